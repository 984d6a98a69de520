// ggml types: the type table and dequantization against fixtures produced by an independent
// implementation (gguf-py's numpy code, scripts/make_quant_fixtures.py -> tests/data/quant/), and
// fp16/bf16 conversion against the compiler's _Float16 and exhaustive round trips.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/ggml_types.hpp"

namespace tessera {
namespace {

const std::filesystem::path quant_dir = std::filesystem::path(TESSERA_TEST_DATA_DIR) / "quant";

std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << p << " (run scripts/make_quant_fixtures.py)";
  std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(buf.size());
  if (!buf.empty()) std::memcpy(out.data(), buf.data(), buf.size());
  return out;
}

std::vector<float> read_floats(const std::filesystem::path& p) {
  const auto b = read_file(p);
  std::vector<float> out(b.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), b.data(), out.size() * 4);
  return out;
}

// Equal, or both NaN, or within 1e-6 relative (the reference may order float ops differently).
void expect_close(float got, float want, const std::string& where) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << where;
    return;
  }
  if (got == want) return;
  EXPECT_LE(std::fabs(got - want), 1e-6f * std::fabs(want) + 1e-30f) << where << ": got " << got << " want " << want;
}

TEST(GgmlTypes, TableMatchesGgufPySizes) {
  std::ifstream in(quant_dir / "sizes.txt");
  ASSERT_TRUE(in.good());
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    uint32_t id = 0;
    std::string name;
    int64_t elems = 0, bytes = 0;
    ls >> id >> name >> elems >> bytes;
    const ggml_type_info* info = find_type_info(id);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->name, name);
    EXPECT_EQ(info->block_elems, elems) << name;
    EXPECT_EQ(info->block_bytes, bytes) << name;
    ++rows;
  }
  EXPECT_EQ(rows, 14);
  // Q8_1 is not in gguf-py's (stale) table: current ggml has two fp16 + 32 int8 = 36 bytes.
  EXPECT_EQ(type_info(ggml_type::q8_1).block_bytes, 36);
  EXPECT_FALSE(type_info(ggml_type::q8_1).can_dequantize);
  EXPECT_FALSE(type_info(ggml_type::q8_k).can_dequantize);
  EXPECT_EQ(find_type_info(4), nullptr);  // Q4_2, removed from ggml
  EXPECT_EQ(find_type_info(5), nullptr);
  EXPECT_EQ(find_type_info(16), nullptr);  // IQ2_XXS: not supported by this build
  EXPECT_EQ(find_type_info(0xFFFFFFFFu), nullptr);
}

TEST(GgmlTypes, RowBytes) {
  EXPECT_EQ(row_bytes(ggml_type::f32, 576), 2304);
  EXPECT_EQ(row_bytes(ggml_type::q4_1, 576), 18 * 20);
  EXPECT_EQ(row_bytes(ggml_type::q8_0, 576), 18 * 34);
  EXPECT_EQ(row_bytes(ggml_type::q6_k, 512), 2 * 210);
  EXPECT_EQ(row_bytes(ggml_type::q4_0, 0), 0);
  EXPECT_EQ(row_bytes(ggml_type::q4_0, 33), -1);
  EXPECT_EQ(row_bytes(ggml_type::q4_k, 576), -1);  // not a multiple of 256
  EXPECT_EQ(row_bytes(ggml_type::f32, -4), -1);
  EXPECT_EQ(row_bytes(ggml_type::f32, int64_t{1} << 62), -1);  // overflows
  EXPECT_EQ(row_bytes(static_cast<ggml_type>(4), 32), -1);
}

struct fixture_case {
  const char* file;
  ggml_type type;
  friend void PrintTo(const fixture_case& c, std::ostream* os) { *os << c.file; }
};

class Dequantize : public ::testing::TestWithParam<fixture_case> {};

TEST_P(Dequantize, MatchesGgufPy) {
  const auto [file, type] = GetParam();
  const auto q = read_file(quant_dir / (std::string(file) + ".q"));
  const auto want = read_floats(quant_dir / (std::string(file) + ".f32"));
  ASSERT_FALSE(want.empty());
  const auto n = static_cast<int64_t>(want.size());
  ASSERT_EQ(static_cast<int64_t>(q.size()), row_bytes(type, n)) << file;

  // Whole buffer as one row.
  std::vector<float> got(want.size(), -12345.0f);
  dequantize_row(type, q.data(), got.data(), n);
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(got[i], want[i], std::string(file) + "[" + std::to_string(i) + "]");

  // Block by block from a misaligned copy (rows start anywhere inside a mapping).
  const ggml_type_info& info = type_info(type);
  std::vector<std::byte> shifted(q.size() + 1);
  std::memcpy(shifted.data() + 1, q.data(), q.size());
  std::vector<float> got2(want.size(), -12345.0f);
  for (int64_t b = 0; b < n / info.block_elems; ++b) {
    dequantize_row(type, shifted.data() + 1 + b * info.block_bytes, got2.data() + b * info.block_elems,
                   info.block_elems);
  }
  EXPECT_EQ(std::memcmp(got.data(), got2.data(), got.size() * 4), 0) << file;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Dequantize,
                         ::testing::Values(fixture_case{"f32", ggml_type::f32}, fixture_case{"f16", ggml_type::f16},
                                           fixture_case{"bf16", ggml_type::bf16}, fixture_case{"q4_0", ggml_type::q4_0},
                                           fixture_case{"q4_1", ggml_type::q4_1}, fixture_case{"q5_0", ggml_type::q5_0},
                                           fixture_case{"q5_1", ggml_type::q5_1}, fixture_case{"q8_0", ggml_type::q8_0},
                                           fixture_case{"q2_k", ggml_type::q2_k}, fixture_case{"q3_k", ggml_type::q3_k},
                                           fixture_case{"q4_k", ggml_type::q4_k}, fixture_case{"q5_k", ggml_type::q5_k},
                                           fixture_case{"q6_k", ggml_type::q6_k}),
                         [](const auto& param_info) { return std::string(param_info.param.file); });

// A hand-built Q4_0 block, independent of any other implementation: d = 0.5, low nibble j, high 15-j.
TEST(GgmlTypes, HandBuiltQ4_0Block) {
  uint8_t block[18];
  const uint16_t d = 0x3800;  // 0.5 in binary16
  std::memcpy(block, &d, 2);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(ggml_type::q4_0, block, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 8));
    EXPECT_EQ(y[j + 16], 0.5f * static_cast<float>(7 - j));
  }
}

TEST(GgmlTypes, EncodingMatchesNumpyAndGgufPy) {
  // F16: numpy's astype(float16); BF16: gguf-py's (= ggml's) round-to-nearest-even.
  for (const auto& [name, is_bf16] : {std::pair{"f16", false}, std::pair{"bf16", true}}) {
    const auto src = read_floats(quant_dir / (std::string(name) + ".src.f32"));
    const auto q = read_file(quant_dir / (std::string(name) + ".q"));
    ASSERT_EQ(q.size(), src.size() * 2);
    for (size_t i = 0; i < src.size(); ++i) {
      uint16_t want;
      std::memcpy(&want, q.data() + 2 * i, 2);
      const uint16_t got = is_bf16 ? fp32_to_bf16(src[i]) : fp32_to_fp16(src[i]);
      EXPECT_EQ(got, want) << name << "[" << i << "] = " << src[i] << " (bits 0x" << std::hex
                           << std::bit_cast<uint32_t>(src[i]) << ")";
    }
  }
}

TEST(GgmlTypes, Fp16ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0;
    EXPECT_EQ(std::isnan(f), nan) << h;
    if (nan) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << h;
    } else {
      EXPECT_EQ(fp32_to_fp16(f), h) << h;
    }
#ifdef __FLT16_MANT_DIG__
    _Float16 ref;
    const auto hh = static_cast<uint16_t>(h);
    std::memcpy(&ref, &hh, 2);
    if (!nan) { EXPECT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(static_cast<float>(ref))) << h; }
#endif
  }
}

#ifdef __FLT16_MANT_DIG__
// The compiler's float -> _Float16 conversion (IEEE round-to-nearest-even) as the oracle for
// rounding: random bit patterns across the whole float range plus every half's neighbourhood.
TEST(GgmlTypes, Fp16EncodingMatchesCompiler) {
  auto check = [](float f) {
    if (std::isnan(f)) return;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(fp32_to_fp16(f), want) << "bits 0x" << std::hex << std::bit_cast<uint32_t>(f);
  };
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) check(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (uint32_t h = 0; h < 0x7C00; ++h) {  // each finite half, its midpoints and their neighbours
    const uint32_t bits = std::bit_cast<uint32_t>(fp16_to_fp32(static_cast<uint16_t>(h)));
    const uint32_t next = std::bit_cast<uint32_t>(fp16_to_fp32(static_cast<uint16_t>(h + 1)));
    const uint32_t mid = bits + (next - bits) / 2;
    for (uint32_t b : {bits, bits + 1, mid - 1, mid, mid + 1}) {
      check(std::bit_cast<float>(b));
      check(-std::bit_cast<float>(b));
    }
  }
}
#endif

TEST(GgmlTypes, Bf16ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(f))));
    } else {
      EXPECT_EQ(fp32_to_bf16(f), h);
    }
  }
  // Ties go to even; above the tie rounds up; the largest float rounds to infinity.
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);
}

TEST(GgmlTypes, DequantizeRejectsWhatItCannotDo) {
  float y[256];
  const std::vector<std::byte> zeros(512);
  EXPECT_THROW(dequantize_row(ggml_type::q8_k, zeros.data(), y, 256), std::invalid_argument);
  EXPECT_THROW(dequantize_row(ggml_type::q4_0, zeros.data(), y, 31), std::invalid_argument);
}

}  // namespace
}  // namespace tessera
