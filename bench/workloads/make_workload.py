#!/usr/bin/env python3
"""Generates a ShareGPT-like serving workload with controlled token counts.

ShareGPT conversations have heavy-tailed (roughly log-normal) prompt and
completion lengths. This script samples both from seeded log-normal
distributions, scaled down for a small CPU machine (see PROMPT_* / OUTPUT_*
below), and builds each prompt from real English prose (docstrings of the
Python standard library, a source that is available offline and stable for a
given Python version) wrapped in a chat-style instruction. Prompt text is cut
at token boundaries with the SmolLM2 tokenizer so each prompt has (almost
exactly) the sampled number of tokens.

Output: JSONL, one request per line: {"id": int, "prompt": str, "max_tokens": int}.
Benchmarks run it with ignore_eos semantics (every request generates exactly
max_tokens tokens), so the amount of work is fixed by the file.

Usage:
    python3 bench/workloads/make_workload.py \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out bench/workloads/sharegpt_like.jsonl --num-requests 320
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import random
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent / "sharegpt_like.jsonl"
SEED = 1234

# ShareGPT (as used by vLLM's benchmark_serving) has median prompt ~200 tokens
# and median output ~128 tokens. A 2-core CPU cannot serve that in benchmark
# time, so both medians and caps are scaled down by ~1.5-2x; the log-normal
# shape (sigma ~0.8, i.e. a long right tail) is kept.
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_MIN, PROMPT_MAX = 128, 0.8, 16, 512
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_MIN, OUTPUT_MAX = 64, 0.7, 4, 256

SOURCE_MODULES = [
    "argparse", "asyncio", "collections", "contextlib", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "email", "enum", "fractions", "functools", "heapq", "http.client",
    "inspect", "itertools", "json", "logging", "os", "pathlib", "pickle", "random", "re",
    "shutil", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "textwrap",
    "threading", "typing", "unittest", "urllib.parse", "uuid", "zipfile",
]

INSTRUCTIONS = [
    "Summarize the following documentation in plain language:\n\n{passage}",
    "Explain what this text means to a beginner programmer.\n\n{passage}",
    "{passage}\n\nWrite three questions a student might ask about the text above.",
    "Rewrite the following passage so that it is easier to read:\n{passage}",
    "I found this in the docs and I'm confused:\n\"\"\"\n{passage}\n\"\"\"\nCan you help?",
    "Translate the key ideas of this passage into a short list of bullet points.\n\n{passage}",
    "{passage}\n\nWhat are the main caveats mentioned here?",
    "Continue the following text in the same style:\n\n{passage}",
]


def load_prose() -> list[str]:
    """Docstring paragraphs from a fixed list of stdlib modules, in a fixed order."""
    paragraphs: list[str] = []
    for name in SOURCE_MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_"):
                continue
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name:
                doc = inspect.getdoc(obj)
                if doc and len(doc) > 200:
                    docs.append(doc)
        for doc in docs:
            paragraphs.extend(p.strip() for p in doc.split("\n\n") if len(p.strip()) > 40)
    return paragraphs


class Tokenizer:
    """SmolLM2 tokenizer from the GGUF: llama.cpp if available, else HF transformers."""

    def __init__(self, model: Path):
        try:
            import llama_cpp
            llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
            self.encode = lambda text: llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            self.decode = lambda ids: llm.detokenize(ids).decode("utf-8", errors="ignore")
            self.name = f"llama-cpp-python {llama_cpp.__version__}"
        except ImportError:
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
            self.encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]
            self.decode = lambda ids: tok.decode(ids)
            self.name = "transformers"


def sample_length(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(round(rng.lognormvariate(math.log(median), sigma)))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--num-requests", type=int, default=320)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    tokenizer = Tokenizer(args.model)
    prose_ids = tokenizer.encode("\n\n".join(load_prose()))
    cursor = 0

    requests, prompt_lengths = [], []
    for request_id in range(args.num_requests):
        target_prompt = sample_length(rng, PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_MIN, PROMPT_MAX)
        max_tokens = sample_length(rng, OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_MIN, OUTPUT_MAX)
        template = rng.choice(INSTRUCTIONS)
        overhead = len(tokenizer.encode(template.format(passage="")))
        passage_len = max(4, target_prompt - overhead)
        # Walk through the prose so neighbouring requests do not share prefixes.
        cursor = (cursor + rng.randint(50, 400)) % max(1, len(prose_ids) - passage_len)
        passage = tokenizer.decode(prose_ids[cursor:cursor + passage_len]).strip()
        prompt = template.format(passage=passage)
        requests.append({"id": request_id, "prompt": prompt, "max_tokens": max_tokens})
        prompt_lengths.append(len(tokenizer.encode(prompt)))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for request in requests:
            out.write(json.dumps(request, ensure_ascii=False) + "\n")

    outputs = [r["max_tokens"] for r in requests]
    print(f"wrote {len(requests)} requests to {args.out} (tokenizer: {tokenizer.name})")
    print(f"prompt tokens: median {statistics.median(prompt_lengths):.0f} mean {statistics.mean(prompt_lengths):.1f} "
          f"min {min(prompt_lengths)} max {max(prompt_lengths)} total {sum(prompt_lengths)}")
    print(f"output tokens: median {statistics.median(outputs):.0f} mean {statistics.mean(outputs):.1f} "
          f"min {min(outputs)} max {max(outputs)} total {sum(outputs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
