#include "engine/speculative/layer_draft.hpp"

#include <string>

#include "engine/base/error.hpp"

namespace tessera {

std::shared_ptr<const model_weights> first_layers_draft(std::shared_ptr<const model_weights> target,
                                                        int32_t num_layers) {
  const int32_t total = target->config.num_layers;
  if (num_layers < 1 || num_layers > total)
    throw invalid_request("--draft-layers must be between 1 and the model's " + std::to_string(total) +
                          " layers (got " + std::to_string(num_layers) + ")");
  auto draft = std::make_shared<model_weights>(*target);
  draft->config.num_layers = num_layers;
  if (!draft->config.layers.empty()) draft->config.layers.resize(static_cast<size_t>(num_layers));
  draft->layers.resize(static_cast<size_t>(num_layers));
  // The tensors point into the target's buffers: the draft keeps the whole target alive.
  draft->storage = target;
  return draft;
}

}  // namespace tessera
