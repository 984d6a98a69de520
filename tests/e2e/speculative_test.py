#!/usr/bin/env python3
"""End-to-end tests of speculative decoding (docs/speculative.md) on the real default model.

Starts a plain `tessera serve` and one with `--speculative ngram`, drives both with the official `openai`
client on input-grounded prompts (the answer quotes the prompt, so n-gram drafts get accepted) and
checks: greedy text is the same on both, streamed and not, one request and several at once; /metrics
of the speculative server counts accepted draft tokens and the final usage carries them; a request with
"speculative": false is served without drafts; bad values get a 400 naming the field, bad flags a CLI
error naming the flag. A third server speculates with a draft model (`--speculative draft -md MODEL`,
the model as its own draft, llama-server's spellings): the same greedy text streamed and not, alone and
concurrent, usage.speculative and the tessera_spec_decode_* counters move, sampled requests draw their
drafts from the draft's distribution (nearly all accepted, seeded output repeats; with
`--draft-sampling argmax --draft-branches 3`, argmax drafts with runner-up leaves, greedy output is
plain decoding's, seeded output repeats, and more tokens per verification than a chain can hold: the
trees reach the executor), and a draft that does not load or has
another vocabulary (gemma-3-270m, when present) is a startup error naming --draft-model.
A fourth verifies n-gram token trees (`--ngram-branches 4`): the same greedy text alone and concurrent,
and a constrained request's JSON unchanged. A fifth drafts with the model's own first 24 layers
(`--draft-layers 24`, two tokens per position: trees of sampled drafts for sampled requests): the same
greedy text, seeded sampled text that repeats, its draft pool empty after; out-of-range and conflicting
--draft-layers are startup errors naming it. Prints "N passed, M failed" and exits non-zero on any failure.
Usage: speculative_test.py TESSERA_BINARY MODEL
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys

from served import case, missing_client, served, summary  # tests/e2e/served.py

BIN, MODEL = sys.argv[1], sys.argv[2]
MODEL_ID = os.path.basename(MODEL)
try:
    import openai
except ImportError as e:  # the lead's scripts/setup installs it
    missing_client(e, "pip install openai")

ENGINE = ["--threads", "2", "--num-kv-blocks", "128", "--swap-space", "0.05", "--max-model-len", "1024", "--quiet"]
SPEC = ["--speculative", "ngram", "--num-speculative-tokens", "4", "--ngram-min", "1", "--ngram-max", "4",
        "--speculative-max-batch", "8"]

TEXTS = [
    "The committee met on Tuesday to review the budget for the coming year and agreed to fund the new library.",
    "To install the package, run the setup script, then restart the server and check the log for errors.",
    "The fox ran through the forest, crossed the river at dawn and hid beneath the old oak tree until night.",
]


def grounded(i):
    t = TEXTS[i % len(TEXTS)]
    return f"Text: {t}\nRepeat the text exactly.\nText: {t}\nRepeat: {t[:10 + i]}"


class server(served):
    def __init__(self, *extra):
        super().__init__([BIN, "serve", MODEL, *ENGINE, *extra], log_prefix="tessera-spec-")
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0,
                                    timeout=300)

    def complete(self, prompt, **kw):
        return self.client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=kw.pop("max_tokens", 32),
                                              temperature=0, **kw)


plain = server()
spec = server(*SPEC)
# The default model as its own draft (llama-server's -md and --draft-max): nearly every draft is accepted.
DRAFT = ["--speculative", "draft", "-md", MODEL, "--draft-max", "4", "--speculative-max-batch", "8"]
draft = server(*DRAFT)
# The same with argmax drafts for sampled requests too, and the draft's two runners-up per position as
# token-tree leaves.
argmax_draft = server(*DRAFT, "--draft-sampling", "argmax", "--draft-branches", "3")
# N-gram token trees (SpecInfer-style tree attention in the CPU executor): several continuations at once.
tree = server(*SPEC, "--ngram-branches", "4")
# The model's own first 24 of 30 layers and its head as the draft (--draft-layers: early exit), with two
# tokens per position (sampled requests: two draws from q, a token tree verified by recursive rejection
# sampling).
layers = server("--speculative", "draft", "--draft-layers", "24", "--draft-max", "3", "--draft-branches", "2")

OPEN_PROMPTS = ["The history of the printing press begins", "Three reasons to learn a second language are",
                "Once upon a time, in a small village by the sea,", "def fibonacci(n):\n"]


def accepted_total():
    return spec.metrics()["tessera_spec_decode_num_accepted_tokens_total"]


@case
def greedy_text_is_the_same_and_drafts_are_accepted():
    before = spec.metrics()
    for i in range(3):
        a = plain.complete(grounded(i))
        b = spec.complete(grounded(i))
        assert b.choices[0].text == a.choices[0].text, (i, a.choices[0].text, b.choices[0].text)
        assert b.usage.completion_tokens == a.usage.completion_tokens
        extra = b.usage.model_extra or {}
        assert "speculative" in extra, b.usage
        assert extra["speculative"]["accepted"] > 0, extra
        assert extra["speculative"]["accepted"] <= extra["speculative"]["proposed"], extra
        assert "speculative" not in (a.usage.model_extra or {}), a.usage
    after = spec.metrics()
    assert after["tessera_spec_decode_num_accepted_tokens_total"] > before["tessera_spec_decode_num_accepted_tokens_total"]
    assert after["tessera_spec_decode_num_draft_tokens_total"] >= after["tessera_spec_decode_num_accepted_tokens_total"]
    assert 0 < after["tessera_spec_decode_draft_acceptance_rate"] <= 1, after["tessera_spec_decode_draft_acceptance_rate"]
    assert after["tessera_spec_decode_mean_accepted_length"] > 1
    assert plain.metrics()["tessera_spec_decode_num_draft_tokens_total"] == 0


@case
def streamed_chat_is_the_same():
    messages = [{"role": "user", "content": "Repeat exactly: " + TEXTS[0]}]

    def streamed(s):
        out = s.client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=40, temperature=0, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in out if c.choices)
    a, b = streamed(plain), streamed(spec)
    assert a == b, (a, b)


def assert_same_concurrent_texts(a_server, b_server, prompts, max_tokens=24):
    # All prompts at once on each server: the texts must be the same, prompt by prompt.
    def run(s):
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda p: s.complete(p, max_tokens=max_tokens).choices[0].text, prompts))
    a, b = run(a_server), run(b_server)
    assert a == b, [(x, y) for x, y in zip(a, b) if x != y]


@case
def concurrent_requests_give_the_same_text():
    assert_same_concurrent_texts(plain, spec, [grounded(i) for i in range(6)])


@case
def token_trees_give_the_same_text_alone_and_concurrent():
    before = tree.metrics()["tessera_spec_decode_num_accepted_tokens_total"]
    for p in [grounded(i) for i in range(3)] + OPEN_PROMPTS:
        a, b = plain.complete(p), tree.complete(p)
        assert b.choices[0].text == a.choices[0].text, (p, a.choices[0].text, b.choices[0].text)
    assert tree.metrics()["tessera_spec_decode_num_accepted_tokens_total"] > before
    assert_same_concurrent_texts(plain, tree, [grounded(i) for i in range(6)] + OPEN_PROMPTS)


@case
def structured_output_gives_the_same_json():
    # The grammar (xgrammar's matcher) masks every draft row: walked over the draft and rolled back.
    fmt = {"type": "json_schema", "json_schema": {"name": "copy", "strict": True, "schema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
        "additionalProperties": False}}}
    messages = [{"role": "user", "content": "Put this sentence in JSON as 'text': " + TEXTS[2]}]

    def ask(s):
        r = s.client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=64, temperature=0,
                                             response_format=fmt)
        return r.choices[0].message.content, r.usage
    (a, _), (b, usage) = ask(plain), ask(spec)
    assert a == b, (a, b)
    assert ask(tree)[0] == a  # a constrained request verifies its tree's first branch
    assert (usage.model_extra or {}).get("speculative", {}).get("proposed", 0) > 0, usage  # it did speculate
    if usage.completion_tokens < 64:  # the grammar completed: the text is one whole JSON object
        assert isinstance(json.loads(b)["text"], str), b


@case
def speculative_false_keeps_a_request_off():
    before = spec.metrics()["tessera_spec_decode_num_draft_tokens_total"]
    r = spec.complete(grounded(1), extra_body={"speculative": False})
    assert "speculative" not in (r.usage.model_extra or {}), r.usage
    assert spec.metrics()["tessera_spec_decode_num_draft_tokens_total"] == before
    assert r.choices[0].text == plain.complete(grounded(1)).choices[0].text


@case
def bad_speculative_value_is_a_400():
    status, body, _ = spec.request("POST", "/v1/completions",
                                   {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2, "speculative": "yes"})
    assert status == 400, (status, body)
    err = json.loads(body)["error"]
    assert err["param"] == "speculative" or "speculative" in err["message"], err
    # The server is still fine.
    assert spec.complete("Hello", max_tokens=2).choices[0].text is not None


@case
def bad_flags_are_cli_errors():
    for flags, word in [(["--num-speculative-tokens", "-1"], "--num-speculative-tokens"),
                        (["--num-speculative-tokens", "0"], "--num-speculative-tokens"),
                        (["--speculative", "draft"], "--speculative"),
                        (["--speculative", "ngram", "--ngram-min", "3", "--ngram-max", "2"], "ngram"),
                        (["--speculative", "ngram", "--ngram-branches", "0"], "--ngram-branches"),
                        (["--speculative", "draft", "-md", MODEL, "--draft-sampling", "top"], "--draft-sampling"),
                        (["--speculative", "draft", "-md", MODEL, "--draft-branches", "0"], "--draft-branches")]:
        p = subprocess.run([BIN, "serve", MODEL, *ENGINE, *flags, "--port", "0"], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode != 0, (flags, p.returncode)
        assert word in p.stderr + p.stdout, (flags, p.stderr[-500:])


@case
def draft_model_greedy_text_is_the_same_with_usage_and_metrics():
    before = draft.metrics()
    for p in OPEN_PROMPTS:
        a = plain.complete(p, max_tokens=40)
        b = draft.complete(p, max_tokens=40)
        assert b.choices[0].text == a.choices[0].text, (p, a.choices[0].text, b.choices[0].text)
        assert b.usage.completion_tokens == a.usage.completion_tokens
        sp = (b.usage.model_extra or {}).get("speculative")
        assert sp and sp["proposed"] > 0, b.usage
        # The model drafting for itself: its greedy guesses are the target's own.
        assert sp["accepted"] >= 0.8 * sp["proposed"], sp
    after = draft.metrics()
    for name in ("tessera_spec_decode_num_drafts_total", "tessera_spec_decode_num_draft_tokens_total",
                 "tessera_spec_decode_num_accepted_tokens_total"):
        assert after[name] > before[name], (name, before[name], after[name])
    assert after["tessera_spec_decode_draft_acceptance_rate"] >= 0.8, after["tessera_spec_decode_draft_acceptance_rate"]
    assert after["tessera_spec_decode_mean_accepted_length"] > 2, after["tessera_spec_decode_mean_accepted_length"]


@case
def draft_model_streamed_chat_is_the_same():
    messages = [{"role": "user", "content": "Write two sentences about the moon."}]

    def streamed(s):
        out = s.client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=48, temperature=0,
                                               stream=True, stream_options={"include_usage": True})
        text, usage = "", None
        for c in out:
            if c.choices:
                text += c.choices[0].delta.content or ""
            if c.usage:
                usage = c.usage
        return text, usage
    before = draft.metrics()["tessera_spec_decode_num_accepted_tokens_total"]
    (a, _), (b, usage) = streamed(plain), streamed(draft)
    assert a == b, (a, b)
    assert (usage.model_extra or {}).get("speculative", {}).get("accepted", 0) > 0, usage
    assert draft.metrics()["tessera_spec_decode_num_accepted_tokens_total"] > before


@case
def draft_model_concurrent_requests_give_the_same_text():
    assert_same_concurrent_texts(
        plain, draft, [OPEN_PROMPTS[i % len(OPEN_PROMPTS)] + " " * (i // len(OPEN_PROMPTS)) for i in range(8)])


def ask_seeded(s, prompt):
    r = s.client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=32, temperature=0.8, top_p=0.95,
                                    seed=7)
    return r.choices[0].text, (r.usage.model_extra or {}).get("speculative", {})


@case
def draft_model_sampled_drafts_are_accepted_and_seeded_output_repeats():
    # Drafts drawn from the model's own distribution under the request's temperature and top-p: q is p
    # (up to the executor's rounding of single- and multi-token rows), so min(1, p/q) accepts nearly all.
    proposed = accepted = 0
    for p in OPEN_PROMPTS:
        (a, sp), (b, _) = ask_seeded(draft, p), ask_seeded(draft, p)
        assert a == b, (p, a, b)
        proposed += sp.get("proposed", 0)
        accepted += sp.get("accepted", 0)
    assert proposed > 0 and accepted >= 0.8 * proposed, (proposed, accepted)


def drafts_and_draft_tokens(s):
    m = s.metrics()
    return m["tessera_spec_decode_num_drafts_total"], m["tessera_spec_decode_num_draft_tokens_total"]


def assert_trees_verified(s, before, chain_max):
    # A chain holds at most --draft-max tokens: more per verification means token trees reached the
    # executor (an adapter that forgot the executor's verifies_token_trees would cut them to chains).
    drafts, tokens = drafts_and_draft_tokens(s)
    drafts, tokens = drafts - before[0], tokens - before[1]
    assert drafts > 0 and tokens > chain_max * drafts, (drafts, tokens)
    assert "tessera_spec_decode_num_tree_branch_tokens_total" in s.metrics()


def assert_seeded_trees_repeat(s, chain_max, also_greedy_as=None):
    # Two prompts sampled twice with one seed: the same text, drafts verified as trees. With
    # also_greedy_as, greedy text must equal that server's too.
    before = drafts_and_draft_tokens(s)
    for p in OPEN_PROMPTS[:2]:
        (a, sp), (b, _) = ask_seeded(s, p), ask_seeded(s, p)
        assert a == b, (p, a, b)
        assert sp.get("proposed", 0) > 0, sp
        if also_greedy_as is not None:
            g, h = also_greedy_as.complete(p, max_tokens=40), s.complete(p, max_tokens=40)
            assert g.choices[0].text == h.choices[0].text, (p, g.choices[0].text, h.choices[0].text)
    assert_trees_verified(s, before, chain_max)


@case
def argmax_draft_trees_keep_greedy_text_and_seeded_runs_repeat():
    # A seeded sampled request is not compared with plain decoding here: a side branch's row differs
    # from the same token's plain row by the int8 rounding of its activations (docs/speculative.md), so
    # its draw can differ where the uniform falls that close to a boundary (chains are bit-identical).
    assert_seeded_trees_repeat(argmax_draft, 4, also_greedy_as=plain)


@case
def sampled_draft_trees_repeat_seeded():
    # Trees of sampled drafts (the first 24 layers' q, two draws per position): a seeded request repeats.
    assert_seeded_trees_repeat(layers, 3)


@case
def draft_model_structured_output_gives_the_same_json():
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": {
        "type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"], "additionalProperties": False}}}
    messages = [{"role": "user", "content": "Name a large city and its country in JSON."}]

    def ask(s):
        r = s.client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=48, temperature=0,
                                             response_format=fmt)
        return r.choices[0].message.content, r.usage
    (a, _), (b, usage) = ask(plain), ask(draft)
    assert a == b, (a, b)
    assert (usage.model_extra or {}).get("speculative", {}).get("proposed", 0) > 0, usage


@case
def first_layers_draft_gives_the_same_text():
    before = layers.metrics()
    for p in OPEN_PROMPTS[:2]:
        a = plain.complete(p, max_tokens=24)
        b = layers.complete(p, max_tokens=24)
        assert b.choices[0].text == a.choices[0].text, (p, a.choices[0].text, b.choices[0].text)
        sp = (b.usage.model_extra or {}).get("speculative")
        assert sp and sp["proposed"] > 0, b.usage
    after = layers.metrics()
    assert after["tessera_spec_decode_num_draft_tokens_total"] > before["tessera_spec_decode_num_draft_tokens_total"]
    assert after["tessera_spec_decode_draft_kv_blocks"] > 0
    assert after["tessera_spec_decode_draft_kv_blocks_used"] == 0, after["tessera_spec_decode_draft_kv_blocks_used"]


@case
def draft_model_bad_flags_are_startup_errors():
    gemma = os.path.join(os.path.dirname(MODEL), "gemma-3-270m-q4_k_m.gguf")
    cases = [(["--speculative", "draft"], "--draft-model"),
             (["--speculative", "draft"], "--draft-layers"),
             (["--speculative", "draft", "--draft-layers", "31"], "--draft-layers must be between 1 and the model's 30"),
             (["--speculative", "draft", "--draft-layers", "4", "-md", MODEL], "--draft-layers and --draft-model"),
             (["--speculative", "draft", "--draft-model", "/nonexistent/draft.gguf"], "--draft-model"),
             (["--speculative", "draft", "--model-draft", os.path.dirname(MODEL) + "/no-such-dir"], "--draft-model")]
    if os.path.exists(gemma):
        cases.append((["--speculative", "draft", "-md", gemma], "vocabulary"))
    for flags, word in cases:
        p = subprocess.run([BIN, "serve", MODEL, *ENGINE, *flags, "--port", "0"], capture_output=True, text=True,
                           timeout=180)
        assert p.returncode != 0, (flags, p.returncode)
        out = p.stderr + p.stdout
        assert word in out, (flags, out[-500:])
        assert "terminate called" not in out and "Segmentation" not in out, out[-500:]


@case
def grouped_target_sizes_its_draft_pool_per_position():
    # Gemma 3's KV blocks hold one layer group each (6 groups: engine/model/kv_layer_groups.hpp), so its
    # pool has 6 blocks for every 16 positions; a draft of its first 6 layers needs one block of its own
    # per 16 positions, never more than the target holds for all its layers. The greedy text is plain
    # decoding's.
    gemma = os.path.join(os.path.dirname(MODEL), "gemma-3-270m-q4_k_m.gguf")
    if not os.path.exists(gemma):
        print("  (skipped: no gemma-3-270m)")
        return
    base = [BIN, "generate", "-m", gemma, "--threads", "2", "--kv-cache-memory", "0.25", "-n", "24",
            "--temperature", "0", "-p", "The quick brown fox jumps over the lazy dog. The quick brown fox"]
    plain_run = subprocess.run(base, capture_output=True, text=True, timeout=300)
    layers_run = subprocess.run(base + ["--speculative", "draft", "--draft-layers", "6"], capture_output=True,
                                text=True, timeout=300)
    assert plain_run.returncode == 0 and layers_run.returncode == 0, (plain_run.stderr[-500:], layers_run.stderr[-500:])
    target = int(re.search(r"executor; KV pool (\d+) blocks", layers_run.stderr).group(1))
    drafted = int(re.search(r"draft KV pool (\d+) blocks", layers_run.stderr).group(1))
    assert 0 < drafted <= target // 6, (target, drafted, layers_run.stderr[-800:])
    assert layers_run.stdout == plain_run.stdout, (plain_run.stdout, layers_run.stdout)


@case
def no_block_is_left_behind():
    for s in (spec, draft, argmax_draft, tree, layers):
        m = s.metrics()
        assert m['tessera_kv_blocks_used{pool="device"}'] == 0, m['tessera_kv_blocks_used{pool="device"}']
    # The draft model's own pool is empty again too (every finished request released its draft K/V).
    m = draft.metrics()
    assert m["tessera_spec_decode_draft_kv_blocks"] > 0, m["tessera_spec_decode_draft_kv_blocks"]
    assert m["tessera_spec_decode_draft_kv_blocks_used"] == 0, m["tessera_spec_decode_draft_kv_blocks_used"]
    assert spec.metrics()["tessera_spec_decode_draft_kv_blocks"] == 0


plain.stop(expect_clean=True)
spec.stop(expect_clean=True)
draft.stop(expect_clean=True)
argmax_draft.stop(expect_clean=True)
tree.stop(expect_clean=True)
layers.stop(expect_clean=True)
sys.exit(summary())
