#!/usr/bin/env python3
"""Render tool-calling chat-template fixtures with transformers: the oracle for tool-aware templates.

Writes tests/data/chat_templates/tools_expected.json: the tool-aware templates of
tests/data/chat_templates (Llama 3.1/3.2, Mistral v0.3/Nemo, Qwen 2.5/3, SmolLM2, which ignores
tools, and hermes_style, our Hermes-2-Pro-style template with a recursive macro) rendered by
transformers' render_jinja_template -- the function apply_chat_template(..., tools=...) calls -- for
conversations with tool definitions, assistant tool calls and tool results.
tests/engine/chat_template_test.cpp (ToolTemplatesMatchTransformers) must reproduce every output
byte for byte and fail wherever transformers raised.

The C++ side receives what the server receives from an OpenAI client: `tools` as JSON text, and each
tool call's `function.arguments` as a JSON string. The server parses the arguments into a dict before
rendering (as vLLM does, and as the templates expect: they print `arguments | tojson`), so the oracle
renders with the parsed dict. Both forms are stored: `tools_json` and `arguments` (text).

Usage: scripts/make_tool_template_fixtures.py   (needs transformers and Jinja2)
"""
import copy
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_chat_template_fixtures import DATA, FIXED_NOW, NAMED_TOKENS, compile_template  # noqa: E402

from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

TEMPLATES = ["llama3_1", "llama3_2", "mistral_v0_3", "mistral_nemo", "qwen2_5", "qwen3", "smollm2", "hermes_style"]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (°C or °F).",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "threshold": {"type": "number", "default": 0.5}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "tags": {"type": "array", "items": {"type": "string"}}},
                   "required": ["query"]}}}
NO_PARAMS = {"type": "function", "function": {"name": "now", "description": "The time now."}}


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Mistral's templates require 9-character alphanumeric tool call ids, so every id here is one.
CONVERSATIONS = {
    "tools_user": ([WEATHER, SEARCH], [{"role": "user", "content": "Weather in Paris?"}]),
    "tools_system_user": ([WEATHER, SEARCH, NO_PARAMS],
                          [{"role": "system", "content": "You are terse."},
                           {"role": "user", "content": "What's the weather in Zürich, in celsius?"}]),
    "call_and_result": ([WEATHER], [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("abc123XYZ", "get_weather", '{"city": "Paris", "unit": "celsius"}')]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": '{"temperature": 21.5, "sky": "clear"}'},
    ]),
    "parallel_calls": ([WEATHER, SEARCH], [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo and news about it."},
        {"role": "assistant", "content": None,
         "tool_calls": [call("id0000001", "get_weather", '{"city": "Oslo", "days": 2}'),
                        call("id0000002", "search", '{"query": "Oslo news", "tags": ["a", "b"]}')]},
        {"role": "tool", "tool_call_id": "id0000001", "content": "cold"},
        {"role": "tool", "tool_call_id": "id0000002", "content": "nothing new"},
        {"role": "assistant", "content": "It is cold in Oslo; no news."},
        {"role": "user", "content": "Thanks!"},
    ]),
    "call_no_tools_listed": (None, [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [call("zzz999zzz", "now", "{}")]},
        {"role": "tool", "tool_call_id": "zzz999zzz", "content": "12:00"},
    ]),
}


def for_oracle(messages):
    """The conversation as the server hands it to the template: arguments parsed into dicts."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    cases = []
    for name in TEMPLATES:
        source = (DATA / f"{name}.jinja").read_bytes().decode("utf-8")
        bos, eos = NAMED_TOKENS[name]
        compile_template(source)  # cached by transformers: render_jinja_template reuses it, fixed clock included
        for conv_name, (tools, messages) in CONVERSATIONS.items():
            for add_generation_prompt in (True, False):
                case = {"template": f"{name}.jinja", "conversation": conv_name,
                        "add_generation_prompt": add_generation_prompt, "bos_token": bos, "eos_token": eos}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[for_oracle(messages)], tools=copy.deepcopy(tools), chat_template=source,
                        add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)
                    case["output"] = rendered[0]
                except Exception as e:  # noqa: BLE001 - any failure is an expected error for the C++ side
                    case["error"] = type(e).__name__ + ": " + str(e)
                cases.append(case)
    conversations = {name: {"tools_json": None if tools is None else json.dumps(tools, ensure_ascii=False),
                            "messages": messages} for name, (tools, messages) in CONVERSATIONS.items()}
    out = {"generator": "scripts/make_tool_template_fixtures.py", "now_unix_seconds": FIXED_NOW,
           "conversations": conversations, "cases": cases}
    (DATA / "tools_expected.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    errors = sum("error" in c for c in cases)
    print(f"wrote {len(cases)} cases ({errors} errors) to {DATA / 'tools_expected.json'}")


if __name__ == "__main__":
    main()
