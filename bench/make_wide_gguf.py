#!/usr/bin/env python3
"""Writes a GGUF of SmolLM2-1.7B's shape with random weights in the default model's tensor types.

Why: decode's "fraction of the bandwidth limit" means something only when each token's weights come
from DRAM. SmolLM2-135M reads ~100 MB per token, which a large last-level cache (260 MiB on some
of the VMs we run on) holds, so there its decode is measured against cache bandwidth it does not
use. This file reads ~1.1 GB per token: past any L3, on every machine of this kind.

Both engines load the same file, so it also serves as the same-file peer comparison with
llama.cpp's `llama-bench` at a DRAM-bound size. The values are random: speed depends on shapes and
types only, and the text it generates is noise.

  python3 bench/make_wide_gguf.py [--base models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out PATH] [--seed 0]

Shape: HuggingFaceTB/SmolLM2-1.7B's config.json (24 layers, hidden 2048, 32 heads and 32 KV heads of
64, FFN 8192, vocabulary 49152, tied embeddings, rope theta 130000). Types: the base file's (Q4_1
matrices, a Q8_0 embedding that doubles as the output projection, F32 norms). The tokenizer and chat
template are copied from the base file, so prompts tokenize as with the default model.
Needs the `gguf` and `numpy` packages (bench/requirements.txt pins them).
"""

import argparse
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parent.parent

SHAPE = {  # HuggingFaceTB/SmolLM2-1.7B config.json
    "block_count": 24,
    "embedding_length": 2048,
    "feed_forward_length": 8192,
    "head_count": 32,
    "head_count_kv": 32,
    "head_dim": 64,
    "rope_freq_base": 130000.0,
}

# Metadata that describes the shape or the file itself: written from SHAPE or by the writer.
SHAPE_KEYS = {
    "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", "general.name",
    "general.size_label", "general.finetune", "general.basename",
    "llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.freq_base",
    "llama.rope.dimension_count",
}


def random_blocks(rng, qtype, rows, cols):
    """`rows` rows of `cols` weights in `qtype`, as the raw bytes the GGUF stores.

    Q4_1 block (ggml-common.h block_q4_1): fp16 scale d, fp16 minimum m, 16 bytes of nibbles, weight =
    d * q + m. Q8_0 block: fp16 d, 32 int8, weight = d * q. Scales are chosen so weights stay near
    the ±0.02 of a trained model's matrices: activations neither vanish nor overflow. Bytes, not
    gguf-py's quantize() of random floats: that takes minutes for 1.7 billion weights, this seconds.
    """
    if qtype not in (Q.Q4_1, Q.Q8_0):
        raise ValueError(f"no random blocks for {qtype.name}")
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rows * cols // block_weights
    data = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
    d = rng.uniform(0.002, 0.004, size=blocks).astype(np.float16)
    data[:, 0:2] = d.view(np.uint8).reshape(blocks, 2)
    if qtype == Q.Q4_1:
        m = (-8.0 * d.astype(np.float32)).astype(np.float16)
        data[:, 2:4] = m.view(np.uint8).reshape(blocks, 2)
    return data.reshape(rows, cols // block_weights * block_bytes)


def copy_metadata(reader, writer):
    for key, field in reader.fields.items():
        if key in SHAPE_KEYS:
            continue
        value_type = field.types[0]
        value = field.contents()
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, value_type, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, value_type)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, default=ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tessera_bench/smollm2-1.7b-shape.Q4_1.gguf"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    reader = gguf.GGUFReader(args.base)
    types = {t.name: t.tensor_type for t in reader.tensors}
    vocab = int(reader.fields["llama.vocab_size"].contents())
    s = SHAPE
    hidden, ffn, kv = s["embedding_length"], s["feed_forward_length"], s["head_count_kv"] * s["head_dim"]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(args.out, "llama")
    writer.add_name("SmolLM2-1.7B shape, random weights (bench/make_wide_gguf.py)")
    writer.add_block_count(s["block_count"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(s["head_count"])
    writer.add_head_count_kv(s["head_count_kv"])
    writer.add_rope_freq_base(s["rope_freq_base"])
    writer.add_rope_dimension_count(s["head_dim"])
    copy_metadata(reader, writer)

    rng = np.random.default_rng(args.seed)

    def matrix(name, rows, cols, qtype):  # `rows` outputs of `cols` inputs
        writer.add_tensor(name, random_blocks(rng, qtype, rows, cols), raw_dtype=qtype)

    def norm(name, n):
        writer.add_tensor(name, np.ones(n, dtype=np.float32))

    q_dim = s["head_count"] * s["head_dim"]
    layer_matrices = {  # (rows, cols); this order and the seed fix the file's bytes
        "attn_q": (q_dim, hidden),
        "attn_k": (kv, hidden),
        "attn_v": (kv, hidden),
        "attn_output": (hidden, q_dim),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }
    matrix("token_embd.weight", vocab, hidden, types["token_embd.weight"])
    norm("output_norm.weight", hidden)
    for layer in range(s["block_count"]):
        norm(f"blk.{layer}.attn_norm.weight", hidden)
        norm(f"blk.{layer}.ffn_norm.weight", hidden)
        for name, (rows, cols) in layer_matrices.items():
            # Every layer in the type of the base's first layer (SmolLM2-135M Q4_1: all Q4_1).
            matrix(f"blk.{layer}.{name}.weight", rows, cols, types[f"blk.0.{name}.weight"])

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(args.out)


if __name__ == "__main__":
    main()
