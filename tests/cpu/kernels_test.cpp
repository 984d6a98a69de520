// Each kernel table (scalar and every SIMD table this CPU runs) against an independent reference:
// weights decoded with the engine's dequantize_row (itself tested against gguf-py), activations
// decoded from the format the kernels read them in (act_block, act_block_k, bf16-rounded, f32),
// products summed in double. Every weight type, random blocks with extreme scales, gguf-py's blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "engine/model/ggml_types.hpp"

namespace tessera::cpu {
namespace {

const std::filesystem::path quant_dir = std::filesystem::path(TESSERA_TEST_DATA_DIR) / "quant";

// Every weight type with a kernel, in the order of the GGUF numbering.
const std::vector<ggml_type> all_types = {ggml_type::f32,  ggml_type::f16,  ggml_type::q4_0, ggml_type::q4_1,
                                          ggml_type::q5_0, ggml_type::q5_1, ggml_type::q8_0, ggml_type::q2_k,
                                          ggml_type::q3_k, ggml_type::q4_k, ggml_type::q5_k, ggml_type::q6_k,
                                          ggml_type::bf16};

bool is_float_type(ggml_type t) { return t == ggml_type::f32 || t == ggml_type::f16 || t == ggml_type::bf16; }

void put_half(std::byte* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Offsets of a block's f16 scale fields (ggml-common.h): d first, then dmin/m where the type has one.
std::vector<int> half_fields(ggml_type t) {
  switch (t) {
    case ggml_type::q4_0:
    case ggml_type::q5_0:
    case ggml_type::q8_0: return {0};
    case ggml_type::q4_1:
    case ggml_type::q5_1: return {0, 2};
    case ggml_type::q2_k: return {80, 82};
    case ggml_type::q3_k: return {108};
    case ggml_type::q4_k:
    case ggml_type::q5_k: return {0, 2};
    case ggml_type::q6_k: return {208};
    default: return {};
  }
}

// The scale regime of a weight row: each row draws its f16 scales from one of these, so that a row
// of extreme scales is checked on its own (not hidden in a sum dominated by other blocks).
enum class regime { typical, huge, tiny, zero_or_negative, mixed };

float draw_scale(regime g, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  switch (g) {
    case regime::typical: return 0.001f + 0.05f * u(rng);
    case regime::huge: return (u(rng) < 0.5f ? -1.0f : 1.0f) * (30000.0f + 35504.0f * u(rng));    // up to f16 max
    case regime::tiny: return 6.0e-8f * static_cast<float>(1 + static_cast<int>(u(rng) * 1000));  // f16 subnormals
    case regime::zero_or_negative: return u(rng) < 0.3f ? 0.0f : -(0.001f + 0.05f * u(rng));
    case regime::mixed: break;
  }
  return draw_scale(static_cast<regime>(static_cast<int>(u(rng) * 4)), rng);
}

// Random bytes in a valid encoding of `type`: every bit pattern of the quants and sub-block scales is
// valid; the f16 scale fields get values of the row's regime (random bits could be NaN or inf).
std::vector<std::byte> random_rows(ggml_type type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t rb = row_bytes(type, cols);
  std::vector<std::byte> buf(static_cast<size_t>(rows * rb));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const auto g = static_cast<regime>(r % 5);
    std::byte* row = buf.data() + r * rb;
    if (is_float_type(type)) {
      const float scale = g == regime::huge ? 1e4f : g == regime::tiny ? 1e-6f : 1.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float v = value(rng) * scale;
        if (type == ggml_type::f32) std::memcpy(row + 4 * c, &v, 4);
        if (type == ggml_type::f16) put_half(row + 2 * c, v);
        if (type == ggml_type::bf16) {
          const uint16_t h = fp32_to_bf16(v);
          std::memcpy(row + 2 * c, &h, 2);
        }
      }
      continue;
    }
    for (int64_t i = 0; i < rb; ++i) row[i] = static_cast<std::byte>(byte(rng));
    const ggml_type_info& info = type_info(type);
    for (int64_t b = 0; b < cols / info.block_elems; ++b) {
      for (int off : half_fields(type)) put_half(row + b * info.block_bytes + off, draw_scale(g, rng));
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

// Activations with the awkward cases: a zero run (an all-zero block), one outlier per token, and a
// token-dependent magnitude.
std::vector<float> random_activations(int32_t tokens, int64_t cols, std::mt19937& rng) {
  std::vector<float> x = random_floats(static_cast<size_t>(tokens * cols), rng);
  for (int32_t t = 0; t < tokens; ++t) {
    float* row = x.data() + t * cols;
    const float mag = t % 3 == 0 ? 1.0f : t % 3 == 1 ? 1e-3f : 50.0f;
    for (int64_t c = 0; c < cols; ++c) row[c] *= mag;
    if (cols >= 64) std::fill(row + 32, row + 64, 0.0f);
    row[(t * 37) % cols] = 40.0f * mag;
  }
  return x;
}

std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << p;
  std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(buf.size());
  if (!buf.empty()) std::memcpy(out.data(), buf.data(), buf.size());
  return out;
}

// A matmul's inputs in the activation format of its weight type, and the activations as the kernels
// see them (dequantized), for the reference.
struct prepared_input {
  std::vector<act_block> q8;
  std::vector<act_block_k> q8_k;
  std::vector<float> xf;     // f32 / bf16-rounded activations
  std::vector<uint16_t> xb;  // bf16 bits
  std::vector<double> seen;  // [tokens, cols]
};

prepared_input prepare_input(const kernel_table& k, ggml_type type, const std::vector<float>& x, int32_t tokens,
                             int64_t cols) {
  prepared_input p;
  p.seen.resize(static_cast<size_t>(tokens * cols));
  switch (act_format_of(type)) {
    case act_format::q8:
      p.q8.resize(static_cast<size_t>(tokens * cols / 32));
      for (int32_t t = 0; t < tokens; ++t) k.quantize_act(x.data() + t * cols, p.q8.data() + t * cols / 32, cols);
      for (int64_t i = 0; i < tokens * cols; ++i) {
        const act_block& b = p.q8[static_cast<size_t>(i / 32)];
        p.seen[static_cast<size_t>(i)] = static_cast<double>(b.d) * b.q[i % 32];
      }
      break;
    case act_format::q8_k:
      p.q8_k.resize(static_cast<size_t>(tokens * cols / 256));
      for (int32_t t = 0; t < tokens; ++t) k.quantize_act_k(x.data() + t * cols, p.q8_k.data() + t * cols / 256, cols);
      for (int64_t i = 0; i < tokens * cols; ++i) {
        const act_block_k& b = p.q8_k[static_cast<size_t>(i / 256)];
        p.seen[static_cast<size_t>(i)] = static_cast<double>(b.d) * b.q[i % 256];
      }
      break;
    case act_format::bf16:
      p.xf.resize(x.size());
      p.xb.resize(x.size());
      round_act_bf16(x.data(), p.xf.data(), p.xb.data(), static_cast<int64_t>(x.size()));
      for (size_t i = 0; i < x.size(); ++i) p.seen[i] = p.xf[i];
      break;
    case act_format::f32:
    case act_format::none:
      p.xf = x;
      for (size_t i = 0; i < x.size(); ++i) p.seen[i] = x[i];
      break;
  }
  return p;
}

// out[t * out_stride + r] for r in [row_begin, row_end) through the table's matmul for `type`.
void run_matmul(const kernel_table& k, ggml_type type, const std::vector<std::byte>& w, int64_t cols,
                const prepared_input& in, int32_t tokens, int64_t row_begin, int64_t row_end, float* out,
                int64_t out_stride, bool accumulate) {
  if (is_float_type(type)) {
    fmatmul_args a;
    a.type = type;
    a.weights = w.data();
    a.cols = cols;
    a.x = in.xf.data();
    a.x_bf16 = in.xb.empty() ? nullptr : in.xb.data();
    a.x_stride = cols;
    a.num_tokens = tokens;
    a.row_begin = row_begin;
    a.row_end = row_end;
    a.out = out;
    a.out_stride = out_stride;
    a.accumulate = accumulate;
    k.matmul_f32(a);
    return;
  }
  const int64_t block = type_info(type).block_elems;
  qmatmul_args a;
  a.type = type;
  a.weights = w.data();
  a.weight_stride = row_bytes(type, cols);
  a.num_blocks = cols / block;
  a.act = in.q8.data();
  a.act_k = in.q8_k.data();
  a.act_stride = cols / block;
  a.num_tokens = tokens;
  a.row_begin = row_begin;
  a.row_end = row_end;
  a.out = out;
  a.out_stride = out_stride;
  a.accumulate = accumulate;
  k.matmul_q(a);
}

struct reference_value {
  double value;
  double magnitude;  // sum of |w * a|: the scale of the float rounding the kernels may differ by
};

reference_value reference_dot(ggml_type type, const std::byte* row, int64_t cols, const double* act) {
  std::vector<float> wrow(static_cast<size_t>(cols));
  dequantize_row(type, row, wrow.data(), cols);
  reference_value r{0.0, 0.0};
  for (int64_t c = 0; c < cols; ++c) {
    r.value += static_cast<double>(wrow[static_cast<size_t>(c)]) * act[c];
    r.magnitude += std::fabs(static_cast<double>(wrow[static_cast<size_t>(c)]) * act[c]);
  }
  return r;
}

// The kernels may only differ from exact math on the dequantized operands by float summation order:
// a few f32 roundings of partial sums, each at most 2^-24 of the magnitude. 1e-5 of it is ~100 of them.
constexpr double matmul_rel_tolerance = 1e-5;

// Checks out[t * out_stride + r] against the reference dot of weight row r and token t's activations
// (plus 0.5 where the kernel accumulated onto the 0.5 the buffer was filled with), for r in
// [row_begin, rows); with out_stride > rows, that the rows outside the range kept their 0.5.
void expect_rows_match_reference(ggml_type type, const std::vector<std::byte>& w, int64_t cols,
                                 const prepared_input& in, const std::vector<float>& out, int64_t out_stride,
                                 int32_t num_tokens, int64_t row_begin, int64_t rows, bool accumulate,
                                 double abs_tolerance, std::string_view what) {
  const int64_t rb = row_bytes(type, cols);
  for (int64_t r = 0; r < out_stride; ++r) {
    for (int32_t t = 0; t < num_tokens; ++t) {
      const float got = out[static_cast<size_t>(t * out_stride + r)];
      if (r < row_begin || r >= rows) {
        EXPECT_EQ(got, 0.5f) << "row outside the range was written";
        continue;
      }
      const reference_value ref =
          reference_dot(type, w.data() + r * rb, cols, in.seen.data() + static_cast<int64_t>(t) * cols);
      const double want = ref.value + (accumulate ? 0.5 : 0.0);
      EXPECT_NEAR(got, want, matmul_rel_tolerance * ref.magnitude + abs_tolerance)
          << what << " cols " << cols << " tokens " << num_tokens << " row " << r << " token " << t << " (regime "
          << r % 5 << ")";
    }
  }
}

// gguf-py's own quantized blocks of `type` (tests/data/quant), tiled into `rows` rows of all the
// fixture's blocks, row r starting at block r (so the rows differ); the float fixtures' inf and NaN
// elements (there on purpose, for the dequantization tests) zeroed. cols is 0 when the file is empty.
struct fixture_rows {
  std::vector<std::byte> w;
  int64_t cols = 0;
};
fixture_rows gguf_py_rows(ggml_type type, int64_t rows) {
  const ggml_type_info& info = type_info(type);
  std::string file(info.name);
  for (char& ch : file) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::vector<std::byte> blocks = read_file(quant_dir / (file + ".q"));
  const int64_t nb = static_cast<int64_t>(blocks.size()) / info.block_bytes;
  fixture_rows f;
  if (nb == 0) return f;
  f.cols = nb * info.block_elems;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const std::byte* blk = blocks.data() + ((b + r) % nb) * info.block_bytes;
      f.w.insert(f.w.end(), blk, blk + info.block_bytes);
    }
  }
  if (is_float_type(type)) {
    const int64_t eb = info.block_bytes;
    for (int64_t i = 0; i < static_cast<int64_t>(f.w.size()) / eb; ++i) {
      float v = 0.0f;
      dequantize_row(type, f.w.data() + i * eb, &v, 1);
      if (!std::isfinite(v)) std::fill(f.w.begin() + i * eb, f.w.begin() + (i + 1) * eb, std::byte{0});
    }
  }
  return f;
}

std::vector<int64_t> test_cols(ggml_type type) {
  if (is_float_type(type)) return {16, 70, 269};  // 269: a tail that is no multiple of any vector
  if (type_info(type).block_elems == 256) return {256, 768};
  return {32, 160, 768};
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
    EXPECT_EQ(q[static_cast<size_t>(b)].sum, sum);
  }
}

TEST_P(kernels_test, quantize_act_k_round_trips_within_half_a_step) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(11);
  std::vector<float> x = random_activations(1, 768, rng);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero super-block
  std::vector<act_block_k> q(3), ref(3);
  k.quantize_act_k(x.data(), q.data(), 768);
  scalar_kernels().quantize_act_k(x.data(), ref.data(), 768);
  for (int b = 0; b < 3; ++b) {
    const act_block_k& qb = q[static_cast<size_t>(b)];
    float amax = 0.0f;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(b * 256 + i)]));
    EXPECT_FLOAT_EQ(qb.d, amax / 127.0f);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) {
        const float xv = x[static_cast<size_t>(b * 256 + i)];
        EXPECT_GE(qb.q[i], -127);
        EXPECT_LE(std::fabs(xv - qb.d * qb.q[i]), qb.d * 0.5f + 1e-6f) << "block " << b << " elem " << i;
        EXPECT_EQ(qb.q[i], ref[static_cast<size_t>(b)].q[i]) << "block " << b << " elem " << i;
        sum += qb.q[i];
      }
      EXPECT_EQ(qb.bsums[j], sum) << "block " << b << " group " << j;
    }
  }
}

// Every type, several shapes, rows [3, rows) of a matrix whose row count is no multiple of any tile,
// 1..9 tokens, accumulate on and off: against the reference on the dequantized operands.
TEST_P(kernels_test, quantized_matmul_matches_dequantized_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(2);
  for (ggml_type type : all_types) {
    // BF16 twice: with the activations' bf16 bits (vdpbf16ps where the CPU has it) and without (FMA).
    for (const bool bf16_bits : {true, false}) {
      if (!bf16_bits && type != ggml_type::bf16) continue;
      for (int64_t cols : test_cols(type)) {
        for (int32_t num_tokens : {1, 2, 3, 4, 5, 9}) {
          const int64_t rows = 37;
          const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
          const std::vector<float> x = random_activations(num_tokens, cols, rng);
          prepared_input in = prepare_input(k, type, x, num_tokens, cols);
          if (!bf16_bits) in.xb.clear();
          const int64_t out_stride = rows + 3;
          std::vector<float> out(static_cast<size_t>(num_tokens * out_stride), 0.5f);
          const bool accumulate = (num_tokens % 2) == 1;
          const int64_t row_begin = 3;
          run_matmul(k, type, w, cols, in, num_tokens, row_begin, rows, out.data(), out_stride, accumulate);
          expect_rows_match_reference(type, w, cols, in, out, out_stride, num_tokens, row_begin, rows, accumulate, 1e-5,
                                      bf16_bits ? type_info(type).name : "BF16 (no bf16 bits)");
        }
      }
    }
  }
}

// The SIMD tables compute the same math as the scalar one (same activation encoding, same integer
// sums), so they agree with it to float summation order; larger shapes than above.
TEST_P(kernels_test, matmul_matches_scalar_table_for_every_type) {
  const kernel_table& k = *GetParam();
  const kernel_table& s = scalar_kernels();
  std::mt19937 rng(12);
  for (ggml_type type : all_types) {
    const int64_t cols = 1024, rows = 67;
    const int32_t num_tokens = 7;
    const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
    const std::vector<float> x = random_activations(num_tokens, cols, rng);
    const prepared_input in = prepare_input(k, type, x, num_tokens, cols);
    std::vector<float> got(static_cast<size_t>(num_tokens * rows)), want(got.size());
    run_matmul(k, type, w, cols, in, num_tokens, 0, rows, got.data(), rows, false);
    run_matmul(s, type, w, cols, in, num_tokens, 0, rows, want.data(), rows, false);
    const int64_t rb = row_bytes(type, cols);
    for (int32_t t = 0; t < num_tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const reference_value ref =
            reference_dot(type, w.data() + r * rb, cols, in.seen.data() + static_cast<int64_t>(t) * cols);
        EXPECT_NEAR(got[static_cast<size_t>(t * rows + r)], want[static_cast<size_t>(t * rows + r)],
                    matmul_rel_tolerance * ref.magnitude + 1e-6)
            << type_info(type).name << " row " << r << " token " << t;
      }
    }
  }
}

// Weights quantized by gguf-py (tests/data/quant/<type>.q, the dequantization fixtures): real block
// statistics rather than random bits. Rows are the fixture's blocks rotated.
TEST_P(kernels_test, matmul_on_gguf_py_blocks_matches_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(13);
  for (ggml_type type : all_types) {
    const int64_t rows = 5;
    const fixture_rows f = gguf_py_rows(type, rows);
    ASSERT_GT(f.cols, 0) << type_info(type).name;
    const int64_t cols = f.cols;
    const std::vector<std::byte>& w = f.w;
    const int32_t num_tokens = 3;
    const std::vector<float> x = random_activations(num_tokens, cols, rng);
    const prepared_input in = prepare_input(k, type, x, num_tokens, cols);
    std::vector<float> out(static_cast<size_t>(num_tokens * rows));
    run_matmul(k, type, w, cols, in, num_tokens, 0, rows, out.data(), rows, false);
    expect_rows_match_reference(type, w, cols, in, out, rows, num_tokens, 0, rows, false, 1e-6, type_info(type).name);
  }
}

// Splitting the rows over calls or the tokens over batches changes nothing (the executor's chunking
// and batching invariance rests on this): bitwise equal.
TEST_P(kernels_test, matmul_results_do_not_depend_on_row_ranges_or_token_batches) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(14);
  for (ggml_type type : all_types) {
    const int64_t cols = 512, rows = 45;
    const int32_t num_tokens = 6;
    const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
    const std::vector<float> x = random_activations(num_tokens, cols, rng);
    const prepared_input in = prepare_input(k, type, x, num_tokens, cols);
    std::vector<float> whole(static_cast<size_t>(num_tokens * rows));
    run_matmul(k, type, w, cols, in, num_tokens, 0, rows, whole.data(), rows, false);
    for (int32_t t = 0; t < num_tokens; ++t) {
      const prepared_input one = prepare_input(k, type, {x.begin() + t * cols, x.begin() + (t + 1) * cols}, 1, cols);
      std::vector<float> part(static_cast<size_t>(rows));
      for (int64_t r0 = 0; r0 < rows; r0 += 7)
        run_matmul(k, type, w, cols, one, 1, r0, std::min(rows, r0 + 7), part.data(), rows, false);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(part[static_cast<size_t>(r)], whole[static_cast<size_t>(t * rows + r)])
            << type_info(type).name << " row " << r << " token " << t;
      }
    }
  }
}

// ---- packed weights -------------------------------------------------------------------------------

std::vector<ggml_type> packed_types() {
  std::vector<ggml_type> out;
  for (ggml_type t : all_types) {
    if (has_packed_kernel(t)) out.push_back(t);
  }
  return out;
}

std::vector<std::byte> pack(ggml_type type, const std::vector<std::byte>& w, int64_t rows, int64_t cols) {
  std::vector<std::byte> packed(static_cast<size_t>(packed_matrix_bytes(type, rows, cols)), std::byte{0x5a});
  pack_weights(type, w.data(), row_bytes(type, cols), rows, cols, packed.data());
  return packed;
}

void run_packed(const kernel_table& k, ggml_type type, const std::vector<std::byte>& packed, int64_t cols,
                const prepared_input& in, int32_t tokens, int64_t row_begin, int64_t row_end, float* out,
                int64_t out_stride, bool accumulate) {
  const int64_t block = type_info(type).block_elems;
  qmatmul_args a;
  a.type = type;
  a.weights = packed.data();
  a.num_blocks = cols / block;
  a.act = in.q8.data();
  a.act_k = in.q8_k.data();
  a.act_stride = cols / block;
  a.num_tokens = tokens;
  a.row_begin = row_begin;
  a.row_end = row_end;
  a.out = out;
  a.out_stride = out_stride;
  a.accumulate = accumulate;
  k.matmul_packed(a);
}

TEST(packed_weights, every_quantized_type_has_a_packed_kernel_of_the_same_bytes) {
  for (ggml_type t : all_types) {
    EXPECT_EQ(has_packed_kernel(t), !is_float_type(t)) << type_info(t).name;
    if (!has_packed_kernel(t)) continue;
    const int64_t cols = 2 * type_info(t).block_elems;
    EXPECT_EQ(packed_matrix_bytes(t, 32, cols), 32 * row_bytes(t, cols));  // no padding on whole panels
    EXPECT_EQ(packed_matrix_bytes(t, 17, cols), 32 * row_bytes(t, cols));  // the last panel padded
  }
}

TEST(packed_weights, unpacking_gives_back_every_row) {
  std::mt19937 rng(21);
  for (ggml_type type : packed_types()) {
    const int64_t rows = 37, cols = 2 * type_info(type).block_elems;  // 3 panels, the last one partial
    const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
    const std::vector<std::byte> packed = pack(type, w, rows, cols);
    const int64_t rb = row_bytes(type, cols);
    std::vector<std::byte> row(static_cast<size_t>(rb));
    for (int64_t r = 0; r < rows; ++r) {
      unpack_weight_row(type, packed.data(), cols, r, row.data());
      EXPECT_TRUE(std::equal(row.begin(), row.end(), w.begin() + r * rb)) << type_info(type).name << " row " << r;
    }
    for (int64_t r = rows; r < 48; ++r) {  // the padding rows are zero
      unpack_weight_row(type, packed.data(), cols, r, row.data());
      EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](std::byte b) { return b == std::byte{0}; })) << r;
    }
  }
}

// As quantized_matmul_matches_dequantized_reference, through the packed kernels, with token counts that
// fill several register tiles (8 tokens per tile on AVX-512, 4 on the 256-bit tables).
TEST_P(kernels_test, packed_matmul_matches_dequantized_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(22);
  for (ggml_type type : packed_types()) {
    for (int64_t cols : test_cols(type)) {
      for (int32_t num_tokens : {1, 2, 3, 4, 5, 8, 9, 17}) {
        const int64_t rows = 37;
        const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
        const std::vector<std::byte> packed = pack(type, w, rows, cols);
        const std::vector<float> x = random_activations(num_tokens, cols, rng);
        const prepared_input in = prepare_input(k, type, x, num_tokens, cols);
        const int64_t out_stride = rows + 3;
        std::vector<float> out(static_cast<size_t>(num_tokens * out_stride), 0.5f);
        const bool accumulate = (num_tokens % 2) == 1;
        const int64_t row_begin = 3;
        run_packed(k, type, packed, cols, in, num_tokens, row_begin, rows, out.data(), out_stride, accumulate);
        expect_rows_match_reference(type, w, cols, in, out, out_stride, num_tokens, row_begin, rows, accumulate, 1e-5,
                                    type_info(type).name);
      }
    }
  }
}

// The packed kernels do the same integer sums and the same f32 fmas in every table: bitwise equal to
// the scalar table's, on shapes with several panels and token tiles.
TEST_P(kernels_test, packed_matmul_is_bitwise_the_scalar_tables) {
  const kernel_table& k = *GetParam();
  const kernel_table& s = scalar_kernels();
  std::mt19937 rng(23);
  for (ggml_type type : packed_types()) {
    const int64_t cols = 1024, rows = 67;
    const int32_t num_tokens = 11;
    const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
    const std::vector<std::byte> packed = pack(type, w, rows, cols);
    const std::vector<float> x = random_activations(num_tokens, cols, rng);
    const prepared_input in = prepare_input(s, type, x, num_tokens, cols);
    std::vector<float> got(static_cast<size_t>(num_tokens * rows)), want(got.size());
    run_packed(k, type, packed, cols, in, num_tokens, 0, rows, got.data(), rows, false);
    run_packed(s, type, packed, cols, in, num_tokens, 0, rows, want.data(), rows, false);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << type_info(type).name << " row " << i % rows << " token " << i / rows;
    }
  }
}

// Row ranges (any start, not only panel boundaries) and token batching change nothing, bitwise.
TEST_P(kernels_test, packed_results_do_not_depend_on_row_ranges_or_token_batches) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(24);
  for (ggml_type type : packed_types()) {
    const int64_t cols = 512, rows = 45;
    const int32_t num_tokens = 10;
    const std::vector<std::byte> w = random_rows(type, rows, cols, rng);
    const std::vector<std::byte> packed = pack(type, w, rows, cols);
    const std::vector<float> x = random_activations(num_tokens, cols, rng);
    const prepared_input in = prepare_input(k, type, x, num_tokens, cols);
    std::vector<float> whole(static_cast<size_t>(num_tokens * rows));
    run_packed(k, type, packed, cols, in, num_tokens, 0, rows, whole.data(), rows, false);
    for (int32_t t = 0; t < num_tokens; ++t) {
      const prepared_input one = prepare_input(k, type, {x.begin() + t * cols, x.begin() + (t + 1) * cols}, 1, cols);
      std::vector<float> part(static_cast<size_t>(rows));
      for (int64_t r0 = 0; r0 < rows; r0 += 7) {
        run_packed(k, type, packed, cols, one, 1, r0, std::min(rows, r0 + 7), part.data(), rows, false);
      }
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(part[static_cast<size_t>(r)], whole[static_cast<size_t>(t * rows + r)])
            << type_info(type).name << " row " << r << " token " << t;
      }
    }
  }
}

// gguf-py's blocks (real statistics) through the packed kernels.
TEST_P(kernels_test, packed_matmul_on_gguf_py_blocks_matches_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(25);
  for (ggml_type type : packed_types()) {
    const int64_t rows = 20;
    const fixture_rows f = gguf_py_rows(type, rows);
    ASSERT_GT(f.cols, 0) << type_info(type).name;
    const int64_t cols = f.cols;
    const std::vector<std::byte>& w = f.w;
    const std::vector<std::byte> packed = pack(type, w, rows, cols);
    const int32_t num_tokens = 3;
    const std::vector<float> x = random_activations(num_tokens, cols, rng);
    const prepared_input in = prepare_input(k, type, x, num_tokens, cols);
    std::vector<float> out(static_cast<size_t>(num_tokens * rows));
    run_packed(k, type, packed, cols, in, num_tokens, 0, rows, out.data(), rows, false);
    expect_rows_match_reference(type, w, cols, in, out, rows, num_tokens, 0, rows, false, 1e-6, type_info(type).name);
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
            ref +=
                static_cast<double>(w[static_cast<size_t>(r * cols + c)]) * x[static_cast<size_t>(t * a.x_stride + c)];
          }
          EXPECT_NEAR(out[static_cast<size_t>(t * rows + r)], ref, 1e-4) << "cols " << cols;
        }
      }
    }
  }
}

const std::vector<kv_dtype> all_kv_dtypes = {kv_dtype::f32, kv_dtype::f16, kv_dtype::bf16, kv_dtype::i8};

// A KV tile of `bs` slots, the first n written with random head vectors (the rest left as garbage, which
// the kernels may read but must not let into a result), plus 64 readable bytes after it as in the pools.
struct test_tile {
  std::vector<std::byte> bytes;
  std::byte* data() { return bytes.data(); }
};

test_tile random_tile(kv_dtype dt, bool is_k, int32_t bs, int32_t hd, int32_t n, std::mt19937& rng) {
  test_tile t;
  t.bytes.resize(static_cast<size_t>(kv_tile_bytes(dt, bs, hd) + 64));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : t.bytes) b = static_cast<std::byte>(dt == kv_dtype::f32 ? 0 : byte(rng));  // no NaN garbage in f32
  for (int32_t j = 0; j < n; ++j) {
    const std::vector<float> x = random_floats(static_cast<size_t>(hd), rng, -3.0f, 3.0f);
    if (is_k) {
      kv_store_k(dt, x.data(), bs, hd, j, t.data());
    } else {
      kv_store_v(dt, x.data(), bs, hd, j, t.data());
    }
  }
  return t;
}

// Stored values read back within the dtype's rounding: fp32 exact, fp16 2^-11, bf16 2^-8 relative; int8
// half a step of the slot's scale (max |x| / 127).
TEST(kv_tiles, store_and_load_round_trip_within_the_dtype_rounding) {
  std::mt19937 rng(30);
  for (kv_dtype dt : all_kv_dtypes) {
    for (const bool is_k : {true, false}) {
      const int32_t bs = 5, hd = 20;
      std::vector<std::byte> tile(static_cast<size_t>(kv_tile_bytes(dt, bs, hd)));
      EXPECT_EQ(kv_tile_bytes(dt, bs, hd) % 4, 0);
      std::vector<std::vector<float>> rows;
      for (int32_t j = 0; j < bs; ++j) {
        rows.push_back(random_floats(static_cast<size_t>(hd), rng, -5.0f, 5.0f));
        if (j == 2) std::fill(rows.back().begin(), rows.back().end(), 0.0f);  // an all-zero vector
        (is_k ? kv_store_k : kv_store_v)(dt, rows.back().data(), bs, hd, j, tile.data());
      }
      for (int32_t j = 0; j < bs; ++j) {
        float amax = 0.0f;
        for (float x : rows[static_cast<size_t>(j)]) amax = std::max(amax, std::fabs(x));
        for (int32_t d = 0; d < hd; ++d) {
          const float x = rows[static_cast<size_t>(j)][static_cast<size_t>(d)];
          const float got = (is_k ? kv_load_k : kv_load_v)(dt, tile.data(), bs, hd, j, d);
          const double tol = dt == kv_dtype::f32    ? 0.0
                             : dt == kv_dtype::f16  ? std::ldexp(std::fabs(x), -11)
                             : dt == kv_dtype::bf16 ? std::ldexp(std::fabs(x), -8)
                                                    : 0.5 * amax / 127.0 * (1 + 1e-6);
          EXPECT_LE(std::fabs(got - x), tol) << to_string(dt) << (is_k ? " K" : " V") << " slot " << j << " dim " << d;
        }
      }
    }
  }
  EXPECT_EQ(kv_tile_bytes(kv_dtype::f32, 16, 64), 16 * 64 * 4);
  EXPECT_EQ(kv_tile_bytes(kv_dtype::f16, 16, 64), 16 * 64 * 2);
  EXPECT_EQ(kv_tile_bytes(kv_dtype::bf16, 16, 64), 16 * 64 * 2);
  EXPECT_EQ(kv_tile_bytes(kv_dtype::i8, 16, 64), 16 * 64 + 16 * 4);
}

// Scores and the V accumulation of every table and dtype against double math on the values the tile holds
// (kv_load_*), with block sizes that are and are not multiples of the vector, rows that fill several
// register tiles, and head dims with a tail.
TEST_P(kernels_test, attention_block_kernels_match_reference_for_every_kv_dtype) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(4);
  for (kv_dtype dt : all_kv_dtypes) {
    for (int32_t bs : {4, 16, 19}) {
      for (int32_t hd : {16, 64, 20, 18}) {  // 18: a head_dim that is no multiple of 4 (the scores' tail)
        for (int32_t rows : {1, 3, 9}) {
          const int32_t n = bs == 4 ? 3 : bs;
          test_tile kt = random_tile(dt, true, bs, hd, n, rng);
          test_tile vt = random_tile(dt, false, bs, hd, n, rng);
          std::vector<std::vector<float>> q;
          std::vector<const float*> qp;
          for (int32_t m = 0; m < rows; ++m) q.push_back(random_floats(static_cast<size_t>(hd), rng));
          for (const auto& r : q) qp.push_back(r.data());
          const int32_t ld = (bs + 15) / 16 * 16;
          std::vector<float> s(static_cast<size_t>(rows * ld), 7.0f);
          attn_block_args a;
          a.dtype = dt;
          a.tile = kt.data();
          a.block_size = bs;
          a.head_dim = hd;
          a.n = n;
          a.rows = rows;
          a.q = qp.data();
          a.scale = 0.25f;
          a.s = s.data();
          a.ld = ld;
          k.attn_scores(a);
          for (int32_t m = 0; m < rows; ++m) {
            for (int32_t j = 0; j < n; ++j) {
              double ref = 0.0, mag = 0.0;
              for (int32_t d = 0; d < hd; ++d) {
                const double p = static_cast<double>(q[static_cast<size_t>(m)][static_cast<size_t>(d)]) *
                                 kv_load_k(dt, kt.data(), bs, hd, j, d);
                ref += p;
                mag += std::fabs(p);
              }
              EXPECT_NEAR(s[static_cast<size_t>(m * ld + j)], 0.25 * ref, 1e-5 * (1 + mag))
                  << to_string(dt) << " bs " << bs << " hd " << hd << " rows " << rows << " m " << m << " j " << j;
            }
          }
          // Probabilities (a zero among them: it must add exactly nothing), then the accumulation.
          for (int32_t m = 0; m < rows; ++m) {
            for (int32_t j = 0; j < ld; ++j)
              s[static_cast<size_t>(m * ld + j)] = j == 1 ? 0.0f : 0.1f + 0.05f * static_cast<float>(j);
          }
          std::vector<float> o(static_cast<size_t>(rows * hd));
          for (auto& x : o) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
          const std::vector<float> before = o;
          a.tile = vt.data();
          a.o = o.data();
          a.o_ld = hd;
          k.attn_accumulate(a);
          for (int32_t m = 0; m < rows; ++m) {
            for (int32_t d = 0; d < hd; ++d) {
              double ref = before[static_cast<size_t>(m * hd + d)];
              for (int32_t j = 0; j < n; ++j) {
                ref += static_cast<double>(s[static_cast<size_t>(m * ld + j)]) * kv_load_v(dt, vt.data(), bs, hd, j, d);
              }
              EXPECT_NEAR(o[static_cast<size_t>(m * hd + d)], ref, 1e-5 * (1 + std::fabs(ref)))
                  << to_string(dt) << " bs " << bs << " hd " << hd << " rows " << rows << " m " << m << " d " << d;
            }
          }
        }
      }
    }
  }
}

// A row's scores and accumulation are bitwise the same whatever rows share the call (the executor's
// batching and chunking invariance rests on it).
TEST_P(kernels_test, attention_rows_do_not_depend_on_their_neighbours) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(31);
  for (kv_dtype dt : all_kv_dtypes) {
    const int32_t bs = 16, hd = 64, n = 11, rows = 11;
    test_tile kt = random_tile(dt, true, bs, hd, n, rng);
    test_tile vt = random_tile(dt, false, bs, hd, n, rng);
    std::vector<std::vector<float>> q;
    std::vector<const float*> qp;
    for (int32_t m = 0; m < rows; ++m) q.push_back(random_floats(static_cast<size_t>(hd), rng));
    for (const auto& r : q) qp.push_back(r.data());
    auto run = [&](int32_t m0, int32_t count, std::vector<float>& s, std::vector<float>& o) {
      attn_block_args a;
      a.dtype = dt;
      a.block_size = bs;
      a.head_dim = hd;
      a.n = n;
      a.rows = count;
      a.q = qp.data() + m0;
      a.scale = 0.125f;
      a.ld = 16;
      a.s = s.data() + m0 * 16;
      a.tile = kt.data();
      k.attn_scores(a);
      for (int32_t j = n; j < 16; ++j) {
        for (int32_t m = m0; m < m0 + count; ++m) s[static_cast<size_t>(m * 16 + j)] = 0.0f;
      }
      a.tile = vt.data();
      a.o = o.data() + m0 * hd;
      a.o_ld = hd;
      k.attn_accumulate(a);
    };
    std::vector<float> s_all(static_cast<size_t>(rows * 16)), o_all(static_cast<size_t>(rows * hd), 0.0f);
    run(0, rows, s_all, o_all);
    for (int32_t m = 0; m < rows; ++m) {
      std::vector<float> s_one(s_all.size()), o_one(o_all.size(), 0.0f);
      run(m, 1, s_one, o_one);
      for (int32_t j = 0; j < n; ++j)
        EXPECT_EQ(s_one[static_cast<size_t>(m * 16 + j)], s_all[static_cast<size_t>(m * 16 + j)]);
      for (int32_t d = 0; d < hd; ++d)
        EXPECT_EQ(o_one[static_cast<size_t>(m * hd + d)], o_all[static_cast<size_t>(m * hd + d)]);
    }
  }
}

// Scores and accumulation are the same f32 operations in the same order in every table: bitwise equal to
// the scalar table's, for every dtype, block sizes with and without a vector tail and head dims with one.
TEST_P(kernels_test, attention_kernels_are_bitwise_the_scalar_table) {
  const kernel_table& k = *GetParam();
  const kernel_table& ref = scalar_kernels();
  std::mt19937 rng(32);
  for (kv_dtype dt : all_kv_dtypes) {
    for (int32_t bs : {16, 19}) {
      for (int32_t hd : {64, 20, 18}) {
        for (int32_t rows : {2, 10}) {  // a decode step's few rows take the kernels' wide tiles
          const int32_t n = bs - 2, ld = (bs + 15) / 16 * 16;
          test_tile kt = random_tile(dt, true, bs, hd, n, rng);
          test_tile vt = random_tile(dt, false, bs, hd, n, rng);
          std::vector<std::vector<float>> q;
          std::vector<const float*> qp;
          for (int32_t m = 0; m < rows; ++m) q.push_back(random_floats(static_cast<size_t>(hd), rng));
          for (const auto& r : q) qp.push_back(r.data());
          const std::vector<float> o0 = random_floats(static_cast<size_t>(rows * hd), rng);
          auto run = [&](const kernel_table& t, std::vector<float>& s, std::vector<float>& o) {
            attn_block_args a;
            a.dtype = dt;
            a.block_size = bs;
            a.head_dim = hd;
            a.n = n;
            a.rows = rows;
            a.q = qp.data();
            a.scale = 0.125f;
            a.ld = ld;
            a.s = s.data();
            a.tile = kt.data();
            t.attn_scores(a);
            // Probabilities from the scores, the same for both tables (softmax_exp is not under test).
            for (int32_t m = 0; m < rows; ++m) {
              for (int32_t j = 0; j < ld; ++j) {
                float& x = s[static_cast<size_t>(m * ld + j)];
                x = j < n ? 1.0f / (1.0f + std::fabs(x)) : 0.0f;
              }
            }
            a.tile = vt.data();
            a.o = o.data();
            a.o_ld = hd;
            t.attn_accumulate(a);
          };
          std::vector<float> s_got(static_cast<size_t>(rows * ld)), s_want(s_got.size());
          std::vector<float> o_got = o0, o_want = o0;
          run(k, s_got, o_got);
          run(ref, s_want, o_want);
          for (int32_t m = 0; m < rows; ++m) {
            for (int32_t j = 0; j < n; ++j) {
              ASSERT_EQ(s_got[static_cast<size_t>(m * ld + j)], s_want[static_cast<size_t>(m * ld + j)])
                  << to_string(dt) << " bs " << bs << " hd " << hd << " rows " << rows << " row " << m << " slot " << j;
            }
            for (int32_t d = 0; d < hd; ++d) {
              ASSERT_EQ(o_got[static_cast<size_t>(m * hd + d)], o_want[static_cast<size_t>(m * hd + d)])
                  << to_string(dt) << " bs " << bs << " hd " << hd << " rows " << rows << " row " << m << " dim " << d;
            }
          }
        }
      }
    }
  }
}

TEST_P(kernels_test, softmax_exp_matches_reference) {
  const kernel_table& k = *GetParam();
  std::mt19937 rng(4);
  for (int32_t n : {1, 7, 16, 19}) {
    const std::vector<float> scores = random_floats(static_cast<size_t>(n), rng, -8.0f, 8.0f);
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
  for (ggml_type t : all_types) EXPECT_TRUE(has_quant_kernel(t)) << type_info(t).name;
  EXPECT_FALSE(has_quant_kernel(ggml_type::q8_1));  // activation-side formats, never weights
  EXPECT_FALSE(has_quant_kernel(ggml_type::q8_k));
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
