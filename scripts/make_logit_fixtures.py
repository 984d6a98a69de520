#!/usr/bin/env python3
"""Builds the logit parity fixture in tests/data/logits/.

Two independent references run the same token ids through SmolLM2-135M-Instruct
(Q4_1 GGUF):
  * HF transformers, which dequantizes the GGUF weights to fp32 and computes in
    fp32 (the "exact math" reference);
  * llama.cpp through llama-cpp-python (logits_all=True), which, like Tessera's
    CPU executor, quantizes activations to Q8 for integer dot products.

Input ids always come from llama.cpp's tokenizer (special=True for the ChatML
prompt) and are stored, so the C++ test feeds identical ids.

Outputs:
  smollm_logits.bin   float32 little-endian rows of vocab_size floats each
  smollm_logits.json  index: prompts, ids, which row holds which (source, position),
                      greedy continuations from both references, agreement stats

Usage:
    python3 scripts/make_logit_fixtures.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
                                           [--out-dir tests/data/logits]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT_DIR = REPO_ROOT / "tests" / "data" / "logits"
NUM_GREEDY_TOKENS = 64
LONG_PROMPT_TOKENS = 520

CHAT_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
               "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
               "<|im_start|>assistant\n")
SHORT_PROMPT = "The quick brown fox jumps over the lazy"


def long_prompt_text() -> str:
    """Deterministic English prose: stdlib module docstrings (offline, stable per Python version)."""
    parts = []
    for name in ("json", "heapq", "textwrap", "difflib", "functools", "contextlib"):
        parts.append(inspect.getdoc(importlib.import_module(name)) or "")
    return "\n\n".join(parts)


def stored_positions(num_tokens: int, count: int) -> list[int]:
    """`count` positions spread from the first to the last token (deduplicated, sorted)."""
    if num_tokens <= count:
        return list(range(num_tokens))
    return sorted({round(i * (num_tokens - 1) / (count - 1)) for i in range(count)})


class LlamaCppReference:
    def __init__(self, model: Path, n_ctx: int, n_threads: int):
        import llama_cpp
        self.version = llama_cpp.__version__
        self.llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_ctx, n_threads=n_threads,
                                   n_threads_batch=n_threads, logits_all=True, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def tokenize(self, text: str, special: bool) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def prompt_logits_and_greedy(self, ids: list[int], num_new: int) -> tuple[np.ndarray, list[int]]:
        """Logits for every prompt position, then greedy decoding that ignores EOS."""
        self.llm.reset()
        self.llm.eval(ids)
        logits = np.array(self.llm.scores[:len(ids)], dtype=np.float32, copy=True)
        generated = []
        next_id = int(np.argmax(logits[-1]))
        for _ in range(num_new):
            generated.append(next_id)
            self.llm.eval([next_id])
            next_id = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
        return logits, generated


class TransformersReference:
    def __init__(self, model: Path, n_threads: int):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
        torch.set_num_threads(n_threads)
        self.torch = torch
        self.version = f"transformers {transformers.__version__}, torch {torch.__version__}"
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model.parent), gguf_file=model.name, dtype=torch.float32)
        self.model.eval()

    def prompt_logits_and_greedy(self, ids: list[int], num_new: int) -> tuple[np.ndarray, list[int]]:
        torch = self.torch
        with torch.no_grad():
            out = self.model(torch.tensor([ids]), use_cache=True)
            logits = out.logits[0].float().numpy().copy()
            past = out.past_key_values
            generated = []
            next_id = int(np.argmax(logits[-1]))
            for _ in range(num_new):
                generated.append(next_id)
                step = self.model(torch.tensor([[next_id]]), past_key_values=past, use_cache=True)
                past = step.past_key_values
                next_id = int(torch.argmax(step.logits[0, -1]))
        return logits, generated


def write_f32_gguf(source: Path, target: Path) -> None:
    """Copies a GGUF with every tensor dequantized to F32 (same metadata)."""
    import gguf
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, values.reshape([int(d) for d in reversed(tensor.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def f32_check(model: Path, out_dir: Path, n_threads: int) -> int:
    """Runs llama.cpp on an all-F32 copy of the model with an F32 KV cache (so no
    activation quantization) and compares with the stored transformers rows. A small
    difference here shows that the transformers rows are the exact fp32 math and that
    the larger transformers-vs-llama.cpp(Q4_1) gap comes from llama.cpp's Q8 activations."""
    import tempfile
    import llama_cpp
    index = json.loads((out_dir / "smollm_logits.json").read_text())
    matrix = np.fromfile(out_dir / index["bin_file"], dtype="<f4").reshape(index["num_rows"], index["vocab_size"])
    with tempfile.TemporaryDirectory() as tmp:
        f32_path = Path(tmp) / "model-f32.gguf"
        write_f32_gguf(model, f32_path)
        configs = [("F32 weights, F32 KV", f32_path, 0), ("Q4_1 weights, F32 KV", model, 0),
                   ("Q4_1 weights, F16 KV (llama.cpp default)", model, 1)]  # 0 = GGML_TYPE_F32, 1 = F16
        for label, path, kv_type in configs:
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=n_threads, n_threads_batch=n_threads,
                                  logits_all=True, verbose=False, type_k=kv_type, type_v=kv_type, flash_attn=False)
            for prompt in index["prompts"]:
                llm.reset()
                llm.eval(prompt["ids"])
                logits = np.array(llm.scores[:len(prompt["ids"])], dtype=np.float32)
                diffs = [float(np.abs(logits[r["position"]] - matrix[r["row"]]).max())
                         for r in prompt["rows"] if r["source"] == "transformers"]
                print(f"llama.cpp {label:<42} vs transformers, {prompt['name']:>5}: "
                      f"max|d| over stored rows = {max(diffs):.2e}")
            del llm
    return 0


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(hf: np.ndarray, cpp: np.ndarray) -> dict:
    diff = np.abs(hf - cpp)
    top1_hf, top1_cpp = hf.argmax(axis=1), cpp.argmax(axis=1)
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "max_abs_logit": float(np.abs(hf).max()),
        "top1_agreement": float((top1_hf == top1_cpp).mean()),
        "num_positions": int(hf.shape[0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--positions", type=int, default=5, help="transformers rows stored per prompt")
    parser.add_argument("--f32-check", action="store_true",
                        help="compare the stored transformers rows with llama.cpp on an F32 copy of the model")
    args = parser.parse_args()
    if args.f32_check:
        return f32_check(args.model, args.out_dir, args.threads)

    cpp = LlamaCppReference(args.model, n_ctx=1024, n_threads=args.threads)
    long_ids = cpp.tokenize(long_prompt_text(), special=False)
    if len(long_ids) < LONG_PROMPT_TOKENS:
        raise SystemExit(f"long prompt text too short: {len(long_ids)} tokens")
    prompts = [
        {"name": "short", "special": False, "ids": cpp.tokenize(SHORT_PROMPT, special=False), "text": SHORT_PROMPT},
        {"name": "long", "special": False, "ids": long_ids[:LONG_PROMPT_TOKENS],
         "text": cpp.llm.detokenize(long_ids[:LONG_PROMPT_TOKENS]).decode("utf-8")},
        {"name": "chat", "special": True, "ids": cpp.tokenize(CHAT_PROMPT, special=True), "text": CHAT_PROMPT},
    ]

    cpp_results = {p["name"]: cpp.prompt_logits_and_greedy(p["ids"], NUM_GREEDY_TOKENS) for p in prompts}
    del cpp  # free the llama.cpp context before loading the fp32 model
    hf = TransformersReference(args.model, args.threads)
    hf_results = {p["name"]: hf.prompt_logits_and_greedy(p["ids"], NUM_GREEDY_TOKENS) for p in prompts}

    args.out_dir.mkdir(parents=True, exist_ok=True)
    bin_path = args.out_dir / "smollm_logits.bin"
    rows: list[np.ndarray] = []
    index_prompts = []
    for prompt in prompts:
        name, ids = prompt["name"], prompt["ids"]
        hf_logits, hf_greedy = hf_results[name]
        cpp_logits, cpp_greedy = cpp_results[name]
        assert hf_logits.shape == cpp_logits.shape == (len(ids), hf_logits.shape[1])
        row_refs = []
        # transformers (fp32 math) rows at several positions; llama.cpp rows at
        # the first and last position only, to keep the fixture small.
        for position in stored_positions(len(ids), args.positions):
            row_refs.append({"source": "transformers", "position": position, "row": len(rows)})
            rows.append(hf_logits[position])
        for position in sorted({0, len(ids) - 1}):
            row_refs.append({"source": "llama_cpp", "position": position, "row": len(rows)})
            rows.append(cpp_logits[position])
        divergence = first_divergence(hf_greedy, cpp_greedy)
        index_prompts.append({
            "name": name,
            "text": prompt["text"],
            "parse_special": prompt["special"],
            "ids": ids,
            "rows": row_refs,
            "greedy_transformers": hf_greedy,
            "greedy_llama_cpp": cpp_greedy,
            "greedy_first_divergence": divergence,
            "top1_transformers": [int(i) for i in hf_logits.argmax(axis=1)],
            "transformers_vs_llama_cpp": compare(hf_logits, cpp_logits),
        })

    matrix = np.stack(rows).astype("<f4")
    matrix.tofile(bin_path)
    import llama_cpp
    index = {
        "model": args.model.name,
        "vocab_size": int(matrix.shape[1]),
        "dtype": "float32 little-endian, row-major; row r starts at byte r * vocab_size * 4",
        "bin_file": bin_path.name,
        "num_rows": int(matrix.shape[0]),
        "add_bos": False,
        "row_semantics": "logits at position p predict the token after ids[p]",
        "greedy": f"{NUM_GREEDY_TOKENS} argmax tokens after the prompt, EOS ignored",
        "generated_by": {
            "script": "scripts/make_logit_fixtures.py",
            "llama_cpp_python": llama_cpp.__version__,
            "transformers": hf.version,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "prompts": index_prompts,
    }
    json_path = args.out_dir / "smollm_logits.json"
    json_path.write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")

    print(f"wrote {bin_path} ({bin_path.stat().st_size} bytes, {matrix.shape[0]} rows) and {json_path}")
    for entry in index_prompts:
        stats = entry["transformers_vs_llama_cpp"]
        print(f"{entry['name']:>5}: {len(entry['ids'])} ids; HF vs llama.cpp max|d|={stats['max_abs_diff']:.4f} "
              f"mean|d|={stats['mean_abs_diff']:.5f} top1={stats['top1_agreement']:.3f} "
              f"(max|logit|={stats['max_abs_logit']:.1f}); greedy first divergence: {entry['greedy_first_divergence']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
