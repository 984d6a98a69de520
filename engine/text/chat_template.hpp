// Chat templates: turn a list of chat messages into the prompt text a model was trained on, using
// the Jinja2 template stored in the model file (GGUF key tokenizer.chat_template, or
// tokenizer_config.json's chat_template). Rendering matches transformers' apply_chat_template
// byte for byte for the supported Jinja subset (see engine/text/jinja/jinja_template.hpp and docs/chat_templates.md).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/jinja/jinja_template.hpp"

namespace tessera {

// A call the assistant made (OpenAI's message.tool_calls[i]). `arguments` is JSON text, as clients
// send it; the template sees it parsed into a dict (as vLLM renders it, and what tool-aware templates
// expect: they print `arguments | tojson`).
struct chat_tool_call {
  std::string id;
  std::string name;
  std::string arguments = "{}";
};

struct chat_message {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
  // "content": null (an assistant turn that only calls tools): the template sees None, as in
  // transformers, so a template that concatenates content fails exactly as it does there.
  bool content_is_null = false;
  std::vector<chat_tool_call> tool_calls;  // assistant: the calls it made (key absent when empty)
  std::string tool_call_id;                // tool: the call this message answers (key absent when empty)
  std::string name;                        // tool / function: the function's name (key absent when empty)
};

struct render_options {
  bool add_generation_prompt = true;  // end with the header that opens the assistant's turn
  std::string bos_token;
  std::string eos_token;
  jinja::limits limits;  // bounds for the untrusted template
  // The request's tool definitions as JSON text (a JSON array, OpenAI's `tools`); empty: the template
  // sees tools = none. Parsed like Python's json.loads (key order kept, ints vs floats).
  std::string tools_json;
  // More variables for the template (vLLM's chat_template_kwargs, e.g. {"enable_thinking": false}):
  // a JSON object's text whose members are added to the context by name; empty: none. Keys that name
  // a variable set here (messages, tools, ...) are refused upstream (server/request_parser.hpp).
  std::string kwargs_json;
  // Clock for strftime_now() (Llama 3.x templates print today's date); nullopt: the current time.
  std::optional<int64_t> now_unix_seconds;
};

// Template families, recognised from marker strings; for logging and diagnostics only (rendering
// always runs the template itself).
enum class chat_template_family { chatml, llama2, llama3, mistral, zephyr, gemma, phi3, unknown };

std::string_view to_string(chat_template_family family);
chat_template_family detect_template_family(std::string_view source);

class chat_template {
 public:
  // Throws chat_template_error (kind syntax or unsupported) when the source cannot be run.
  static chat_template parse(std::string source);

  // ChatML (<|im_start|>role\ncontent<|im_end|>\n), the fallback for models without a usable template.
  static chat_template fallback_chatml();

  // The model's template when it parses and renders a one-message conversation; otherwise ChatML,
  // with a one-line explanation in *warning (cleared when the model's template is used) that the
  // caller should log. Never throws for a bad template.
  static chat_template from_model_or_fallback(const std::optional<std::string>& source, std::string* warning);

  // Throws chat_template_error: kind raised when the template rejects the conversation (e.g. roles
  // that do not alternate), render for runtime errors, limit when a resource bound is hit.
  std::string render(const std::vector<chat_message>& messages, const render_options& options = {}) const;

  const std::string& source() const { return source_; }
  // The template reads the `tools` variable (it can describe tools to the model).
  bool mentions_tools() const;
  chat_template_family family() const { return family_; }

 private:
  chat_template(std::string source, std::shared_ptr<const jinja::program> program);

  std::string source_;
  std::shared_ptr<const jinja::program> program_;
  chat_template_family family_ = chat_template_family::unknown;
};

}  // namespace tessera
