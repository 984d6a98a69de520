// The grammar engine (engine/structured/, over xgrammar): masks, acceptance, completion, rollback and
// forks of the matcher; every kind of spec; the compile cache, its bounds and the refusals; masks
// filled concurrently on the workers. A small byte-level vocabulary makes every mask checkable by hand;
// the real model's vocabulary (when models/ has it) checks a random walk through the masks always ends
// in output that parses.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/gguf.hpp"
#include "engine/structured/grammar_backend.hpp"
#include "engine/structured/schema_check.hpp"
#include "engine/structured_output.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera::structured {
namespace {

// Token 0 is the end token; 1..95 the printable ASCII bytes (GPT-2's byte alphabet maps them to
// themselves, the space to U+0120); then a few multi-byte tokens and the newline.
const std::vector<std::string> extra_tokens = {"{\"", "\":", "true", "false", "12", "abc", "\"}", "Ġ{", "Ċ"};

std::shared_ptr<const tokenizer> byte_tokenizer() {
  vocab_data v;
  v.kind = vocab_kind::bpe;
  v.tokens.push_back("<|end|>");
  v.types.push_back(token_type::control);
  for (int c = 0x20; c < 0x7f; ++c) {
    v.tokens.push_back(c == ' ' ? std::string("\xC4\xA0") : std::string(1, static_cast<char>(c)));
    v.types.push_back(token_type::normal);
  }
  for (const std::string& t : extra_tokens) {
    v.tokens.push_back(t);
    v.types.push_back(token_type::normal);
  }
  v.eos = 0;
  return std::make_shared<const tokenizer>(std::move(v));
}

token_id extra_id(const std::string& t) {
  return static_cast<token_id>(96 + (std::find(extra_tokens.begin(), extra_tokens.end(), t) - extra_tokens.begin()));
}
token_id byte_id(char c) { return c == '\n' ? extra_id("Ċ") : static_cast<token_id>(c - 0x20 + 1); }

structured_output_spec spec_of(structured_output_spec::kind k, std::string source, bool strict = false) {
  structured_output_spec s;
  s.type = k;
  s.source = std::move(source);
  s.strict = strict;
  return s;
}

using kind = structured_output_spec::kind;

class GrammarBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = byte_tokenizer();
    vocab_ = static_cast<int32_t>(tok_->vocab_size()) + 5;  // padded like a model's logits
    backend_ = make_grammar_backend(*tok_, vocab_);
  }
  std::vector<uint32_t> mask_of(token_constraint& c) {
    std::vector<uint32_t> m(static_cast<size_t>(token_mask_words(vocab_)), 0xdeadbeef);
    c.fill_next_mask(m);
    return m;
  }
  std::vector<token_id> allowed(token_constraint& c) {
    const std::vector<uint32_t> m = mask_of(c);
    std::vector<token_id> out;
    for (token_id t = 0; t < vocab_; ++t)
      if (token_allowed(m, t)) out.push_back(t);
    return out;
  }
  bool accept_text(token_constraint& c, const std::string& text) {
    for (char ch : text)
      if (!c.accept(byte_id(ch))) return false;
    return true;
  }
  std::string error_of(const structured_output_spec& s) {
    try {
      backend_->compile(s);
    } catch (const invalid_request& e) { return e.what(); }
    return "";
  }

  std::shared_ptr<const tokenizer> tok_;
  int32_t vocab_ = 0;
  std::shared_ptr<constraint_backend> backend_;
};

TEST_F(GrammarBackend, JsonSchemaMasksAllowExactlyTheValidContinuations) {
  auto g = backend_->compile(spec_of(kind::json_schema, R"({"type": "object", "properties": {"a": {"type": "boolean"}},
                                                           "required": ["a"]})"));
  auto c = g->start();
  // The start: "{" or a token that begins with it; never the end token, a space (compact) or text.
  const std::vector<token_id> first = allowed(*c);
  EXPECT_EQ(first, (std::vector<token_id>{byte_id('{'), extra_id("{\"")}));
  EXPECT_FALSE(c->accept(byte_id('x')));  // refused, state unchanged
  EXPECT_TRUE(c->accept(extra_id("{\"")));
  EXPECT_TRUE(accept_text(*c, "a\": "));
  const std::vector<token_id> value = allowed(*c);
  EXPECT_EQ(value, (std::vector<token_id>{byte_id('f'), byte_id('t'), extra_id("true"), extra_id("false")}));
  EXPECT_TRUE(c->accept(extra_id("true")));
  EXPECT_FALSE(c->is_complete());
  EXPECT_TRUE(c->accept(byte_id('}')));
  // Root matched and only the end token may follow: complete, and the mask says so.
  EXPECT_TRUE(c->is_complete());
  EXPECT_EQ(allowed(*c), std::vector<token_id>{0});
  // Padding ids beyond the tokenizer are never allowed.
  for (token_id t = static_cast<token_id>(tok_->vocab_size()); t < vocab_; ++t)
    EXPECT_FALSE(token_allowed(mask_of(*c), t));
}

TEST_F(GrammarBackend, RollbackAndForkRestoreEarlierStates) {
  auto g = backend_->compile(spec_of(kind::regex, "(ab|ac)d+"));
  auto c = g->start();
  const auto at_start = allowed(*c);
  ASSERT_TRUE(c->accept(byte_id('a')));
  const auto after_a = allowed(*c);
  EXPECT_EQ(after_a, (std::vector<token_id>{byte_id('b'), byte_id('c')}));
  auto fork = c->fork();
  ASSERT_TRUE(c->accept(byte_id('b')));
  ASSERT_TRUE(c->accept(byte_id('d')));
  EXPECT_EQ(c->num_accepted(), 3);
  EXPECT_FALSE(c->is_complete());  // "d+" may go on: more d or the end token
  EXPECT_EQ(allowed(*c), (std::vector<token_id>{0, byte_id('d')}));
  c->rollback(2);
  EXPECT_EQ(c->num_accepted(), 1);
  EXPECT_EQ(allowed(*c), after_a);
  c->rollback(1);
  EXPECT_EQ(allowed(*c), at_start);
  EXPECT_THROW(c->rollback(1), invalid_request);
  // The fork kept its own state through all of that.
  EXPECT_EQ(allowed(*fork), after_a);
  EXPECT_TRUE(fork->accept(byte_id('c')));
  EXPECT_FALSE(fork->accept(byte_id('c')));
}

TEST_F(GrammarBackend, ChoicesGbnfAndJsonObject) {
  structured_output_spec choice = spec_of(kind::choice, "");
  choice.choices = {"yes", "no", "a \"quoted\\\" one"};
  auto c = backend_->compile(choice)->start();
  EXPECT_EQ(allowed(*c), (std::vector<token_id>{byte_id('a'), byte_id('n'), byte_id('y')}));
  EXPECT_TRUE(accept_text(*c, "a \"quoted\\\" one"));
  EXPECT_TRUE(c->is_complete());

  // llama.cpp's GBNF: comments, character classes, repetition.
  auto gbnf = backend_
                  ->compile(spec_of(kind::grammar, R"(# a sum of small numbers
root ::= num (" + " num)*
num  ::= [1-9] [0-9]?
)"))
                  ->start();
  EXPECT_TRUE(accept_text(*gbnf, "12 + 7"));
  EXPECT_FALSE(gbnf->accept(byte_id('x')));
  EXPECT_FALSE(gbnf->is_complete());  // " + ..." may follow

  auto obj = backend_->compile(spec_of(kind::json_object, ""))->start();
  EXPECT_TRUE(accept_text(*obj, R"({"k": [1, "two", null], "m": {"n": false}})"));
  EXPECT_TRUE(obj->is_complete());
}

// Tool calling's building block: free text until a trigger, then the tag's schema, then free again.
TEST_F(GrammarBackend, StructuralTagsConstrainOnlyAfterTheirTrigger) {
  auto c = backend_
               ->compile(spec_of(kind::structural_tag, R"({"type": "structural_tag", "format": {
      "type": "triggered_tags", "triggers": ["<f>"], "tags": [{"type": "tag", "begin": "<f>",
      "content": {"type": "json_schema", "json_schema": {"type": "object", "properties": {"x": {"type": "boolean"}},
                                                          "required": ["x"]}}, "end": "</f>"}]}})"))
               ->start();
  EXPECT_TRUE(accept_text(*c, "any text, even {, before <f>"));
  const std::vector<uint32_t> in_tag = mask_of(*c);  // the schema now: an object, no free text
  EXPECT_TRUE(token_allowed(in_tag, byte_id('{')));
  EXPECT_FALSE(token_allowed(in_tag, byte_id('a')));
  EXPECT_FALSE(token_allowed(in_tag, 0));
  EXPECT_TRUE(accept_text(*c, "{\"x\": false}</f> and free again"));
  EXPECT_GT(allowed(*c).size(), 90u);
}

TEST_F(GrammarBackend, BadSpecsAreRefusedNamingTheProblem) {
  const auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  std::string e = error_of(spec_of(kind::json_schema, R"({"type": "object", "properties": )"));
  EXPECT_TRUE(has(e, "'response_format'") && has(e, "not valid JSON")) << e;
  e = error_of(spec_of(kind::json_schema, R"({"type": "objekt"})"));
  EXPECT_TRUE(has(e, "unknown 'type'")) << e;
  e = error_of(
      spec_of(kind::json_schema, R"({"type": "object", "properties": {"a": {"type": "string", "foo": 1}}})", true));
  EXPECT_TRUE(has(e, "'foo'") && has(e, "strict") && has(e, "/properties/a/foo")) << e;
  // Not strict: the unknown keyword is ignored.
  EXPECT_EQ(
      error_of(spec_of(kind::json_schema, R"({"type": "object", "properties": {"a": {"type": "string", "foo": 1}}})")),
      "");
  e = error_of(spec_of(kind::json_schema, R"({"$ref": "#/$defs/missing"})"));
  EXPECT_TRUE(has(e, "invalid JSON schema")) << e;
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 40; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  e = error_of(spec_of(kind::json_schema, deep));
  EXPECT_TRUE(has(e, "nests more than 32")) << e;
  e = error_of(spec_of(kind::regex, "(ab"));
  EXPECT_TRUE(has(e, "regular expression does not compile")) << e;
  e = error_of(spec_of(kind::grammar, "root ::= \"a\" | undefined_rule"));
  EXPECT_TRUE(has(e, "grammar does not parse")) << e;
  e = error_of(spec_of(kind::grammar, "root ::= ("));
  EXPECT_TRUE(has(e, "grammar does not parse")) << e;
}

// Schemas the grammar engine would accept but not enforce are refused rather than generated loosely.
TEST_F(GrammarBackend, UnenforcedSchemaCombinationsAreRefused) {
  const auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  const std::string two_all_of = R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                                {"type": "object", "properties": {"b": {"type": "integer"}}}]})";
  for (bool strict : {false, true}) {
    const std::string e = error_of(spec_of(kind::json_schema, two_all_of, strict));
    EXPECT_TRUE(has(e, "'allOf'") && has(e, "/allOf")) << e;
  }
  // One subschema (what pydantic emits around a $ref with a description) is that subschema.
  EXPECT_EQ(error_of(spec_of(kind::json_schema,
                             R"({"$defs": {"p": {"type": "integer"}}, "type": "object",
                                 "properties": {"x": {"allOf": [{"$ref": "#/$defs/p"}], "description": "d"}}})",
                             true)),
            "");
  const std::string pattern_and_length =
      R"({"type": "object", "properties": {"c": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}}})";
  std::string e = error_of(spec_of(kind::json_schema, pattern_and_length, true));
  EXPECT_TRUE(has(e, "'pattern' or 'format'") && has(e, "/properties/c")) << e;
  EXPECT_EQ(error_of(spec_of(kind::json_schema, pattern_and_length, false)), "");  // lengths ignored
  e = error_of(spec_of(kind::json_schema, R"({"type": "string", "format": "zip-code"})", true));
  EXPECT_TRUE(has(e, "'zip-code'") && has(e, "/format")) << e;
  EXPECT_EQ(error_of(spec_of(kind::json_schema, R"({"type": "string", "format": "date-time"})", true)), "");
}

// A recursive $ref compiles (xgrammar's pushdown automaton) and matches nesting of any depth.
TEST_F(GrammarBackend, RecursiveRefsMatchNestingOfAnyDepth) {
  auto c = backend_
               ->compile(spec_of(kind::json_schema, R"({"$defs": {"n": {"type": "object", "properties": {
      "k": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["k"], "additionalProperties": false}},
      "$ref": "#/$defs/n"})"))
               ->start();
  EXPECT_TRUE(accept_text(*c, R"({"k": [{"k": [{"k": []}, {"k": [{"k": []}]}]}]})"));
  EXPECT_TRUE(c->is_complete());
  auto unbalanced = backend_
                        ->compile(spec_of(kind::json_schema, R"({"$defs": {"n": {"type": "object", "properties": {
      "k": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["k"], "additionalProperties": false}},
      "$ref": "#/$defs/n"})"))
                        ->start();
  EXPECT_TRUE(accept_text(*unbalanced, R"({"k": [{"k": []})"));
  EXPECT_FALSE(unbalanced->accept(byte_id('}')));  // the array must close first
}

// llama.cpp's own grammars (tests/data/grammars, MIT, copied unchanged), empty alternatives included.
TEST_F(GrammarBackend, LlamaCppGrammarsWorkUnchanged) {
  const auto read = [](const std::string& name) {
    std::ifstream f(std::string(TESSERA_TEST_DATA_DIR) + "/grammars/" + name);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string json_gbnf = read("json.gbnf");
  ASSERT_NE(json_gbnf.find("ws ::= |"), std::string::npos);  // the empty alternative xgrammar lacks
  auto json = backend_->compile(spec_of(kind::grammar, json_gbnf))->start();
  EXPECT_TRUE(accept_text(*json, "{\"a\": [1, -2.5e3, \"x\\n\", true, null],\n  \"b\":{}}"));
  EXPECT_FALSE(json->accept(byte_id('x')));
  EXPECT_TRUE(json->accept(byte_id(' ')));  // the optional trailing ws, then nothing but the end
  EXPECT_TRUE(json->is_complete());
  auto not_json = backend_->compile(spec_of(kind::grammar, json_gbnf))->start();
  EXPECT_FALSE(not_json->accept(byte_id('[')));  // root is an object

  auto list = backend_->compile(spec_of(kind::grammar, read("list.gbnf")))->start();
  EXPECT_TRUE(accept_text(*list, "- apples\n- pears\n"));
  EXPECT_FALSE(list->accept(byte_id('x')));
  EXPECT_TRUE(accept_text(*list, "- plums"));
  EXPECT_FALSE(list->is_complete());
}

TEST_F(GrammarBackend, CompilesAreCachedByContentFailuresToo) {
  const structured_output_spec s = spec_of(kind::regex, "[0-9]{3}");
  std::vector<compile_result> got;
  for (int i = 0; i < 2; ++i) {
    auto promise = std::make_shared<std::promise<compile_result>>();
    backend_->compile_async(s, [promise](compile_result r) { promise->set_value(std::move(r)); });
    got.push_back(promise->get_future().get());
  }
  ASSERT_TRUE(got[0].compiled && got[1].compiled);
  EXPECT_FALSE(got[0].cache_hit);
  EXPECT_TRUE(got[1].cache_hit);
  EXPECT_EQ(got[0].compiled, got[1].compiled);  // one compiled grammar, shared
  structured_output_spec bad = spec_of(kind::regex, "(");
  auto promise = std::make_shared<std::promise<compile_result>>();
  backend_->compile_async(bad, [](compile_result) {});
  backend_->compile_async(bad, [promise](compile_result r) { promise->set_value(std::move(r)); });
  compile_result again = promise->get_future().get();
  EXPECT_FALSE(again.compiled);
  EXPECT_FALSE(again.error.empty());
}

TEST_F(GrammarBackend, ACompilePastItsTimeBoundIsRefusedAndRemembered) {
  grammar_options o;
  o.max_compile_seconds = 1e-6;
  auto slow = make_grammar_backend(*tok_, vocab_, o);
  const structured_output_spec s =
      spec_of(kind::json_schema, R"({"type": "object", "properties": {"x": {"type": "integer"}}})");
  try {
    slow->compile(s);
    FAIL() << "compiles take longer than a microsecond";
  } catch (const invalid_request& e) {
    EXPECT_NE(std::string(e.what()).find("took longer than"), std::string::npos) << e.what();
  }
  EXPECT_THROW(slow->compile(s), invalid_request);  // remembered: fails at once
}

TEST_F(GrammarBackend, MasksFilledConcurrentlyEqualMasksFilledOneByOne) {
  grammar_options o;
  o.num_mask_threads = 3;
  auto backend = make_grammar_backend(*tok_, vocab_, o);
  auto g =
      backend->compile(spec_of(kind::json_schema, R"({"type": "array", "items": {"type": "integer"}, "maxItems": 9})"));
  std::vector<std::unique_ptr<token_constraint>> cs;
  std::mt19937 rng(3);
  for (int i = 0; i < 64; ++i) {
    cs.push_back(g->start());
    const std::string prefix = std::string("[1, 23, 4").substr(0, static_cast<size_t>(rng() % 9));
    ASSERT_TRUE(accept_text(*cs.back(), prefix)) << prefix;
  }
  const auto words = static_cast<size_t>(token_mask_words(vocab_));
  std::vector<uint32_t> together(cs.size() * words);
  std::vector<mask_job> jobs;
  for (size_t i = 0; i < cs.size(); ++i) jobs.push_back({cs[i].get(), {together.data() + i * words, words}});
  backend->fill_masks(std::move(jobs)).wait();
  for (size_t i = 0; i < cs.size(); ++i) {
    EXPECT_EQ(std::vector<uint32_t>(together.begin() + static_cast<ptrdiff_t>(i * words),
                                    together.begin() + static_cast<ptrdiff_t>((i + 1) * words)),
              mask_of(*cs[i]))
        << i;
  }
  backend->fill_masks({}).wait();  // no jobs: ready at once
}

// The real vocabulary (byte-level BPE, 49152 tokens): random walks through the masks of a schema end
// in output that parses and has the schema's shape.
TEST(GrammarBackendRealVocabulary, RandomWalksThroughTheMasksYieldValidJson) {
  const std::filesystem::path model = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " missing";
  auto tok = tokenizer::from_gguf(*gguf_file::open(model));
  const auto vocab = static_cast<int32_t>(tok->vocab_size());
  auto backend = make_grammar_backend(*tok, vocab);
  auto g = backend->compile(spec_of(kind::json_schema, R"({"type": "object", "properties": {
      "colour": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
      "ok": {"type": "boolean"}}, "required": ["colour", "n", "ok"], "additionalProperties": false})"));
  std::mt19937 rng(11);
  std::vector<uint32_t> mask(static_cast<size_t>(token_mask_words(vocab)));
  for (int walk = 0; walk < 20; ++walk) {
    auto c = g->start();
    std::string text;
    for (int step = 0; step < 200 && !c->is_complete(); ++step) {
      c->fill_next_mask(mask);
      std::vector<token_id> ok;
      for (token_id t = 0; t < vocab; ++t)
        if (token_allowed(mask, t) && !tok->is_eog(t)) ok.push_back(t);
      ASSERT_FALSE(ok.empty()) << text;
      const token_id t = ok[rng() % ok.size()];
      ASSERT_TRUE(c->accept(t));
      text += tok->token_to_piece(t);
    }
    ASSERT_TRUE(c->is_complete()) << text;
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    ASSERT_FALSE(parser.parse(text).get(doc)) << text;
    std::string_view colour;
    int64_t n = -1;
    bool flag = false;
    ASSERT_FALSE(doc["colour"].get(colour)) << text;
    EXPECT_TRUE(colour == "red" || colour == "green" || colour == "blue") << text;
    ASSERT_FALSE(doc["n"].get(n)) << text;
    EXPECT_TRUE(n >= 0 && n <= 99) << text;
    EXPECT_FALSE(doc["ok"].get(flag)) << text;
  }
}

}  // namespace
}  // namespace tessera::structured
