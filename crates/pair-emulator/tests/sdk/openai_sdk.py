"""The real `openai` SDK against an emulated engine (any flavor).

Env: BASE_URL (ending in /v1), MODEL, EMBED_MODEL. Exits non-zero on failure.
"""
import os
import sys

import openai

base_url = os.environ["BASE_URL"]
model = os.environ["MODEL"]
embed_model = os.environ["EMBED_MODEL"]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

ids = [m.id for m in client.models.list()]
assert model in ids, ids

messages = [{"role": "user", "content": "Tell me about the sea."}]
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=5)
text = whole.choices[0].message.content
assert len(text.split(" ")) == 5, text
assert whole.choices[0].finish_reason == "length", whole
assert whole.usage.completion_tokens == 5 and whole.usage.prompt_tokens > 0, whole.usage

parts, usage = [], None
stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=5, stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            parts.append(choice.delta.content)
assert "".join(parts) == text, (parts, text)
assert usage is not None and usage.completion_tokens == 5, usage

plain = client.chat.completions.create(model=model, messages=messages)
assert plain.choices[0].finish_reason == "stop", plain

comp = client.completions.create(model=model, prompt="Once upon", max_tokens=3)
assert len(comp.choices[0].text.split(" ")) == 3, comp
streamed = "".join(c.choices[0].text for c in client.completions.create(
    model=model, prompt="Once upon", max_tokens=3, stream=True) if c.choices)
assert streamed == comp.choices[0].text, (streamed, comp)

# The SDK asks for base64 by default and decodes it.
emb = client.embeddings.create(model=embed_model, input=["alpha", "beta"])
assert len(emb.data) == 2 and len(emb.data[0].embedding) == 64, emb
floats = client.embeddings.create(model=embed_model, input="alpha", encoding_format="float")
assert all(abs(a - b) < 1e-6 for a, b in zip(floats.data[0].embedding, emb.data[0].embedding))

try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    sys.exit("an unknown model must raise")
except openai.NotFoundError as e:
    assert e.status_code == 404, e

print("openai sdk ok")
