"""The real openai and ollama Python SDKs against a running pair cluster.

Usage: clients.py OLLAMA_FACE_URL OPENAI_FACE_URL
Every check raises on failure; the last line printed is "ok <n> checks".
"""
import sys

import ollama
import openai

ollama_url, openai_url = sys.argv[1], sys.argv[2]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


# --- OpenAI SDK, through the OpenAI face -----------------------------------
oa = openai.OpenAI(base_url=openai_url + "/v1", api_key="unused", max_retries=0)

models = [m.id for m in oa.models.list()]
check("llama3.2:3b" in models and "qwen2.5:7b" in models, f"models {models}")

r = oa.chat.completions.create(
    model="llama3.2:3b", messages=[{"role": "user", "content": "hello"}], max_tokens=8
)
check(r.choices[0].message.content, "chat content")
check(r.usage.completion_tokens == 8, f"usage {r.usage}")

raw = oa.chat.completions.with_raw_response.create(
    model="qwen2.5:7b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
)
check(raw.headers.get("x-pair-node"), "route receipt header")
check(raw.headers.get("x-pair-policy") == "predicted-latency", raw.headers.get("x-pair-policy"))
check(raw.headers.get("x-pair-attempts") == "1", raw.headers.get("x-pair-attempts"))
check(len(raw.headers.get("x-pair-job", "")) == 36, raw.headers.get("x-pair-job"))
check(raw.headers.get("x-pair-route") is None, "the score breakdown only when asked")
raw = oa.chat.completions.with_raw_response.create(
    model="qwen2.5:7b",
    messages=[{"role": "user", "content": "hi"}],
    max_tokens=4,
    extra_headers={"x-pair-explain": "1"},
)
route = raw.headers.get("x-pair-route", "")
check(route.startswith("predicted-latency: predicted"), f"explained route {route!r}")

parts = []
for chunk in oa.chat.completions.create(
    model="llama3.2:3b",
    messages=[{"role": "user", "content": "stream please"}],
    max_tokens=12,
    stream=True,
):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
check(len(parts) >= 10, f"streamed {len(parts)} parts")

c = oa.completions.create(model="llama3.2:3b", prompt="Once", max_tokens=5)
check(c.choices[0].text, "completion text")

e = oa.embeddings.create(model="nomic-embed-text", input=["a", "b"])
check(len(e.data) == 2 and len(e.data[0].embedding) > 8, "embeddings")

try:
    oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check(False, "unknown model must raise")
except openai.APIStatusError as err:
    check(err.status_code == 404 and "no-such-model" in str(err) and "llama3.2:3b" in str(err), f"error {err}")

# --- Ollama SDK, through the Ollama face -----------------------------------
ol = ollama.Client(host=ollama_url)

names = [m.model for m in ol.list().models]
check("llama3.2:3b" in names, f"ollama list {names}")

r = ol.chat(model="llama3.2:3b", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 6})
check(r.message.content and r.done, "ollama chat")
check(r.eval_count == 6, f"eval_count {r.eval_count}")

stream = list(ol.chat(model="qwen2.5:7b", messages=[{"role": "user", "content": "hi"}],
                      stream=True, options={"num_predict": 10}))
check(len(stream) >= 10 and stream[-1].done, f"ollama stream {len(stream)}")

g = ol.generate(model="llama3.2:3b", prompt="hi", options={"num_predict": 4})
check(g.response and g.done, "ollama generate")

emb = ol.embed(model="nomic-embed-text", input=["x", "y", "z"])
check(len(emb.embeddings) == 3, "ollama embed")

ps = ol.ps()
check(any(m.model.startswith("llama3.2") for m in ps.models), f"ps {ps}")

try:
    ol.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check(False, "unknown model must raise")
except ollama.ResponseError as err:
    check(err.status_code == 404 and "no-such-model" in err.error, f"ollama error {err}")

print(f"ok {checks} checks")
