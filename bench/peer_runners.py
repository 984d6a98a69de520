"""Peer engines for the Tessera benchmarks: llama.cpp (via llama-cpp-python's
low-level C API), HF transformers, and the Tessera CLI as a subprocess.

llama.cpp is driven through llama_decode directly rather than the high-level
Llama class so that (a) timings do not include Python-side logit copies of the
whole vocabulary for every position, and (b) several sequences can share one
batch (continuous batching, as in llama.cpp's server and batched example).
"""

from __future__ import annotations

import ctypes
import json
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TESSERA = REPO_ROOT / "build" / "bin" / "tessera"


def versions() -> dict:
    """Versions of every peer library that is importable."""
    found = {"numpy": np.__version__}
    for name in ("llama_cpp", "torch", "transformers"):
        try:
            module = __import__(name)
            found[name] = getattr(module, "__version__", "?")
        except ImportError:
            pass
    return found


class LlamaCpp:
    """One llama.cpp model + context with up to `n_seq_max` parallel sequences."""

    def __init__(self, model: Path, n_threads: int, n_ctx: int, n_batch: int = 512, n_seq_max: int = 1):
        import llama_cpp
        self.lib = llama_cpp
        llama_cpp.llama_backend_init()
        self._silence_logs()
        model_params = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(str(model).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp failed to load {model}")
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = n_batch
        ctx_params.n_ubatch = n_batch
        ctx_params.n_seq_max = n_seq_max
        ctx_params.n_threads = n_threads
        ctx_params.n_threads_batch = n_threads
        # One KV pool shared by all sequences (what llama-server does by default),
        # so a long request can use space a short one does not need.
        ctx_params.kv_unified = True
        ctx_params.no_perf = False  # keep llama.cpp's own timing counters
        self.ctx = llama_cpp.llama_init_from_model(self.model, ctx_params)
        if not self.ctx:
            raise RuntimeError("llama.cpp failed to create a context")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_batch = n_batch
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq_max)

    def _silence_logs(self) -> None:
        callback_type = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
        self._log_callback = callback_type(lambda level, text, user: None)  # keep a reference
        self.lib.llama_log_set(self._log_callback, ctypes.c_void_p(0))

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.lib.llama_model_free(self.model)
            self.ctx = None

    def tokenize(self, text: str, parse_special: bool = False) -> list[int]:
        raw = text.encode("utf-8")
        capacity = len(raw) + 8
        buffer = (self.lib.llama_token * capacity)()
        count = self.lib.llama_tokenize(self.vocab, raw, len(raw), buffer, capacity, False, parse_special)
        if count < 0:
            raise RuntimeError("llama_tokenize buffer too small")
        return list(buffer[:count])

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)

    def remove_sequence(self, seq_id: int) -> None:
        self.lib.llama_memory_seq_rm(self.memory, seq_id, -1, -1)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """Runs one llama_decode over (token, position, seq_id, want_logits) entries."""
        batch = self.batch
        for i, (token, position, seq_id, want_logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq_id
            batch.logits[i] = want_logits
        batch.n_tokens = len(entries)
        status = self.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def argmax(self, batch_index: int) -> int:
        """Greedy token from the logits of entry `batch_index` of the last decode."""
        row = self.lib.llama_get_logits_ith(self.ctx, batch_index)
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(self.n_vocab,))))

    def perf(self) -> dict:
        data = self.lib.llama_perf_context(self.ctx)
        return {"t_p_eval_ms": data.t_p_eval_ms, "n_p_eval": data.n_p_eval,
                "t_eval_ms": data.t_eval_ms, "n_eval": data.n_eval}


@dataclass
class TesseraResult:
    data: dict
    command: str


def run_tessera(binary: Path, args: list[str], timeout_s: float) -> TesseraResult:
    """Runs `tessera <args>` and returns the last JSON object it printed on stdout."""
    command = [str(binary)] + args
    printable = " ".join(shlex.quote(part) for part in command)
    if not binary.exists():
        raise FileNotFoundError(f"Tessera binary not found: {binary} (build it, or pass --skip-tessera)")
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if completed.returncode != 0:
        raise RuntimeError(f"{printable} exited with {completed.returncode}:\n{completed.stderr[-2000:]}")
    for line in reversed(completed.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return TesseraResult(json.loads(line), printable)
    raise RuntimeError(f"{printable} printed no JSON line:\n{completed.stdout[-2000:]}")


def load_hf_model(model: Path, n_threads: int):
    """fp32 transformers model dequantized from the GGUF."""
    import os
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(n_threads)
    hf_model = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, dtype=torch.float32)
    hf_model.eval()
    return hf_model


def machine_info() -> dict:
    """Platform and load; a loaded machine makes every number here meaningless."""
    import os
    import platform
    info = {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "loadavg_1m": os.getloadavg()[0]}
    if info["loadavg_1m"] > (os.cpu_count() or 1):
        print(f"warning: load average {info['loadavg_1m']:.1f} exceeds {os.cpu_count()} CPUs; "
              "timings will be noisy (llama.cpp's OpenMP threads spin at barriers and suffer most)",
              file=__import__("sys").stderr)
    return info


class Stopwatch:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        return False


def write_report(out: Path, benchmark: str, args, **sections) -> None:
    """Writes one benchmark's JSON report: when, where, how it was configured, then its sections."""
    report = {
        "benchmark": benchmark,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "versions": versions(),
        **sections,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out}")
