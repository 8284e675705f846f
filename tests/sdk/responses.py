"""The real openai SDK's Responses API (`client.responses.create`) against a
pair node's OpenAI face: a plain request, a streamed one, and a tool call
with its output sent back, on whatever engine holds MODEL.

usage: responses.py OPENAI_FACE MODEL
Prints "N checks" last; exits non-zero at the first failed check.
"""
import json
import sys

import openai

from checks import check, summary

base, model = sys.argv[1:3]


client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

r = client.responses.create(model=model, instructions="be brief", input="Why is the sky blue?",
                            max_output_tokens=8, store=False)
check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
      and r.output_text, f"plain, cut by its limit {r}")
check(r.usage.output_tokens > 0 and r.usage.input_tokens > 0, f"usage {r.usage}")

names = []
text = ""
# An answer that ends on its own (the emulated engine's natural length): the
# SDK's stream helper wants `response.completed`, which an answer cut by
# max_output_tokens does not end with (it ends `response.incomplete`).
natural = {"x-emulator-answer-tokens": "8"}
with client.responses.stream(model=model, input=[{"role": "user", "content": "hi"}],
                             extra_headers=natural) as stream:
    for event in stream:
        names.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    final = stream.get_final_response()
check(names[0] == "response.created" and names[-1] in ("response.completed", "response.incomplete"),
      f"event sequence {names}")
check(text and final.output_text == text, f"streamed text {text!r} vs {final.output_text!r}")

tools = [{"type": "function", "name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
asked = [{"role": "user", "content": 'weather in Oslo? get_weather({"city": "Oslo"})'}]
r1 = client.responses.create(model=model, input=asked, tools=tools, extra_headers=natural)
calls = [o for o in r1.output if o.type == "function_call"]
check(calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Oslo"},
      f"tool call {r1.output}")
r2 = client.responses.create(model=model, tools=tools, input=asked + [
    {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
     "arguments": calls[0].arguments},
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "12C"},
], extra_headers=natural)
check(r2.output_text and not any(o.type == "function_call" for o in r2.output), f"after the tool {r2.output}")

with client.responses.stream(model=model, input=asked, tools=tools, extra_headers=natural) as stream:
    args = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
    final = stream.get_final_response()
check(json.loads(args) == {"city": "Oslo"} and any(o.type == "function_call" for o in final.output),
      f"streamed tool call {args!r}")

try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_123")
    check(False, "previous_response_id must be refused")
except openai.BadRequestError as err:
    check("previous_response_id" in str(err), f"400 naming the field: {err}")

print(summary())
