#!/usr/bin/env python3
"""Generates the input-grounded workload of bench/speculative_bench.sh: requests whose answer quotes,
edits or summarises a text given in the prompt, the case n-gram speculative decoding (prompt lookup,
docs/speculative.md) is for — most of the output is a copy of the input.

The texts are docstrings of the Python standard library (offline and stable for a given Python), cut
at a sentence end near 600 characters. Each text gets three tasks: quote it back, edit it (a word
replaced throughout), and summarise it quoting its key sentences. The prompts are completions that
state the task and start the answer with the text's first words: a chat instruction alone does not
make a 135M model quote (it paraphrases), and the workload is meant to be input-grounded for the
models the benchmark runs. One request per line: {"id": int, "prompt": str, "max_tokens": int}.

Usage: python3 bench/workloads/make_grounded.py [--out bench/workloads/grounded.jsonl] [--num-texts 12]
"""

import argparse
import importlib
import inspect
import json
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "grounded.jsonl"
MODULES = ["argparse", "json", "logging", "pathlib", "subprocess", "functools", "collections", "textwrap",
           "csv", "unittest", "itertools", "shutil", "tempfile", "datetime", "zipfile", "heapq"]
TASKS = [
    ("quote", "The text above, quoted back word for word:", lambda t: t),
    ("edit", "The text above, unchanged except that every 'the' is written 'THE':", lambda t: t.replace("the ", "THE ")),
    ("summarise", "A summary of the text above that quotes its most important sentences word for word:", lambda t: t),
]

def passage(module_name, limit=600):
    doc = inspect.getdoc(importlib.import_module(module_name)) or ""
    text = " ".join(doc.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit)
    return text[: cut + 1] if cut > limit // 3 else text[:limit]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--num-texts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    texts = [t for t in (passage(m) for m in MODULES) if len(t) > 200][: args.num_texts]
    with args.out.open("w") as f:
        i = 0
        for text in texts:
            for _, task, answer in TASKS:
                start = " ".join(answer(text).split()[:6])  # the answer's first words
                prompt = f"Text:\n{text}\n\n{task}\n{start}"
                f.write(json.dumps({"id": i, "prompt": prompt, "max_tokens": args.max_tokens}) + "\n")
                i += 1
    print(f"wrote {i} requests to {args.out}")


if __name__ == "__main__":
    main()
