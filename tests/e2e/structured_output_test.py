#!/usr/bin/env python3
"""End-to-end tests of structured output (constrained decoding) on a real `tessera serve` and the real
default model (docs/structured_output.md).

  * 50+ JSON schemas (nested objects, arrays with item bounds, enums, const, anyOf, $defs/$ref,
    patterns, formats, numeric bounds, nullable fields) x greedy and sampled decoding, through
    response_format json_schema: every output parses and validates with the `jsonschema` package, and
    finishes with reason "stop";
  * json_object, regex and choice (OpenAI, vLLM's structured_outputs and guided_* fields), GBNF
    grammars (one written here; llama.cpp's json.gbnf when its sources are in the peers cache), and
    llama-server's json_schema / grammar fields; streaming; n > 1; /v1/ws;
  * the openai SDK's client.chat.completions.parse(response_format=PydanticModel);
  * bad input: each a 400 naming the problem, while other requests run on unharmed.
Prints "N passed, M failed" and exits non-zero on any failure.
Usage: structured_output_test.py TESSERA_BINARY MODEL
"""
import asyncio
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

from served import served  # tests/e2e/served.py

BIN, MODEL = sys.argv[1], sys.argv[2]
try:
    import jsonschema
    import openai
    import pydantic
    import websockets
except ImportError as e:  # scripts/test installs them
    print(f"SKIP: {e} (scripts/test installs jsonschema openai pydantic websockets)")
    sys.exit(77)

ENGINE = ["--threads", "2", "--num-kv-blocks", "256", "--swap-space", "0.05", "--max-model-len", "1024", "--quiet"]


class server(served):
    """`tessera serve` on a free loopback port (tests/e2e/served.py)."""

    def __init__(self, *extra):
        super().__init__([BIN, "serve", MODEL, *ENGINE, *extra])

    def model_id(self):
        return json.loads(self.request("GET", "/v1/models")[1])["data"][0]["id"]


# llama.cpp's own grammars, committed as fixtures (MIT; provenance in tests/data/grammars/README.md).
LLAMA_CPP_GRAMMARS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "grammars")
results = []


def check(name, fn):
    t0 = time.time()
    try:
        fn()
        results.append((name, True, ""))
        print(f"ok   {name} ({time.time() - t0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 -- a failed check is reported, the others still run
        results.append((name, False, f"{type(e).__name__}: {e}"))
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()


def s(**kw):  # a small-string helper: bounded strings keep a 135M model's values short
    return {"type": "string", **kw}


# ---- the schemas ------------------------------------------------------------------------------------
SCHEMAS = []


def schema(name, body, prompt):
    SCHEMAS.append((name, body, prompt))


schema("flat person", {"type": "object", "properties": {"name": s(maxLength=20), "age": {"type": "integer", "minimum": 0,
       "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}, "a person")
schema("enum colour", {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
       "required": ["colour"]}, "your favourite colour")
schema("boolean + number", {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number",
       "minimum": 0, "maximum": 1}}, "required": ["ok", "score"]}, "a test result")
schema("integer bounds", {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900,
       "maximum": 2100}}, "required": ["year"]}, "the year the web was invented")
schema("exclusive bounds", {"type": "object", "properties": {"t": {"type": "integer", "exclusiveMinimum": 0,
       "exclusiveMaximum": 10}}, "required": ["t"]}, "a digit")
schema("negative range", {"type": "object", "properties": {"c": {"type": "integer", "minimum": -40, "maximum": -1}},
       "required": ["c"]}, "a freezing temperature in Celsius")
schema("const", {"type": "object", "properties": {"version": {"const": 2}, "kind": {"const": "report"}},
       "required": ["version", "kind"]}, "a report header")
schema("string pattern", {"type": "object", "properties": {"code": s(pattern="^[A-Z]{3}-[0-9]{3}$")},
       "required": ["code"]}, "a product code")
schema("zip pattern", {"type": "object", "properties": {"zip": s(pattern="^[0-9]{5}$")}, "required": ["zip"]},
       "a US zip code")
schema("hex colour", {"type": "object", "properties": {"hex": s(pattern="^#[0-9a-f]{6}$")}, "required": ["hex"]},
       "a colour in hex")
schema("min/max length", {"type": "object", "properties": {"word": s(minLength=3, maxLength=8)},
       "required": ["word"]}, "a word")
schema("array of ints", {"type": "object", "properties": {"primes": {"type": "array", "items": {"type": "integer",
       "minimum": 0, "maximum": 100}, "minItems": 2, "maxItems": 5}}, "required": ["primes"]}, "a few primes")
schema("array of enums", {"type": "object", "properties": {"days": {"type": "array", "items": {"enum": ["mon",
       "tue", "wed", "thu", "fri"]}, "minItems": 1, "maxItems": 3}}, "required": ["days"]}, "working days")
schema("top-level array", {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 3,
       "maxItems": 3}, "three digits")
schema("array of objects", {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "minItems": 1,
       "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                  "label": s(maxLength=12)},
                 "required": ["id", "label"], "additionalProperties": False}}}, "required": ["items"]},
       "a short todo list")
schema("nested object", {"type": "object", "properties": {"user": {"type": "object", "properties": {
       "name": s(maxLength=16), "address": {"type": "object", "properties": {"city": s(maxLength=16),
                                            "zip": s(pattern="^[0-9]{5}$")}, "required": ["city", "zip"]}},
       "required": ["name", "address"]}}, "required": ["user"]}, "a user with an address")
schema("deep nesting", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type":
       "object", "properties": {"c": {"type": "object", "properties": {"d": {"type": "integer", "minimum": 0,
       "maximum": 9}}, "required": ["d"]}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
       "nested letters")
schema("anyOf scalar", {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0,
       "maximum": 50}, s(maxLength=10)]}}, "required": ["value"]}, "a value")
schema("anyOf objects", {"type": "object", "properties": {"shape": {"anyOf": [
       {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1,
        "maximum": 9}}, "required": ["kind", "r"], "additionalProperties": False},
       {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1,
        "maximum": 9}}, "required": ["kind", "side"], "additionalProperties": False}]}}, "required": ["shape"]},
       "a shape")
schema("nullable anyOf", {"type": "object", "properties": {"nick": {"anyOf": [s(maxLength=10), {"type": "null"}]}},
       "required": ["nick"]}, "a nickname or null")
schema("type list", {"type": "object", "properties": {"n": {"type": ["integer", "null"], "minimum": 0,
       "maximum": 9}}, "required": ["n"]}, "a digit or null")
schema("$defs + $ref", {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
       "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"],
       "additionalProperties": False}}, "type": "object", "properties": {"start": {"$ref": "#/$defs/point"},
       "end": {"$ref": "#/$defs/point"}}, "required": ["start", "end"]}, "a line segment")
schema("definitions + $ref", {"definitions": {"tag": s(maxLength=8)}, "type": "object", "properties": {"tags": {
       "type": "array", "items": {"$ref": "#/definitions/tag"}, "maxItems": 3}}, "required": ["tags"]}, "tags")
# (A recursive $ref lets a model nest without end, which a 135M model does until max_tokens: it is
# checked token by token in tests/structured/grammar_backend_test.cpp instead.)
schema("nested $refs", {"$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0,
       "maximum": 9}}, "required": ["v"], "additionalProperties": False}, "node": {"type": "object", "properties": {
       "v": {"type": "integer", "minimum": 0, "maximum": 9}, "kids": {"type": "array", "items": {"$ref":
       "#/$defs/leaf"}, "maxItems": 2}}, "required": ["v", "kids"], "additionalProperties": False}},
       "$ref": "#/$defs/node"}, "a small tree")
schema("optional properties", {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
       "maximum": 9}, "b": s(maxLength=5), "c": {"type": "boolean"}}, "required": ["a"],
       "additionalProperties": False}, "a record")
schema("many fields", {"type": "object", "properties": {k: {"type": "integer", "minimum": 0, "maximum": 99}
       for k in "abcdefgh"}, "required": list("abcdefgh")}, "eight numbers")
schema("enum of numbers", {"type": "object", "properties": {"level": {"enum": [1, 2, 3, 5, 8]}},
       "required": ["level"]}, "a level")
schema("mixed enum", {"type": "object", "properties": {"x": {"enum": ["auto", 0, True, None]}}, "required": ["x"]},
       "a setting")
schema("date format", {"type": "object", "properties": {"day": s(format="date")}, "required": ["day"]},
       "a date")
schema("email pattern", {"type": "object", "properties": {"mail": s(pattern="^[a-z]{1,12}@[a-z]{1,12}\\.(com|org)$")},
       "required": ["mail"]}, "an email address")
schema("date-time format", {"type": "object", "properties": {"at": s(format="date-time")}, "required": ["at"]},
       "a meeting time")
schema("uuid format", {"type": "object", "properties": {"id": s(format="uuid")}, "required": ["id"]}, "an id")
schema("ipv4 format", {"type": "object", "properties": {"ip": s(format="ipv4")}, "required": ["ip"]},
       "an IP address")
schema("string enum array", {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 4},
       "letters")
schema("boolean only", {"type": "boolean"}, "true or false")
schema("integer only", {"type": "integer", "minimum": 0, "maximum": 1000}, "a number")
schema("string only", s(maxLength=20), "a short greeting")
schema("enum only", {"enum": ["north", "south", "east", "west"]}, "a direction")
schema("weather", {"type": "object", "properties": {"city": s(maxLength=15), "temp_c": {"type": "integer",
       "minimum": -50, "maximum": 50}, "sky": {"enum": ["clear", "cloudy", "rain"]}},
       "required": ["city", "temp_c", "sky"], "additionalProperties": False}, "today's weather")
schema("book", {"type": "object", "properties": {"title": s(maxLength=30), "author": s(maxLength=20), "year":
       {"type": "integer", "minimum": 1450, "maximum": 2025}, "genres": {"type": "array", "items": s(maxLength=10),
       "maxItems": 2}}, "required": ["title", "author", "year", "genres"]}, "a book")
schema("order", {"type": "object", "properties": {"order_id": s(pattern="^ORD[0-9]{4}$"), "lines": {"type": "array",
       "minItems": 1, "maxItems": 2, "items": {"type": "object", "properties": {"sku": s(pattern="^[A-Z]{2}[0-9]{2}$"),
       "qty": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["sku", "qty"]}}},
       "required": ["order_id", "lines"]}, "an order")
schema("event", {"type": "object", "properties": {"name": s(maxLength=20), "when": s(format="date"), "online":
       {"type": "boolean"}}, "required": ["name", "when", "online"]}, "an event")
schema("rgb", {"type": "object", "properties": {c: {"type": "integer", "minimum": 0, "maximum": 255}
       for c in ("r", "g", "b")}, "required": ["r", "g", "b"]}, "a colour")
schema("matrix", {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "array", "minItems": 2,
       "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}, "a 2x2 matrix")
schema("key value pairs", {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {"k": s(
       maxLength=6), "v": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["k", "v"]}}, "pairs")
schema("sentiment", {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
       "confidence": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["label", "confidence"]},
       "the sentiment of 'I love it'")
schema("classification", {"type": "object", "properties": {"category": {"enum": ["bug", "feature", "question"]},
       "priority": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["category", "priority"]},
       "a ticket triage")
schema("coordinates", {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
       "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"]},
       "the coordinates of Paris")
schema("step list", {"type": "object", "properties": {"steps": {"type": "array", "minItems": 2, "maxItems": 3,
       "items": s(maxLength=25)}}, "required": ["steps"]}, "steps to boil an egg")
schema("answer + reason", {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0,
       "maximum": 100}, "reason": s(maxLength=40)}, "required": ["answer", "reason"]}, "2 + 2, with a reason")
schema("yes/no", {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
       "additionalProperties": False}, "is the sky blue?")
schema("tuple prefixItems", {"type": "array", "prefixItems": [s(maxLength=8), {"type": "integer", "minimum": 0,
       "maximum": 99}], "items": False}, "a name and an age")
schema("allOf of one $ref", {"$defs": {"size": {"enum": ["S", "M", "L"]}}, "type": "object", "properties": {
       "size": {"allOf": [{"$ref": "#/$defs/size"}], "description": "a T-shirt size"}}, "required": ["size"]},
       "a T-shirt size")
schema("object property count", {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
       "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"],
       "minProperties": 2, "maxProperties": 2}, "a point")
schema("nested arrays of enums", {"type": "object", "properties": {"grid": {"type": "array", "minItems": 1,
       "maxItems": 2, "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"enum": ["x", "o"]}}}},
       "required": ["grid"]}, "a tic-tac-toe row")
schema("multipleOf", {"type": "object", "properties": {"even": {"type": "integer", "multipleOf": 2, "minimum": 0,
       "maximum": 20}}, "required": ["even"]}, "an even number")
schema("described fields", {"title": "Pet", "description": "a pet", "type": "object", "properties": {
       "species": {"description": "what it is", "enum": ["cat", "dog"]}, "name": s(maxLength=12, title="Name")},
       "required": ["species", "name"]}, "a pet")

GREEDY = {"temperature": 0}
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "seed": 7}


def validate(instance, body):
    jsonschema.validate(instance, body, format_checker=jsonschema.FormatChecker())


def run_schema_case(srv, name, body, prompt, sampling):
    req = {"messages": [{"role": "user", "content": f"Answer in JSON: {prompt}."}], "max_tokens": 320,
           "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": body}}, **sampling}
    status, data, _ = srv.request("POST", "/v1/chat/completions", req, timeout=600)
    assert status == 200, (status, data[:300])
    out = json.loads(data)
    choice = out["choices"][0]
    text = choice["message"]["content"]
    assert choice["finish_reason"] == "stop", (choice["finish_reason"], text)
    validate(json.loads(text), body)
    return text


def test_schemas(srv):
    cases = [(n, b, p, mode, params) for n, b, p in SCHEMAS for mode, params in (("greedy", GREEDY),
                                                                                   ("sampled", SAMPLED))]
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = {pool.submit(run_schema_case, srv, n, b, p, params): (n, mode) for n, b, p, mode, params in cases}
        for f in concurrent.futures.as_completed(futures):
            n, mode = futures[f]
            try:
                f.result()
            except Exception as e:  # noqa: BLE001
                failures.append(f"{n} ({mode}): {type(e).__name__}: {str(e)[:300]}")
    assert len(SCHEMAS) >= 50, len(SCHEMAS)
    assert not failures, f"{len(failures)} of {len(cases)} outputs invalid:\n  " + "\n  ".join(failures)


def chat(srv, content, max_tokens=64, path="/v1/chat/completions", **fields):
    body = {"max_tokens": max_tokens, **fields}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": content}]
    else:
        body["prompt"] = content
    status, data, _ = srv.request("POST", path, body, timeout=600)
    return status, json.loads(data)


def content_of(out):
    c = out["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def test_regex_and_choice(srv):
    cases = [
        ({"guided_regex": r"\d{3}-\d{4}"}, lambda t: re.fullmatch(r"\d{3}-\d{4}", t)),
        ({"structured_outputs": {"regex": "(yes|no), because [a-z ]{1,20}\\."}},
         lambda t: re.fullmatch(r"(yes|no), because [a-z ]{1,20}\.", t)),
        ({"guided_regex": "[A-Z][a-z]{2,8}"}, lambda t: re.fullmatch("[A-Z][a-z]{2,8}", t)),
        ({"guided_choice": ["Paris", "London", "Berlin"]}, lambda t: t in ("Paris", "London", "Berlin")),
        ({"structured_outputs": {"choice": ["positive", "negative"]}}, lambda t: t in ("positive", "negative")),
    ]
    for fields, ok in cases:
        for sampling in (GREEDY, SAMPLED):
            status, out = chat(srv, "What is the capital of France? Answer briefly.", **fields, **sampling)
            assert status == 200, (fields, out)
            text = content_of(out)
            assert ok(text), (fields, sampling, text)
            assert out["choices"][0]["finish_reason"] == "stop", (fields, out["choices"][0])
    # /v1/completions too
    status, out = chat(srv, "The answer is", path="/v1/completions", guided_regex="[0-9]{2}", temperature=0)
    assert status == 200 and re.fullmatch("[0-9]{2}", content_of(out)), out


# Our own GBNF (llama.cpp's dialect): one arithmetic equation, as llama.cpp's arithmetic.gbnf but a
# single line, so the output always ends.
EQUATION_GBNF = r'''
root  ::= expr "=" ws num
expr  ::= term ([-+*] term)*
term  ::= num | "(" ws expr ")" ws
num   ::= [1-9] [0-9]? ws
ws    ::= " "?
'''


def test_gbnf(srv):
    status, out = chat(srv, "Write an equation.", guided_grammar=EQUATION_GBNF, temperature=0)
    assert status == 200, out
    text = content_of(out)
    assert re.fullmatch(r"[0-9()+*\- ]+= ?[1-9][0-9]? ?", text), text
    # llama-server's field name, sampled
    status, out = chat(srv, "Write an equation.", grammar=EQUATION_GBNF, **SAMPLED)
    assert status == 200 and re.fullmatch(r"[0-9()+*\- ]+= ?[1-9][0-9]? ?", content_of(out)), out
    # llama.cpp's json.gbnf, unchanged: greedy and sampled, through both field names. The oracle is
    # Python's json parser (the grammar is JSON's, whitespace included).
    with open(os.path.join(LLAMA_CPP_GRAMMARS, "json.gbnf"), encoding="utf-8") as f:
        json_gbnf = f.read()
    for fields in ({"structured_outputs": {"grammar": json_gbnf}, **GREEDY}, {"grammar": json_gbnf, **SAMPLED}):
        status, out = chat(srv, "Describe a cat as JSON.", max_tokens=300, **fields)
        assert status == 200, out
        text, reason = content_of(out), out["choices"][0]["finish_reason"]
        # json.gbnf lets whitespace follow the object, so the model itself ends it (stop) or runs into
        # max_tokens inside it: either way the text is a JSON object or a prefix of one.
        if reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert reason == "length" and text.startswith("{"), (reason, text)
    # llama.cpp's list.gbnf: lines "- item\n", one or more (never complete by itself).
    with open(os.path.join(LLAMA_CPP_GRAMMARS, "list.gbnf"), encoding="utf-8") as f:
        list_gbnf = f.read()
    status, out = chat(srv, "List three fruits.", max_tokens=40, guided_grammar=list_gbnf, **GREEDY)
    assert status == 200, out
    text, reason = content_of(out), out["choices"][0]["finish_reason"]
    line = r"- [^\r\n\x0b\x0c\x85\u2028\u2029]+"
    if reason == "stop":
        assert re.fullmatch(f"({line}\n)+", text), text
    else:  # cut at max_tokens: complete lines, then possibly a started one
        assert reason == "length" and re.fullmatch(f"({line}\n)*(- ?|{line})?", text), (reason, text)


def test_json_object_and_other_dialects(srv):
    for fields in ({"response_format": {"type": "json_object"}}, {"structured_outputs": {"json_object": True}}):
        # (A prompt a 135M model answers with a small object: asked to "describe a dog" it nests
        # "breed_info" objects until max_tokens, which any engine would let it do.)
        status, out = chat(srv, 'Return a JSON object with one key, "animal", whose value is dog.', max_tokens=200,
                           **fields, temperature=0)
        assert status == 200, out
        assert out["choices"][0]["finish_reason"] == "stop", out["choices"][0]
        assert isinstance(json.loads(content_of(out)), dict), content_of(out)
    body = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
    for fields in ({"guided_json": body}, {"guided_json": json.dumps(body)}, {"json_schema": body},
                   {"structured_outputs": {"json": body}}):
        status, out = chat(srv, "Pick a digit.", **fields, temperature=0)
        assert status == 200, (fields, out)
        validate(json.loads(content_of(out)), body)
    # The no-op value is accepted as such.
    status, out = chat(srv, "Hi", max_tokens=4, response_format={"type": "text"})
    assert status == 200, out


def test_stream_and_n(srv):
    body = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog", "owl"]}, "legs": {"type": "integer",
            "minimum": 0, "maximum": 8}}, "required": ["animal", "legs"]}
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none")
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": body}}
    stream = client.chat.completions.create(model=srv.model_id(), messages=[{"role": "user", "content": "An animal."}],
                                            max_tokens=64, stream=True, response_format=rf)
    text, reasons = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].finish_reason:
                reasons.append(chunk.choices[0].finish_reason)
    validate(json.loads(text), body)
    assert reasons == ["stop"], reasons
    out = client.chat.completions.create(model=srv.model_id(), messages=[{"role": "user", "content": "An animal."}],
                                         max_tokens=64, n=3, temperature=1.0, seed=3, response_format=rf)
    assert len(out.choices) == 3
    for c in out.choices:
        validate(json.loads(c.message.content), body)
        assert c.finish_reason == "stop"


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int = pydantic.Field(ge=0, le=120)
    pets: list[str] = pydantic.Field(max_length=3)
    address: Address


def test_openai_parse(srv):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none")
    for temperature in (0.0, 0.8):
        completion = client.chat.completions.parse(
            model=srv.model_id(), messages=[{"role": "user", "content": "Invent a person with an address and pets."}],
            response_format=Person, max_tokens=256, temperature=temperature, seed=1)
        person = completion.choices[0].message.parsed
        assert isinstance(person, Person), completion
        assert completion.choices[0].finish_reason == "stop"


def test_websocket(srv):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/ws") as ws:
            body = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
            await ws.send(json.dumps({"type": "start", "id": "g1", "request": {
                "messages": [{"role": "user", "content": "ok?"}], "max_tokens": 32, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": body}}}}))
            text = ""
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if m["type"] == "delta":
                    text += m.get("text", "")
                if m["type"] in ("final", "error"):
                    break
            assert m["type"] == "final", m
            validate(json.loads(text), body)
            await ws.send(json.dumps({"type": "start", "id": "g2", "request": {
                "messages": [{"role": "user", "content": "x"}], "guided_grammar": "root ::= ("}}))
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if m["type"] in ("final", "error"):
                    break
            assert m["type"] == "error" and m["status"] == 400, m
            assert "grammar does not parse" in m["error"]["message"], m
    asyncio.run(go())


def bad_cases():
    deep = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 64} for i in range(1200)}}
    rf = lambda body, strict=None: {"response_format": {"type": "json_schema", "json_schema": {  # noqa: E731
        "name": "x", "schema": body, **({} if strict is None else {"strict": strict})}}}
    return [
        ("invalid schema type", rf({"type": "objekt"}), "response_format", "unknown 'type'"),
        ("unknown keyword in strict mode", rf({"type": "object", "properties": {"a": {"type": "string", "foo": 1}}},
                                              strict=True), "response_format", "'foo'"),
        ("unresolvable $ref", rf({"$ref": "#/$defs/nope"}), "response_format", "invalid JSON schema"),
        ("schema not JSON", {"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ("allOf of two schemas", rf({"allOf": [{"type": "object"}, {"required": ["a"]}]}), "response_format",
         "'allOf'"),
        ("strict: pattern with maxLength", rf({"type": "string", "pattern": "^a+$", "maxLength": 3}, strict=True),
         "response_format", "'pattern' or 'format'"),
        ("strict: unknown format", rf({"type": "string", "format": "zip"}, strict=True), "response_format", "'zip'"),
        ("schema too deep", rf(deep), "response_format", "nests more than"),
        ("schema too big", rf(big), "response_format", "bytes, at most"),
        ("grammar does not parse", {"guided_grammar": "root ::= (\"a\""}, "guided_grammar", "does not parse"),
        ("grammar with an undefined rule", {"grammar": "root ::= foo"}, "grammar", "does not parse"),
        ("regex does not compile", {"guided_regex": "(ab"}, "guided_regex", "does not compile"),
        ("two constraints", {"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "cannot be combined"),
        ("empty choice", {"guided_choice": []}, "guided_choice", "must not be empty"),
        ("unknown response_format type", {"response_format": {"type": "yaml"}}, "response_format.type", "must be"),
        ("json_schema without schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format.json_schema.schema", "is required"),
        ("structured_outputs empty", {"structured_outputs": {}}, "structured_outputs", "must hold one of"),
    ]


def test_bad_inputs(srv):
    # Good requests run meanwhile and must be unaffected.
    good_body = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                 "required": ["n"]}
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        goods = [pool.submit(chat, srv, "Pick a digit.", 32, guided_json=good_body, temperature=0.7, seed=i)
                 for i in range(3)]
        problems = []
        for name, fields, param, message in bad_cases():
            status, out = chat(srv, "hello", **fields)
            err = out.get("error", {})
            if status != 400 or err.get("param") != param or message not in err.get("message", ""):
                problems.append(f"{name}: {status} {err}")
        for g in goods:
            status, out = g.result()
            assert status == 200, out
            validate(json.loads(content_of(out)), good_body)
    assert not problems, "\n  ".join(problems)
    status, data, _ = srv.request("GET", "/health")
    assert status == 200, data


def test_bench_script(srv):
    """bench/structured_output_bench.py runs to a complete report (tiny sizes; no timing asserts)."""
    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "structured_output_bench.py")
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "report.json")
        subprocess.run([sys.executable, bench, "--base-url", f"http://127.0.0.1:{srv.port}", "--concurrency", "3",
                        "--max-tokens", "48", "--compile-schemas", "2", "--output", out_path],
                       check=True, timeout=600, stdout=subprocess.DEVNULL)
        with open(out_path, encoding="utf-8") as f:
            report = json.load(f)
    assert len(report["compile"]) == 2, report
    for phase in ("unconstrained", "json_schema"):
        assert report[phase]["requests"] == 3 and report[phase]["output_tokens"] > 0, report[phase]
    # The unconstrained phase generated exactly the constrained phase's lengths (ignore_eos).
    assert report["unconstrained"]["output_tokens"] == report["json_schema"]["output_tokens"], report
    assert report["server_grammar_masks"] >= report["json_schema"]["output_tokens"], report
    assert report["server_mask_wait_s"] >= 0, report


def main():
    srv = server("--max-num-seqs", "16")
    try:
        check("50+ JSON schemas x greedy and sampled: every output validates", lambda: test_schemas(srv))
        check("regex and choice outputs always match", lambda: test_regex_and_choice(srv))
        check("GBNF grammars (own, llama.cpp's json.gbnf and list.gbnf)", lambda: test_gbnf(srv))
        check("json_object, guided_json, llama-server json_schema, no-ops", lambda: test_json_object_and_other_dialects(srv))
        check("streaming and n > 1", lambda: test_stream_and_n(srv))
        check("openai SDK chat.completions.parse(response_format=Pydantic)", lambda: test_openai_parse(srv))
        check("/v1/ws: constrained generation and a 400", lambda: test_websocket(srv))
        check("bad input: each a 400 naming the problem, others unaffected", lambda: test_bad_inputs(srv))
        check("bench/structured_output_bench.py produces a complete report", lambda: test_bench_script(srv))
        m = srv.metrics()
        busy = m.get("tessera_num_requests_running", 0) + m.get('tessera_kv_blocks_used{pool="device"}', 0)
        if busy:
            results.append(("idle at the end", False, f"running/used blocks left: {busy}"))
    finally:
        srv.stop()
    passed = sum(1 for _, ok, _ in results if ok)
    failed = len(results) - passed
    for name, ok, why in results:
        if not ok:
            print(f"FAILED: {name}: {why}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
