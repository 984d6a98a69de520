#include "engine/speculative/speculative_options.hpp"

#include <string>

#include "engine/base/error.hpp"

namespace tessera {

std::optional<speculative_mode> parse_speculative_mode(std::string_view text) {
  if (text == "off") return speculative_mode::off;
  if (text == "ngram") return speculative_mode::ngram;
  return std::nullopt;
}

std::string_view to_string(speculative_mode mode) {
  switch (mode) {
    case speculative_mode::off: return "off";
    case speculative_mode::ngram: return "ngram";
  }
  return "?";
}

void speculative_options::validate() const {
  if (num_tokens < 1)
    throw invalid_request("the number of speculative tokens must be at least 1, got " + std::to_string(num_tokens));
  if (max_batch < 1)
    throw invalid_request("the speculative max batch must be at least 1, got " + std::to_string(max_batch));
  ngram_proposer check(ngram);  // throws on a bad range
}

std::unique_ptr<draft_proposer> speculative_options::make_proposer() const {
  switch (mode) {
    case speculative_mode::off: return nullptr;
    case speculative_mode::ngram: return std::make_unique<ngram_proposer>(ngram);
  }
  return nullptr;
}

}  // namespace tessera
