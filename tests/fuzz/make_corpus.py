#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets, tests/fuzz/corpus/<name>/ (committed; run again after
changing it: the output is deterministic).

Seeds are small real inputs, so that mutation starts from what the parsers actually see:
  gguf            tiny LLaMA files written from the GGUF spec (ggml docs/gguf.md) with F32/F16/Q8_0/Q4_0
                  tensors and gpt2 / llama (SentencePiece) vocabularies, plus metadata of every value type
  safetensors     files laid out as the safetensors format describes (8-byte length, JSON header, data)
  hf_config       bench/models/*/config.json and the default model's own config.json
  hf_tokenizer    tokenizer.json \\0 tokenizer_config.json \\0 config.json \\0 chat_template.jinja, shaped like
                  the files transformers writes (the layouts tests/cpu/hf_model_test.cpp uses)
  tokenizer       a mode byte + the texts of tests/data/tokenizer/smollm_parity.jsonl
  jinja           tests/data/chat_templates/*.jinja and snippets.txt, alone and with a JSON context built
                  from expected.json's conversations
  request_parser  a selector byte + request bodies from tests/e2e/server_test.py
  http_request    a read-size byte + HTTP/1.1 byte streams: the API's requests, pipelines, chunked bodies
                  with extensions and trailers, Expect, an upgrade, smuggling attempts, the issue #14 trailer
  ws_frames       a read-size byte + the client frames after a /v1/ws upgrade: the protocol's messages
                  (auth, ping, start, cancel), fragments, control frames, binary, close, bad frames
"""
import base64
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus")


def write(name, filename, data):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, filename), "wb") as f:
        f.write(data)


# ---- GGUF ------------------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
              I64: "<q", F64: "<d"}
T_F32, T_F16, T_Q4_0, T_Q8_0 = 0, 1, 2, 8


def gguf_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == STRING:
        return gguf_str(v)
    if t == ARRAY:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def tensor_bytes(ttype, dims):
    n = 1
    for d in dims:
        n *= d
    if ttype == T_F32:
        return n * 4
    if ttype == T_F16:
        return n * 2
    if ttype == T_Q8_0:
        return n // 32 * 34
    if ttype == T_Q4_0:
        return n // 32 * 18
    raise ValueError(ttype)


def gguf(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, dims ne0-first)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gguf_str(key) + struct.pack("<I", t) + gguf_value(t, v)
    offset = 0
    datas = []
    for name, ttype, dims in tensors:
        out += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        n = tensor_bytes(ttype, dims)
        # Deterministic, finite contents: small f32/f16 values, quant blocks with a unit scale.
        if ttype == T_F32:
            data = b"".join(struct.pack("<f", ((i * 7) % 13 - 6) / 8.0) for i in range(n // 4))
        elif ttype == T_F16:
            data = b"".join(struct.pack("<e", ((i * 5) % 11 - 5) / 8.0) for i in range(n // 2))
        else:
            block = 34 if ttype == T_Q8_0 else 18
            one = struct.pack("<e", 0.01) + bytes((j * 37) % 256 for j in range(block - 2))
            data = one * (n // block)
        datas.append(data)
        offset += (n + alignment - 1) // alignment * alignment
    out += b"\0" * ((alignment - len(out) % alignment) % alignment)
    for data in datas:
        out += data + b"\0" * ((alignment - len(data) % alignment) % alignment)
    return out


def llama_kvs(layers, hidden, heads, kv_heads, ffn, vocab):
    return [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "tiny"),
        ("llama.block_count", U32, layers),
        ("llama.context_length", U32, 256),
        ("llama.embedding_length", U32, hidden),
        ("llama.feed_forward_length", U32, ffn),
        ("llama.attention.head_count", U32, heads),
        ("llama.attention.head_count_kv", U32, kv_heads),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.vocab_size", U32, vocab),
    ]


def llama_tensors(layers, hidden, heads, kv_heads, ffn, vocab, mat_type, embd_type, with_output):
    hd = hidden // heads
    t = [("token_embd.weight", embd_type, [hidden, vocab]), ("output_norm.weight", T_F32, [hidden])]
    if with_output:
        t.append(("output.weight", embd_type, [hidden, vocab]))
    for l in range(layers):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", T_F32, [hidden]), (p + "attn_q.weight", mat_type, [hidden, heads * hd]),
              (p + "attn_k.weight", mat_type, [hidden, kv_heads * hd]),
              (p + "attn_v.weight", mat_type, [hidden, kv_heads * hd]),
              (p + "attn_output.weight", mat_type, [heads * hd, hidden]), (p + "ffn_norm.weight", T_F32, [hidden]),
              (p + "ffn_gate.weight", mat_type, [hidden, ffn]), (p + "ffn_up.weight", mat_type, [hidden, ffn]),
              (p + "ffn_down.weight", mat_type, [ffn, hidden])]
    return t


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def gpt2_vocab_kvs(pre):
    # GPT-2 byte alphabet: 'Ġ' is the space byte, 'Ċ' the newline.
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "Ġ", "Ċ"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += [str(d) for d in range(10)] + ["!", ",", "."]
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ h"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, [
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, pre),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.padding_token_id", U32, 0),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STRING, CHATML),
    ]


def spm_vocab_kvs():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in (0x0A, 0x20, 0xE4, 0xB8, 0x96)]
    tokens += ["▁", "▁h", "▁he", "▁hello", "e", "h", "l", "o", "ll", "▁w", "or", "▁world", "d", "r", "w"]
    scores = [0.0, 0.0, 0.0] + [0.0] * 5 + [-float(i) for i in range(len(tokens) - 8)]
    types = [2, 3, 3] + [6] * 5 + [1] * (len(tokens) - 8)
    return tokens, [
        ("tokenizer.ggml.model", STRING, "llama"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.scores", ARRAY, (F32, scores)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.add_space_prefix", BOOL, True),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
    ]


def make_gguf():
    tokens, vocab = gpt2_vocab_kvs("smollm")
    v = len(tokens)
    write("gguf", "tiny_llama_gpt2_f32.gguf",
          gguf(llama_kvs(1, 4, 2, 1, 8, v) + vocab, llama_tensors(1, 4, 2, 1, 8, v, T_F32, T_F32, False)))
    tokens, vocab = gpt2_vocab_kvs("llama-bpe")
    v = len(tokens)
    write("gguf", "tiny_llama_gpt2_q8_0.gguf",
          gguf(llama_kvs(1, 32, 2, 1, 32, v) + vocab, llama_tensors(1, 32, 2, 1, 32, v, T_Q8_0, T_F16, True)))
    tokens, vocab = spm_vocab_kvs()
    v = len(tokens)
    write("gguf", "tiny_llama_spm_q4_0_v2.gguf",
          gguf(llama_kvs(2, 32, 4, 2, 32, v) + vocab, llama_tensors(2, 32, 4, 2, 32, v, T_Q4_0, T_F32, False),
               version=2))
    # Metadata of every value type, nested arrays and a non-default alignment; no tensors bound.
    kvs = [("general.alignment", U32, 64), ("k.u8", U8, 255), ("k.i8", I8, -128), ("k.u16", U16, 65535),
           ("k.i16", I16, -32768), ("k.u32", U32, 2**32 - 1), ("k.i32", I32, -2**31), ("k.u64", U64, 2**64 - 1),
           ("k.i64", I64, -2**63), ("k.f32", F32, 1.5), ("k.f64", F64, -2.25), ("k.bool", BOOL, True),
           ("k.str", STRING, "h\u00e9llo"), ("k.bools", ARRAY, (BOOL, [True, False])),
           ("k.floats", ARRAY, (F64, [0.5, -1.0])), ("k.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (STRING, ["x"])])),
           ("k.empty", ARRAY, (I64, []))]
    write("gguf", "metadata_all_types.gguf",
          gguf(kvs, [("t.f32", T_F32, [3, 2]), ("t.f16", T_F16, [4]), ("t.q8", T_Q8_0, [32, 1, 1, 1])], alignment=64))
    write("gguf", "header_only.gguf", gguf([], []))


# ---- safetensors -----------------------------------------------------------------------------------

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "BOOL": 1}


def safetensors(tensors, metadata=None, pad_to=8):
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape in tensors:
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((pad_to - len(h) % pad_to) % pad_to)  # writers pad the header with spaces
    data = bytes((i * 29) % 256 for i in range(offset))
    return struct.pack("<Q", len(h)) + h + data


def make_safetensors():
    write("safetensors", "llama_layer_f32.safetensors",
          safetensors([("model.norm.weight", "F32", [8]), ("model.layers.0.self_attn.q_proj.weight", "F32", [8, 8])],
                      {"format": "pt"}))
    write("safetensors", "mixed_dtypes.safetensors",
          safetensors([("a.bf16", "BF16", [2, 3]), ("b.f16", "F16", [4]), ("c.i64", "I64", [2]), ("d.scalar", "F32", []),
                       ("e.empty", "F32", [0, 4]), ("f.bool", "BOOL", [3])]))
    write("safetensors", "empty_header.safetensors", safetensors([], None, pad_to=1))


# ---- Hugging Face JSON -----------------------------------------------------------------------------

SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
    "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
    "use_cache": True, "vocab_size": 49152}


def make_hf_config():
    for model in ("llama-3-8b", "qwen2.5-7b"):
        with open(os.path.join(ROOT, "bench", "models", model, "config.json"), "rb") as f:
            write("hf_config", model + ".json", f.read())
    write("hf_config", "smollm2-135m.json", json.dumps(SMOLLM2_CONFIG, indent=2))
    mistral = dict(SMOLLM2_CONFIG, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096,
                   head_dim=None, eos_token_id=[2, 0])
    write("hf_config", "mistral_sliding_window.json", json.dumps(mistral))
    v5 = {k: v for k, v in SMOLLM2_CONFIG.items() if k not in ("architectures", "rope_theta")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    v5["head_dim"] = 64
    write("hf_config", "transformers5_rope_parameters.json", json.dumps(v5))


def gpt2_byte_char(b):
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


LLAMA3_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
PRE = {
    "gpt2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "llama3": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
}


def tokenizer_json(pre, pair_merges, bytes_only=range(32, 127)):
    vocab = {gpt2_byte_char(b): i for i, b in enumerate(bytes_only)}
    n = len(vocab)
    vocab.update({"ab": n, "abc": n + 1, "Ġt": n + 2, "he": n + 3, "Ġthe": n + 4})
    merges = [["a", "b"], ["ab", "c"], ["Ġ", "t"], ["h", "e"], ["Ġt", "he"]]
    specials = [{"id": n + 5 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": s} for i, (c, s) in
                enumerate([("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<tool>", False)])]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials, "normalizer": None,
        "pre_tokenizer": PRE[pre],
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {}} if pre == "llama3" else
                          {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": pre == "llama3",
                  "vocab": vocab, "merges": merges if pair_merges else [" ".join(m) for m in merges]},
    }, ensure_ascii=False), n + 9


def make_hf_tokenizer():
    with open(os.path.join(ROOT, "tests", "data", "chat_templates", "smollm2.jinja")) as f:
        smollm2_template = f.read()
    tc = {"add_prefix_space": False, "bos_token": "<|im_start|>", "clean_up_tokenization_spaces": False,
          "eos_token": "<|im_end|>", "model_max_length": 1000000000000000019884624838656, "pad_token": "<|im_end|>",
          "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>", "vocab_size": 49152,
          "chat_template": smollm2_template}
    for pre, pairs in (("smollm", False), ("gpt2", False), ("llama3", True)):
        tok, n = tokenizer_json(pre, pairs)
        config = dict(SMOLLM2_CONFIG, vocab_size=n + 3, bos_token_id=n + 6, eos_token_id=n + 7)
        write("hf_tokenizer", f"{pre}.bin",
              "\0".join([tok, json.dumps(tc, ensure_ascii=False), json.dumps(config)]))
    tok, n = tokenizer_json("gpt2", True)
    tc_list = dict(tc, chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ x }}"}],
                   bos_token={"content": "<|im_start|>", "special": True}, add_bos_token=True)
    write("hf_tokenizer", "template_list_and_added_token_object.bin", "\0".join([tok, json.dumps(tc_list)]))
    tc_no_template = {k: v for k, v in tc.items() if k != "chat_template"}
    write("hf_tokenizer", "chat_template_jinja_file.bin",
          "\0".join([tok, json.dumps(tc_no_template), json.dumps(dict(SMOLLM2_CONFIG, vocab_size=n + 1)),
                     smollm2_template]))
    write("hf_tokenizer", "tokenizer_json_only.bin", tok)


# ---- tokenizer texts -------------------------------------------------------------------------------

def make_tokenizer():
    with open(os.path.join(ROOT, "tests", "data", "tokenizer", "smollm_parity.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    # Every 8th case (about 65 files), alternating the encode/decode modes; the special cases keep
    # parse_special (bit 0), one in three also decode the text's bytes as ids (bit 3).
    for i, case in enumerate(lines[::8]):
        text = base64.b64decode(case["text_b64"])
        mode = (1 if case["special"] else 0) | (2 if i % 4 == 1 else 0) | (4 if i % 5 == 2 else 0) | (8 if i % 3 == 0 else 0)
        write("tokenizer", f"parity_{i:03d}.bin", bytes([mode]) + text)
    write("tokenizer", "chatml_special.bin",
          b"\x01<|im_start|>user\nHello, world! 123<|im_end|>\n<|im_start|>assistant\n")


# ---- Jinja -----------------------------------------------------------------------------------------

def make_jinja():
    tdir = os.path.join(ROOT, "tests", "data", "chat_templates")
    with open(os.path.join(tdir, "expected.json")) as f:
        expected = json.load(f)
    conversations = expected["conversations"]
    names = sorted(n for n in os.listdir(tdir) if n.endswith(".jinja"))
    for i, name in enumerate(names):
        with open(os.path.join(tdir, name)) as f:
            source = f.read()
        write("jinja", name, source)  # the chat_template path, fixed conversation
        conv_name = sorted(conversations)[i % len(conversations)]
        context = {"messages": conversations[conv_name], "add_generation_prompt": i % 2 == 0,
                   "bos_token": "<s>", "eos_token": "</s>", "tools": None}
        write("jinja", name.replace(".jinja", f"+{conv_name}.bin"), source + "\0" + json.dumps(context, ensure_ascii=False))
    with open(os.path.join(tdir, "snippets.txt")) as f:
        snippets = f.read().split("\n=====\n")
    context = json.dumps({"messages": conversations["multi_turn"], "add_generation_prompt": True,
                          "x": [1, 2.5, "s", None, True, {"k": [[]]}]})
    for i, s in enumerate(snippets):
        write("jinja", f"snippet_{i:03d}.bin", s + ("\0" + context if i % 2 else ""))


# ---- request bodies --------------------------------------------------------------------------------

def make_request_parser():
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    bodies = [
        (0, {"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7,
             "seed": 1}),
        (0, {"prompt": "The", "max_tokens": 4, "n": 2, "stop": ["\n", "."], "logprobs": 2, "stream": True,
             "stream_options": {"include_usage": True}}),
        (0, {"prompt": [1, 2, 3], "max_tokens": 4, "top_k": 1, "min_p": 0.1, "repetition_penalty": 1.1,
             "presence_penalty": 0.5, "frequency_penalty": -0.5, "ignore_eos": True, "priority": -1, "user": "tester"}),
        (0, {"prompt": [[5, 6]], "max_tokens": 8, "logit_bias": {"42": 100, "7": -100}, "stop_token_ids": [2],
             "include_stop_str_in_output": True, "min_tokens": 2, "top_p": 0.9}),
        (0, {"prompt": ["one prompt"], "max_completion_tokens": 3, "best_of": 1, "echo": False, "seed": -5}),
        (1, {"model": "SmolLM2-135M-Instruct", "messages": chat, "max_tokens": 48, "stream": True}),
        (1, {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": None},
                          {"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}],
             "logprobs": True, "top_logprobs": 3, "temperature": 0}),
        (1, {"messages": chat, "chat_template": "{{ 7*7 }}"}),
        (1, {"messages": chat, "tools": [], "response_format": {"type": "json_object"}}),
        (2, {"prompt": "Hello world", "add_special_tokens": False}),
        (2, {"messages": chat, "add_generation_prompt": True, "model": "m"}),
        (3, {"tokens": [9906, 1917], "model": "m"}),
        # Structured output in each dialect (server/structured_output_request.cpp).
        (1, {"messages": chat, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": True,
             "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}}),
        (1, {"messages": chat, "structured_outputs": {"choice": ["yes", "no"], "backend": "xgrammar"}}),
        (0, {"prompt": "x", "guided_regex": "[0-9]{3}", "guided_decoding_backend": "auto"}),
        (0, {"prompt": "x", "grammar": "root ::= \"a\" | \"b\"", "json_schema": None}),
        (1, {"messages": chat, "guided_json": "{\"type\": \"string\"}", "response_format": {"type": "text"}}),
        # Issue #19: prompt batches, echo, chat_template_kwargs, truncate_prompt_tokens.
        (0, {"prompt": ["a", "b", "c"], "n": 2, "echo": True, "truncate_prompt_tokens": 8}),
        (0, {"prompt": [[1, 2], [3]], "truncate_prompt_tokens": -1, "echo": False}),
        (1, {"messages": chat, "chat_template_kwargs": {"enable_thinking": False, "x": [1, {"y": None}]},
             "truncate_prompt_tokens": 64}),
        # /v1/responses (selector 4): string input, message items with text parts, the refused fields.
        (4, {"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0,
             "stream": True, "store": True, "metadata": {"k": "v"}}),
        (4, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]},
                       {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                        "content": [{"type": "output_text", "text": "b", "annotations": []}]}],
             "truncation": "auto", "text": {"format": {"type": "text"}}, "tools": [], "include": []}),
        (4, {"input": "x", "tools": [{"type": "function", "name": "f"}], "previous_response_id": "resp_1"}),
        # /v1/embeddings (selector 5): each input shape, the formats, dimensions.
        (5, {"model": "m", "input": "The sky is blue", "encoding_format": "float"}),
        (5, {"input": ["a", "b"], "encoding_format": "base64", "dimensions": 576, "user": "u"}),
        (5, {"input": [[1, 2, 3], [4]], "add_special_tokens": False}),
        (5, {"input": [7, 8, 9], "dimensions": 64}),
    ]
    for i, (kind, body) in enumerate(bodies):
        write("request_parser", f"body_{i:02d}.bin", bytes([kind]) + json.dumps(body).encode())
    # Malformed bodies from the server's bad-input table.
    for i, (kind, raw) in enumerate([(0, b"{"), (0, b'{"prompt": [1, 2, 49152]}'), (1, b'{"messages": []}'),
                                     (0, b'{"prompt": "x", "max_tokens": 1e400}'), (3, b'{"tokens": [-1]}'),
                                     (0, b'{"prompt": "x", "logit_bias": {"99999999": 1}}'), (2, b"[]"),
                                     (5, b'{"input": [[1, 49152]]}'), (5, b'{"input": []}')]):
        write("request_parser", f"bad_{i:02d}.bin", bytes([kind]) + raw)


def make_http_request():
    # A read-size byte + HTTP/1.1 byte streams the server reads: the requests of its API, keep-alive
    # pipelines, chunked bodies with extensions and trailers, Expect, an upgrade, and the issue #14
    # trailer (a 65534-byte field) that used to crash it.
    body = b'{"prompt":"abc"}'
    cl = b"Content-Length: %d\r\n" % len(body)

    def chunk(data):
        return b"%x\r\n" % len(data) + data + b"\r\n"
    streams = [
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + cl + b"\r\n" + body,
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost:8000\r\nAuthorization: Bearer k\r\n" + cl + b"\r\n" + body,
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(body[:5]) +
        b"b;ext=1;q=\"x\"\r\n" + body[5:] + b"\r\n0\r\nX-Trailer: 1\r\nX-Other: two\r\n\r\n",
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n" + cl + b"\r\n" + body,
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"
        b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        b"POST /detokenize HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 14\r\n\r\n{\"tokens\":[1]}",
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunk(body) +
        b"0\r\n\r\n",
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(body) +
        b"0\r\nX-Big: " + b"a" * 65534 + b"\r\n\r\n",
    ]
    for i, s in enumerate(streams):
        write("http_request", f"stream_{i:02d}.bin", bytes([i % 8]) + s)


def ws_frame(payload, opcode=0x1, fin=True, masked=True, rsv=0, key=b"\0\0\0\0"):
    # RFC 6455 §5.2: FIN/RSV/opcode, the mask bit and a 7-, 16- or 64-bit length, the key, the payload.
    # The zero key leaves the payload readable, so that mutations (and the dictionary's JSON) change
    # the message itself; one seed uses another key.
    if isinstance(payload, str):
        payload = payload.encode()
    head = bytes([(0x80 if fin else 0) | rsv | opcode])
    n = len(payload)
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([mask_bit | n])
    elif n < 65536:
        head += bytes([mask_bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack(">Q", n)
    if not masked:
        return head + payload
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def make_ws_frames():
    start = json.dumps({"type": "start", "id": "a", "endpoint": "completions",
                        "request": {"prompt": "Hello", "max_tokens": 4, "logprobs": 2}})
    chat = json.dumps({"type": "start", "id": "c", "request": {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True, "n": 2}})
    close_1000 = ws_frame(struct.pack(">H", 1000) + b"bye", opcode=0x8)
    streams = [
        ws_frame('{"type":"auth","api_key":"k"}') + ws_frame('{"type":"ping"}', key=b"\x5a\x17\x3c\x71") + close_1000,
        ws_frame(start) + ws_frame('{"type":"cancel","id":"a"}') + close_1000,
        ws_frame(chat) + close_1000,
        # a message in three fragments with a ping between them (RFC 6455 §5.4)
        ws_frame(start[:10], fin=False) + ws_frame(b"p", opcode=0x9) + ws_frame(start[10:30], opcode=0x0, fin=False) +
        ws_frame(start[30:], opcode=0x0) + close_1000,
        ws_frame('{"type":"ping"}', opcode=0x2) + ws_frame(b"", opcode=0xA),
        ws_frame('{"type":"start","id":"","request":{}}') + ws_frame('{"type":"bogus","id":7}') + ws_frame("{not json"),
        ws_frame("x" * 300) + ws_frame(b"\xed\xa0\x80"),  # a 16-bit length; a surrogate (not UTF-8)
        ws_frame('{"type":"ping"}', masked=False),       # clients must mask: a protocol error
        ws_frame('{"type":"ping"}', rsv=0x40),           # RSV1 without an extension
        ws_frame(b"p" * 126, opcode=0x9),                # a control frame over 125 bytes
        ws_frame(start, opcode=0x0),                     # a continuation without a start
        ws_frame(struct.pack(">H", 1005), opcode=0x8),   # a reserved close code
        # a header that declares 70,000 bytes (over the 64 KiB limit: refused from the header alone)
        bytes([0x81, 0x80 | 127]) + struct.pack(">Q", 70000) + b"\x5a\x17\x3c\x71" + b"{" * 64,
    ]
    for i, s in enumerate(streams):
        write("ws_frames", f"frames_{i:02d}.bin", bytes([i % 8]) + s)


def main():
    make_gguf()
    make_safetensors()
    make_hf_config()
    make_hf_tokenizer()
    make_tokenizer()
    make_jinja()
    make_request_parser()
    make_http_request()
    make_ws_frames()
    for name in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, name))
        size = sum(os.path.getsize(os.path.join(OUT, name, f)) for f in files)
        print(f"{name}: {len(files)} seeds, {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
