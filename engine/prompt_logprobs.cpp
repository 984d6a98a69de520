#include "engine/prompt_logprobs.hpp"

#include <algorithm>

#include "engine/sampler.hpp"
#include "engine/sampling_math.hpp"

namespace tessera {

prompt_logprob score_prompt_row(std::span<const float> logits, token_id target, int32_t top_k) {
  thread_local std::vector<float> tls_work;  // the sanitized row
  std::vector<float>& work = tls_work;
  work.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) work[i] = sampling_math::sanitize_logit(logits[i]);
  raw_logprobs raw = compute_raw_logprobs(work, static_cast<size_t>(top_k > 0 ? top_k : 0));
  prompt_logprob out;
  out.token = target;
  if (target < 0 || static_cast<size_t>(target) >= work.size()) return out;  // rank 0: not scored
  const float t = work[static_cast<size_t>(target)];
  out.logprob = static_cast<float>(t - raw.log_normalizer);
  int32_t above = 0;
  for (float v : work) above += v > t;
  out.rank = above + 1;
  out.top = std::move(raw.top);
  return out;
}

prompt_logprob_collector::prompt_logprob_collector(std::span<const token_id> prompt, int32_t top_k)
    : rows_(prompt.size()), top_k_(top_k) {
  for (size_t i = 0; i < prompt.size(); ++i) rows_[i].token = prompt[i];
  next_ = prompt.empty() ? 0 : 1;
}

bool prompt_logprob_collector::add(int32_t first_position, std::span<const prompt_logprob> rows) {
  const auto size = static_cast<int64_t>(rows_.size());
  const int64_t end = int64_t{first_position} + static_cast<int64_t>(rows.size());
  if (rows.empty()) return true;
  if (first_position < 1 || first_position > next_ || end > size) return false;
  for (int64_t p = next_; p < end; ++p) {
    const prompt_logprob& r = rows[static_cast<size_t>(p - first_position)];
    if (r.token != rows_[static_cast<size_t>(p)].token || !r.has_logprob()) return false;
  }
  for (int64_t p = next_; p < end; ++p) rows_[static_cast<size_t>(p)] = rows[static_cast<size_t>(p - first_position)];
  next_ = static_cast<int32_t>(std::max<int64_t>(next_, end));
  return true;
}

}  // namespace tessera
