#!/usr/bin/env python3
"""Render chat-template fixtures with Python Jinja2: the independent oracle for the interpreter in engine/text/jinja/.

Writes tests/data/chat_templates/expected.json: every template in tests/data/chat_templates/*.jinja,
rendered for a set of conversations with
add_generation_prompt true and false, plus each edge-case snippet of snippets.txt (separated by
lines "=====") rendered for the multi_turn conversation. tests/engine/chat_template_test.cpp must
reproduce each output byte for byte, and must fail wherever Jinja2 raised.

The environment is the one transformers' apply_chat_template builds (its _compile_jinja_template:
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, json.dumps tojson,
raise_exception); when transformers is missing an equivalent environment is built here. Variables
are those apply_chat_template passes: messages, tools=None, documents=None, add_generation_prompt,
bos_token, eos_token. strftime_now reads a fixed clock (FIXED_NOW) so outputs are reproducible.

Usage:
  scripts/make_chat_template_fixtures.py
  scripts/make_chat_template_fixtures.py --smollm2-gguf models/SmolLM2-135M-Instruct.Q4_1.gguf

"""
import argparse
import datetime
import json
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "chat_templates"
FIXED_NOW = 1_721_952_000  # 2024-07-26T00:00:00Z

# Special tokens for the named templates (from each model's tokenizer_config.json).
NAMED_TOKENS = {
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "llama2": ("<s>", "</s>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral_v0_1": ("<s>", "</s>"),
    "mistral_v0_1_legacy": ("<s>", "</s>"),
    "mistral_v0_3": ("<s>", "</s>"),
    "mistral_nemo": ("<s>", "</s>"),
    "zephyr": ("<|endoftext|>", "<|endoftext|>"),
    "gemma": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "phi3_5": ("<s>", "<|endoftext|>"),
    "qwen2_5": ("", "<|im_end|>"),
    "qwen3": ("", "<|im_end|>"),
    "hermes_style": ("<|begin_of_text|>", "<|im_end|>"),  # our Hermes-2-Pro-style tool template
    "features": ("<s>", "</s>"),
    "whitespace": ("<s>", "</s>"),
}


def msg(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "system_user": [msg("system", "You are a helpful assistant."), msg("user", "Hello!")],
    "user_only": [msg("user", "What is 2+2?")],
    "multi_turn": [
        msg("system", "Be brief."),
        msg("user", "Hi there"),
        msg("assistant", "Hello! How can I help?"),
        msg("user", "Tell me a joke."),
    ],
    "multi_turn_no_system": [msg("user", "One"), msg("assistant", "Two"), msg("user", "Three")],
    "ends_with_assistant": [msg("user", "Ping"), msg("assistant", "Pong")],
    "special_chars": [
        msg("system", "Quotes ' and \" and \\backslash\\ and {{ braces }} {% tag %} {# hash #}"),
        msg("user", "  Line one\nline two\r\n\ttabbed\n\n  héllo wörld 世界 🎉 \u00a0\u3000"),
        msg("assistant", "<|im_end|> [INST] </s> <<SYS>> literal markers, not specials"),
        msg("user", "\n\n"),
    ],
    "empty_content": [msg("user", "")],
    "bad_alternation": [msg("user", "a"), msg("user", "b")],
    "no_messages": [],
    "unknown_role": [msg("tool", "42"), msg("user", "ok?")],
}


def random_text(rng):
    alphabet = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?'\"\\{}%#|-+*/[]()<>=_~\t\n\r"
                "éüßçñøåЖжΩω中文日本語한국어😀🎉\u00a0\u2028\u3000\u200b")
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))


def random_conversation(seed, with_system, turns):
    rng = random.Random(seed)
    messages = [msg("system", random_text(rng))] if with_system else []
    for turn in range(turns):
        messages.append(msg("user" if turn % 2 == 0 else "assistant", random_text(rng)))
    return messages


# Seeded random contents: every character class the templates might treat specially.
CONVERSATIONS["random_1"] = random_conversation(1, True, 3)
CONVERSATIONS["random_2"] = random_conversation(2, False, 5)
CONVERSATIONS["random_3"] = random_conversation(3, True, 1)


def compile_template(source):
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        template = _compile_jinja_template(source)
    except ImportError:
        template = _own_environment().from_string(source)
    # Fixed clock instead of datetime.now() (naive, like transformers' own), so that Llama 3.x
    # "Today Date" lines are reproducible.
    fixed = datetime.datetime.fromtimestamp(FIXED_NOW, tz=datetime.timezone.utc).replace(tzinfo=None)
    template.globals["strftime_now"] = lambda fmt: fixed.strftime(fmt)
    return template


def _own_environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["namespace"] = jinja2.utils.Namespace
    env.globals["dict"] = dict
    return env


def render_cases(name, source, bos, eos, conversations=None, prompts=(True, False)):
    cases = []
    try:
        template = compile_template(source)
    except Exception as e:  # noqa: BLE001 - any failure is an expected error for the C++ side
        return [{"template": name, "compile_error": type(e).__name__ + ": " + str(e)}]
    for conv_name in conversations or CONVERSATIONS:
        conversation = CONVERSATIONS[conv_name]
        for add_generation_prompt in prompts:
            case = {"template": name, "conversation": conv_name, "add_generation_prompt": add_generation_prompt,
                    "bos_token": bos, "eos_token": eos}
            try:
                case["output"] = template.render(messages=[dict(m) for m in conversation], tools=None, documents=None,
                                                 add_generation_prompt=add_generation_prompt,
                                                 bos_token=bos, eos_token=eos)
            except Exception as e:  # noqa: BLE001
                case["error"] = type(e).__name__ + ": " + str(e)
            cases.append(case)
    return cases


def token_text(token):
    if isinstance(token, dict):
        return token.get("content") or ""
    return token or ""


def refresh_smollm2(path):
    import gguf
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    (DATA / "smollm2.jinja").write_bytes(bytes(field.parts[field.data[0]]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smollm2-gguf", help="GGUF file to read SmolLM2's tokenizer.chat_template from")
    args = parser.parse_args()
    if args.smollm2_gguf:
        refresh_smollm2(args.smollm2_gguf)

    cases = []
    for path in sorted(DATA.glob("*.jinja")):
        name = path.stem
        if name not in NAMED_TOKENS:
            sys.exit(f"no special tokens listed for {path.name}; add it to NAMED_TOKENS")
        bos, eos = NAMED_TOKENS[name]
        cases += render_cases(path.name, path.read_bytes().decode("utf-8"), bos, eos)  # bytes: keep \r\n
    snippets = (DATA / "snippets.txt").read_bytes().decode("utf-8").split("\n=====\n")
    for index, snippet in enumerate(snippets):
        cases += render_cases(f"snippet:{index}", snippet, "<s>", "</s>", ["multi_turn"], (True,))
    out = {"generator": "scripts/make_chat_template_fixtures.py", "now_unix_seconds": FIXED_NOW,
           "conversations": CONVERSATIONS, "cases": cases}
    (DATA / "expected.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {DATA / 'expected.json'}")


if __name__ == "__main__":
    main()
