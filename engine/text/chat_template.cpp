#include "engine/text/chat_template.hpp"

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

std::string chat_template::render(const std::vector<chat_message>& messages, const render_options& options) const {
  std::vector<jinja::value> items;
  items.reserve(messages.size());
  for (const auto& m : messages) {
    items.push_back(jinja::value::make_dict({{jinja::value::string("role"), jinja::value::string(m.role)},
                                             {jinja::value::string("content"), jinja::value::string(m.content)}}));
  }
  const jinja::context variables = {
      {"messages", jinja::value::make_list(std::move(items))},
      {"add_generation_prompt", jinja::value::boolean(options.add_generation_prompt)},
      {"bos_token", jinja::value::string(options.bos_token)},
      {"eos_token", jinja::value::string(options.eos_token)},
      {"tools", jinja::value::none()},
      {"documents", jinja::value::none()},
  };
  const int64_t now = options.now_unix_seconds
                          ? *options.now_unix_seconds
                          : std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return program_->render(variables, options.limits, now);
}

}  // namespace tessera
