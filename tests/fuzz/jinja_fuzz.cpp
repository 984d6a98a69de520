// The Jinja interpreter that runs chat templates from model files (engine/text/jinja/jinja_template.hpp,
// through its public API only). An input is a template source, optionally followed by a NUL byte and
// a JSON object whose keys become the template's variables:
//
//   source                 chat_template::parse + render of a fixed conversation (the server's path)
//   source \0 {json}       jinja::program::parse + render with that context
//
// Both run under the interpreter's default bounds (jinja::limits: 1M steps, depth 256, 8 MiB output).
// Oracles besides the sanitizers: only chat_template_error escapes, and output stays within the
// output bound.
#include <simdjson.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/text/chat_template.hpp"
#include "engine/text/jinja/jinja_template.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace tessera;
namespace sj = simdjson;

constexpr int64_t k_now = 1721952000;  // a fixed clock for strftime_now: runs are reproducible

// JSON -> Jinja values, nesting bounded by the interpreter's own depth limit; nullopt when deeper.
std::optional<jinja::value> to_value(sj::dom::element e, size_t depth, size_t max_depth) {
  if (depth > max_depth) return std::nullopt;
  switch (e.type()) {
    case sj::dom::element_type::ARRAY: {
      std::vector<jinja::value> items;
      for (auto x : e.get_array()) {
        auto v = to_value(x, depth + 1, max_depth);
        if (!v) return std::nullopt;
        items.push_back(std::move(*v));
      }
      return jinja::value::make_list(std::move(items));
    }
    case sj::dom::element_type::OBJECT: {
      std::vector<std::pair<jinja::value, jinja::value>> entries;
      for (auto field : e.get_object()) {
        auto v = to_value(field.value, depth + 1, max_depth);
        if (!v) return std::nullopt;
        entries.emplace_back(jinja::value::string(std::string(field.key)), std::move(*v));
      }
      return jinja::value::make_dict(std::move(entries));
    }
    case sj::dom::element_type::INT64: return jinja::value::integer(int64_t(e));
    case sj::dom::element_type::UINT64: return jinja::value::floating(double(uint64_t(e)));
    case sj::dom::element_type::DOUBLE: return jinja::value::floating(double(e));
    case sj::dom::element_type::STRING: return jinja::value::string(std::string(std::string_view(e)));
    case sj::dom::element_type::BOOL: return jinja::value::boolean(bool(e));
    case sj::dom::element_type::NULL_VALUE: return jinja::value::none();
  }
  return std::nullopt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  const std::string_view source = parts[0];
  const jinja::limits bounds;

  if (parts.size() == 1) {
    try {
      const chat_template t = chat_template::parse(std::string(source));
      const std::vector<chat_message> conversation = {{"system", "You are a helpful assistant."},
                                                      {"user", "Hello! {{ not a tag }}"},
                                                      {"assistant", "Hi. <|im_end|>"},
                                                      {"user", "Tell me a joke."}};
      render_options options;
      options.bos_token = "<s>";
      options.eos_token = "</s>";
      options.now_unix_seconds = k_now;
      const std::string out = t.render(conversation, options);
      fuzz::check(out.size() <= bounds.max_output_bytes, "output beyond max_output_bytes");
    } catch (const chat_template_error&) {  // a refusal: the documented answer to bad input
    }
    return 0;
  }

  static sj::dom::parser parser;
  const sj::padded_string json(parts[1]);
  sj::dom::element root;
  if (parser.parse(json).get(root) || !root.is_object()) return 0;
  jinja::context variables;
  for (auto field : root.get_object()) {
    auto v = to_value(field.value, 1, bounds.max_depth);
    if (!v) return 0;
    variables.emplace_back(std::string(field.key), std::move(*v));
  }
  try {
    const auto program = jinja::program::parse(source);
    const std::string out = program->render(variables, bounds, k_now);
    fuzz::check(out.size() <= bounds.max_output_bytes, "output beyond max_output_bytes");
  } catch (const chat_template_error&) {  // a refusal: the documented answer to bad input
  }
  return 0;
}
