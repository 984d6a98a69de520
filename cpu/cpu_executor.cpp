// The CPU executor. One execute() = one batched forward pass over every token of every sequence in
// the step, as a [T, hidden] activation matrix, so each weight matrix is streamed once per step.
// The pass runs as a single job on the thread pool; threads split each phase (matmul row chunks,
// tokens, attention tasks) through per-phase atomic counters and meet at a barrier after it.
#include "cpu/cpu_executor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "cpu/kernels.hpp"
#include "cpu/thread_pool.hpp"
#include "engine/base/error.hpp"
#include "engine/model/rope.hpp"
#include "engine/model/weight_shapes.hpp"
#include "engine/step_layout.hpp"

namespace tessera {
namespace {

using cpu::act_block;
using cpu::act_block_elems;
using cpu::act_block_k;
using cpu::act_block_k_elems;
using cpu::act_format;
using cpu::kernel_table;

// A weight matrix as the kernels consume it: rows of `type` (as stored, or f32 converted at load),
// multiplied with activations in `act` format (matmul_q for q8 / q8_k, matmul_f32 for f32 / bf16).
struct matrix {
  act_format act = act_format::f32;
  ggml_type type = ggml_type::f32;
  const std::byte* data = nullptr;
  bool packed = false;  // data is pack_weights' panel layout (matmul_packed), else rows (matmul_q / matmul_f32)
  int64_t stride = 0;   // bytes per row (of the ggml layout)
  int64_t rows = 0;
  int64_t cols = 0;
};

// Matrices over the same input computed in one phase, outputs side by side (Q|K|V, gate|up).
struct fused_linear {
  struct chunk {
    int32_t part;
    int64_t row_begin;
    int64_t row_end;
  };
  std::vector<matrix> parts;
  std::vector<int64_t> col_offset;
  std::vector<chunk> chunks;
  int64_t in_cols = 0;
  int64_t out_cols = 0;
  // Activation formats the parts need: the input is converted once per format and shared by them.
  bool needs_q8 = false;
  bool needs_q8_k = false;
  bool needs_bf16 = false;
  bool needs_conversion() const { return needs_q8 || needs_q8_k || needs_bf16; }
};

struct layer_state {
  std::vector<float> attn_norm;
  std::vector<float> ffn_norm;
  std::vector<float> post_attn_norm;  // post_norms (empty when off)
  std::vector<float> post_ffn_norm;
  std::vector<float> q_norm, k_norm;  // qk_norm, [head_dim] each
  std::vector<float> qkv_bias;        // qkv_bias: Q|K|V biases side by side, like the fused output
  int32_t rope_table = 0;             // index into cpu_executor::rope_
  int32_t sliding_window = 0;         // 0: full causal attention
  fused_linear qkv;
  fused_linear wo;
  fused_linear gate_up;
  fused_linear down;
};

struct alignas(64) padded_counter {
  std::atomic<int64_t> next{0};
};

// Attention of the query heads [head_begin, head_end) of one kv head, for the tokens [token_begin,
// token_end) of one sequence: its rows (token-major) share every K / V tile they read. A split task
// (segment >= 0) takes only the keys of one key segment and leaves its rows' partial softmax states at
// `partials` (attn_merge then folds them); an unsplit one takes them all and writes the output rows.
struct attn_task {
  int32_t seq;  // index into step_batch::seqs
  int32_t kv_head;
  int32_t head_begin;
  int32_t head_end;
  int32_t token_begin;
  int32_t token_end;
  int32_t segment = -1;
  int32_t num_segments = 0;  // of the split family: partial of (row m, segment s) at (m * num_segments + s)
  int64_t partials = 0;      // offset into attn_partials_, in partial_state floats
};

// Where the split tasks of one (sequence, kv head, token run) left their partial states.
struct attn_merge {
  int32_t head_begin;
  int32_t head_end;
  int32_t token_begin;
  int32_t token_end;
  int32_t num_segments;
  int64_t partials;
};

// Keys per segment of the attention's key range (a whole number of blocks: segment_blocks). Every row's
// softmax runs segment by segment and folds each segment into the row's result in key order
// (fold_segment), whether one task walks all of them or each is a task of its own (flash-decoding's
// split-KV: Dao et al. 2023, "Flash-Decoding for long-context inference"), so a row's result does not
// depend on how a step was split: a sequence decodes the same tokens alone, in a batch, or verifying
// a draft.
constexpr int32_t attn_segment_keys = 128;

// A row's softmax state over some keys: the largest score m, the sum l of exp(score - m), and the
// output o (head_dim values) still to be divided by l.
inline int64_t partial_state_floats(int32_t head_dim) { return 2 + static_cast<int64_t>(head_dim); }

// (M, L, O) := the state over both key sets, (M, L, O) followed by (m, l, o). Out of line, so that the
// unsplit tasks and the merge of split ones run the very same instructions.
[[gnu::noinline]] void fold_segment(float& M, float& L, float* O, float m, float l, const float* o, int32_t head_dim) {
  if (l == 0.0f) return;  // no key of the segment was the row's
  const float next = std::max(M, m);
  const float a = L == 0.0f ? 0.0f : std::exp(M - next);
  const float b = std::exp(m - next);
  for (int32_t d = 0; d < head_dim; ++d) O[d] = O[d] * a + o[d] * b;
  L = L * a + l * b;
  M = next;
}

// The largest of x[0 .. n), n > 0, over four independent chains: one chain of dependent max
// instructions over a segment's 128 keys was a large part of a decode step's attention. (The largest
// value is the same whatever the order.)
inline float max_of(const float* x, int32_t n) {
  float m[4] = {x[0], x[0], x[0], x[0]};
  int32_t j = 0;
  for (; j + 4 <= n; j += 4) {
    for (int i = 0; i < 4; ++i) m[i] = std::max(m[i], x[j + i]);
  }
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// Query tokens per attention task: enough rows (x the GQA group) to reuse each tile from L1, few enough
// to spread a prefill over the threads.
constexpr int32_t attn_chunk = 16;

cpu::kv_dtype to_kernel_dtype(cpu_kv_dtype d, bool dequantize_weights = false) {
  switch (resolve(d, dequantize_weights)) {
    case cpu_kv_dtype::fp32: return cpu::kv_dtype::f32;
    case cpu_kv_dtype::bf16: return cpu::kv_dtype::bf16;
    case cpu_kv_dtype::int8: return cpu::kv_dtype::i8;
    default: return cpu::kv_dtype::f16;
  }
}

const kernel_table& pick_kernels(const std::string& want) {
  if (want.empty()) return cpu::best_kernels();
  for (const kernel_table* t : cpu::available_kernels()) {
    if (std::string_view(t->name) == want) return *t;
  }
  throw invalid_request("cpu executor: kernel table '" + want + "' is unknown or not supported by this CPU");
}

class cpu_executor final : public executor {
 public:
  cpu_executor(std::shared_ptr<const model_weights> weights, const cpu_executor_options& options)
      : weights_(std::move(weights)),
        spec_(options.kv),
        kern_(&pick_kernels(options.kernels)),
        dequantize_all_(options.dequantize_weights),
        repack_(options.repack_weights && !env_disables_repack()),
        kv_dt_(to_kernel_dtype(options.kv_dtype, options.dequantize_weights)) {
    if (!weights_) throw invalid_request("cpu executor: no weights");
    config_ = weights_->config;
    config_.validate();
    if (spec_.block_size < 1 || spec_.num_device_blocks < 0 || spec_.num_host_blocks < 0) {
      throw invalid_request("cpu executor: bad kv_cache_spec");
    }
    if (config_.num_heads % config_.num_kv_heads != 0 || config_.rope_dims % 2 != 0 ||
        config_.rope_dims > config_.head_dim || config_.rope_dims < 0) {
      throw load_error("cpu executor: inconsistent head geometry in model config");
    }
    pool_ = std::make_unique<cpu::thread_pool>(options.num_threads);
    prepare_weights();
    tile_bytes_ = cpu::kv_tile_bytes(kv_dt_, spec_.block_size, config_.head_dim);
    groups_ = options.kv_layer_groups ? group_kv_layers(config_) : single_kv_group(config_);
    block_bytes_ = cpu_kv_block_bytes(config_, spec_.block_size, resolve(options.kv_dtype, options.dequantize_weights),
                                      groups_.layers_per_block);
    // Uninitialised on purpose: the OS maps pages lazily, and every slot is written before it is read.
    // 64 bytes more: the attention kernels read whole vectors past a tile's last slot.
    kv_device_ = allocate(block_bytes_ * spec_.num_device_blocks + 64);
    kv_host_ = allocate(block_bytes_ * spec_.num_host_blocks + 64);
    base_phases_ = 11 + 16 * static_cast<int64_t>(config_.num_layers);
    num_phases_ = base_phases_;
    counters_.reset(new padded_counter[static_cast<size_t>(num_phases_)]);
    prefetched_.reset(new padded_counter[static_cast<size_t>(num_linears())]);
    // Attention scratch per thread: scores / probabilities, outputs, running max and sum, query rows.
    attn_rows_ = attn_chunk * (config_.num_heads / config_.num_kv_heads);
    segment_blocks_ = std::max(1, attn_segment_keys / spec_.block_size);
    // A segment's keys, rounded up to whole vectors, and one vector more: a block's scores are written
    // in whole vectors from its column, which may run past a block size that is no multiple of 16.
    attn_ld_ = (segment_blocks_ * spec_.block_size + 15) / 16 * 16 + 16;
    scratch_.resize(static_cast<size_t>(pool_->size()));
    for (auto& sc : scratch_) {
      sc.s.resize(static_cast<size_t>(attn_rows_ * attn_ld_));
      sc.o.resize(static_cast<size_t>(attn_rows_ * config_.head_dim));
      sc.mx.resize(static_cast<size_t>(attn_rows_));
      sc.l.resize(static_cast<size_t>(attn_rows_));
      sc.O.resize(static_cast<size_t>(attn_rows_ * config_.head_dim));
      sc.M.resize(static_cast<size_t>(attn_rows_));
      sc.L.resize(static_cast<size_t>(attn_rows_));
      sc.q.resize(static_cast<size_t>(attn_rows_));
      sc.masked.resize(static_cast<size_t>(attn_ld_));
      sc.blocks.resize(static_cast<size_t>(segment_blocks_));
    }
  }

  const model_config& config() const override { return config_; }
  const kv_cache_spec& kv_spec() const override { return spec_; }
  int64_t kv_block_bytes() const override { return block_bytes_; }
  kv_layer_groups kv_groups() const override { return groups_; }
  const char* name() const override { return "cpu"; }
  // Attention starts at the window's first key (below) and the K/V write is at the new positions, so
  // entries of freed blocks before the window are never touched.
  bool reads_only_window() const override { return true; }
  // Token trees: RoPE at each row's depth, K/V at its slot, the ancestor mask in attention (below).
  bool verifies_token_trees() const override { return true; }
  bool pools_hidden_states() const override { return true; }
  bool scores_prompts() const override { return true; }
  const char* kv_cache_dtype() const override { return cpu::to_string(kv_dt_); }

  void execute(const step_batch& batch, step_output& out) override;

 private:
  matrix prepare_matrix(const weight_tensor& w);
  std::vector<float> prepare_vector(const weight_tensor& w);
  fused_linear make_linear(std::initializer_list<matrix> parts) const;
  void prepare_weights();
  void plan_step(const step_batch& batch, step_output& out);
  void apply_block_moves(const step_batch& batch);
  void forward(int thread_index, const step_batch& batch);

  // The linears of a forward pass in the order it runs them: per layer Q|K|V, O, gate|up, down; then
  // the LM head. nullptr past the end.
  int64_t num_linears() const { return 4 * static_cast<int64_t>(config_.num_layers) + 1; }
  const fused_linear* linear_at(int64_t id) const {
    if (id < 4 * static_cast<int64_t>(config_.num_layers)) {
      const layer_state& L = layers_[static_cast<size_t>(id / 4)];
      const fused_linear* in_order[] = {&L.qkv, &L.wo, &L.gate_up, &L.down};
      return in_order[id % 4];
    }
    return id == num_linears() - 1 ? &output_ : nullptr;
  }
  bool prefetch_piece(int64_t id);

  // The (layer, K|V, kv head) tile of a device block (cpu/kernels.hpp, "KV cache tiles"); a block of
  // the layer's group holds it at the layer's slot in the group (kv_layer_groups).
  std::byte* kv_tile(block_id block, int32_t layer, int kind, int32_t kv_head) const {
    // step_layout refuses a freed entry inside the window; reaching one here is a bug in the key
    // ranges below, and reading through it would read another block's memory: stop.
    if (block < 0) [[unlikely]]
      freed_block_touched(block, layer);
    return kv_device_.get() + static_cast<int64_t>(block) * block_bytes_ +
           ((static_cast<int64_t>(groups_.slot_of(layer)) * 2 + kind) * config_.num_kv_heads + kv_head) * tile_bytes_;
  }

  [[noreturn]] static void freed_block_touched(block_id block, int32_t layer) {
    std::fprintf(stderr, "cpu executor: layer %d touched block-table entry %d (a freed block): aborting\n", layer,
                 block);
    std::abort();
  }

  static bool env_disables_repack() {
    const char* v = std::getenv("TESSERA_CPU_REPACK");
    return v != nullptr && std::string_view(v) == "0";
  }

  struct free_deleter {
    void operator()(std::byte* p) const { std::free(p); }
  };

  std::shared_ptr<const model_weights> weights_;
  model_config config_;
  kv_cache_spec spec_;
  kv_layer_groups groups_;  // how the layers share blocks (one group of all, unless options.kv_layer_groups)
  const kernel_table* kern_;
  bool dequantize_all_;
  bool repack_;
  cpu::kv_dtype kv_dt_;
  std::vector<std::unique_ptr<std::byte[], free_deleter>> packed_;  // repacked matrices (64-byte aligned)

  static std::unique_ptr<std::byte[], free_deleter> allocate(int64_t bytes) {
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64)));
    if (p == nullptr) throw invalid_request("cpu executor: cannot allocate the KV pools");
    return std::unique_ptr<std::byte[], free_deleter>(p);
  }
  std::unique_ptr<cpu::thread_pool> pool_;

  std::vector<std::vector<float>> owned_;  // converted weights (moving keeps data() stable)
  std::vector<layer_state> layers_;
  std::vector<float> output_norm_;
  fused_linear output_;
  // The distinct RoPE tables of the layers (one, or Gemma 3's global and local ones).
  std::vector<rope_table> rope_;

  int64_t tile_bytes_ = 0;
  int64_t block_bytes_ = 0;
  std::unique_ptr<std::byte[], free_deleter> kv_device_;
  std::unique_ptr<std::byte[], free_deleter> kv_host_;
  int64_t base_phases_ = 0;  // a step's phases of the pool (parallel() calls) without prompt logprobs
  int64_t num_phases_ = 0;   // the counters allocated
  std::unique_ptr<padded_counter[]> counters_;
  // Per linear of the pass (linear_at's order), the pieces of its weights prefetched so far this step.
  std::unique_ptr<padded_counter[]> prefetched_;

  // ---- per-step state (sized by plan_step, read by every thread in forward) ----------------
  int32_t num_tokens_ = 0;
  step_layout layout_;  // token rows, positions, owning sequences, logits rows (engine/step_layout.hpp)
  std::vector<attn_task> attn_tasks_;
  std::vector<attn_merge> attn_merges_;  // the split families of attn_tasks_
  std::vector<float> attn_partials_;     // their rows' partial states, per (row, segment)
  int32_t segment_blocks_ = 1;           // attn_segment_keys in blocks
  float* logits_out_ = nullptr;
  float* hidden_out_ = nullptr;                          // step_output::hidden: one row per pooled sequence
  prompt_logprob* scored_out_ = nullptr;                 // step_output::prompt_logprobs: one per scored row
  int64_t score_rows_ = 1;                               // scored prompt rows per LM-head group
  std::vector<float> sx_, slogits_;                      // one group's normed rows and logits
  std::vector<float> px_;                                // per pooled sequence: the normed row being added
  std::vector<std::vector<float>> rope_cos_, rope_sin_;  // per table: [T, rope_dims / 2]
  std::vector<float> x_, xn_, qkv_, attn_, gu_, mlp_, lx_, tmp_;
  std::vector<act_block> xq_;  // the current matmul input in the formats its matrices need
  std::vector<act_block_k> xqk_;
  std::vector<float> xbf_;
  std::vector<uint16_t> xbf16_;
  // A block of the current attention segment that some of a task's rows reach: rows [m_lo, m_hi), its
  // first n slots.
  struct segment_block {
    int32_t block;
    int32_t m_lo;
    int32_t m_hi;
    int32_t n;
  };
  struct attn_scratch {
    std::vector<float> s;         // the current segment's scores, then probabilities, per row (attn_ld_)
    std::vector<float> o, mx, l;  // the current segment's state per row
    std::vector<float> O, M, L;   // the segments folded so far (unsplit tasks)
    std::vector<const float*> q;
    std::vector<uint8_t> masked;  // a token tree's row: which keys of the current segment it may not see
    std::vector<segment_block> blocks;
  };
  // A masked score: far below any real one, finite so that the softmax's exp stays defined.
  static constexpr float kMasked = -1e30f;
  int32_t attn_rows_ = 0;  // rows of the largest attention task
  int32_t attn_ld_ = 0;    // scores per row: a segment's keys rounded up to 16, and 16 more
  std::vector<attn_scratch> scratch_;
};

// ---- weight preparation ----------------------------------------------------------------------

// pre: check_weight_shapes accepted `w` (present, shaped as the config says, a decodable type, rows of
// whole blocks: what the kernels and their activation blocks need).
matrix cpu_executor::prepare_matrix(const weight_tensor& w) {
  matrix m;
  m.rows = w.rows;
  m.cols = w.cols;
  if (cpu::has_quant_kernel(w.type) && !dequantize_all_) {  // used in place, as stored
    m.act = cpu::act_format_of(w.type);
    m.type = w.type;
    m.data = w.data;
    m.stride = w.row_stride_bytes;
    if (repack_ && cpu::has_packed_kernel(w.type)) {  // the same bytes, rows interleaved in panels of 16
      const auto bytes = static_cast<size_t>(cpu::packed_matrix_bytes(w.type, w.rows, w.cols));
      auto* p = static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
      if (p == nullptr) throw load_error("cpu executor: out of memory repacking a weight matrix");
      packed_.emplace_back(p);
      cpu::pack_weights(w.type, w.data, w.row_stride_bytes, w.rows, w.cols, p);
      m.data = p;
      m.packed = true;
    }
    return m;
  }
  // No kernel for this type, or exact mode: dequantize once to f32 and use the f32 path.
  std::vector<float> buf(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) dequantize_row(w.type, w.row(r), buf.data() + r * w.cols, w.cols);
  m.act = act_format::f32;
  m.type = ggml_type::f32;
  m.data = reinterpret_cast<const std::byte*>(buf.data());
  m.stride = w.cols * static_cast<int64_t>(sizeof(float));
  owned_.push_back(std::move(buf));
  return m;
}

std::vector<float> cpu_executor::prepare_vector(const weight_tensor& w) {
  std::vector<float> v(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) dequantize_row(w.type, w.row(r), v.data() + r * w.cols, w.cols);
  return v;
}

namespace {

// RMSNorm weights as the forward pass multiplies them: Gemma's checkpoints store w for x * (1 + w)
// (transformers GemmaRMSNorm computes 1 + w in fp32, as here), the others w itself.
void to_norm_multiplier(std::vector<float>& w, norm_kind kind) {
  if (kind == norm_kind::rms_one_plus) {
    for (float& x : w) x = 1.0f + x;
  }
}

}  // namespace

fused_linear cpu_executor::make_linear(std::initializer_list<matrix> parts) const {
  fused_linear f;
  f.parts.assign(parts.begin(), parts.end());
  f.in_cols = f.parts.front().cols;
  const int64_t threads = pool_->size();
  for (size_t p = 0; p < f.parts.size(); ++p) {
    const matrix& m = f.parts[p];
    f.col_offset.push_back(f.out_cols);
    f.out_cols += m.rows;
    f.needs_q8 = f.needs_q8 || m.act == act_format::q8;
    f.needs_q8_k = f.needs_q8_k || m.act == act_format::q8_k;
    f.needs_bf16 = f.needs_bf16 || m.act == act_format::bf16;
    // Two chunks per thread, so that a thread whose core is shared can hand work to the others, and no
    // more: each chunk starts a new stream of weights from memory, and in a decode step (300 matmul calls
    // of tens of KB on SmolLM2) those starts cost more than the balance gains (4 per thread: 5% slower
    // decode, 8: 20%, measured with bench_cpu_kernels on 2 threads). Multiples of the 16-row tile.
    int64_t rows_per_chunk = (m.rows + threads * 2 - 1) / (threads * 2);
    rows_per_chunk = std::clamp<int64_t>((rows_per_chunk + 15) / 16 * 16, 16, 512);
    for (int64_t r = 0; r < m.rows; r += rows_per_chunk) {
      f.chunks.push_back({static_cast<int32_t>(p), r, std::min(m.rows, r + rows_per_chunk)});
    }
  }
  return f;
}

void cpu_executor::prepare_weights() {
  const model_weights& w = *weights_;
  check_weight_shapes(w, "cpu");  // every tensor, before anything is converted
  const model_features& f = config_.features;
  auto norm = [&](const weight_tensor& t) {
    std::vector<float> v = prepare_vector(t);
    to_norm_multiplier(v, f.norm);
    return v;
  };
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const layer_weights& lw = w.layers[static_cast<size_t>(l)];
    layer_state ls;
    ls.attn_norm = norm(lw.attn_norm);
    ls.ffn_norm = norm(lw.ffn_norm);
    if (f.post_norms) {
      ls.post_attn_norm = norm(lw.post_attn_norm);
      ls.post_ffn_norm = norm(lw.post_ffn_norm);
    }
    if (f.qk_norm) {
      ls.q_norm = norm(lw.q_norm);
      ls.k_norm = norm(lw.k_norm);
    }
    if (f.qkv_bias) {
      for (const weight_tensor* b : {&lw.bq, &lw.bk, &lw.bv}) {
        const std::vector<float> v = prepare_vector(*b);
        ls.qkv_bias.insert(ls.qkv_bias.end(), v.begin(), v.end());
      }
    }
    // Layers with equal frequencies share a table (Gemma 3: the local ones, and the global ones).
    rope_table table = rope_frequencies(config_, l);
    auto same = [&](const rope_table& t) {
      return t.inv_freq == table.inv_freq && t.attention_factor == table.attention_factor;
    };
    const auto it = std::find_if(rope_.begin(), rope_.end(), same);
    ls.rope_table = static_cast<int32_t>(it - rope_.begin());
    if (it == rope_.end()) rope_.push_back(std::move(table));
    ls.sliding_window = config_.layer(l).sliding_window;
    ls.qkv = make_linear({prepare_matrix(lw.wq), prepare_matrix(lw.wk), prepare_matrix(lw.wv)});
    ls.wo = make_linear({prepare_matrix(lw.wo)});
    ls.gate_up = make_linear({prepare_matrix(lw.w_gate), prepare_matrix(lw.w_up)});
    ls.down = make_linear({prepare_matrix(lw.w_down)});
    layers_.push_back(std::move(ls));
  }
  output_norm_ = norm(w.output_norm);
  output_ = make_linear({prepare_matrix(w.output.empty() ? w.token_embedding : w.output)});
}

// ---- step planning -----------------------------------------------------------------------------

void cpu_executor::apply_block_moves(const step_batch& batch) {
  const size_t bytes = static_cast<size_t>(kv_block_bytes());
  // All checks first: a rejected step leaves the cache as it was.
  check_block_moves(batch, spec_, "cpu");
  const int64_t bb = block_bytes_;
  for (const block_copy& c : batch.swap_in) {
    std::memcpy(kv_device_.get() + c.dst * bb, kv_host_.get() + c.src * bb, bytes);
  }
  for (const block_copy& c : batch.swap_out) {
    std::memcpy(kv_host_.get() + c.dst * bb, kv_device_.get() + c.src * bb, bytes);
  }
  for (const block_copy& c : batch.copies) {
    if (c.src != c.dst) std::memcpy(kv_device_.get() + c.dst * bb, kv_device_.get() + c.src * bb, bytes);
  }
}

void cpu_executor::plan_step(const step_batch& batch, step_output& out) {
  build_step_layout(batch, spec_, config_, /*samples_on_device=*/false, "cpu", layout_, out, /*allow_trees=*/true,
                    &groups_);
  // Attention tasks: one per (sequence, kv head, run of attn_chunk tokens), its rows every query head of
  // the kv head's group, so that each K / V tile is read once for all of them. A step with fewer such
  // tasks than threads (a decode of one sequence of a model with few kv heads) splits the group into one
  // task per query head instead, so that every thread has work (each row's result is the same either
  // way: attn_block_args). Not sooner: a task of the group's few rows costs about what a one-row task
  // does (the kernels' FMA chains are independent across rows), so splitting SmolLM2's 3 groups of 3
  // over 2 threads made decode attention slower (1.95 against 1.58 ms per token at context 16..1018).
  const int32_t group = config_.num_heads / config_.num_kv_heads;
  const bool split_heads =
      static_cast<int64_t>(layout_.seqs.size()) * config_.num_kv_heads < static_cast<int64_t>(pool_->size());
  attn_tasks_.clear();
  for (size_t s = 0; s < layout_.seqs.size(); ++s) {
    const step_layout::sequence_rows& sr = layout_.seqs[s];
    const bool split = split_heads && sr.num_tokens <= 2;
    for (int32_t kvh = 0; kvh < config_.num_kv_heads; ++kvh) {
      for (int32_t h = kvh * group; h < (kvh + 1) * group; h += split ? 1 : group) {
        for (int32_t t = 0; t < sr.num_tokens; t += attn_chunk) {
          attn_tasks_.push_back({static_cast<int32_t>(s), kvh, h, split ? h + 1 : h + group, sr.token_begin + t,
                                 sr.token_begin + std::min(sr.num_tokens, t + attn_chunk)});
        }
      }
    }
  }
  // Still fewer than two tasks per thread (SmolLM2's decode: 3 tasks for 2 threads, one of which then
  // waited a third of the phase): each task becomes one per key segment its rows reach, and a merge
  // phase folds their partial states. Segments before a sliding window get tasks that find no key.
  const std::vector<int32_t>& pos = layout_.slots;
  attn_merges_.clear();
  const int32_t segment_keys = segment_blocks_ * spec_.block_size;
  const int64_t state = partial_state_floats(config_.head_dim);
  auto partials_of = [&](const attn_task& t, int32_t segments) {
    return static_cast<int64_t>(t.token_end - t.token_begin) * (t.head_end - t.head_begin) * segments * state;
  };
  auto segments_of = [&](const attn_task& t) {
    const int32_t keys = pos[static_cast<size_t>(t.token_end - 1)] + 1;  // the last row's context
    return (keys + segment_keys - 1) / segment_keys;
  };
  // The partial states stay small next to the KV they summarise (a decode row: 66 floats per 128 keys),
  // but a chunk of many rows at a long context on many threads could ask for hundreds of MB: such a
  // step keeps its tasks whole.
  constexpr int64_t max_partial_floats = int64_t{4} << 20;  // 16 MiB
  int64_t wanted = 0;
  for (const attn_task& t : attn_tasks_) wanted += partials_of(t, segments_of(t));
  if (attn_tasks_.size() < 2 * static_cast<size_t>(pool_->size()) && wanted <= max_partial_floats) {
    std::vector<attn_task> split;
    int64_t partials = 0;
    for (const attn_task& t : attn_tasks_) {
      const int32_t segments = segments_of(t);
      if (segments < 2) {
        split.push_back(t);
        continue;
      }
      attn_merges_.push_back({t.head_begin, t.head_end, t.token_begin, t.token_end, segments, partials});
      for (int32_t g = 0; g < segments; ++g) {
        attn_task part = t;
        part.segment = g;
        part.num_segments = segments;
        part.partials = partials;
        split.push_back(part);
      }
      partials += partials_of(t, segments);
    }
    attn_tasks_ = std::move(split);
    attn_partials_.resize(static_cast<size_t>(partials));
  }
  // Heaviest attention tasks (latest slots, latest segments) first, so the tail of the phase is short.
  std::stable_sort(attn_tasks_.begin(), attn_tasks_.end(), [&](const attn_task& a, const attn_task& b) {
    auto keys = [&](const attn_task& t) {
      const int32_t all = pos[static_cast<size_t>(t.token_end - 1)] + 1;
      return t.segment < 0 ? all : std::min(all - t.segment * segment_keys, segment_keys);
    };
    return keys(a) > keys(b);
  });

  num_tokens_ = layout_.num_tokens();
  const auto T = static_cast<size_t>(num_tokens_);
  const auto hidden = static_cast<size_t>(config_.hidden_size);
  const auto q_dim = static_cast<size_t>(config_.num_heads) * static_cast<size_t>(config_.head_dim);
  const auto ffn = static_cast<size_t>(config_.intermediate_size);
  const size_t widest = std::max({hidden, q_dim, ffn});
  x_.resize(T * hidden);
  xn_.resize(T * hidden);
  xq_.resize(T * (widest / act_block_elems + 1));
  xqk_.resize(T * (widest / act_block_k_elems + 1));
  xbf_.resize(T * widest);
  xbf16_.resize(T * widest);
  qkv_.resize(T * static_cast<size_t>(layers_.front().qkv.out_cols));
  attn_.resize(T * q_dim);
  gu_.resize(T * 2 * ffn);
  mlp_.resize(T * ffn);
  lx_.resize(layout_.logit_tokens.size() * hidden);
  if (config_.features.post_norms) tmp_.resize(T * hidden);
  const size_t half = static_cast<size_t>(config_.rope_dims / 2);
  rope_cos_.resize(rope_.size());
  rope_sin_.resize(rope_.size());
  for (size_t r = 0; r < rope_.size(); ++r) {
    rope_cos_[r].resize(T * half);
    rope_sin_[r].resize(T * half);
  }
  logits_out_ = out.logits.data();  // sized by build_step_layout
  hidden_out_ = out.hidden.data();  // zeroed by build_step_layout: mean pooling adds into it
  px_.resize(layout_.pooled_seqs.size() * hidden);
  // Prompt logprobs: the LM head runs over the scored rows in groups of about 4 M logits (85 rows of
  // SmolLM2's 49,152-token vocabulary), so a 2,048-token chunk needs 16 MB of logits, not 400 MB. Each
  // group takes 3 phases of the pool; the counters grow to what the step needs.
  const auto num_scored = static_cast<int64_t>(layout_.scored_tokens.size());
  const auto vocab = static_cast<int64_t>(config_.vocab_size);
  score_rows_ = std::max<int64_t>(1, std::min<int64_t>(num_scored, (int64_t{4} << 20) / vocab));
  const int64_t num_groups = (num_scored + score_rows_ - 1) / score_rows_;
  const int64_t phases = base_phases_ + 3 * num_groups;
  if (phases > num_phases_) {
    num_phases_ = phases;
    counters_.reset(new padded_counter[static_cast<size_t>(num_phases_)]);
  }
  if (num_scored > 0) {
    sx_.resize(static_cast<size_t>(score_rows_) * hidden);
    slogits_.resize(static_cast<size_t>(score_rows_ * vocab));
  }
  scored_out_ = out.prompt_logprobs.data();  // sized by build_step_layout
}

void cpu_executor::execute(const step_batch& batch, step_output& out) {
  if (layers_.empty()) throw invalid_request("cpu executor: model has no layers");
  plan_step(batch, out);  // validates everything before any KV memory is touched
  apply_block_moves(batch);
  if (num_tokens_ == 0) return;
  for (int64_t p = 0; p < num_phases_; ++p) counters_[p].next.store(0, std::memory_order_relaxed);
  for (int64_t p = 0; p < num_linears(); ++p) prefetched_[p].next.store(0, std::memory_order_relaxed);
  pool_->run([this, &batch](int i) { forward(i, batch); });
}

// ---- the forward pass (runs on every pool thread) ----------------------------------------------

// Weights asked for ahead of their matmul by threads waiting at a barrier. A decode step's memory bus
// idles through the phases between matmuls (norms, RoPE, attention's latency-bound walk, the wait for
// the slowest thread), about a quarter of SmolLM2's step; a waiting thread spends that time pulling
// the next matmuls' first rows into the cache, and the matmul then starts on cached rows rather than
// on a cold stream (SmolLM2 Q4_1 decode: O projection 188 -> 130 us per token, docs/cpu_executor.md).
// The amount ahead stays within a core's L2 (1 MiB on Zen 4): the next two linears, 256 KiB each.
constexpr int64_t prefetch_bytes_per_linear = 256 << 10;
constexpr int64_t prefetch_piece_bytes = 1024;  // one call's share: short, so a released thread goes on soon

// Asks for the next piece of linear `id`'s first prefetch_bytes_per_linear, a piece of each row chunk
// in turn (whichever thread takes a chunk finds its start cached); false when there is none left.
bool cpu_executor::prefetch_piece(int64_t id) {
  const fused_linear* f = linear_at(id);
  if (f == nullptr) return false;
  const auto chunks = static_cast<int64_t>(f->chunks.size());
  const int64_t per_chunk = std::max<int64_t>(1, prefetch_bytes_per_linear / chunks / prefetch_piece_bytes);
  const int64_t p = prefetched_[id].next.fetch_add(1, std::memory_order_relaxed);
  if (p >= per_chunk * chunks) return false;
  const fused_linear::chunk& ch = f->chunks[static_cast<size_t>(p % chunks)];
  const matrix& m = f->parts[static_cast<size_t>(ch.part)];
  const std::byte* begin = m.data + ch.row_begin * m.stride + (p / chunks) * prefetch_piece_bytes;
  const std::byte* end = std::min(begin + prefetch_piece_bytes, m.data + ch.row_end * m.stride);
  for (const std::byte* a = begin; a < end; a += 64) __builtin_prefetch(a, 0, 1);
  return true;
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// x += rms_norm(y) * w: a post-norm on a sub-layer's output before the residual add (Gemma 2/3).
void add_rms_norm(float* x, const float* y, const float* w, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += y[i] * y[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] += y[i] * scale * w[i];
}

// GeGLU: gelu_tanh(g) * u, GELU's tanh approximation as transformers' gelu_pytorch_tanh (Hendrycks &
// Gimpel 2016, eq. for GELU(x) ~ 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))).
void gelu_tanh_mul(const float* g, const float* u, float* out, int64_t n) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x))) * u[i];
  }
}

// cap * tanh(x / cap) (Gemma 2 report, sec. 2 "Logit soft-capping").
void soft_cap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void cpu_executor::forward(int thread_index, const step_batch& batch) {
  const kernel_table& k = *kern_;
  int64_t phase = 0;
  int64_t upcoming = 0;  // linear_at's id of the next linear to start
  // Runs body(i) for every i < n, spread over the threads, then waits for all of them (prefetching the
  // next two linears' first weights while it waits).
  auto parallel = [&](int64_t n, auto&& body) {
    std::atomic<int64_t>& next = counters_[phase++].next;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) body(i);
    pool_->barrier([&] { return prefetch_piece(upcoming) || prefetch_piece(upcoming + 1); });
  };
  const model_features& feat = config_.features;
  const int32_t T = num_tokens_;
  const int64_t hidden = config_.hidden_size;
  const int32_t hd = config_.head_dim;
  const int32_t nh = config_.num_heads;
  const int32_t nkv = config_.num_kv_heads;
  const int64_t q_dim = static_cast<int64_t>(nh) * hd;
  const int64_t kv_dim = static_cast<int64_t>(nkv) * hd;
  const int64_t ffn = config_.intermediate_size;
  const int32_t bs = spec_.block_size;
  const int64_t half = config_.rope_dims / 2;
  const float eps = config_.rms_norm_eps;
  const float scale = feat.attention_scale > 0.0f ? feat.attention_scale : 1.0f / std::sqrt(static_cast<float>(hd));
  // Gemma multiplies the embedding by sqrt(hidden) in the activations' dtype (fp32 here).
  const float embed_scale = feat.scale_embedding ? std::sqrt(static_cast<float>(hidden)) : 1.0f;

  // out[t, cols of part] (+)= input[t] . W rows, over the chunks of `f`. The input is `xf` (f32) and
  // its conversions quantize_rows made (xq_, xqk_, xbf_ / xbf16_).
  auto linear = [&](int64_t id, const fused_linear& f, const float* xf, int64_t xf_stride, int32_t num_tokens,
                    float* out, int64_t out_stride, bool accumulate) {
    upcoming = id + 1;  // threads done with their chunks start on the next one's weights
    parallel(static_cast<int64_t>(f.chunks.size()), [&](int64_t c) {
      const fused_linear::chunk& ch = f.chunks[static_cast<size_t>(c)];
      const matrix& m = f.parts[static_cast<size_t>(ch.part)];
      float* o = out + f.col_offset[static_cast<size_t>(ch.part)];
      if (m.act == act_format::q8 || m.act == act_format::q8_k) {
        const bool k_quant = m.act == act_format::q8_k;
        const int64_t block = k_quant ? act_block_k_elems : act_block_elems;
        cpu::qmatmul_args a;
        a.type = m.type;
        a.weights = m.data;
        a.weight_stride = m.stride;
        a.num_blocks = m.cols / block;
        a.act = xq_.data();
        a.act_k = xqk_.data();
        a.act_stride = f.in_cols / block;
        a.num_tokens = num_tokens;
        a.row_begin = ch.row_begin;
        a.row_end = ch.row_end;
        a.out = o;
        a.out_stride = out_stride;
        a.accumulate = accumulate;
        if (m.packed) {
          k.matmul_packed(a);
        } else {
          k.matmul_q(a);
        }
      } else {
        cpu::fmatmul_args a;
        a.type = m.type;
        a.weights = m.data;
        a.weight_stride = m.stride;
        a.cols = m.cols;
        if (m.act == act_format::bf16) {
          a.x = xbf_.data();
          a.x_bf16 = xbf16_.data();
          a.x_stride = f.in_cols;
        } else {
          a.x = xf;
          a.x_stride = xf_stride;
        }
        a.num_tokens = num_tokens;
        a.row_begin = ch.row_begin;
        a.row_end = ch.row_end;
        a.out = o;
        a.out_stride = out_stride;
        a.accumulate = accumulate;
        k.matmul_f32(a);
      }
    });
  };
  // Row `row` of the input x (rows f.in_cols apart) in every activation format f's matrices need.
  auto quantize_rows = [&](const fused_linear& f, const float* x, int64_t row) {
    const int64_t n = f.in_cols;
    const float* xr = x + row * n;
    if (f.needs_q8) k.quantize_act(xr, xq_.data() + row * (n / act_block_elems), n);
    if (f.needs_q8_k) k.quantize_act_k(xr, xqk_.data() + row * (n / act_block_k_elems), n);
    if (f.needs_bf16) cpu::round_act_bf16(xr, xbf_.data() + row * n, xbf16_.data() + row * n, n);
  };

  // Embedding rows and this step's RoPE angles (per table), cos/sin scaled by the table's
  // attention factor (YaRN's / LongRoPE's mscale, as transformers and ggml_rope_ext apply it).
  parallel(T, [&](int64_t t) {
    const weight_tensor& emb = weights_->token_embedding;
    float* x = x_.data() + t * hidden;
    dequantize_row(emb.type, emb.row(layout_.token_ids[static_cast<size_t>(t)]), x, hidden);
    if (embed_scale != 1.0f) {
      for (int64_t i = 0; i < hidden; ++i) x[i] *= embed_scale;
    }
    const auto pos = static_cast<float>(layout_.positions[static_cast<size_t>(t)]);
    for (size_t r = 0; r < rope_.size(); ++r) {
      const rope_table& table = rope_[r];
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * table.inv_freq[static_cast<size_t>(i)];
        rope_cos_[r][static_cast<size_t>(t * half + i)] =
            static_cast<float>(std::cos(static_cast<double>(angle))) * table.attention_factor;
        rope_sin_[r][static_cast<size_t>(t * half + i)] =
            static_cast<float>(std::sin(static_cast<double>(angle))) * table.attention_factor;
      }
    }
  });

  auto rope = [&](float* v, int64_t t, int32_t table) {
    const float* c = rope_cos_[static_cast<size_t>(table)].data() + t * half;
    const float* s = rope_sin_[static_cast<size_t>(table)].data() + t * half;
    if (config_.rope == rope_style::interleaved) {
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c[i] - b * s[i];
        v[2 * i + 1] = a * s[i] + b * c[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = a * s[i] + b * c[i];
      }
    }
  };

  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const layer_state& L = layers_[static_cast<size_t>(l)];
    const int32_t group = groups_.group_of(l);  // whose block tables hold this layer's K/V
    parallel(T, [&](int64_t t) {
      rms_norm(x_.data() + t * hidden, L.attn_norm.data(), xn_.data() + t * hidden, hidden, eps);
      quantize_rows(L.qkv, xn_.data(), t);
    });
    const int64_t qkv_cols = L.qkv.out_cols;
    linear(4 * l, L.qkv, xn_.data(), hidden, T, qkv_.data(), qkv_cols, false);

    // Biases, per-head q/k norms, RoPE on Q and K, then K and V into their paged slots.
    parallel(T, [&](int64_t t) {
      float* q = qkv_.data() + t * qkv_cols;
      float* kk = q + q_dim;
      const float* v = kk + kv_dim;
      if (!L.qkv_bias.empty()) {
        for (int64_t i = 0; i < qkv_cols; ++i) q[i] += L.qkv_bias[static_cast<size_t>(i)];
      }
      if (!L.q_norm.empty()) {
        for (int32_t h = 0; h < nh; ++h) rms_norm(q + h * hd, L.q_norm.data(), q + h * hd, hd, eps);
        for (int32_t h = 0; h < nkv; ++h) rms_norm(kk + h * hd, L.k_norm.data(), kk + h * hd, hd, eps);
      }
      for (int32_t h = 0; h < nh; ++h) rope(q + static_cast<int64_t>(h) * hd, t, L.rope_table);
      const int32_t pos = layout_.slots[static_cast<size_t>(t)];  // where its K/V goes (a tree row: not its position)
      const auto seq = static_cast<size_t>(layout_.token_seq[static_cast<size_t>(t)]);
      const std::vector<block_id>& table = batch.seqs[seq].table(group);
      const block_id blk = table[static_cast<size_t>(pos / bs)];
      const int32_t slot = pos % bs;
      for (int32_t h = 0; h < nkv; ++h) {
        rope(kk + static_cast<int64_t>(h) * hd, t, L.rope_table);
        cpu::kv_store_k(kv_dt_, kk + static_cast<int64_t>(h) * hd, bs, hd, slot, kv_tile(blk, l, 0, h));
        cpu::kv_store_v(kv_dt_, v + static_cast<int64_t>(h) * hd, bs, hd, slot, kv_tile(blk, l, 1, h));
      }
    });

    // Causal attention of each new token over positions [first, pos], read through the block table;
    // first = 0, or pos - window + 1 on a sliding-window layer (keys older than the window are skipped,
    // as transformers' sliding mask and llama.cpp's LLAMA_SWA_TYPE_STANDARD do). Table entries before
    // first / block_size are never looked at: the engine frees those blocks (no_block) when every layer
    // of the group whose table it is has a window (reads_only_window, kv_layer_groups). Flash-style: a task's rows walk
    // the KV blocks once, a segment (attn_segment_keys) at a time: each row's exact softmax over its keys of
    // the segment, folded into the row's result with the online softmax's rescaling (Dao et al. 2022,
    // FlashAttention, alg. 1), so no row keeps more than one segment of scores. Each row sees the same
    // segments, slots and operations whatever task it is in.
    const int32_t window = L.sliding_window;
    auto write_attention_row = [&](int32_t token, int32_t head, const float* o, float sum) {
      float* out = attn_.data() + int64_t{token} * q_dim + int64_t{head} * hd;
      const float inv = 1.0f / sum;
      for (int32_t d = 0; d < hd; ++d) out[d] = o[d] * inv;
    };
    parallel(static_cast<int64_t>(attn_tasks_.size()), [&](int64_t i) {
      const attn_task& task = attn_tasks_[static_cast<size_t>(i)];
      const std::vector<block_id>& table = batch.seqs[static_cast<size_t>(task.seq)].table(group);
      attn_scratch& sc = scratch_[static_cast<size_t>(thread_index)];
      const int32_t heads = task.head_end - task.head_begin;
      const int32_t rows = (task.token_end - task.token_begin) * heads;
      const int32_t ld = attn_ld_;
      // Rows are token-major, so slots grow with the row index: the rows that reach into a block
      // (causal: n_ctx > its first slot; window: first < its end) are a contiguous range.
      auto n_ctx = [&](int32_t m) { return layout_.slots[static_cast<size_t>(task.token_begin + m / heads)] + 1; };
      // A token tree (sequence_slice::tree_parents): its rows' positions are their depths, not their
      // slots, so they are not monotonic; the walk starts at the root's window (the earliest any row
      // needs) and tree_mask below hides, per row, the keys outside its own window and the tree rows
      // that are not its ancestors.
      const int32_t tree_row0 = layout_.tree_row[static_cast<size_t>(task.token_begin)];
      const bool tree = tree_row0 >= 0;
      const int32_t root_slot = tree ? layout_.slots[static_cast<size_t>(task.token_begin)] - tree_row0 : 0;
      auto first = [&](int32_t m) {
        if (window <= 0) return 0;
        return std::max(0, (tree ? root_slot + 1 : n_ctx(m)) - window);
      };
      // Scores of row m's keys [lo, hi) of the segment whose column 0 is slot `begin` that it may not
      // see: set to kMasked (after any soft-cap), flagged in sc.masked. Returns whether any key is left.
      const int32_t slice_begin = layout_.seqs[static_cast<size_t>(task.seq)].token_begin;
      auto tree_mask = [&](int32_t m, int32_t begin, int32_t lo, int32_t hi, float* sr) {
        const auto tk = static_cast<size_t>(task.token_begin + m / heads);
        const int32_t row = layout_.tree_row[tk], position = layout_.positions[tk];
        bool any = false;
        for (int32_t j = lo; j < hi; ++j) {
          const int32_t key = begin + j;
          bool visible;
          if (key < root_slot) {
            visible = window <= 0 || key > position - window;
          } else {
            const int32_t key_row = key - root_slot;
            const int32_t key_position = layout_.positions[static_cast<size_t>(slice_begin + key_row)];
            visible = layout_.sees(task.seq, row, key_row) && (window <= 0 || key_position > position - window);
          }
          sc.masked[static_cast<size_t>(j)] = visible ? 0 : 1;
          if (!visible) sr[j] = kMasked;
          any = any || visible;
        }
        return any;
      };
      constexpr float no_score = -std::numeric_limits<float>::infinity();
      for (int32_t m = 0; m < rows; ++m) {
        sc.q[static_cast<size_t>(m)] = qkv_.data() + static_cast<int64_t>(task.token_begin + m / heads) * qkv_cols +
                                       static_cast<int64_t>(task.head_begin + m % heads) * hd;
      }
      auto fold_into_result = [&] {
        for (int32_t m = 0; m < rows; ++m) {
          fold_segment(sc.M[static_cast<size_t>(m)], sc.L[static_cast<size_t>(m)], sc.O.data() + int64_t{m} * hd,
                       sc.mx[static_cast<size_t>(m)], sc.l[static_cast<size_t>(m)], sc.o.data() + int64_t{m} * hd, hd);
        }
      };
      // A fresh segment: every row's state empty.
      auto start_segment = [&] {
        std::fill(sc.mx.begin(), sc.mx.begin() + rows, no_score);
        std::fill(sc.l.begin(), sc.l.begin() + rows, 0.0f);
        std::fill(sc.o.begin(), sc.o.begin() + static_cast<int64_t>(rows) * hd, 0.0f);
      };
      start_segment();
      std::fill(sc.M.begin(), sc.M.begin() + rows, no_score);
      std::fill(sc.L.begin(), sc.L.begin() + rows, 0.0f);
      std::fill(sc.O.begin(), sc.O.begin() + static_cast<int64_t>(rows) * hd, 0.0f);
      const int32_t ctx_end = n_ctx(rows - 1);
      cpu::attn_block_args a;
      a.dtype = kv_dt_;
      a.block_size = bs;
      a.head_dim = hd;
      a.scale = scale;
      a.ld = ld;
      a.o_ld = hd;
      int32_t m_lo = 0, m_hi = 0;
      // The blocks this task walks: all the rows reach, or those of its segment.
      const int32_t seg = segment_blocks_;
      int32_t b_begin = first(0) / bs;
      int32_t b_end = (ctx_end + bs - 1) / bs;
      if (task.segment >= 0) {
        b_begin = std::max(b_begin, task.segment * seg);
        b_end = std::min(b_end, (task.segment + 1) * seg);
      }
      // One segment at a time: the scores of all its blocks, then each row's softmax over its keys of the
      // segment in one pass (a decode row's 128 keys at once, not 16 at a time with a rescale per block:
      // the per-block max, exp and bookkeeping cost more than the tiles' dot products), then the V tiles.
      // Column c of a row's scores is the segment's key seg_begin + c.
      for (int32_t g_first = b_begin; g_first < b_end;) {
        const int32_t g_end = std::min(b_end, (g_first / seg + 1) * seg);
        const int32_t seg_begin = g_first * bs;
        int32_t walked = 0;  // blocks of the segment some row reaches, in sc.blocks
        for (int32_t b = g_first; b < g_end; ++b) {
          // The K and V tiles of a sequence's blocks are scattered through the pool (the block table's
          // order), so no hardware prefetcher follows them: the next block's tiles are asked for while
          // this one is computed. A decode step's attention waited on these loads for most of its time
          // (SmolLM2, context 512..768: 4.77 -> 4.08 ms per token; two blocks ahead measured the same).
          // Into L2 (prefetcht1), not L1: on Zen 4 the L1 requests held the tile loads up (attention
          // 1,000-1,460 -> 770-1,080 us per token at context 512..640; two, four or eight blocks ahead
          // were slower, 2026-12-06).
          const block_id next = b + 1 < b_end ? table[static_cast<size_t>(b + 1)] : no_block;
          if (next >= 0) {  // (a block no row reaches is skipped below without looking at its entry)
            for (int kind = 0; kind < 2; ++kind) {
              const std::byte* t = kv_tile(next, l, kind, task.kv_head);
              for (int64_t off = 0; off < tile_bytes_; off += 64) __builtin_prefetch(t + off, 0, 2);
            }
          }
          const int32_t begin = b * bs;
          while (m_lo < rows && n_ctx(m_lo) <= begin) ++m_lo;
          m_hi = std::max(m_hi, m_lo);
          while (m_hi < rows && first(m_hi) < begin + bs) ++m_hi;
          if (m_lo >= m_hi) continue;
          const int32_t n = std::min(bs, n_ctx(m_hi - 1) - begin);
          a.tile = kv_tile(table[static_cast<size_t>(b)], l, 0, task.kv_head);
          a.n = n;
          a.rows = m_hi - m_lo;
          a.q = sc.q.data() + m_lo;
          a.s = sc.s.data() + static_cast<int64_t>(m_lo) * ld + (begin - seg_begin);
          k.attn_scores(a);
          sc.blocks[static_cast<size_t>(walked++)] = {b, m_lo, m_hi, n};
        }
        if (walked == 0) {  // no row's keys reach into this segment (before a window)
          g_first = g_end;
          continue;
        }
        // Each row that reaches into the segment: its keys are one run [lo, hi) of the columns (causal
        // and window limits; a tree row's hidden keys masked inside it), all of them computed above.
        const segment_block& last = sc.blocks[static_cast<size_t>(walked - 1)];
        const int32_t width = last.block * bs + last.n - seg_begin;
        for (int32_t m = sc.blocks[0].m_lo; m < last.m_hi; ++m) {
          float* sr = sc.s.data() + static_cast<int64_t>(m) * ld;
          const int32_t lo = std::max(first(m), seg_begin) - seg_begin;
          const int32_t hi = std::min(n_ctx(m), seg_begin + width) - seg_begin;
          bool any = lo < hi;
          if (any && feat.attn_softcap.on()) soft_cap(sr + lo, hi - lo, feat.attn_softcap.cap);
          if (any && tree) any = tree_mask(m, seg_begin, lo, hi, sr);
          if (!any) {  // a row none of whose keys is in this segment adds nothing
            std::fill(sr, sr + width, 0.0f);
            continue;
          }
          const float mx = max_of(sr + lo, hi - lo);
          float sum = k.softmax_exp(sr + lo, hi - lo, mx);
          if (tree) {  // a masked key adds exactly nothing, whatever the exp approximation made of it
            for (int32_t j = lo; j < hi; ++j) {
              if (sc.masked[static_cast<size_t>(j)] == 0) continue;
              sum -= sr[j];
              sr[j] = 0.0f;
            }
          }
          std::fill(sr, sr + lo, 0.0f);
          std::fill(sr + hi, sr + width, 0.0f);
          sc.mx[static_cast<size_t>(m)] = mx;
          sc.l[static_cast<size_t>(m)] = sum;
        }
        for (const segment_block& w : std::span(sc.blocks).first(static_cast<size_t>(walked))) {
          a.tile = kv_tile(table[static_cast<size_t>(w.block)], l, 1, task.kv_head);
          a.n = w.n;
          a.rows = w.m_hi - w.m_lo;
          a.s = sc.s.data() + static_cast<int64_t>(w.m_lo) * ld + (w.block * bs - seg_begin);
          a.o = sc.o.data() + static_cast<int64_t>(w.m_lo) * hd;
          k.attn_accumulate(a);
        }
        g_first = g_end;
        if (task.segment < 0) {
          fold_into_result();
          start_segment();
        }
      }
      if (task.segment >= 0) {  // the segment's states, for attn_merge
        const int64_t state = partial_state_floats(hd);
        for (int32_t m = 0; m < rows; ++m) {
          float* p = attn_partials_.data() + task.partials + (int64_t{m} * task.num_segments + task.segment) * state;
          p[0] = sc.mx[static_cast<size_t>(m)];
          p[1] = sc.l[static_cast<size_t>(m)];
          std::copy_n(sc.o.data() + int64_t{m} * hd, hd, p + 2);
        }
        return;
      }
      for (int32_t m = 0; m < rows; ++m) {
        write_attention_row(task.token_begin + m / heads, task.head_begin + m % heads, sc.O.data() + int64_t{m} * hd,
                            sc.L[static_cast<size_t>(m)]);
      }
    });
    // The split tasks' rows: their segments folded in key order, as an unsplit task folds them.
    if (!attn_merges_.empty())
      parallel(static_cast<int64_t>(attn_merges_.size()), [&](int64_t i) {
        const attn_merge& mg = attn_merges_[static_cast<size_t>(i)];
        attn_scratch& sc = scratch_[static_cast<size_t>(thread_index)];
        const int32_t heads = mg.head_end - mg.head_begin;
        const int32_t rows = (mg.token_end - mg.token_begin) * heads;
        const int64_t state = partial_state_floats(hd);
        for (int32_t m = 0; m < rows; ++m) {
          float mx = -std::numeric_limits<float>::infinity(), sum = 0.0f;
          float* o = sc.O.data();
          std::fill(o, o + hd, 0.0f);
          for (int32_t g = 0; g < mg.num_segments; ++g) {
            const float* p = attn_partials_.data() + mg.partials + (int64_t{m} * mg.num_segments + g) * state;
            fold_segment(mx, sum, o, p[0], p[1], p + 2, hd);
          }
          write_attention_row(mg.token_begin + m / heads, mg.head_begin + m % heads, o, sum);
        }
      });

    // Output projection: added to the residual directly, or (post_norms) normed first.
    if (L.wo.needs_conversion()) parallel(T, [&](int64_t t) { quantize_rows(L.wo, attn_.data(), t); });
    if (feat.post_norms) {
      linear(4 * l + 1, L.wo, attn_.data(), q_dim, T, tmp_.data(), hidden, false);
      parallel(T, [&](int64_t t) {
        add_rms_norm(x_.data() + t * hidden, tmp_.data() + t * hidden, L.post_attn_norm.data(), hidden, eps);
      });
    } else {
      linear(4 * l + 1, L.wo, attn_.data(), q_dim, T, x_.data(), hidden, true);
    }

    parallel(T, [&](int64_t t) {
      rms_norm(x_.data() + t * hidden, L.ffn_norm.data(), xn_.data() + t * hidden, hidden, eps);
      quantize_rows(L.gate_up, xn_.data(), t);
    });
    linear(4 * l + 2, L.gate_up, xn_.data(), hidden, T, gu_.data(), 2 * ffn, false);

    parallel(T, [&](int64_t t) {
      const float* g = gu_.data() + t * 2 * ffn;
      const float* u = g + ffn;
      float* m = mlp_.data() + t * ffn;
      if (feat.activation == ffn_activation::gelu_tanh) {
        gelu_tanh_mul(g, u, m, ffn);
      } else {
        k.silu_mul(g, u, m, ffn);
      }
      quantize_rows(L.down, mlp_.data(), t);
    });
    if (feat.post_norms) {
      linear(4 * l + 3, L.down, mlp_.data(), ffn, T, tmp_.data(), hidden, false);
      parallel(T, [&](int64_t t) {
        add_rms_norm(x_.data() + t * hidden, tmp_.data() + t * hidden, L.post_ffn_norm.data(), hidden, eps);
      });
    } else {
      linear(4 * l + 3, L.down, mlp_.data(), ffn, T, x_.data(), hidden, true);
    }
  }

  // Embeddings: the final norm of each pooled sequence's rows (what transformers calls the last
  // hidden state), summed over the slice for mean pooling or of its last row only. One task per
  // sequence, its rows in order, so the sum does not depend on the thread count.
  parallel(static_cast<int64_t>(layout_.pooled_seqs.size()), [&](int64_t j) {
    const auto s = static_cast<size_t>(layout_.pooled_seqs[static_cast<size_t>(j)]);
    const step_layout::sequence_rows& sr = layout_.seqs[s];
    float* dst = hidden_out_ + j * hidden;
    if (batch.seqs[s].hidden == sequence_slice::hidden_mode::last) {
      rms_norm(x_.data() + (sr.token_begin + sr.num_tokens - 1) * hidden, output_norm_.data(), dst, hidden, eps);
      return;
    }
    float* row = px_.data() + j * hidden;
    for (int32_t t = sr.token_begin; t < sr.token_begin + sr.num_tokens; ++t) {
      rms_norm(x_.data() + t * hidden, output_norm_.data(), row, hidden, eps);
      for (int64_t d = 0; d < hidden; ++d) dst[d] += row[d];
    }
  });

  // Prompt logprobs: the scored rows' final norm and LM head, a group at a time (plan_step), each row
  // then reduced to its target's logprob and rank and the top tokens (engine/prompt_logprobs.hpp); only
  // those leave the executor.
  const auto S = static_cast<int64_t>(layout_.scored_tokens.size());
  const int32_t vocab = config_.vocab_size;
  for (int64_t g0 = 0; g0 < S; g0 += score_rows_) {
    const int64_t G = std::min(score_rows_, S - g0);
    parallel(G, [&](int64_t r) {
      rms_norm(x_.data() + layout_.scored_tokens[static_cast<size_t>(g0 + r)] * hidden, output_norm_.data(),
               sx_.data() + r * hidden, hidden, eps);
      quantize_rows(output_, sx_.data(), r);
    });
    linear(num_linears() - 1, output_, sx_.data(), hidden, static_cast<int32_t>(G), slogits_.data(), vocab, false);
    parallel(G, [&](int64_t r) {
      float* row = slogits_.data() + r * vocab;
      if (feat.final_softcap.on()) soft_cap(row, vocab, feat.final_softcap.cap);
      const auto at = static_cast<size_t>(g0 + r);
      scored_out_[at] =
          score_prompt_row({row, static_cast<size_t>(vocab)}, layout_.scored_targets[at], layout_.scored_top_k[at]);
    });
  }

  // Final norm of the rows whose logits were asked for, then the output projection.
  const auto R = static_cast<int64_t>(layout_.logit_tokens.size());
  if (R == 0) return;
  parallel(R, [&](int64_t r) {
    rms_norm(x_.data() + layout_.logit_tokens[static_cast<size_t>(r)] * hidden, output_norm_.data(),
             lx_.data() + r * hidden, hidden, eps);
    quantize_rows(output_, lx_.data(), r);
  });
  linear(num_linears() - 1, output_, lx_.data(), hidden, static_cast<int32_t>(R), logits_out_, config_.vocab_size,
         false);
  if (feat.final_softcap.on()) {
    parallel(R, [&](int64_t r) {
      soft_cap(logits_out_ + r * config_.vocab_size, config_.vocab_size, feat.final_softcap.cap);
    });
  }
}

}  // namespace

std::unique_ptr<executor> make_cpu_executor(std::shared_ptr<const model_weights> weights,
                                            const cpu_executor_options& options) {
  return std::make_unique<cpu_executor>(std::move(weights), options);
}

std::optional<cpu_kv_dtype> parse_cpu_kv_dtype(std::string_view name) {
  for (const cpu_kv_dtype d :
       {cpu_kv_dtype::automatic, cpu_kv_dtype::fp32, cpu_kv_dtype::fp16, cpu_kv_dtype::bf16, cpu_kv_dtype::int8}) {
    if (name == to_string(d)) return d;
  }
  return std::nullopt;
}

const char* to_string(cpu_kv_dtype d) {
  switch (d) {
    case cpu_kv_dtype::automatic: return "auto";
    case cpu_kv_dtype::fp32: return "fp32";
    case cpu_kv_dtype::fp16: return "fp16";
    case cpu_kv_dtype::bf16: return "bf16";
    case cpu_kv_dtype::int8: return "int8";
  }
  return "?";
}

cpu_kv_dtype resolve(cpu_kv_dtype d, bool dequantize_weights) {
  if (d != cpu_kv_dtype::automatic) return d;
  return dequantize_weights ? cpu_kv_dtype::fp32 : cpu_kv_dtype::fp16;
}

int64_t cpu_kv_block_bytes(const model_config& config, int32_t block_size, cpu_kv_dtype dtype,
                           int32_t layers_per_block) {
  return static_cast<int64_t>(layers_per_block > 0 ? layers_per_block : config.num_layers) * 2 * config.num_kv_heads *
         cpu::kv_tile_bytes(to_kernel_dtype(dtype), block_size, config.head_dim);
}

int32_t kv_blocks_for_bytes(const model_config& config, int32_t block_size, int64_t bytes, cpu_kv_dtype dtype,
                            int32_t layers_per_block) {
  const int64_t per_block = cpu_kv_block_bytes(config, block_size, dtype, layers_per_block);
  if (per_block <= 0 || bytes <= 0) return 0;
  return static_cast<int32_t>(std::min<int64_t>(bytes / per_block, std::numeric_limits<int32_t>::max()));
}

}  // namespace tessera
