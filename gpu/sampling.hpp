// Logits processing and sampling on the GPU: the engine's sampler (engine/sampler.cpp) as a batched
// kernel, one CTA per logits row, so an executor copies back a token (and logprobs) per sequence
// instead of a vocabulary-sized row of fp32 logits. Same order and semantics as sampler::sample()
// (docs/sampling.md): sanitize, the grammar's token mask, logit_bias, min_tokens mask, repetition penalty,
// presence/frequency penalties, greedy argmax or temperature, top-k, top-p, min-p, the seeded inverse-CDF draw in token
// id order; the raw logprob of the chosen token and the top-n raw logprobs.
//
// Truncation never sorts the row: the top-k threshold is a radix selection over the logits' order
// keys (a 256-bucket count histogram per byte, 4 passes), the top-p threshold a 16-way search over the
// weights' bit patterns (each pass sums the probability mass above 16 thresholds at once: about 8
// passes); entries equal to a threshold are resolved in token id order, as the host's total order
// (higher score first, lower id first) does.
//
// Host and device agree token for token on the same logits except when a cumulative sum lands within
// double rounding of a boundary (the top-p cut, the drawn CDF position: the sums are accumulated in a
// different order) or when a double exp() straddles a float rounding boundary (engine/sampling_math.hpp):
// events of probability ~1e-12 and ~2^-29 per entry.
//
// This header is C++17 and CUDA-only (no engine types): gpu/sampling_batch.hpp packs the engine's
// device_sampling descriptors into these rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::gpu {

// One row to sample (plain data, uploaded as is). Token lists live in the batch's `ids`/`values`.
struct sampling_row {
  uint64_t stream_key = 0;
  uint64_t position = 0;
  int32_t logits_row = 0;  // row of `logits` to read
  int32_t top_k = -1;
  int32_t num_logprobs = -1;  // -1: none
  int32_t greedy = 0;
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t bias_begin = 0, bias_count = 0;    // ids[i], values[i]: logit bias
  int32_t mask_begin = 0, mask_count = 0;    // ids[i]: set to -inf
  int32_t rep_begin = 0, rep_count = 0;      // ids[i]: repetition penalty (distinct)
  int32_t count_begin = 0, count_count = 0;  // ids[i], values[i] (a count as float): presence/frequency
  int32_t mask_row = -1;                     // row of `allowed` (constrained decoding); -1: every token allowed
  // Overlapped steps (device_sampling::counts_last_token): pending_tokens[pending_row] is one more
  // generated token for the penalties, in neither list; -1: none.
  int32_t pending_row = -1;
};

struct sampling_kernel_args {
  const float* logits = nullptr;  // [*, vocab] fp32, not modified
  int32_t vocab = 0;
  float* work = nullptr;  // [num_rows, vocab] scratch
  const sampling_row* rows = nullptr;
  int32_t num_rows = 0;
  const int32_t* ids = nullptr;
  const float* values = nullptr;
  // Constrained decoding: packed allowed-token bitmasks, `mask_words` uint32 per row (bit t % 32 of word
  // t / 32: token t allowed). Disallowed logits become -inf before anything else, raw logprobs included.
  const uint32_t* allowed = nullptr;
  int32_t mask_words = 0;
  const int32_t* pending_tokens = nullptr;  // the previous step's sampled ids (sampling_row::pending_row)
  int32_t* out_tokens = nullptr;            // [num_rows]
  float* out_logprobs = nullptr;            // [num_rows] (rows with num_logprobs >= 0)
  int32_t max_top = 0;                      // top logprob slots per row
  int32_t* out_top_ids = nullptr;           // [num_rows, max_top]; -1 past the last one found
  float* out_top_logprobs = nullptr;        // [num_rows, max_top]
};

// Samples every row; asynchronous on `stream`. Throws (CUDA_CHECK) when the launch fails.
void sample_rows(const sampling_kernel_args& a, cudaStream_t stream);

}  // namespace tessera::gpu
