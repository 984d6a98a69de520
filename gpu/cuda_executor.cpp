// The CUDA executor. One execute() = one batched forward pass over every token of the step, as in the
// CPU executor: a [T, hidden] activation matrix, so each weight matrix is read once per step.
//
// Per layer, on one stream:
//   add_rms_norm (x -> xn, GEMM input type)         gemm  qkv = xn Wqkv^T            (fp32 out)
//   rope_kv_write (+ Q/K/V bias, q/k norms; Q, K rotated; K, V -> cache)
//   paged_attention (decode rows) + prefill_attention (prompt-chunk rows) (-> attn; per-layer window,
//                                                    soft-capped scores)
//   gemm  x += attn Wo^T  (beta = 1: the residual add is the GEMM's epilogue)
//   add_rms_norm (x -> xn)   gemm gu = xn Wgu^T   silu_and_mul / gelu_tanh_and_mul (-> mlp)
//   gemm x += mlp Wdown^T
// Post-norm models (Gemma 2/3) write the O and down GEMMs to tmp instead and add them to x through
// post_norm_add_rms_norm, which also computes the next pre-norm (one launch, as add_rms_norm's).
// Then the final norm of only the rows whose logits are wanted, the LM head GEMM, the final soft-cap,
// the GPU sampler (gpu/sampling.hpp) over the rows the engine asked to sample here, and one copy of
// the tokens and of the remaining logits rows to pinned host memory (docs/gpu_executor.md).
// Embedding and prompt-logprob rows are read after the step from the activations it left (the final
// norm of the rows asked for; the LM head and the scoring reduction for scored prompt rows).
#include "gpu/cuda_executor.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/ggml_types.hpp"
#include "engine/model/rope.hpp"
#include "engine/model/weight_shapes.hpp"
#include "engine/prompt_logprobs.hpp"
#include "engine/step_layout.hpp"
#include "gpu/attention.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/fp8.hpp"
#include "gpu/gemv.hpp"
#include "gpu/kernels.hpp"
#include "gpu/op_profiler.hpp"
#include "gpu/prefill_attention.hpp"
#include "gpu/quantized_gemm.hpp"
#include "gpu/sampling.hpp"
#include "gpu/sampling_batch.hpp"

#define CUBLAS_CHECK(expr)                                                                                  \
  do {                                                                                                      \
    const cublasStatus_t tessera_cublas_status_ = (expr);                                                   \
    if (tessera_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      throw std::runtime_error(std::string("cuBLAS error ") + cublasGetStatusName(tessera_cublas_status_) + \
                               " in " #expr " at " __FILE__ ":" + std::to_string(__LINE__));                \
    }                                                                                                       \
  } while (0)

namespace tessera {
namespace {

using gpu::bf16;

// cudaMalloc'd memory, grown on demand (never shrunk). Growing synchronises the device first.
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  ~device_buffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_) {
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaFree(ptr_));
      ptr_ = nullptr;
      bytes_ = 0;
    }
    CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  template <class U>
  U* as() const {
    return static_cast<U*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// What identifies a device copy of weight rows: the host tensors it was made from and its layout.
struct weight_key {
  struct part {
    uintptr_t data = 0;
    int64_t rows = 0;
    int64_t row_stride_bytes = 0;
    int type = 0;
    auto operator<=>(const part&) const = default;
  };
  size_t element_bytes = 0;
  int64_t cols = 0;
  std::vector<part> parts;
  auto operator<=>(const weight_key&) const = default;

  // The key of a matrix made of `parts`' rows one after the other, `cols` wide; element_bytes 0: a
  // copy of GGUF blocks rather than of elements.
  static weight_key of(std::initializer_list<const weight_tensor*> parts, size_t element_bytes, int64_t cols) {
    weight_key key{element_bytes, cols, {}};
    for (const weight_tensor* w : parts) {
      key.parts.push_back(
          {reinterpret_cast<uintptr_t>(w->data), w->rows, w->row_stride_bytes, static_cast<int>(w->type)});
    }
    return key;
  }
  int64_t rows() const {
    int64_t n = 0;
    for (const part& p : parts) n += p.rows;
    return n;
  }
};

}  // namespace

class cuda_weight_cache {
 public:
  std::shared_ptr<const device_buffer> find(const weight_key& key) {
    std::lock_guard lock(mutex_);
    const auto it = copies_.find(key);
    return it == copies_.end() ? nullptr : it->second.lock();
  }
  void add(weight_key key, const std::shared_ptr<const device_buffer>& copy) {
    std::lock_guard lock(mutex_);
    copies_[std::move(key)] = copy;
  }

 private:
  std::mutex mutex_;
  // Weak: a copy is freed with the last executor that uses it, not kept alive by the cache.
  std::map<weight_key, std::weak_ptr<const device_buffer>> copies_;
};

std::shared_ptr<cuda_weight_cache> make_cuda_weight_cache() { return std::make_shared<cuda_weight_cache>(); }

namespace {

// Page-locked host memory: the copies from/to it are real asynchronous DMA.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_) {
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaFreeHost(ptr_));
      ptr_ = nullptr;
      bytes_ = 0;
    }
    CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault));
    bytes_ = bytes;
  }
  template <class U>
  U* as() const {
    return static_cast<U*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// One submitted step's results and what is needed to take them: two slots, used in turn, so the
// device writes step n+1's tokens and logits elsewhere than where the host reads step n's.
struct step_slot {
  step_output out;  // shaped by plan_step, filled by collect()
  gpu::sampling_batch sampling;
  std::vector<int32_t> device_sampled_seqs;
  pinned_buffer sample_out_host, logits_host;
  size_t logit_floats = 0;
  cudaEvent_t begin = nullptr, end = nullptr;
  bool collected = false;
  // step_batch::late_masks: the forward pass is queued, the mask upload and the sampling are not yet
  // (finish_late_sampling), the masks to come through masks_ready into masks_host.
  bool late_sampling = false;
  std::shared_future<void> masks_ready;
  pinned_buffer masks_host;
};

// A weight matrix on the device, [rows, cols] row-major: in the compute dtype, or (bf16 compute)
// GGUF blocks as the file has them, for the kernels of gpu/quantized_gemm.hpp.
struct gpu_matrix {
  const void* data = nullptr;
  std::optional<ggml_type> quantized;  // the blocks' type; empty: compute-dtype elements
  int64_t row_bytes = 0;               // quantized: bytes of a row
};

struct gpu_layer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* post_attn_norm = nullptr;  // post_norms, else null
  const float* post_ffn_norm = nullptr;
  const float* q_norm = nullptr;  // qk_norm, else null: [head_dim] each
  const float* k_norm = nullptr;
  const float* qkv_bias = nullptr;  // qkv_bias, else null: Q|K|V biases, as the fused GEMM's columns
  gpu_matrix qkv;                   // [q_dim + 2 kv_dim, hidden]
  gpu_matrix wo;                    // [hidden, q_dim]
  gpu_matrix gate_up;               // [2 ffn, hidden]
  gpu_matrix down;                  // [hidden, ffn]
  const float* inv_freq = nullptr;  // this layer's RoPE table (layers with equal tables share one)
  float attention_factor = 1.0f;
  int32_t window = 0;        // sliding window (0: full causal)
  int32_t window_class = 0;  // index into cuda_executor::window_classes_ (its split plans)
};

// Bytes of the per-token activation buffers for `tokens` tokens of elements of `elem` bytes
// (cuda_executor::reserve_tokens allocates them; cuda_co_resident_for counts them).
struct activation_bytes {
  size_t x = 0, xn = 0, qkv = 0, attn = 0, gu = 0, mlp = 0, tmp = 0;
  size_t total() const { return x + xn + qkv + attn + gu + mlp + tmp; }
};

activation_bytes activation_bytes_for(const model_config& c, size_t tokens, size_t elem) {
  const auto hidden = static_cast<size_t>(c.hidden_size);
  const size_t q_dim = static_cast<size_t>(c.num_heads) * static_cast<size_t>(c.head_dim);
  const size_t qkv_cols = q_dim + 2 * static_cast<size_t>(c.num_kv_heads) * static_cast<size_t>(c.head_dim);
  const auto ffn = static_cast<size_t>(c.intermediate_size);
  activation_bytes a;
  a.x = tokens * hidden * sizeof(float);
  a.xn = tokens * hidden * elem;
  a.qkv = tokens * qkv_cols * sizeof(float);
  a.attn = tokens * q_dim * elem;
  a.gu = tokens * 2 * ffn * sizeof(float);
  a.mlp = tokens * ffn * elem;
  if (c.features.post_norms) a.tmp = tokens * hidden * sizeof(float);
  return a;
}

// Device bytes of the logit rows' buffers for `rows` rows: the final norm's output and the fp32 logits
// (cuda_executor::reserve_logit_rows allocates them, and as many pinned host bytes as `logits`).
struct logit_row_bytes {
  size_t lx = 0, logits = 0;
  size_t total() const { return lx + logits; }
};

logit_row_bytes logit_row_bytes_for(const model_config& c, size_t rows, size_t elem) {
  return {rows * static_cast<size_t>(c.hidden_size) * elem, rows * static_cast<size_t>(c.vocab_size) * sizeof(float)};
}

// Bytes of one element of the compute dtype.
size_t element_bytes(cuda_dtype dtype) { return dtype == cuda_dtype::f32 ? 4 : 2; }
// Bytes of one KV cache element.
size_t kv_element_bytes(cuda_dtype dtype, cuda_kv_dtype kv) {
  return kv == cuda_kv_dtype::fp8_e4m3 ? sizeof(gpu::fp8_e4m3) : element_bytes(dtype);
}

// The per-tensor scale of an fp8 KV cache (K and V alike): 1, what vLLM uses when a checkpoint
// carries no calibrated k/v scales. E4M3 then keeps 3 mantissa bits down to 2^-6 (subnormals below)
// and saturates at |448|; post-RoPE K and V of LLaMA-family models stay far below that. The kernels
// take any scale (gpu/kernels.hpp); calibrated per-layer scales from a checkpoint are not read yet.
constexpr float kKvScale = 1.0f;

// Logit rows allocated up front: those of a full step, at most 256 (they grow when a step has more).
int32_t initial_logit_rows(int32_t max_num_batched_tokens) {
  return std::min(std::max(1, max_num_batched_tokens), 256);
}

// cuBLAS' fixed workspace (no allocation during a step; what graph capture needs).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// The weight matrices as upload_weights uploads them (a tied head once).
template <class F>
void for_each_matrix(const model_weights& w, F&& f) {
  f(w.token_embedding);
  if (!w.output.empty() && w.output.data != w.token_embedding.data) f(w.output);
  for (const layer_weights& l : w.layers)
    for (const weight_tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) f(*t);
}

// Whether a layer matrix made of `parts` stays in its GGUF blocks on the device: bf16 compute, a type
// gpu/quantized_gemm.hpp reads, the same type in every part (a fused Q|K|V of Q4_K and Q6_K parts is
// dequantised), rows at their natural stride.
bool keeps_quantized(std::initializer_list<const weight_tensor*> parts, int64_t cols, bool allowed) {
  if (!allowed) return false;
  const ggml_type type = (*parts.begin())->type;
  if (!gpu::quantized_gemm_supports(type)) return false;
  for (const weight_tensor* w : parts) {
    if (w->type != type || w->row_stride_bytes != row_bytes(type, cols)) return false;
  }
  return true;
}

// Device bytes of the uploaded weights: matrices in the compute dtype (layer matrices in their GGUF
// blocks where `quantized` keeps them so), vectors (norms, biases) in fp32, as upload_weights lays
// them out; less the matrices that are tensors of `shares_with`.
int64_t device_weight_bytes(const model_weights& w, size_t elem, bool quantized,
                            const model_weights* shares_with = nullptr) {
  std::set<const void*> shared;
  if (shares_with) for_each_matrix(*shares_with, [&](const weight_tensor& t) { shared.insert(t.data); });
  int64_t matrix_elems = 0, vector_elems = 0, block_bytes = 0, largest_blocks = 0;
  for_each_matrix(w, [&](const weight_tensor& t) {
    if (t.empty() || shared.contains(t.data)) return;
    const bool layer_matrix = t.data != w.token_embedding.data && t.data != w.output.data;
    if (layer_matrix && keeps_quantized({&t}, t.cols, quantized && elem == sizeof(uint16_t))) {
      block_bytes += t.rows * t.row_stride_bytes;
      largest_blocks = std::max(largest_blocks, t.rows * t.cols);
    } else {
      matrix_elems += t.rows * t.cols;
    }
  });
  // The bf16 scratch of the largest quantized matrix (a fused gate|up is two tensors: bounded by twice
  // the largest one).
  block_bytes += 2 * largest_blocks * static_cast<int64_t>(elem);
  auto vector = [&](const weight_tensor& t) { vector_elems += t.empty() ? 0 : t.rows * t.cols; };
  vector(w.output_norm);
  for (const layer_weights& l : w.layers) {
    for (const weight_tensor* t :
         {&l.attn_norm, &l.ffn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm})
      vector(*t);
  }
  return matrix_elems * static_cast<int64_t>(elem) + block_bytes + vector_elems * static_cast<int64_t>(sizeof(float));
}

// What the CUDA kernels still lack is refused at load by name rather than computed as another model.
// Every model_config feature runs (docs/models.md); what is left is the attention kernels' head sizes.
void refuse_unsupported_features(const model_config& c) {
  if (!gpu::attention_supports_head_dim(c.head_dim)) {
    throw load_error("cuda executor: " + std::string(to_string(c.architecture)) + " model needs head_dim " +
                     std::to_string(c.head_dim) +
                     ", which the CUDA executor does not implement yet (its attention kernels are compiled for "
                     "head_dim 32, 64, 128, 256; use --device cpu)");
  }
}

// T: weights, GEMM inputs and activations (float or bf16); C: the KV cache's element (T, or
// fp8_e4m3 under bf16 for --kv-cache-dtype fp8).
template <class T, class C = T>
class cuda_executor final : public executor {
 public:
  static constexpr bool is_bf16 = std::is_same_v<T, bf16>;
  static constexpr bool fp8_cache = std::is_same_v<C, gpu::fp8_e4m3>;
  static_assert(std::is_same_v<C, T> || (is_bf16 && fp8_cache), "an fp8 cache is for bf16 compute");
  // The prefill attention kernel its launches take (prefill_attention_args::tensor_cores left on).
  static constexpr gpu::prefill_kernel prefill_kind =
      is_bf16 ? gpu::prefill_kernel::tensor_cores : gpu::prefill_kernel::simt;

  cuda_executor(std::shared_ptr<const model_weights> weights, const cuda_executor_options& options)
      : weights_(std::move(weights)),
        spec_(options.kv),
        device_(options.device),
        use_graphs_(options.cuda_graphs),
        small_batch_gemm_rows_(options.small_batch_gemm_rows.value_or(gpu::small_batch_gemm_rows_from_env())),
        quantized_weights_(options.quantized_weights),
        int8_quantized_gemv_(options.int8_quantized_gemv.value_or(gpu::int8_quantized_gemv_from_env())),
        quantized_tiled_gemm_rows_(
            options.quantized_tiled_gemm_rows.value_or(gpu::quantized_tiled_gemm_rows_from_env())),
        prefill_min_tokens_(options.prefill_min_tokens.value_or(gpu::prefill_min_tokens_from_env())),
        decode_kernel_(!options.staged_decode_attention.has_value() ? gpu::decode_kernel_from_env()
                       : *options.staged_decode_attention           ? gpu::decode_kernel::staged_warp_tiles
                                                                    : gpu::decode_kernel::warp_tiles) {
    config_ = weights_->config;
    config_.validate();
    refuse_unsupported_features(config_);
    post_norms_ = config_.features.post_norms;
    if (spec_.block_size < 1 || spec_.num_device_blocks < 0 || spec_.num_host_blocks < 0) {
      throw invalid_request("cuda executor: bad kv_cache_spec");
    }
    if (quantized_tiled_gemm_rows_ < 0) throw invalid_request("cuda executor: quantized_tiled_gemm_rows must be >= 0");
    if (prefill_min_tokens_ < 1) throw invalid_request("cuda executor: prefill_min_tokens must be >= 1");
    if (small_batch_gemm_rows_ < 0 || small_batch_gemm_rows_ > gpu::kMaxGemvRows) {
      throw invalid_request("cuda executor: small_batch_gemm_rows must be in [0, " + std::to_string(gpu::kMaxGemvRows) +
                            "]");
    }
    if (decode_kernel_ == gpu::decode_kernel::staged_warp_tiles && !is_bf16) {
      throw invalid_request("cuda executor: the staged decode attention kernel (v3) needs bf16 compute");
    }
    if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0)) {
      throw invalid_request("cuda executor: --gpu-memory-utilization must be in (0, 1]");
    }
    groups_ = options.kv_layer_groups ? group_kv_layers(config_) : single_kv_group(config_);
    // A block holds one layer group's layers; a kernel's `layer` is the layer's slot in its group.
    layout_ = {groups_.layers_per_block, config_.num_kv_heads, spec_.block_size, config_.head_dim};
    prefill_tile_tokens_ =
        gpu::prefill_tile_tokens(prefill_kind, config_.head_dim, config_.num_heads, config_.num_kv_heads);
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
    count_attention_slots();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&swap_done_, cudaEventDisableTiming));
    for (step_slot& slot : step_slots_) {
      CUDA_CHECK(cudaEventCreate(&slot.begin));
      CUDA_CHECK(cudaEventCreate(&slot.end));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&inputs_read_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&stream_ready_, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // A fixed workspace keeps cuBLAS from allocating during a step (and is what graph capture needs).
    cublas_workspace_.reserve(kCublasWorkspaceBytes);
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.as<void>(), cublas_workspace_.bytes()));
    weight_cache_ = options.weight_cache;
    upload_weights();
    plan_layers();

    reserve_tokens(std::max(1, options.max_num_batched_tokens));
    // A step samples at most one row per token: growing it later would wait for the step in flight.
    sampled_ids_dev_.reserve(static_cast<size_t>(std::max(1, options.max_num_batched_tokens)) * sizeof(int32_t));
    reserve_logit_rows(initial_logit_rows(options.max_num_batched_tokens));

    block_bytes_ = layout_.block_elems() * static_cast<int64_t>(sizeof(C));
    if (spec_.num_device_blocks == 0) {
      size_t free_bytes = 0, total_bytes = 0;
      CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      // Budget: utilisation * total, minus what is in use already (weights, activations, context,
      // other processes), minus a reserve for buffers that grow later (logits of long prompts,
      // split-KV workspace), minus a co-resident draft model's weights and buffers; each block then
      // pays for the draft's block too.
      const double reserve = 512.0 * 1024 * 1024;
      const cuda_co_resident& other = options.co_resident;
      if (other.bytes < 0 || other.kv_block_bytes < 0) throw invalid_request("cuda executor: bad co_resident");
      const double budget = options.gpu_memory_utilization * static_cast<double>(total_bytes) -
                            static_cast<double>(total_bytes - free_bytes) - reserve - static_cast<double>(other.bytes);
      const double blocks = budget / static_cast<double>(block_bytes_ + other.kv_block_bytes);
      spec_.num_device_blocks =
          static_cast<int32_t>(std::clamp(blocks, 0.0, double(std::numeric_limits<int32_t>::max())));
      if (spec_.num_device_blocks < 1) {
        throw invalid_request(other.bytes > 0
                                  ? "cuda executor: no KV block fits in GPU memory after the weights of the "
                                    "model and its draft model (raise --gpu-memory-utilization)"
                                  : "cuda executor: no KV block fits in GPU memory after the weights "
                                    "(raise --gpu-memory-utilization)");
      }
    }
    // One block more than the engine sees: the padding tokens of graph-replayed steps write there.
    pad_block_ = spec_.num_device_blocks;
    kv_.reserve(static_cast<size_t>(block_bytes_) * (static_cast<size_t>(spec_.num_device_blocks) + 1));
    if (spec_.num_host_blocks > 0)
      host_pool_.reserve(static_cast<size_t>(block_bytes_) * static_cast<size_t>(spec_.num_host_blocks));
  }

  ~cuda_executor() override {
    cudaDeviceSynchronize();
    for (auto& g : graphs_) cudaGraphExecDestroy(g.exec);
    if (cublas_) cublasDestroy(cublas_);
    if (swap_done_) cudaEventDestroy(swap_done_);
    for (step_slot& slot : step_slots_) {
      if (slot.begin) cudaEventDestroy(slot.begin);
      if (slot.end) cudaEventDestroy(slot.end);
    }
    if (inputs_read_) cudaEventDestroy(inputs_read_);
    if (stream_ready_) cudaEventDestroy(stream_ready_);
    if (stream_) cudaStreamDestroy(stream_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
  }

  const model_config& config() const override { return config_; }
  const kv_cache_spec& kv_spec() const override { return spec_; }
  int64_t kv_block_bytes() const override { return block_bytes_; }
  kv_layer_groups kv_groups() const override { return groups_; }
  const char* name() const override { return "cuda"; }
  const char* kv_cache_dtype() const override { return fp8_cache ? "fp8_e4m3" : is_bf16 ? "bf16" : "fp32"; }
  double device_step_seconds() const override { return device_step_seconds_; }
  bool samples_on_device() const override { return true; }
  // Both attention kernels start their walk at the window's first key and index the block table
  // from there (gpu/attention.cu, gpu/prefill_attention.cu), and a step writes only its own tokens'
  // slots, so the freed (no_block) entries before a window are never read: the engine may free them.
  bool reads_only_window() const override { return true; }
  // Token trees: RoPE at each row's position (depth), K/V at its slot (rope_kv_write's positions and
  // slot_mapping), and paged_attention masks the tree rows that are not its ancestors.
  bool verifies_token_trees() const override { return true; }
  bool pools_hidden_states() const override { return true; }
  bool scores_prompts() const override { return true; }

  // Overlapped steps (docs/gpu_executor.md#overlapped-steps): a step is queued on the stream by
  // submit() and its results taken by wait(), so the engine plans the next step meanwhile. Not while
  // the per-op profiler times a step: its events belong to one step at a time.
  bool overlaps_steps() const override { return !profiler_.enabled(); }
  bool takes_late_masks() const override { return true; }

  void execute(const step_batch& batch, step_output& out) override {
    submit(batch);
    wait(out);
  }

  void submit(const step_batch& batch) override {
    if (submitted_.size() >= 2) throw std::logic_error("cuda executor: two steps are submitted and not waited for");
    CUDA_CHECK(cudaSetDevice(device_));
    // The previous step's sampling, if its masks came late: before anything of this step is planned
    // (planning may grow the sampling buffers that step's inputs are in) or queued (this step may
    // take its tokens).
    if (!submitted_.empty()) finish_late_sampling(step_slots_[submitted_.back()]);
    // The pinned input buffers are rewritten below: the previous step's uploads must have left them
    // (they are that step's first operations, so this is not a wait for its forward pass).
    CUDA_CHECK(cudaEventSynchronize(inputs_read_));
    step_slot& slot = step_slots_[next_slot_];
    plan_step(batch, slot.out);  // validates everything before the cache is touched
    CUDA_CHECK(cudaEventRecord(slot.begin, stream_));
    upload_metadata();
    // The grammar masks the engine's workers are still writing: uploaded after the forward pass is queued,
    // or, late, at the next submit() or wait() (step_batch::late_masks).
    const bool masks_later = !sampling_.empty() && sampling_.has_masks() && batch.masks_ready.valid();
    const bool masks_late = masks_later && batch.late_masks;
    if (!sampling_.empty()) {
      // Without the grammar masks when they come later (below): the host is about to write them.
      CUDA_CHECK(cudaMemcpyAsync(sample_in_dev_.as<void>(), sample_in_host_.as<void>(),
                                 masks_later ? sampling_.masks_offset() : sampling_.input_bytes(),
                                 cudaMemcpyHostToDevice, stream_));
    }
    if (!pending_tokens_.empty()) {
      // Tokens the previous step sampled, which the host has not seen yet, into this step's ids.
      gpu::take_sampled_tokens(meta_dev_.as<int32_t>() + meta_ids_.offset, meta_ptr(meta_pending_),
                               static_cast<int32_t>(pending_tokens_.size() / 2), sampled_ids_dev_.as<int32_t>(),
                               stream_);
    }
    const auto T_ = num_tokens_;
    const bool swaps = !batch.swap_in.empty() || !batch.swap_out.empty();
    if (swaps) {
      // Swaps on their own stream: they overlap with the embedding gather; the first kernel that
      // touches the cache waits for them. They wait for the previous step, which may still be running
      // (overlapped steps), so nothing is still reading or writing the blocks involved.
      CUDA_CHECK(cudaEventRecord(stream_ready_, stream_));
      CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, stream_ready_, 0));
      char* dev = kv_.as<char>();
      char* host = host_pool_.as<char>();
      const auto bytes = static_cast<size_t>(block_bytes_);
      for (const block_copy& c : batch.swap_in) {
        CUDA_CHECK(
            cudaMemcpyAsync(dev + bytes * c.dst, host + bytes * c.src, bytes, cudaMemcpyHostToDevice, copy_stream_));
      }
      for (const block_copy& c : batch.swap_out) {
        CUDA_CHECK(
            cudaMemcpyAsync(host + bytes * c.dst, dev + bytes * c.src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
      }
      CUDA_CHECK(cudaEventRecord(swap_done_, copy_stream_));
    }
    if (T_ > 0 && !graph_step_) {
      gpu::embedding_gather(x_.as<float>(), static_cast<const T*>(embedding_), meta_ptr(meta_ids_), T_,
                            config_.hidden_size, config_.vocab_size, stream_, embed_scale());
    }
    if (swaps) CUDA_CHECK(cudaStreamWaitEvent(stream_, swap_done_, 0));
    if (!batch.copies.empty()) {
      gpu::block_copy(kv_.as<void>(), block_bytes_, meta_ptr(meta_copies_), static_cast<int32_t>(batch.copies.size()),
                      stream_);
    }
    if (!masks_later || masks_late) CUDA_CHECK(cudaEventRecord(inputs_read_, stream_));
    if (graph_step_) {
      CUDA_CHECK(cudaGraphLaunch(graph_for_step(), stream_));
    } else if (T_ > 0) {
      profiler_.begin(stream_, num_prefill_tokens_ == 0 && batch.seqs.size() == static_cast<size_t>(T_));
      forward();
    }
    if (masks_later && !masks_late) {
      // The GPU runs the forward pass meanwhile: waiting here for the grammar workers costs the step
      // nothing unless the masks take longer than the forward pass. Then one more small upload, queued
      // behind the forward pass on the same stream.
      batch.masks_ready.wait();
      sampling_.pack_masks(sample_in_host_.as<void>());
      CUDA_CHECK(cudaMemcpyAsync(sample_in_dev_.as<char>() + sampling_.masks_offset(),
                                 sample_in_host_.as<char>() + sampling_.masks_offset(), sampling_.masks_bytes(),
                                 cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaEventRecord(inputs_read_, stream_));
    }
    slot.logit_floats = slot.out.logits.size();  // the host-sampled rows, which come first
    if (slot.logit_floats > 0) {
      slot.logits_host.reserve(slot.logit_floats * sizeof(float));
      CUDA_CHECK(cudaMemcpyAsync(slot.logits_host.as<float>(), logits_.as<float>(), slot.logit_floats * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
    }
    slot.late_sampling = masks_late;
    slot.masks_ready = masks_late ? batch.masks_ready : std::shared_future<void>();
    if (!masks_late) {
      queue_sampling(slot, sampling_);
      if (!graph_step_ && T_ > 0) profiler_.mark(stream_, "sampling + copies");
      CUDA_CHECK(cudaEventRecord(slot.end, stream_));
    }
    // What wait() needs of this step once the next one is planned.
    std::swap(slot.sampling, sampling_);
    slot.device_sampled_seqs.assign(step_layout_.device_sampled_seqs.begin(), step_layout_.device_sampled_seqs.end());
    sampled_row_of_seq_.assign(batch.seqs.size(), -1);
    for (size_t j = 0; j < slot.device_sampled_seqs.size(); ++j)
      sampled_row_of_seq_[static_cast<size_t>(slot.device_sampled_seqs[j])] = static_cast<int32_t>(j);
    slot.collected = false;
    submitted_.push_back(next_slot_);
    next_slot_ ^= 1;
    if (!step_layout_.pooled_seqs.empty() || !step_layout_.scored_tokens.empty()) {
      // Embedding and scored prompt rows are read from this step's activations, which the next step
      // overwrites: such a step is finished here (with late masks, its forward pass: the sampling and
      // collect() come at wait()).
      if (slot.late_sampling) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
      } else {
        collect(slot);
      }
      if (!step_layout_.pooled_seqs.empty()) pool_hidden_states(batch, slot.out);
      if (!step_layout_.scored_tokens.empty()) score_prompt_rows(slot.out);
    }
  }

  void wait(step_output& out) override {
    if (submitted_.empty()) throw std::logic_error("cuda executor: wait() without a submitted step");
    step_slot& slot = step_slots_[submitted_.front()];
    submitted_.pop_front();
    finish_late_sampling(slot);
    if (!slot.collected) collect(slot);
    std::swap(out, slot.out);
  }

 private:
  // ---- weights ---------------------------------------------------------------------------------

  // The rows of `parts` one after the other, as one [sum of rows, cols] matrix of T.
  // pre: check_weight_shapes accepted them (present, `cols` wide, a decodable type).
  // With a weight cache, rows another executor uploaded already are that executor's copy.
  const void* upload(std::initializer_list<const weight_tensor*> parts, int64_t cols) {
    weight_key key = weight_key::of(parts, sizeof(T), cols);
    const int64_t rows = key.rows();
    if (weight_cache_) {
      if (std::shared_ptr<const device_buffer> copy = weight_cache_->find(key)) {
        matrices_.push_back(copy);
        return copy->as<void>();
      }
    }
    auto shared = std::make_shared<device_buffer>();
    device_buffer& buf = *shared;
    buf.reserve(static_cast<size_t>(rows * cols) * sizeof(T));
    // Host staging in the device element's bits (bf16 as uint16_t: __nv_bfloat16 is not trivially copyable).
    using host_t = std::conditional_t<is_bf16, uint16_t, float>;
    std::vector<host_t> host;
    std::vector<float> row;
    int64_t row0 = 0;
    for (const weight_tensor* w : parts) {
      T* dst = buf.as<T>() + row0 * cols;
      const bool same_type = (is_bf16 && w->type == ggml_type::bf16) || (!is_bf16 && w->type == ggml_type::f32);
      if (same_type && w->row_stride_bytes == cols * static_cast<int64_t>(sizeof(T))) {
        CUDA_CHECK(
            cudaMemcpy(dst, w->data, static_cast<size_t>(w->rows * w->row_stride_bytes), cudaMemcpyHostToDevice));
      } else {
        host.resize(static_cast<size_t>(w->rows * cols));
        row.resize(static_cast<size_t>(cols));
        for (int64_t r = 0; r < w->rows; ++r) {
          dequantize_row(w->type, w->row(r), row.data(), cols);
          host_t* h = host.data() + r * cols;
          if constexpr (is_bf16) {
            for (int64_t c = 0; c < cols; ++c) h[c] = fp32_to_bf16(row[static_cast<size_t>(c)]);
          } else {
            std::memcpy(h, row.data(), static_cast<size_t>(cols) * sizeof(float));
          }
        }
        CUDA_CHECK(cudaMemcpy(dst, host.data(), host.size() * sizeof(host_t), cudaMemcpyHostToDevice));
      }
      row0 += w->rows;
    }
    if (weight_cache_) weight_cache_->add(std::move(key), shared);
    matrices_.push_back(std::move(shared));
    return buf.as<void>();
  }

  // A layer matrix: its GGUF blocks copied as they are when keeps_quantized says so (the parts' rows
  // one after the other, as upload() does with elements), else upload()'s compute-dtype copy. The
  // scratch that dequantize_rows_to_bf16 fills for steps of many rows grows to the largest such matrix,
  // the int8 path's activations to the widest input of kMaxQuantizedGemvRows rows.
  gpu_matrix upload_matrix(std::initializer_list<const weight_tensor*> parts, int64_t cols) {
    if (!keeps_quantized(parts, cols, quantized_weights_ && is_bf16)) return {upload(parts, cols), std::nullopt, 0};
    const ggml_type type = (*parts.begin())->type;
    const int64_t rb = row_bytes(type, cols);
    weight_key key = weight_key::of(parts, 0, cols);
    const int64_t rows = key.rows();
    dequant_scratch_.reserve(static_cast<size_t>(rows * cols) * sizeof(T));
    if (int8_quantized_gemv_) {
      int8_act_.reserve(static_cast<size_t>(gpu::int8_activation_bytes(type, gpu::kMaxQuantizedGemvRows, cols)));
    }
    std::shared_ptr<const device_buffer> copy = weight_cache_ ? weight_cache_->find(key) : nullptr;
    if (!copy) {
      auto fresh = std::make_shared<device_buffer>();
      fresh->reserve(static_cast<size_t>(rows * rb));
      int64_t row0 = 0;
      for (const weight_tensor* w : parts) {
        CUDA_CHECK(cudaMemcpy(fresh->as<char>() + row0 * rb, w->data, static_cast<size_t>(w->rows * rb),
                              cudaMemcpyHostToDevice));
        row0 += w->rows;
      }
      if (weight_cache_) weight_cache_->add(std::move(key), fresh);
      copy = std::move(fresh);
    }
    matrices_.push_back(copy);
    return {copy->as<void>(), type, rb};
  }

  // Vectors (norm weights, biases) in fp32, one after the other.
  const float* upload_vector(std::initializer_list<const weight_tensor*> parts, bool is_norm) {
    std::vector<float> v;
    for (const weight_tensor* w : parts) {
      const size_t at = v.size();
      v.resize(at + static_cast<size_t>(w->rows * w->cols));
      for (int64_t r = 0; r < w->rows; ++r) dequantize_row(w->type, w->row(r), v.data() + at + r * w->cols, w->cols);
    }
    // Gemma's checkpoints store w for x * (1 + w) (transformers GemmaRMSNorm, 1 + w in fp32): the
    // multiplier the kernels take, as the CPU executor's to_norm_multiplier.
    if (is_norm && config_.features.norm == norm_kind::rms_one_plus) {
      for (float& x : v) x = 1.0f + x;
    }
    return upload_floats(v);
  }

  const float* upload_floats(const std::vector<float>& v) {
    device_buffer buf;
    buf.reserve(v.size() * sizeof(float));
    CUDA_CHECK(cudaMemcpy(buf.as<float>(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    const float* p = buf.as<float>();
    weight_buffers_.push_back(std::move(buf));
    return p;
  }

  void upload_weights() {
    const model_weights& w = *weights_;
    check_weight_shapes(w, "cuda");  // every tensor, before anything is uploaded
    const int64_t hidden = config_.hidden_size;
    const int64_t q_dim = static_cast<int64_t>(config_.num_heads) * config_.head_dim;
    const int64_t ffn = config_.intermediate_size;
    const model_features& f = config_.features;
    embedding_ = upload({&w.token_embedding}, hidden);
    for (const layer_weights& lw : w.layers) {
      gpu_layer g;
      g.attn_norm = upload_vector({&lw.attn_norm}, true);
      g.ffn_norm = upload_vector({&lw.ffn_norm}, true);
      if (f.post_norms) {
        g.post_attn_norm = upload_vector({&lw.post_attn_norm}, true);
        g.post_ffn_norm = upload_vector({&lw.post_ffn_norm}, true);
      }
      if (f.qk_norm) {
        g.q_norm = upload_vector({&lw.q_norm}, true);
        g.k_norm = upload_vector({&lw.k_norm}, true);
      }
      if (f.qkv_bias) g.qkv_bias = upload_vector({&lw.bq, &lw.bk, &lw.bv}, false);
      // Phi-3's fused qkv_proj / gate_up_proj arrive as row views of one tensor: uploaded the same way.
      g.qkv = upload_matrix({&lw.wq, &lw.wk, &lw.wv}, hidden);
      g.wo = upload_matrix({&lw.wo}, q_dim);
      g.gate_up = upload_matrix({&lw.w_gate, &lw.w_up}, hidden);
      g.down = upload_matrix({&lw.w_down}, ffn);
      layers_.push_back(g);
    }
    output_norm_ = upload_vector({&w.output_norm}, true);
    const weight_tensor& out = w.output.empty() ? w.token_embedding : w.output;
    if (out.data == w.token_embedding.data) {
      output_ = embedding_;  // tied: one copy on the GPU
    } else {
      output_ = upload({&out}, hidden);
    }
  }

  // Each layer's RoPE table (as the CPU executor computes them, so both rotate by the same angles:
  // per-layer bases and scaling, e.g. Gemma 3's local and global layers, and the llama3 / YaRN /
  // LongRoPE divisors and attention factors of engine/model/rope.hpp) and its window class: the
  // distinct sliding windows, each with its own split plans per step.
  void plan_layers() {
    std::vector<rope_table> tables;
    std::vector<const float*> uploaded;
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      gpu_layer& g = layers_[static_cast<size_t>(l)];
      rope_table table = rope_frequencies(config_, l);
      auto same = [&](const rope_table& t) {
        return t.inv_freq == table.inv_freq && t.attention_factor == table.attention_factor;
      };
      const auto it = std::find_if(tables.begin(), tables.end(), same);
      if (it == tables.end()) {
        uploaded.push_back(upload_floats(table.inv_freq));
        tables.push_back(std::move(table));
        g.inv_freq = uploaded.back();
        g.attention_factor = tables.back().attention_factor;
      } else {
        g.inv_freq = uploaded[static_cast<size_t>(it - tables.begin())];
        g.attention_factor = it->attention_factor;
      }
      g.window = config_.layer(l).sliding_window;
      const auto c = std::find(window_classes_.begin(), window_classes_.end(), g.window);
      g.window_class = static_cast<int32_t>(c - window_classes_.begin());
      if (c == window_classes_.end()) window_classes_.push_back(g.window);
    }
  }

  // ---- buffers ---------------------------------------------------------------------------------

  void reserve_tokens(int32_t n) {
    if (n <= cap_tokens_) return;
    const activation_bytes a = activation_bytes_for(config_, static_cast<size_t>(n), sizeof(T));
    x_.reserve(a.x);
    xn_.reserve(a.xn);
    qkv_.reserve(a.qkv);
    attn_.reserve(a.attn);
    gu_.reserve(a.gu);
    mlp_.reserve(a.mlp);
    if (a.tmp > 0) tmp_.reserve(a.tmp);
    cap_tokens_ = n;
  }

  void reserve_logit_rows(int32_t n) {
    if (n <= cap_rows_) return;
    const logit_row_bytes b = logit_row_bytes_for(config_, static_cast<size_t>(n), sizeof(T));
    lx_.reserve(b.lx);
    logits_.reserve(b.logits);
    for (step_slot& slot : step_slots_) slot.logits_host.reserve(b.logits);
    cap_rows_ = n;
  }

  // ---- overlapped steps ------------------------------------------------------------------------

  // Sampling on the device after the LM head (a replayed graph included), then the copies: only tokens
  // come back, and the sampled ids stay on the device for the next step.
  void queue_sampling(step_slot& slot, const gpu::sampling_batch& sampling) {
    if (sampling.empty()) return;
    gpu::sample_rows(sampling.kernel_args(sample_in_dev_.as<void>(), sample_out_dev_.as<void>(), logits_.as<float>(),
                                          config_.vocab_size, sample_work_.as<float>(), sampled_ids_dev_.as<int32_t>()),
                     stream_);
    slot.sample_out_host.reserve(sampling.output_bytes());
    CUDA_CHECK(cudaMemcpyAsync(slot.sample_out_host.as<void>(), sample_out_dev_.as<void>(), sampling.output_bytes(),
                               cudaMemcpyDeviceToHost, stream_));
    // The sampled ids stay on the device for the next step (sequence_slice::last_token_from): in a
    // buffer of their own, which the next step's sampler does not overwrite before it read them.
    // (Growing it synchronises, after this step's take_sampled_tokens read the old one.)
    sampled_ids_dev_.reserve(static_cast<size_t>(sampling.num_rows()) * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(sampled_ids_dev_.as<void>(), sample_out_dev_.as<char>() + sampling.tokens_offset(),
                               static_cast<size_t>(sampling.num_rows()) * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                               stream_));
  }

  // A step submitted with late masks (step_batch::late_masks), at the next submit() or wait(): the
  // engine has made its masks ready by then, so this does not block. They go up from a pinned buffer
  // of the step's own (the shared one holds the next step's inputs), behind its forward pass on the
  // stream and ahead of anything of the next step, whose ids may come from these samples.
  void finish_late_sampling(step_slot& slot) {
    if (!slot.late_sampling) return;
    slot.late_sampling = false;
    slot.masks_ready.wait();
    slot.masks_ready = {};
    slot.masks_host.reserve(slot.sampling.input_bytes());
    slot.sampling.pack_masks(slot.masks_host.as<void>());
    CUDA_CHECK(cudaMemcpyAsync(sample_in_dev_.as<char>() + slot.sampling.masks_offset(),
                               slot.masks_host.as<char>() + slot.sampling.masks_offset(), slot.sampling.masks_bytes(),
                               cudaMemcpyHostToDevice, stream_));
    queue_sampling(slot, slot.sampling);
    CUDA_CHECK(cudaEventRecord(slot.end, stream_));
  }

  // Waits for the slot's step and unpacks its tokens and logits rows into slot.out.
  void collect(step_slot& slot) {
    CUDA_CHECK(cudaEventSynchronize(slot.end));
    float step_ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&step_ms, slot.begin, slot.end));
    device_step_seconds_ += step_ms / 1e3;
    profiler_.end_step();
    if (slot.logit_floats > 0)
      std::memcpy(slot.out.logits.data(), slot.logits_host.as<float>(), slot.logit_floats * sizeof(float));
    if (!slot.sampling.empty()) {
      std::vector<sampled_token> sampled = slot.sampling.unpack_outputs(slot.sample_out_host.as<void>());
      for (size_t j = 0; j < sampled.size(); ++j)
        slot.out.sampled[static_cast<size_t>(slot.device_sampled_seqs[j])] = std::move(sampled[j]);
    }
    slot.collected = true;
  }

  // ---- step planning ---------------------------------------------------------------------------

  struct meta_range {
    size_t offset = 0;
  };

  const int32_t* meta_ptr(meta_range r) const { return meta_dev_.as<int32_t>() + r.offset; }

  void plan_step(const step_batch& batch, step_output& out) {
    check_block_moves(batch, spec_, "cuda");
    build_step_layout(batch, spec_, config_, /*samples_on_device=*/true, "cuda", step_layout_, out,
                      /*allow_trees=*/true, &groups_);

    // The uploaded per-token arrays: the layout's, copied (plan_prefill reorders them, pad_for_graph
    // appends padding tokens), and each token's cache slot and context length (the slot's position + 1:
    // a token tree's row writes and reads up to its own slot, above its position).
    const int32_t bs = spec_.block_size;
    ids_.assign(step_layout_.token_ids.begin(), step_layout_.token_ids.end());
    positions_.assign(step_layout_.positions.begin(), step_layout_.positions.end());
    token_seq_.assign(step_layout_.token_seq.begin(), step_layout_.token_seq.end());
    slots_.resize(static_cast<size_t>(groups_.num_groups()));
    for (std::vector<int32_t>& group_slots : slots_) group_slots.clear();
    context_.clear();
    for (size_t t = 0; t < positions_.size(); ++t) {
      const int32_t at = step_layout_.slots[t];
      const sequence_slice& sl = batch.seqs[static_cast<size_t>(token_seq_[t])];
      for (int32_t g = 0; g < groups_.num_groups(); ++g)
        slots_[static_cast<size_t>(g)].push_back(sl.table(g)[static_cast<size_t>(at / bs)] * bs + at % bs);
      context_.push_back(at + 1);
    }
    max_blocks_ = std::max(1, (step_layout_.max_context + bs - 1) / bs);  // the most blocks one sequence reads
    // Rows sampled on the device follow the rows returned to the host (gpu/sampling.hpp).
    logit_rows_.assign(step_layout_.logit_tokens.begin(), step_layout_.logit_tokens.end());
    sampling_.clear();
    for (size_t j = 0; j < step_layout_.device_sampled_seqs.size(); ++j) {
      const sequence_slice& sl = batch.seqs[static_cast<size_t>(step_layout_.device_sampled_seqs[j])];
      sampling_.add(*sl.sampling, static_cast<int32_t>(logit_rows_.size()),
                    sl.sampling->counts_last_token ? previous_sample_row(sl.last_token_from) : -1);
      logit_rows_.push_back(step_layout_.device_sampled_tokens[j]);
    }
    graph_step_ = use_graphs_ && graph_eligible(batch);
    plan_prefill(batch);
    plan_trees(batch);
    if (graph_step_) pad_for_graph(batch.seqs.size());
    plan_pending_tokens(batch);
    num_tokens_ = static_cast<int32_t>(ids_.size());
    num_logit_rows_ = static_cast<int32_t>(logit_rows_.size());

    // Every int32 array of the step in one pinned buffer, uploaded with one copy.
    size_t off = 0;
    auto place = [&](size_t n) {
      meta_range r{off};
      off += (n + 31) / 32 * 32;  // 128-byte aligned sub-arrays
      return r;
    };
    const size_t T_ = ids_.size();
    meta_ids_ = place(T_);
    meta_positions_ = place(T_);
    meta_slots_.clear();
    for (int32_t g = 0; g < groups_.num_groups(); ++g) meta_slots_.push_back(place(T_));
    meta_context_ = place(T_);
    meta_token_seq_ = place(T_);
    meta_logit_rows_ = place(logit_rows_.size());
    if (!graph_step_) num_table_rows_ = batch.seqs.size();
    meta_tables_.clear();
    for (int32_t g = 0; g < groups_.num_groups(); ++g)
      meta_tables_.push_back(place(num_table_rows_ * static_cast<size_t>(max_blocks_)));
    meta_copies_ = place(2 * batch.copies.size());
    meta_tiles_ = place(4 * prefill_tiles_.size());
    meta_tree_root_ = place(tree_root_.size());
    meta_tree_offset_ = place(tree_mask_offset_.size());
    meta_tree_mask_ = place(tree_mask_.size());
    meta_pending_ = place(pending_tokens_.size());  // last: a graph's captured offsets stay put
    meta_size_ = off;
    meta_host_.reserve(std::max<size_t>(off, 1) * sizeof(int32_t));
    int32_t* h = meta_host_.as<int32_t>();
    auto put = [&](meta_range r, const std::vector<int32_t>& v) { std::copy(v.begin(), v.end(), h + r.offset); };
    put(meta_ids_, ids_);
    put(meta_positions_, positions_);
    for (size_t g = 0; g < slots_.size(); ++g) put(meta_slots_[g], slots_[g]);
    put(meta_context_, context_);
    put(meta_token_seq_, token_seq_);
    put(meta_logit_rows_, logit_rows_);
    put(meta_tree_root_, tree_root_);
    put(meta_tree_offset_, tree_mask_offset_);
    put(meta_tree_mask_, tree_mask_);
    put(meta_pending_, pending_tokens_);
    for (int32_t g = 0; g < groups_.num_groups(); ++g) {
      for (size_t s = 0; s < num_table_rows_; ++s) {
        int32_t* row = h + meta_tables_[static_cast<size_t>(g)].offset + s * static_cast<size_t>(max_blocks_);
        if (s >= batch.seqs.size()) {  // a graph step's padding rows: every entry the padding block
          std::fill(row, row + max_blocks_, pad_block_);
          continue;
        }
        const auto& table = batch.seqs[s].table(g);
        const size_t n = std::min(table.size(), static_cast<size_t>(max_blocks_));
        std::copy(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(n), row);
        std::fill(row + n, row + max_blocks_, 0);
      }
    }
    for (size_t c = 0; c < batch.copies.size(); ++c) {
      h[meta_copies_.offset + 2 * c] = batch.copies[c].src;
      h[meta_copies_.offset + 2 * c + 1] = batch.copies[c].dst;
    }
    if (!prefill_tiles_.empty()) {
      std::memcpy(h + meta_tiles_.offset, prefill_tiles_.data(), prefill_tiles_.size() * sizeof(gpu::prefill_tile));
    }

    reserve_tokens(num_tokens_);
    reserve_logit_rows(num_logit_rows_);
    if (!sampling_.empty()) {
      sample_in_host_.reserve(sampling_.input_bytes());
      // The grammar masks are packed after the forward pass is launched (execute()): the engine's
      // grammar workers are still writing them now.
      sampling_.pack_inputs(sample_in_host_.as<void>(), /*with_masks=*/!batch.masks_ready.valid());
      sample_in_dev_.reserve(sampling_.input_bytes());
      sample_out_dev_.reserve(sampling_.output_bytes());
      sample_out_host_.reserve(sampling_.output_bytes());
      sample_work_.reserve(static_cast<size_t>(sampling_.num_rows()) * static_cast<size_t>(config_.vocab_size) *
                           sizeof(float));
    }
    // A graph's kernels are fixed at capture: plan its split for the widest context its block tables
    // allow (shorter contexts leave partitions empty, which the combine step skips). One plan per
    // window class: a sliding-window layer's queries walk at most `window` positions, so it splits less
    // (or not at all) where the full-attention layers of the same step split.
    const int32_t widest_context = graph_step_ ? max_blocks_ * spec_.block_size : step_layout_.max_context;
    const size_t classes = window_classes_.size();
    split_.assign(classes, gpu::split_plan{});
    prefill_split_.assign(classes, gpu::split_plan{});
    int64_t workspace = 0;
    for (size_t c = 0; c < classes; ++c) {
      const int32_t window = window_classes_[c];
      // A tree row walks from its position's window to its slot, tree_lag_ further.
      const int32_t walk = window > 0 ? std::min(widest_context, window + tree_lag_) : widest_context;
      split_[c] = gpu::plan_attention_split(num_tokens_ - num_prefill_tokens_, config_.num_heads, config_.num_kv_heads,
                                            walk, decode_slots_);
      if (split_[c].num_splits > 1) {
        reserve_split_counters(static_cast<int64_t>(num_tokens_) * config_.num_heads);
        workspace = std::max(workspace, gpu::attention_workspace_floats(num_tokens_, config_.num_heads,
                                                                        config_.head_dim, split_[c].num_splits));
      }
      // The prefill kernel runs after paged_attention on the same stream: it reuses the workspace. A
      // tile reads from its lowest position's window start (0 without a window) to its last row's
      // slot; in a token tree that position is at most tree_lag_ below the first row's slot.
      int32_t prefill_walk = 0;
      for (const gpu::prefill_tile& t : prefill_tiles_) {
        const int32_t begin = window > 0 ? std::max(0, t.first_position - tree_lag_ - window + 1) : 0;
        prefill_walk = std::max(prefill_walk, t.first_position + t.num_tokens - begin);
      }
      prefill_split_[c] = gpu::plan_prefill_split(
          prefill_kind, static_cast<int32_t>(prefill_tiles_.size()), config_.head_dim, config_.num_heads,
          config_.num_kv_heads, prefill_walk, tree_root_.empty() ? prefill_slots_ : tree_prefill_slots_);
      if (prefill_split_[c].num_splits > 1) {
        reserve_split_counters(std::min<int64_t>(static_cast<int64_t>(prefill_tiles_.size()), 65535) *
                               config_.num_heads);
        workspace = std::max(workspace, gpu::prefill_workspace_floats(static_cast<int32_t>(prefill_tiles_.size()),
                                                                      prefill_tile_tokens_, config_.num_heads,
                                                                      config_.head_dim, prefill_split_[c].num_splits));
      }
    }
    if (workspace > 0) attn_workspace_.reserve(static_cast<size_t>(workspace) * sizeof(float));
  }

  // Slices whose last token the previous submitted step sampled here (sequence_slice::last_token_from):
  // pairs (device row of that token, its row in sampled_ids_dev_). Checked before anything is queued.
  void plan_pending_tokens(const step_batch& batch) {
    pending_tokens_.clear();
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const int32_t from = batch.seqs[s].last_token_from;
      if (from < 0) continue;
      if (!batch.seqs[s].tree_parents.empty()) throw invalid_request("cuda executor: last_token_from in a token tree");
      const step_layout::sequence_rows rows = step_layout_.seqs[s];
      pending_tokens_.push_back(device_row(rows.token_begin + rows.num_tokens - 1));
      pending_tokens_.push_back(previous_sample_row(from));
    }
  }

  // The row of sampled_ids_dev_ holding the token the previous step sampled for its sequence `from`.
  int32_t previous_sample_row(int32_t from) const {
    if (from < 0 || static_cast<size_t>(from) >= sampled_row_of_seq_.size() ||
        sampled_row_of_seq_[static_cast<size_t>(from)] < 0) {
      throw invalid_request("cuda executor: last_token_from " + std::to_string(from) +
                            " names no token the previous step sampled on the device");
    }
    return sampled_row_of_seq_[static_cast<size_t>(from)];
  }

  // A wave of each attention kernel this executor launches (its split plans fill one): the kernels
  // are chosen by the layout, the head counts and the types, so this is known before any step.
  void count_attention_slots() {
    gpu::paged_attention_args<T, C> decode;
    decode.layout = layout_;
    decode.num_heads = config_.num_heads;
    decode.kernel = decode_kernel_;
    decode_slots_ = {num_sms_, gpu::paged_attention_ctas_per_sm(decode)};
    gpu::prefill_attention_args<T, C> prefill;
    prefill.layout = layout_;
    prefill.num_heads = config_.num_heads;
    prefill_slots_ = {num_sms_, gpu::prefill_attention_ctas_per_sm(prefill, /*with_trees=*/false)};
    tree_prefill_slots_ = {num_sms_, gpu::prefill_attention_ctas_per_sm(prefill, /*with_trees=*/true)};
  }

  // paged_attention_args::split_counters: zero when allocated, and the kernels leave them zero.
  void reserve_split_counters(int64_t n) {
    const auto bytes = static_cast<size_t>(n) * sizeof(int32_t);
    if (bytes <= split_counters_.bytes()) return;
    split_counters_.reserve(bytes);
    CUDA_CHECK(cudaMemsetAsync(split_counters_.as<void>(), 0, bytes, stream_));
  }

  // Sequences bringing at least prefill_min_tokens_ new tokens (prompt chunks; 4 unless set) take the
  // tiled prefill kernel; the others (decode) paged_attention, whose one CTA per token and split-KV
  // keep a long context busy when there are few queries. (A threshold to tune on the H200.) The
  // prefill tokens are moved after the decode tokens, so paged_attention runs over the contiguous rows
  // [0, num_tokens_ - num_prefill_tokens_); logit_rows_ follows the move, so the logits keep the
  // batch's order. A graph step is left as it is: its kernels and their tiles are fixed at capture.
  // A token tree of as many rows is a chunk too: its tiles read the context once for all their rows,
  // where paged_attention would read it once per row, and mask the tree's slots (plan_trees).
  void plan_prefill(const step_batch& batch) {
    prefill_tiles_.clear();
    num_prefill_tokens_ = 0;
    if (graph_step_) return;
    const auto min_tokens = static_cast<size_t>(prefill_min_tokens_);
    const auto is_prefill = [min_tokens](const sequence_slice& sl) { return sl.tokens.size() >= min_tokens; };
    if (std::none_of(batch.seqs.begin(), batch.seqs.end(), is_prefill)) return;
    // row_order_[new row] = row plan_step gave the token (sequence by sequence): decode rows, then prefill.
    row_order_.clear();
    prefill_chunks_.clear();
    for (const bool prefill : {false, true}) {
      int32_t row = 0;
      for (size_t s = 0; s < batch.seqs.size(); ++s) {
        const sequence_slice& sl = batch.seqs[s];
        const auto n = static_cast<int32_t>(sl.tokens.size());
        if (is_prefill(sl) == prefill) {
          if (prefill)
            prefill_chunks_.push_back(
                {static_cast<int32_t>(row_order_.size()), n, sl.num_computed, static_cast<int32_t>(s)});
          for (int32_t i = 0; i < n; ++i) row_order_.push_back(row + i);
        }
        row += n;
      }
    }
    const size_t T_ = row_order_.size();
    auto reorder = [&](std::vector<int32_t>& v) {
      row_scratch_.assign(v.begin(), v.end());
      for (size_t r = 0; r < T_; ++r) v[r] = row_scratch_[static_cast<size_t>(row_order_[r])];
    };
    for (std::vector<int32_t>* v : {&ids_, &positions_, &context_, &token_seq_}) reorder(*v);
    for (std::vector<int32_t>& group_slots : slots_) reorder(group_slots);
    row_scratch_.resize(T_);
    for (size_t r = 0; r < T_; ++r) row_scratch_[static_cast<size_t>(row_order_[r])] = static_cast<int32_t>(r);
    for (int32_t& r : logit_rows_) r = row_scratch_[static_cast<size_t>(r)];
    for (const gpu::prefill_tile& c : prefill_chunks_) num_prefill_tokens_ += c.num_tokens;
    prefill_tiles_ = gpu::plan_prefill_tiles(prefill_chunks_, prefill_tile_tokens_);
  }

  // Token trees (sequence_slice::tree_parents), after plan_prefill has placed the rows: per token its
  // tree's root row (-1 outside a tree) and where its ancestor bits start; each tree row's bits (the
  // layout's ancestor sets, a 32-bit word per 32 rows). Empty when no slice of the step is a tree.
  void plan_trees(const step_batch& batch) {
    tree_root_.clear();
    tree_mask_offset_.clear();
    tree_mask_.clear();
    tree_lag_ = 0;
    if (std::all_of(batch.seqs.begin(), batch.seqs.end(),
                    [](const sequence_slice& sl) { return sl.tree_parents.empty(); }))
      return;
    const size_t num_tokens = ids_.size();
    tree_root_.assign(num_tokens, -1);
    tree_mask_offset_.assign(num_tokens, 0);
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      if (batch.seqs[s].tree_parents.empty()) continue;
      const step_layout::sequence_rows rows = step_layout_.seqs[s];
      const int32_t root = device_row(rows.token_begin);  // a tree's rows stay consecutive (a chunk's do)
      const int32_t words = (rows.num_tokens + 31) / 32;
      for (int32_t q = 0; q < rows.num_tokens; ++q) {
        const auto t = static_cast<size_t>(root + q);
        tree_root_[t] = root;
        tree_mask_offset_[t] = static_cast<int32_t>(tree_mask_.size());
        tree_mask_.resize(tree_mask_.size() + static_cast<size_t>(words), 0);
        int32_t* bits = tree_mask_.data() + tree_mask_offset_[t];
        for (int32_t k = 0; k <= q; ++k) {
          if (step_layout_.sees(static_cast<int32_t>(s), q, k)) bits[k / 32] |= static_cast<int32_t>(1u << (k % 32));
        }
        tree_lag_ = std::max(tree_lag_, context_[t] - 1 - positions_[t]);
      }
    }
  }

  void upload_metadata() {
    if (meta_size_ == 0) return;
    meta_dev_.reserve(meta_size_ * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(meta_dev_.as<int32_t>(), meta_host_.as<int32_t>(), meta_size_ * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
  }

  // ---- CUDA graphs for decode steps ------------------------------------------------------------

  static constexpr int32_t kGraphBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

  // Decode only: every sequence brings one token and wants its last logits.
  bool graph_eligible(const step_batch& batch) const {
    if (batch.seqs.empty() || batch.seqs.size() > 256) return false;
    for (const sequence_slice& sl : batch.seqs) {
      if (sl.tokens.size() != 1 || sl.logits != sequence_slice::logits_mode::last) return false;
      // Embeddings and scored prompt rows are read from the step's activations after it (below).
      if (sl.hidden != sequence_slice::hidden_mode::none || !sl.prompt_targets.empty()) return false;
    }
    return true;
  }

  // Pads the step to its bucket: padding tokens (id 0, position 0, context 1) each read and write only
  // the padding block, through a table row of their own; block tables widened to a power of two.
  void pad_for_graph(size_t num_seqs) {
    int32_t bucket = 256;
    for (int32_t b : kGraphBuckets) {
      if (static_cast<size_t>(b) >= num_seqs) {
        bucket = b;
        break;
      }
    }
    int32_t width = 16;
    while (width < max_blocks_) width *= 2;
    max_blocks_ = width;
    for (auto s = static_cast<int32_t>(num_seqs); s < bucket; ++s) {
      ids_.push_back(0);
      positions_.push_back(0);
      for (std::vector<int32_t>& group_slots : slots_) group_slots.push_back(pad_block_ * spec_.block_size);
      context_.push_back(1);
      token_seq_.push_back(s);
      logit_rows_.push_back(s);
    }
    num_table_rows_ = static_cast<size_t>(bucket);
  }

  struct captured_graph {
    int32_t bucket = 0;
    int32_t width = 0;
    std::vector<const void*> buffers;  // the device pointers baked into it
    cudaGraphExec_t exec = nullptr;
  };

  std::vector<const void*> graph_buffers() const {
    return {x_.as<void>(),
            xn_.as<void>(),
            qkv_.as<void>(),
            attn_.as<void>(),
            gu_.as<void>(),
            mlp_.as<void>(),
            tmp_.as<void>(),
            lx_.as<void>(),
            logits_.as<void>(),
            attn_workspace_.as<void>(),
            split_counters_.as<void>(),
            meta_dev_.as<void>()};
  }

  // The graph for this step's (bucket, width), captured now if missing or if a buffer it uses moved.
  cudaGraphExec_t graph_for_step() {
    const std::vector<const void*> buffers = graph_buffers();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if (it->bucket != num_tokens_ || it->width != max_blocks_) continue;
      if (it->buffers == buffers) return it->exec;
      CUDA_CHECK(cudaGraphExecDestroy(it->exec));
      graphs_.erase(it);
      break;
    }
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      gpu::embedding_gather(x_.as<float>(), static_cast<const T*>(embedding_), meta_ptr(meta_ids_), num_tokens_,
                            config_.hidden_size, config_.vocab_size, stream_, embed_scale());
      forward();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    captured_graph g;
    g.bucket = num_tokens_;
    g.width = max_blocks_;
    g.buffers = buffers;
    const cudaError_t err = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(err);
    graphs_.push_back(g);
    return g.exec;
  }

  // ---- the forward pass ------------------------------------------------------------------------

  // out[rows, n] (row stride ldc) = (or +=) in[rows, k] . W[n, k]^T. cuBLAS is column-major: this is
  // out^T = W . in^T with W read transposed (its row-major [n, k] is a column-major [k, n]).
  // Steps of at most kMaxGemvRows rows can take gpu/gemv.hpp's weight-streaming kernel instead
  // (cuda_executor_options::small_batch_gemm_rows). A matrix kept in its GGUF blocks goes through
  // gpu/quantized_gemm.hpp: its own kernel for up to 8 rows (the float or the int8 path), the tiled
  // tensor-core kernel up to quantized_tiled_gemm_rows_, else dequantised to bf16 into a scratch buffer
  // for cuBLAS (prefill-sized steps, where weight bytes no longer bound the step).
  void gemm(const gpu_matrix& m, int64_t n, int64_t k, const T* in, int32_t rows, float* out, int64_t ldc,
            bool accumulate) {
    const void* w = m.data;
    if constexpr (is_bf16) {
      if (m.quantized) {
        if (rows <= gpu::kMaxQuantizedGemvRows) {
          if (int8_quantized_gemv_) {
            gpu::quantize_activations_int8(*m.quantized, in, rows, k, int8_act_.as<void>(), stream_);
            gpu::quantized_small_batch_gemm_int8(*m.quantized, w, m.row_bytes, n, k, int8_act_.as<void>(), rows, out,
                                                 ldc, accumulate, stream_);
          } else {
            gpu::quantized_small_batch_gemm(*m.quantized, w, m.row_bytes, n, k, in, rows, out, ldc, accumulate,
                                            stream_);
          }
          return;
        }
        if (rows <= quantized_tiled_gemm_rows_ && gpu::quantized_tiled_gemm_supports(*m.quantized, k)) {
          gpu::quantized_tiled_gemm(*m.quantized, w, m.row_bytes, n, k, in, rows, out, ldc, accumulate, stream_);
          return;
        }
        gpu::dequantize_rows_to_bf16(*m.quantized, w, m.row_bytes, n, k, dequant_scratch_.as<bf16>(), stream_);
        w = dequant_scratch_.as<void>();
      }
    }
    if (rows <= small_batch_gemm_rows_ && gpu::small_batch_gemm_supports(static_cast<const T*>(w), n, k, in, rows)) {
      gpu::small_batch_gemm(static_cast<const T*>(w), n, k, in, rows, out, ldc, accumulate, stream_);
      return;
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    constexpr cudaDataType_t type = is_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), rows, static_cast<int>(k), &alpha,
                              w, type, static_cast<int>(k), in, type, static_cast<int>(k), &beta, out, CUDA_R_32F,
                              static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // Gemma multiplies the embedding by sqrt(hidden) (in fp32 here, as the CPU executor).
  float embed_scale() const {
    return config_.features.scale_embedding ? std::sqrt(static_cast<float>(config_.hidden_size)) : 1.0f;
  }

  void forward() {
    const model_features& f = config_.features;
    const int32_t T_ = num_tokens_;
    const int32_t hidden = config_.hidden_size;
    const int32_t hd = config_.head_dim;
    const int64_t q_dim = static_cast<int64_t>(config_.num_heads) * hd;
    const int64_t qkv_cols = q_dim + 2 * static_cast<int64_t>(config_.num_kv_heads) * hd;
    const int64_t ffn = config_.intermediate_size;
    const float eps = config_.rms_norm_eps;
    float* x = x_.as<float>();
    T* xn = xn_.as<T>();
    float* qkv = qkv_.as<float>();
    T* attn = attn_.as<T>();
    float* gu = gu_.as<float>();
    T* mlp = mlp_.as<T>();
    float* tmp = tmp_.as<float>();  // post_norms: the O and down GEMMs' outputs before their norms
    C* kv = kv_.as<C>();

    gpu::rope_kv_args rope;
    rope.qkv = qkv;
    rope.qkv_stride = qkv_cols;
    rope.positions = meta_ptr(meta_positions_);
    rope.eps = eps;
    rope.num_tokens = T_;
    rope.num_heads = config_.num_heads;
    rope.rope_dims = config_.rope_dims;
    rope.interleaved_pairs = config_.rope == rope_style::interleaved;
    rope.layout = layout_;
    rope.k_scale = kKvScale;
    rope.v_scale = kKvScale;

    // The two attention launches share the matrices and the cache; each has its own split plan per
    // window class.
    gpu::paged_attention_common<T, C> common;
    common.out = attn;
    common.out_stride = q_dim;
    common.q = qkv;
    common.q_stride = qkv_cols;
    common.kv_cache = kv;
    common.k_scale = kKvScale;
    common.v_scale = kKvScale;
    common.layout = layout_;
    common.num_heads = config_.num_heads;
    common.max_blocks_per_seq = max_blocks_;
    // As the CPU executor: the model's scale (Gemma: query_pre_attn_scalar^-1/2), else 1/sqrt(head_dim).
    common.scale = f.attention_scale > 0.0f ? f.attention_scale : 1.0f / std::sqrt(static_cast<float>(hd));
    common.softcap = f.attn_softcap.cap;
    auto with_split = [&](const gpu::split_plan& plan, int32_t window) {
      gpu::paged_attention_common<T, C> c = common;
      c.window = window;
      c.num_splits = plan.num_splits;
      c.partition_size = plan.partition_size;
      c.workspace = plan.num_splits > 1 ? attn_workspace_.as<float>() : nullptr;
      return c;
    };

    gpu::paged_attention_args<T, C> att;
    att.kernel = decode_kernel_;
    att.num_tokens = T_ - num_prefill_tokens_;  // the decode rows; prefill rows follow them
    att.context_lens = meta_ptr(meta_context_);
    att.token_seq = meta_ptr(meta_token_seq_);
    if (!tree_root_.empty()) {
      att.tree.root = meta_ptr(meta_tree_root_);
      att.tree.positions = meta_ptr(meta_positions_);
      att.tree.mask_offset = meta_ptr(meta_tree_offset_);
      att.tree.mask = reinterpret_cast<const uint32_t*>(meta_ptr(meta_tree_mask_));
    }

    gpu::prefill_attention_args<T, C> pre;
    pre.tiles = reinterpret_cast<const gpu::prefill_tile*>(meta_ptr(meta_tiles_));
    pre.num_tiles = static_cast<int32_t>(prefill_tiles_.size());
    pre.tile_tokens = prefill_tile_tokens_;
    pre.tree = att.tree;

    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const gpu_layer& L = layers_[static_cast<size_t>(l)];
      // Post-norm models: the previous layer's post_norm_add_rms_norm has computed this norm.
      if (l == 0 || !post_norms_) {
        gpu::add_rms_norm(xn, x, nullptr, L.attn_norm, T_, hidden, eps, stream_);
        profiler_.mark(stream_, "rms_norm");
      }
      gemm(L.qkv, qkv_cols, hidden, xn, T_, qkv, qkv_cols, false);
      profiler_.mark(stream_, "gemm qkv");
      // The layer's K/V: its group's blocks (slot mapping and tables), at its slot in the group.
      const auto group = static_cast<size_t>(groups_.group_of(l));
      rope.slot_mapping = meta_ptr(meta_slots_[group]);
      common.block_tables = meta_ptr(meta_tables_[group]);
      rope.layer = groups_.slot_of(l);
      rope.inv_freq = L.inv_freq;
      rope.attention_factor = L.attention_factor;
      rope.bias = L.qkv_bias;
      rope.q_norm = L.q_norm;
      rope.k_norm = L.k_norm;
      gpu::rope_kv_write(rope, kv, stream_);
      profiler_.mark(stream_, "rope_kv_write");
      const auto wc = static_cast<size_t>(L.window_class);
      static_cast<gpu::paged_attention_common<T, C>&>(att) = with_split(split_[wc], L.window);
      att.split_counters = split_[wc].num_splits > 1 ? split_counters_.as<int32_t>() : nullptr;
      att.layer = groups_.slot_of(l);
      gpu::paged_attention(att, stream_);
      profiler_.mark(stream_, "attention decode");
      static_cast<gpu::paged_attention_common<T, C>&>(pre) = with_split(prefill_split_[wc], L.window);
      pre.split_counters = prefill_split_[wc].num_splits > 1 ? split_counters_.as<int32_t>() : nullptr;
      pre.layer = groups_.slot_of(l);
      gpu::prefill_attention(pre, stream_);
      profiler_.mark(stream_, "attention prefill");
      if (post_norms_) {
        gemm(L.wo, hidden, q_dim, attn, T_, tmp, hidden, false);
        profiler_.mark(stream_, "gemm o");
        gpu::post_norm_add_rms_norm(xn, x, tmp, L.post_attn_norm, L.ffn_norm, T_, hidden, eps, stream_);
        profiler_.mark(stream_, "post_norm + rms_norm");
      } else {
        gemm(L.wo, hidden, q_dim, attn, T_, x, hidden, true);
        profiler_.mark(stream_, "gemm o");
        gpu::add_rms_norm(xn, x, nullptr, L.ffn_norm, T_, hidden, eps, stream_);
        profiler_.mark(stream_, "rms_norm");
      }
      gemm(L.gate_up, 2 * ffn, hidden, xn, T_, gu, 2 * ffn, false);
      profiler_.mark(stream_, "gemm gate_up");
      if (f.activation == ffn_activation::gelu_tanh) {
        gpu::gelu_tanh_and_mul(mlp, gu, T_, static_cast<int32_t>(ffn), stream_);
        profiler_.mark(stream_, "gelu_tanh_and_mul");
      } else {
        gpu::silu_and_mul(mlp, gu, T_, static_cast<int32_t>(ffn), stream_);
        profiler_.mark(stream_, "silu_and_mul");
      }
      if (post_norms_) {
        gemm(L.down, hidden, ffn, mlp, T_, tmp, hidden, false);
        profiler_.mark(stream_, "gemm down");
        // The last layer's post-norm is added by the final norm, for the logits rows only.
        if (l + 1 < config_.num_layers) {
          gpu::post_norm_add_rms_norm(xn, x, tmp, L.post_ffn_norm, layers_[static_cast<size_t>(l) + 1].attn_norm, T_,
                                      hidden, eps, stream_);
          profiler_.mark(stream_, "post_norm + rms_norm");
        }
      } else {
        gemm(L.down, hidden, ffn, mlp, T_, x, hidden, true);
        profiler_.mark(stream_, "gemm down");
      }
    }
    if (num_logit_rows_ == 0) return;
    T* lx = lx_.as<T>();
    final_norm_rows(lx, meta_ptr(meta_logit_rows_), num_logit_rows_);
    profiler_.mark(stream_, "rms_norm");
    gemm({output_}, config_.vocab_size, hidden, lx, num_logit_rows_, logits_.as<float>(), config_.vocab_size, false);
    profiler_.mark(stream_, "gemm lm_head");
    if (f.final_softcap.on()) {  // before the GPU sampler and the copy to the host
      gpu::soft_cap(logits_.as<float>(), static_cast<int64_t>(num_logit_rows_) * config_.vocab_size,
                    f.final_softcap.cap, stream_);
      profiler_.mark(stream_, "soft_cap");
    }
  }

  // ---- embeddings and prompt logprobs (after the step) --------------------------------------------
  // Both read what the forward pass left on the device: x, the residual stream of every row (and, for
  // post-norm models, tmp, the last layer's down projection that only the final norm adds), through
  // the final norm of rms_norm_rows as the logits rows take it. A group of rows at a time, each group
  // waited for, so a 2,048-token chunk never holds its 2,048 logits rows at once.

  // The final norm of rows row_index[0, n) of x (device memory) into `out` ([n, hidden]): for post-norm
  // models with the last layer's post-normed down projection (tmp) added first, which the layer loop
  // leaves to this norm.
  template <class U>
  void final_norm_rows(U* out, const int32_t* row_index, int32_t n) {
    gpu::rms_norm_rows(out, x_.as<float>(), row_index, output_norm_, n, config_.hidden_size, config_.rms_norm_eps,
                       stream_, post_norms_ ? tmp_.as<float>() : nullptr,
                       post_norms_ ? layers_.back().post_ffn_norm : nullptr);
  }

  // The row of x that holds the layout's token row (plan_prefill moved the prompt-chunk rows last).
  int32_t device_row(int32_t layout_row) const {
    return num_prefill_tokens_ > 0 ? row_scratch_[static_cast<size_t>(layout_row)] : layout_row;
  }

  // The final norm of aux_rows_host_[0, n) (device rows) into `out` ([n, hidden] on the device).
  template <class U>
  void final_norm_of_aux_rows(U* out, int32_t n) {
    CUDA_CHECK(cudaMemcpyAsync(aux_rows_dev_.as<int32_t>(), aux_rows_host_.as<int32_t>(),
                               static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    final_norm_rows(out, aux_rows_dev_.as<int32_t>(), n);
  }

  void reserve_aux_rows(int32_t n) {
    aux_rows_host_.reserve(static_cast<size_t>(n) * sizeof(int32_t));
    aux_rows_dev_.reserve(static_cast<size_t>(n) * sizeof(int32_t));
  }

  // Embeddings (sequence_slice::hidden): each pooled sequence's final-normed rows in fp32, added up on
  // the host in row order for mean pooling (the CPU executor's order), or its last row.
  static constexpr int32_t kPoolRowsPerGroup = 512;

  void pool_hidden_states(const step_batch& batch, step_output& out) {
    const auto hidden = static_cast<size_t>(config_.hidden_size);
    std::vector<std::pair<int32_t, int32_t>> rows;  // (device row, index into pooled_seqs)
    for (size_t j = 0; j < step_layout_.pooled_seqs.size(); ++j) {
      const auto s = static_cast<size_t>(step_layout_.pooled_seqs[j]);
      const step_layout::sequence_rows& sr = step_layout_.seqs[s];
      const bool last_only = batch.seqs[s].hidden == sequence_slice::hidden_mode::last;
      for (int32_t t = last_only ? sr.token_begin + sr.num_tokens - 1 : sr.token_begin;
           t < sr.token_begin + sr.num_tokens; ++t) {
        rows.emplace_back(device_row(t), static_cast<int32_t>(j));
      }
    }
    const int32_t group = std::min(kPoolRowsPerGroup, static_cast<int32_t>(rows.size()));
    reserve_aux_rows(group);
    pooled_dev_.reserve(static_cast<size_t>(group) * hidden * sizeof(float));
    pooled_host_.reserve(static_cast<size_t>(group) * hidden * sizeof(float));
    for (size_t g0 = 0; g0 < rows.size(); g0 += static_cast<size_t>(group)) {
      const auto n = static_cast<int32_t>(std::min(rows.size() - g0, static_cast<size_t>(group)));
      for (int32_t r = 0; r < n; ++r) aux_rows_host_.as<int32_t>()[r] = rows[g0 + static_cast<size_t>(r)].first;
      final_norm_of_aux_rows(pooled_dev_.as<float>(), n);
      CUDA_CHECK(cudaMemcpyAsync(pooled_host_.as<float>(), pooled_dev_.as<float>(),
                                 static_cast<size_t>(n) * hidden * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (int32_t r = 0; r < n; ++r) {
        const float* row = pooled_host_.as<float>() + static_cast<size_t>(r) * hidden;
        float* dst = out.hidden.data() + static_cast<size_t>(rows[g0 + static_cast<size_t>(r)].second) * hidden;
        for (size_t d = 0; d < hidden; ++d) dst[d] += row[d];  // zeroed by build_step_layout
      }
    }
  }

  // Prompt logprobs (sequence_slice::prompt_targets): the scored rows' final norm, LM head and final
  // soft-cap on the device, a group at a time; each logits row is reduced on the host by
  // score_prompt_row (engine/prompt_logprobs.hpp), the CPU executor's reduction.
  int32_t score_rows_per_group() const {
    constexpr int64_t kScoreLogitsBytes = int64_t{64} << 20;
    const int64_t per_row = static_cast<int64_t>(config_.vocab_size) * static_cast<int64_t>(sizeof(float));
    return static_cast<int32_t>(std::clamp<int64_t>(kScoreLogitsBytes / per_row, 1, 256));
  }

  void score_prompt_rows(step_output& out) {
    const auto S = static_cast<int32_t>(step_layout_.scored_tokens.size());
    const int32_t group = std::min(score_rows_per_group(), S);
    const auto vocab = static_cast<size_t>(config_.vocab_size);
    reserve_aux_rows(group);
    score_x_.reserve(static_cast<size_t>(group) * static_cast<size_t>(config_.hidden_size) * sizeof(T));
    score_logits_.reserve(static_cast<size_t>(group) * vocab * sizeof(float));
    score_logits_host_.reserve(static_cast<size_t>(group) * vocab * sizeof(float));
    const softcap& cap = config_.features.final_softcap;
    for (int32_t g0 = 0; g0 < S; g0 += group) {
      const int32_t n = std::min(group, S - g0);
      for (int32_t r = 0; r < n; ++r) {
        aux_rows_host_.as<int32_t>()[r] = device_row(step_layout_.scored_tokens[static_cast<size_t>(g0 + r)]);
      }
      final_norm_of_aux_rows(score_x_.as<T>(), n);
      gemm({output_}, config_.vocab_size, config_.hidden_size, score_x_.as<T>(), n, score_logits_.as<float>(),
           config_.vocab_size, false);
      if (cap.on())
        gpu::soft_cap(score_logits_.as<float>(), static_cast<int64_t>(n) * config_.vocab_size, cap.cap, stream_);
      CUDA_CHECK(cudaMemcpyAsync(score_logits_host_.as<float>(), score_logits_.as<float>(),
                                 static_cast<size_t>(n) * vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (int32_t r = 0; r < n; ++r) {
        const auto at = static_cast<size_t>(g0 + r);
        out.prompt_logprobs[at] =
            score_prompt_row({score_logits_host_.as<float>() + static_cast<size_t>(r) * vocab, vocab},
                             step_layout_.scored_targets[at], step_layout_.scored_top_k[at]);
      }
    }
  }

  std::shared_ptr<const model_weights> weights_;
  model_config config_;
  kv_cache_spec spec_;
  int device_ = 0;
  int num_sms_ = 0;
  // One wave of each attention kernel (count_attention_slots): decode, prefill, prefill with trees.
  gpu::cta_slots decode_slots_, prefill_slots_, tree_prefill_slots_;
  gpu::kv_layout layout_;
  kv_layer_groups groups_;  // how the layers share blocks (one group of all, unless options.kv_layer_groups)
  int64_t block_bytes_ = 0;

  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t swap_done_ = nullptr;
  // Overlapped steps: the two result slots (the next one to fill), the submitted ones oldest first;
  // the last upload from the pinned inputs; the previous step's end, for the swap stream.
  step_slot step_slots_[2];
  int next_slot_ = 0;
  std::deque<int> submitted_;
  cudaEvent_t inputs_read_ = nullptr, stream_ready_ = nullptr;
  // The last submitted step's sampled ids, on the device, and per sequence of it its row there (-1:
  // not sampled on the device): what sequence_slice::last_token_from refers to.
  device_buffer sampled_ids_dev_;
  std::vector<int32_t> sampled_row_of_seq_;
  double device_step_seconds_ = 0.0;
  cublasHandle_t cublas_ = nullptr;
  device_buffer cublas_workspace_;
  gpu::op_profiler profiler_;  // TESSERA_CUDA_PROFILE=1

  std::vector<device_buffer> weight_buffers_;                   // vectors (norms, biases, RoPE tables)
  std::vector<std::shared_ptr<const device_buffer>> matrices_;  // with weight_cache_: maybe another's too
  std::shared_ptr<cuda_weight_cache> weight_cache_;
  std::vector<gpu_layer> layers_;
  const void* embedding_ = nullptr;
  const void* output_ = nullptr;   // the LM head (the embedding's copy when tied), in the compute dtype
  device_buffer dequant_scratch_;  // bf16 of the largest quantized matrix, for steps of many rows
  device_buffer int8_act_;         // a small step's rows quantised for the int8 path (its widest input)
  const float* output_norm_ = nullptr;
  bool post_norms_ = false;
  std::vector<int32_t> window_classes_;  // the layers' distinct sliding windows (0: full attention)

  device_buffer kv_;
  pinned_buffer host_pool_;

  int32_t cap_tokens_ = 0, cap_rows_ = 0;
  device_buffer x_, xn_, qkv_, attn_, gu_, mlp_, tmp_, lx_, logits_, attn_workspace_;
  device_buffer split_counters_;  // both attention kernels' fused split-KV merge (gpu/attention.hpp)
  // Sampling on the device: packed descriptors in, tokens and logprobs out, a scratch row per sequence.
  gpu::sampling_batch sampling_;
  pinned_buffer sample_in_host_, sample_out_host_;
  device_buffer sample_in_dev_, sample_out_dev_, sample_work_;

  bool use_graphs_ = false;
  int32_t small_batch_gemm_rows_ = 0;
  bool quantized_weights_ = true;          // cuda_executor_options::quantized_weights
  bool int8_quantized_gemv_ = false;       // cuda_executor_options::int8_quantized_gemv
  int32_t quantized_tiled_gemm_rows_ = 0;  // cuda_executor_options::quantized_tiled_gemm_rows
  int32_t prefill_min_tokens_ = 0;         // cuda_executor_options::prefill_min_tokens
  gpu::decode_kernel decode_kernel_;       // cuda_executor_options::staged_decode_attention
  int32_t pad_block_ = 0;
  std::vector<captured_graph> graphs_;

  // ---- per-step state --------------------------------------------------------------------------
  step_layout step_layout_;  // the validated, flattened batch (engine/step_layout.hpp)
  std::vector<int32_t> ids_, positions_, context_, token_seq_, logit_rows_;
  std::vector<std::vector<int32_t>> slots_;  // per KV layer group: each token's cache slot in its blocks
  int32_t num_tokens_ = 0, num_logit_rows_ = 0, max_blocks_ = 1;
  bool graph_step_ = false;                     // this step replays a captured graph (padded to its bucket)
  size_t num_table_rows_ = 0;                   // block-table rows uploaded (sequences, plus padding rows)
  std::vector<gpu::split_plan> split_;          // per window class: decode rows
  std::vector<gpu::split_plan> prefill_split_;  // per window class: prefill tiles
  int32_t prefill_tile_tokens_ = 0;             // query tokens per prefill tile for this model's heads
  int32_t num_prefill_tokens_ = 0;              // the step's last rows, handled by prefill_attention
  std::vector<gpu::prefill_tile> prefill_chunks_, prefill_tiles_;
  std::vector<int32_t> row_order_, row_scratch_;
  // Token trees (plan_trees): per token, then the ancestor bits; the most a row's slot exceeds its position.
  std::vector<int32_t> tree_root_, tree_mask_offset_, tree_mask_;
  int32_t tree_lag_ = 0;
  // Embeddings and prompt logprobs: the rows of a group, their normed rows and their logits.
  pinned_buffer aux_rows_host_, pooled_host_, score_logits_host_;
  device_buffer aux_rows_dev_, pooled_dev_, score_x_, score_logits_;
  std::vector<meta_range> meta_slots_, meta_tables_;  // per KV layer group
  meta_range meta_ids_, meta_positions_, meta_context_, meta_token_seq_, meta_logit_rows_, meta_copies_, meta_tiles_,
      meta_tree_root_, meta_tree_offset_, meta_tree_mask_, meta_pending_;
  std::vector<int32_t> pending_tokens_;  // plan_pending_tokens
  size_t meta_size_ = 0;
  pinned_buffer meta_host_;
  device_buffer meta_dev_;
};

}  // namespace

bool cuda_executor_available() noexcept { return gpu::device_count() > 0; }

std::unique_ptr<executor> make_cuda_executor(std::shared_ptr<const model_weights> weights,
                                             const cuda_executor_options& options) {
  if (!weights) throw invalid_request("cuda executor: no weights");
  const int n = gpu::device_count();
  if (n == 0) throw invalid_request("--device cuda: no CUDA device is visible (no GPU, or no driver)");
  if (options.device < 0 || options.device >= n) {
    throw invalid_request("cuda executor: device " + std::to_string(options.device) + " does not exist (" +
                          std::to_string(n) + " visible)");
  }
  const bool fp8 = options.kv_dtype == cuda_kv_dtype::fp8_e4m3;
  if (options.dtype == cuda_dtype::f32) {
    if (fp8) throw invalid_request("--kv-cache-dtype fp8 needs --dtype bfloat16 (the fp32 path is the exact one)");
    return std::make_unique<cuda_executor<float>>(std::move(weights), options);
  }
  if (fp8) return std::make_unique<cuda_executor<bf16, gpu::fp8_e4m3>>(std::move(weights), options);
  return std::make_unique<cuda_executor<bf16>>(std::move(weights), options);
}

int64_t cuda_kv_block_bytes(const model_config& config, int32_t block_size, cuda_dtype dtype, cuda_kv_dtype kv_dtype,
                            int32_t layers_per_block) {
  const gpu::kv_layout layout{layers_per_block > 0 ? layers_per_block : config.num_layers, config.num_kv_heads,
                              block_size, config.head_dim};
  return layout.block_elems() * static_cast<int64_t>(kv_element_bytes(dtype, kv_dtype));
}

cuda_co_resident cuda_co_resident_for(const model_weights& weights, const cuda_executor_options& options,
                                      const model_weights* shares_with) {
  const model_config& c = weights.config;
  const size_t elem = element_bytes(options.dtype);
  const size_t tokens = static_cast<size_t>(std::max(1, options.max_num_batched_tokens));
  const auto rows = static_cast<size_t>(initial_logit_rows(options.max_num_batched_tokens));
  const int64_t block = cuda_kv_block_bytes(c, options.kv.block_size, options.dtype, options.kv_dtype);
  cuda_co_resident r;
  r.bytes = device_weight_bytes(weights, elem, options.quantized_weights, shares_with) +
            static_cast<int64_t>(activation_bytes_for(c, tokens, elem).total() +
                                 logit_row_bytes_for(c, rows, elem).total() + kCublasWorkspaceBytes);
  if (options.kv.num_device_blocks > 0) {
    r.bytes += block * (options.kv.num_device_blocks + 1);  // + the padding block of graph replays
  } else {
    r.kv_block_bytes = block;
  }
  return r;
}

}  // namespace tessera
