// The GEMMs over GGUF-quantised weights (gpu/quantized_gemm.hpp) against the engine's CPU dequantiser
// (engine/model/ggml_types.hpp's dequantize_row, checked against llama.cpp's output by the model
// tests) and a dot product in double: every type, random blocks (every bit pattern of the quants and
// scales, finite half-precision factors), rows 1..8, accumulate on and off, a padded output stride, and
// the bf16 dequantisation for large batches; the shapes they refuse. Runs on a GPU and under the CPU
// emulation of CUDA (gpu_quantized_gemm_test_emu in CI).
#include "gpu/quantized_gemm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model/ggml_types.hpp"
#include "tests/gpu/device_fixture.hpp"
#include "tests/gpu/test_data.hpp"

namespace tessera::gpu {
namespace {

const ggml_type kTypes[] = {ggml_type::q8_0, ggml_type::q4_0, ggml_type::q4_1, ggml_type::q4_k, ggml_type::q6_k};

void put_half(std::vector<uint8_t>& b, size_t at, float v) {
  const uint16_t h = fp32_to_fp16(v);
  b[at] = static_cast<uint8_t>(h & 0xFF);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}

// n rows of k weights of `type`: random bytes, then each block's half-precision factors set to
// finite values of either sign (as a quantiser writes; Q4_1's min and Q4_K's dmin included).
std::vector<uint8_t> random_matrix(ggml_type type, int64_t n, int64_t k, uint32_t seed) {
  const ggml_type_info& info = type_info(type);
  const int64_t blocks = n * (k / info.block_elems);
  std::vector<uint8_t> m(static_cast<size_t>(blocks * info.block_bytes));
  std::mt19937 rng(seed);
  for (uint8_t& b : m) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> factor(-0.05f, 0.05f);
  for (int64_t i = 0; i < blocks; ++i) {
    const size_t at = static_cast<size_t>(i * info.block_bytes);
    switch (type) {
      case ggml_type::q8_0:
      case ggml_type::q4_0: put_half(m, at, factor(rng)); break;
      case ggml_type::q4_1:
      case ggml_type::q4_k:
        put_half(m, at, factor(rng));
        put_half(m, at + 2, factor(rng));
        break;
      case ggml_type::q6_k: put_half(m, at + 208, factor(rng)); break;
      default: break;
    }
  }
  return m;
}

// Row r of the matrix as the CPU dequantises it.
std::vector<float> dequantized(ggml_type type, const std::vector<uint8_t>& m, int64_t n, int64_t k) {
  const int64_t row = row_bytes(type, k);
  std::vector<float> w(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) dequantize_row(type, m.data() + r * row, w.data() + r * k, k);
  return w;
}

struct shape {
  int64_t n, k;
  int32_t rows;
  bool accumulate;
  int64_t ldc_pad;
};

class QuantizedGemm : public device_fixture<> {};

TEST_F(QuantizedGemm, SmallBatchEqualsTheCpuDequantiserTimesTheInput) {
  const shape shapes[] = {{37, 512, 1, false, 0}, {19, 256, 2, true, 3}, {8, 768, 3, false, 1},
                          {41, 256, 5, true, 0},  {9, 512, 8, false, 2}, {3, 256, 7, true, 0}};
  uint32_t seed = 100;
  for (const ggml_type type : kTypes) {
    for (const shape& s : shapes) {
      SCOPED_TRACE(std::string(type_info(type).name) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) +
                   " rows " + std::to_string(s.rows) + (s.accumulate ? " accumulate" : ""));
      const auto m = random_matrix(type, s.n, s.k, ++seed);
      const std::vector<float> w = dequantized(type, m, s.n, s.k);
      const std::vector<float> in = round_bf16(random_floats(static_cast<size_t>(s.rows * s.k), ++seed));
      const int64_t ldc = s.n + s.ldc_pad;
      const std::vector<float> prefill = random_floats(static_cast<size_t>(s.rows * ldc), ++seed, 4.0f);
      float* out = upload(prefill);
      quantized_small_batch_gemm(type, upload(m), row_bytes(type, s.k), s.n, s.k,
                                 reinterpret_cast<const bf16*>(upload(to_bf16(in))), s.rows, out, ldc, s.accumulate,
                                 nullptr);
      const std::vector<float> got = download(out, prefill.size());
      for (int32_t r = 0; r < s.rows; ++r) {
        for (int64_t j = 0; j < ldc; ++j) {
          const size_t at = static_cast<size_t>(r * ldc + j);
          if (j >= s.n) {
            ASSERT_EQ(got[at], prefill[at]) << "the gap past n is left alone";
            continue;
          }
          double want = s.accumulate ? prefill[at] : 0.0, mag = 0.0;
          for (int64_t i = 0; i < s.k; ++i) {
            const double p = double(w[static_cast<size_t>(j * s.k + i)]) * in[static_cast<size_t>(r * s.k + i)];
            want += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(got[at], want, 1e-5 * (mag + 1.0)) << "row " << r << " column " << j;
        }
      }
    }
  }
}

// The large-batch path: the matrix as bf16, the CPU dequantiser's value rounded to nearest even (one
// bf16 step apart at most where the device fuses a multiply-add the CPU rounds twice).
TEST_F(QuantizedGemm, DequantisationToBf16EqualsTheCpuDequantiserRounded) {
  uint32_t seed = 200;
  for (const ggml_type type : kTypes) {
    SCOPED_TRACE(type_info(type).name);
    const int64_t n = 13, k = 512;
    const auto m = random_matrix(type, n, k, ++seed);
    const std::vector<float> w = dequantized(type, m, n, k);
    auto* out = alloc<uint16_t>(static_cast<size_t>(n * k));
    dequantize_rows_to_bf16(type, upload(m), row_bytes(type, k), n, k, reinterpret_cast<bf16*>(out), nullptr);
    const std::vector<uint16_t> got = download(out, static_cast<size_t>(n * k));
    size_t exact = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const uint16_t want = fp32_to_bf16(w[i]);
      if (got[i] == want) {
        ++exact;
        continue;
      }
      ASSERT_EQ(std::abs(int(got[i]) - int(want)), 1)
          << "element " << i << ": " << bf16_to_fp32(got[i]) << " vs " << w[i];
    }
    EXPECT_GE(double(exact), 0.999 * double(got.size()));
  }
}

TEST_F(QuantizedGemm, RefusesWhatItCannotRead) {
  const auto m = random_matrix(ggml_type::q4_k, 2, 256, 1);
  const void* w = upload(m);
  const auto* in = reinterpret_cast<const bf16*>(alloc<uint16_t>(8 * 512));
  float* out = alloc(64);
  EXPECT_TRUE(quantized_gemm_supports(ggml_type::q6_k));
  EXPECT_FALSE(quantized_gemm_supports(ggml_type::q5_k));
  EXPECT_FALSE(quantized_gemm_supports(ggml_type::bf16));
  EXPECT_THROW(quantized_small_batch_gemm(ggml_type::q5_k, w, 176, 2, 256, in, 1, out, 2, false, nullptr),
               std::invalid_argument);
  EXPECT_THROW(quantized_small_batch_gemm(ggml_type::q4_k, w, 144, 2, 200, in, 1, out, 2, false, nullptr),
               std::invalid_argument);  // k not a multiple of 256
  EXPECT_THROW(quantized_small_batch_gemm(ggml_type::q4_k, w, 100, 2, 256, in, 1, out, 2, false, nullptr),
               std::invalid_argument);  // row_bytes short of a row
  EXPECT_THROW(quantized_small_batch_gemm(ggml_type::q4_k, w, 146, 1, 256, in, 1, out, 2, false, nullptr),
               std::invalid_argument);  // Q4_K rows read in 4-byte words
  EXPECT_THROW(quantized_small_batch_gemm(ggml_type::q4_k, w, 144, 2, 256, in, 9, out, 2, false, nullptr),
               std::invalid_argument);  // more rows than the kernel serves
  EXPECT_THROW(quantized_small_batch_gemm(ggml_type::q4_k, w, 144, 2, 256, in, 1, out, 1, false, nullptr),
               std::invalid_argument);  // ldc < n
  EXPECT_THROW(dequantize_rows_to_bf16(ggml_type::q2_k, w, 84, 2, 256, reinterpret_cast<bf16*>(out), nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace tessera::gpu
