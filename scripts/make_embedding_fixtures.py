#!/usr/bin/env python3
"""Writes tests/data/embeddings/smollm_embeddings.json: reference /v1/embeddings vectors of
SmolLM2-135M-Instruct for tests/cpu/embedding_parity_test.cpp and tests/e2e/api_surface_test.py.

The reference is computed here, independently of Tessera: the default GGUF's weights dequantized to
float32 by gguf-py, and a plain numpy LLaMA forward pass in float64 (RMSNorm, interleaved RoPE as
GGUF llama files pair it, grouped-query causal attention, SwiGLU) up to the final RMSNorm, the
decoder's last hidden state, pooled two ways as vLLM and llama-server do for generative models:
  mean: the average over every prompt token, L2-normalised (Tessera's default, --pooling mean);
  last: the last token's row, L2-normalised (--pooling last).

That forward pass is itself checked against transformers before anything is written: SmolLM2 ties its
LM head to the token embedding, so hidden_state @ token_embd^T must reproduce the transformers logits
committed in tests/data/logits (smollm_logits.bin, transformers 5.24 on the same dequantized weights)
at every position stored there; the script refuses to write the fixture otherwise. (transformers
itself is not needed, and was not installed where this fixture was made.)

The inputs are the three prompts of tests/data/logits (short, long: 520 tokens, chat: ChatML with
special tokens), with the ids llama.cpp's tokenizer gave them, so the tests can send either the
text (Tessera's tokenizer must give the same ids) or the ids.

Usage: python3 scripts/make_embedding_fixtures.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
Needs numpy and gguf (pip install numpy gguf).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LOGITS = REPO_ROOT / "tests" / "data" / "logits"
OUT = REPO_ROOT / "tests" / "data" / "embeddings" / "smollm_embeddings.json"


class model:
    def __init__(self, path: Path):
        r = GGUFReader(str(path))

        def field(key):
            f = r.fields[key]
            return f.parts[f.data[0]][0]

        self.layers = int(field("llama.block_count"))
        self.heads = int(field("llama.attention.head_count"))
        self.kv_heads = int(field("llama.attention.head_count_kv"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(field("llama.rope.freq_base"))
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}
        self.hidden = self.w["token_embd.weight"].shape[1]
        self.head_dim = self.hidden // self.heads
        assert "output.weight" not in self.w, "expected tied embeddings (the logits check relies on it)"

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, positions):
        # GGUF llama Q/K rows are permuted so that RoPE rotates dimension pairs (2i, 2i + 1).
        d = self.head_dim
        inv = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = positions[:, None] * inv[None, :]  # [T, d/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def last_hidden_state(self, ids):
        w, T, d = self.w, len(ids), self.head_dim
        x = w["token_embd.weight"][np.asarray(ids)]
        pos = np.arange(T, dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        group = self.heads // self.kv_heads
        for l in range(self.layers):
            p = f"blk.{l}."
            h = self.rms_norm(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(T, self.heads, d), pos)
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(T, self.kv_heads, d), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.kv_heads, d)
            out = np.empty((T, self.heads, d))
            for hh in range(self.heads):
                s = q[:, hh] @ k[:, hh // group].T / np.sqrt(d) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, hh // group]
            x = x + out.reshape(T, -1) @ w[p + "attn_output.weight"].T
            h = self.rms_norm(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        return self.rms_norm(x, w["output_norm.weight"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    args = ap.parse_args()
    m = model(args.model)
    index = json.loads((LOGITS / "smollm_logits.json").read_text())
    vocab = index["vocab_size"]
    logits = np.fromfile(LOGITS / index["bin_file"], dtype="<f4").reshape(-1, vocab)
    out = {
        "model": args.model.name,
        "generated_by": "scripts/make_embedding_fixtures.py (numpy float64 forward over the GGUF dequantized by gguf-py)",
        "hidden_size": m.hidden,
        "inputs": [],
    }
    for p in index["prompts"]:
        hidden = m.last_hidden_state(p["ids"])
        # The oracle's check against transformers: its logits at every stored position.
        worst = 0.0
        for row in p["rows"]:
            if row["source"] != "transformers":
                continue
            mine = hidden[row["position"]] @ m.w["token_embd.weight"].T
            worst = max(worst, float(np.max(np.abs(mine - logits[row["row"]]))))
        print(f"{p['name']:5s} {len(p['ids']):3d} tokens: max |logit - transformers'| {worst:.2e}")
        assert worst < 2e-3, f"the numpy forward disagrees with transformers on {p['name']}: {worst}"
        mean = hidden.mean(axis=0)
        last = hidden[-1]
        out["inputs"].append({
            "name": p["name"],
            "text": p["text"],
            "parse_special": p["parse_special"],
            "ids": p["ids"],
            "mean": [float(f"{v:.8g}") for v in mean / np.linalg.norm(mean)],
            "last": [float(f"{v:.8g}") for v in last / np.linalg.norm(last)],
        })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
