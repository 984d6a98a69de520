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
#include <vector>

#include "engine/sampler.hpp"
#include "engine/sampling_params.hpp"

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

// ---- Drafts sampled from a known distribution q (a draft model's, for a request that samples) -----
//
// Leviathan et al. ("Fast Inference from Transformers via Speculative Decoding", ICML 2023, Algorithm 1)
// and Chen et al. ("Accelerating Large Language Model Decoding with Speculative Sampling", 2023): draft
// token d_j ~ q_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)); the first rejection draws
// the step's last token from the normalised residual max(0, p_j - q_j); when every draft token is
// accepted the last row gives one more token from p. P(emit x) = min(p(x), q(x)) + (1 - Σ min(p, q)) *
// max(0, p(x) - q(x)) / Σ max(0, p - q) = p(x), so the output has the target's distribution exactly,
// for any q; the closer q is to p, the more is accepted (Σ_x min(p(x), q(x)) per token). p is the
// sampler's distribution (sampler::distribution: every sampling parameter and the grammar mask), q
// what the proposer drew from (draft_distribution).
//
// The three draws use streams of their own, derived from the request's (sampler::stream_key) and keyed
// by output position, so a seeded request is reproducible; they are not plain decoding's draws, so its
// tokens differ from plain decoding's (in value, not in distribution).
enum class speculative_draw : uint64_t { draft = 1, accept = 2, residual = 3 };
double speculative_uniform(uint64_t stream_key, speculative_draw draw, uint64_t position);
// The uniform of the candidate-th of several candidates at one output position (a token tree's
// siblings, below); candidate 0's is the one above, so a chain draws what it always drew.
double speculative_uniform(uint64_t stream_key, speculative_draw draw, uint64_t position, uint32_t candidate);

// q for a request sampled with `params`: the draft model's logits under its temperature, top-k, top-p
// and min-p (penalties, biases and grammar stay with the target: any q keeps the output exact, a
// closer one is accepted more often); greedy params give the argmax. Vocabulary-sized, into `q`.
void draft_distribution(std::span<const float> logits, const sampling_params& params, std::vector<float>& q);

// Verifies a chain whose token j was drawn from q.subspan(j * vocab, vocab) (vocab: the rows' size),
// committing each token as verify_draft does. Returns how many draft tokens were accepted.
int32_t verify_sampled_draft(sampler& samp, std::span<const token_id> draft, std::span<const float> q,
                             const std::function<verify_row(int32_t row)>& row,
                             const std::function<bool(const sample_result&, bool accepted)>& commit);

// ---- Trees of drafts sampled from q: recursive rejection sampling ---------------------------------
//
// Several drafts for one position, drawn from one q WITHOUT replacement (x_1 ~ q, x_2 ~ q without x_1
// renormalised, ...), verified in their draw order (Jeon et al., "Recursive Speculative Decoding:
// Accelerating LLM Inference via Sampling Without Replacement", 2024; SpecInfer's multi-step
// speculative sampling is the same rule for draws with replacement). With p_1 = p and q_1 = q:
// x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); on rejection p_{i+1} = max(0, p_i - q_i)
// normalised and q_{i+1} = q_i without x_i normalised; when every candidate is rejected the token
// comes from p_{m+1}. Lossless by induction from the last candidate: whatever q_{i+1} is, if the
// rest emits p_{i+1} then candidate i's stage emits min(p_i, q_i) + (1 - Σ min(p_i, q_i)) p_{i+1} =
// p_i. A rejected x_i had p_i(x_i) < q_i(x_i), so p_{i+1}(x_i) = 0: no later stage emits it.

// Draws candidates 1 .. count - 1 (x_2 .. x_count) for output position `position` from q without
// `first` (x_1, drawn with speculative_draw::draft there) and without each other, each with its
// candidate's uniform, into `out`, most recent last; fewer when q's support runs out.
void draw_further_candidates(std::span<const float> q, token_id first, int32_t count, uint64_t stream_key,
                             uint64_t position, std::vector<token_id>& out);

// Verifies a tree of drafts sampled from q (a chain when parents is empty), committing each token as
// verify_draft does: the candidates at a node are its children in node order, which must be their
// draw order, verified by the rule above. Row j of q (vocab: the rows' size) is what the children of
// the accepted node at depth j - 1 were drawn from (j = 0: the root's): the draft model's shape, a
// chain with leaves beside it (a leaf has no children). A chain's tokens and draws are
// verify_sampled_draft's. Returns the accepted nodes, in order; commit() got them and one more token,
// unless it ended earlier.
std::vector<int32_t> verify_sampled_tree(sampler& samp, std::span<const token_id> tokens,
                                         std::span<const int32_t> parents, std::span<const float> q,
                                         const std::function<verify_row(int32_t row)>& row,
                                         const std::function<bool(const sample_result&, bool accepted)>& commit);

// Verifies a token tree (engine/speculative/proposer.hpp: tokens[i] a child of parents[i], -1 the
// sequence's last token): row 0 is the target's logits after the context, row 1 + i after the context
// and node i's branch (node i and its ancestors). From the root, draws t from the current node's row;
// a child of that node whose token is t is accepted and the walk goes on from its row; otherwise the
// step ends with t. It is the chain's rule applied along whichever branch the target's own draws take:
// every token is drawn from the target's row for exactly the tokens before it, with the uniform plain
// decoding would use at that output position, so the output is plain decoding's in distribution (and,
// seeded, token for token). The children of a node have distinct tokens. Returns the accepted nodes,
// in order; commit() got them and one more token, unless it ended earlier.
std::vector<int32_t> verify_tree(sampler& samp, std::span<const token_id> tokens, std::span<const int32_t> parents,
                                 const std::function<verify_row(int32_t row)>& row,
                                 const std::function<bool(const sample_result&, bool accepted)>& commit);

}  // namespace tessera
