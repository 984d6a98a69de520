// The safetensors reader on files built here byte by byte: one valid file (read back through the
// mapping and from memory) and hostile variants, each of which must be refused with a load_error
// whose message names the problem.
#include "engine/model/safetensors.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/base/error.hpp"

namespace tessera {
namespace {

// [8-byte little-endian length][header][data]
std::vector<std::byte> image(const std::string& header, const std::vector<uint8_t>& data, uint64_t stated_len) {
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((stated_len >> (8 * i)) & 0xff));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (uint8_t b : data) out.push_back(static_cast<std::byte>(b));
  return out;
}

std::vector<std::byte> image(const std::string& header, const std::vector<uint8_t>& data) {
  return image(header, data, header.size());
}

std::vector<uint8_t> bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 1);
  return v;
}

// The message of the load_error `bytes` provokes, or "" when it parses.
std::string error_of(std::vector<std::byte> bytes) {
  try {
    safetensors_file::from_bytes(std::move(bytes), "hostile.safetensors");
  } catch (const load_error& e) { return e.what(); }
  return "";
}

#define EXPECT_REFUSED(img, fragment)                                               \
  do {                                                                              \
    const std::string msg = error_of(img);                                          \
    EXPECT_NE(msg.find(fragment), std::string::npos) << "message: '" << msg << "'"; \
    EXPECT_NE(msg.find("hostile.safetensors"), std::string::npos) << msg;           \
  } while (0)

// Two tensors: a [2, 3] F32 matrix then a [4] BF16 vector, plus metadata.
const std::string k_valid_header =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
    R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})";

TEST(safetensors, valid_file_parses_from_memory) {
  const auto data = bytes(32);
  const auto f = safetensors_file::from_bytes(image(k_valid_header, data), "mem");
  ASSERT_EQ(f->tensors().size(), 2u);
  const safetensors_tensor* a = f->tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_TRUE(a->supported);
  EXPECT_EQ(a->type, ggml_type::f32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->num_elements(), 6);
  EXPECT_EQ(a->num_bytes, 24);
  EXPECT_EQ(std::memcmp(a->data, data.data(), 24), 0);
  const safetensors_tensor* b = f->tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, ggml_type::bf16);
  EXPECT_EQ(std::memcmp(b->data, data.data() + 24, 8), 0);
  EXPECT_EQ(f->tensor("c"), nullptr);
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(safetensors, valid_file_parses_through_the_mapping) {
  const auto path =
      std::filesystem::temp_directory_path() / ("tessera_st_" + std::to_string(::getpid()) + ".safetensors");
  const auto data = bytes(32);
  {
    // Header padded with spaces to a multiple of 8, as the Python writer does.
    std::string header = k_valid_header;
    header.append((8 - header.size() % 8) % 8, ' ');
    const auto img = image(header, data);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
  }
  const auto f = safetensors_file::open(path);
  std::filesystem::remove(path);  // the mapping stays valid after unlink
  EXPECT_EQ(f->name(), path.string());
  const safetensors_tensor* b = f->tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(std::memcmp(b->data, data.data() + 24, 8), 0);
}

TEST(safetensors, missing_file_is_a_load_error) {
  EXPECT_THROW(safetensors_file::open("/nonexistent/dir/x.safetensors"), load_error);
}

TEST(safetensors, unsupported_dtypes_are_sized_but_flagged) {
  const auto f = safetensors_file::from_bytes(
      image(R"({"ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]}})", bytes(24)), "mem");
  ASSERT_NE(f->tensor("ids"), nullptr);
  EXPECT_FALSE(f->tensor("ids")->supported);
  EXPECT_EQ(f->tensor("ids")->dtype, "I64");
}

TEST(safetensors, empty_and_scalar_tensors) {
  const auto f = safetensors_file::from_bytes(image(R"({"s":{"dtype":"F16","shape":[],"data_offsets":[0,2]},)"
                                                    R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[2,2]}})",
                                                    bytes(2)),
                                              "mem");
  EXPECT_EQ(f->tensor("s")->num_elements(), 1);
  EXPECT_EQ(f->tensor("e")->num_elements(), 0);
}

TEST(safetensors, hostile_truncated_files) {
  EXPECT_REFUSED(std::vector<std::byte>{}, "shorter than the 8-byte");
  EXPECT_REFUSED(std::vector<std::byte>(5, std::byte{0}), "shorter than the 8-byte");
  auto img = image(k_valid_header, bytes(32));
  img.resize(img.size() - 3);  // data cut short
  EXPECT_REFUSED(img, "past the");
  img.resize(8 + k_valid_header.size() / 2);  // header cut short
  EXPECT_REFUSED(img, "runs past the end of the file");
}

TEST(safetensors, hostile_header_lengths) {
  EXPECT_REFUSED(image(k_valid_header, bytes(32), ~uint64_t{0}), "exceeds the 100 MB limit");
  EXPECT_REFUSED(image(k_valid_header, bytes(32), (100ull << 20) + 1), "exceeds the 100 MB limit");
  EXPECT_REFUSED(image(k_valid_header, bytes(32), k_valid_header.size() + 1000), "runs past the end");
  EXPECT_REFUSED(image("", {}, 0), "cannot be a JSON object");
}

TEST(safetensors, hostile_json) {
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", bytes(4)), "not valid JSON");
  EXPECT_REFUSED(image(R"([1,2,3])", {}), "does not start with '{'");
  EXPECT_REFUSED(image("{\"a\xff\":{}}", {}), "not valid JSON");  // invalid UTF-8
  EXPECT_REFUSED(image(R"({"a":[1]})", {}), "entry is not an object");
  EXPECT_REFUSED(image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", bytes(4)), "'dtype' is missing");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", bytes(4)), "'shape' is missing");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1]}})", bytes(4)), "'data_offsets' is missing");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", bytes(4)), "non-negative integer");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", bytes(4)), "[begin, end]");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", bytes(4)), "more than two");
  EXPECT_REFUSED(image(R"({"__metadata__":{"k":1}})", {}), "not a string");
}

TEST(safetensors, hostile_offsets) {
  // Past the end of the data section.
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", bytes(8)), "past the 8-byte");
  // Inverted.
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", bytes(8)), "end before they begin");
  // Overlapping.
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       bytes(12)),
                 "overlaps");
  // A gap between tensors, and bytes nobody owns at the end.
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", bytes(8)), "gap");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", bytes(8)), "trailing bytes");
  // Offsets near 2^64 must not wrap around.
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}})", bytes(4)),
                 "end before they begin");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", bytes(4)),
                 "past the 4-byte");
}

TEST(safetensors, hostile_shapes_and_dtypes) {
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", bytes(20)),
                 "holds 20 bytes but dtype F32 x shape needs 24");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", bytes(16)), "needs 8");
  // Element count overflow: 2^40 * 2^40 elements.
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}})", bytes(4)),
                 "too large");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"Q4_1","shape":[1],"data_offsets":[0,4]}})", bytes(4)), "unknown dtype 'Q4_1'");
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", bytes(2)), "whole bytes");
}

TEST(safetensors, hostile_duplicate_names) {
  EXPECT_REFUSED(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                       bytes(8)),
                 "duplicate entry 'a'");
  EXPECT_REFUSED(image(R"({"__metadata__":{},"__metadata__":{}})", {}), "duplicate entry '__metadata__'");
}

}  // namespace
}  // namespace tessera
