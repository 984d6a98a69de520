#include "engine/speculative/ngram_proposer.hpp"

#include <algorithm>
#include <string>

#include "engine/base/error.hpp"

namespace tessera {

ngram_proposer::ngram_proposer(const ngram_options& options) : options_(options) {
  if (options.min_n < 1) throw invalid_request("ngram min must be at least 1, got " + std::to_string(options.min_n));
  if (options.branches < 1 || options.branches > 64)
    throw invalid_request("ngram branches must be 1..64, got " + std::to_string(options.branches));
  if (options.max_n < options.min_n)
    throw invalid_request("ngram max (" + std::to_string(options.max_n) + ") must not be below ngram min (" +
                          std::to_string(options.min_n) + ")");
}

namespace {

// What followed a match ending at `from` (< len), read on past the end of the context into the draft
// itself: the draft continues a repeating cycle (period len - from) for all max_tokens tokens.
std::vector<token_id> continuation(std::span<const token_id> context, int64_t from, int32_t max_tokens) {
  const auto len = static_cast<int64_t>(context.size());
  std::vector<token_id> draft;
  draft.reserve(static_cast<size_t>(max_tokens));
  for (int64_t i = from; static_cast<int64_t>(draft.size()) < max_tokens; ++i)
    draft.push_back(i < len ? context[static_cast<size_t>(i)] : draft[static_cast<size_t>(i - len)]);
  return draft;
}

}  // namespace

// Calls found(from) for each match, in preference order (longer n first, then the more recent), where
// `from` is the index of the token that followed it; stops when found returns false.
template <class F>
void ngram_proposer::for_each_match(std::span<const token_id> context, F&& found) const {
  const auto len = static_cast<int64_t>(context.size());
  if (len < 2) return;
  for (int64_t n = std::min<int64_t>(options_.max_n, len - 1); n >= options_.min_n; --n) {
    const auto suffix = context.subspan(static_cast<size_t>(len - n));
    // Candidate starts s < len - n, latest first: context[s, s + n) == suffix, then context[s + n] follows.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + s)) continue;
      if (!found(s + n)) return;
    }
  }
}

std::vector<token_id> ngram_proposer::propose(std::span<const token_id> context, int32_t max_tokens) const {
  std::vector<token_id> draft;
  if (max_tokens <= 0) return draft;
  for_each_match(context, [&](int64_t from) {
    draft = continuation(context, from, max_tokens);
    return false;
  });
  return draft;
}

std::vector<draft_proposal> ngram_proposer::propose(std::span<const draft_request> requests) {
  std::vector<draft_proposal> proposals;
  proposals.reserve(requests.size());
  for (const draft_request& r : requests) {
    if (options_.branches > 1)
      proposals.push_back(propose_tree(r.tokens, r.max_tokens));
    else
      proposals.push_back({propose(r.tokens, r.max_tokens), {}, {}});
  }
  return proposals;
}

draft_proposal ngram_proposer::propose_tree(std::span<const token_id> context, int32_t max_tokens) const {
  draft_proposal tree;
  if (max_tokens <= 0) return tree;
  int32_t branches = 0;
  for_each_match(context, [&](int64_t from) {
    // Merge the continuation into the tree: follow the nodes it shares with earlier branches, then
    // append the rest under the last shared one. A continuation the tree already holds adds nothing.
    const std::vector<token_id> branch = continuation(context, from, max_tokens);
    int32_t at = -1;  // the current node (-1: the sequence's last token)
    size_t i = 0;
    for (; i < branch.size(); ++i) {
      int32_t child = -1;
      for (size_t c = 0; c < tree.tokens.size() && child < 0; ++c) {
        if (tree.parents[c] == at && tree.tokens[c] == branch[i]) child = static_cast<int32_t>(c);
      }
      if (child < 0) break;
      at = child;
    }
    if (i == branch.size()) return true;  // nothing new
    for (; i < branch.size(); ++i) {
      tree.tokens.push_back(branch[i]);
      tree.parents.push_back(at);
      at = static_cast<int32_t>(tree.tokens.size()) - 1;
    }
    return ++branches < options_.branches;
  });
  if (branches <= 1) tree.parents.clear();  // one branch: a chain
  return tree;
}

}  // namespace tessera
