#include "engine/speculative/verifier.hpp"

namespace tessera {

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

}  // namespace tessera
