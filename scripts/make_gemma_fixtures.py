#!/usr/bin/env python3
"""Builds the Gemma 3 270M (Q4_K_M GGUF) fixtures of tests/cpu/gemma3_test.cpp from the pinned llama.cpp.

Two files, both from llama.cpp on models/gemma-3-270m-q4_k_m.gguf (scripts/setup --models gemma3-270m)
through scripts/llama_cpp_oracle.cpp (its `tokenize` and `greedy` commands, linked against the static
libllama of bench/build_llama_cpp.sh):

  * tests/data/tokenizer/gemma3_parity.jsonl: the hard corpus of scripts/make_tokenizer_fixtures.py
    (whitespace runs, numbers, code, contractions, mixed scripts, NFC/NFD accents, emoji, control
    characters, invalid UTF-8, seeded random mixes, long inputs) plus Gemma's own special-token
    spellings and look-alikes, tokenized by llama_tokenize (no BOS; parse_special as the line says).
    Same line format as smollm_parity.jsonl: {"text_b64", "special", "ids"}.
  * tests/data/logits/gemma3_270m_greedy.json: prompts (text and ids, BOS first, as llama.cpp's
    tokenizer makes them), NUM_GREEDY greedy tokens per prompt and llama.cpp's top-1 minus top-2 logit
    margin at each of those steps (n_threads 1, default context settings, KV cleared between prompts).

Usage:
    python3 scripts/make_gemma_fixtures.py [--model models/gemma-3-270m-q4_k_m.gguf] [--tool PATH]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import make_tokenizer_fixtures as corpus  # noqa: E402  (the shared hard corpus)

DEFAULT_MODEL = REPO_ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
TOKENIZER_OUT = REPO_ROOT / "tests" / "data" / "tokenizer" / "gemma3_parity.jsonl"
GREEDY_OUT = REPO_ROOT / "tests" / "data" / "logits" / "gemma3_270m_greedy.json"
PIN = "0.3.36"
NUM_GREEDY = 16
N_CTX = 512

GEMMA_SPECIALS = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
                  "<start_of_image>", "<end_of_image>", "[multimodal]", "<unused0>", "<unused17>"]

GEMMA_LOOKALIKES = [
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<start_of_turn>", "<end_of_turn>",
    "< start_of_turn >", "<start_of_turn", "start_of_turn>", "<START_OF_TURN>", "<start of turn>",
    "<<start_of_turn>>", "<start_of_turn><end_of_turn>", " <bos>", "<bos> ", "<bos><bos>", "text<eos>more",
    "<eos", "eos>", "<pad><pad>", "<mask>ed", "<unused0><unused1>", "<unused999>", "[multimodal]x",
    "<start_of_image><end_of_image>", "<|im_start|>", "<|endoftext|>", "<s>", "</s>", "[INST]",
    "<start_of_turn>model\nSure! 😀<end_of_turn>", "<start_of_turn>user\n<eos> inside<end_of_turn>",
]

# Prompts whose continuations are mostly determined: sequences, well-known texts, code, facts, patterns.
PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "10, 20, 30, 40, 50,",
    "2, 4, 8, 16, 32, 64,",
    "A B C D E F G H",
    "a, b, c, d, e, f, g,",
    "Monday, Tuesday, Wednesday,",
    "January, February, March, April,",
    "one two three four five six",
    "Zero, one, two, three, four,",
    "The quick brown fox jumps over the",
    "To be, or not to be, that is",
    "Four score and seven years ago our fathers",
    "We hold these truths to be self-evident, that all men",
    "Twinkle, twinkle, little star, how I wonder",
    "Happy birthday to you, happy birthday to you, happy birthday",
    "Lorem ipsum dolor sit amet, consectetur",
    "Once upon a time, in a land far, far",
    "It was the best of times, it was the worst of",
    "In the beginning God created the heaven and the",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "Water is made of hydrogen and",
    "The first president of the United States was George",
    "The Earth revolves around the",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "for i in range(10):\n    print(",
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"Hello, world!\\n\");\n    return",
    "import numpy as np\nimport matplotlib.pyplot as",
    "SELECT * FROM users WHERE",
    "<html>\n<head>\n<title>My page</title>\n</head>\n<",
    "public static void main(String[] args) {\n    System.out.",
    "x = [1, 2, 3]\ny = [4, 5, 6]\nz = [7, 8,",
    "red, orange, yellow, green, blue,",
    "Mercury, Venus, Earth, Mars, Jupiter,",
    "first, second, third, fourth, fifth,",
    "I, II, III, IV, V, VI,",
    "Alpha, Beta, Gamma, Delta,",
    "do re mi fa sol",
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
    "Hello! How are you? I am fine, thank you. And",
    "Question: What is 2 + 2?\nAnswer:",
    "Q: What color is the sky?\nA: The sky is",
    "English: Hello\nFrench: Bonjour\nEnglish: Thank you\nFrench:",
    "un, deux, trois, quatre,",
    "eins, zwei, drei, vier,",
    "uno, dos, tres, cuatro,",
    "月曜日、火曜日、水曜日、",
    "一、二、三、四、",
    "Понедельник, вторник, среда,",
    "The alphabet: a b c d e f g h i j k",
    "Name: John Smith\nAge: 35\nCity: New York\n\nName: Jane Doe\nAge:",
    "{\"name\": \"Alice\", \"age\": 30, \"city\": \"",
    "- apples\n- bananas\n- cherries\n-",
    "Step 1: Preheat the oven.\nStep 2:",
    "Roses are red, violets are",
    "An apple a day keeps the",
    "All that glitters is not",
    "Rome was not built in a",
    "The early bird catches the",
    "E = mc",
    "The speed of light is approximately 300,000 kilometers per",
    "There are seven days in a week and twelve months in a",
    "Python is a programming",
    "The chemical symbol for gold is",
    "Shakespeare wrote Romeo and",
]


def build_tokenizer_corpus() -> list[tuple[bytes, bool]]:
    """The shared hard corpus, with Gemma's special tokens in place of SmolLM2's."""
    text_cases: list[str] = []
    for group in (corpus._whitespace_cases(), corpus._number_cases(), corpus._code_cases(),
                  corpus._contraction_cases(), corpus._punctuation_cases(), corpus._url_json_markdown_cases(),
                  corpus._script_cases(), corpus._accent_cases(), corpus._emoji_cases(),
                  corpus._special_lookalike_cases(), GEMMA_LOOKALIKES, corpus._control_cases(),
                  corpus._random_mix_cases(60), corpus._long_cases()):
        text_cases.extend(group)
    entries: list[tuple[bytes, bool]] = []
    seen: set[tuple[bytes, bool]] = set()

    def add(raw: bytes, special: bool) -> None:
        if (raw, special) not in seen:
            seen.add((raw, special))
            entries.append((raw, special))

    for text in text_cases:
        add(text.encode("utf-8"), False)
    for raw in corpus._invalid_utf8_cases() + corpus.LLAMA_CPP_ABORTS:
        add(raw, False)
    # special=True: Gemma's control-token spellings become single ids, look-alikes stay text.
    for text in GEMMA_LOOKALIKES + GEMMA_SPECIALS + [
            "Hello<end_of_turn>", "<end_of_turn>Hello", " <eos> ", "<start_of_turn><start_of_turn>",
            "plain text, no specials", "<bos>The quick brown fox", "<|im_start|>user\nHi<|im_end|>\n"]:
        add(text.encode("utf-8"), True)
    return entries


def run_tool(tool: Path, args: list[str], lines: list[str]) -> list[str]:
    res = subprocess.run([str(tool), *args], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         check=True)
    out = res.stdout.splitlines()
    if len(out) != len(lines):
        sys.exit(f"make_gemma_fixtures: {args[0]} answered {len(out)} lines for {len(lines)} inputs\n{res.stderr}")
    return out


def tokenize(tool: Path, model: Path, entries: list[tuple[bytes, bool]]) -> list[list[int] | None]:
    lines = [f"{int(special)} {raw.hex()}" for raw, special in entries]
    out = []
    for line in run_tool(tool, ["tokenize", str(model)], lines):
        out.append(None if line == "error" else [int(x) for x in line.split()])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--peers", type=Path,
                        default=Path(os.environ.get("TESSERA_PEERS", Path.home() / ".cache" / "tessera" / "peers")) /
                        f"llama.cpp-{PIN}")
    parser.add_argument("--tool", type=Path, help="a built scripts/llama_cpp_oracle.cpp (default: build it in --peers)")
    args = parser.parse_args()
    if not args.model.exists():
        print(f"make_gemma_fixtures: {args.model} is missing (scripts/setup --models gemma3-270m)", file=sys.stderr)
        return 1
    if args.tool is None:
        import make_model_fixtures
        args.tool = make_model_fixtures.build_oracle_tool(args.peers)

    entries = build_tokenizer_corpus()
    ids = tokenize(args.tool, args.model, entries)
    kept = 0
    with TOKENIZER_OUT.open("w", encoding="utf-8") as f:
        for (raw, special), i in zip(entries, ids):
            if i is None:
                continue  # llama.cpp aborts on it: no oracle (tokenizer_test covers it without one)
            f.write(json.dumps({"text_b64": base64.b64encode(raw).decode("ascii"), "special": special, "ids": i}) + "\n")
            kept += 1
    print(f"{TOKENIZER_OUT.relative_to(REPO_ROOT)}: {kept} inputs ({len(entries) - kept} llama.cpp cannot tokenize)")

    bos = 2  # tokenizer.ggml.bos_token_id; add_bos_token is true
    prompt_ids = [[bos] + i for i in tokenize(args.tool, args.model, [(p.encode("utf-8"), False) for p in PROMPTS])]
    lines = run_tool(args.tool, ["greedy", str(args.model), str(N_CTX), str(NUM_GREEDY)],
                     [" ".join(map(str, p)) for p in prompt_ids])
    prompts = []
    for text, p, line in zip(PROMPTS, prompt_ids, lines):
        toks, margins = line.split("|")
        prompts.append({"text": text, "ids": p, "greedy": [int(x) for x in toks.split()],
                        "margins": [float(x) for x in margins.split()]})
    index = {"model": args.model.name, "llama_cpp": f"llama-cpp-python {PIN} sdist (vendored llama.cpp)",
             "settings": "llama_tokenize (BOS prepended), greedy argmax, n_ctx 512, n_threads 1, default context",
             "num_greedy": NUM_GREEDY, "prompts": prompts}
    GREEDY_OUT.write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{GREEDY_OUT.relative_to(REPO_ROOT)}: {len(prompts)} prompts x {NUM_GREEDY} greedy tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
