#!/usr/bin/env python3
"""Builds the Hugging Face model directory used by tests/cpu/hf_model_test.cpp.

transformers dequantizes the default GGUF model (SmolLM2-135M-Instruct, Q4_1) to float32, undoes
llama.cpp's Q/K row permutation (GGUF llama files pair RoPE dimensions (2i, 2i+1); HF checkpoints
use rotate_half, pairing (i, i + d/2)), and save_pretrained writes an ordinary HF checkpoint:
config.json, model.safetensors, tokenizer.json, tokenizer_config.json, ...

The weights are stored as float32 so they are exactly the dequantized GGUF values: the C++ test then
compares the two loaders' configs, tokenizers and logits (which checks the rotate-half RoPE path).
`--shards` splits the safetensors into several files with model.safetensors.index.json, to exercise
the sharded path as well (the test works with either).

models/ is git-ignored; scripts/setup regenerates the directory when transformers is importable.

Usage:
    python3 scripts/make_hf_fixture.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
                                       [--out models/SmolLM2-135M-Instruct-hf] [--shards]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO_ROOT / "models" / "SmolLM2-135M-Instruct-hf"


# transformers' GGUF tokenizer converter ignores tokenizer.ggml.pre and always writes a plain
# ByteLevel pre-tokenizer (the GPT-2 split). The upstream SmolLM2 repositories split every digit
# first (StarCoder style), which is what llama.cpp's "smollm" pre-tokenizer does; restore that so the
# directory looks like the real checkpoint and tokenizes like the GGUF file.
PRE_TOKENIZERS = {
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    },
}


def gguf_pre_tokenizer(path: Path) -> str | None:
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    field = GGUFReader(path).fields.get("tokenizer.ggml.pre")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def restore_pre_tokenizer(out: Path, pre: str | None) -> None:
    if pre not in PRE_TOKENIZERS:
        print(f"make_hf_fixture: keeping transformers' pre-tokenizer (GGUF pre = {pre!r})", file=sys.stderr)
        return
    path = out / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["pre_tokenizer"] = PRE_TOKENIZERS[pre]
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--shards", action="store_true", help="write ~200 MB shards plus an index")
    args = parser.parse_args()

    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # setup calls this only when they exist; say so when run by hand
        print(f"make_hf_fixture: needs torch and transformers ({e})", file=sys.stderr)
        return 1
    if not args.model.is_file():
        print(f"make_hf_fixture: {args.model} not found (run scripts/setup)", file=sys.stderr)
        return 1

    models_dir, name = str(args.model.parent), args.model.name
    model = AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=name, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(models_dir, gguf_file=name)

    # The weights are already plain float32 tensors; only the bookkeeping still says "gguf", which
    # save_pretrained refuses to serialize. Drop it so the checkpoint is an ordinary fp32 one.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.float32

    args.out.mkdir(parents=True, exist_ok=True)
    for stale in list(args.out.glob("*.safetensors")) + list(args.out.glob("*.safetensors.index.json")):
        stale.unlink()
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="200MB" if args.shards else "2GB")
    tok.save_pretrained(args.out)
    restore_pre_tokenizer(args.out, gguf_pre_tokenizer(args.model))
    print(f"wrote {args.out}: {sorted(p.name for p in args.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
