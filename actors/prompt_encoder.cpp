#include "actors/prompt_encoder.hpp"

#include "engine/base/error.hpp"

namespace tessera::actors {

prompt_encoder::prompt_encoder(std::shared_ptr<const tokenizer> tok, std::optional<chat_template> chat)
    : tok_(std::move(tok)), chat_(chat ? std::move(*chat) : chat_template::fallback_chatml()) {}

std::string prompt_encoder::render(const std::vector<chat_message>& messages, const std::string& tools_json,
                                   const std::string& kwargs_json) const {
  if (!tok_) throw invalid_request("this engine has no tokenizer: send token ids");
  if (messages.empty()) throw invalid_request("messages: the conversation is empty");
  render_options options;
  if (auto bos = tok_->bos()) options.bos_token = tok_->token_text(*bos);
  if (auto eos = tok_->eos()) options.eos_token = tok_->token_text(*eos);
  options.tools_json = tools_json;
  options.kwargs_json = kwargs_json;
  return chat_.render(messages, options);
}

std::vector<token_id> prompt_encoder::encode(const prompt_input& prompt) const {
  switch (prompt.type) {
    case prompt_input::kind::token_ids: return prompt.ids;
    case prompt_input::kind::text: {
      if (!tok_) throw invalid_request("this engine has no tokenizer: send token ids");
      encode_options options;
      options.add_special = prompt.add_special && tok_->add_bos();
      options.parse_special = prompt.parse_special;
      return tok_->encode(prompt.text, options);
    }
    case prompt_input::kind::chat: {
      const std::string text = render(prompt.messages, prompt.tools_json, prompt.template_kwargs_json);
      // The rendered text holds the template's special tokens, so those are parsed; BOS is added
      // only when the vocabulary asks for it and the template did not already write it.
      encode_options options;
      options.parse_special = true;
      options.add_special = tok_->add_bos();
      if (tok_->bos() && text.starts_with(tok_->token_text(*tok_->bos()))) options.add_special = false;
      return tok_->encode(text, options);
    }
  }
  throw invalid_request("unknown prompt kind");
}

}  // namespace tessera::actors
