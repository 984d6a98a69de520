#!/usr/bin/env python3
"""Reference fixtures for tessera's ggml dequantization (tests/engine/ggml_types_test.cpp).

The oracle is an independent implementation: the `gguf` Python package (gguf-py, numpy code in
gguf/quants.py). For each type we write, under tests/data/quant/:

  <type>.q        the raw encoded bytes (whole blocks)
  <type>.f32      gguf-py's dequantization of those bytes (little-endian float32)
  <type>.src.f32  (F16, BF16 only) the float32 inputs, so the C++ test also checks encoding
  sizes.txt       "<id> <name> <block_elems> <block_bytes>" for every type tessera knows

Legacy quants (Q4_0 ... Q8_0) are produced by gguf-py's quantizer from fixed-seed random data.
gguf-py has no k-quant quantizer, so K-type blocks are fixed-seed random bytes with their fp16
scale fields replaced by finite values; every bit pattern of the other fields is a legal block, and
random bytes exercise all of them. Deterministic: re-running produces identical files.

Usage: python3 scripts/make_quant_fixtures.py [out_dir]
"""
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests" / "data" / "quant"

# (block_elems, block_bytes) as tessera's table has them; Q8_1 is 36 bytes in current ggml
# (ggml-common.h: two fp16 + 32 int8) while gguf-py's table still says 40, so it is not listed.
KNOWN = [T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
         T.Q6_K, T.Q8_K, T.BF16]

# Byte offsets of the fp16 scale fields inside one block of each k-quant (ggml-common.h).
K_HALF_FIELDS = {
    T.Q2_K: [80, 82],   # scales[16] qs[64] d dmin
    T.Q3_K: [108],      # hmask[32] qs[64] scales[12] d
    T.Q4_K: [0, 2],     # d dmin scales[12] qs[128]
    T.Q5_K: [0, 2],     # d dmin scales[12] qh[32] qs[128]
    T.Q6_K: [208],      # ql[128] qh[64] scales[16] d
}


def legacy_input(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    x = rng.standard_normal((n_blocks, 32)).astype(np.float32)
    x *= np.float32(10.0) ** rng.uniform(-3, 2, size=(n_blocks, 1)).astype(np.float32)  # varied scales
    x[0] = 0.0                   # all-zero block: d == 0
    x[1] = np.float32(0.75)      # constant block
    x[2, :16] = -x[2, 16:]       # symmetric block
    return x.reshape(-1)


def half_specials() -> np.ndarray:
    vals = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 1e6, -1e6, np.inf, -np.inf,
            2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 2.0 ** -26, 3 * 2.0 ** -25,
            1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1e-8, 6.1e-5, 0.1, 1.0 / 3.0, 2049.0, 2051.0]
    return np.array(vals, dtype=np.float32)


def bf16_specials() -> np.ndarray:
    bits = np.array([0x00000000, 0x80000000, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F807FFF,
                     0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x00000001, 0x00800000, 0x807FFFFF,
                     0x3EAAAAAB, 0x40490FDB], dtype=np.uint32)
    return bits.view(np.float32)


def write(name: str, q: np.ndarray, deq: np.ndarray, src: np.ndarray | None = None) -> None:
    (OUT / f"{name}.q").write_bytes(np.ascontiguousarray(q).view(np.uint8).tobytes())
    (OUT / f"{name}.f32").write_bytes(np.asarray(deq, dtype="<f4").tobytes())
    if src is not None:
        (OUT / f"{name}.src.f32").write_bytes(np.asarray(src, dtype="<f4").tobytes())


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20241129)

    # Plain float types.
    x = rng.standard_normal(64).astype(np.float32)
    write("f32", x, dequantize(x.view(np.uint8), T.F32), None)

    with np.errstate(over="ignore"):
        src = np.concatenate([half_specials(), (rng.standard_normal(39) * 100).astype(np.float32)])
        q = src.astype(np.float16)  # numpy: IEEE round-to-nearest-even, overflow to inf
    write("f16", q, dequantize(q.view(np.uint8), T.F16), src)

    src = np.concatenate([bf16_specials(), rng.standard_normal(50).astype(np.float32)])
    q = quantize(src, T.BF16)
    write("bf16", q, dequantize(q, T.BF16), src)

    # Legacy block quants, quantized by gguf-py.
    for t in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        src = legacy_input(rng, 8)
        q = quantize(src.reshape(1, -1), t)
        write(t.name.lower(), q, dequantize(q, t).reshape(-1))

    # k-quants: random blocks with finite fp16 scales.
    for t, fields in K_HALF_FIELDS.items():
        _, block_bytes = gguf.GGML_QUANT_SIZES[t]
        n_blocks = 3
        blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for off in fields:
            scale = (rng.uniform(0.5, 2.0, size=n_blocks) * 10.0 ** rng.uniform(-4, -1, size=n_blocks))
            blocks[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        write(t.name.lower(), blocks, dequantize(blocks.reshape(-1), t).reshape(-1))

    model_rows()

    with open(OUT / "sizes.txt", "w") as f:
        for t in KNOWN:
            be, bb = gguf.GGML_QUANT_SIZES[t]
            f.write(f"{int(t)} {t.name} {be} {bb}\n")


MODEL = Path(__file__).resolve().parent.parent / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS = [("token_embd.weight", 49151), ("output_norm.weight", 0), ("blk.0.attn_q.weight", 3),
        ("blk.0.attn_norm.weight", 0), ("blk.29.ffn_down.weight", 575)]


def model_rows() -> None:
    """tests/data/gguf/smollm2_rows.txt: "<tensor> <row> <n> v0 .. v(n-1)", the first n values of a
    row as gguf-py's GGUFReader + dequantize see them (checks offsets and the Q4_1/Q8_0 paths on
    the real file). Skipped when the model is absent; the C++ test skips too."""
    if not MODEL.exists():
        return
    reader = gguf.GGUFReader(MODEL)
    tensors = {t.name: t for t in reader.tensors}
    out_dir = OUT.parent / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "smollm2_rows.txt", "w") as f:
        for name, row in ROWS:
            t = tensors[name]
            data = np.asarray(t.data)
            raw = data[row] if data.ndim > 1 else data
            values = dequantize(np.ascontiguousarray(raw).view(np.uint8), t.tensor_type).reshape(-1)[:64]
            f.write(f"{name} {row} {len(values)} " + " ".join(f"{v:.9g}" for v in values) + "\n")


if __name__ == "__main__":
    main()
