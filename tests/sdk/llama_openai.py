"""The openai SDK through a pair cluster to a real llama.cpp server node.

Usage: llama_openai.py OPENAI_FACE_URL EXPECTED_NODE_UUID
"""
import sys

import openai

url, expected = sys.argv[1], sys.argv[2]
oa = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)

raw = oa.chat.completions.with_raw_response.create(
    model="smollm2",
    messages=[{"role": "user", "content": "Say hello."}],
    max_tokens=8,
    temperature=0,
)
served = raw.headers.get("x-pair-node", "")
assert expected in served, f"served by {served!r}, expected {expected}"
r = raw.parse()
assert r.choices[0].message.content, r
assert r.usage.completion_tokens > 0, r.usage

parts = []
for chunk in oa.chat.completions.create(
    model="smollm2",
    messages=[{"role": "user", "content": "Count to five."}],
    max_tokens=12,
    stream=True,
):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
assert len(parts) >= 2, parts
print("ok", repr(r.choices[0].message.content), len(parts), "streamed parts")
