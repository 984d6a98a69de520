// The warp matrix and cp.async wrappers of gpu/mma.cuh, through the kernels of tests/gpu/mma_kernels.cu:
// every lane's fragment held to the PTX ISA manual's tables, and the products to a scalar matmul. On a
// GPU this checks the inline PTX (and that the kernels build fragments as the manual says); under the
// CPU emulation of CUDA it checks the emulator's implementation of the same instructions. The
// expected fragments here are spelled differently from both (element order of the manual's figures,
// not its formulas), so a layout mistake on either side fails:
//
//   * ldmatrix (PTX ISA 9.7.14.5.15, Figure 104): lane l receives elements 2l and 2l + 1 of each 8x8
//     matrix in row-major order (four lanes per row); with .trans, in column-major order;
//   * mma C/D (9.7.14.5.8 / 9.7.14.5.7, Figures 83 / 77): lane l's c0, c1 are row l / 4, columns
//     2 (l % 4) and 2 (l % 4) + 1; c2, c3 the same 8 rows lower.
//
// Integer-valued data is exact on any hardware (every partial sum is a small integer), so those
// checks compare bit for bit; random real data is compared with a tolerance for the Tensor Core's
// summation order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "tests/gpu/device_fixture.hpp"
#include "tests/gpu/mma_kernels.hpp"

namespace tessera::gpu {
namespace {

using mma_test::kWarps;
using mma_test::mma_variant;

bool is_k16(mma_variant v) { return v == mma_variant::m16n8k16_bf16 || v == mma_variant::m16n8k16_f16; }
bool is_bf16(mma_variant v) { return v == mma_variant::m16n8k16_bf16 || v == mma_variant::m16n8k8_bf16; }

std::string name_of(mma_variant v) {
  switch (v) {
    case mma_variant::m16n8k16_bf16: return "m16n8k16_bf16";
    case mma_variant::m16n8k16_f16: return "m16n8k16_f16";
    case mma_variant::m16n8k8_bf16: return "m16n8k8_bf16";
    case mma_variant::m16n8k8_f16: return "m16n8k8_f16";
  }
  return "?";
}

// The operand type's bits of f, and back (f16 or bf16, round to nearest even).
uint16_t encode(mma_variant v, float f) { return is_bf16(v) ? fp32_to_bf16(f) : fp32_to_fp16(f); }
float decode(mma_variant v, uint16_t h) { return is_bf16(v) ? bf16_to_fp32(h) : fp16_to_fp32(h); }

// ---- ldmatrix --------------------------------------------------------------------------------

struct ldmatrix_case {
  int num;
  bool trans;
};

class Ldmatrix : public device_fixture<::testing::TestWithParam<ldmatrix_case>> {};

// Matrix m of warp w holds value(w, m, r, c) at row r, column c: distinct 10-bit values, so a wrong
// lane, register, half, row or column shows as a different number.
uint16_t value(int w, int m, int r, int c) { return static_cast<uint16_t>((w << 9) | (m << 6) | (r << 3) | c); }

TEST_P(Ldmatrix, EveryLaneHoldsTheManualsFragment) {
  const auto [num, trans] = GetParam();
  std::vector<uint16_t> matrices(kWarps * 4 * 64);
  for (int w = 0; w < kWarps; ++w)
    for (int m = 0; m < 4; ++m)
      for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 8; ++c) matrices[((w * 4 + m) * 8 + r) * 8 + c] = value(w, m, r, c);
  // Rows in shuffled shared-memory slots: ldmatrix takes one address per row, not a base and a stride.
  std::vector<int32_t> slot(kWarps * 32);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), std::mt19937(7));
  constexpr uint32_t kUntouched = 0xDEADBEEFu;
  uint32_t* out = upload(std::vector<uint32_t>(kWarps * 32 * 4, kUntouched));
  mma_test::ldmatrix_fragments(out, upload(matrices), upload(slot), num, trans);
  const std::vector<uint32_t> got = download(out, kWarps * 32 * 4);
  for (int w = 0; w < kWarps; ++w) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 4; ++i) {
        const uint32_t word = got[(w * 32 + lane) * 4 + i];
        if (i >= num) {
          EXPECT_EQ(word, kUntouched) << "warp " << w << " lane " << lane << " register " << i;
          continue;
        }
        // Elements 2 lane and 2 lane + 1 of matrix i, in row-major (or, .trans, column-major) order.
        uint16_t half[2];
        for (int h = 0; h < 2; ++h) {
          const int e = 2 * lane + h;
          half[h] = trans ? value(w, i, e % 8, e / 8) : value(w, i, e / 8, e % 8);
        }
        EXPECT_EQ(word & 0xffffu, half[0]) << "warp " << w << " lane " << lane << " register " << i << " low half";
        EXPECT_EQ(word >> 16, half[1]) << "warp " << w << " lane " << lane << " register " << i << " high half";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Ldmatrix,
                         ::testing::Values(ldmatrix_case{1, false}, ldmatrix_case{2, false}, ldmatrix_case{4, false},
                                           ldmatrix_case{1, true}, ldmatrix_case{2, true}, ldmatrix_case{4, true}),
                         [](const auto& p) {
                           return "x" + std::to_string(p.param.num) + (p.param.trans ? "_trans" : "");
                         });

// ---- mma.sync with fragments gathered by the manual's tables -----------------------------------

// One warp's problem: A [16][K], B [K][8] (values exactly representable in the operand type), C [16][8].
struct mma_problem {
  std::vector<float> a, b, c;
};

// D = A B + C in double (the products of two f16/bf16 values and these sums are exact for the
// integer-valued cases).
std::vector<double> reference(const mma_problem& p, int k) {
  std::vector<double> d(16 * 8);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      double s = p.c[m * 8 + n];
      for (int j = 0; j < k; ++j) s += double{p.a[m * k + j]} * p.b[j * 8 + n];
      d[m * 8 + n] = s;
    }
  }
  return d;
}

// Sum of |a b| over the dot product and |c|: the scale of the rounding a Tensor Core may add.
double magnitude(const mma_problem& p, int k, int m, int n) {
  double s = std::fabs(p.c[m * 8 + n]);
  for (int j = 0; j < k; ++j) s += std::fabs(double{p.a[m * k + j]} * p.b[j * 8 + n]);
  return s;
}

class MmaFragments : public device_fixture<::testing::TestWithParam<mma_variant>> {
 protected:
  // Runs one problem per warp; checks lane l's d[i] against D at the manual's C/D position. tolerance
  // 0: bit for bit.
  void check(const std::vector<mma_problem>& problems, double tolerance, const std::string& what) {
    SCOPED_TRACE(what);
    const mma_variant v = GetParam();
    const int k = is_k16(v) ? 16 : 8;
    std::vector<uint16_t> a, b;
    std::vector<float> c;
    for (const mma_problem& p : problems) {
      for (float x : p.a) a.push_back(encode(v, x));
      for (float x : p.b) b.push_back(encode(v, x));
      c.insert(c.end(), p.c.begin(), p.c.end());
    }
    float* out = alloc(kWarps * 32 * 4);
    mma_test::mma_fragments(out, upload(a), upload(b), upload(c), v);
    const std::vector<float> got = download(out, kWarps * 32 * 4);
    for (int w = 0; w < kWarps; ++w) {
      const std::vector<double> want = reference(problems[w], k);
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {
          const int row = lane / 4 + (i < 2 ? 0 : 8), col = 2 * (lane % 4) + i % 2;
          const float d = got[(w * 32 + lane) * 4 + i];
          const double limit = tolerance * magnitude(problems[w], k, row, col);
          EXPECT_LE(std::fabs(d - want[row * 8 + col]), limit)
              << "warp " << w << " lane " << lane << " d[" << i << "] should be D[" << row << "][" << col
              << "] = " << want[row * 8 + col] << ", is " << d;
        }
      }
    }
  }

  // Operands exactly representable in the variant's type: values rounded through it.
  std::vector<float> representable(std::vector<float> x) const {
    for (float& f : x) f = decode(GetParam(), encode(GetParam(), f));
    return x;
  }
};

TEST_P(MmaFragments, EveryLaneHoldsItsElementOfD) {
  const int k = is_k16(GetParam()) ? 16 : 8;
  // A = I (the first 8 columns for K = 8, so rows m and m + 8 both pick B's row m % 8), C = 0:
  // D[m][n] = B[m % K][n], and B's elements are all different, so every lane's d[i] names its position.
  std::vector<mma_problem> identity(kWarps);
  for (int w = 0; w < kWarps; ++w) {
    identity[w].a.assign(16 * k, 0.0f);
    for (int m = 0; m < 16; ++m) identity[w].a[m * k + m % k] = 1.0f;
    for (int j = 0; j < k; ++j)
      for (int n = 0; n < 8; ++n) identity[w].b.push_back(static_cast<float>(w * 128 + j * 8 + n + 1));
    identity[w].c.assign(16 * 8, 0.0f);
  }
  check(identity, 0.0, "A = I: D reveals B and the C/D layout");

  // B selects A's columns n (then n + 8 for K = 16): D[m][n] = A[m][n (+ 8)], every A element a
  // different integer (at most 256, exact in bf16).
  for (int shift = 0; shift < k; shift += 8) {
    std::vector<mma_problem> select(kWarps);
    for (int w = 0; w < kWarps; ++w) {
      for (int m = 0; m < 16; ++m)
        for (int j = 0; j < k; ++j) select[w].a.push_back(static_cast<float>(m * k + j + 1 - w * 64));
      select[w].b.assign(k * 8, 0.0f);
      for (int n = 0; n < 8; ++n) select[w].b[(n + shift) * 8 + n] = 1.0f;
      select[w].c.assign(16 * 8, 0.0f);
    }
    check(select, 0.0, "B selects columns " + std::to_string(shift) + "..: D reveals the A layout");
  }

  // A = 0: D = C, each element different: the C fragment goes in where D comes out.
  std::vector<mma_problem> passthrough(kWarps);
  for (int w = 0; w < kWarps; ++w) {
    passthrough[w].a.assign(16 * k, 0.0f);
    passthrough[w].b.assign(k * 8, 1.0f);
    for (int e = 0; e < 128; ++e) passthrough[w].c.push_back(static_cast<float>(e * 3 - 100 + w * 1000));
  }
  check(passthrough, 0.0, "A = 0: D = C");
}

TEST_P(MmaFragments, ProductsMatchAScalarMatmul) {
  const int k = is_k16(GetParam()) ? 16 : 8;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<mma_problem> ints(kWarps);
  for (mma_problem& p : ints) {
    for (int e = 0; e < 16 * k; ++e) p.a.push_back(static_cast<float>(small(rng)));
    for (int e = 0; e < k * 8; ++e) p.b.push_back(static_cast<float>(small(rng)));
    for (int e = 0; e < 16 * 8; ++e) p.c.push_back(static_cast<float>(small(rng) * 16));
  }
  check(ints, 0.0, "integers in [-8, 8]: exact");

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<mma_problem> reals(kWarps);
  for (mma_problem& p : reals) {
    for (int e = 0; e < 16 * k; ++e) p.a.push_back(normal(rng));
    for (int e = 0; e < k * 8; ++e) p.b.push_back(normal(rng));
    for (int e = 0; e < 16 * 8; ++e) p.c.push_back(normal(rng));
    p.a = representable(p.a);
    p.b = representable(p.b);
  }
  check(reals, 1e-5, "normal values");
}

INSTANTIATE_TEST_SUITE_P(Variants, MmaFragments,
                         ::testing::Values(mma_variant::m16n8k16_bf16, mma_variant::m16n8k16_f16,
                                           mma_variant::m16n8k8_bf16, mma_variant::m16n8k8_f16),
                         [](const auto& p) { return name_of(p.param); });

// ---- cp.async -> ldmatrix -> mma, against a scalar matmul -------------------------------------

struct pipeline_case {
  mma_variant variant;
  bool b_transposed;
  int k;
};

class LdmatrixMma : public device_fixture<::testing::TestWithParam<pipeline_case>> {};

TEST_P(LdmatrixMma, MatchesAScalarMatmul) {
  const auto [v, b_transposed, k] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(k * 10 + b_transposed));
  for (const bool integers : {true, false}) {
    SCOPED_TRACE(integers ? "integers in [-8, 8]" : "normal values");
    std::uniform_int_distribution<int> small(-8, 8);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto draw = [&] { return integers ? static_cast<float>(small(rng)) : decode(v, encode(v, normal(rng))); };
    std::vector<float> a(16 * k), b(k * 8);  // A row-major [16][k], B row-major [k][8]
    for (float& x : a) x = draw();
    for (float& x : b) x = draw();
    std::vector<uint16_t> a_bits(a.size()), b_bits(b.size());
    for (size_t i = 0; i < a.size(); ++i) a_bits[i] = encode(v, a[i]);
    for (int j = 0; j < k; ++j) {
      for (int n = 0; n < 8; ++n) {
        // B^T [8][k] when the kernel loads B without .trans.
        b_bits[b_transposed ? n * k + j : j * 8 + n] = encode(v, b[j * 8 + n]);
      }
    }
    float* d = alloc(16 * 8);
    mma_test::ldmatrix_mma(d, upload(a_bits), upload(b_bits), k, v, b_transposed);
    const std::vector<float> got = download(d, 16 * 8);
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 8; ++n) {
        double want = 0.0, scale = 0.0;
        for (int j = 0; j < k; ++j) {
          want += double{a[m * k + j]} * b[j * 8 + n];
          scale += std::fabs(double{a[m * k + j]} * b[j * 8 + n]);
        }
        EXPECT_LE(std::fabs(got[m * 8 + n] - want), integers ? 0.0 : 1e-5 * scale) << "D[" << m << "][" << n << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, LdmatrixMma,
                         ::testing::Values(pipeline_case{mma_variant::m16n8k16_bf16, false, 16},
                                           pipeline_case{mma_variant::m16n8k16_bf16, false, 64},
                                           pipeline_case{mma_variant::m16n8k16_bf16, true, 32},
                                           pipeline_case{mma_variant::m16n8k16_f16, false, 32},
                                           pipeline_case{mma_variant::m16n8k16_f16, true, 16},
                                           pipeline_case{mma_variant::m16n8k8_bf16, false, 8},
                                           pipeline_case{mma_variant::m16n8k8_bf16, true, 24},
                                           pipeline_case{mma_variant::m16n8k8_f16, false, 40},
                                           pipeline_case{mma_variant::m16n8k8_f16, true, 8}),
                         [](const auto& p) {
                           return name_of(p.param.variant) + (p.param.b_transposed ? "_bt" : "_b") + "_k" +
                                  std::to_string(p.param.k);
                         });

// ---- cp.async ----------------------------------------------------------------------------------

class CpAsync : public device_fixture<> {};

TEST_F(CpAsync, EveryKindLandsInSharedMemory) {
  using namespace mma_test;
  std::vector<uint8_t> src(kCopySourceBytes);
  std::mt19937 rng(5);
  for (uint8_t& x : src) x = static_cast<uint8_t>(rng());
  uint8_t* out = alloc<uint8_t>(kCopyBytes);
  uint8_t* first = alloc<uint8_t>(kCopyThreads * 4);
  cp_async_copies(out, first, upload(src));
  const std::vector<uint8_t> got = download(out, kCopyBytes);
  const std::vector<uint8_t> got_first = download(first, kCopyThreads * 4);
  // Region by region (mma_kernels.cu, cp_async_kernel): ca 4, ca 8, cg 16 copy whole; the two
  // zero-fill kinds copy cp_async_zfill_bytes of their 16 and clear the rest.
  const int sizes[] = {4, 8, 16, 16, 16};
  int region = 0;
  for (int kind = 0; kind < 5; ++kind) {
    for (int t = 0; t < kCopyThreads; ++t) {
      const int dst = region + t * sizes[kind];
      const int from_src = kind < 3 ? sizes[kind] : cp_async_zfill_bytes(t, kind - 3);
      for (int j = 0; j < sizes[kind]; ++j) {
        const uint8_t want = j < from_src ? src[cp_async_source_offset(dst + j)] : uint8_t{0};
        ASSERT_EQ(got[dst + j], want) << "kind " << kind << " thread " << t << " byte " << j;
      }
    }
    region += kCopyThreads * sizes[kind];
  }
  // What each thread read from its first group right after cp.async.wait_group 3.
  for (int t = 0; t < kCopyThreads; ++t) {
    for (int j = 0; j < 4; ++j)
      ASSERT_EQ(got_first[t * 4 + j], src[cp_async_source_offset(t * 4 + j)]) << "thread " << t;
  }
}

}  // namespace
}  // namespace tessera::gpu
