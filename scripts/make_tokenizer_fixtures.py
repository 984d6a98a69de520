#!/usr/bin/env python3
"""Builds the tokenizer parity fixture tests/data/tokenizer/smollm_parity.jsonl.

The oracle is llama.cpp (through llama-cpp-python) loaded in vocab-only mode on
the same GGUF file Tessera loads, so the fixture checks Tessera's GGUF-driven
BPE tokenizer against an independent implementation of the same vocabulary,
merges and "smollm" pre-tokenizer.

Each output line is one JSON object:
    {"text_b64": base64(raw bytes), "special": bool, "ids": [int, ...]}
where `special` is the value passed as llama_tokenize(parse_special=...), and
BOS is never added (add_bos=False).

The corpus is deterministic: hand-written strings plus seeded random mixes.
As an extra sanity check the valid-UTF-8 strings are also tokenized with the
Hugging Face `tokenizers` library through transformers' GGUF loader, and any
disagreement is reported (the fixture always stores llama.cpp's answer).

Usage:
    python3 scripts/make_tokenizer_fixtures.py \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/data/tokenizer/smollm_parity.jsonl
    python3 scripts/make_tokenizer_fixtures.py --corpus-only   # print corpus stats
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import unicodedata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "tokenizer" / "smollm_parity.jsonl"
SEED = 20261129

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
    "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
    "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
    "<jupyter_output>", "<jupyter_script>", "<empty_output>",
]


def _whitespace_cases() -> list[str]:
    cases = ["", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\n\n\n", " \n", "\n ",
             " \t \n", "\t\t\t", "\r", "\r\r\n\n", "\u00a0", "\u3000", "\u2003 \u2003",
             "a  b", "a   b", "a\t\tb", "a \n b", "a\n\n\nb", "a \t\n\r b",
             "  leading", "trailing  ", "   both   ", " single", "single ",
             "hello\n  world", "hello \n\n world", "x" + " " * 17 + "y",
             " " * 64, "\n" * 33, "\t" * 9 + "indented", "    def f():\n        return 1\n",
             "line1\r\nline2\r\n", "end with newline\n", "\n\nstarts with newlines",
             "word \u00a0word", "mixed\u2009thin\u200aspace", "tab\tseparated\tvalues\n"]
    rng = random.Random(SEED + 1)
    for _ in range(16):
        pieces = []
        for _ in range(rng.randint(2, 8)):
            pieces.append(rng.choice([" ", "\t", "\n", "\r\n", "  ", "word", "x", "42", ".", "\u00a0"])
                          * rng.randint(1, 4))
        cases.append("".join(pieces))
    return cases


def _number_cases() -> list[str]:
    cases = ["0", "1", "12", "123", "1234", "12345", "123456", "1234567", "3.14159",
             "-42", "+7", "1e10", "6.022e23", "0x1F", "0b1010", "1,000,000", "1 000 000",
             "2026-11-29", "15:17:47", "v1.2.3", "192.168.0.1", "$1,234.56", "100%",
             "3/4", "1st 2nd 3rd 4th", "phone: +1 (555) 010-9999",
             "31415926535897932384626433832795028841971693993751",
             "a1b2c3", "abc123def", "１２３", "٣٤٥", "१२३", "Ⅻ", "½ ¾", "²³"]
    rng = random.Random(SEED + 2)
    for n in range(1, 25):
        cases.append("".join(rng.choice("0123456789") for _ in range(n)))
    return cases


def _code_cases() -> list[str]:
    return [
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }\n",
        "template <typename T>\nstd::vector<T> v{1, 2, 3};\nauto x = v[0] << 2;",
        "fn main() {\n    let s: &str = \"hello\";\n    println!(\"{s}\");\n}\n",
        "func main() {\n\tfmt.Println(\"go\")\n}\n",
        "const f = (a, b) => a ?? b;\nconsole.log(`${f(null, 1)}`);",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
        "<html><body><div class=\"x\">&amp;&lt;&gt;</div></body></html>",
        "$ ls -la | grep '\\.py$' && echo \"done\" > /dev/null 2>&1",
        "if (a != b && c <= d || !e) { x += 1; y -= 2; z *= 3; w /= 4; }",
        "public static void Main(string[] args) => Console.WriteLine(args?.Length);",
        "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n",
        "    \tmixed_indent = True\n\t    # comment\n",
        "x=[i**2 for i in range(10) if i%2==0]",
        "#define MAX(a,b) ((a)>(b)?(a):(b))",
        "let re = /^[a-z0-9_-]{3,16}$/gi;",
        "\\begin{equation} E = mc^2 \\end{equation}",
        "@decorator\nclass Foo(Bar, metaclass=Meta):\n    __slots__ = ()\n",
        "a->b; c::d; e.f; g?.h; i!!; j..k; l...m; n::<T>()",
        "{{ template }} {% for x in y %}{{ x|upper }}{% endfor %}",
    ]


def _contraction_cases() -> list[str]:
    return [
        "it's", "don't", "they're", "we've", "I'm", "you'll", "he'd", "It'S", "DON'T",
        "THEY'RE", "WE'VE", "I'M", "YOU'LL", "HE'D", "'s", "'t", "'re", "'ve", "'m", "'ll",
        "'d", "' s", "it 's", "rock'n'roll", "o'clock", "y'all'd've", "the dog's bone's",
        "'''", "''", "l'été", "can’t", "won’t (curly)", "'S'T'RE'VE'M'LL'D",
        "He said 'hello' and 'goodbye'.", "Ma'am", "'tis", "'90s",
    ]


def _punctuation_cases() -> list[str]:
    return [
        "!!!", "???", "...", "…", "!?!?", "---", "—", "–", "***", "###", "===", "~~~",
        "((()))", "[[[]]]", "{{{}}}", "<<>>", "@@@", "$$$", "%%%", "^^^", "&&&", "|||",
        "\\\\\\", "///", ";;;", ":::", ",,,", "\"\"\"", "``` ```", "!@#$%^&*()_+-=[]{}|;':\",./<>?",
        "Hello, world!", "Wait... what?!", "«quoted»", "„German“", "「Japanese」", "【brackets】",
        "¿Qué? ¡Sí!", "a.b.c.d", "end.", ".start",
    ]


def _url_json_markdown_cases() -> list[str]:
    return [
        "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
        "http://example.com:8080/path/to/file.html",
        "mailto:someone@example.org", "ftp://ftp.example.net/pub/", "www.example.com/a_b-c",
        "user@example.com", "C:\\Users\\Admin\\Documents\\file.txt", "/usr/local/bin/python3",
        "{\"key\": \"value\", \"n\": [1, 2.5, -3e4, true, false, null], \"nested\": {\"a\": {}}}",
        "[{\"id\":1},{\"id\":2}]", "{\n  \"pretty\": true,\n  \"indent\": 2\n}",
        "# Heading 1\n## Heading 2\n\n- item *one*\n- item **two**\n1. `code`\n",
        "| col a | col b |\n|-------|------:|\n| 1     | 2     |\n",
        "```python\nprint('fenced')\n```", "> quote\n>> nested quote", "[link](https://x.y) ![img](a.png)",
        "~~strike~~ __under__ _em_", "<!-- comment -->", "key: value\nlist:\n  - a\n  - b\n",
        "a,b,c\n1,2,3\n\"q,uoted\",4,5\n",
    ]


def _script_cases() -> list[str]:
    return [
        "你好，世界！", "我爱自然语言处理。", "中文 English 混合 text", "繁體中文測試",
        "日本語のテキストです。", "カタカナとひらがな", "東京都渋谷区", "ｈａｌｆｗｉｄｔｈ ｶﾀｶﾅ",
        "한국어 텍스트입니다.", "안녕하세요 세계", "العربية نص تجريبي", "مرحبا بالعالم",
        "हिन्दी पाठ", "नमस्ते दुनिया", "Привет, мир!", "Ελληνικά γράμματα", "עברית טקסט",
        "ภาษาไทย", "Tiếng Việt có dấu", "Türkçe İstanbul ıi", "Ærøskøbing Œuvre straße",
        "ǅemal ǈubljana", "ﬁ ﬂ ligatures", "Zalgo: z̴̢a̷l̶g̵o̸", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝐁𝐨𝐥𝐝",
        "ᚠᛇᚻ᛫ᛒᛦᚦ runes", "ꯃꯤꯇꯩ", "𓀀𓀁 hieroglyphs", "�replacement char",
    ]


def _accent_cases() -> list[str]:
    base = ["café", "naïve", "résumé", "Ångström", "jalapeño", "façade", "São Paulo",
            "Crème Brûlée", "Øresund", "Dvořák", "Łódź", "Ελλάδα", "Việt Nam", "ếẫỹ"]
    cases = []
    for word in base:
        cases.append(unicodedata.normalize("NFC", word))
        cases.append(unicodedata.normalize("NFD", word))
    cases += ["e\u0301", "a\u0308\u0304", "\u0301 lone combining", "x\u20dd", "n\u0303o"]
    return cases


def _emoji_cases() -> list[str]:
    return [
        "😀", "😀😃😄", "👍", "👍🏻", "👍🏿", "👋🏽 hi", "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "🏴‍☠️",
        "❤️", "❤", "🇫🇷🇯🇵", "🇺🇸", "1️⃣", "#️⃣", "🧑🏾‍🚀", "🤷‍♀️", "I ❤️ NY", "🔥🔥🔥 fire",
        "emoji😀inside", "🙂 🙃", "☃", "✓ ✗", "⚡️", "🫠", "👁️‍🗨️", "🐈‍⬛", "😀 " * 5,
    ]


def _special_lookalike_cases() -> list[str]:
    return [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "< |im_start| >", "<|im_start",
        "im_start|>", "<|im_", "|>", "<|", "<||>", "<|im_start|><|im_end|>",
        "<|im_start|>user\nHello<|im_end|>\n", "text<|endoftext|>more text",
        "<|im_start|> user", " <|im_start|>", "<|im_start|>\n", "<<|im_start|>>", "<|IM_START|>",
        "<|im start|>", "<|endoftext|><|endoftext|>", "<repo_name>my/repo<file_sep>a.py",
        "<filename>main.py<gh_stars>100", "<jupyter_code>print(1)<jupyter_output>1",
        "<empty_output>", "<issue_start>bug<issue_comment>fix<issue_closed>",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "<s>", "</s>", "[INST]", "<unk>", "<pad>",
    ]


def _control_cases() -> list[str]:
    return [
        "\x00", "\x00\x00\x00", "a\x00b", "\x01\x02\x03\x04\x05\x06\x07", "\x08\x0b\x0c",
        "\x1b[31mred\x1b[0m", "\x7f", "\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a",
        "\x1c\x1d\x1e\x1f", "\u0085next line", "\u2028line sep\u2029para sep", "\u200b zero width",
        "zw\u200cnj\u200dj", "\ufeffBOM start", "\u202eRTL override", "\u00ad soft hyphen",
        "\ufffe", "\U0010ffff", "\ue000 private use", "\x9b\x9c C1 controls",
    ]


def _invalid_utf8_cases() -> list[bytes]:
    return [
        b"\x80", b"\xbf", b"a\x80b", b"\x80\x80\x80", b"\xc3", b"abc\xc3", b"\xe2\x82",
        b"\xe2\x82 euro?", b"\xf0\x9f\x98", b"\xf0\x9f\x98 truncated emoji", b"\xc0\x80",
        b"\xc1\xbf", b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xed\xa0\x80",  # lone surrogate
        b"\xff", b"\xfe\xff", b"hello \xff world", b"\xf8\x88\x80\x80\x80",
        b"caf\xe9", b"\xc3\xa9\x80\xc3\xa9", b"   \xff   ", b"\xe4\xbd\xa0\xe5\xa5",
    ]


# Inputs on which llama.cpp itself aborts (std::invalid_argument "invalid codepoint"
# escapes llama_tokenize), so they cannot be in the fixture. Tessera must still not
# crash on them; its own tests cover that without an oracle.
LLAMA_CPP_ABORTS = [
    b"\xf4\x90\x80\x80",  # 4-byte form of U+110000, above U+10FFFF
]


def _random_mix_cases(count: int) -> list[str]:
    """Seeded random concatenations of fragments from every category."""
    rng = random.Random(SEED + 3)
    alphabet_pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "éèêëàâäôöùûüçñ", "你好世界中文日本語한국어",
        "😀👍🏽❤️🇫🇷", "αβγδεζηθ", "абвгдежз", "عربى", "हिन्दी",
    ]
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "It's", "HTTP",
             "token", "izer", "  ", "\n", "12345", "don't", "They'LL", "<|im_end|>", "naïve"]
    cases = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.5:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(alphabet_pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
            if rng.random() < 0.6:
                parts.append(rng.choice([" ", "", "  ", "\n", "\t"]))
        cases.append("".join(parts))
    return cases


def _long_cases() -> list[str]:
    rng = random.Random(SEED + 4)
    prose = ("The history of natural language processing generally started in the 1950s, "
             "although work can be found from earlier periods. In 1950, Alan Turing published "
             "an article titled \"Computing Machinery and Intelligence\" which proposed what is "
             "now called the Turing test as a criterion of intelligence. ")
    mixed = "".join(rng.choice(["word ", "1234 ", "\n", "  ", "é", "中", "😀", "it's ", "!!"])
                    for _ in range(400))
    return [prose * 6, mixed, "a" * 300, "ab" * 200, " ab" * 150, "1" * 100, "!" * 64,
            "中" * 100, "😀" * 40]


def build_corpus() -> list[tuple[bytes, bool]]:
    """Returns (raw bytes, parse_special) pairs in a fixed order."""
    text_cases: list[str] = []
    for group in (_whitespace_cases(), _number_cases(), _code_cases(), _contraction_cases(),
                  _punctuation_cases(), _url_json_markdown_cases(), _script_cases(),
                  _accent_cases(), _emoji_cases(), _special_lookalike_cases(), _control_cases(),
                  _random_mix_cases(60), _long_cases()):
        text_cases.extend(group)

    entries: list[tuple[bytes, bool]] = []
    seen: set[tuple[bytes, bool]] = set()

    def add(raw: bytes, special: bool) -> None:
        key = (raw, special)
        if key not in seen:
            seen.add(key)
            entries.append(key)

    for text in text_cases:
        add(text.encode("utf-8"), False)
    for raw in _invalid_utf8_cases():
        add(raw, False)
    # With special=True the special-token spellings must become single control ids,
    # while look-alikes must fall back to ordinary BPE.
    for text in _special_lookalike_cases() + SPECIAL_TOKENS + [
            "Hello<|im_end|>", "<|im_end|>Hello", " <|endoftext|> ", "<|im_start|><|im_start|>",
            "<|im_start|>assistant\nSure! 😀<|im_end|>", "plain text, no specials",
            "<|im_start|>user\n<|endoftext|> inside<|im_end|>"]:
        add(text.encode("utf-8"), True)
    return entries


def tokenize_with_llama_cpp(model_path: Path, corpus: list[tuple[bytes, bool]]) -> list[list[int]]:
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    return [llm.tokenize(raw, add_bos=False, special=special) for raw, special in corpus]


def _hf_reference_tokenizers(model_path: Path):
    """HF `tokenizers` built from the GGUF vocab/merges, with SmolLM2's original pre-tokenizer.

    transformers' GGUF converter emits a plain GPT-2 ByteLevel pre-tokenizer, but
    SmolLM2's tokenizer.json (like StarCoder's) is Sequence[Digits(individual_digits),
    ByteLevel(use_regex)]: digits are isolated *before* the GPT-2 regex runs, which
    changes how whitespace runs next to digits split. We restore that pipeline.
    Returns (with_specials, without_specials) tokenizers.
    """
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    converted = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    spec = json.loads(converted.backend_tokenizer.to_str())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    with_specials = Tokenizer.from_str(json.dumps(spec))
    spec["added_tokens"] = []  # special=False: control-token spellings are plain text
    without_specials = Tokenizer.from_str(json.dumps(spec))
    return with_specials, without_specials


def cross_check_with_hf(model_path: Path, corpus, ids_list) -> tuple[int, int, list[str]]:
    """Compares with HF tokenizers (valid UTF-8 only). Returns (checked, mismatched, notes)."""
    try:
        with_specials, without_specials = _hf_reference_tokenizers(model_path)
    except Exception as exc:  # the cross-check is optional
        return 0, 0, [f"HF cross-check skipped: {exc}"]
    checked = mismatched = 0
    notes = []
    for (raw, special), ids in zip(corpus, ids_list):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        tok = with_specials if special else without_specials
        hf_ids = tok.encode(text, add_special_tokens=False).ids
        checked += 1
        if list(hf_ids) != list(ids):
            mismatched += 1
            notes.append(f"special={special} text={text!r:.60} llama={ids[:12]} hf={list(hf_ids)[:12]}")
    return checked, mismatched, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--corpus-only", action="store_true", help="print corpus stats and exit")
    parser.add_argument("--no-hf-check", action="store_true")
    args = parser.parse_args()

    corpus = build_corpus()
    num_invalid = 0
    for raw, _ in corpus:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            num_invalid += 1
    num_special = sum(1 for _, special in corpus if special)
    print(f"corpus: {len(corpus)} entries ({num_special} with special=True, {num_invalid} invalid UTF-8)")
    if args.corpus_only:
        return 0

    ids_list = tokenize_with_llama_cpp(args.model, corpus)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for (raw, special), ids in zip(corpus, ids_list):
            out.write(json.dumps({"text_b64": base64.b64encode(raw).decode("ascii"),
                                  "special": special, "ids": ids}) + "\n")
    print(f"wrote {args.out} ({sum(len(i) for i in ids_list)} tokens total)")

    if not args.no_hf_check:
        checked, mismatched, notes = cross_check_with_hf(args.model, corpus, ids_list)
        print(f"HF tokenizers cross-check: {checked} valid-UTF-8 strings, {mismatched} differ from llama.cpp")
        for note in notes[:40]:
            print("  " + note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
