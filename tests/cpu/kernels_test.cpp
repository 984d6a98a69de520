// Each kernel table (scalar and every SIMD table this CPU runs) against an independent reference:
// weights decoded with the engine's dequantize_row, activations decoded from their act_blocks,
// products summed in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.hpp"
#include "engine/model/ggml_types.hpp"

namespace tessera::cpu {
namespace {

// Random bytes in a valid block encoding of `type` (scales are small positive halves).
std::vector<std::byte> random_rows(ggml_type type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = row_bytes(type, cols);
  std::vector<std::byte> buf(static_cast<size_t>(rows * rb));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> q8(-127, 127);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::uniform_real_distribution<float> offset(-0.2f, 0.2f);
  auto put_half = [](std::byte* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      std::byte* blk = buf.data() + r * rb + b * type_info(type).block_bytes;
      switch (type) {
        case ggml_type::q8_0:
          put_half(blk, scale(rng));
          for (int i = 0; i < 32; ++i) blk[2 + i] = static_cast<std::byte>(static_cast<int8_t>(q8(rng)));
          break;
        case ggml_type::q4_0:
          put_half(blk, scale(rng));
          for (int i = 0; i < 16; ++i) blk[2 + i] = static_cast<std::byte>(byte(rng));
          break;
        case ggml_type::q4_1:
          put_half(blk, scale(rng));
          put_half(blk + 2, offset(rng));
          for (int i = 0; i < 16; ++i) blk[4 + i] = static_cast<std::byte>(byte(rng));
          break;
        default:
          ADD_FAILURE() << "no generator for type";
      }
    }
  }
  return buf;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

class kernels_test : public ::testing::TestWithParam<const kernel_table*> {};

TEST_P(kernels_test, quantize_act_round_trips_within_half_a_step) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(1);
  std::vector<float> x = random_floats(256, rng);
  x[40] = 0.0f;
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
  std::vector<act_block> q(8);
  k.quantize_act(x.data(), q.data(), 256);
  std::vector<act_block> ref(8);
  scalar_kernels().quantize_act(x.data(), ref.data(), 256);
  for (int b = 0; b < 8; ++b) {
    int sum = 0;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(b * 32 + i)]));
    EXPECT_FLOAT_EQ(q[static_cast<size_t>(b)].d, amax / 127.0f);
    for (int i = 0; i < 32; ++i) {
      const float xv = x[static_cast<size_t>(b * 32 + i)];
      const int8_t qi = q[static_cast<size_t>(b)].q[i];
      EXPECT_GE(qi, -127);
      EXPECT_LE(std::fabs(xv - q[static_cast<size_t>(b)].d * qi), q[static_cast<size_t>(b)].d * 0.5f + 1e-6f);
      // Same rounding rule in every table, so the SIMD and scalar encodings agree exactly.
      EXPECT_EQ(qi, ref[static_cast<size_t>(b)].q[i]) << "block " << b << " elem " << i;
      sum += qi;
    }
    EXPECT_FLOAT_EQ(q[static_cast<size_t>(b)].s, q[static_cast<size_t>(b)].d * static_cast<float>(sum));
  }
}

TEST_P(kernels_test, quantized_matmul_matches_dequantized_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(2);
  for (ggml_type type : {ggml_type::q8_0, ggml_type::q4_0, ggml_type::q4_1}) {
    for (int32_t num_tokens : {1, 2, 3, 4, 5, 9}) {
      const int64_t rows = 37, cols = 160;  // 5 blocks; a row count that is not a tile multiple
      const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
      const std::vector<float> x = random_floats(static_cast<size_t>(num_tokens * cols), rng);
      std::vector<act_block> act(static_cast<size_t>(num_tokens * cols / 32));
      for (int32_t t = 0; t < num_tokens; ++t) k.quantize_act(x.data() + t * cols, act.data() + t * cols / 32, cols);

      const int64_t out_stride = rows + 3;
      std::vector<float> out(static_cast<size_t>(num_tokens * out_stride), 0.5f);
      qmatmul_args a;
      a.type = type;
      a.weights = w.data();
      a.weight_stride = row_bytes(type, cols);
      a.num_blocks = cols / 32;
      a.act = act.data();
      a.act_stride = cols / 32;
      a.num_tokens = num_tokens;
      a.row_begin = 3;
      a.row_end = rows;
      a.out = out.data();
      a.out_stride = out_stride;
      a.accumulate = (num_tokens % 2) == 1;
      k.matmul_q(a);

      std::vector<float> wrow(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows + 3; ++r) {
        if (r < rows) dequantize_row(type, w.data() + r * a.weight_stride, wrow.data(), cols);
        for (int32_t t = 0; t < num_tokens; ++t) {
          const float got = out[static_cast<size_t>(t * out_stride + r)];
          if (r < a.row_begin || r >= a.row_end) {
            EXPECT_EQ(got, 0.5f) << "row outside the range was written";
            continue;
          }
          double ref = a.accumulate ? 0.5 : 0.0, mag = 0.0;
          for (int64_t c = 0; c < cols; ++c) {
            const act_block& blk = act[static_cast<size_t>(t * cols / 32 + c / 32)];
            const double av = static_cast<double>(blk.d) * blk.q[c % 32];
            ref += static_cast<double>(wrow[static_cast<size_t>(c)]) * av;
            mag += std::fabs(static_cast<double>(wrow[static_cast<size_t>(c)]) * av);
          }
          EXPECT_NEAR(got, ref, 1e-5 * mag + 1e-5)
              << type_info(type).name << " tokens " << num_tokens << " row " << r << " token " << t;
        }
      }
    }
  }
}

TEST_P(kernels_test, f32_matmul_matches_double_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(3);
  for (int64_t cols : {16, 64, 70}) {
    for (int32_t num_tokens : {1, 4, 6}) {
      const int64_t rows = 21;
      const std::vector<float> w = random_floats(static_cast<size_t>(rows * cols), rng);
      const std::vector<float> x = random_floats(static_cast<size_t>(num_tokens * (cols + 2)), rng);
      std::vector<float> out(static_cast<size_t>(num_tokens * rows), 1.0f);
      fmatmul_args a;
      a.weights = w.data();
      a.cols = cols;
      a.x = x.data();
      a.x_stride = cols + 2;
      a.num_tokens = num_tokens;
      a.row_begin = 0;
      a.row_end = rows;
      a.out = out.data();
      a.out_stride = rows;
      a.accumulate = cols == 64;
      k.matmul_f32(a);
      for (int32_t t = 0; t < num_tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double ref = a.accumulate ? 1.0 : 0.0;
          for (int64_t c = 0; c < cols; ++c) {
            ref += static_cast<double>(w[static_cast<size_t>(r * cols + c)]) * x[static_cast<size_t>(t * a.x_stride + c)];
          }
          EXPECT_NEAR(out[static_cast<size_t>(t * rows + r)], ref, 1e-4) << "cols " << cols;
        }
      }
    }
  }
}

TEST_P(kernels_test, attention_helpers_match_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(4);
  for (int32_t hd : {16, 64, 20}) {
    for (int32_t n : {1, 7, 16, 19}) {
      const std::vector<float> q = random_floats(static_cast<size_t>(hd), rng);
      const std::vector<float> kv = random_floats(static_cast<size_t>(n * hd), rng);
      std::vector<float> scores(static_cast<size_t>(n));
      k.attn_scores(q.data(), kv.data(), n, hd, 0.25f, scores.data());
      for (int32_t j = 0; j < n; ++j) {
        double ref = 0.0;
        for (int32_t d = 0; d < hd; ++d) ref += static_cast<double>(q[static_cast<size_t>(d)]) * kv[static_cast<size_t>(j * hd + d)];
        EXPECT_NEAR(scores[static_cast<size_t>(j)], 0.25 * ref, 1e-5);
      }
      std::vector<float> e = scores;
      const float mx = *std::max_element(e.begin(), e.end());
      const float sum = k.softmax_exp(e.data(), n, mx);
      double ref_sum = 0.0;
      for (int32_t j = 0; j < n; ++j) {
        const double ref = std::exp(static_cast<double>(scores[static_cast<size_t>(j)]) - mx);
        EXPECT_NEAR(e[static_cast<size_t>(j)], ref, 1e-6 * ref + 1e-30);
        ref_sum += ref;
      }
      EXPECT_NEAR(sum, ref_sum, 1e-5 * ref_sum);
      std::vector<float> out = random_floats(static_cast<size_t>(hd), rng);
      const std::vector<float> before = out;
      k.attn_accumulate(e.data(), kv.data(), n, hd, out.data());
      for (int32_t d = 0; d < hd; ++d) {
        double ref = before[static_cast<size_t>(d)];
        for (int32_t j = 0; j < n; ++j) ref += static_cast<double>(e[static_cast<size_t>(j)]) * kv[static_cast<size_t>(j * hd + d)];
        EXPECT_NEAR(out[static_cast<size_t>(d)], ref, 1e-5);
      }
    }
  }
  // Very negative inputs underflow to (almost) zero instead of producing garbage.
  std::vector<float> x{0.0f, -50.0f, -200.0f, -1e30f, -3.0f, 1.0f, -1.0f, -87.5f, -90.0f};
  const float s = k.softmax_exp(x.data(), static_cast<int32_t>(x.size()), 1.0f);
  EXPECT_NEAR(x[5], 1.0f, 1e-6f);
  EXPECT_NEAR(x[0], std::exp(-1.0f), 1e-6f);
  EXPECT_LT(x[3], 1e-30f);
  EXPECT_GE(x[3], 0.0f);
  EXPECT_NEAR(s, 1.0 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-4.0), 1e-5);
}

TEST_P(kernels_test, silu_mul_matches_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(5);
  std::vector<float> g = random_floats(37, rng, -12.0f, 12.0f);
  g[0] = -100.0f;  // exp overflow territory
  g[1] = 100.0f;
  g[2] = 0.0f;
  const std::vector<float> u = random_floats(37, rng);
  std::vector<float> out(37);
  k.silu_mul(g.data(), u.data(), out.data(), 37);
  for (size_t i = 0; i < g.size(); ++i) {
    const double ref = static_cast<double>(g[i]) / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-7) << "gate " << g[i];
  }
}

INSTANTIATE_TEST_SUITE_P(all_tables, kernels_test, ::testing::ValuesIn(available_kernels()),
                         [](const ::testing::TestParamInfo<const kernel_table*>& p) {
                           return std::string(p.param->name);
                         });

TEST(kernel_dispatch, best_is_available_and_names_are_unique) {
  const auto tables = available_kernels();
  ASSERT_FALSE(tables.empty());
  EXPECT_STREQ(tables.front()->name, "scalar");
  bool found = false;
  for (const kernel_table* t : tables) found = found || t == &best_kernels();
  EXPECT_TRUE(found);
  EXPECT_TRUE(has_quant_kernel(ggml_type::q4_1));
  EXPECT_FALSE(has_quant_kernel(ggml_type::q6_k));
}

TEST(kernel_dispatch, half_to_float_matches_engine_conversion) {
  for (uint32_t h = 0; h < 65536; h += 7) {
    const float a = half_to_float(static_cast<uint16_t>(h));
    const float b = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a));
    } else {
      EXPECT_EQ(a, b) << h;
    }
  }
}

}  // namespace
}  // namespace tessera::cpu
