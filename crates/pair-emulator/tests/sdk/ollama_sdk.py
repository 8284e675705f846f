"""The real `ollama` SDK against an emulated Ollama.

Env: BASE_URL (no path), MODEL, EMBED_MODEL. Exits non-zero on failure.
"""
import os
import sys

import ollama

client = ollama.Client(host=os.environ["BASE_URL"])
model = os.environ["MODEL"]
embed_model = os.environ["EMBED_MODEL"]

names = [m.model for m in client.list().models]
assert model in names, names
assert all(m.size > 0 and m.details.format == "gguf" for m in client.list().models)
assert client.ps().models == [], client.ps()

gen = client.generate(model=model, prompt="Why is the sky blue?", options={"num_predict": 5})
assert len(gen.response.split(" ")) == 5, gen
assert gen.done and gen.done_reason == "length" and gen.eval_count == 5, gen
assert gen.load_duration > 0, "first use is a cold load"
streamed = "".join(c.response for c in client.generate(
    model=model, prompt="Why is the sky blue?", options={"num_predict": 5}, stream=True))
assert streamed == gen.response, (streamed, gen.response)

messages = [{"role": "user", "content": "hello"}]
chat = client.chat(model=model, messages=messages)
assert chat.message.role == "assistant" and chat.done_reason == "stop", chat
parts = list(client.chat(model=model, messages=messages, stream=True))
assert "".join(p.message.content for p in parts) == chat.message.content
assert parts[-1].done and parts[-1].eval_count == 32, parts[-1]

emb = client.embed(model=embed_model, input=["a", "b"])
assert len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 64, emb
legacy = client.embeddings(model=embed_model, prompt="a")
assert all(abs(x - y) < 1e-6 for x, y in zip(legacy.embedding, emb.embeddings[0]))

show = client.show(model)
assert show.details.family, show
loaded = [m.model for m in client.ps().models]
assert model in loaded, loaded

try:
    client.chat(model="no-such-model", messages=messages)
    sys.exit("an unknown model must raise")
except ollama.ResponseError as e:
    assert e.status_code == 404, e
    assert "not found" in e.error, e.error

print("ollama sdk ok")
