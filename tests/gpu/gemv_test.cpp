// The small-batch GEMM of gpu/gemv.hpp against a CPU reference in double, for fp32 and bf16: every row
// count 1..8, accumulate on and off over a prefilled output, a row stride larger than n (the gap must
// be left alone), column counts that leave a CTA part-empty, k with tails of the unrolled loop, every
// tuning (warps per column, columns per warp); the shapes it refuses; and the CUDA executor with the
// kernel switched on against the CPU executor. Runs on a GPU and under the CPU emulation of CUDA (gpu_gemv_test_emu in
// CI, where shapes stay small: an emulated kernel is ~1000x slower than a GPU).
#include "gpu/gemv.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_executor.hpp"
#include "engine/model/dummy_weights.hpp"
#include "gpu/cuda_executor.hpp"
#include "tests/gpu/device_fixture.hpp"
#include "tests/gpu/test_data.hpp"
#include "tests/support/step_slices.hpp"
#include "tests/support/tiny_model.hpp"

namespace tessera::gpu {
namespace {

enum class elem { f32, bf16 };

struct gemv_case {
  int64_t n = 0;
  int64_t k = 0;
  int32_t rows = 0;
  bool accumulate = false;
  int64_t ldc_pad = 0;  // ldc = n + ldc_pad
  int32_t split = 0;    // warps per column; 0: what small_batch_gemm picks (and columns per warp too)
  int32_t columns = 1;  // columns per warp, when split > 0
};

std::string describe(elem e, const gemv_case& c) {
  return std::string(e == elem::f32 ? "f32" : "bf16") + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) +
         " rows " + std::to_string(c.rows) + (c.accumulate ? " accumulate" : "") + " ldc n+" +
         std::to_string(c.ldc_pad) + " split " + std::to_string(c.split) + " columns " + std::to_string(c.columns);
}

class SmallBatchGemm : public device_fixture<> {
 protected:
  // Runs one case on the device and checks every element of out (the gap columns included).
  void check(elem e, const gemv_case& c, uint32_t seed) {
    SCOPED_TRACE(describe(e, c));
    const int64_t ldc = c.n + c.ldc_pad;
    std::vector<float> w = random_floats(static_cast<size_t>(c.n * c.k), seed);
    std::vector<float> in = random_floats(static_cast<size_t>(c.rows * c.k), seed + 1);
    const std::vector<float> prefill = random_floats(static_cast<size_t>(c.rows * ldc), seed + 2, 4.0f);
    if (e == elem::bf16) w = round_bf16(w), in = round_bf16(in);  // the values the kernel sees

    float* out = upload(prefill);
    if (e == elem::f32) {
      const float* dw = upload(w);
      const float* din = upload(in);
      ASSERT_TRUE(small_batch_gemm_supports(dw, c.n, c.k, din, c.rows));
      if (c.split == 0) {
        small_batch_gemm(dw, c.n, c.k, din, c.rows, out, ldc, c.accumulate, nullptr);
      } else {
        small_batch_gemm_with(dw, c.n, c.k, din, c.rows, out, ldc, c.accumulate, {c.split, c.columns}, nullptr);
      }
    } else {
      const auto* dw = reinterpret_cast<const bf16*>(upload(to_bf16(w)));
      const auto* din = reinterpret_cast<const bf16*>(upload(to_bf16(in)));
      ASSERT_TRUE(small_batch_gemm_supports(dw, c.n, c.k, din, c.rows));
      if (c.split == 0) {
        small_batch_gemm(dw, c.n, c.k, din, c.rows, out, ldc, c.accumulate, nullptr);
      } else {
        small_batch_gemm_with(dw, c.n, c.k, din, c.rows, out, ldc, c.accumulate, {c.split, c.columns}, nullptr);
      }
    }
    const std::vector<float> got = download(out, prefill.size());
    for (int32_t r = 0; r < c.rows; ++r) {
      for (int64_t j = 0; j < ldc; ++j) {
        const size_t o = static_cast<size_t>(r * ldc + j);
        if (j >= c.n) {  // beyond the matrix: untouched
          ASSERT_EQ(got[o], prefill[o]) << "row " << r << " gap column " << j;
          continue;
        }
        double dot = 0, mag = 0;
        for (int64_t i = 0; i < c.k; ++i) {
          const double p = double(in[static_cast<size_t>(r * c.k + i)]) * w[static_cast<size_t>(j * c.k + i)];
          dot += p;
          mag += std::fabs(p);
        }
        const double want = (c.accumulate ? prefill[o] : 0.0) + dot;
        // fp32 accumulation in another order: error ~ k * eps * sum |products|, far looser in theory;
        // 1e-5 relative to the magnitude sum is what any correct fp32 summation meets.
        const double tol = 1e-5 * (mag + 1.0);
        ASSERT_NEAR(got[o], want, tol) << "row " << r << " column " << j;
      }
    }
  }
};

// Every row count, both modes, a partial CTA (n = 37 is 9 CTAs of 4 columns and 1 extra), a padded
// row stride, and k whose per-lane chunk count is not a multiple of the unroll.
TEST_F(SmallBatchGemm, EveryRowCountMatchesTheReference) {
  uint32_t seed = 10;
  for (const elem e : {elem::f32, elem::bf16}) {
    for (int32_t rows = 1; rows <= kMaxGemvRows; ++rows) {
      check(e, {37, 576, rows, rows % 2 == 0, rows % 3 == 0 ? 5 : 0}, seed++);
    }
  }
}

// k from a single 16-byte chunk to several full unrolled steps plus a tail, with every tuning.
TEST_F(SmallBatchGemm, TailsOfKAndEveryTuning) {
  uint32_t seed = 100;
  for (const elem e : {elem::f32, elem::bf16}) {
    const int64_t per_chunk = e == elem::f32 ? 4 : 8;
    for (const int64_t k : {per_chunk, int64_t{64}, int64_t{1000}, int64_t{4096} + per_chunk}) {
      for (const int32_t split : {1, 2, 4}) {
        for (const int32_t columns : {1, 2}) {  // n = 7: the last warp's second column is past n
          check(e, {7, k, split == 2 ? 3 : 8, split != 1, 3, split, columns}, seed++);
        }
      }
    }
  }
}

// One column, and the automatic tuning on Llama-like shapes shrunk to emulator size (k 4096 and 14336:
// several warps per column for small n; 8 rows: two columns per warp).
TEST_F(SmallBatchGemm, SmallShapesWithTheAutomaticTuning) {
  ASSERT_GT(small_batch_gemm_default_tuning(64, 4096, 1, 2).warps_per_column, 1);
  ASSERT_EQ(small_batch_gemm_default_tuning(64, 4096, 8, 2).columns_per_warp, 2);
  uint32_t seed = 200;
  for (const elem e : {elem::f32, elem::bf16}) {
    check(e, {1, 256, 1, false, 0}, seed++);
    check(e, {1, 256, 8, true, 7}, seed++);
    check(e, {64, 4096, 1, true, 0}, seed++);   // o / down projection, residual add (beta = 1)
    check(e, {96, 1024, 4, false, 0}, seed++);  // qkv / gate_up
    check(e, {21, 14336, 8, true, 2}, seed++);  // down, 8 rows
  }
}

// Pure host checks: no device needed.
TEST(SmallBatchGemmSupport, RefusesWhatTheKernelCannotRun) {
  alignas(16) static float wf[64];
  alignas(16) static float xf[64];
  const auto* wb = reinterpret_cast<const bf16*>(wf);
  const auto* xb = reinterpret_cast<const bf16*>(xf);
  EXPECT_TRUE(small_batch_gemm_supports(wf, 4, 16, xf, 1));
  EXPECT_TRUE(small_batch_gemm_supports(wf, 4, 16, xf, kMaxGemvRows));
  EXPECT_TRUE(small_batch_gemm_supports(wb, 4, 16, xb, 3));
  EXPECT_FALSE(small_batch_gemm_supports(wf, 4, 16, xf, 0));                 // no rows
  EXPECT_FALSE(small_batch_gemm_supports(wf, 4, 16, xf, kMaxGemvRows + 1));  // cuBLAS's job
  EXPECT_FALSE(small_batch_gemm_supports(wf, 0, 16, xf, 1));                 // no columns
  EXPECT_FALSE(small_batch_gemm_supports(wf, 4, 0, xf, 1));
  EXPECT_FALSE(small_batch_gemm_supports(wf, 4, 6, xf, 1));   // fp32 k not a multiple of 4
  EXPECT_FALSE(small_batch_gemm_supports(wb, 4, 12, xb, 1));  // bf16 k not a multiple of 8
  EXPECT_FALSE(small_batch_gemm_supports(wb, 4, 1001, xb, 1));
  EXPECT_FALSE(small_batch_gemm_supports(wf + 1, 4, 16, xf, 1));  // W not 16-byte aligned
  EXPECT_FALSE(small_batch_gemm_supports(wf, 4, 16, xf + 2, 1));  // input not 16-byte aligned
  EXPECT_FALSE(small_batch_gemm_supports(wb + 4, 4, 16, xb, 1));
  EXPECT_FALSE(small_batch_gemm_supports(static_cast<const float*>(nullptr), 4, 16, xf, 1));
  // The launchers refuse the same before touching the device.
  float out[8] = {};
  EXPECT_THROW(small_batch_gemm(wf, 4, 6, xf, 1, out, 4, false, nullptr), std::invalid_argument);
  EXPECT_THROW(small_batch_gemm(wf, 4, 16, xf, 9, out, 4, false, nullptr), std::invalid_argument);
  EXPECT_THROW(small_batch_gemm(wf, 4, 16, xf, 1, out, 3, false, nullptr), std::invalid_argument);  // ldc < n
  EXPECT_THROW(small_batch_gemm_with(wf, 4, 16, xf, 1, out, 4, false, {3, 1}, nullptr), std::invalid_argument);
  EXPECT_THROW(small_batch_gemm_with(wf, 4, 16, xf, 1, out, 4, false, {1, 4}, nullptr), std::invalid_argument);
}

TEST(SmallBatchGemmSupport, DefaultTuningStaysInRange) {
  for (const int64_t n : {int64_t{1}, int64_t{576}, int64_t{4096}, int64_t{6144}, int64_t{28672}, int64_t{128256}}) {
    for (const int64_t k : {int64_t{64}, int64_t{576}, int64_t{4096}, int64_t{14336}}) {
      for (int32_t rows = 1; rows <= kMaxGemvRows; ++rows) {
        for (const int32_t bytes : {2, 4}) {
          const small_batch_gemm_tuning t = small_batch_gemm_default_tuning(n, k, rows, bytes);
          EXPECT_TRUE(t.warps_per_column == 1 || t.warps_per_column == 2 || t.warps_per_column == 4) << n << " " << k;
          EXPECT_TRUE(t.columns_per_warp == 1 || t.columns_per_warp == 2) << n << " " << k;
        }
      }
    }
  }
  // Enough columns to fill the GPU by themselves: one warp each (no shared-memory reduction).
  EXPECT_EQ(small_batch_gemm_default_tuning(128256, 4096, 1, 2).warps_per_column, 1);
  // Too little k to give split warps a full unrolled step each: not split.
  EXPECT_EQ(small_batch_gemm_default_tuning(64, 64, 1, 2).warps_per_column, 1);
}

// ---- the CUDA executor with the kernel switched on ------------------------------------------

using test_support::pseudo_tokens;
using test_support::tiny_executor_config;

struct executor_case {
  cuda_dtype dtype;
  bool graphs;
};
void PrintTo(const executor_case& c, std::ostream* os) {
  *os << (c.dtype == cuda_dtype::bf16 ? "bf16" : "f32") << (c.graphs ? "_graphs" : "");
}

class CudaExecutorSmallBatchGemm : public ::testing::TestWithParam<executor_case> {};

// Prefill (160 rows: cuBLAS, but its LM head has 8 rows: the kernel), then decode steps of 1, 3, 8 rows and a 5-token
// prompt chunk
// (<= 8 rows: the small-batch kernel for every projection and the LM head), against the CPU executor;
// the same steps on a CUDA executor with the kernel off show how far the two GEMMs differ.
TEST_P(CudaExecutorSmallBatchGemm, SameLogitsAsTheCpuExecutor) {
  if (!cuda_executor_available()) GTEST_SKIP() << "no CUDA device on this machine: CUDA executor tests skipped";
  using mode = sequence_slice::logits_mode;
  const executor_case c = GetParam();
  const auto weights = test_support::f32_dummy_weights(tiny_executor_config(), 5);
  const kv_cache_spec kv = test_support::kv_pool(64);
  const auto cpu = test_support::cpu_reference_executor(weights, kv, 2);
  cuda_executor_options go;
  go.kv = kv;
  go.dtype = c.dtype;
  go.cuda_graphs = c.graphs;
  go.small_batch_gemm_rows = gpu::kMaxGemvRows;
  const auto gemv = make_cuda_executor(weights, go);
  go.small_batch_gemm_rows = 0;
  const auto cublas = make_cuda_executor(weights, go);

  const float rel_tol = c.dtype == cuda_dtype::f32 ? 1e-3f : 6e-2f;
  auto run = [&](const step_batch& b, const char* what) {
    step_output oc, og, ob;
    cpu->execute(b, oc);
    gemv->execute(b, og);
    cublas->execute(b, ob);
    EXPECT_EQ(oc.num_rows, og.num_rows) << what;
    EXPECT_EQ(oc.logits.size(), og.logits.size()) << what;
    float scale = 1.0f;
    for (float v : oc.logits) scale = std::max(scale, std::fabs(v));
    double worst = 0, vs_cublas = 0;
    for (size_t i = 0; i < std::min(oc.logits.size(), og.logits.size()); ++i) {
      const double d = std::fabs(oc.logits[i] - og.logits[i]);
      worst = std::max(worst, d);
      if (!(d <= rel_tol * scale)) {
        ADD_FAILURE() << what << ": logit " << i << " cpu " << oc.logits[i] << " cuda " << og.logits[i];
        break;
      }
    }
    for (size_t i = 0; i < std::min(ob.logits.size(), og.logits.size()); ++i) {
      vs_cublas = std::max(vs_cublas, double(std::fabs(ob.logits[i] - og.logits[i])));
    }
    std::printf("  %-24s rows %zu  max |cpu - gemv| %.3g  max |cublas - gemv| %.3g (scale %.3g)\n", what,
                oc.logits.size() / 512, worst, vs_cublas, double(scale));
    return oc;
  };
  auto argmax = [](std::span<const float> row) {
    return static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
  };

  // 8 sequences: a 20-token prompt each, then decode.
  std::vector<token_id> next(8);
  step_batch prefill;
  for (int32_t s = 0; s < 8; ++s) {
    prefill.seqs.push_back(test_support::make_slice(s + 1, pseudo_tokens(20, s), 0, {2 * s, 2 * s + 1}, mode::last));
  }
  const step_output po = run(prefill, "prefill");
  for (int32_t s = 0; s < 8; ++s) next[static_cast<size_t>(s)] = argmax(po.row(s));
  // Decode positions per sequence advance as each takes part.
  std::vector<int32_t> pos(8, 20);
  for (const int32_t batch : {1, 3, 8, 8}) {
    step_batch b;
    for (int32_t s = 0; s < batch; ++s) {
      b.seqs.push_back(test_support::make_slice(s + 1, {next[static_cast<size_t>(s)]}, pos[static_cast<size_t>(s)],
                                                {2 * s, 2 * s + 1}, mode::last));
    }
    const step_output o = run(b, ("decode batch " + std::to_string(batch)).c_str());
    for (int32_t s = 0; s < batch; ++s) {
      next[static_cast<size_t>(s)] = argmax(o.row(s));
      ++pos[static_cast<size_t>(s)];
    }
  }
  // A 5-token prompt chunk of a new sequence, every row's logits (5 rows through the small kernel).
  step_batch chunk;
  chunk.seqs.push_back(test_support::make_slice(20, pseudo_tokens(5, 20), 0, {40}, mode::all));
  run(chunk, "prompt chunk of 5");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaExecutorSmallBatchGemm,
                         ::testing::Values(executor_case{cuda_dtype::f32, false},
                                           executor_case{cuda_dtype::bf16, false},
                                           executor_case{cuda_dtype::bf16, true}));

}  // namespace
}  // namespace tessera::gpu
