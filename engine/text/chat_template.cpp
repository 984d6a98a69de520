#include "engine/text/chat_template.hpp"

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace tessera {

namespace {

// The ChatML template as Hugging Face ships it (e.g. Qwen1.5 / OpenHermes), without a default
// system prompt.
constexpr std::string_view chatml_source =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

bool has(std::string_view source, std::string_view marker) { return source.find(marker) != std::string_view::npos; }

[[noreturn]] void bad_json(const std::string& what, const std::string& why) {
  throw chat_template_error(chat_template_error_kind::render, what + " is not valid JSON (" + why + ")");
}

// A JSON value as Python's json.loads returns it to the template: objects keep their key order (a
// repeated key keeps its first position and takes the last value), integers stay integers (64-bit:
// larger ones are refused rather than rounded), other numbers are floats.
jinja::value from_json(simdjson::dom::element e, const std::string& what) {
  using simdjson::dom::element_type;
  switch (e.type()) {
    case element_type::OBJECT: {
      std::vector<std::pair<jinja::value, jinja::value>> entries;
      for (auto field : simdjson::dom::object(e)) {
        jinja::value key = jinja::value::string(std::string(field.key));
        jinja::value v = from_json(field.value, what);
        bool replaced = false;
        for (auto& [k, old] : entries) {
          if (k.str() == key.str()) {
            old = std::move(v);
            replaced = true;
            break;
          }
        }
        if (!replaced) entries.emplace_back(std::move(key), std::move(v));
      }
      return jinja::value::make_dict(std::move(entries));
    }
    case element_type::ARRAY: {
      std::vector<jinja::value> items;
      for (auto item : simdjson::dom::array(e)) items.push_back(from_json(item, what));
      return jinja::value::make_list(std::move(items));
    }
    case element_type::STRING: return jinja::value::string(std::string(std::string_view(e)));
    case element_type::INT64: return jinja::value::integer(int64_t(e));
    case element_type::UINT64: bad_json(what, "an integer beyond 64 bits");
    case element_type::DOUBLE: return jinja::value::floating(double(e));
    case element_type::BOOL: return jinja::value::boolean(bool(e));
    case element_type::NULL_VALUE: return jinja::value::none();
  }
  bad_json(what, "unknown element");
}

jinja::value parse_json_value(simdjson::dom::parser& parser, const std::string& text, const std::string& what) {
  simdjson::dom::element root;
  if (auto error = parser.parse(text).get(root)) bad_json(what, simdjson::error_message(error));
  return from_json(root, what);
}

jinja::value message_value(const chat_message& m, size_t index, simdjson::dom::parser& parser) {
  using jinja::value;
  std::vector<std::pair<value, value>> entries;
  entries.emplace_back(value::string("role"), value::string(m.role));
  entries.emplace_back(value::string("content"), m.content_is_null ? value::none() : value::string(m.content));
  if (!m.tool_calls.empty()) {
    std::vector<value> calls;
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
      const chat_tool_call& c = m.tool_calls[j];
      const std::string what =
          "messages[" + std::to_string(index) + "].tool_calls[" + std::to_string(j) + "].function.arguments";
      value function = value::make_dict({{value::string("name"), value::string(c.name)},
                                         {value::string("arguments"), parse_json_value(parser, c.arguments, what)}});
      calls.push_back(value::make_dict({{value::string("id"), value::string(c.id)},
                                        {value::string("type"), value::string("function")},
                                        {value::string("function"), std::move(function)}}));
    }
    entries.emplace_back(value::string("tool_calls"), value::make_list(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) entries.emplace_back(value::string("tool_call_id"), value::string(m.tool_call_id));
  if (!m.name.empty()) entries.emplace_back(value::string("name"), value::string(m.name));
  return value::make_dict(std::move(entries));
}

}  // namespace

std::string_view to_string(chat_template_family family) {
  switch (family) {
    case chat_template_family::chatml: return "chatml";
    case chat_template_family::llama2: return "llama2";
    case chat_template_family::llama3: return "llama3";
    case chat_template_family::mistral: return "mistral";
    case chat_template_family::zephyr: return "zephyr";
    case chat_template_family::gemma: return "gemma";
    case chat_template_family::phi3: return "phi3";
    case chat_template_family::unknown: return "unknown";
  }
  return "unknown";
}

chat_template_family detect_template_family(std::string_view source) {
  // Ordered from the most specific marker: Llama 2 and Mistral both use [INST], but only Llama 2
  // wraps the system prompt in <<SYS>>; Zephyr and Phi-3 both use <|user|>, but Phi-3 ends turns
  // with <|end|>.
  if (has(source, "<|im_start|>")) return chat_template_family::chatml;
  if (has(source, "<|start_header_id|>")) return chat_template_family::llama3;
  if (has(source, "<start_of_turn>")) return chat_template_family::gemma;
  if (has(source, "<<SYS>>")) return chat_template_family::llama2;
  if (has(source, "[INST]")) return chat_template_family::mistral;
  if (has(source, "<|user|>") && has(source, "<|end|>")) return chat_template_family::phi3;
  if (has(source, "<|user|>")) return chat_template_family::zephyr;
  return chat_template_family::unknown;
}

chat_template::chat_template(std::string source, std::shared_ptr<const jinja::program> program)
    : source_(std::move(source)), program_(std::move(program)), family_(detect_template_family(source_)) {}

chat_template chat_template::parse(std::string source) {
  auto program = jinja::program::parse(source);
  return chat_template(std::move(source), std::move(program));
}

chat_template chat_template::fallback_chatml() { return parse(std::string(chatml_source)); }

chat_template chat_template::from_model_or_fallback(const std::optional<std::string>& source, std::string* warning) {
  auto warn = [&](std::string text) {
    if (warning) *warning = std::move(text);
  };
  warn("");
  if (!source || source->empty()) {
    warn("the model has no chat template; using ChatML");
    return fallback_chatml();
  }
  try {
    chat_template model = parse(*source);
    // A template that cannot render a single user turn is broken for every request; finding out
    // now gives one warning at load time instead of an error per request.
    render_options probe;
    probe.now_unix_seconds = 0;
    model.render({{"user", "Hello"}}, probe);
    return model;
  } catch (const chat_template_error& e) {
    warn(std::string("the model's chat template cannot be used (") + e.what() + "); using ChatML");
    return fallback_chatml();
  }
}

bool chat_template::mentions_tools() const { return has(source_, "tools"); }

std::string chat_template::render(const std::vector<chat_message>& messages, const render_options& options) const {
  simdjson::dom::parser parser;
  std::vector<jinja::value> items;
  items.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) items.push_back(message_value(messages[i], i, parser));
  jinja::value tools =
      options.tools_json.empty() ? jinja::value::none() : parse_json_value(parser, options.tools_json, "tools");
  jinja::context variables = {
      {"messages", jinja::value::make_list(std::move(items))},
      {"add_generation_prompt", jinja::value::boolean(options.add_generation_prompt)},
      {"bos_token", jinja::value::string(options.bos_token)},
      {"eos_token", jinja::value::string(options.eos_token)},
      {"tools", std::move(tools)},
      {"documents", jinja::value::none()},
  };
  if (!options.kwargs_json.empty()) {
    simdjson::dom::element root;
    simdjson::dom::object members;
    if (auto error = parser.parse(options.kwargs_json).get(root))
      bad_json("chat_template_kwargs", simdjson::error_message(error));
    if (root.get(members)) bad_json("chat_template_kwargs", "not an object");
    for (auto [key, v] : members) {
      const std::string name(key);
      const bool taken =
          std::any_of(variables.begin(), variables.end(), [&](const auto& var) { return var.first == name; });
      if (!taken) variables.emplace_back(name, from_json(v, "chat_template_kwargs." + name));
    }
  }
  const int64_t now =
      options.now_unix_seconds
          ? *options.now_unix_seconds
          : std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
  return program_->render(variables, options.limits, now);
}

}  // namespace tessera
