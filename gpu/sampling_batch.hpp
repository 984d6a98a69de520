// Packs the engine's device_sampling descriptors (engine/executor.hpp) into the rows and token lists
// the GPU sampler reads (gpu/sampling.hpp), as one host image uploaded with one copy, and unpacks the
// tokens and logprobs it writes back (one small copy instead of the logits rows).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/executor.hpp"
#include "gpu/sampling.hpp"

namespace tessera::gpu {

class sampling_batch {
 public:
  void clear();
  // Samples row `logits_row` of the logits with `d`. d.counts_last_token: pending_row is where the
  // kernel finds that token in kernel_args' pending_tokens (std::invalid_argument when negative).
  void add(const device_sampling& d, int32_t logits_row, int32_t pending_row = -1);
  int32_t num_rows() const { return static_cast<int32_t>(rows_.size()); }
  bool empty() const { return rows_.empty(); }

  // The inputs as one image of input_bytes() bytes (rows, ids, values, then the grammar masks).
  size_t input_bytes() const;
  // with_masks false: everything but the masks, whose words the grammar workers may still be writing
  // (device_sampling::allowed_tokens); pack_masks() adds them once they are ready.
  void pack_inputs(void* host, bool with_masks = true) const;
  void pack_masks(void* host) const;
  // The masks' part of the image: [masks_offset(), masks_offset() + masks_bytes()).
  size_t masks_offset() const { return input_layout().masks; }
  size_t masks_bytes() const { return input_layout().end - input_layout().masks; }
  bool has_masks() const { return !masks_.empty(); }
  // The outputs: tokens, logprobs, top ids, top logprobs in one buffer of output_bytes().
  size_t output_bytes() const;
  // Where in the outputs the sampled ids are ([num_rows()] int32, in the rows' order).
  size_t tokens_offset() const { return output_layout().tokens; }

  // Kernel arguments for device copies of the packed inputs and the outputs buffer.
  sampling_kernel_args kernel_args(const void* device_inputs, void* device_outputs, const float* logits, int32_t vocab,
                                   float* work, const int32_t* pending_tokens = nullptr) const;
  // The results from a host copy of the outputs buffer, one per add(), in order.
  std::vector<sampled_token> unpack_outputs(const void* host) const;

 private:
  struct layout {
    size_t rows = 0, ids = 0, values = 0, masks = 0, end = 0;
  };
  struct out_layout {
    size_t tokens = 0, logprobs = 0, top_ids = 0, top_logprobs = 0, end = 0;
  };
  layout input_layout() const;
  out_layout output_layout() const;

  std::vector<sampling_row> rows_;
  std::vector<int32_t> ids_;
  std::vector<float> values_;
  std::vector<std::span<const uint32_t>> masks_;  // the rows' allowed_tokens, in mask_row order
  int32_t mask_words_ = 0;
  int32_t max_top_ = 0;
};

}  // namespace tessera::gpu
