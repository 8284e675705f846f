"""The real ollama and anthropic SDKs against a pair node whose engine does
not speak their API (or does), through the node's translation.

usage: translated.py OLLAMA_FACE OPENAI_FACE MODEL EMBED_MODEL [ollama|anthropic|both][-basic]
"-basic" leaves out the tool-call round trips (a real small model does not
call tools on demand, as the emulated engine does).
Prints "N checks" last; exits non-zero at the first failed check.
"""
import sys

import anthropic
import ollama

from checks import check, summary

ollama_url, openai_url, model, embed_model = sys.argv[1:5]
mode = sys.argv[5] if len(sys.argv) > 5 else "both"
tools_too = not mode.endswith("-basic")
mode = mode.removesuffix("-basic")


user = [{"role": "user", "content": "hello there"}]

if mode in ("ollama", "both"):
    ol = ollama.Client(host=ollama_url)
    names = [m.model for m in ol.list().models]
    check(model in names and embed_model in names, f"list {names}")
    r = ol.chat(model=model, messages=user, options={"num_predict": 6, "temperature": 0.1})
    check(r.message.content and r.done and r.eval_count and r.eval_count > 0, f"chat {r}")
    check(r.total_duration and r.total_duration > 0, f"durations from the node's clock {r}")
    parts = list(ol.chat(model=model, messages=user, stream=True, options={"num_predict": 5}))
    check(len(parts) >= 2 and parts[-1].done, f"chat stream {parts}")
    check("".join(p.message.content for p in parts), "streamed text")
    g = ol.generate(model=model, prompt="Once", options={"num_predict": 4})
    check(g.response and g.done and g.done_reason in ("stop", "length"), f"generate {g}")
    gs = list(ol.generate(model=model, prompt="Once", stream=True, options={"num_predict": 4}))
    check(len(gs) >= 2 and gs[-1].done and not gs[0].done, f"generate stream {gs}")
    e = ol.embed(model=embed_model, input=["a", "b"])
    check(len(e.embeddings) == 2 and len(e.embeddings[0]) > 0, "embed")
    legacy = ol.embeddings(model=embed_model, prompt="a")
    check(len(legacy.embedding) > 0, "legacy embeddings")
    s = ol.show(model)
    check(s.details is not None, f"show {s}")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    r = tools_too and ol.chat(model=model, messages=[{"role": "user", "content": 'weather in Oslo? get_weather({"city": "Oslo"})'}], tools=tools)
    if tools_too:
        calls = r.message.tool_calls or []
        check(calls and calls[0].function.name == "get_weather"
          and calls[0].function.arguments == {"city": "Oslo"}, f"tool call {r.message}")
        back = ol.chat(model=model, tools=tools, messages=[
            {"role": "user", "content": 'weather in Oslo? get_weather({"city": "Oslo"})'},
            {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
            {"role": "tool", "content": "12C", "tool_name": "get_weather"},
        ], options={"num_predict": 5})
        check(back.message.content and not back.message.tool_calls, f"tool answer {back.message}")
    try:
        ol.chat(model=model, messages=user, options={"mirostat": 2})
        check(False, "an option with no equivalent must be refused")
    except ollama.ResponseError as err:
        check(err.status_code == 400 and "mirostat" in err.error, f"400 naming the field: {err}")

if mode in ("anthropic", "both"):
    an = anthropic.Anthropic(base_url=openai_url, api_key="unused", max_retries=0)
    m = an.messages.create(model=model, max_tokens=8, system="be brief", messages=user)
    check(m.content and m.content[0].type == "text" and m.content[0].text, f"message {m}")
    check(m.usage.output_tokens > 0 and m.stop_reason in ("end_turn", "max_tokens"), f"usage {m}")
    with an.messages.stream(model=model, max_tokens=8, messages=user) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(text and final.stop_reason in ("end_turn", "max_tokens"), f"stream {final}")
    if tools_too:
        tools = [{"name": "get_weather", "description": "weather",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
        asked = [{"role": "user", "content": 'weather in Oslo? get_weather({"city": "Oslo"})'}]
        m1 = an.messages.create(model=model, max_tokens=16, tools=tools, messages=asked)
        use = [b for b in m1.content if b.type == "tool_use"]
        check(m1.stop_reason == "tool_use" and use and use[0].name == "get_weather"
          and use[0].input == {"city": "Oslo"}, f"tool use {m1}")
        m2 = an.messages.create(model=model, max_tokens=16, tools=tools, messages=asked + [
            {"role": "assistant", "content": m1.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "12C"}]},
        ])
        check(m2.stop_reason != "tool_use" and m2.content[0].type == "text", f"after the tool {m2}")
        with an.messages.stream(model=model, max_tokens=16, tools=tools, messages=asked) as stream:
            final = stream.get_final_message()
        check(final.stop_reason == "tool_use" and any(b.type == "tool_use" for b in final.content),
              f"streamed tool use {final}")
    try:
        an.messages.create(model="no-such-model", max_tokens=4, messages=user)
        check(False, "an unknown model must raise")
    except anthropic.APIStatusError as err:
        check(err.status_code >= 400 and "no-such-model" in str(err), f"error {err}")

print(summary())
