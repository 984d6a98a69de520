// Chat templates: byte-for-byte agreement with Python Jinja2 (the oracle, via
// scripts/make_chat_template_fixtures.py -> tests/data/chat_templates/expected.json) on real model
// templates, plus hostile templates that must fail fast with a clear error.
#include "engine/text/chat_template.hpp"
#include "engine/text/tokenizer_pretokenize.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace tessera {
namespace {

const std::string data_dir = std::string(TESSERA_TEST_DATA_DIR) + "/chat_templates/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---- a minimal JSON reader for the fixture file (objects, arrays, strings, numbers, literals) ----
struct json {
  enum class type { null, boolean, number, string, array, object } kind = type::null;
  bool b = false;
  double n = 0;
  std::string s;
  std::vector<json> items;
  std::vector<std::pair<std::string, json>> members;

  const json* find(const std::string& key) const {
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
  const json& at(const std::string& key) const {
    const json* v = find(key);
    if (!v) throw std::runtime_error("missing key " + key);
    return *v;
  }
};

class json_reader {
 public:
  explicit json_reader(const std::string& text) : t_(text) {}
  json parse() {
    json v = value();
    ws();
    if (p_ != t_.size()) throw std::runtime_error("trailing JSON");
    return v;
  }

 private:
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\r' || t_[p_] == '\t')) ++p_;
  }
  void expect(char c) {
    ws();
    if (p_ >= t_.size() || t_[p_] != c) throw std::runtime_error(std::string("JSON: expected ") + c);
    ++p_;
  }
  uint32_t hex4() {
    uint32_t v = std::stoul(t_.substr(p_, 4), nullptr, 16);
    p_ += 4;
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (t_[p_] != '"') {
      if (t_[p_] != '\\') {
        out.push_back(t_[p_++]);
        continue;
      }
      const char e = t_[p_ + 1];
      p_ += 2;
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && t_.compare(p_, 2, "\\u") == 0) {
            p_ += 2;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4() - 0xDC00);
          }
          append_utf8(cp, out);
          break;
        }
        default: out.push_back(e);
      }
    }
    ++p_;
    return out;
  }
  json value() {
    ws();
    json v;
    const char c = t_[p_];
    if (c == '{') {
      v.kind = json::type::object;
      ++p_;
      ws();
      if (t_[p_] == '}') {
        ++p_;
        return v;
      }
      while (true) {
        std::string k = string();
        expect(':');
        v.members.emplace_back(std::move(k), value());
        ws();
        if (t_[p_] == ',') {
          ++p_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = json::type::array;
      ++p_;
      ws();
      if (t_[p_] == ']') {
        ++p_;
        return v;
      }
      while (true) {
        v.items.push_back(value());
        ws();
        if (t_[p_] == ',') {
          ++p_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = json::type::string;
      v.s = string();
      return v;
    }
    if (t_.compare(p_, 4, "true") == 0) {
      v.kind = json::type::boolean;
      v.b = true;
      p_ += 4;
      return v;
    }
    if (t_.compare(p_, 5, "false") == 0) {
      v.kind = json::type::boolean;
      p_ += 5;
      return v;
    }
    if (t_.compare(p_, 4, "null") == 0) {
      p_ += 4;
      return v;
    }
    size_t used = 0;
    v.kind = json::type::number;
    v.n = std::stod(t_.substr(p_, 32), &used);
    p_ += used;
    return v;
  }
  const std::string& t_;
  size_t p_ = 0;
};

const json& fixtures() {
  static const json doc = json_reader(read_file(data_dir + "expected.json")).parse();
  return doc;
}

std::string template_source(const std::string& name) {
  if (name.rfind("snippet:", 0) == 0) {
    // snippets.txt holds small edge-case templates separated by lines "=====".
    static std::vector<std::string> snippets;
    if (snippets.empty()) {
      const std::string text = read_file(data_dir + "snippets.txt");
      const std::string separator = "\n=====\n";
      size_t start = 0;
      while (true) {
        const size_t hit = text.find(separator, start);
        snippets.push_back(text.substr(start, hit == std::string::npos ? std::string::npos : hit - start));
        if (hit == std::string::npos) break;
        start = hit + separator.size();
      }
    }
    return snippets.at(std::stoul(name.substr(8)));
  }
  return read_file(data_dir + name);
}

std::vector<chat_message> conversation(const std::string& name) {
  std::vector<chat_message> out;
  for (const auto& m : fixtures().at("conversations").at(name).items)
    out.push_back({m.at("role").s, m.at("content").s});
  return out;
}

// Fixture templates that use constructs this interpreter deliberately refuses; each must fail to
// parse with kind unsupported (never render differently from Jinja2). None today.
const std::set<std::string> unsupported_templates = {};

struct fixture_run {
  int compared = 0;
  int errors_matched = 0;
  std::vector<std::string> mismatches;
};

std::string category_of(const std::string& name) {
  const size_t colon = name.find(':');
  return colon == std::string::npos ? "named" : name.substr(0, colon);
}

fixture_run run_fixtures(const std::string& category) {
  fixture_run run;
  std::map<std::string, std::shared_ptr<chat_template>> cache;
  for (const auto& c : fixtures().at("cases").items) {
    const std::string name = c.at("template").s;
    if (category_of(name) != category) continue;
    if (c.find("compile_error")) {
      EXPECT_THROW(chat_template::parse(template_source(name)), chat_template_error) << name;
      continue;
    }
    if (unsupported_templates.count(name)) {
      if (!cache.count(name)) {
        cache[name] = nullptr;
        try {
          chat_template::parse(template_source(name));
          run.mismatches.push_back(name + ": listed as unsupported but parses");
        } catch (const chat_template_error& e) {
          if (e.kind() != chat_template_error_kind::unsupported) run.mismatches.push_back(name + ": " + e.what());
          ++run.errors_matched;
        }
      }
      continue;
    }
    auto& tmpl = cache[name];
    if (!tmpl) {
      try {
        tmpl = std::make_shared<chat_template>(chat_template::parse(template_source(name)));
      } catch (const chat_template_error& e) {
        run.mismatches.push_back(name + ": parse failed: " + e.what());
        cache.erase(name);
        continue;
      }
    }
    render_options options;
    options.add_generation_prompt = c.at("add_generation_prompt").b;
    options.bos_token = c.at("bos_token").s;
    options.eos_token = c.at("eos_token").s;
    options.now_unix_seconds = static_cast<int64_t>(fixtures().at("now_unix_seconds").n);
    const std::string label =
        name + " / " + c.at("conversation").s + " / agp=" + (options.add_generation_prompt ? "1" : "0");
    const auto messages = conversation(c.at("conversation").s);
    if (const json* expected = c.find("output")) {
      try {
        const std::string got = tmpl->render(messages, options);
        ++run.compared;
        if (got != expected->s)
          run.mismatches.push_back(label + ":\n--- expected ---\n" + expected->s + "\n--- got ---\n" + got);
      } catch (const chat_template_error& e) { run.mismatches.push_back(label + ": unexpected error: " + e.what()); }
    } else {
      try {
        const std::string got = tmpl->render(messages, options);
        run.mismatches.push_back(label + ": expected an error (" + c.at("error").s + "), rendered:\n" + got);
      } catch (const chat_template_error& e) {
        ++run.errors_matched;
        // Jinja's TemplateError from raise_exception must surface as our "raised" kind, with its text.
        const std::string& oracle_error = c.at("error").s;
        if (oracle_error.rfind("TemplateError: ", 0) == 0) {
          if (e.kind() != chat_template_error_kind::raised || oracle_error.substr(15) != e.what())
            run.mismatches.push_back(label + ": expected raise_exception(" + oracle_error + "), got: " + e.what());
        }
      }
    }
  }
  return run;
}

void report(const fixture_run& run, int minimum_compared) {
  EXPECT_GE(run.compared, minimum_compared);
  for (size_t k = 0; k < run.mismatches.size() && k < 20; ++k) ADD_FAILURE() << run.mismatches[k];
  EXPECT_EQ(run.mismatches.size(), 0u) << "cases compared: " << run.compared
                                       << ", errors matched: " << run.errors_matched;
}

TEST(ChatTemplate, NamedTemplatesMatchJinja2) {
  // SmolLM2, Llama 2/3/3.1/3.2, Mistral v0.1/v0.3/Nemo, Zephyr, Gemma 1/3, Phi-3/3.5, Qwen 2.5/3 and
  // the feature-coverage template, for every fixture conversation.
  report(run_fixtures("named"), 200);
}

// ---- tool calling: scripts/make_tool_template_fixtures.py -> tools_expected.json (transformers) ----

const json& tool_fixtures() {
  static const json doc = json_reader(read_file(data_dir + "tools_expected.json")).parse();
  return doc;
}

// The conversation as the server builds it from an OpenAI request: arguments stay JSON text.
std::vector<chat_message> tool_conversation(const json& conv) {
  std::vector<chat_message> out;
  for (const auto& m : conv.at("messages").items) {
    chat_message msg;
    msg.role = m.at("role").s;
    const json& content = m.at("content");
    msg.content_is_null = content.kind == json::type::null;
    msg.content = content.s;
    if (const json* calls = m.find("tool_calls")) {
      for (const auto& c : calls->items)
        msg.tool_calls.push_back({c.at("id").s, c.at("function").at("name").s, c.at("function").at("arguments").s});
    }
    if (const json* id = m.find("tool_call_id")) msg.tool_call_id = id->s;
    out.push_back(std::move(msg));
  }
  return out;
}

TEST(ChatTemplate, ToolTemplatesMatchTransformers) {
  // Llama 3.1/3.2, Mistral v0.3/Nemo, Qwen 2.5/3 (Hermes-style <tool_call>), SmolLM2 and hermes_style.jinja (a
  // Hermes-2-Pro-style template with a recursive macro) with tool definitions, assistant tool calls (content null) and
  // tool results, against transformers' render_jinja_template (what apply_chat_template(..., tools=...) runs).
  int compared = 0, errors_matched = 0;
  std::map<std::string, std::shared_ptr<chat_template>> cache;
  for (const auto& c : tool_fixtures().at("cases").items) {
    const std::string name = c.at("template").s;
    auto& tmpl = cache[name];
    if (!tmpl) tmpl = std::make_shared<chat_template>(chat_template::parse(read_file(data_dir + name)));
    const json& conv = tool_fixtures().at("conversations").at(c.at("conversation").s);
    render_options options;
    options.add_generation_prompt = c.at("add_generation_prompt").b;
    options.bos_token = c.at("bos_token").s;
    options.eos_token = c.at("eos_token").s;
    options.now_unix_seconds = static_cast<int64_t>(tool_fixtures().at("now_unix_seconds").n);
    if (conv.at("tools_json").kind == json::type::string) options.tools_json = conv.at("tools_json").s;
    const std::string label =
        name + " / " + c.at("conversation").s + " / agp=" + (options.add_generation_prompt ? "1" : "0");
    const auto messages = tool_conversation(conv);
    if (const json* expected = c.find("output")) {
      try {
        const std::string got = tmpl->render(messages, options);
        ++compared;
        EXPECT_EQ(got, expected->s) << label;
      } catch (const chat_template_error& e) { ADD_FAILURE() << label << ": unexpected error: " << e.what(); }
    } else {
      try {
        ADD_FAILURE() << label << ": expected an error (" << c.at("error").s << "), rendered:\n"
                      << tmpl->render(messages, options);
      } catch (const chat_template_error& e) {
        ++errors_matched;
        const std::string& oracle_error = c.at("error").s;
        if (oracle_error.rfind("TemplateError: ", 0) == 0) {
          EXPECT_EQ(e.kind(), chat_template_error_kind::raised) << label;
          EXPECT_EQ(oracle_error.substr(15), e.what()) << label;
        }
      }
    }
  }
  EXPECT_GE(compared, 50);
  EXPECT_GE(errors_matched, 4);
}

TEST(ChatTemplate, ToolArgumentsMustBeJson) {
  const chat_template t = chat_template::parse(read_file(data_dir + "qwen2_5.jinja"));
  chat_message call{"assistant", "", true, {{"c1", "f", "{\"a\": "}}, "", ""};
  try {
    t.render({{"user", "x"}, call});
    ADD_FAILURE() << "rendered a call whose arguments are not JSON";
  } catch (const chat_template_error& e) {
    EXPECT_NE(std::string(e.what()).find("messages[1].tool_calls[0].function.arguments is not valid JSON"),
              std::string::npos)
        << e.what();
  }
  render_options options;
  options.tools_json = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"n\": 18446744073709551616}}]";
  EXPECT_THROW(t.render({{"user", "x"}}, options), chat_template_error);  // beyond 64 bits: refused, not rounded
}

// chat_template_kwargs reach the template as variables (as transformers' apply_chat_template(**kwargs));
// one never replaces a variable the renderer sets, and an undefined one stays undefined.
TEST(ChatTemplate, KwargsBecomeVariables) {
  const chat_template t = chat_template::parse(
      "{% if enable_thinking is defined and not enable_thinking %}no-think {% endif %}"
      "{{ lang | default('en') }} {{ messages | length }}{% for m in messages %} {{ m.content }}{% endfor %}"
      "{% if extra is defined %} {{ extra.k[1] }}{% endif %}");
  render_options options;
  EXPECT_EQ(t.render({{"user", "x"}}, options), "en 1 x");
  options.kwargs_json = R"({"enable_thinking": false, "lang": "fr", "extra": {"k": [1, 2]}})";
  EXPECT_EQ(t.render({{"user", "x"}}, options), "no-think fr 1 x 2");
  options.kwargs_json = R"({"enable_thinking": true, "messages": []})";
  EXPECT_EQ(t.render({{"user", "x"}}, options), "en 1 x");
  options.kwargs_json = "[1]";
  EXPECT_THROW(t.render({{"user", "x"}}, options), chat_template_error);
}

TEST(ChatTemplate, EdgeCaseSnippetsMatchJinja2) {
  // Scoping, literals, operators, every filter/test/method, error cases (snippets.txt).
  report(run_fixtures("snippet"), 40);
}

TEST(ChatTemplate, SmolLM2TemplateFromTheModelFile) {
  const std::string source = read_file(data_dir + "smollm2.jinja");
  const chat_template t = chat_template::parse(source);
  EXPECT_EQ(t.family(), chat_template_family::chatml);
  render_options options;
  const std::string out = t.render({{"user", "Hi"}}, options);
  // The default system prompt SmolLM2 inserts, then the user turn and the assistant header.
  EXPECT_NE(out.find("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - std::string("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n").size()),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, DetectsFamilies) {
  const std::map<std::string, chat_template_family> expected = {
      {"smollm2.jinja", chat_template_family::chatml},       {"qwen2_5.jinja", chat_template_family::chatml},
      {"llama2.jinja", chat_template_family::llama2},        {"llama3.jinja", chat_template_family::llama3},
      {"llama3_1.jinja", chat_template_family::llama3},      {"mistral_v0_1.jinja", chat_template_family::mistral},
      {"mistral_v0_3.jinja", chat_template_family::mistral}, {"zephyr.jinja", chat_template_family::zephyr},
      {"gemma.jinja", chat_template_family::gemma},          {"phi3.jinja", chat_template_family::phi3},
      {"features.jinja", chat_template_family::unknown},
  };
  for (const auto& [file, family] : expected)
    EXPECT_EQ(detect_template_family(read_file(data_dir + file)), family)
        << file << " -> " << to_string(detect_template_family(read_file(data_dir + file)));
}

TEST(ChatTemplate, FallbackIsChatML) {
  const chat_template t = chat_template::fallback_chatml();
  EXPECT_EQ(t.family(), chat_template_family::chatml);
  EXPECT_EQ(t.render({{"system", "S"}, {"user", "U"}}, {}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  render_options no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(t.render({{"user", "U"}}, no_prompt), "<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTemplate, FromModelOrFallback) {
  std::string warning = "stale";
  const chat_template good = chat_template::from_model_or_fallback(read_file(data_dir + "llama3.jinja"), &warning);
  EXPECT_EQ(warning, "");
  EXPECT_EQ(good.family(), chat_template_family::llama3);

  const chat_template missing = chat_template::from_model_or_fallback(std::nullopt, &warning);
  EXPECT_NE(warning, "");
  EXPECT_EQ(missing.source(), chat_template::fallback_chatml().source());

  const chat_template broken = chat_template::from_model_or_fallback(std::string("{% if %}"), &warning);
  EXPECT_NE(warning.find("syntax"), std::string::npos) << warning;
  EXPECT_EQ(broken.family(), chat_template_family::chatml);

  // Parses, but cannot render even one user message: also replaced at load time.
  const chat_template unusable =
      chat_template::from_model_or_fallback(std::string("{{ messages[0].content + 1 }}"), &warning);
  EXPECT_NE(warning.find("unsupported operand"), std::string::npos) << warning;
  EXPECT_EQ(unusable.family(), chat_template_family::chatml);
}

// ---- error reporting ----

chat_template_error_kind error_kind(const std::string& source,
                                    const std::vector<chat_message>& messages = {{"user", "x"}},
                                    const render_options& options = {}) {
  try {
    chat_template::parse(source).render(messages, options);
  } catch (const chat_template_error& e) { return e.kind(); }
  ADD_FAILURE() << "no error for: " << source;
  return chat_template_error_kind::render;
}

TEST(ChatTemplate, SyntaxErrorsAreReportedWithTheLine) {
  for (const char* bad :
       {"{% if true %}never closed", "{{ 1 + }}", "{% for x in %}{% endfor %}", "{% endif %}", "{{ 'unterminated }}",
        "{# no end", "{{ (1 }}", "{% if x %}{% endfor %}", "{% bogus %}", "{% break %}", "{{ a b }}", "{{ x | }}",
        "{{ ]", "{{ messages|no_such_filter }}", "{{ 1 is no_such_test }}"}) {
    EXPECT_EQ(error_kind(bad), chat_template_error_kind::syntax) << bad;
  }
  try {
    chat_template::parse("line one\n{{ ok }}\n{% if %}");
    FAIL();
  } catch (const chat_template_error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, UnsupportedConstructsAreRefused) {
  for (const char* bad :
       {"{% macro m() %}{% call m() %}x{% endcall %}{% endmacro %}", "{% call m() %}x{% endcall %}",
        "{% include 'other' %}", "{% import 'x' as y %}", "{% extends 'base' %}", "{% raw %}{{ x }}{% endraw %}",
        "{% filter upper %}x{% endfilter %}", "{% for x in y recursive %}{% endfor %}", "{{ '%s' % 1 }}",
        "{{ 1.5|round }}", "{{ x|groupby('a') }}", "{{ x is escaped }}"}) {
    EXPECT_EQ(error_kind(bad), chat_template_error_kind::unsupported) << bad;
  }
}

TEST(ChatTemplate, RuntimeErrors) {
  EXPECT_EQ(error_kind("{{ raise_exception('nope') }}"), chat_template_error_kind::raised);
  EXPECT_EQ(error_kind("{{ undefined_var + 'x' }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{{ 1 + 'x' }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{{ 1 / 0 }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{{ messages[5]['role'] }}"), chat_template_error_kind::render);
  // Integers are 64-bit (Python's are unbounded): overflow is an error, never a wrong number.
  EXPECT_EQ(error_kind("{{ 9223372036854775807 + 1 }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{{ '99999999999999999999'|int }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{{ 99999999999999999999 }}"), chat_template_error_kind::syntax);
  EXPECT_EQ(error_kind("{{ 3037000500 * 3037000500 }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{{ 2 ** 64 }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{% set x = 1 %}{% set x.y = 2 %}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{% set ns = namespace() %}{% set ns.me = ns %}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{{ 'abc'.nomethod() }}"), chat_template_error_kind::render);
  try {
    chat_template::parse("{{ raise_exception('Conversation roles must alternate') }}").render({}, {});
  } catch (const chat_template_error& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate");
    // Callers that map invalid_request to a client error get one.
    EXPECT_NE(dynamic_cast<const invalid_request*>(&e), nullptr);
  }
  // Found by fuzzing (tests/fuzz/regressions/jinja): an empty sequence times 2e13 looped 2e13 times,
  // and range() near the int64 limits overflowed its counter. Outputs as Jinja2 renders them.
  const std::pair<const char*, const char*> edge_cases[] = {
      {"{{ [] * 20000000000000 }}", "[]"},
      {"{{ '' * 20000000000000 }}", ""},
      {"{{ range(9223372036854775800, 9223372036854775807, 5) | list }}", "[9223372036854775800, 9223372036854775805]"},
      {"{{ range(-9223372036854775800, -9223372036854775807, -5) | list }}",
       "[-9223372036854775800, -9223372036854775805]"},
  };
  for (const auto& [source, expected] : edge_cases) EXPECT_EQ(chat_template::parse(source).render({}, {}), expected);
  // Operands are evaluated left to right, as Python (and so Jinja) does: the left failure is reported.
  for (const char* source : {"{{ raise_exception('left') + raise_exception('right') }}",
                             "{{ raise_exception('left')[raise_exception('right')] }}"}) {
    try {
      chat_template::parse(source).render({}, {});
      ADD_FAILURE() << source << " rendered";
    } catch (const chat_template_error& e) { EXPECT_STREQ(e.what(), "left") << source; }
  }
}

// ---- hostile templates: each must stop with a limit error, quickly ----

class HostileTemplate : public ::testing::TestWithParam<const char*> {};

TEST_P(HostileTemplate, StopsWithALimitError) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(error_kind(GetParam()), chat_template_error_kind::limit) << GetParam();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "complexity guard: the budget should stop this well under a second";
}

INSTANTIATE_TEST_SUITE_P(
    Budgets, HostileTemplate,
    ::testing::Values(
        // nested loops: 10^15 iterations without a budget
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor "
        "%}{% endfor %}",
        // silent loops (no output) still cost steps
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        // a range beyond the sandbox's 100000-item cap
        "{% for a in range(1000000000) %}{% endfor %}",
        // output bomb by string repetition and by doubling
        "{{ 'x' * 100000000 }}",
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor "
        "%}{{ ns.s }}",
        // many smaller outputs adding up past 8 MiB
        "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
        // list bomb
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length "
        "}}",
        "{{ [1, 2, 3] * 1000000000 }}",
        // deeply nested values, built iteratively
        "{% set ns = namespace(v=[]) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
        "{% set ns = namespace(v={}) %}{% for i in range(100000) %}{% set ns.v = {'k': ns.v} %}{% endfor %}{{ "
        "ns.v|tojson }}",
        // tojson / join over a DAG that doubles each step (shared lists, exponential when printed)
        "{% set ns = namespace(v=[1]) %}{% for i in range(60) %}{% set ns.v = [ns.v, ns.v] %}{% endfor %}{{ "
        "ns.v|tojson }}",
        "{% set ns = namespace(v=[1]) %}{% for i in range(60) %}{% set ns.v = [ns.v, ns.v] %}{% endfor %}{{ ns.v }}",
        // huge integer powers are bounded by overflow checks; huge float loops by steps
        "{% for i in range(100000) %}{% for j in range(100) %}{% set x = 2 ** 62 %}{% endfor %}{% endfor %}",
        // macros: unbounded recursion (depth), exponential fan-out (steps), doubling strings (size)
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s }}{% endif %}{% endmacro %}{{ d('x', 60) "
        "}}"));

// Macro recursion is bounded by limits::max_depth, which every macro call also counts against, so a
// hostile template cannot overflow the native stack; a legitimately deep recursion still renders.
TEST(ChatTemplate, MacroRecursionIsBoundedByTheDepthLimit) {
  const std::string countdown =
      "{% macro count(n) %}{% if n > 0 %}{{ n }},{{ count(n - 1) }}{% endif %}{% endmacro %}{{ count(N) }}";
  auto with_n = [&](int n) {
    std::string src = countdown;
    src.replace(src.find('N'), 1, std::to_string(n));
    return src;
  };
  EXPECT_EQ(chat_template::parse(with_n(3)).render({}, {}), "3,2,1,");
  // Deep enough for any schema a tool definition carries (Hermes' json_to_python_type recurses
  // once per nesting level).
  EXPECT_NO_THROW(chat_template::parse(with_n(40)).render({}, {}));
  try {
    chat_template::parse(with_n(100000)).render({}, {});
    ADD_FAILURE() << "deep recursion rendered";
  } catch (const chat_template_error& e) {
    EXPECT_EQ(e.kind(), chat_template_error_kind::limit);
    EXPECT_NE(std::string(e.what()).find("recursion depth limit (256)"), std::string::npos) << e.what();
  }
  render_options shallow;
  shallow.limits.max_depth = 16;
  EXPECT_EQ(error_kind(with_n(40), {}, shallow), chat_template_error_kind::limit);
  EXPECT_EQ(chat_template::parse(with_n(2)).render({}, shallow), "2,1,");
}

// What a macro call checks, beyond the Jinja2 fixtures (snippets.txt): the errors' kinds and texts.
TEST(ChatTemplate, MacroCallErrors) {
  EXPECT_EQ(error_kind("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{% macro m(a) %}{% endmacro %}{{ m(b=2) }}"), chat_template_error_kind::render);
  EXPECT_EQ(error_kind("{% macro m(a, b=1, c) %}{% endmacro %}"), chat_template_error_kind::syntax);
  EXPECT_EQ(error_kind("{% macro m(a, a) %}{% endmacro %}"), chat_template_error_kind::syntax);
  EXPECT_EQ(error_kind("{% macro m() %}{% break %}{% endmacro %}"), chat_template_error_kind::syntax);
  EXPECT_EQ(error_kind("{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}"),
            chat_template_error_kind::syntax);
  try {
    chat_template::parse("{% macro greet(name) %}hi {{ name }}{% endmacro %}{{ greet('a', 'b') }}").render({}, {});
    ADD_FAILURE();
  } catch (const chat_template_error& e) {
    EXPECT_NE(std::string(e.what()).find("macro 'greet' takes not more than 1 argument(s)"), std::string::npos)
        << e.what();
  }
  // raise_exception inside a macro surfaces as itself.
  try {
    chat_template::parse("{% macro check(r) %}{{ raise_exception('bad role ' ~ r) }}{% endmacro %}{{ check('x') }}")
        .render({}, {});
    ADD_FAILURE();
  } catch (const chat_template_error& e) {
    EXPECT_EQ(e.kind(), chat_template_error_kind::raised);
    EXPECT_STREQ(e.what(), "bad role x");
  }
}

TEST(ChatTemplate, DeepSourceNestingIsASyntaxErrorNotACrash) {
  const std::string parens = std::string(100000, '(') + "1" + std::string(100000, ')');
  EXPECT_EQ(error_kind("{{ " + parens + " }}"), chat_template_error_kind::syntax);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_EQ(error_kind(ifs), chat_template_error_kind::syntax);
  EXPECT_EQ(error_kind("{{ " + std::string(100000, '-') + "1 }}"), chat_template_error_kind::syntax);
  std::string nots;
  for (int i = 0; i < 50000; ++i) nots += "not ";
  EXPECT_EQ(error_kind("{{ " + nots + "1 }}"), chat_template_error_kind::syntax);
  // Long left-associative chains are built without recursion but must still be bounded, since
  // everything that walks the tree later (including its destructor) recurses.
  auto repeat = [](const std::string& unit, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += unit;
    return out;
  };
  for (const std::string& chain :
       {repeat("+1", 20000), repeat("|trim", 20000), repeat(".a", 20000), repeat("[0]", 20000), repeat(" or 1", 20000),
        repeat(" * 2", 20000), repeat("(1)", 20000), repeat(" is defined", 20000), repeat(" if 1 else 1", 20000)}) {
    EXPECT_EQ(error_kind("{{ 1" + chain + " }}"), chat_template_error_kind::syntax) << chain.substr(0, 20);
  }
  std::string lists;
  for (int i = 0; i < 100000; ++i) lists += "[";
  EXPECT_EQ(error_kind("{{ " + lists + " }}"), chat_template_error_kind::syntax);
}

TEST(ChatTemplate, MutatedTemplatesNeverCrash) {
  // Random edits of real templates: every outcome must be a render or a chat_template_error (and,
  // in sanitizer builds, no memory error). Deterministic seed, so failures reproduce.
  static const char* const fragments[] = {"{%",
                                          "%}",
                                          "{{",
                                          "}}",
                                          "{#",
                                          "#}",
                                          "-",
                                          "+",
                                          "(",
                                          ")",
                                          "[",
                                          "]",
                                          "{",
                                          "}",
                                          "'",
                                          "\"",
                                          "\\",
                                          "|",
                                          "~",
                                          "*",
                                          "**",
                                          ".",
                                          ",",
                                          ":",
                                          "=",
                                          "==",
                                          " is ",
                                          " not ",
                                          " in ",
                                          " if ",
                                          " else ",
                                          "for x in messages",
                                          "endfor",
                                          "endif",
                                          "loop.",
                                          "ns.",
                                          "range(99999)",
                                          "messages",
                                          "namespace(a=1)",
                                          "|tojson",
                                          "|join",
                                          "[1:]",
                                          "[::-1]",
                                          "\n",
                                          " ",
                                          "raise_exception('x')",
                                          "{% set ns = namespace(v=[]) %}",
                                          "{% set ns.v = ns.v + ns.v %}"};
  std::mt19937 rng(12345);
  render_options options;
  options.limits.max_steps = 200'000;
  options.limits.max_output_bytes = 1u << 20;
  options.now_unix_seconds = 0;
  const std::vector<chat_message> messages = {
      {"system", "S"}, {"user", "Hi {{ there }}"}, {"assistant", "Yo"}, {"user", "é"}};
  int rendered = 0, rejected = 0;
  for (const char* file : {"smollm2.jinja", "llama2.jinja", "llama3_1.jinja", "mistral_v0_3.jinja", "gemma3.jinja",
                           "phi3_5.jinja", "qwen3.jinja", "features.jinja", "whitespace.jinja", "hermes_style.jinja"}) {
    const std::string original = read_file(data_dir + file);
    for (int round = 0; round < 150; ++round) {
      std::string src = original;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !src.empty(); ++e) {
        const size_t at = rng() % (src.size() + 1);
        const size_t len = std::min<size_t>(1 + rng() % 12, src.size() - std::min(at, src.size()));
        switch (rng() % 3) {
          case 0: src.erase(at, len); break;                                        // delete
          case 1: src.insert(at, src.substr(at, len)); break;                       // duplicate
          default: src.insert(at, fragments[rng() % std::size(fragments)]); break;  // insert syntax
        }
      }
      try {
        (void)chat_template::parse(src).render(messages, options);
        ++rendered;
      } catch (const chat_template_error&) { ++rejected; } catch (const std::exception& e) {
        ADD_FAILURE() << file << " round " << round << ": unexpected exception type: " << e.what() << "\n" << src;
      }
    }
  }
  EXPECT_GT(rendered, 0);
  EXPECT_GT(rejected, 0);
}

TEST(ChatTemplate, LimitsAreConfigurable) {
  render_options tight;
  tight.limits.max_output_bytes = 10;
  EXPECT_EQ(error_kind("{{ 'x' * 11 }}", {}, tight), chat_template_error_kind::limit);
  EXPECT_EQ(chat_template::parse("{{ 'x' * 10 }}").render({}, tight), "xxxxxxxxxx");
  render_options few_steps;
  few_steps.limits.max_steps = 100;
  EXPECT_EQ(error_kind("{% for i in range(1000) %}{% endfor %}", {}, few_steps), chat_template_error_kind::limit);
  render_options shallow;
  shallow.limits.max_depth = 8;
  EXPECT_EQ(error_kind("{{ [[[[[[[[[[1]]]]]]]]]] }}", {}, shallow), chat_template_error_kind::limit);
}

TEST(ChatTemplate, HugeMessageContentIsFine) {
  // Inputs do not count against the template's budget until the template copies them around.
  const std::string big(4u << 20, 'a');
  const std::string out = chat_template::fallback_chatml().render({{"user", big}}, {});
  EXPECT_EQ(out.size(), big.size() + std::string("<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n").size());
}

TEST(ChatTemplate, InvalidUtf8InContentPassesThroughUnchanged) {
  const std::string content = std::string("ok \xff\xfe bad \xc3") + "(";
  const chat_template t = chat_template::parse(
      "{{ messages[0].content }}|{{ messages[0].content|length }}|{{ messages[0].content[::-1][::-1] }}");
  EXPECT_EQ(t.render({{"user", content}}, {}), content + "|" + std::to_string(content.size() - 0) + "|" + content);
}

TEST(ChatTemplate, TemplatesAreReusableAndIndependentAcrossRenders) {
  // Top-level {% set %} and namespace state must not leak from one render into the next.
  const chat_template t = chat_template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  EXPECT_EQ(t.render({{"user", "a"}, {"user", "b"}}, {}), "2");
  EXPECT_EQ(t.render({{"user", "a"}, {"user", "b"}}, {}), "2");
}

}  // namespace
}  // namespace tessera
