// CUDA kernels against the CPU references of tests/gpu/reference.hpp. GPU tests skip (with the reason)
// where no GPU is present, which is the case in CI; scripts/gpu-check.sh runs them on a machine with
// one (and under compute-sanitizer memcheck). The ReferenceSelfCheck tests need no GPU: they check
// the references themselves against independent formulations, so a wrong reference cannot make a
// wrong kernel pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <random>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "gpu/attention.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/prefill_attention.hpp"
#include "tests/gpu/decode_kernels.hpp"
#include "tests/gpu/device_fixture.hpp"
#include "tests/gpu/reference.hpp"
#include "tests/gpu/test_data.hpp"

namespace tessera::gpu {
namespace {

class GpuKernels : public device_fixture<> {
 protected:
  static bf16* as_bf16(uint16_t* p) { return reinterpret_cast<bf16*>(p); }

  // The executor's split-KV plan for queries walking `walk` positions (a wave of the kernel on the
  // emulation's 132 SMs), or `forced_splits` (> 1) splits.
  template <class Args>
  void plan_split(Args& a, int32_t num_kv_heads, int32_t head_dim, int32_t walk, int32_t forced_splits) {
    split_plan plan =
        plan_attention_split(a.num_tokens, a.num_heads, num_kv_heads, walk, {132, paged_attention_ctas_per_sm(a)});
    if (forced_splits > 1) plan = {forced_splits, (walk + forced_splits - 1) / forced_splits};
    a.num_splits = plan.num_splits;
    a.partition_size = plan.partition_size;
    if (plan.num_splits > 1) {
      a.workspace = alloc(size_t(attention_workspace_floats(a.num_tokens, a.num_heads, head_dim, plan.num_splits)));
      if constexpr (requires { a.split_counters; }) {
        if (fused_merge_) a.split_counters = alloc<int32_t>(size_t(a.num_tokens) * a.num_heads);
      }
    }
  }
  // plan_split's paged_attention launches merge their splits in the attention kernel (the executor's
  // way) instead of a second kernel.
  bool fused_merge_ = false;
  // run_paged_attention's kernel (paged_attention_args::kernel).
  decode_kernel kernel_ = decode_kernel::warp_tiles;

  // paged_attention over `kv` as an f32 or a bf16 cache (`fill` sets every other argument), as floats.
  template <class Fill>
  std::vector<float> run_paged_attention(bool bf16_cache, const std::vector<float>& kv, size_t out_elems,
                                         const Fill& fill) {
    if (bf16_cache) {
      paged_attention_args<bf16> a;
      fill(a);
      a.kernel = kernel_;
      a.kv_cache = as_bf16(upload(to_bf16(kv)));
      uint16_t* out = alloc<uint16_t>(out_elems);
      a.out = as_bf16(out);
      paged_attention(a, nullptr);
      return from_bf16(download(out, out_elems));
    }
    paged_attention_args<float> a;
    fill(a);
    a.kernel = kernel_;
    a.kv_cache = upload(kv);
    float* out = alloc(out_elems);
    a.out = out;
    paged_attention(a, nullptr);
    return download(out, out_elems);
  }
};

TEST_F(GpuKernels, EmbeddingGatherMatchesCpu) {
  const int32_t vocab = 1000, hidden = 576, rows = 37;
  auto table = random_floats(size_t(vocab) * hidden, 1);
  std::vector<int32_t> ids(rows);
  for (int32_t r = 0; r < rows; ++r) ids[r] = (r * 997 + 13) % vocab;
  ids[5] = -1;  // out of range: a zero row, never a wild read
  float* out = alloc(size_t(rows) * hidden);
  embedding_gather(out, upload(table), upload(ids), rows, hidden, vocab, nullptr);
  auto got = download(out, size_t(rows) * hidden);
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t i = 0; i < hidden; ++i)
      ASSERT_EQ(got[size_t(r) * hidden + i], r == 5 ? 0.0f : table[size_t(ids[r]) * hidden + i]);

  const auto table16 = to_bf16(table);
  float* out16 = alloc(size_t(rows) * hidden);
  embedding_gather(out16, as_bf16(upload(table16)), upload(ids), rows, hidden, vocab, nullptr);
  got = download(out16, size_t(rows) * hidden);
  for (int32_t r = 0; r < rows; ++r) {
    if (r == 5) continue;
    for (int32_t i = 0; i < hidden; ++i)
      ASSERT_EQ(got[size_t(r) * hidden + i], bf16_to_fp32(table16[size_t(ids[r]) * hidden + i]));
  }
  // Gemma's sqrt(hidden) scale, in fp32 after the lookup (as the CPU executor).
  const float scale = std::sqrt(float(hidden));
  float* scaled = alloc(size_t(rows) * hidden);
  embedding_gather(scaled, as_bf16(upload(table16)), upload(ids), rows, hidden, vocab, nullptr, scale);
  got = download(scaled, size_t(rows) * hidden);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t i = 0; i < hidden; ++i) {
      ASSERT_EQ(got[size_t(r) * hidden + i],
                r == 5 ? 0.0f : bf16_to_fp32(table16[size_t(ids[r]) * hidden + i]) * scale);
    }
  }
}

// hidden 576 and 8192 take the row-in-registers kernel (hidden % 4 == 0, at most 8192), 570 and 8196
// the general one.
class GpuNorm : public GpuKernels, public ::testing::WithParamInterface<int32_t> {};

TEST_P(GpuNorm, AddRmsNormMatchesCpu) {
  const int32_t rows = 19, hidden = GetParam();
  const float eps = 1e-5f;
  auto residual = random_floats(size_t(rows) * hidden, 2);
  auto x = random_floats(size_t(rows) * hidden, 3);
  auto weight = random_floats(hidden, 4);
  std::vector<float> sum(residual.size()), want(residual.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + x[i];
  for (int32_t r = 0; r < rows; ++r)
    ref::rms_norm(&sum[size_t(r) * hidden], weight.data(), &want[size_t(r) * hidden], hidden, eps);

  float* d_res = upload(residual);
  float* out = alloc(residual.size());
  add_rms_norm(out, d_res, upload(x), upload(weight), rows, hidden, eps, nullptr);
  auto got = download(out, residual.size());
  auto got_res = download(d_res, residual.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    ASSERT_NEAR(got_res[i], sum[i], 1e-6f);
    ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
  }
  // bf16 output, no add: the residual is left alone and the output is the rounded norm.
  float* d_res2 = upload(sum);
  uint16_t* out16 = alloc<uint16_t>(sum.size());
  add_rms_norm(as_bf16(out16), d_res2, nullptr, upload(weight), rows, hidden, eps, nullptr);
  const auto got16 = from_bf16(download(out16, sum.size()));
  EXPECT_EQ(download(d_res2, sum.size()), sum);
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_NEAR(got16[i], want[i], 8e-3 * (1 + std::fabs(want[i]))) << i;
}

TEST_P(GpuNorm, RmsNormRowsNormalisesOnlyTheChosenRows) {
  const int32_t rows = 9, hidden = GetParam();
  auto x = random_floats(size_t(rows) * hidden, 21);
  auto weight = random_floats(hidden, 22);
  const std::vector<int32_t> pick = {8, 0, 3};
  std::vector<float> want(pick.size() * hidden);
  for (size_t r = 0; r < pick.size(); ++r)
    ref::rms_norm(&x[size_t(pick[r]) * hidden], weight.data(), &want[r * hidden], hidden, 1e-6f);
  float* out = alloc(want.size());
  rms_norm_rows(out, upload(x), upload(pick), upload(weight), 3, hidden, 1e-6f, nullptr);
  const auto got = download(out, want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i])));
}

// Gemma's post-norms: x += rms_norm(y) * post_w, then the next pre-norm of x, in one launch; and the
// last layer's, folded into the final norm of the chosen rows (x left alone there).
TEST_P(GpuNorm, PostNormAddRmsNormMatchesCpu) {
  const int32_t rows = 11, hidden = GetParam();
  const float eps = 1e-6f;
  auto residual = random_floats(size_t(rows) * hidden, 61);
  auto y = random_floats(size_t(rows) * hidden, 62, 3.0f);
  auto post_w = random_floats(hidden, 63);
  auto weight = random_floats(hidden, 64);
  std::vector<float> sum(residual.size()), want(residual.size()), normed(hidden);
  for (int32_t r = 0; r < rows; ++r) {
    ref::rms_norm(&y[size_t(r) * hidden], post_w.data(), normed.data(), hidden, eps);
    for (int32_t i = 0; i < hidden; ++i)
      sum[size_t(r) * hidden + i] = residual[size_t(r) * hidden + i] + normed[size_t(i)];
    ref::rms_norm(&sum[size_t(r) * hidden], weight.data(), &want[size_t(r) * hidden], hidden, eps);
  }
  const float* d_y = upload(y);
  const float* d_post = upload(post_w);
  float* d_res = upload(residual);
  uint16_t* out16 = alloc<uint16_t>(sum.size());
  post_norm_add_rms_norm(as_bf16(out16), d_res, d_y, d_post, upload(weight), rows, hidden, eps, nullptr);
  const auto got_res = download(d_res, sum.size());
  const auto got16 = from_bf16(download(out16, sum.size()));
  for (size_t i = 0; i < sum.size(); ++i) {
    ASSERT_NEAR(got_res[i], sum[i], 2e-5 * (1 + std::fabs(sum[i]))) << i;
    ASSERT_NEAR(got16[i], want[i], 8e-3 * (1 + std::fabs(want[i]))) << i;
  }
  // Without an output: only the residual moves.
  float* d_res2 = upload(residual);
  post_norm_add_rms_norm(static_cast<float*>(nullptr), d_res2, d_y, d_post, nullptr, rows, hidden, eps, nullptr);
  const auto got_res2 = download(d_res2, sum.size());
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_NEAR(got_res2[i], sum[i], 2e-5 * (1 + std::fabs(sum[i]))) << i;
  // The final norm of rows {7, 2} with the post-norm folded in; the source rows are not written.
  const std::vector<int32_t> pick = {7, 2};
  float* d_res3 = upload(residual);
  float* out = alloc(pick.size() * hidden);
  rms_norm_rows(out, d_res3, upload(pick), upload(weight), 2, hidden, eps, nullptr, d_y, d_post);
  const auto got = download(out, pick.size() * hidden);
  EXPECT_EQ(download(d_res3, residual.size()), residual);
  for (size_t r = 0; r < pick.size(); ++r) {
    for (int32_t i = 0; i < hidden; ++i) {
      const float w = want[size_t(pick[r]) * hidden + i];
      ASSERT_NEAR(got[r * hidden + i], w, 1e-4 * (1 + std::fabs(w))) << r << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Hidden, GpuNorm, ::testing::Values(576, 8192, 570, 8196));

TEST_F(GpuKernels, SiluAndMulMatchesCpu) {
  const int32_t rows = 7, inter = 1536;
  auto gate_up = random_floats(size_t(rows) * 2 * inter, 5);
  float* out = alloc(size_t(rows) * inter);
  float* d_gu = upload(gate_up);
  silu_and_mul(out, d_gu, rows, inter, nullptr);
  uint16_t* out16 = alloc<uint16_t>(size_t(rows) * inter);
  silu_and_mul(as_bf16(out16), d_gu, rows, inter, nullptr);
  auto got = download(out, size_t(rows) * inter);
  auto got16 = from_bf16(download(out16, size_t(rows) * inter));
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t i = 0; i < inter; ++i) {
      const double g = gate_up[size_t(r) * 2 * inter + i], u = gate_up[size_t(r) * 2 * inter + inter + i];
      const double want = g / (1.0 + std::exp(-g)) * u;
      ASSERT_NEAR(got[size_t(r) * inter + i], want, 1e-5 * (1 + std::fabs(want)));
      ASSERT_NEAR(got16[size_t(r) * inter + i], want, 8e-3 * (1 + std::fabs(want)));
    }
}

TEST_F(GpuKernels, GeluTanhAndMulMatchesCpu) {
  const int32_t rows = 5, inter = 1000;
  auto gate_up = random_floats(size_t(rows) * 2 * inter, 65, 2.0f);
  float* d_gu = upload(gate_up);
  float* out = alloc(size_t(rows) * inter);
  uint16_t* out16 = alloc<uint16_t>(size_t(rows) * inter);
  gelu_tanh_and_mul(out, d_gu, rows, inter, nullptr);
  gelu_tanh_and_mul(as_bf16(out16), d_gu, rows, inter, nullptr);
  const auto got = download(out, size_t(rows) * inter);
  const auto got16 = from_bf16(download(out16, size_t(rows) * inter));
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t i = 0; i < inter; ++i) {
      // GELU's tanh approximation in double (Hendrycks & Gimpel 2016).
      const double g = gate_up[size_t(r) * 2 * inter + i], u = gate_up[size_t(r) * 2 * inter + inter + i];
      const double want = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
      ASSERT_NEAR(got[size_t(r) * inter + i], want, 1e-5 * (1 + std::fabs(want))) << r << " " << i;
      ASSERT_NEAR(got16[size_t(r) * inter + i], want, 8e-3 * (1 + std::fabs(want))) << r << " " << i;
    }
  }
}

TEST_F(GpuKernels, SoftCapMatchesCpu) {
  const int64_t n = 3 * 1000 + 7;
  auto x = random_floats(size_t(n), 66, 20.0f);  // well past the cap: the tanh's saturation
  float* d = upload(x);
  soft_cap(d, n, 30.0f, nullptr);
  const auto got = download(d, size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const double want = 30.0 * std::tanh(double(x[size_t(i)]) / 30.0);
    ASSERT_NEAR(got[size_t(i)], want, 1e-5 * (1 + std::fabs(want))) << i;
  }
  EXPECT_THROW(soft_cap(d, n, 0.0f, nullptr), std::invalid_argument);
}

// ---- RoPE + paged KV write ------------------------------------------------------------------------

struct rope_case {
  rope_style style;
  int32_t rope_dims;  // < head_dim: partial rotary
  bool bf16_cache;
  int32_t head_dim = 64;
  bool bias = false;              // Q|K|V biases (Qwen2)
  bool qk_norm = false;           // per-head q/k RMSNorm (Qwen3, Gemma 3): the warp-per-head kernel
  float attention_factor = 1.0f;  // YaRN / LongRoPE cos/sin multiplier
};

// Deterministic test names for ctest (the default prints the struct's bytes, padding included).
void PrintTo(const rope_case& c, std::ostream* os) {
  *os << (c.style == rope_style::half ? "half" : "interleaved") << "_d" << c.head_dim << "_rope" << c.rope_dims
      << (c.bf16_cache ? "_bf16" : "_f32") << (c.bias ? "_bias" : "") << (c.qk_norm ? "_qknorm" : "")
      << (c.attention_factor != 1.0f ? "_factor" : "");
}

class GpuRopeKv : public GpuKernels, public ::testing::WithParamInterface<rope_case> {};

TEST_P(GpuRopeKv, MatchesCpuAndWritesTheRightSlots) {
  const rope_case c = GetParam();
  ref::kv_geometry g{3, 2, 16, c.head_dim};
  const int32_t num_heads = 6, num_blocks = 7, layer = 1;
  const int64_t stride = int64_t{num_heads + 2 * g.num_kv_heads} * g.head_dim + 8;  // padded rows
  // 11 tokens of two sequences at scattered positions / slots (block tables out of order).
  const std::vector<int32_t> positions = {0, 1, 2, 15, 16, 17, 40, 3, 4, 1000, 4094};  // no two share a slot
  std::vector<int32_t> slots;
  for (size_t t = 0; t < positions.size(); ++t)
    slots.push_back(int32_t((t * 5 + 3) % num_blocks) * g.block_size + positions[t] % g.block_size);
  auto qkv = random_floats(positions.size() * stride, 7);
  const auto freq = ref::inv_freq(c.rope_dims, 10000.0f);
  const size_t cache_elems = size_t(num_blocks) * g.block_elems();
  ref::rope_extras extras;
  extras.attention_factor = c.attention_factor;
  extras.eps = 1e-6f;
  if (c.bias) extras.bias = random_floats(size_t(num_heads + 2 * g.num_kv_heads) * g.head_dim, 8, 0.5f);
  if (c.qk_norm) {
    extras.q_norm = random_floats(size_t(g.head_dim), 9);
    extras.k_norm = random_floats(size_t(g.head_dim), 10);
  }
  std::vector<float> want_kv(cache_elems, 0.0f), want_qkv = qkv;
  ref::rope_kv_write(want_qkv, stride, want_kv, g, layer, num_heads, positions, slots, freq, c.style, extras);

  rope_kv_args a;
  a.qkv = upload(qkv);
  a.qkv_stride = stride;
  a.positions = upload(positions);
  a.slot_mapping = upload(slots);
  a.inv_freq = upload(freq);
  a.num_tokens = int32_t(positions.size());
  a.num_heads = num_heads;
  a.rope_dims = c.rope_dims;
  a.interleaved_pairs = c.style == rope_style::interleaved;
  a.layer = layer;
  a.layout = {g.num_layers, g.num_kv_heads, g.block_size, g.head_dim};
  a.attention_factor = c.attention_factor;
  a.eps = extras.eps;
  if (c.bias) a.bias = upload(extras.bias);
  if (c.qk_norm) {
    a.q_norm = upload(extras.q_norm);
    a.k_norm = upload(extras.k_norm);
  }
  std::vector<float> got_kv;
  if (c.bf16_cache) {
    uint16_t* kv = alloc<uint16_t>(cache_elems);
    rope_kv_write(a, as_bf16(kv), nullptr);
    got_kv = from_bf16(download(kv, cache_elems));
    want_kv = round_bf16(want_kv);
  } else {
    float* kv = alloc(cache_elems);
    rope_kv_write(a, kv, nullptr);
    got_kv = download(kv, cache_elems);
  }
  const auto got_qkv = download(a.qkv, qkv.size());
  // The rows' processed Q|K|V (with biases and norms, V too); the padding past them untouched.
  for (size_t i = 0; i < qkv.size(); ++i)
    ASSERT_NEAR(got_qkv[i], want_qkv[i], 2e-5 * (1 + std::fabs(want_qkv[i]))) << i;
  // Every element of the cache: written slots equal, untouched ones still zero.
  for (size_t i = 0; i < cache_elems; ++i) ASSERT_NEAR(got_kv[i], want_kv[i], 1e-2 * (1 + std::fabs(want_kv[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuRopeKv,
                         ::testing::Values(rope_case{rope_style::interleaved, 64, false},
                                           rope_case{rope_style::half, 64, false},
                                           rope_case{rope_style::half, 32, false},
                                           rope_case{rope_style::interleaved, 48, true},
                                           rope_case{rope_style::half, 64, true},
                                           // per-pair kernel with a cos/sin multiplier (Phi-3 LongRoPE)
                                           rope_case{rope_style::half, 64, false, 64, false, false, 1.19f},
                                           // warp-per-head kernel: bias alone (Qwen2, YaRN factor),
                                           // q/k norm alone (Qwen3: head_dim 32 and 128), both, partial
                                           // rotary, head_dim 256 (Gemma)
                                           rope_case{rope_style::half, 64, false, 64, true, false, 1.14f},
                                           rope_case{rope_style::half, 32, true, 32, false, true},
                                           rope_case{rope_style::half, 128, false, 128, false, true},
                                           rope_case{rope_style::interleaved, 64, true, 64, true, true, 1.3f},
                                           rope_case{rope_style::half, 48, false, 64, true, true},
                                           rope_case{rope_style::half, 256, true, 256, true, true}));

TEST_F(GpuKernels, RopeRejectsAQNormWithoutAKNorm) {
  rope_kv_args a;
  a.num_tokens = 1;
  a.num_heads = 2;
  a.rope_dims = 64;
  a.layout = {1, 1, 16, 64};
  const std::vector<float> w(64, 1.0f);
  a.q_norm = upload(w);
  float* kv = alloc(size_t(2) * 16 * 64);
  EXPECT_THROW(rope_kv_write(a, kv, nullptr), std::invalid_argument);
}

// ---- paged attention ------------------------------------------------------------------------------

struct attention_case {
  int32_t head_dim;
  int32_t num_heads;
  int32_t num_kv_heads;
  bool prefill;        // several query tokens per sequence, causal (chunked prefill over cached prefix)
  int32_t num_splits;  // 0: the executor's plan; >1 forced
  bool bf16;
  int32_t window = 0;    // sliding window (Mistral, Gemma's local layers)
  float softcap = 0.0f;  // attention logit soft-cap (Gemma 2)
};

void PrintTo(const attention_case& c, std::ostream* os) {
  *os << "d" << c.head_dim << "_h" << c.num_heads << "_kv" << c.num_kv_heads << (c.prefill ? "_prefill" : "_decode")
      << "_splits" << c.num_splits << (c.bf16 ? "_bf16" : "_f32");
  if (c.window > 0) *os << "_window" << c.window;
  if (c.softcap > 0) *os << "_softcap";
}

// Sets every element of the blocks that lie wholly before `first` in the sequence's table to NaN: an
// attention kernel that reads them (even to mask them) gives NaN, so this checks it skips them.
void poison_blocks_before(std::vector<float>& kv, const ref::kv_geometry& g, const int32_t* table, int32_t first) {
  for (int32_t b = 0; (b + 1) * g.block_size <= first; ++b) {
    std::fill_n(kv.begin() + table[b] * g.block_elems(), g.block_elems(), std::nanf(""));
  }
}

class GpuAttention : public GpuKernels, public ::testing::WithParamInterface<attention_case> {};

TEST_P(GpuAttention, MatchesCpuReference) {
  const attention_case c = GetParam();
  ref::kv_geometry g{2, c.num_kv_heads, 16, c.head_dim};
  const int32_t layer = 1;
  // Three sequences with scattered block tables; contexts chosen to end mid-block and at a block edge.
  const std::vector<int32_t> seq_len = {37, 16, 301};
  const int32_t max_blocks = (301 + 15) / 16;
  const int32_t num_blocks = 3 * max_blocks + 5;
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(11));
  std::vector<int32_t> tables(size_t(3) * max_blocks, 0);
  for (int32_t s = 0, next = 0; s < 3; ++s)
    for (int32_t b = 0; b < (seq_len[s] + 15) / 16; ++b) tables[size_t(s) * max_blocks + b] = perm[size_t(next++)];
  std::vector<int32_t> context, token_seq;
  for (int32_t s = 0; s < 3; ++s) {
    // decode: the last position; prefill: a chunk of the last 20 positions (earlier ones cached)
    const int32_t first = c.prefill ? std::max(0, seq_len[s] - 20) : seq_len[s] - 1;
    for (int32_t p = first; p < seq_len[s]; ++p) {
      context.push_back(p + 1);
      token_seq.push_back(s);
    }
  }
  const auto T = int32_t(context.size());
  const int64_t q_stride = int64_t{c.num_heads} * c.head_dim + 16;
  // Scores of ~N(0, 4) when soft-capped, so that the cap of 3 bends them.
  auto q = random_floats(size_t(T) * q_stride, 12, c.softcap > 0 ? 2.0f : 1.0f);
  auto kv = random_floats(size_t(num_blocks) * g.block_elems(), 13);
  if (c.bf16) kv = round_bf16(kv);
  if (c.window > 0) {
    // The earliest query of each sequence sees from its window's start: blocks before it are NaN.
    for (int32_t s = 0; s < 3; ++s) {
      const int32_t first_query = c.prefill ? std::max(0, seq_len[s] - 20) : seq_len[s] - 1;
      poison_blocks_before(kv, g, &tables[size_t(s) * max_blocks], first_query + 1 - c.window);
    }
  }
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  const auto want = ref::paged_attention(q, q_stride, kv, g, layer, c.num_heads, context, token_seq, tables, max_blocks,
                                         scale, c.softcap, c.window);

  const size_t out_elems = size_t(T) * c.num_heads * c.head_dim;
  auto fill = [&](auto& a) {
    a.out_stride = int64_t{c.num_heads} * c.head_dim;
    a.q = upload(q);
    a.q_stride = q_stride;
    a.layout = {g.num_layers, g.num_kv_heads, g.block_size, g.head_dim};
    a.layer = layer;
    a.num_heads = c.num_heads;
    a.num_tokens = T;
    a.context_lens = upload(context);
    a.token_seq = upload(token_seq);
    a.block_tables = upload(tables);
    a.max_blocks_per_seq = max_blocks;
    a.scale = scale;
    a.softcap = c.softcap;
    a.window = c.window;
    // As the executor: a sliding-window layer's queries walk at most `window` positions.
    plan_split(a, c.num_kv_heads, c.head_dim, c.window > 0 ? std::min(301, c.window) : 301, c.num_splits);
  };
  // A split is merged by a second kernel, then (the executor's way) by the attention kernel's last
  // CTA per (token, head group), twice over the same counters (which it must leave at zero).
  const double tol = c.bf16 ? 1e-2 : 2e-5;
  int32_t* counters = nullptr;
  for (const decode_kernel kernel : decode_kernels(c.bf16))
    for (const int pass : {0, 1, 2}) {
      kernel_ = kernel;
      fused_merge_ = pass > 0;
      bool split = false;
      const std::vector<float> got = run_paged_attention(c.bf16, kv, out_elems, [&](auto& a) {
        fill(a);
        split = a.num_splits > 1;
        if (pass == 2) a.split_counters = counters;  // the first fused pass's, as it left them
        counters = a.split_counters;
      });
      for (size_t i = 0; i < out_elems; ++i)
        ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i])))
            << "element " << i << " pass " << pass << " (" << name(kernel) << ")";
      if (!split) break;  // no split: one pass says it all
      if (pass == 1) {
        const auto left = download(counters, size_t(T) * c.num_heads);
        ASSERT_EQ(std::count(left.begin(), left.end(), 0), std::ptrdiff_t(left.size())) << "counters left at zero";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuAttention,
    ::testing::Values(attention_case{64, 9, 3, false, 0, false},  // SmolLM2: group 3
                      attention_case{64, 9, 3, true, 0, false},
                      attention_case{128, 32, 8, false, 0, true},  // Llama-3-8B: group 4, bf16
                      attention_case{128, 32, 8, true, 0, true},
                      attention_case{128, 28, 4, false, 3, true},   // Qwen2.5-7B: group 7, split-KV
                      attention_case{128, 12, 1, false, 4, false},  // MQA, group 12 > 8: two CTAs per KV head
                      attention_case{64, 8, 4, false, 2, true},     // group 2, split-KV, bf16
                      attention_case{256, 4, 4, true, 0, false},    // MHA, largest head
                      attention_case{64, 8, 2, true, 7, false},     // split with partitions past some contexts
                      // Sliding windows that cut through blocks (16 positions): 24 on a 37- and a
                      // 301-position context (a 16-position one is all inside), decode and chunks;
                      // split over the window (partitions past a short context's window left empty)
                      attention_case{64, 8, 2, false, 0, false, 24}, attention_case{64, 4, 1, true, 0, true, 24},
                      attention_case{128, 32, 8, false, 3, true, 200}, attention_case{64, 8, 4, true, 4, false, 100},
                      // soft-capped scores (Gemma 2), with a window and a split; head_dim 32 (Qwen3)
                      attention_case{256, 8, 4, false, 0, false, 0, 3.0f},
                      attention_case{64, 4, 1, true, 3, false, 24, 3.0f}, attention_case{32, 4, 1, false, 0, false},
                      attention_case{32, 16, 2, true, 2, true, 50, 3.0f}));

// ---- token trees (tree_attention_view) ------------------------------------------------------------

struct tree_case {
  int32_t window;      // 0: full attention
  int32_t num_splits;  // 0: the executor's plan; > 1 forced
  bool bf16;
  float softcap = 0.0f;
};

void PrintTo(const tree_case& c, std::ostream* os) {
  *os << "window" << c.window << "_splits" << c.num_splits << (c.bf16 ? "_bf16" : "_f32")
      << (c.softcap > 0 ? "_softcap" : "");
}

class GpuTreeAttention : public GpuKernels, public ::testing::WithParamInterface<tree_case> {};

// Two token trees after cached contexts and a plain decode token between them. Tree A (200 rows after
// 100 positions): a chain of 5 under the root, 184 leaves under the root, then a chain of 10 under
// row 5, so the deep rows' slots (up to 299) lie far past their positions (up to 116) and, split in 4,
// a whole partition of theirs holds only masked slots. Tree B (40 rows, two mask words) has random
// parents. Each row must equal attention over exactly its context (within its window) and its
// ancestors' slots (those inside its window), in order of slot.
TEST_P(GpuTreeAttention, EachRowSeesItsContextAndAncestorsOnly) {
  const tree_case c = GetParam();
  const int32_t head_dim = 64, num_heads = 8, num_kv_heads = 2;
  ref::kv_geometry g{2, num_kv_heads, 16, head_dim};
  const int32_t layer = 1;
  struct slice {
    int32_t context;
    std::vector<int32_t> parents;  // empty: one plain decode token at position `context`
  };
  std::vector<int32_t> parents_a{-1, 0, 1, 2, 3, 4};
  while (parents_a.size() < 190) parents_a.push_back(0);
  parents_a.push_back(5);
  while (parents_a.size() < 200) parents_a.push_back(static_cast<int32_t>(parents_a.size()) - 1);
  std::vector<int32_t> parents_b{-1};
  std::mt19937 rng(5);
  while (parents_b.size() < 40) parents_b.push_back(static_cast<int32_t>(rng() % parents_b.size()));
  const std::vector<slice> slices{{100, parents_a}, {57, {}}, {33, parents_b}};
  int32_t widest = 0;
  for (const slice& sl : slices)
    widest = std::max(widest, sl.context + std::max<int32_t>(1, static_cast<int32_t>(sl.parents.size())));
  const int32_t max_blocks = (widest + 15) / 16;
  const auto num_seqs = static_cast<int32_t>(slices.size());
  const int32_t num_blocks = num_seqs * max_blocks + 3;
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(17));
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs * max_blocks));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = perm[i];

  // Per token: context length (slot + 1), sequence, position, root row, ancestor bits; the reference's keys.
  std::vector<int32_t> context, token_seq, positions, roots, offsets, mask_words;
  std::vector<std::vector<int32_t>> keys;
  int32_t lag = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const slice& sl = slices[static_cast<size_t>(s)];
    const int32_t root = static_cast<int32_t>(context.size());
    const auto n = static_cast<int32_t>(std::max<size_t>(1, sl.parents.size()));
    std::vector<int32_t> depth(static_cast<size_t>(n), 0);
    for (int32_t r = 0; r < n; ++r) {
      const int32_t parent = sl.parents.empty() ? -1 : sl.parents[static_cast<size_t>(r)];
      depth[static_cast<size_t>(r)] = parent < 0 ? 0 : depth[static_cast<size_t>(parent)] + 1;
      const int32_t pos = sl.context + depth[static_cast<size_t>(r)], slot = sl.context + r;
      context.push_back(slot + 1);
      token_seq.push_back(s);
      positions.push_back(pos);
      roots.push_back(sl.parents.empty() ? -1 : root);
      offsets.push_back(static_cast<int32_t>(mask_words.size()));
      lag = std::max(lag, slot - pos);
      auto in_window = [&](int32_t key_pos) { return c.window <= 0 || key_pos > pos - c.window; };
      std::vector<int32_t> k;
      for (int32_t j = 0; j < sl.context; ++j)
        if (in_window(j)) k.push_back(j);
      std::vector<bool> ancestor(static_cast<size_t>(n), false);
      for (int32_t a = r; a >= 0; a = sl.parents.empty() ? -1 : sl.parents[static_cast<size_t>(a)])
        ancestor[static_cast<size_t>(a)] = true;
      std::vector<int32_t> words(static_cast<size_t>((n + 31) / 32), 0);
      for (int32_t a = 0; a < n; ++a) {
        if (!ancestor[static_cast<size_t>(a)]) continue;
        words[static_cast<size_t>(a / 32)] |= static_cast<int32_t>(1u << (a % 32));
        if (in_window(sl.context + depth[static_cast<size_t>(a)])) k.push_back(sl.context + a);
      }
      if (!sl.parents.empty()) mask_words.insert(mask_words.end(), words.begin(), words.end());
      keys.push_back(std::move(k));
    }
  }
  const auto T = static_cast<int32_t>(context.size());
  const int64_t q_stride = int64_t{num_heads} * head_dim;
  auto q = random_floats(size_t(T) * q_stride, 22, c.softcap > 0 ? 2.0f : 1.0f);
  auto kv = random_floats(size_t(num_blocks) * g.block_elems(), 23);
  if (c.bf16) kv = round_bf16(kv);
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const auto want =
      ref::attention_over(q, q_stride, kv, g, layer, num_heads, keys, token_seq, tables, max_blocks, scale, c.softcap);

  const size_t out_elems = size_t(T) * num_heads * head_dim;
  // What the decode and prefill kernels' launches share: the common part and the trees.
  auto fill_common = [&](auto& a) {
    a.out_stride = q_stride;
    a.q = upload(q);
    a.q_stride = q_stride;
    a.layout = {g.num_layers, g.num_kv_heads, g.block_size, g.head_dim};
    a.layer = layer;
    a.num_heads = num_heads;
    a.block_tables = upload(tables);
    a.max_blocks_per_seq = max_blocks;
    a.scale = scale;
    a.softcap = c.softcap;
    a.window = c.window;
    a.tree.root = upload(roots);
    a.tree.positions = upload(positions);
    a.tree.mask_offset = upload(offsets);
    a.tree.mask = reinterpret_cast<const uint32_t*>(upload(mask_words));
  };
  auto fill = [&](auto& a) {
    fill_common(a);
    a.num_tokens = T;
    a.context_lens = upload(context);
    a.token_seq = upload(token_seq);
    // As the executor: a tree row walks from its window's start to its slot.
    plan_split(a, num_kv_heads, head_dim, c.window > 0 ? std::min(widest, c.window + lag) : widest, c.num_splits);
  };
  const double tol = c.bf16 ? 1e-2 : 2e-5;
  for (const decode_kernel kernel : decode_kernels(c.bf16)) {
    kernel_ = kernel;
    const std::vector<float> got = run_paged_attention(c.bf16, kv, out_elems, fill);
    for (size_t i = 0; i < out_elems; ++i)
      ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i])))
          << "token " << i / (num_heads * head_dim) << " (position " << positions[i / (num_heads * head_dim)] << ")"
          << " (" << name(kernel) << ")";
  }

  // The same rows through prefill_attention, as the executor gives it trees of 4 rows or more: each
  // tree one chunk (the decode token a chunk of its own), whose tiles (16 rows of tree A's 200 a
  // tile) hold rows of different depths, the deep chain's tile starting its walk at its shallowest
  // row's window; both kernels for bf16 (the tensor-core one rounds Q and P to bf16: within 1e-2 too).
  std::vector<prefill_tile> chunks;
  for (int32_t s = 0, row = 0; s < num_seqs; ++s) {
    const auto n = static_cast<int32_t>(std::max<size_t>(1, slices[static_cast<size_t>(s)].parents.size()));
    chunks.push_back({row, n, slices[static_cast<size_t>(s)].context, s});
    row += n;
  }
  auto fill_prefill = [&](auto& p) {
    fill_common(p);
    p.tile_tokens = prefill_tile_tokens(prefill_kernel_of(p), head_dim, num_heads, num_kv_heads);
    const std::vector<prefill_tile> tiles = plan_prefill_tiles(chunks, p.tile_tokens);
    p.tiles = upload(tiles);
    p.num_tiles = static_cast<int32_t>(tiles.size());
    // As the executor: a tile walks from its first slot's window start, the tree's lag below it.
    int32_t walk = 0;
    for (const prefill_tile& t : tiles) {
      walk = std::max(walk, t.first_position + t.num_tokens -
                                (c.window > 0 ? std::max(0, t.first_position - lag - c.window + 1) : 0));
    }
    split_plan plan = plan_prefill_split(prefill_kernel_of(p), p.num_tiles, head_dim, num_heads, num_kv_heads, walk,
                                         {132, prefill_attention_ctas_per_sm(p, /*with_trees=*/true)});
    if (c.num_splits > 1) plan = {c.num_splits, (walk + c.num_splits - 1) / c.num_splits};
    p.num_splits = plan.num_splits;
    p.partition_size = plan.partition_size;
    if (plan.num_splits > 1) {
      p.workspace =
          alloc(size_t(prefill_workspace_floats(p.num_tiles, p.tile_tokens, num_heads, head_dim, plan.num_splits)));
      p.split_counters = alloc<int32_t>(size_t(p.num_tiles) * num_heads);
    }
  };
  for (const bool tensor_cores : {true, false}) {
    if (tensor_cores && !c.bf16) continue;
    std::vector<float> got;
    if (c.bf16) {
      prefill_attention_args<bf16> p;
      p.tensor_cores = tensor_cores;
      fill_prefill(p);
      p.kv_cache = as_bf16(upload(to_bf16(kv)));
      uint16_t* out = alloc<uint16_t>(out_elems);
      p.out = as_bf16(out);
      prefill_attention(p, nullptr);
      got = from_bf16(download(out, out_elems));
    } else {
      prefill_attention_args<float> p;
      fill_prefill(p);
      p.kv_cache = upload(kv);
      float* out = alloc(out_elems);
      p.out = out;
      prefill_attention(p, nullptr);
      got = download(out, out_elems);
    }
    for (size_t i = 0; i < out_elems; ++i)
      ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i])))
          << "token " << i / (num_heads * head_dim) << " (position " << positions[i / (num_heads * head_dim)] << ")"
          << (tensor_cores ? " (prefill, tensor cores)" : " (prefill, SIMT)");
  }
}

// Full attention, a window of 24 (it cuts into every context) and one of 8 (shorter than tree A's
// depth of 15: the deep rows lose their oldest ancestors); unsplit and split (tree A's deep rows then
// have partitions of masked slots only); f32, bf16 and soft-capped. Unsplit with the window of 8, a
// deep row's walk (from position 108) starts with a whole tile of masked slots before its visible ones.
INSTANTIATE_TEST_SUITE_P(Trees, GpuTreeAttention,
                         ::testing::Values(tree_case{0, 0, false}, tree_case{0, 4, false}, tree_case{24, 0, false},
                                           tree_case{8, 0, false}, tree_case{24, 4, true}, tree_case{8, 3, false, 3.0f},
                                           tree_case{0, 4, true, 3.0f}));

TEST_F(GpuKernels, AttentionRejectsUnsupportedHeadDim) {
  paged_attention_args<float> a;
  a.num_tokens = 1;
  a.num_heads = 2;
  a.layout = {1, 1, 16, 96};
  EXPECT_THROW(paged_attention(a, nullptr), std::invalid_argument);
  EXPECT_THROW(paged_attention_ctas_per_sm(a), std::invalid_argument);
  EXPECT_FALSE(attention_supports_head_dim(96));
  a.layout.head_dim = 128;
  EXPECT_GE(paged_attention_ctas_per_sm(a), 1);
  a.kernel = decode_kernel::staged_warp_tiles;  // v3 stages bf16 or fp8 rows, not f32
  EXPECT_THROW(paged_attention(a, nullptr), std::invalid_argument);
  EXPECT_THROW(paged_attention_ctas_per_sm(a), std::invalid_argument);
  paged_attention_args<bf16> b;
  b.num_heads = 8;
  b.layout = {1, 2, 16, 128};
  b.kernel = decode_kernel::staged_warp_tiles;
  EXPECT_GE(paged_attention_ctas_per_sm(b), 1);
  a.num_heads = 3;  // not a multiple of the KV heads
  a.layout.num_kv_heads = 2;
  EXPECT_THROW(paged_attention_ctas_per_sm(a), std::invalid_argument);
}

TEST_F(GpuKernels, BlockCopyCopiesWholeBlocksAndNothingElse) {
  const int64_t block_elems = 2 * 2 * 2 * 16 * 64;  // floats
  const int32_t num_blocks = 6;
  auto cache = random_floats(size_t(num_blocks) * block_elems, 31);
  float* d = upload(cache);
  const std::vector<int32_t> pairs = {0, 3, 5, 1, 2, 2};  // (src, dst): 0->3, 5->1, 2->2 (no-op)
  block_copy(d, block_elems * 4, upload(pairs), 3, nullptr);
  const auto got = download(d, cache.size());
  auto want = cache;
  std::copy_n(cache.begin() + 0 * block_elems, block_elems, want.begin() + 3 * block_elems);
  std::copy_n(cache.begin() + 5 * block_elems, block_elems, want.begin() + 1 * block_elems);
  EXPECT_EQ(got, want);
  EXPECT_THROW(block_copy(d, 24, upload(pairs), 1, nullptr), std::invalid_argument);
}

TEST_F(GpuKernels, TakeSampledTokensWritesOnlyTheNamedIds) {
  // 300 pairs: more than one CTA of the launcher's 256 threads.
  std::vector<int32_t> ids(400), sampled(300), pairs;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(1000 + i);
  for (size_t j = 0; j < sampled.size(); ++j) sampled[j] = static_cast<int32_t>(7 * j + 1);
  auto want = ids;
  for (int32_t i = 0; i < 300; ++i) {
    const int32_t row = (i * 37) % 400, from = 299 - i;  // distinct rows, rows taken in reverse
    pairs.push_back(row);
    pairs.push_back(from);
    want[static_cast<size_t>(row)] = sampled[static_cast<size_t>(from)];
  }
  int32_t* d = upload(ids);
  take_sampled_tokens(d, upload(pairs), 300, upload(sampled), nullptr);
  EXPECT_EQ(download(d, ids.size()), want);
  take_sampled_tokens(d, nullptr, 0, nullptr, nullptr);  // nothing to take: no launch
}

// ---- the references themselves (no GPU needed) ---------------------------------------------------

TEST(ReferenceSelfCheck, PagedAttentionEqualsDenseAttention) {
  // Scattered blocks read through a table == the same K/V laid out densely.
  ref::kv_geometry g{1, 2, 4, 64};
  const int32_t num_heads = 4, n = 10, max_blocks = 3;
  const std::vector<int32_t> table = {5, 0, 3};
  auto kv = random_floats(size_t(6) * g.block_elems(), 41);
  auto q = random_floats(size_t(num_heads) * 64, 42);
  const auto got = ref::paged_attention(q, num_heads * 64, kv, g, 0, num_heads, {n}, {0}, table, max_blocks, 0.125f);
  for (int32_t h = 0; h < num_heads; ++h) {
    const int32_t kvh = h / 2;
    std::vector<double> w(n);
    double sum = 0;
    for (int32_t j = 0; j < n; ++j) {
      const float* k = &kv[size_t(g.offset(table[j / 4], 0, 0, kvh, j % 4))];
      double s = 0;
      for (int d = 0; d < 64; ++d) s += double(q[size_t(h) * 64 + d]) * k[d];
      sum += (w[size_t(j)] = std::exp(0.125 * s));
    }
    for (int d = 0; d < 64; ++d) {
      double o = 0;
      for (int32_t j = 0; j < n; ++j) o += w[size_t(j)] * kv[size_t(g.offset(table[j / 4], 0, 1, kvh, j % 4) + d)];
      ASSERT_NEAR(got[size_t(h) * 64 + d], o / sum, 1e-5);
    }
  }
}

TEST(ReferenceSelfCheck, WindowedSoftCappedAttentionEqualsDenseAttentionOverTheWindow) {
  // The window's keys, soft-capped, laid out densely, against the paged reference.
  ref::kv_geometry g{1, 1, 4, 64};
  const int32_t n = 11, window = 6, max_blocks = 3;
  const float cap = 2.0f;
  const std::vector<int32_t> table = {2, 0, 1};
  auto kv = random_floats(size_t(3) * g.block_elems(), 43);
  auto q = random_floats(64, 44, 2.0f);
  const auto got = ref::paged_attention(q, 64, kv, g, 0, 1, {n}, {0}, table, max_blocks, 0.125f, cap, window);
  std::vector<double> w;
  double sum = 0;
  for (int32_t j = n - window; j < n; ++j) {
    const float* k = &kv[size_t(g.offset(table[j / 4], 0, 0, 0, j % 4))];
    double s = 0;
    for (int d = 0; d < 64; ++d) s += double(q[size_t(d)]) * k[d];
    w.push_back(std::exp(cap * std::tanh(0.125 * s / cap)));
    sum += w.back();
  }
  for (int d = 0; d < 64; ++d) {
    double o = 0;
    for (int32_t j = n - window; j < n; ++j)
      o += w[size_t(j - (n - window))] * kv[size_t(g.offset(table[j / 4], 0, 1, 0, j % 4) + d)];
    ASSERT_NEAR(got[size_t(d)], o / sum, 1e-5);
  }
}

TEST(ReferenceSelfCheck, RopeStylesAreTheSameRotationUpToAPermutation) {
  // GGUF's interleaved pairs are HF's rotate_half pairs after llama.cpp's Q/K row permutation:
  // rotating v in one layout equals permuting, rotating in the other and permuting back.
  const int32_t d = 16;
  const auto freq = ref::inv_freq(d, 10000.0f);
  auto v = random_floats(d, 51);
  std::vector<float> inter = v, half(d);
  for (int32_t i = 0; i < d / 2; ++i) {
    half[size_t(i)] = v[size_t(2 * i)];
    half[size_t(i + d / 2)] = v[size_t(2 * i + 1)];
  }
  ref::rope_head(inter.data(), 123, freq, rope_style::interleaved);
  ref::rope_head(half.data(), 123, freq, rope_style::half);
  for (int32_t i = 0; i < d / 2; ++i) {
    EXPECT_FLOAT_EQ(inter[size_t(2 * i)], half[size_t(i)]);
    EXPECT_FLOAT_EQ(inter[size_t(2 * i + 1)], half[size_t(i + d / 2)]);
  }
  // And it is a rotation: norms of each pair are kept.
  for (int32_t i = 0; i < d / 2; ++i) {
    EXPECT_NEAR(std::hypot(inter[size_t(2 * i)], inter[size_t(2 * i + 1)]),
                std::hypot(v[size_t(2 * i)], v[size_t(2 * i + 1)]), 1e-5);
  }
}

TEST(ReferenceSelfCheck, SplitPlanOnlySplitsWhenTheGpuWouldIdle) {
  const cta_slots h200{132, 2};                                              // 264 CTAs a wave
  EXPECT_EQ(plan_attention_split(1, 32, 8, 256, h200).num_splits, 1);        // short context: one tile pair
  EXPECT_EQ(plan_attention_split(64, 32, 8, 32768, h200).num_splits, 1);     // 512 CTAs: a wave and more
  EXPECT_EQ(plan_attention_split(32, 32, 8, 32768, h200).num_splits, 1);     // 256: a second split would not fit
  EXPECT_EQ(plan_attention_split(32, 32, 8, 4096, {132, 4}).num_splits, 2);  // ... at 4 CTAs per SM it does
  const split_plan p = plan_attention_split(1, 32, 8, 32768, h200);          // batch-1 decode at 32k
  EXPECT_EQ(p.num_splits, 32);  // 264 / 8 = 33 wanted; 1024-position partitions leave 32
  EXPECT_EQ(p.partition_size, 1024);
  const split_plan four = plan_attention_split(1, 32, 8, 32768, {132, 4});
  EXPECT_EQ(four.num_splits, 64);
  EXPECT_EQ(four.partition_size, 512);
  // A group of 16 takes two CTAs per KV head (8 query heads a CTA): half the splits.
  EXPECT_EQ(plan_attention_split(1, 128, 8, 32768, h200).num_splits, 16);
  const split_plan shortish = plan_attention_split(1, 32, 8, 600, h200);  // batch-1 decode at 600
  EXPECT_EQ(shortish.num_splits, 3);                                      // at most one per two tiles
  EXPECT_EQ(shortish.partition_size, 256);
  EXPECT_EQ(plan_attention_split(1, 30, 8, 32768, h200).num_splits, 1);  // heads not a multiple: no plan
}

TEST(ReferenceSelfCheck, WaveSplitFillsOneWaveInWholeGranulesWithNoEmptyPartition) {
  for (const int32_t per_sm : {1, 2, 3, 4, 16}) {
    for (const int64_t ctas : {1, 7, 8, 50, 131, 132, 200}) {
      for (const int32_t context : {100, 257, 1000, 4096, 32768, 131072}) {
        const cta_slots slots{132, per_sm};
        const split_plan p = plan_wave_split(ctas, context, 256, 128, slots);
        SCOPED_TRACE(testing::Message() << per_sm << " per SM, " << ctas << " CTAs, context " << context);
        if (p.num_splits == 1) {
          EXPECT_EQ(p.partition_size, 0);
          // Unsplit only when already a wave, a short walk, or no room for two splits.
          EXPECT_TRUE(ctas * 2 > slots.total() || context <= 256);
          continue;
        }
        EXPECT_LE(ctas * p.num_splits, slots.total());  // one wave
        EXPECT_LE(p.num_splits, 256);
        EXPECT_EQ(p.partition_size % 128, 0);
        EXPECT_GE(int64_t{p.num_splits} * p.partition_size, context);      // every position
        EXPECT_LT(int64_t{p.num_splits - 1} * p.partition_size, context);  // the last partition not empty
        EXPECT_LE(p.num_splits, (context + 255) / 256);                    // one per min_partition at most
      }
    }
  }
  // Rounding to granules leaves fewer partitions than wanted: 300 positions, 5 wanted, 128 a granule.
  const split_plan r = plan_wave_split(1, 300, 64, 128, {5, 1});
  EXPECT_EQ(r.num_splits, 3);
  EXPECT_EQ(r.partition_size, 128);
  EXPECT_EQ(plan_wave_split(0, 4096, 256, 128, {132, 2}).num_splits, 1);  // nothing to run
  EXPECT_EQ(plan_wave_split(8, 4096, 256, 128, {0, 0}).num_splits, 1);    // no slots known
}

}  // namespace
}  // namespace tessera::gpu
