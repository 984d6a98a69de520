// What a caller submits to the runtime, as a plain value: text (encoded as is), a conversation
// (rendered with the model's chat template, then encoded) or token ids (passed through). No CAF here:
// the server's request parser builds it without pulling in the actor framework.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/executor.hpp"  // token_id
#include "engine/text/chat_template.hpp"

namespace tessera::actors {

struct prompt_input {
  enum class kind : uint8_t { text, chat, token_ids };
  kind type = kind::token_ids;
  std::string text;
  std::vector<chat_message> messages;
  std::vector<token_id> ids;
  std::string tools_json;  // chat: the request's tool definitions for the template; empty: none
  // chat: chat_template_kwargs (vLLM's), a JSON object whose keys become template variables
  // ({"enable_thinking": false}); empty: none.
  std::string template_kwargs_json;
  // Text only: whether the vocabulary's BOS is added (when it asks for one). A generation always
  // adds it; POST /tokenize may say "add_special_tokens": false.
  bool add_special = true;
  // Text only: whether special-token text in it ("<|im_start|>") becomes the special token, as in
  // vLLM and llama-server (a hand-written ChatML prompt then is the tokens a template would give);
  // false: it is encoded as plain text ("parse_special": false).
  bool parse_special = true;
  // vLLM's truncate_prompt_tokens (actors/prompt_truncation.hpp): > 0 keep the prompt's last N tokens;
  // -1 keep the last tokens that fit the context with max_tokens; 0: none (too long: refused).
  int32_t truncate_prompt_tokens = 0;

  static prompt_input from_text(std::string t) {
    prompt_input p;
    p.type = kind::text;
    p.text = std::move(t);
    return p;
  }
  static prompt_input from_chat(std::vector<chat_message> m) {
    prompt_input p;
    p.type = kind::chat;
    p.messages = std::move(m);
    return p;
  }
  static prompt_input from_ids(std::vector<token_id> i) {
    prompt_input p;
    p.type = kind::token_ids;
    p.ids = std::move(i);
    return p;
  }
};

}  // namespace tessera::actors
