#!/usr/bin/env python3
"""Builds the per-architecture parity fixtures in tests/data/models/<arch>/ (tests/cpu/model_parity_test.cpp).

For each architecture: a tiny random model made with transformers (fixed seed; hidden and FFN widths of
256 so that K-quants accept the rows; 2 layers), with a small BPE tokenizer trained by the `tokenizers`
library in the family's style (pre-tokenizer regex, byte-level or SentencePiece-style byte fallback),
saved as an ordinary Hugging Face directory (config.json, model.safetensors in BF16, tokenizer.json,
tokenizer_config.json). Then:

  * transformers' fp32 logits (the checkpoint loaded back as float32) for a prompt and 16 greedy tokens:
    every prompt position and every decode step;
  * the same model converted by llama.cpp's own convert_hf_to_gguf.py (the pinned sources of
    bench/build_llama_cpp.sh) to GGUF, F16 and/or Q8_0, and quantized to Q4_K_M / Q6_K from the F16 file
    by llama-quantize (or, before bench/build_llama_cpp.sh has built it, by the library function it calls,
    llama_model_quantize, through scripts/llama_cpp_oracle.cpp: the same bytes);
  * llama.cpp's logits and greedy tokens on each GGUF (scripts/llama_cpp_oracle.cpp, linked against the
    pinned build's static libllama).

The converter identifies a BPE tokenizer's pre-tokenizer by hashing how it splits a fixed text, which a
freshly trained tokenizer never matches. We run it in-process with TextModel.get_vocab_base_pre
returning the name of the family's pre-tokenizer ("llama-bpe", "qwen2"): the split rules are the same,
only the vocabulary differs.

Written per architecture: the HF files, <arch>-<type>.gguf, oracle.json (prompt text and ids, greedy
tokens per source, each source's byte offset and dtype in oracle.bin, the references' agreement) and
oracle.bin (little-endian logits rows of vocab_size values: transformers' as float32, llama.cpp's as
float16). The GGUF types per architecture are chosen to keep tests/data/models small: all four for
llama, Q8_0 (the closest to the exact math) for the others.

Usage:
    python3 scripts/make_model_fixtures.py [--arch llama,qwen2,...] [--peers DIR] [--out tests/data/models]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "models"
PIN = "0.3.36"
SEED = 1234
NUM_GREEDY = 16
VOCAB = 384       # byte-level BPE vocabularies (256 byte symbols + merges + specials)
SPM_VOCAB = 512   # SentencePiece ones (256 byte-fallback pieces + specials + characters + merges)
N_CTX = 256

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

# ~40 tokens with the tiny vocabularies: longer than the 8-token sliding windows, and than Phi-3's
# 32-position original context (so transformers' longrope uses the long factors from the first step,
# as llama.cpp and Tessera do for a 256-position context).
PROMPT = "The quick brown fox jumps over the lazy dog. Pack my box."

COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=N_CTX,
              rms_norm_eps=1e-6, initializer_range=0.08)

# arch -> (transformers config class, config overrides, tokenizer style, converter pre-tokenizer, GGUF types)
ARCHS = {
    "llama": dict(config="LlamaConfig", tok="llama3", pre="llama-bpe", gguf=["f16", "q4_k_m", "q6_k"],
                  kw=dict(rope_theta=500000.0, tie_word_embeddings=True, head_dim=64,
                          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                            high_freq_factor=4.0, original_max_position_embeddings=64))),
    "qwen2": dict(config="Qwen2Config", tok="qwen2", pre="qwen2", gguf=["q8_0"],
                  kw=dict(rope_theta=1000000.0, tie_word_embeddings=True,
                          rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64))),
    "qwen3": dict(config="Qwen3Config", tok="qwen2", pre="qwen2", gguf=["q8_0"],
                  kw=dict(rope_theta=1000000.0, tie_word_embeddings=True, head_dim=32)),
    "mistral": dict(config="MistralConfig", tok="spm_llama", gguf=["q8_0"],
                    kw=dict(rope_theta=1000000.0, tie_word_embeddings=True, sliding_window=8, head_dim=64)),
    # Untied output projection: phi3 (the others tie, as their small real models do, to keep the
    # fixtures small). Gemma: norms stored as w for x * (1 + w), so perturbed around 0. Soft-caps of 5 (real: 50 / 30) so
    # that the tanh is far from linear on these logits; query_pre_attn_scalar != head_dim in Gemma 3.
    "gemma2": dict(config="Gemma2Config", tok="spm_gemma", gguf=["q8_0"], norm_offset=True,
                   kw=dict(head_dim=64, query_pre_attn_scalar=64, attn_logit_softcapping=5.0,
                           final_logit_softcapping=5.0, sliding_window=8, tie_word_embeddings=True,
                           hidden_activation="gelu_pytorch_tanh")),
    "gemma3": dict(config="Gemma3TextConfig", tok="spm_gemma", gguf=["q8_0"], norm_offset=True,
                   kw=dict(head_dim=64, query_pre_attn_scalar=48, sliding_window=8, tie_word_embeddings=True,
                           layer_types=["sliding_attention", "full_attention"],
                           hidden_activation="gelu_pytorch_tanh",
                           rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    # Phi-3: fused qkv / gate_up, LongRoPE over an original context of 32 (< the prompt, so transformers
    # uses the long factors as llama.cpp and Tessera do for a 256-position context).
    "phi3": dict(config="Phi3Config", tok="spm_phi3", gguf=["q8_0"], longrope=True,
                 kw=dict(rope_theta=10000.0, tie_word_embeddings=False, original_max_position_embeddings=32,
                         sliding_window=None, bos_token_id=1, eos_token_id=2, pad_token_id=None)),
}

# llama_ftype numbers (llama.h) for llama_model_quantize.
FTYPES = {"q4_k_m": 15, "q6_k": 18}


def corpus() -> list[str]:
    """Deterministic English prose (stdlib docstrings) to train the tiny tokenizers on."""
    texts = []
    for name in ("json", "heapq", "textwrap", "difflib", "functools", "contextlib", "collections", "argparse"):
        texts.append(inspect.getdoc(importlib.import_module(name)) or "")
    return texts + [PROMPT]


def train_spm(style: str, out: Path):
    """A SentencePiece BPE model with byte fallback (the LLaMA-2 / Mistral v0.x / Phi-3 recipe, or Gemma's
    without the dummy prefix), its tokenizer.json made by transformers' converter as for the real models."""
    import sentencepiece as spm
    import transformers
    gemma = style == "spm_gemma"
    # Phi-3's vocabulary has <|endoftext|> (llama.cpp's loader looks it up for any model named phi3).
    extra = dict(control_symbols=["<|endoftext|>"]) if style == "spm_phi3" else {}
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "corpus.txt"
        text.write_text("\n".join(t.replace("\n", " ") for t in corpus()), encoding="utf-8")
        # Gemma's special pieces as its tokenizer.model names them (else transformers' GemmaTokenizer
        # appends its own <bos>/<eos>/<mask> after the vocabulary).
        ids = (dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
                    unk_piece="<unk>", control_symbols=["<mask>"])
               if gemma else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(Path(tmp) / "m"), vocab_size=SPM_VOCAB,
                                       model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                       add_dummy_prefix=not gemma, normalization_rule_name="identity",
                                       split_digits=True, allow_whitespace_only_pieces=True,
                                       remove_extra_whitespaces=False, minloglevel=2, num_threads=1, **ids, **extra)
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "tokenizer.model").write_bytes((Path(tmp) / "m.model").read_bytes())
        cls = transformers.GemmaTokenizer if gemma else transformers.LlamaTokenizer
        tok = cls.from_pretrained(src)
        tok.save_pretrained(out)
        (out / "tokenizer.model").write_bytes((src / "tokenizer.model").read_bytes())
    return tok


def train_tokenizer(style: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    regex = {"llama3": LLAMA3_REGEX, "qwen2": QWEN2_REGEX}[style]
    specials = {"llama3": ["<|begin_of_text|>", "<|end_of_text|>"], "qwen2": ["<|endoftext|>", "<|im_start|>"]}[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok, specials


def save_tokenizer(tok, specials: list[str], out: Path) -> None:
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[-1])
    fast.save_pretrained(out)


def make_model(arch: str, spec: dict, out: Path, vocab_size: int):
    import torch
    import transformers
    torch.manual_seed(SEED)
    kw = {**COMMON, **spec["kw"], "vocab_size": vocab_size}
    if spec.get("longrope"):
        # Per-pair factors, long > short, distinct per dimension so a wrong choice or order shows.
        half = kw.get("head_dim", kw["hidden_size"] // kw["num_attention_heads"]) // 2
        g = np.random.default_rng(SEED)
        kw["rope_scaling"] = dict(rope_type="longrope", original_max_position_embeddings=32,
                                  short_factor=[float(x) for x in 1.0 + g.random(half)],
                                  long_factor=[float(x) for x in 2.0 + 8.0 * g.random(half)])
    config = getattr(transformers, spec["config"])(**kw)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # transformers initialises norms to 1 and biases to 0, which would hide a missing or misplaced
        # one: perturb every 1-D parameter.
        for name, p in model.named_parameters():
            if p.ndim == 1:
                base = 0.0 if ("bias" in name or spec.get("norm_offset")) else 1.0
                p.copy_(base + 0.1 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return config


def transformers_oracle(out: Path, ids: list[int]):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    rows = []
    with torch.no_grad():
        res = model(torch.tensor([ids]), use_cache=True)
        rows.extend(res.logits[0].float().numpy())
        past = res.past_key_values
        greedy = [int(np.argmax(rows[-1]))]
        while len(greedy) < NUM_GREEDY:
            pos = len(ids) + len(greedy) - 1
            res = model(torch.tensor([[greedy[-1]]]), past_key_values=past, use_cache=True,
                        position_ids=torch.tensor([[pos]]))
            past = res.past_key_values
            rows.append(res.logits[0, -1].float().numpy())
            greedy.append(int(np.argmax(rows[-1])))
    return np.stack(rows).astype(np.float32), greedy


def convert(src: Path, hf_dir: Path, outfile: Path, outtype: str, pre: str) -> None:
    """llama.cpp's converter, in a subprocess, with the pre-tokenizer name given instead of hashed."""
    code = f"""
import sys
sys.path.insert(0, {str(src / 'gguf-py')!r})
sys.path.insert(0, {str(src)!r})
import conversion.base as base
if {pre!r} is not None:
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
import convert_hf_to_gguf as c
sys.argv = ['convert_hf_to_gguf.py', {str(hf_dir)!r}, '--outfile', {str(outfile)!r}, '--outtype', {outtype!r}]
c.main()
"""
    env = {**os.environ, "PYTHONPATH": ""}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL)


def build_oracle_tool(peers: Path) -> Path:
    tool = peers / "build" / "tessera_llama_cpp_oracle"
    src = REPO_ROOT / "scripts" / "llama_cpp_oracle.cpp"
    if tool.exists() and tool.stat().st_mtime > src.stat().st_mtime:
        return tool
    b = peers / "build"
    libs = [b / "src" / "libllama.a", b / "ggml" / "src" / "libggml.a", b / "ggml" / "src" / "libggml-cpu.a",
            b / "ggml" / "src" / "libggml-base.a"]
    missing = [str(p) for p in libs if not p.exists()]
    if missing:
        sys.exit(f"make_model_fixtures: run bench/build_llama_cpp.sh first (missing {missing})")
    subprocess.run(["g++", "-O2", "-std=c++17", f"-I{peers / 'src' / 'include'}", f"-I{peers / 'src' / 'ggml' / 'include'}",
                    str(src), *map(str, libs), "-fopenmp", "-lpthread", "-ldl", "-o", str(tool)], check=True)
    return tool


def llama_cpp_oracle(tool: Path, gguf: Path, ids: list[int]):
    res = subprocess.run([str(tool), "logits", str(gguf), str(N_CTX), str(NUM_GREEDY), *map(str, ids)],
                         check=True, capture_output=True)
    data = res.stdout
    vocab, num_rows = struct.unpack_from("<ii", data, 0)
    rows = np.frombuffer(data, dtype="<f4", count=vocab * num_rows, offset=8).reshape(num_rows, vocab)
    greedy = list(np.frombuffer(data, dtype="<i4", count=NUM_GREEDY, offset=8 + 4 * vocab * num_rows))
    return rows.astype(np.float32), [int(g) for g in greedy]


def stats(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "max_abs_logit": float(np.abs(b).max())}


def make_arch(arch: str, spec: dict, out_root: Path, peers: Path, tool: Path) -> None:
    out = out_root / arch
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        stale.unlink()
    if spec["tok"].startswith("spm"):
        hf_tok = train_spm(spec["tok"], out)
        vocab_size = len(hf_tok)
        ids = hf_tok.encode(PROMPT, add_special_tokens=False)
    else:
        tok, specials = train_tokenizer(spec["tok"])
        save_tokenizer(tok, specials, out)
        vocab_size = tok.get_vocab_size()
        ids = tok.encode(PROMPT).ids
    make_model(arch, spec, out, vocab_size)
    sources = {}
    sources["transformers"] = transformers_oracle(out, ids)
    with tempfile.TemporaryDirectory() as tmp:
        for t in spec["gguf"]:
            path = out / f"{arch}-{t}.gguf"
            if t in ("f16", "q8_0"):
                convert(peers / "src", out, path, t, spec.get("pre"))
            else:
                f16 = out / f"{arch}-f16.gguf"
                if not f16.exists():
                    f16 = Path(tmp) / "f16.gguf"
                    convert(peers / "src", out, f16, "f16", spec.get("pre"))
                # llama-quantize when bench/build_llama_cpp.sh has built it, else the same library call
                # (llama_model_quantize) through the oracle tool; both write identical files.
                quantize = peers / "build" / "bin" / "llama-quantize"
                cmd = ([str(quantize), str(f16), str(path), t.upper()] if quantize.exists() else
                       [str(tool), "quantize", str(f16), str(path), str(FTYPES[t])])
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            sources[f"llama_cpp:{t}"] = llama_cpp_oracle(tool, path, ids)
    index = {"arch": arch, "prompt": PROMPT, "ids": ids, "num_greedy": NUM_GREEDY, "n_ctx": N_CTX,
             "rows_per_source": len(ids) + NUM_GREEDY - 1, "sources": []}
    blobs = []
    ref_rows = sources["transformers"][0]
    vocab = ref_rows.shape[1]
    for name, (rows, greedy) in sources.items():
        assert rows.shape == (len(ids) + NUM_GREEDY - 1, vocab), (name, rows.shape)
        entry = {"name": name, "greedy": greedy}
        if name != "transformers":
            entry["gguf"] = f"{arch}-{name.split(':')[1]}.gguf"
            # Prompt rows only: after the first greedy token on which the sources differ, each decodes
            # its own continuation (the C++ test feeds each source's own tokens).
            entry["vs_transformers_prompt"] = stats(rows[:len(ids)], ref_rows[:len(ids)])
            entry["greedy_equal_transformers"] = greedy == sources["transformers"][1]
        index["sources"].append(entry)
        blobs.append(rows)
    index["vocab_size"] = vocab
    # transformers' rows in float32 (the exact comparison), llama.cpp's in float16 (compared at a
    # percent of the logit scale; f16 keeps 1e-3 of it): oracle.json gives each source's offset.
    offset = 0
    with open(out / "oracle.bin", "wb") as f:
        for entry, rows in zip(index["sources"], blobs):
            dtype = "<f4" if entry["name"] == "transformers" else "<f2"
            entry["dtype"] = "f32" if dtype == "<f4" else "f16"
            entry["offset"] = offset
            data = rows.astype(dtype).tobytes()
            f.write(data)
            offset += len(data)
    (out / "oracle.json").write_text(json.dumps(index, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{arch}: {len(ids)} prompt ids, {size / 1e6:.2f} MB; " +
          "; ".join(f"{s['name']}: {s.get('vs_transformers_prompt', {}).get('max_abs', 0):.4f}" for s in index["sources"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default=",".join(ARCHS))
    parser.add_argument("--peers", type=Path,
                        default=Path(os.environ.get("TESSERA_PEERS", Path.home() / ".cache" / "tessera" / "peers")) /
                        f"llama.cpp-{PIN}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if not (args.peers / "src" / "convert_hf_to_gguf.py").exists():
        print(f"make_model_fixtures: no llama.cpp sources in {args.peers} (bench/build_llama_cpp.sh)", file=sys.stderr)
        return 1
    tool = build_oracle_tool(args.peers)
    for arch in args.arch.split(","):
        make_arch(arch, ARCHS[arch], args.out, args.peers, tool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
