#include "engine/speculative/ngram_proposer.hpp"

#include <algorithm>
#include <string>

#include "engine/base/error.hpp"

namespace tessera {

ngram_proposer::ngram_proposer(const ngram_options& options) : options_(options) {
  if (options.min_n < 1) throw invalid_request("ngram min must be at least 1, got " + std::to_string(options.min_n));
  if (options.max_n < options.min_n)
    throw invalid_request("ngram max (" + std::to_string(options.max_n) + ") must not be below ngram min (" +
                          std::to_string(options.min_n) + ")");
}

std::vector<std::vector<token_id>> ngram_proposer::propose(std::span<const draft_request> requests) {
  std::vector<std::vector<token_id>> drafts;
  drafts.reserve(requests.size());
  for (const draft_request& r : requests) drafts.push_back(propose(r.tokens, r.max_tokens));
  return drafts;
}

std::vector<token_id> ngram_proposer::propose(std::span<const token_id> context, int32_t max_tokens) const {
  const auto len = static_cast<int64_t>(context.size());
  if (max_tokens <= 0 || len < 2) return {};
  for (int64_t n = std::min<int64_t>(options_.max_n, len - 1); n >= options_.min_n; --n) {
    const auto suffix = context.subspan(static_cast<size_t>(len - n));
    // Candidate starts s < len - n, latest first: context[s, s + n) == suffix, then context[s + n] follows.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + s)) continue;
      // What followed the match, read on past the end of the context into the draft itself: the
      // draft continues a repeating cycle (period len - from) for all max_tokens tokens.
      const int64_t from = s + n;  // < len: at least one token follows the match
      std::vector<token_id> draft;
      draft.reserve(static_cast<size_t>(max_tokens));
      for (int64_t i = from; static_cast<int64_t>(draft.size()) < max_tokens; ++i)
        draft.push_back(i < len ? context[static_cast<size_t>(i)] : draft[static_cast<size_t>(i - len)]);
      return draft;
    }
  }
  return {};
}

}  // namespace tessera
