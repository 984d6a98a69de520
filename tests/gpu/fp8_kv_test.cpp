// The FP8 KV cache (--kv-cache-dtype fp8): the E4M3 conversions of gpu/fp8.hpp against the format's
// definition (OCP OFP8 1.0) computed independently here, then the KV write and both attention kernels
// with an fp8 cache against the CPU references of tests/gpu/reference.hpp over the dequantised
// values. The format tests need no device; the kernel tests skip without one (real or emulated).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/attention.hpp"
#include "gpu/fp8.hpp"
#include "gpu/kernels.hpp"
#include "gpu/prefill_attention.hpp"
#include "tests/gpu/decode_kernels.hpp"
#include "tests/gpu/device_fixture.hpp"
#include "tests/gpu/reference.hpp"
#include "tests/gpu/test_data.hpp"

namespace tessera::gpu {
namespace {

// ---- the format ------------------------------------------------------------------------------------

// E4M3 by its definition: (-1)^s * 2^(1-7) * m/8 for e = 0, (-1)^s * 2^(e-7) * (1 + m/8) otherwise,
// NaN for e = 15, m = 7 (OFP8 1.0, table 1).
double e4m3_by_definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8E4m3, EveryCodeDecodesAsTheFormatDefinesIt) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_by_definition(c);
    const float got = fp8_e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << c;
      EXPECT_EQ(std::signbit(got), c >= 128) << c;  // -0 too
    }
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));
}

TEST(Fp8E4m3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(static_cast<uint8_t>(c))), c) << c;
  }
}

// Between two neighbouring codes: the midpoint goes to the even code, anything nearer to the nearer one.
TEST(Fp8E4m3, RoundsToNearestWithTiesToEven) {
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = fp8_e4m3_to_float(static_cast<uint8_t>(c)), hi = fp8_e4m3_to_float(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact: the two differ in their last 4 bits at most
    ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);
    EXPECT_EQ(float_to_fp8_e4m3(mid), (c % 2 == 0) ? c : c + 1) << "midpoint above code " << c;
    EXPECT_EQ(float_to_fp8_e4m3(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(float_to_fp8_e4m3(std::nextafter(mid, 1e9f)), c + 1) << c;
    EXPECT_EQ(float_to_fp8_e4m3(-std::nextafter(mid, 1e9f)), 0x80 | (c + 1)) << c;  // the sign is apart
  }
}

// Against a brute-force nearest code over every finite value, for magnitudes from far below the
// smallest subnormal to far above the largest value (which saturate to +-448, as __NV_SATFINITE).
TEST(Fp8E4m3, EqualsTheNearestCodeByExhaustiveSearch) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> log2_mag(-14.0f, 11.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(log2_mag(rng)) * (i % 2 ? -1.0f : 1.0f);
    int best = 0;
    double best_err = 1e300;
    for (int c = 0; c <= 0x7E; ++c) {  // magnitudes, ascending
      const double err = std::fabs(std::fabs(double(x)) - e4m3_by_definition(c));
      if (err < best_err || (err == best_err && c % 2 == 0)) {
        best = c;
        best_err = err;
      }
    }
    const int want = (x < 0 ? 0x80 : 0) | best;
    ASSERT_EQ(float_to_fp8_e4m3(x), want) << x;
  }
}

TEST(Fp8E4m3, SaturatesAndKeepsNaN) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(470.0f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(inf), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(-inf), 0xFE);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3(std::nanf("")))));
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(float_to_fp8_e4m3(-std::ldexp(1.0f, -11)), 0x80);
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -149)), 0x00);  // fp32's smallest subnormal
}

// ---- the kernels with an fp8 cache ------------------------------------------------------------------

// Scales other than 1, so a kernel that forgets one (or divides where it should multiply) fails.
constexpr float kKScale = 0.125f, kVScale = 3.0f;

// A random fp8 cache (K stored / kKScale, V / kVScale) and the values it stands for, in float.
struct fp8_cache {
  std::vector<uint8_t> codes;
  std::vector<float> values;  // dequantised: code's value times its kind's scale
};
fp8_cache random_fp8_cache(const ref::kv_geometry& g, int32_t num_blocks, uint32_t seed) {
  const auto raw = random_floats(size_t(num_blocks) * g.block_elems(), seed);
  fp8_cache c{std::vector<uint8_t>(raw.size()), std::vector<float>(raw.size())};
  const int64_t kind_elems = int64_t{g.num_kv_heads} * g.block_size * g.head_dim;
  for (size_t i = 0; i < raw.size(); ++i) {
    const bool is_v = (int64_t(i) % g.block_elems()) / kind_elems % 2 == 1;
    const float scale = is_v ? kVScale : kKScale;
    c.codes[i] = float_to_fp8_e4m3(raw[i] / scale);
    c.values[i] = fp8_e4m3_to_float(c.codes[i]) * scale;
  }
  return c;
}

class GpuFp8Kv : public device_fixture<> {
 protected:
  // What both attention kernels take alike: Q (rows of num_heads heads, 1/sqrt(head_dim)), the fp8
  // cache with its scales, the block tables, the window.
  template <class Args>
  void set_common(Args& a, const std::vector<float>& q, const fp8_cache& kv, const ref::kv_geometry& g, int32_t layer,
                  int32_t num_heads, const std::vector<int32_t>& tables, int32_t max_blocks, int32_t window) {
    a.out_stride = a.q_stride = int64_t{num_heads} * g.head_dim;
    a.q = upload(q);
    a.kv_cache = reinterpret_cast<const fp8_e4m3*>(upload(kv.codes));
    a.k_scale = kKScale;
    a.v_scale = kVScale;
    a.layout = {g.num_layers, g.num_kv_heads, g.block_size, g.head_dim};
    a.layer = layer;
    a.num_heads = num_heads;
    a.block_tables = upload(tables);
    a.max_blocks_per_seq = max_blocks;
    a.scale = 1.0f / std::sqrt(float(g.head_dim));
    a.window = window;
  }
};

// The KV write quantises K / k_scale and V / v_scale: every written element is the reference's value
// rounded to its nearest code (or, where the kernel's fp32 rotation and the reference's differ in the
// last bit at a rounding midpoint, its neighbour); every other byte stays zero. Both kernels: one
// thread per element, and one warp per head (with q/k norms).
TEST_F(GpuFp8Kv, KvWriteStoresTheNearestCodeOfTheScaledValue) {
  for (const bool qk_norm : {false, true}) {
    ref::kv_geometry g{2, 2, 16, 64};
    const int32_t num_heads = 4, num_blocks = 5, layer = 1;
    const int64_t stride = int64_t{num_heads + 2 * g.num_kv_heads} * g.head_dim;
    const std::vector<int32_t> positions = {0, 1, 17, 40, 63, 3, 900};
    std::vector<int32_t> slots;
    for (size_t t = 0; t < positions.size(); ++t)
      slots.push_back(int32_t((t * 3 + 1) % num_blocks) * g.block_size + positions[t] % g.block_size);
    auto qkv = random_floats(positions.size() * stride, 31, 2.0f);
    const auto freq = ref::inv_freq(64, 10000.0f);
    ref::rope_extras extras;
    if (qk_norm) {
      extras.q_norm = random_floats(size_t(g.head_dim), 32);
      extras.k_norm = random_floats(size_t(g.head_dim), 33);
    }
    const size_t cache_elems = size_t(num_blocks) * g.block_elems();
    std::vector<float> want(cache_elems, 0.0f), want_qkv = qkv;
    ref::rope_kv_write(want_qkv, stride, want, g, layer, num_heads, positions, slots, freq, rope_style::half, extras);

    rope_kv_args a;
    a.qkv = upload(qkv);
    a.qkv_stride = stride;
    a.positions = upload(positions);
    a.slot_mapping = upload(slots);
    a.inv_freq = upload(freq);
    a.num_tokens = int32_t(positions.size());
    a.num_heads = num_heads;
    a.rope_dims = 64;
    a.interleaved_pairs = false;
    a.layer = layer;
    a.layout = {g.num_layers, g.num_kv_heads, g.block_size, g.head_dim};
    a.k_scale = kKScale;
    a.v_scale = kVScale;
    if (qk_norm) {
      a.q_norm = upload(extras.q_norm);
      a.k_norm = upload(extras.k_norm);
    }
    auto* kv = alloc<uint8_t>(cache_elems);
    rope_kv_write(a, reinterpret_cast<fp8_e4m3*>(kv), nullptr);
    const auto got = download(kv, cache_elems);
    const int64_t kind_elems = int64_t{g.num_kv_heads} * g.block_size * g.head_dim;
    size_t exact = 0, written = 0;
    for (size_t i = 0; i < cache_elems; ++i) {
      const bool is_v = (int64_t(i) % g.block_elems()) / kind_elems % 2 == 1;
      const uint8_t code = float_to_fp8_e4m3(want[i] / (is_v ? kVScale : kKScale));
      if (want[i] != 0.0f) ++written;
      if (got[i] == code) {
        ++exact;
        continue;
      }
      // A neighbour of the same sign only.
      ASSERT_EQ(got[i] & 0x80, code & 0x80) << i;
      ASSERT_EQ(std::abs(int(got[i] & 0x7F) - int(code & 0x7F)), 1) << "element " << i << " qk_norm " << qk_norm;
    }
    EXPECT_EQ(written, positions.size() * 2 * g.num_kv_heads * g.head_dim);
    EXPECT_GE(double(exact), 0.99 * double(cache_elems)) << "qk_norm " << qk_norm;
    // Q and K are rotated in the rows as without fp8 (the rows stay fp32).
    const auto got_qkv = download(a.qkv, qkv.size());
    for (size_t i = 0; i < qkv.size(); ++i) ASSERT_NEAR(got_qkv[i], want_qkv[i], 2e-5 * (1 + std::fabs(want_qkv[i])));
  }
}

struct fp8_attention_case {
  int32_t head_dim, num_heads, num_kv_heads;
  bool chunk;          // several query tokens per sequence
  int32_t num_splits;  // 1: none
  int32_t window = 0;
};

class GpuFp8Attention : public GpuFp8Kv, public ::testing::WithParamInterface<fp8_attention_case> {};

// Decode attention (gpu/attention.hpp) reading an fp8 cache equals the reference over the values the
// codes stand for (bf16 output: its rounding is the tolerance).
TEST_P(GpuFp8Attention, DecodeKernelEqualsTheReferenceOverTheDequantisedCache) {
  const fp8_attention_case c = GetParam();
  ref::kv_geometry g{2, c.num_kv_heads, 16, c.head_dim};
  const int32_t layer = 1;
  const std::vector<int32_t> seq_len = {37, 16, 301};
  const int32_t max_blocks = (301 + 15) / 16, num_blocks = 3 * max_blocks + 2;
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(41));
  std::vector<int32_t> tables(size_t(3) * max_blocks, 0);
  for (int32_t s = 0, next = 0; s < 3; ++s)
    for (int32_t b = 0; b < (seq_len[s] + 15) / 16; ++b) tables[size_t(s) * max_blocks + b] = perm[size_t(next++)];
  std::vector<int32_t> context, token_seq;
  for (int32_t s = 0; s < 3; ++s) {
    for (int32_t p = c.chunk ? std::max(0, seq_len[s] - 12) : seq_len[s] - 1; p < seq_len[s]; ++p) {
      context.push_back(p + 1);
      token_seq.push_back(s);
    }
  }
  const auto T = int32_t(context.size());
  const int64_t q_stride = int64_t{c.num_heads} * c.head_dim;
  const auto q = random_floats(size_t(T) * q_stride, 42);
  const fp8_cache kv = random_fp8_cache(g, num_blocks, 43);
  paged_attention_args<bf16, fp8_e4m3> a;
  set_common(a, q, kv, g, layer, c.num_heads, tables, max_blocks, c.window);
  const auto want = ref::paged_attention(q, q_stride, kv.values, g, layer, c.num_heads, context, token_seq, tables,
                                         max_blocks, a.scale, 0.0f, c.window);
  a.num_tokens = T;
  a.context_lens = upload(context);
  a.token_seq = upload(token_seq);
  if (c.num_splits > 1) {
    a.num_splits = c.num_splits;
    a.partition_size = (301 + c.num_splits - 1) / c.num_splits;
    a.workspace = alloc(size_t(attention_workspace_floats(T, c.num_heads, c.head_dim, c.num_splits)));
  }
  const size_t out_elems = size_t(T) * q_stride;
  uint16_t* out = alloc<uint16_t>(out_elems);
  a.out = reinterpret_cast<bf16*>(out);
  for (const decode_kernel kernel : decode_kernels(true)) {  // v2 (the default), v1 and v3
    a.kernel = kernel;
    paged_attention(a, nullptr);
    const auto got = from_bf16(download(out, out_elems));
    for (size_t i = 0; i < out_elems; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << i << " (" << name(kernel) << ")";
  }
}

// The tiled prefill kernel (gpu/prefill_attention.hpp) reading an fp8 cache: a whole prompt and a
// chunk after a cached prefix, against the same reference.
class GpuFp8Prefill : public GpuFp8Kv, public ::testing::WithParamInterface<fp8_attention_case> {};

TEST_P(GpuFp8Prefill, TiledKernelEqualsTheReferenceOverTheDequantisedCache) {
  const fp8_attention_case c = GetParam();
  ref::kv_geometry g{2, c.num_kv_heads, 16, c.head_dim};
  const int32_t layer = 0;
  const std::vector<int32_t> num_computed = {0, 45}, num_new = {37, 30};
  const int32_t max_blocks = (45 + 30 + 15) / 16, num_blocks = 2 * max_blocks + 1;
  std::vector<int32_t> tables(size_t(2) * max_blocks);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t((i * 7 + 3) % size_t(num_blocks));
  std::vector<int32_t> context, token_seq;
  std::vector<prefill_tile> chunks;
  for (int32_t s = 0; s < 2; ++s) {
    chunks.push_back({int32_t(context.size()), num_new[s], num_computed[s], s});
    for (int32_t p = num_computed[s]; p < num_computed[s] + num_new[s]; ++p) {
      context.push_back(p + 1);
      token_seq.push_back(s);
    }
  }
  const auto T = int32_t(context.size());
  const int64_t q_stride = int64_t{c.num_heads} * c.head_dim;
  const auto q = random_floats(size_t(T) * q_stride, 52);
  const fp8_cache kv = random_fp8_cache(g, num_blocks, 53);
  prefill_attention_args<bf16, fp8_e4m3> a;
  set_common(a, q, kv, g, layer, c.num_heads, tables, max_blocks, c.window);
  const auto want = ref::paged_attention(q, q_stride, kv.values, g, layer, c.num_heads, context, token_seq, tables,
                                         max_blocks, a.scale, 0.0f, c.window);
  const int32_t tile_tokens = prefill_tile_tokens(prefill_kernel_of(a), c.head_dim, c.num_heads, c.num_kv_heads);
  const auto tiles = plan_prefill_tiles(chunks, tile_tokens);
  a.tiles = upload(tiles);
  a.num_tiles = int32_t(tiles.size());
  a.tile_tokens = tile_tokens;
  if (c.num_splits > 1) {
    a.num_splits = 3;  // 75 positions at most: three partitions of 32 (a multiple of the key tiles)
    a.partition_size = 32;
    a.workspace =
        alloc(size_t(prefill_workspace_floats(a.num_tiles, tile_tokens, c.num_heads, c.head_dim, a.num_splits)));
  }
  const size_t out_elems = size_t(T) * q_stride;
  uint16_t* out = alloc<uint16_t>(out_elems);
  a.out = reinterpret_cast<bf16*>(out);
  prefill_attention(a, nullptr);
  const auto got = from_bf16(download(out, out_elems));
  for (size_t i = 0; i < out_elems; ++i) ASSERT_NEAR(got[i], want[i], 1e-2 * (1 + std::fabs(want[i]))) << i;
}

void PrintTo(const fp8_attention_case& c, std::ostream* os) {
  *os << "d" << c.head_dim << "_h" << c.num_heads << "_kv" << c.num_kv_heads << (c.chunk ? "_chunk" : "_decode")
      << "_splits" << c.num_splits;
  if (c.window > 0) *os << "_window" << c.window;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuFp8Attention,
                         ::testing::Values(fp8_attention_case{64, 9, 3, false, 1},      // SmolLM2's group of 3
                                           fp8_attention_case{128, 32, 8, false, 3},    // Llama-3-8B, split-KV
                                           fp8_attention_case{128, 12, 1, false, 1},    // MQA: two CTAs a KV head
                                           fp8_attention_case{64, 8, 2, true, 1},       // chunks
                                           fp8_attention_case{128, 32, 8, true, 2},     // chunks, split
                                           fp8_attention_case{256, 4, 4, true, 1, 24},  // head_dim 256, window
                                           fp8_attention_case{32, 4, 1, false, 1, 24}));
INSTANTIATE_TEST_SUITE_P(Shapes, GpuFp8Prefill,
                         ::testing::Values(fp8_attention_case{64, 9, 3, true, 1},       // SmolLM2
                                           fp8_attention_case{128, 32, 8, true, 3},     // Llama-3-8B, split
                                           fp8_attention_case{256, 4, 4, true, 1, 24},  // head_dim 256, window
                                           fp8_attention_case{32, 16, 2, true, 3, 40}));

}  // namespace
}  // namespace tessera::gpu
