#include "engine/speculative/vocabulary_check.hpp"

#include <algorithm>
#include <optional>
#include <vector>

namespace tessera {

namespace {

std::string id_text(const std::optional<token_id>& id) { return id ? std::to_string(*id) : std::string("none"); }

// At most 40 characters of a token's text, for the message.
std::string shown(const std::string& text) {
  return "'" + (text.size() > 40 ? text.substr(0, 40) + "..." : text) + "'";
}

}  // namespace

std::string vocabulary_mismatch(const tokenizer& target, const tokenizer& draft) {
  if (target.vocab_size() != draft.vocab_size())
    return "the target's vocabulary has " + std::to_string(target.vocab_size()) + " tokens, the draft's " +
           std::to_string(draft.vocab_size());
  for (size_t i = 0; i < target.vocab_size(); ++i) {
    const auto id = static_cast<token_id>(i);
    if (target.token_text(id) != draft.token_text(id))
      return "token " + std::to_string(i) + " is " + shown(target.token_text(id)) + " in the target, " +
             shown(draft.token_text(id)) + " in the draft";
    if (target.is_special(id) != draft.is_special(id))
      return "token " + std::to_string(i) + " (" + shown(target.token_text(id)) + ") is special in the " +
             (target.is_special(id) ? "target" : "draft") + " only";
  }
  const struct {
    const char* name;
    std::optional<token_id> (tokenizer::*get)() const noexcept;
  } specials[] = {{"BOS", &tokenizer::bos},
                  {"EOS", &tokenizer::eos},
                  {"EOT", &tokenizer::eot},
                  {"UNK", &tokenizer::unk},
                  {"PAD", &tokenizer::pad}};
  for (const auto& s : specials) {
    const std::optional<token_id> t = (target.*s.get)(), d = (draft.*s.get)();
    if (t != d)
      return std::string("the ") + s.name + " token is " + id_text(t) + " in the target, " + id_text(d) +
             " in the draft";
  }
  std::vector<token_id> t(target.eog_tokens().begin(), target.eog_tokens().end());
  std::vector<token_id> d(draft.eog_tokens().begin(), draft.eog_tokens().end());
  std::sort(t.begin(), t.end());
  std::sort(d.begin(), d.end());
  if (t != d) return "the end-of-generation tokens differ between the target and the draft";
  return {};
}

}  // namespace tessera
