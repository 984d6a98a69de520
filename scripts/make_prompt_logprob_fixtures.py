#!/usr/bin/env python3
"""Writes tests/data/prompt_logprobs/smollm_prompt_logprobs.json: reference prompt-token logprobs of
SmolLM2-135M-Instruct for tests/cpu/prompt_logprobs_parity_test.cpp and tests/e2e/api_surface_test.py
(/v1/completions with echo and logprobs, vLLM's prompt_logprobs).

The reference is computed here, independently of Tessera, by the numpy float64 forward pass of
scripts/make_embedding_fixtures.py over the default GGUF's weights dequantized by gguf-py (that
script's `model`, which it checks against the transformers logits of tests/data/logits; the same check
runs here before anything is written): the final hidden states times the tied LM head give every
position's logits, and a float64 log-softmax of each row gives the logprob of the prompt's next token
(position i from row i - 1; the first token has none), its rank (1 + the tokens with a strictly larger
logit) and the 5 most likely tokens with their logprobs.

The inputs are the three prompts of tests/data/logits (short, 8 tokens; long, 520; chat, 37 with
special tokens) with the ids llama.cpp's tokenizer gave them.

Usage: python3 scripts/make_prompt_logprob_fixtures.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
Needs numpy and gguf (pip install numpy gguf).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_embedding_fixtures import DEFAULT_MODEL, LOGITS, REPO_ROOT, model  # noqa: E402

OUT = REPO_ROOT / "tests" / "data" / "prompt_logprobs" / "smollm_prompt_logprobs.json"
TOP = 5


def log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    args = ap.parse_args()
    m = model(args.model)
    index = json.loads((LOGITS / "smollm_logits.json").read_text())
    vocab = index["vocab_size"]
    reference_logits = np.fromfile(LOGITS / index["bin_file"], dtype="<f4").reshape(-1, vocab)
    out = {
        "model": args.model.name,
        "generated_by": "scripts/make_prompt_logprob_fixtures.py (numpy float64 forward over the GGUF "
                        "dequantized by gguf-py)",
        "top": TOP,
        "prompts": [],
    }
    for p in index["prompts"]:
        ids = p["ids"]
        logits = m.last_hidden_state(ids) @ m.w["token_embd.weight"].T  # [T, vocab], float64
        worst = 0.0
        for row in p["rows"]:
            if row["source"] == "transformers":
                worst = max(worst, float(np.max(np.abs(logits[row["position"]] - reference_logits[row["row"]]))))
        print(f"{p['name']:5s} {len(ids):3d} tokens: max |logit - transformers'| {worst:.2e}")
        assert worst < 2e-3, f"the numpy forward disagrees with transformers on {p['name']}: {worst}"
        lp = log_softmax(logits[:-1])  # row i - 1 scores position i
        positions = []
        for i in range(1, len(ids)):
            row = lp[i - 1]
            target = ids[i]
            order = np.lexsort((np.arange(vocab), -row))[:TOP]  # most likely first, ties by the lower id
            positions.append({
                "token": target,
                "logprob": float(f"{row[target]:.9g}"),
                "rank": int(1 + np.count_nonzero(row > row[target])),
                "top": [[int(t), float(f"{row[t]:.9g}")] for t in order],
            })
        out["prompts"].append({
            "name": p["name"],
            "text": p["text"],
            "parse_special": p["parse_special"],
            "ids": ids,
            "positions": positions,  # positions 1 .. len(ids) - 1
        })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
