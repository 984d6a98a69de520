// The CPU executor: runs LLaMA-family models over their stored (quantized) weights with SIMD
// kernels and a persistent thread pool, reading a paged KV cache through per-sequence block tables.
// See docs/cpu_executor.md for the KV layout, threading and kernel dispatch.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "engine/executor.hpp"
#include "engine/model/model_config.hpp"
#include "engine/model/model_weights.hpp"

namespace tessera {

// Element type of the CPU executor's KV cache (docs/cpu_executor.md, "KV cache"). automatic is fp16 (half
// the bytes of fp32 for ~5e-4 relative error in K and V, llama.cpp's default too), except with
// dequantize_weights: that mode promises exact fp32 math, so its automatic KV is fp32. int8 (a scale per
// token and kv head) quarters the bytes.
enum class cpu_kv_dtype : uint8_t { automatic, fp32, fp16, bf16, int8 };
// "auto", "fp32", "fp16", "bf16", "int8"; nullopt for anything else.
std::optional<cpu_kv_dtype> parse_cpu_kv_dtype(std::string_view name);
const char* to_string(cpu_kv_dtype d);  // the names parse accepts
// automatic -> fp16, or fp32 when the weights are dequantized (exact mode); anything else unchanged.
cpu_kv_dtype resolve(cpu_kv_dtype d, bool dequantize_weights = false);

struct cpu_executor_options {
  int num_threads = 0;  // 0: hardware concurrency
  kv_cache_spec kv;
  cpu_kv_dtype kv_dtype = cpu_kv_dtype::automatic;
  // Kernel table by name ("scalar", "avx2", "avxvnni", "avx512vnni"); empty: the fastest this
  // CPU supports (or $TESSERA_CPU_KERNELS). Throws invalid_request when unknown/unsupported.
  std::string kernels;
  // Dequantize every weight matrix to f32 at load and run the f32 path (no activation
  // quantization): matches an fp32 reference (transformers) to ~1e-4 at ~6x the weight memory and
  // several times the time. For parity tests and debugging; off for serving.
  bool dequantize_weights = false;
  // Repack the quantized matrices at load into 16-row panels (cpu/kernels.hpp, "packed weights": the
  // same bytes, rows interleaved) for the register-tiled kernels. Off (or $TESSERA_CPU_REPACK=0): the
  // kernels read the rows as stored in the file, without a copy.
  bool repack_weights = true;
  // Cut the KV blocks by layer groups (engine/model/kv_layer_groups.hpp: group_kv_layers) when the
  // model's layers differ in window (Gemma 2/3): a block then holds one group's layers, and every
  // slice carries one block table per group, so the engine frees the sliding layers' old blocks. Off:
  // a block holds every layer (the tables tests build by hand).
  bool kv_layer_groups = false;
};

// Throws load_error when the weights are inconsistent with their config, invalid_request when
// the options are unusable (block_size < 1, negative pool sizes).
std::unique_ptr<executor> make_cpu_executor(std::shared_ptr<const model_weights> weights,
                                            const cpu_executor_options& options);

// Bytes of one KV block of `block_size` positions (every layer's K and V tiles in `dtype`, or
// `layers_per_block` layers' with KV layer groups; automatic: fp16, so pass resolve(d,
// dequantize_weights) when sizing pools for an exact-mode executor).
int64_t cpu_kv_block_bytes(const model_config& config, int32_t block_size, cpu_kv_dtype dtype = cpu_kv_dtype::automatic,
                           int32_t layers_per_block = 0);

// How many such blocks fit in `bytes` (clamped to [0, INT32_MAX]).
int32_t kv_blocks_for_bytes(const model_config& config, int32_t block_size, int64_t bytes,
                            cpu_kv_dtype dtype = cpu_kv_dtype::automatic, int32_t layers_per_block = 0);

}  // namespace tessera
