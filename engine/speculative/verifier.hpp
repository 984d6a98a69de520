// Speculative decoding's second half: verifying a linear draft against the target model's rows, so
// that the output has exactly the distribution of plain decoding (docs/speculative.md).
//
// Row j of the verification pass is the target's logits after the context and draft[0, j). The
// sequence's own sampler draws the target's token t_j from row j — with every transform it applies
// (logit_bias, min_tokens, penalties over the history INCLUDING the drafts accepted so far, since it
// records each token it draws, temperature, top-k/top-p/min-p) and its seeded stream at that output
// position — and the draft token is accepted iff t_j == draft[j]. The first mismatch ends the step
// with t_j, the target's own token; when every draft token is accepted, the last row gives one more.
//
// Why this is lossless. A proposer without a distribution (n-gram lookup) is a point mass q = δ_d, for
// which the rejection sampling of Leviathan et al. / Chen et al. (2023) accepts d with probability
// min(1, p(d) / q(d)) = p(d) and on rejection samples the normalised residual max(0, p - q), i.e. p
// with d removed, renormalised. Drawing t ~ p with one uniform u (inverse CDF) and accepting iff t == d
// is that same algorithm with both of its draws taken from u: P(accept) = P(u falls in d's interval)
// = p(d), and given rejection u is uniform over the rest of the CDF, so t ~ p(· | t != d). Every token
// thus has the target's distribution given the tokens before it, and greedy requests (argmax rows)
// accept exactly the longest prefix that equals the target's argmax. As a bonus the draw for output
// position t is the same uniform plain decoding would use, so a seeded request gives the same tokens
// with and without speculation (up to the executor's rounding of multi-token rows).
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "engine/sampler.hpp"

namespace tessera {

// Row j of a verification: the target's logits after the context and draft[0, j), and the grammar's
// allowed tokens there (structured output; empty: all), computed with the grammar advanced over those
// drafts.
struct verify_row {
  std::span<const float> logits;
  std::span<const uint32_t> allowed;
};

// Verifies `draft` with `samp`: for j = 0, 1, ... draws t_j from row(j) (samp records it) and passes it
// to `commit` with whether it is the draft's token (accepted), which returns false when the sequence
// ends there (a stop, the length limit). Goes on while t_j == draft[j], the sequence goes on and a row
// is left (rows 0..draft.size()). Returns how many draft tokens were accepted; commit() got that many
// plus one tokens, unless it ended earlier.
int32_t verify_draft(sampler& samp, std::span<const token_id> draft, const std::function<verify_row(int32_t row)>& row,
                     const std::function<bool(const sample_result&, bool accepted)>& commit);

}  // namespace tessera
