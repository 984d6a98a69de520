// The GEMMs over GGUF-quantised weights (gpu/quantized_gemm.hpp) against the engine's CPU dequantiser
// (engine/model/ggml_types.hpp's dequantize_row, checked against llama.cpp's output by the model
// tests) and a dot product in double: every type, random blocks (every bit pattern of the quants and
// scales, finite half-precision factors), rows 1..8, accumulate on and off, a padded output stride, and
// the bf16 dequantisation for large batches; the shapes they refuse. The int8 path (dp4a) against the
// CPU executor's own kernels: its activation quantisation field for field, its quantised matmul up to
// the order of float sums. Runs on a GPU and under the CPU emulation of CUDA
// (gpu_quantized_gemm_test_emu in CI).
#include "gpu/quantized_gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels.hpp"
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
  int64_t ldc() const { return n + ldc_pad; }
};

// Both small-batch paths' cases: every row count, several block counts, accumulate on and off, padded
// output strides.
constexpr shape kShapes[] = {{37, 512, 1, false, 0}, {19, 256, 2, true, 3}, {8, 768, 3, false, 1},
                             {41, 256, 5, true, 0},  {9, 512, 8, false, 2}, {3, 256, 7, true, 0}};

std::string case_name(ggml_type type, const shape& s) {
  return std::string(type_info(type).name) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " rows " +
         std::to_string(s.rows) + (s.accumulate ? " accumulate" : "");
}

// sum_i |W[j, i] in[r, i]|: what the float sums of row r, column j are rounded against.
double magnitude(const std::vector<float>& w, const std::vector<float>& in, const shape& s, int32_t r, int64_t j) {
  double mag = 0.0;
  for (int64_t i = 0; i < s.k; ++i)
    mag += std::fabs(double(w[static_cast<size_t>(j * s.k + i)]) * in[static_cast<size_t>(r * s.k + i)]);
  return mag;
}

// got (rows x ldc) against want(r, j, at) = {value, tolerance} in the n columns of each row; the
// columns past n as they were before the call (prefill).
template <class Want>
void expect_columns(const std::vector<float>& got, const std::vector<float>& prefill, const shape& s, Want&& want) {
  for (int32_t r = 0; r < s.rows; ++r) {
    for (int64_t j = 0; j < s.ldc(); ++j) {
      const size_t at = static_cast<size_t>(r * s.ldc() + j);
      if (j >= s.n) {
        ASSERT_EQ(got[at], prefill[at]) << "the gap past n is left alone";
        continue;
      }
      const auto [value, tolerance] = want(r, j, at);
      ASSERT_NEAR(got[at], value, tolerance) << "row " << r << " column " << j;
    }
  }
}

// The float kernels' contract, out = (accumulate ? out : 0) + in . W^T, for one case: gemm(type, w, in,
// out) is the kernel on device buffers; W's values are the CPU dequantiser's, rounded to bf16 when the
// kernel multiplies bf16 (bf16_weights); the reference is the product in double, within tolerance x
// the magnitude of its terms.
using float_gemm = void (*)(ggml_type, const void*, int64_t, int64_t, int64_t, const bf16*, int32_t, float*, int64_t,
                            bool, cudaStream_t);

class QuantizedGemm : public device_fixture<> {
 protected:
  void expect_product(float_gemm gemm, ggml_type type, const shape& s, uint32_t& seed, bool bf16_weights,
                      double tolerance) {
    SCOPED_TRACE(case_name(type, s));
    const auto m = random_matrix(type, s.n, s.k, ++seed);
    std::vector<float> w = dequantized(type, m, s.n, s.k);
    if (bf16_weights) w = round_bf16(w);
    const std::vector<float> in = round_bf16(random_floats(static_cast<size_t>(s.rows * s.k), ++seed));
    const std::vector<float> prefill = random_floats(static_cast<size_t>(s.rows * s.ldc()), ++seed, 4.0f);
    float* out = upload(prefill);
    gemm(type, upload(m), row_bytes(type, s.k), s.n, s.k, reinterpret_cast<const bf16*>(upload(to_bf16(in))), s.rows,
         out, s.ldc(), s.accumulate, nullptr);
    expect_columns(download(out, prefill.size()), prefill, s, [&](int32_t r, int64_t j, size_t at) {
      double want = s.accumulate ? prefill[at] : 0.0;
      for (int64_t i = 0; i < s.k; ++i)
        want += double(w[static_cast<size_t>(j * s.k + i)]) * in[static_cast<size_t>(r * s.k + i)];
      return std::pair{want, tolerance * (magnitude(w, in, s, r, j) + 1.0)};
    });
  }
};

TEST_F(QuantizedGemm, SmallBatchEqualsTheCpuDequantiserTimesTheInput) {
  uint32_t seed = 100;
  for (const ggml_type type : kTypes) {
    for (const shape& s : kShapes) expect_product(quantized_small_batch_gemm, type, s, seed, false, 1e-5);
  }
}

// The tiled tensor-core path: the CPU dequantiser's values rounded to bf16 (what it multiplies on tensor
// cores) times the bf16 input, for every type; rows that end inside a 64-row tile or fill one or two,
// columns that end inside a 64-column tile, one to six 128-value K tiles (a K-quant block spans two),
// accumulate, padded strides.
TEST_F(QuantizedGemm, TiledEqualsTheCpuDequantiserRoundedToBf16TimesTheInput) {
  const shape shapes[] = {
      {37, 256, 9, false, 0}, {64, 512, 64, true, 2}, {130, 256, 65, false, 1}, {19, 768, 100, true, 0}};
  uint32_t seed = 400;
  for (const ggml_type type : kTypes) {
    for (const shape& s : shapes) {
      ASSERT_TRUE(quantized_tiled_gemm_supports(type, s.k));
      expect_product(quantized_tiled_gemm, type, s, seed, true, 3e-5);
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

bool is_k_quant(ggml_type type) { return type == ggml_type::q4_k || type == ggml_type::q6_k; }

// Activations quantised by one of the CPU executor's quantisers, as the bytes of its blocks.
template <class Block>
std::vector<uint8_t> quantized_bytes(const std::vector<float>& in, int64_t block_elems,
                                     void (*quantize)(const float*, Block*, int64_t)) {
  std::vector<Block> blocks(in.size() / static_cast<size_t>(block_elems));
  quantize(in.data(), blocks.data(), static_cast<int64_t>(in.size()));
  std::vector<uint8_t> bytes(blocks.size() * sizeof(Block));
  std::memcpy(bytes.data(), blocks.data(), bytes.size());
  return bytes;
}

// The CPU executor's quantisation of rows x k activations for `type` (the scalar table's quantize_act or
// quantize_act_k): the int8 path's layout.
std::vector<uint8_t> cpu_activations(ggml_type type, const std::vector<float>& in) {
  const cpu::kernel_table& k = cpu::scalar_kernels();
  return is_k_quant(type) ? quantized_bytes(in, act_block_k_elems, k.quantize_act_k)
                          : quantized_bytes(in, act_block_elems, k.quantize_act);
}

template <class Block>
Block block_at(const std::vector<uint8_t>& bytes, size_t i) {
  Block b;
  std::memcpy(&b, bytes.data() + i * sizeof(Block), sizeof(Block));
  return b;
}

// Rows of bf16 values with the edge cases of the rule: an all-zero block (scale 0), a block of one
// non-zero value (it quantises to +-127), values halfway between two steps (ties go to even).
std::vector<float> activation_rows(int32_t rows, int64_t k, uint32_t seed) {
  std::vector<float> in = round_bf16(random_floats(static_cast<size_t>(rows * k), seed, 2.0f));
  // Row 0's values 32..63: max 127, so the step is 1 in their 32-block and their super-block, and 0.5,
  // 1.5, 2.5, -2.5 are ties (0, 2, 2, -2).
  in[32] = 127.0f;
  const float ties[] = {0.5f, 1.5f, 2.5f, -2.5f, -0.5f, 3.5f};
  for (size_t i = 0; i < std::size(ties); ++i) in[33 + i] = ties[i];
  if (rows > 1) {
    // Row 1's first super-block: one value, alone in its 32-block, the other 32-blocks zero.
    std::fill(in.begin() + k, in.begin() + k + 256, 0.0f);
    in[static_cast<size_t>(k + 20)] = -3.5f;
  }
  return in;
}

// The int8 path's activations are, field for field, the CPU executor's quantisation of the same bf16
// values, for both block formats.
TEST_F(QuantizedGemm, Int8ActivationsAreTheCpuExecutorsQuantisation) {
  const int32_t rows = 3;
  const int64_t k = 768;
  const std::vector<float> in = activation_rows(rows, k, 11);
  const auto* dev_in = reinterpret_cast<const bf16*>(upload(to_bf16(in)));
  for (const ggml_type type : {ggml_type::q8_0, ggml_type::q6_k}) {
    SCOPED_TRACE(type_info(type).name);
    const int64_t bytes = int8_activation_bytes(type, rows, k);
    auto* act = alloc<uint8_t>(static_cast<size_t>(bytes));
    quantize_activations_int8(type, dev_in, rows, k, act, nullptr);
    const std::vector<uint8_t> got = download(act, static_cast<size_t>(bytes));
    const std::vector<uint8_t> want = cpu_activations(type, in);
    ASSERT_EQ(got.size(), want.size());
    if (is_k_quant(type)) {
      for (size_t b = 0; b < got.size() / sizeof(act_block_k); ++b) {
        const auto g = block_at<act_block_k>(got, b);
        const auto w = block_at<act_block_k>(want, b);
        ASSERT_EQ(g.d, w.d) << "block " << b;
        for (int i = 0; i < 256; ++i) ASSERT_EQ(g.q[i], w.q[i]) << "block " << b << " value " << i;
        for (int j = 0; j < 16; ++j) ASSERT_EQ(g.bsums[j], w.bsums[j]) << "block " << b << " group " << j;
      }
    } else {
      for (size_t b = 0; b < got.size() / sizeof(act_block); ++b) {
        const auto g = block_at<act_block>(got, b);
        const auto w = block_at<act_block>(want, b);
        ASSERT_EQ(g.d, w.d) << "block " << b;
        ASSERT_EQ(g.s, w.s) << "block " << b;
        ASSERT_EQ(g.sum, w.sum) << "block " << b;
        for (int i = 0; i < 32; ++i) ASSERT_EQ(g.q[i], w.q[i]) << "block " << b << " value " << i;
      }
    }
  }
}

// The int8 small-batch GEMM over the CPU executor's activation blocks (uploaded as they are: one
// layout) equals the CPU executor's quantised matmul (the scalar table's matmul_q: exact int32 dot
// products per block, then the scales) up to the order of the float sums; over activations quantised on
// the device it gives the same output bit for bit.
TEST_F(QuantizedGemm, Int8SmallBatchEqualsTheCpuExecutorsQuantisedMatmul) {
  uint32_t seed = 300;
  for (const ggml_type type : kTypes) {
    for (const shape& s : kShapes) {
      SCOPED_TRACE(case_name(type, s));
      const auto m = random_matrix(type, s.n, s.k, ++seed);
      const std::vector<float> w = dequantized(type, m, s.n, s.k);
      const std::vector<float> in = activation_rows(s.rows, s.k, ++seed);
      const std::vector<uint8_t> act = cpu_activations(type, in);
      const std::vector<float> prefill = random_floats(static_cast<size_t>(s.rows * s.ldc()), ++seed, 4.0f);
      const uint8_t* dev_w = upload(m);
      float* out = upload(prefill);
      quantized_small_batch_gemm_int8(type, dev_w, row_bytes(type, s.k), s.n, s.k, upload(act), s.rows, out, s.ldc(),
                                      s.accumulate, nullptr);
      const std::vector<float> got = download(out, prefill.size());

      std::vector<float> want = prefill;
      const bool k_quant = is_k_quant(type);
      cpu::qmatmul_args args;
      args.type = type;
      args.weights = reinterpret_cast<const std::byte*>(m.data());
      args.weight_stride = row_bytes(type, s.k);
      args.num_blocks = s.k / type_info(type).block_elems;
      args.act = k_quant ? nullptr : reinterpret_cast<const act_block*>(act.data());
      args.act_k = k_quant ? reinterpret_cast<const act_block_k*>(act.data()) : nullptr;
      args.act_stride = args.num_blocks;  // the weights' and the activations' blocks are the same size
      args.num_tokens = s.rows;
      args.row_begin = 0;
      args.row_end = s.n;
      args.out = want.data();
      args.out_stride = s.ldc();
      args.accumulate = s.accumulate;
      cpu::scalar_kernels().matmul_q(args);
      expect_columns(got, prefill, s, [&](int32_t r, int64_t j, size_t at) {
        const double mag = magnitude(w, in, s, r, j) + (s.accumulate ? std::fabs(prefill[at]) : 0.0);
        return std::pair{double(want[at]), 1e-5 * (mag + 1.0)};
      });

      auto* dev_act = alloc<uint8_t>(act.size());
      quantize_activations_int8(type, reinterpret_cast<const bf16*>(upload(to_bf16(in))), s.rows, s.k, dev_act,
                                nullptr);
      float* out2 = upload(prefill);
      quantized_small_batch_gemm_int8(type, dev_w, row_bytes(type, s.k), s.n, s.k, dev_act, s.rows, out2, s.ldc(),
                                      s.accumulate, nullptr);
      ASSERT_EQ(download(out2, prefill.size()), got);
    }
  }
}

TEST_F(QuantizedGemm, Int8PathRefusesWhatItCannotRead) {
  const auto m = random_matrix(ggml_type::q8_0, 2, 256, 1);
  const auto* w = upload(m);
  const auto* in = reinterpret_cast<const bf16*>(alloc<uint16_t>(8 * 512));
  auto* act = alloc<uint8_t>(static_cast<size_t>(int8_activation_bytes(ggml_type::q6_k, 8, 512)));
  float* out = alloc(64);
  EXPECT_EQ(int8_activation_bytes(ggml_type::q8_0, 2, 512), 2 * 16 * 44);
  EXPECT_EQ(int8_activation_bytes(ggml_type::q4_k, 3, 512), 3 * 2 * 320);
  EXPECT_THROW(int8_activation_bytes(ggml_type::q5_k, 1, 256), std::invalid_argument);
  EXPECT_THROW(int8_activation_bytes(ggml_type::q4_k, 1, 224), std::invalid_argument);  // k not a multiple of 256
  EXPECT_THROW(quantize_activations_int8(ggml_type::q8_0, in, 0, 256, act, nullptr), std::invalid_argument);
  EXPECT_THROW(quantize_activations_int8(ggml_type::q8_0, in, 1, 256, act + 4, nullptr), std::invalid_argument);
  EXPECT_THROW(quantize_activations_int8(ggml_type::q8_0, in + 1, 1, 256, act, nullptr), std::invalid_argument);
  const int64_t rb = row_bytes(ggml_type::q8_0, 256);
  EXPECT_THROW(quantized_small_batch_gemm_int8(ggml_type::q8_0, w, rb, 2, 256, act + 4, 1, out, 2, false, nullptr),
               std::invalid_argument);  // activations misaligned
  EXPECT_THROW(quantized_small_batch_gemm_int8(ggml_type::q8_0, w + 1, rb, 1, 256, act, 1, out, 2, false, nullptr),
               std::invalid_argument);  // weights read in 2-byte words
  EXPECT_THROW(quantized_small_batch_gemm_int8(ggml_type::q8_0, w, rb, 2, 256, act, 9, out, 2, false, nullptr),
               std::invalid_argument);  // more rows than the kernel serves
  EXPECT_THROW(quantized_small_batch_gemm_int8(ggml_type::q8_0, w, rb, 2, 256, act, 1, out, 1, false, nullptr),
               std::invalid_argument);  // ldc < n
  EXPECT_THROW(quantized_small_batch_gemm_int8(ggml_type::q8_0, w, rb - 2, 2, 256, act, 1, out, 2, false, nullptr),
               std::invalid_argument);  // row_bytes short of a row
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
  EXPECT_FALSE(quantized_tiled_gemm_supports(ggml_type::q8_0, 96));  // not whole 128-value K tiles
  EXPECT_FALSE(quantized_tiled_gemm_supports(ggml_type::q5_k, 256));
  EXPECT_THROW(quantized_tiled_gemm(ggml_type::q8_0, w, 34 * 3, 2, 96, in, 9, out, 2, false, nullptr),
               std::invalid_argument);
  EXPECT_THROW(quantized_tiled_gemm(ggml_type::q4_k, w, 144, 2, 256, in, 0, out, 2, false, nullptr),
               std::invalid_argument);  // no rows
  EXPECT_THROW(quantized_tiled_gemm(ggml_type::q4_k, w, 144, 2, 256, in, 9, out, 1, false, nullptr),
               std::invalid_argument);  // ldc < n
}

}  // namespace
}  // namespace tessera::gpu
