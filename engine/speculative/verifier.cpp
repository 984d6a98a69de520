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
  thread_local std::vector<float> tls_p;
  std::vector<float>& p = tls_p;
  int32_t accepted = 0;
  for (size_t j = 0; j < draft.size(); ++j) {
    const verify_row rj = row(static_cast<int32_t>(j));
    const size_t vocab = rj.logits.size();
    if (q.size() < (j + 1) * vocab) throw std::invalid_argument("verify_sampled_draft: fewer q rows than draft tokens");
    const std::span<const float> qj = q.subspan(j * vocab, vocab);
    samp.distribution(rj.logits, rj.allowed, p);
    const auto d = static_cast<size_t>(draft[j]);
    const auto position = static_cast<uint64_t>(samp.num_generated());
    // u < p(d) / q(d), without dividing: always when p(d) >= q(d).
    const double u = speculative_uniform(samp.stream_key(), speculative_draw::accept, position);
    if (d < vocab && qj[d] > 0.0f && u * qj[d] < p[d]) {
      if (!commit(samp.take(rj.logits, rj.allowed, draft[j]), true)) return accepted;
      ++accepted;
      continue;
    }
    // Rejected: the residual max(0, p - q). Its mass is 1 - Σ min(p, q) > 0 after a rejection, but
    // rounding may leave none: then p itself (the residual's limit as q -> p).
    double mass = 0.0;
    for (size_t x = 0; x < vocab; ++x) mass += p[x] = std::max(0.0f, p[x] - qj[x]);
    if (!(mass > 0.0)) samp.distribution(rj.logits, rj.allowed, p);
    const token_id t = draw_from(p, speculative_uniform(samp.stream_key(), speculative_draw::residual, position));
    commit(samp.take(rj.logits, rj.allowed, t), false);
    return accepted;
  }
  const verify_row last = row(static_cast<int32_t>(draft.size()));
  commit(samp.sample(last.logits, last.allowed), false);
  return accepted;
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
