#include "engine/speculative/verifier.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "engine/sampling_math.hpp"

namespace tessera {

double speculative_uniform(uint64_t stream_key, speculative_draw draw, uint64_t position) {
  return sampling_math::uniform_draw(sampling_math::derive_stream_key(stream_key, static_cast<uint64_t>(draw)),
                                     position);
}

double speculative_uniform(uint64_t stream_key, speculative_draw draw, uint64_t position, uint32_t candidate) {
  if (candidate == 0) return speculative_uniform(stream_key, draw, position);
  const uint64_t per_draw = sampling_math::derive_stream_key(stream_key, static_cast<uint64_t>(draw));
  return sampling_math::uniform_draw(sampling_math::derive_stream_key(per_draw, candidate), position);
}

void draft_distribution(std::span<const float> logits, const sampling_params& params, std::vector<float>& q) {
  thread_local std::vector<float> tls_scaled;
  std::vector<float>& scaled = tls_scaled;
  scaled.resize(logits.size());
  const float temperature = params.greedy() ? 1.0f : params.temperature;
  for (size_t i = 0; i < logits.size(); ++i)
    scaled[i] = std::min(sampling_math::sanitize_logit(logits[i]) / temperature, std::numeric_limits<float>::max());
  if (!processed_distribution(scaled, params, q)) {
    // Every logit -inf (a broken draft row): a point mass on token 0 is still a distribution.
    q.assign(logits.size(), 0.0f);
    q[0] = 1.0f;
  }
}

int32_t verify_sampled_draft(sampler& samp, std::span<const token_id> draft, std::span<const float> q,
                             const std::function<verify_row(int32_t row)>& row,
                             const std::function<bool(const sample_result&, bool accepted)>& commit) {
  return static_cast<int32_t>(verify_sampled_tree(samp, draft, {}, q, row, commit).size());
}

void draw_further_candidates(std::span<const float> q, token_id first, int32_t count, uint64_t stream_key,
                             uint64_t position, std::vector<token_id>& out) {
  out.clear();
  thread_local std::vector<float> tls_rest;
  std::vector<float>& rest = tls_rest;
  rest.assign(q.begin(), q.end());
  if (first >= 0 && static_cast<size_t>(first) < rest.size()) rest[static_cast<size_t>(first)] = 0.0f;
  for (uint32_t c = 1; c < static_cast<uint32_t>(std::max(count, 0)); ++c) {
    // draw_from takes weights of any total: zeroing the drawn ones is drawing from the rest renormalised.
    const token_id t = draw_from(rest, speculative_uniform(stream_key, speculative_draw::draft, position, c));
    if (t < 0) return;
    out.push_back(t);
    rest[static_cast<size_t>(t)] = 0.0f;
  }
}

namespace {

// The children of node `at` (-1: the root) in node order: children come after their parent.
void children_of(std::span<const int32_t> parents, size_t num_nodes, int32_t at, std::vector<int32_t>& out) {
  out.clear();
  for (auto i = static_cast<size_t>(at + 1); i < num_nodes; ++i) {
    const int32_t parent = parents.empty() ? static_cast<int32_t>(i) - 1 : parents[i];
    if (parent == at) out.push_back(static_cast<int32_t>(i));
  }
}

}  // namespace

std::vector<int32_t> verify_sampled_tree(sampler& samp, std::span<const token_id> tokens,
                                         std::span<const int32_t> parents, std::span<const float> q,
                                         const std::function<verify_row(int32_t row)>& row,
                                         const std::function<bool(const sample_result&, bool accepted)>& commit) {
  if (!parents.empty() && parents.size() != tokens.size())
    throw std::invalid_argument("verify_sampled_tree: one parent per token");
  thread_local std::vector<float> tls_p;
  thread_local std::vector<double> tls_residual;
  thread_local std::vector<int32_t> tls_children;
  std::vector<float>& p = tls_p;
  std::vector<double>& residual = tls_residual;
  std::vector<int32_t>& children = tls_children;
  std::vector<int32_t> path;
  int32_t at = -1;  // the current node: -1 is the sequence's last token (row 0)
  for (;;) {
    const verify_row r = row(at + 1);
    children_of(parents, tokens.size(), at, children);
    if (children.empty()) {  // past the drafts: the target's own token, as plain decoding draws it
      commit(samp.sample(r.logits, r.allowed), false);
      return path;
    }
    const size_t vocab = r.logits.size(), depth = path.size();
    if (q.size() < (depth + 1) * vocab) throw std::invalid_argument("verify_sampled_tree: fewer q rows than depths");
    if (at >= 0 && static_cast<size_t>(at) != depth - 1)
      throw std::invalid_argument("verify_sampled_tree: a node off the chain has children");
    const std::span<const float> qd = q.subspan(depth * vocab, vocab);
    samp.distribution(r.logits, r.allowed, p);
    const auto position = static_cast<uint64_t>(samp.num_generated());
    // q_i is qd without the candidates tried before x_i, renormalised: qd(x) / (1 - removed).
    double removed = 0.0;
    int32_t taken = -1;
    for (uint32_t c = 0; c < children.size(); ++c) {
      const auto d = static_cast<size_t>(tokens[static_cast<size_t>(children[c])]);
      const double kept = 1.0 - removed;
      // A candidate q_i gives no mass (off q's support, or a repeat of one tried before) was never
      // drawn from it: skipped, as if not proposed.
      const bool repeat = std::any_of(children.begin(), children.begin() + c, [&](int32_t n) {
        return static_cast<size_t>(tokens[static_cast<size_t>(n)]) == d;
      });
      if (d >= vocab || !(qd[d] > 0.0f) || !(kept > 0.0) || repeat) continue;
      // u < p_i(d) / q_i(d), without dividing: always when p_i(d) >= q_i(d).
      const double u = speculative_uniform(samp.stream_key(), speculative_draw::accept, position, c);
      if (u * qd[d] < p[d] * kept) {
        taken = children[c];
        break;
      }
      // Rejected: p_{i+1} = max(0, p_i - q_i). Its mass is 1 - Σ min(p_i, q_i) > 0 after a rejection,
      // but rounding may leave none: then p_i stays (the residual's limit as q_i -> p_i).
      residual.resize(vocab);
      double mass = 0.0;
      for (size_t x = 0; x < vocab; ++x) mass += residual[x] = std::max(0.0, static_cast<double>(p[x]) - qd[x] / kept);
      if (mass > 0.0) {
        // Normalised only when another candidate follows: draw_from takes any total (a chain's one
        // residual is drawn from exactly as before).
        const double scale = c + 1 < children.size() ? 1.0 / mass : 1.0;
        for (size_t x = 0; x < vocab; ++x) p[x] = static_cast<float>(residual[x] * scale);
      }
      removed += qd[d];
    }
    if (taken < 0) {
      const token_id t = draw_from(p, speculative_uniform(samp.stream_key(), speculative_draw::residual, position));
      commit(samp.take(r.logits, r.allowed, t), false);
      return path;
    }
    if (!commit(samp.take(r.logits, r.allowed, tokens[static_cast<size_t>(taken)]), true)) return path;
    path.push_back(taken);
    at = taken;
  }
}

int32_t verify_draft(sampler& samp, std::span<const token_id> draft, const std::function<verify_row(int32_t row)>& row,
                     const std::function<bool(const sample_result&, bool accepted)>& commit) {
  int32_t accepted = 0;
  for (size_t j = 0;; ++j) {
    const verify_row rj = row(static_cast<int32_t>(j));
    const sample_result r = samp.sample(rj.logits, rj.allowed);
    const bool is_draft = j < draft.size() && r.token == draft[j];
    if (!commit(r, is_draft) || !is_draft) return accepted;
    ++accepted;
  }
}

std::vector<int32_t> verify_tree(sampler& samp, std::span<const token_id> tokens, std::span<const int32_t> parents,
                                 const std::function<verify_row(int32_t row)>& row,
                                 const std::function<bool(const sample_result&, bool accepted)>& commit) {
  std::vector<int32_t> path;
  int32_t at = -1;  // the current node: -1 is the sequence's last token (row 0)
  for (;;) {
    const verify_row r = row(at + 1);
    const sample_result drawn = samp.sample(r.logits, r.allowed);
    int32_t child = -1;
    for (size_t i = static_cast<size_t>(at + 1); i < tokens.size() && child < 0; ++i) {
      if (parents[i] == at && tokens[i] == drawn.token) child = static_cast<int32_t>(i);  // children follow parents
    }
    if (!commit(drawn, child >= 0) || child < 0) return path;
    path.push_back(child);
    at = child;
  }
}

}  // namespace tessera
