// A draft model made of the target's own first layers: the first `num_layers` decoder layers, then the
// target's final norm and LM head (early exit, as in self-speculative decoding: Zhang et al. 2023,
// "Draft & Verify: Lossless Large Language Model Acceleration via Self-Speculative Decoding";
// Elhoushi et al. 2024, "LayerSkip"). For models without a smaller sibling that shares their
// vocabulary (`--speculative draft --draft-layers N`). The vocabulary is the target's by construction.
// The tensors are the target's own: no weight is copied (an executor may still repack them).
#pragma once
#include <cstdint>
#include <memory>

#include "engine/model/model_weights.hpp"

namespace tessera {

// pre: target non-null. Throws invalid_request naming the bound when num_layers is not in
// [1, target's layers].
std::shared_ptr<const model_weights> first_layers_draft(std::shared_ptr<const model_weights> target,
                                                        int32_t num_layers);

}  // namespace tessera
