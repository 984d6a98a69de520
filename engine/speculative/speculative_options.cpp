#include "engine/speculative/speculative_options.hpp"

#include <string>

#include "engine/base/error.hpp"

namespace tessera {

std::optional<speculative_mode> parse_speculative_mode(std::string_view text) {
  if (text == "off") return speculative_mode::off;
  if (text == "ngram") return speculative_mode::ngram;
  if (text == "draft") return speculative_mode::draft;
  return std::nullopt;
}

std::string_view to_string(speculative_mode mode) {
  switch (mode) {
    case speculative_mode::off: return "off";
    case speculative_mode::ngram: return "ngram";
    case speculative_mode::draft: return "draft";
  }
  return "?";
}

void speculative_options::validate() const {
  if (num_tokens < 1)
    throw invalid_request("the number of speculative tokens must be at least 1, got " + std::to_string(num_tokens));
  if (max_batch < 1)
    throw invalid_request("the speculative max batch must be at least 1, got " + std::to_string(max_batch));
  ngram_proposer check(ngram);  // throws on a bad range
  if (draft.max_batch_tokens < 1)
    throw invalid_request("the draft model's tokens per forward pass must be at least 1, got " +
                          std::to_string(draft.max_batch_tokens));
  if (draft.branches < 1 || draft.branches > 64)
    throw invalid_request("the draft model's branches per position must be 1..64, got " +
                          std::to_string(draft.branches));
}

std::unique_ptr<draft_proposer> speculative_options::make_proposer(int32_t target_vocab) const {
  switch (mode) {
    case speculative_mode::off: return nullptr;
    case speculative_mode::ngram: return std::make_unique<ngram_proposer>(ngram);
    case speculative_mode::draft:
      if (!draft_executor)
        throw invalid_request("speculative decoding with a draft model needs the draft model (--draft-model)");
      return std::make_unique<draft_model_proposer>(draft_executor, target_vocab, draft);
  }
  return nullptr;
}

}  // namespace tessera
