// The tiled prefill attention kernel (gpu/prefill_attention.cu) against the CPU reference of paged
// attention (tests/gpu/reference.hpp), which the ReferenceSelfCheck tests of kernels_test.cpp check
// against dense attention. Skips (with the reason) where no CUDA device is present; the tile-plan tests
// need no device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/base/error.hpp"
#include "engine/model/dummy_weights.hpp"
#include "engine/model/ggml_types.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/cuda_executor.hpp"
#include "gpu/kernels.hpp"
#include "gpu/prefill_attention.hpp"
#include "tests/gpu/device_fixture.hpp"
#include "tests/gpu/reference.hpp"
#include "tests/gpu/test_data.hpp"
#include "tests/support/tiny_model.hpp"

namespace tessera::gpu {
namespace {

// ---- the tile plan (host only) -------------------------------------------------------------------

TEST(PrefillTilePlan, TokensPerTileFollowTheGqaGroup) {
  for (const prefill_kernel k : {prefill_kernel::simt, prefill_kernel::tensor_cores}) {
    EXPECT_EQ(prefill_tile_tokens(k, 128, 32, 8), 16);  // Llama-3-8B: group 4, 64 rows
    EXPECT_EQ(prefill_tile_tokens(k, 64, 9, 3), 21);    // SmolLM2: group 3 (63 of 64 rows used)
    EXPECT_EQ(prefill_tile_tokens(k, 128, 28, 4), 9);   // Qwen2.5-7B: group 7
    EXPECT_EQ(prefill_tile_tokens(k, 128, 8, 1), 8);    // MQA
    EXPECT_EQ(prefill_tile_tokens(k, 64, 4, 4), 64);    // MHA
    EXPECT_EQ(prefill_tile_tokens(k, 32, 4, 1), 16);    // head_dim 32: 64 rows (Qwen3-style small heads)
    EXPECT_EQ(prefill_tile_tokens(k, 96, 8, 8), 0);     // head_dim not compiled
    EXPECT_EQ(prefill_tile_tokens(k, 128, 10, 4), 0);   // heads not a multiple of KV heads
  }
  // head_dim 256: the SIMT kernel's 24 rows, the tensor-core kernel's 64.
  EXPECT_EQ(prefill_tile_tokens(prefill_kernel::simt, 256, 4, 4), 24);
  EXPECT_EQ(prefill_tile_tokens(prefill_kernel::simt, 256, 32, 1), 1);  // group 32 > 24 rows: two CTAs a KV head
  EXPECT_EQ(prefill_tile_tokens(prefill_kernel::tensor_cores, 256, 4, 4), 64);
  EXPECT_EQ(prefill_tile_tokens(prefill_kernel::tensor_cores, 256, 8, 4), 32);  // Gemma-2-9B: group 2
  EXPECT_EQ(prefill_tile_tokens(prefill_kernel::tensor_cores, 256, 32, 1), 2);
  EXPECT_EQ(prefill_tile_tokens(prefill_kernel::tensor_cores, 256, 128, 1), 1);  // group 128: two CTAs a KV head
}

TEST(PrefillTilePlan, TheKernelFollowsTheActivationsAndTheSwitch) {
  prefill_attention_args<float> f;
  EXPECT_EQ(prefill_kernel_of(f), prefill_kernel::simt);  // fp32: no tensor-core kernel
  prefill_attention_args<bf16> b;
  EXPECT_EQ(prefill_kernel_of(b), prefill_kernel::tensor_cores);
  b.tensor_cores = false;
  EXPECT_EQ(prefill_kernel_of(b), prefill_kernel::simt);
  prefill_attention_args<bf16, fp8_e4m3> e;
  EXPECT_EQ(prefill_kernel_of(e), prefill_kernel::tensor_cores);
}

TEST(PrefillTilePlan, CoversEveryTokenOnceLongestContextFirst) {
  const std::vector<prefill_tile> chunks = {{0, 37, 0, 0}, {37, 0, 5, 1}, {37, 70, 45, 2}, {107, 1, 200, 3}};
  const int32_t tt = 16;
  const auto tiles = plan_prefill_tiles(chunks, tt);
  std::vector<int32_t> seen(108, 0);
  for (size_t i = 0; i < tiles.size(); ++i) {
    const prefill_tile& t = tiles[i];
    ASSERT_GE(t.num_tokens, 1);
    ASSERT_LE(t.num_tokens, tt);
    // Inside its chunk, with the chunk's row and consistent positions.
    const auto c = std::find_if(chunks.begin(), chunks.end(), [&](const prefill_tile& chunk) {
      return chunk.num_tokens > 0 && t.token_begin >= chunk.token_begin &&
             t.token_begin < chunk.token_begin + chunk.num_tokens;
    });
    ASSERT_NE(c, chunks.end());
    EXPECT_EQ(t.table_row, c->table_row);
    EXPECT_EQ(t.first_position - c->first_position, t.token_begin - c->token_begin);
    EXPECT_LE(t.token_begin + t.num_tokens, c->token_begin + c->num_tokens);
    for (int32_t k = 0; k < t.num_tokens; ++k) ++seen[size_t(t.token_begin + k)];
    if (i > 0) { EXPECT_GE(tiles[i - 1].first_position + tiles[i - 1].num_tokens, t.first_position + t.num_tokens); }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 108);
  EXPECT_EQ(tiles.size(), size_t(3 + 5 + 1));  // ceil(37/16) + ceil(70/16) + 1
  EXPECT_THROW(plan_prefill_tiles(chunks, 0), std::invalid_argument);
}

TEST(PrefillTilePlan, SplitsOnlyFewTilesOverLongContexts) {
  const cta_slots h200{132, 3};  // 396 CTAs a wave
  // A 4k prompt on Llama-3-8B: 256 tiles x 8 KV heads fill the wave; no split.
  const prefill_kernel mma = prefill_kernel::tensor_cores;
  EXPECT_EQ(plan_prefill_split(mma, 256, 128, 32, 8, 4096, h200).num_splits, 1);
  // Few tiles but a short context: no split.
  EXPECT_EQ(plan_prefill_split(mma, 2, 128, 32, 8, 1024, h200).num_splits, 1);
  // 64 new tokens after 16k cached (multi-turn chat with a prefix hit): 4 tiles x 8 CTAs; split.
  const split_plan p = plan_prefill_split(mma, 4, 128, 32, 8, 16384 + 64, h200);
  EXPECT_EQ(p.num_splits, 12);  // 396 / 32 CTAs
  EXPECT_GE(int64_t{p.num_splits} * p.partition_size, 16384 + 64);
  EXPECT_GT(p.partition_size, 512);
  EXPECT_EQ(p.partition_size % 32, 0);
  EXPECT_EQ(plan_prefill_split(mma, 4, 128, 32, 8, 16384 + 64, {132, 1}).num_splits, 4);  // 132 / 32
  EXPECT_EQ(plan_prefill_split(mma, 4, 96, 32, 8, 16384, h200).num_splits, 1);            // unsupported shape
  // The CTAs count per kernel: group 32 over head_dim 256 takes two SIMT CTAs a tile, one tensor-core
  // CTA, so 40 tiles of one KV head fill a wave of 2 x 40 only in SIMT.
  EXPECT_GT(plan_prefill_split(mma, 40, 256, 32, 1, 16384, {40, 2}).num_splits, 1);
  EXPECT_EQ(plan_prefill_split(prefill_kernel::simt, 40, 256, 32, 1, 16384, {40, 2}).num_splits, 1);
}

TEST(PrefillTilePlan, LaunchRejectsBadShapesBeforeTouchingTheDevice) {
  prefill_tile tile{0, 1, 0, 0};
  prefill_attention_args<float> a;
  a.num_heads = 8;
  a.layout = {1, 2, 16, 96};
  a.tiles = &tile;
  a.num_tiles = 1;
  EXPECT_THROW(prefill_attention(a, nullptr), std::invalid_argument);  // head_dim 96
  EXPECT_THROW(prefill_attention_ctas_per_sm(a, false), std::invalid_argument);
  a.layout.head_dim = 128;
  a.tile_tokens = 64;  // cut for another shape: 8/2 heads give 16 tokens a tile
  EXPECT_THROW(prefill_attention(a, nullptr), std::invalid_argument);
  a.num_heads = 7;
  a.tile_tokens = 0;
  EXPECT_THROW(prefill_attention(a, nullptr), std::invalid_argument);  // 7 heads over 2 KV heads
  EXPECT_THROW(prefill_attention_ctas_per_sm(a, true), std::invalid_argument);
  a.num_heads = 8;
  a.tile_tokens = 16;
  a.num_splits = 2;  // split without a workspace
  a.partition_size = 512;
  EXPECT_THROW(prefill_attention(a, nullptr), std::invalid_argument);
  // head_dim 256 tiles cut for the SIMT kernel (24 tokens) given to the tensor-core one (64), and back.
  prefill_attention_args<bf16> b;
  b.num_heads = 4;
  b.layout = {1, 4, 16, 256};
  b.tiles = &tile;
  b.num_tiles = 1;
  b.tile_tokens = prefill_tile_tokens(prefill_kernel::simt, 256, 4, 4);
  EXPECT_THROW(prefill_attention(b, nullptr), std::invalid_argument);
  b.tensor_cores = false;
  b.tile_tokens = prefill_tile_tokens(prefill_kernel::tensor_cores, 256, 4, 4);
  EXPECT_THROW(prefill_attention(b, nullptr), std::invalid_argument);
}

// ---- the kernel ----------------------------------------------------------------------------------

struct prefill_case {
  int32_t head_dim;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t block_size;
  bool bf16;
  int32_t partition = 0;  // > 0: split the positions into partitions of this size (split-KV)
  int32_t window = 0;     // sliding window (Mistral, Gemma's local layers)
  float softcap = 0.0f;   // attention logit soft-cap (Gemma 2)
};

void PrintTo(const prefill_case& c, std::ostream* os) {
  *os << "d" << c.head_dim << "_h" << c.num_heads << "_kv" << c.num_kv_heads << "_bs" << c.block_size
      << (c.bf16 ? "_bf16" : "_f32") << "_part" << c.partition;
  if (c.window > 0) *os << "_window" << c.window;
  if (c.softcap > 0) *os << "_softcap";
}

class GpuPrefillAttention : public device_fixture<::testing::TestWithParam<prefill_case>> {};

// One launch over several sequences' chunks plus rows that belong to no tile (where a step's decode
// tokens would be): every chunk's rows must equal the reference, the others stay untouched.
//   seq 0: a whole prompt of 37 tokens (not a multiple of any tile, ends mid-block);
//   seq 1: a prefix-cache hit: 45 positions cached, 70 new (starts mid-block, tiles straddle blocks);
//   seq 2: a later chunk of a chunked prefill: 96 cached (a block edge), 33 new;
//   seq 3: a single new token at position 20 given to the prefill kernel (a 1-token tile).
// With a window, it cuts through blocks (and the prefix hit's cached positions); every block wholly
// before a sequence's first window start holds NaN, so a kernel that reads one (even masked) fails.
TEST_P(GpuPrefillAttention, MatchesCpuReference) {
  const prefill_case c = GetParam();
  const int32_t bs = c.block_size;
  ref::kv_geometry g{2, c.num_kv_heads, bs, c.head_dim};
  const int32_t layer = 1;
  const std::vector<int32_t> num_computed = {0, 45, 96, 20};
  const std::vector<int32_t> num_new = {37, 70, 33, 1};
  const auto num_seqs = int32_t(num_computed.size());
  int32_t max_blocks = 0;
  for (int32_t s = 0; s < num_seqs; ++s)
    max_blocks = std::max(max_blocks, (num_computed[s] + num_new[s] + bs - 1) / bs);
  const int32_t num_blocks = num_seqs * max_blocks + 3;
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(21));
  std::vector<int32_t> tables(size_t(num_seqs) * max_blocks, 0);
  for (int32_t s = 0, next = 0; s < num_seqs; ++s)
    for (int32_t b = 0; b < (num_computed[s] + num_new[s] + bs - 1) / bs; ++b)
      tables[size_t(s) * max_blocks + b] = perm[size_t(next++)];

  // Batch rows: [gap][seq 0][gap][seq 1][seq 2][gap][seq 3]: the gaps are rows of no tile.
  std::vector<int32_t> context, token_seq;
  std::vector<bool> in_tile;
  std::vector<prefill_tile> chunks;
  auto gap = [&] {
    context.push_back(1);
    token_seq.push_back(0);
    in_tile.push_back(false);
  };
  for (int32_t s = 0; s < num_seqs; ++s) {
    if (s != 2) gap();
    chunks.push_back({int32_t(context.size()), num_new[s], num_computed[s], s});
    for (int32_t p = num_computed[s]; p < num_computed[s] + num_new[s]; ++p) {
      context.push_back(p + 1);
      token_seq.push_back(s);
      in_tile.push_back(true);
    }
  }
  const auto T = int32_t(context.size());
  const int64_t q_stride = int64_t{c.num_heads + 2 * c.num_kv_heads} * c.head_dim;  // as the executor's qkv rows
  // Scores of ~N(0, 4) when soft-capped, so that the cap of 3 bends them.
  const auto q = random_floats(size_t(T) * q_stride, 22, c.softcap > 0 ? 2.0f : 1.0f);
  auto kv = random_floats(size_t(num_blocks) * g.block_elems(), 23);
  if (c.bf16) kv = from_bf16(to_bf16(kv));  // the reference reads what the bf16 cache holds
  for (int32_t s = 0; s < num_seqs && c.window > 0; ++s) {
    const int32_t first = num_computed[s] + 1 - c.window;  // the chunk's first row's window start
    for (int32_t b = 0; (b + 1) * bs <= first; ++b) {
      std::fill_n(kv.begin() + tables[size_t(s) * max_blocks + b] * g.block_elems(), g.block_elems(), std::nanf(""));
    }
  }
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  const auto want = ref::paged_attention(q, q_stride, kv, g, layer, c.num_heads, context, token_seq, tables, max_blocks,
                                         scale, c.softcap, c.window);
  // The tensor-core kernel's operands are bf16: its reference reads the queries it multiplies, the
  // scaled Q rounded to bf16 (unscaled again here; the reference scales them back).
  std::vector<float> q_mma(q.size());
  for (size_t i = 0; i < q.size(); ++i) q_mma[i] = round_bf16({q[i] * scale})[0] / scale;
  const auto want_mma = ref::paged_attention(q_mma, q_stride, kv, g, layer, c.num_heads, context, token_seq, tables,
                                             max_blocks, scale, c.softcap, c.window);

  const size_t out_elems = size_t(T) * c.num_heads * c.head_dim;
  constexpr float sentinel = 7.0f;  // exactly representable in bf16
  ASSERT_GT(prefill_tile_tokens(prefill_kernel::simt, c.head_dim, c.num_heads, c.num_kv_heads), 0);
  // The tiles of the kernel a launch runs (head_dim 256 cuts them differently for each), and the
  // split's counters (pass 1 allocates them, pass 2 reuses them).
  int32_t tile_tokens = 0;
  std::vector<prefill_tile> tiles;
  int32_t* counters = nullptr;
  auto fill = [&](auto& a, int pass) {
    tile_tokens = prefill_tile_tokens(prefill_kernel_of(a), c.head_dim, c.num_heads, c.num_kv_heads);
    tiles = plan_prefill_tiles(chunks, tile_tokens);
    if (pass == 1) counters = alloc<int32_t>(tiles.size() * size_t(c.num_heads));
    a.split_counters = pass == 0 ? nullptr : counters;
    a.out_stride = int64_t{c.num_heads} * c.head_dim;
    a.q = upload(q);
    a.q_stride = q_stride;
    a.layout = {g.num_layers, g.num_kv_heads, g.block_size, g.head_dim};
    a.layer = layer;
    a.num_heads = c.num_heads;
    a.tiles = upload(tiles);
    a.num_tiles = int32_t(tiles.size());
    a.tile_tokens = tile_tokens;
    a.block_tables = upload(tables);
    a.max_blocks_per_seq = max_blocks;
    a.scale = scale;
    a.softcap = c.softcap;
    a.window = c.window;
    if (c.partition > 0) {
      // 129 = the furthest position read + 1 (seq 2); partitions past a tile's context stay empty.
      a.num_splits = (129 + c.partition - 1) / c.partition;
      a.partition_size = c.partition;
      // Left unwritten (the emulation fills fresh allocations with NaN): the kernels must write every
      // partial they read.
      float* ws = nullptr;
      const auto ws_floats =
          size_t(prefill_workspace_floats(a.num_tiles, tile_tokens, c.num_heads, c.head_dim, a.num_splits));
      CUDA_CHECK(cudaMalloc(&ws, ws_floats * sizeof(float)));
      allocations_.push_back(ws);
      a.workspace = ws;
    }
  };
  // A split is merged by a second kernel, then by the attention kernel's last CTA per (tile, head
  // group) (the executor's way), twice over the same counters, which it must leave at zero.
  // bf16 runs both kernels, the tensor-core one first.
  for (const bool tensor_cores : {true, false}) {
    for (const int pass : {0, 1, 2}) {
      if (!tensor_cores && !c.bf16) break;
      if (pass > 0 && c.partition == 0) break;
      std::vector<float> got;
      if (c.bf16) {
        prefill_attention_args<bf16> a;
        a.tensor_cores = tensor_cores;
        fill(a, pass);
        a.kv_cache = reinterpret_cast<const bf16*>(upload(to_bf16(kv)));
        uint16_t* out = upload(to_bf16(std::vector<float>(out_elems, sentinel)));
        a.out = reinterpret_cast<bf16*>(out);
        prefill_attention(a, nullptr);
        got = from_bf16(download(out, out_elems));
      } else {
        prefill_attention_args<float> a;
        fill(a, pass);
        a.kv_cache = upload(kv);
        float* out = upload(std::vector<float>(out_elems, sentinel));
        a.out = out;
        prefill_attention(a, nullptr);
        got = download(out, out_elems);
      }
      // fp32: the kernel's only departures from the double reference are fp32 rounding of D-term dot
      // products and softmax sums (scores ~N(0, 1) after scaling, outputs convex combinations of N(0, 1)
      // values): ~1e-6, so 2e-5 relative is tight yet safe (the decode kernel's bound). bf16: the output
      // is rounded to bf16 (relative error <= 2^-9 ~ 2e-3) on top, the cache holds exactly what the
      // reference reads; 4e-3 relative.
      // The tensor-core kernel also rounds the probabilities P to bf16 for P V, as FlashAttention-2 does
      // with bf16 operands (its Q rounding is in want_mma): each weight off by <= 2^-9 relative, with
      // random signs over the positions; measured 3.4e-3 at worst (8 positions, soft-capped) against
      // 2.6e-3 for the SIMT kernel, so 5e-3.
      const bool mma = c.bf16 && tensor_cores;
      const double tol = c.bf16 ? (mma ? 5e-3 : 4e-3) : 2e-5;
      const std::vector<float>& expected = mma ? want_mma : want;
      double worst = 0.0;
      const size_t row = size_t(c.num_heads) * c.head_dim;
      for (size_t i = 0; i < out_elems; ++i) {
        if (in_tile[i / row]) {
          ASSERT_NEAR(got[i], expected[i], tol * (1 + std::fabs(expected[i])))
              << "element " << i << " (row " << i / row << ") pass " << pass << (mma ? " (tensor cores)" : "");
          worst = std::max<double>(worst, std::fabs(got[i] - expected[i]) / (1 + std::fabs(expected[i])));
        } else {
          ASSERT_EQ(got[i], sentinel) << "row " << i / row << " belongs to no tile but was written";
        }
      }
      if (pass == 0) RecordProperty(mma ? "worst_rel_error_mma" : "worst_rel_error", std::to_string(worst));
      if (pass > 0) {
        const auto left = download(counters, tiles.size() * size_t(c.num_heads));
        ASSERT_EQ(std::count(left.begin(), left.end(), 0), std::ptrdiff_t(left.size())) << "counters left at zero";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuPrefillAttention,
    ::testing::Values(prefill_case{64, 9, 3, 16, false},  // SmolLM2: group 3, 21-token tiles
                      prefill_case{64, 9, 3, 16, true}, prefill_case{128, 32, 8, 16, true},  // Llama-3-8B: group 4
                      prefill_case{128, 32, 8, 8, false},     // 8-position blocks: each K tile spans two
                      prefill_case{128, 28, 4, 16, true},     // Qwen2.5-7B: group 7, 9-token tiles
                      prefill_case{128, 8, 1, 32, false},     // MQA group 8; blocks larger than a K tile
                      prefill_case{64, 4, 4, 16, false},      // MHA: group 1, 64-token tiles
                      prefill_case{256, 4, 4, 16, true},      // head_dim 256, group 1: 64-token tiles (SIMT: 24)
                      prefill_case{256, 32, 1, 16, false},    // group 32 > 24 rows: two CTAs per KV head
                      prefill_case{256, 32, 1, 8, true},      // the same on tensor cores: 2-token tiles
                      prefill_case{256, 8, 4, 16, true, 48},  // Gemma-2-9B's group 2, split (16-key tiles)
                      // Split over positions: partitions that are no multiple of the K tile, rows
                      // whose position precedes a partition, partitions past a tile's context.
                      prefill_case{128, 32, 8, 16, true, 40}, prefill_case{64, 9, 3, 8, false, 48},
                      prefill_case{256, 8, 1, 16, false, 64},
                      // Sliding windows through blocks and the cached prefix: 24 positions on 16-position
                      // blocks, 20 on 8-position ones (a K tile spans two blocks), 40 with a split
                      // (partitions of the windows, some past a tile's last row), MQA group 4 (the tiny
                      // fixtures' shape); soft-capped scores, alone and with a window
                      prefill_case{64, 9, 3, 16, false, 0, 24}, prefill_case{128, 32, 8, 8, true, 0, 20},
                      prefill_case{128, 32, 8, 16, false, 24, 40}, prefill_case{64, 4, 1, 16, true, 0, 8, 3.0f},
                      prefill_case{256, 4, 4, 16, false, 0, 0, 3.0f}, prefill_case{64, 4, 1, 16, false, 16, 30, 3.0f},
                      // Gemma 3 270M's heads (4 over 1, head_dim 256): a window and a soft-cap on tensor cores
                      prefill_case{256, 4, 1, 16, true, 0, 24, 3.0f},
                      // head_dim 32 (Qwen3-style small heads: 8-lane groups)
                      prefill_case{32, 4, 1, 16, false}, prefill_case{32, 16, 2, 8, true, 0, 24, 3.0f},
                      prefill_case{32, 8, 8, 16, false, 40}));

// ---- in the executor ------------------------------------------------------------------------------

// The executor gives prompt chunks (>= 4 new tokens, or cuda_executor_options::prefill_min_tokens) to
// prefill_attention and the other sequences to paged_attention in the same step, moving the chunks'
// rows after the decode rows. Steps that interleave them in the batch (chunk, decode, chunk, decode)
// must give the CPU executor's logits in the batch's order, at the default threshold, at 1 (every
// token to the prefill kernel, paged_attention given none) and at 2 (B's 3 tokens there too), and with
// the staged decode kernel (v3) taking the decode rows.
// (tests/gpu/cuda_executor_test.cpp covers paging, swaps and the real model.)
struct executor_case {
  cuda_dtype dtype;
  int32_t head_dim = 64;                               // 256: Gemma's heads, whose tiles differ between the two kernels
  int32_t min_tokens = gpu::kDefaultPrefillMinTokens;  // 1: decode tokens take the prefill kernel too
  bool staged = false;                                 // cuda_executor_options::staged_decode_attention
};
// Deterministic ctest names (the default prints the parameter's bytes).
std::string executor_case_name(const executor_case& c) {
  return std::string(c.dtype == cuda_dtype::f32 ? "f32" : "bf16") + (c.head_dim == 64 ? "" : "_d256") +
         (c.min_tokens == gpu::kDefaultPrefillMinTokens ? "" : "_min" + std::to_string(c.min_tokens)) +
         (c.staged ? "_v3" : "");
}
void PrintTo(const executor_case& c, std::ostream* os) { *os << executor_case_name(c); }

class PrefillInTheExecutor : public ::testing::TestWithParam<executor_case> {};

TEST_P(PrefillInTheExecutor, MixedStepsEqualTheCpuExecutor) {
  if (!cuda_executor_available()) GTEST_SKIP() << "no CUDA device on this machine: CUDA executor tests skipped";
  model_config cfg;
  cfg.num_layers = 2;
  const bool d64 = GetParam().head_dim == 64;
  cfg.hidden_size = d64 ? 384 : 512;
  cfg.intermediate_size = 512;
  cfg.num_heads = d64 ? 6 : 2;  // group 3: 21-token tiles; group 2: 32 (SIMT: 12)
  cfg.num_kv_heads = d64 ? 2 : 1;
  cfg.head_dim = GetParam().head_dim;
  cfg.vocab_size = 256;
  cfg.context_length = 4096;
  cfg.rope_dims = cfg.head_dim;
  const auto weights = test_support::f32_dummy_weights(cfg, 5);
  const kv_cache_spec kv = test_support::kv_pool(64);
  const auto cpu = test_support::cpu_reference_executor(weights, kv, 2);
  cuda_executor_options go;
  go.kv = kv;
  go.dtype = GetParam().dtype;
  go.prefill_min_tokens = 0;
  EXPECT_THROW(make_cuda_executor(weights, go), invalid_request);
  go.prefill_min_tokens = GetParam().min_tokens;
  if (GetParam().dtype == cuda_dtype::f32) {  // v3 stages bf16 or fp8 rows
    go.staged_decode_attention = true;
    EXPECT_THROW(make_cuda_executor(weights, go), invalid_request);
  }
  go.staged_decode_attention = GetParam().staged;
  const auto gpu = make_cuda_executor(weights, go);

  using mode = sequence_slice::logits_mode;
  auto slice = [](uint64_t id, int32_t first, int32_t n, int32_t num_computed, std::vector<block_id> table, mode m) {
    sequence_slice s;
    s.seq = seq_id{id};
    for (int32_t i = 0; i < n; ++i) s.tokens.push_back((first + i) * 37 % 256);
    s.num_computed = num_computed;
    s.block_table = std::move(table);
    s.logits = m;
    return s;
  };
  auto both = [&](const step_batch& b, const char* what) {
    step_output oc, og;
    cpu->execute(b, oc);
    gpu->execute(b, og);
    EXPECT_EQ(oc.first_row, og.first_row) << what;
    EXPECT_EQ(oc.num_rows, og.num_rows) << what;
    ASSERT_EQ(oc.logits.size(), og.logits.size()) << what;
    float scale = 1.0f;
    for (float v : oc.logits) scale = std::max(scale, std::fabs(v));
    // As cuda_executor_test.cpp: fp32 GEMMs and attention differ from the CPU's only in summation
    // order; bf16 weights, activations and cache lose ~3 significant digits on the way.
    const float tol = (GetParam().dtype == cuda_dtype::f32 ? 1e-3f : 6e-2f) * scale;
    for (size_t i = 0; i < oc.logits.size(); ++i) {
      ASSERT_NEAR(oc.logits[i], og.logits[i], tol) << what << ": logit " << i << " (row " << i / 256 << ")";
    }
  };
  // Step 1: A's 40-token prompt (every row's logits), B's 3 tokens (under the default threshold: decode
  // kernel), C's first chunk of 30.
  step_batch s1;
  s1.seqs.push_back(slice(1, 0, 40, 0, {5, 9, 1}, mode::all));
  s1.seqs.push_back(slice(2, 100, 3, 0, {12}, mode::last));
  s1.seqs.push_back(slice(3, 200, 30, 0, {20, 3, 30}, mode::last));
  both(s1, "step 1");
  // Step 2: C's second chunk (starts mid-block), A decoding, D a prefix hit on A's first two blocks
  // with 9 new tokens, B decoding: prefill rows and decode rows interleaved in the batch.
  step_batch s2;
  s2.seqs.push_back(slice(3, 230, 13, 30, {20, 3, 30}, mode::all));
  s2.seqs.push_back(slice(1, 40, 1, 40, {5, 9, 1}, mode::last));
  s2.seqs.push_back(slice(4, 300, 9, 32, {5, 9, 40}, mode::last));
  s2.seqs.push_back(slice(2, 103, 1, 3, {12}, mode::last));
  both(s2, "step 2");
  // Steps 3 and 4: every sequence decoding, then all but D: CUDA-graph steps of one bucket (captured,
  // then replayed with a padding row), whose attention stays with paged_attention whatever the
  // threshold (their kernels and grids are fixed at capture).
  step_batch s3;
  s3.seqs.push_back(slice(1, 41, 1, 41, {5, 9, 1}, mode::last));
  s3.seqs.push_back(slice(2, 104, 1, 4, {12}, mode::last));
  s3.seqs.push_back(slice(3, 243, 1, 43, {20, 3, 30}, mode::last));
  s3.seqs.push_back(slice(4, 309, 1, 41, {5, 9, 40}, mode::last));
  both(s3, "step 3");
  step_batch s4;
  s4.seqs.push_back(slice(1, 42, 1, 42, {5, 9, 1}, mode::last));
  s4.seqs.push_back(slice(2, 105, 1, 5, {12}, mode::last));
  s4.seqs.push_back(slice(3, 244, 1, 44, {20, 3, 30}, mode::last));
  both(s4, "step 4");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PrefillInTheExecutor,
                         ::testing::Values(executor_case{cuda_dtype::f32}, executor_case{cuda_dtype::bf16},
                                           executor_case{cuda_dtype::f32, 256}, executor_case{cuda_dtype::bf16, 256},
                                           executor_case{cuda_dtype::f32, 64, 1},
                                           executor_case{cuda_dtype::bf16, 64, 1},
                                           executor_case{cuda_dtype::bf16, 256, 2},
                                           executor_case{cuda_dtype::bf16, 64, gpu::kDefaultPrefillMinTokens, true},
                                           executor_case{cuda_dtype::bf16, 256, gpu::kDefaultPrefillMinTokens, true}),
                         [](const ::testing::TestParamInfo<executor_case>& i) { return executor_case_name(i.param); });

}  // namespace
}  // namespace tessera::gpu
