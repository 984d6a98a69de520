// Prompt text / conversation -> token ids, the work of the tokenizer actors. Immutable after
// construction, so one instance is shared by every tokenizer actor of the pool.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "actors/messages.hpp"
#include "engine/text/chat_template.hpp"
#include "engine/text/tokenizer.hpp"

namespace tessera::actors {

class prompt_encoder {
 public:
  // `tok` may be null: only token-id prompts are accepted then. `chat` absent: ChatML.
  prompt_encoder(std::shared_ptr<const tokenizer> tok, std::optional<chat_template> chat);

  // Throws invalid_request (no tokenizer, empty conversation) or chat_template_error (the template
  // rejects the conversation).
  std::vector<token_id> encode(const prompt_input& prompt) const;
  // The conversation rendered with the chat template (add_generation_prompt), BOS/EOS texts from the
  // vocabulary.
  // `tools_json`: the request's tool definitions (JSON array text) for the template; empty: none.
  // `kwargs_json`: chat_template_kwargs (a JSON object's text), more template variables; empty: none.
  std::string render(const std::vector<chat_message>& messages, const std::string& tools_json = {},
                     const std::string& kwargs_json = {}) const;

  const std::shared_ptr<const tokenizer>& tok() const { return tok_; }

 private:
  std::shared_ptr<const tokenizer> tok_;
  chat_template chat_;
};

}  // namespace tessera::actors
