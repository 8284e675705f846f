"""The real openai and anthropic SDKs against a pair node's LAN face, run from
another machine's network (a network namespace): with an API key they are
served; with a wrong one they get the API's own 401.

usage: lan_clients.py BASE_URL KEY MODEL
Prints "N checks" last; exits non-zero at the first failed check.
"""
import sys

import anthropic
import openai

from checks import check, summary

base, key, model = sys.argv[1:4]


user = [{"role": "user", "content": "hi"}]
oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
r = oa.chat.completions.create(model=model, messages=user, max_tokens=5)
check(r.choices[0].message.content, f"openai chat {r}")
stream = oa.chat.completions.create(model=model, messages=user, max_tokens=5, stream=True)
check("".join(c.choices[0].delta.content or "" for c in stream if c.choices), "openai stream")
check(any(m.id == model for m in oa.models.list()), "openai models")
r = oa.responses.create(model=model, input="hi", max_output_tokens=5)
check(r.output_text, f"responses {r}")

an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
m = an.messages.create(model=model, max_tokens=5, messages=user)
check(m.content and m.content[0].text, f"anthropic message {m}")

for client, error in ((openai.OpenAI(base_url=base + "/v1", api_key="pair-sk-wrong", max_retries=0),
                       openai.AuthenticationError),):
    try:
        client.chat.completions.create(model=model, messages=user, max_tokens=5)
        check(False, "a wrong key must be refused")
    except error as err:
        check(err.status_code == 401 and "API key" in str(err), f"openai 401 {err}")
try:
    anthropic.Anthropic(base_url=base, api_key="pair-sk-wrong", max_retries=0).messages.create(
        model=model, max_tokens=5, messages=user)
    check(False, "a wrong key must be refused")
except anthropic.AuthenticationError as err:
    check(err.status_code == 401 and err.body["error"]["type"] == "authentication_error", f"anthropic 401 {err}")

print(summary())
