// GGUF reader: a valid file written by an independent in-test writer parses to the right values;
// a corpus of hostile files (built in-test, so the corpus is code) is refused with load_error naming
// the problem, quickly, without crashing or over-reading (run under ASan too); the real model parses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/gguf_test_writer.hpp"
#include "engine/model/gguf.hpp"

namespace tessera {
namespace {

using test::byte_writer;
using test::gguf_writer;
namespace vt = test::vt;

// The sample file: every value type, nested arrays, three tensors of three element types. Its last
// tensor ends exactly at the end of the file, so every proper prefix of it is a truncated file.
gguf_writer sample_writer() {
  gguf_writer w;
  w.kv_str("general.architecture", "llama");
  w.kv_str("general.name", "tiny \"sample\"\n");
  w.kv_scalar("t.u8", vt::u8, uint8_t{200});
  w.kv_scalar("t.i8", vt::i8, int8_t{-100});
  w.kv_scalar("t.u16", vt::u16, uint16_t{60000});
  w.kv_scalar("t.i16", vt::i16, int16_t{-30000});
  w.kv_u32("t.u32", 4000000000u);
  w.kv_i32("t.i32", -2000000000);
  w.kv_u64("t.u64", 18000000000000000000ull);
  w.kv_scalar("t.i64", vt::i64, int64_t{-9000000000000000000ll});
  w.kv_f32("t.f32", 0.15625f);
  w.kv_scalar("t.f64", vt::f64, 2.718281828459045);
  w.kv_bool("t.bool", true);
  w.kv_str_array("t.strings", {"a", "", "héllo", std::string("nul\0byte", 8)});
  w.kv_array<int32_t>("t.i32s", vt::i32, {1, -2, 3});
  w.kv_array<uint64_t>("t.u64s", vt::u64, {0, 9223372036854775807ull});
  w.kv_array<float>("t.f32s", vt::f32, {0.5f, -1.25f});
  w.kv_array<uint8_t>("t.bools", vt::boolean, {1, 0, 1});
  w.kv_array<uint8_t>("t.empty", vt::u8, {});
  {
    // [[1, 2], [], [[7]]] as arrays of u8 / nested
    byte_writer v;
    v.u32(vt::array).u64(3);
    v.u32(vt::u8).u64(2).u8(1).u8(2);
    v.u32(vt::u8).u64(0);
    v.u32(vt::array).u64(1).u32(vt::u16).u64(1).put(uint16_t{7});
    w.kv_raw("t.nested", vt::array, v.bytes);
  }
  // Q8_0 [64, 2]: 4 blocks of (fp16 d, 32 x int8).
  byte_writer q8;
  for (int b = 0; b < 4; ++b) {
    q8.put(uint16_t{0x3C00});  // d = 1.0
    for (int j = 0; j < 32; ++j) q8.put(static_cast<int8_t>(b * 32 + j - 64));
  }
  w.tensor({"blk.0.q8", 8, {64, 2}, q8.bytes, std::nullopt, std::nullopt});
  byte_writer f16;
  for (int i = 0; i < 16; ++i) f16.put(static_cast<uint16_t>(0x3C00 + i));
  w.tensor({"f16.vec", 1, {16}, f16.bytes, std::nullopt, std::nullopt});
  w.f32_tensor("f32.mat", {4, 8}, [](uint64_t i) { return 0.5 * static_cast<double>(i); });
  return w;
}

using clock_type = std::chrono::steady_clock;

// Parses `bytes`, expecting load_error whose message contains `expect`; guards "well under a second".
void expect_refused(const std::vector<std::byte>& bytes, const std::string& expect, const std::string& label) {
  SCOPED_TRACE(label);
  const auto t0 = clock_type::now();
  try {
    gguf_file::from_bytes(bytes);
    ADD_FAILURE() << "accepted a hostile file: " << label;
  } catch (const load_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(expect), std::string::npos) << "message: " << msg << "\nexpected to contain: " << expect;
    EXPECT_NE(msg.find("GGUF"), std::string::npos) << msg;
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_LT(seconds, 1.0) << "refusing took " << seconds << " s";
}

TEST(GgufReader, ParsesEveryValueTypeOfAValidFile) {
  const gguf_writer w = sample_writer();
  const auto bytes = w.build();
  const auto f = gguf_file::from_bytes(bytes);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->keys().size(), 20u);
  EXPECT_EQ(f->keys().front(), "general.architecture");  // file order
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_string("general.name"), "tiny \"sample\"\n");
  EXPECT_EQ(f->get_int("t.u8"), 200);
  EXPECT_EQ(f->get_int("t.i8"), -100);
  EXPECT_EQ(f->get_int("t.u16"), 60000);
  EXPECT_EQ(f->get_int("t.i16"), -30000);
  EXPECT_EQ(f->get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(f->get_int("t.i32"), -2000000000);
  EXPECT_EQ(f->find("t.u64")->u, 18000000000000000000ull);
  EXPECT_THROW(f->get_int("t.u64"), load_error);  // does not fit int64
  EXPECT_EQ(f->get_int("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f->get_float("t.f32"), 0.15625);
  EXPECT_EQ(f->get_float("t.f64"), 2.718281828459045);
  EXPECT_EQ(f->get_float("t.i32"), -2000000000.0);  // integers accepted as floats
  EXPECT_EQ(f->get_bool("t.bool"), true);

  const auto* strings = f->get_string_array("t.strings");
  ASSERT_NE(strings, nullptr);
  EXPECT_EQ(*strings, (std::vector<std::string>{"a", "", "héllo", std::string("nul\0byte", 8)}));
  EXPECT_EQ(*f->get_int_array("t.i32s"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f->get_int_array("t.u64s"), (std::vector<int64_t>{0, 9223372036854775807ll}));
  EXPECT_EQ(*f->get_float_array("t.f32s"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(f->find("t.bools")->ints, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(f->find("t.empty")->array_size, 0u);
  EXPECT_TRUE(f->get_int_array("t.empty")->empty());

  const gguf_value* nested = f->find("t.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->elem_type, gguf_value_type::array);
  ASSERT_EQ(nested->arrays.size(), 3u);
  EXPECT_EQ(nested->arrays[0].ints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested->arrays[1].array_size, 0u);
  ASSERT_EQ(nested->arrays[2].arrays.size(), 1u);
  EXPECT_EQ(nested->arrays[2].arrays[0].elem_type, gguf_value_type::u16);
  EXPECT_EQ(nested->arrays[2].arrays[0].ints, (std::vector<int64_t>{7}));

  // Absent keys and wrong types.
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_FALSE(f->get_string("nope").has_value());
  EXPECT_EQ(f->get_string_array("nope"), nullptr);
  EXPECT_THROW(f->get_string("t.u32"), load_error);
  EXPECT_THROW(f->get_int("general.name"), load_error);
  EXPECT_THROW(f->get_bool("t.u8"), load_error);
  EXPECT_THROW(f->get_float("t.strings"), load_error);
  EXPECT_THROW(f->get_string_array("t.i32s"), load_error);
  EXPECT_THROW(f->get_int_array("t.f32s"), load_error);
  EXPECT_THROW(f->get_float_array("t.i32s"), load_error);

  // describe(): readable, long arrays abbreviated.
  EXPECT_EQ(f->describe("t.i32s"), "[1, -2, 3]");
  EXPECT_EQ(f->describe("general.name"), "\"tiny \\\"sample\\\"\\n\"");
  EXPECT_EQ(f->describe("t.bool"), "true");
  EXPECT_EQ(f->describe("t.u64"), "18000000000000000000");
  EXPECT_EQ(f->describe("t.nested"), "[[1, 2], [], [[7]]]");

  // Tensors: file order, shapes, sizes, data pointers into the image.
  ASSERT_EQ(f->tensors().size(), 3u);
  const gguf_tensor_info* q8 = f->tensor("blk.0.q8");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8->type, ggml_type::q8_0);
  EXPECT_EQ(q8->dims, (std::vector<int64_t>{64, 2}));
  EXPECT_EQ(q8->num_elements, 128);
  EXPECT_EQ(q8->num_bytes, 4u * 34u);
  EXPECT_EQ(q8->offset, 0u);
  const auto* raw = reinterpret_cast<const int8_t*>(q8->data);
  EXPECT_EQ(raw[2 + 5], -59);  // block 0, element 5
  const gguf_tensor_info* mat = f->tensor("f32.mat");
  ASSERT_NE(mat, nullptr);
  EXPECT_EQ(mat->offset, 192u);  // 136 -> 160 (f16, 32 bytes) -> 192
  EXPECT_EQ(mat->dims, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mat->data) % 32, 0u);  // aligned in the owned copy
  float v = 0;
  std::memcpy(&v, mat->data + 4 * 31, 4);
  EXPECT_EQ(v, 15.5f);
  EXPECT_EQ(f->tensor("f16.vec")->type, ggml_type::f16);
  EXPECT_EQ(f->tensor("missing"), nullptr);
  EXPECT_EQ(bytes.size(), w.data_start() + 192 + 128);  // no trailing padding (see sample_writer)
}

TEST(GgufReader, AcceptsVersion2AndCustomAlignment) {
  gguf_writer w;
  w.version = 2;
  w.alignment = 64;
  w.kv_u32("general.alignment", 64);
  w.f32_tensor("a", {3}, [](uint64_t i) { return static_cast<double>(i); });
  w.f32_tensor("b", {5}, [](uint64_t i) { return -static_cast<double>(i); });
  const auto f = gguf_file::from_bytes(w.build());
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->tensor("b")->offset, 64u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor("b")->data) % 64, 0u);
}

TEST(GgufReader, FileWithoutTensorsOrMetadata) {
  gguf_writer w;
  const auto f = gguf_file::from_bytes(w.build());
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->keys().empty());
}

TEST(GgufReader, EveryTruncationOfAValidFileIsRefused) {
  const auto bytes = sample_writer().build();
  ASSERT_NO_THROW(gguf_file::from_bytes(bytes));
  const auto t0 = clock_type::now();
  for (size_t len = 0; len < bytes.size(); ++len) {
    const std::vector<std::byte> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len));
    try {
      gguf_file::from_bytes(prefix);
      ADD_FAILURE() << "accepted a prefix of " << len << " bytes";
    } catch (const load_error& e) {
      const std::string msg = e.what();
      const bool named = msg.find("truncated") != std::string::npos || msg.find("remain") != std::string::npos ||
                         msg.find("past the end") != std::string::npos;
      EXPECT_TRUE(named) << "prefix " << len << ": " << msg;
    }
  }
  EXPECT_LT(std::chrono::duration<double>(clock_type::now() - t0).count(), 5.0);
}

// ---- the hostile corpus ------------------------------------------------------------------------

struct hostile_case {
  std::string label;
  std::function<std::vector<std::byte>()> make;
  std::string expect;
};

std::vector<std::byte> with_kv(const std::function<void(gguf_writer&)>& add) {
  gguf_writer w;
  w.kv_str("general.architecture", "llama");
  add(w);
  w.f32_tensor("t", {8}, [](uint64_t i) { return static_cast<double>(i); });
  return w.build();
}

std::vector<std::byte> with_tensor(gguf_writer::tensor_spec t, size_t tail = 0) {
  gguf_writer w;
  w.f32_tensor("first", {8}, [](uint64_t i) { return static_cast<double>(i); });
  w.tensor(std::move(t));
  w.extra_tail_bytes = tail;
  return w.build();
}

std::vector<std::byte> zeros(size_t n) { return std::vector<std::byte>(n); }

gguf_writer::tensor_spec f32_spec(std::string name, std::vector<uint64_t> dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return {std::move(name), 0, std::move(dims), zeros(n * 4), std::nullopt, std::nullopt};
}

std::vector<std::byte> nested_arrays(int depth) {
  byte_writer v;  // payload of an array value: (type=array, count=1) repeated, innermost u8 x0
  for (int d = 0; d < depth; ++d) v.u32(vt::array).u64(1);
  v.u32(vt::u8).u64(0);
  return v.bytes;
}

constexpr uint64_t u64_max = std::numeric_limits<uint64_t>::max();

std::vector<hostile_case> hostile_corpus() {
  std::vector<hostile_case> c;
  auto add = [&](std::string label, std::function<std::vector<std::byte>()> make, std::string expect) {
    c.push_back({std::move(label), std::move(make), std::move(expect)});
  };
  // Header.
  add(
      "empty file", [] { return std::vector<std::byte>{}; }, "truncated");
  add(
      "three bytes",
      [] {
        return std::vector<std::byte>{std::byte{'G'}, std::byte{'G'}, std::byte{'U'}};
      },
      "truncated");
  add(
      "bad magic GGML",
      [] {
        gguf_writer w;
        std::memcpy(w.magic, "GGML", 4);
        return w.build();
      },
      "bad magic");
  add(
      "byte-swapped magic",
      [] {
        gguf_writer w;
        std::memcpy(w.magic, "FUGG", 4);
        return w.build();
      },
      "bad magic");
  add(
      "version 1",
      [] {
        gguf_writer w;
        w.version = 1;
        return w.build();
      },
      "unsupported version 1");
  add(
      "version 4",
      [] {
        gguf_writer w;
        w.version = 4;
        return w.build();
      },
      "unsupported version 4");
  add(
      "big-endian file",
      [] {
        gguf_writer w;
        w.version = 0x03000000u;
        return w.build();
      },
      "big-endian");
  add(
      "version 0xffffffff",
      [] {
        gguf_writer w;
        w.version = 0xFFFFFFFFu;
        return w.build();
      },
      "unsupported version 4294967295");
  add(
      "tensor count u64 max",
      [] {
        gguf_writer w;
        w.tensor_count_override = u64_max;
        return w.build();
      },
      "tensor count 18446744073709551615");
  add(
      "tensor count 1000 in a small file",
      [] {
        gguf_writer w;
        w.tensor_count_override = 1000;
        return w.build();
      },
      "tensor count 1000");
  add(
      "kv count 2^63",
      [] {
        gguf_writer w;
        w.kv_count_override = uint64_t{1} << 63;
        return w.build();
      },
      "metadata count 9223372036854775808");
  add(
      "kv count one more than present",
      [] {
        gguf_writer w;
        w.kv_u32("a", 1);
        w.kv_count_override = 2;
        return w.build();
      },
      "remain");
  // Strings.
  add(
      "key length 0xffffffff",
      [] {
        gguf_writer w;
        byte_writer b;
        b.u64(0xFFFFFFFFu);
        w.kv_count_override = 1;
        auto out = w.build();
        out.insert(out.end(), b.bytes.begin(), b.bytes.end());
        out.resize(out.size() + 100);
        return out;
      },
      "string length 4294967295");
  add(
      "key length u64 max",
      [] {
        gguf_writer w;
        byte_writer b;
        b.u64(u64_max);
        w.kv_count_override = 1;
        auto out = w.build();
        out.insert(out.end(), b.bytes.begin(), b.bytes.end());
        out.resize(out.size() + 100);
        return out;
      },
      "string length 18446744073709551615");
  add(
      "key longer than 65535 bytes",
      [] { return with_kv([](gguf_writer& w) { w.kv_u32(std::string(70000, 'k'), 1); }); },
      "exceeds the limit of 65535");
  add(
      "empty key", [] { return with_kv([](gguf_writer& w) { w.kv_u32("", 1); }); }, "empty key");
  add(
      "string value length 2^40",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u64(uint64_t{1} << 40);
          w.kv_raw("s", vt::string, b.bytes);
        });
      },
      "string length 1099511627776 of string value of key 's'");
  add(
      "string value of 1 MiB + 1",
      [] { return with_kv([](gguf_writer& w) { w.kv_str("big", std::string((1u << 20) + 1, 'x')); }); },
      "exceeds the limit of 1048576");
  add(
      "string array element length overflow",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u32(vt::string).u64(2).str("ok").u64(u64_max - 3);
          w.kv_raw("arr", vt::array, b.bytes);
        });
      },
      "string element 1 of key 'arr'");
  add(
      "tensor name length huge",
      [] {
        gguf_writer w;
        w.tensor_count_override = 1;
        auto out = w.build();
        byte_writer b;
        b.u64(uint64_t{1} << 50);
        b.u32(1).u64(8).u32(0).u64(0);
        out.insert(out.end(), b.bytes.begin(), b.bytes.end());
        return out;
      },
      "string length 1125899906842624");
  // Value types.
  add(
      "unknown value type 13", [] { return with_kv([](gguf_writer& w) { w.kv_raw("x", 13, zeros(8)); }); },
      "unknown value type 13 for key 'x'");
  add(
      "unknown value type 0xffffffff",
      [] { return with_kv([](gguf_writer& w) { w.kv_raw("x", 0xFFFFFFFFu, zeros(8)); }); },
      "unknown value type 4294967295");
  add(
      "unknown array element type",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u32(42).u64(1).u32(0);
          w.kv_raw("arr", vt::array, b.bytes);
        });
      },
      "unknown array element type 42");
  add(
      "bool value 2", [] { return with_kv([](gguf_writer& w) { w.kv_scalar("b", vt::boolean, uint8_t{2}); }); },
      "bool value 2");
  add(
      "bool array element 7",
      [] { return with_kv([](gguf_writer& w) {
             w.kv_array<uint8_t>("bs", vt::boolean, {0, 1, 7});
           }); },
      "bool array element 7");
  add(
      "u64 array element above int64",
      [] { return with_kv([](gguf_writer& w) {
             w.kv_array<uint64_t>("big", vt::u64, {1, u64_max});
           }); },
      "does not fit in int64");
  // Arrays.
  add(
      "array count 2^62 of u32",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u32(vt::u32).u64(uint64_t{1} << 62);
          w.kv_raw("a", vt::array, b.bytes);
        });
      },
      "array of 4611686018427387904 u32 elements in key 'a' needs more than");
  add(
      "array count u64 max of strings",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u32(vt::string).u64(u64_max);
          w.kv_raw("a", vt::array, b.bytes);
        });
      },
      "needs more than");
  add(
      "array of 16M + 1 bytes (present)",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u32(vt::u8).u64((uint64_t{1} << 24) + 1);
          b.bytes.resize(b.size() + (size_t{1} << 24) + 1);
          w.kv_raw("a", vt::array, b.bytes);
        });
      },
      "exceeds the limit of 16777216");
  add(
      "arrays nested 100 deep",
      [] { return with_kv([](gguf_writer& w) { w.kv_raw("deep", vt::array, nested_arrays(99)); }); },
      "nested deeper than 8");
  add(
      "70000 empty nested arrays",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u32(vt::array).u64(70000);
          for (int i = 0; i < 70000; ++i) b.u32(vt::u8).u64(0);
          w.kv_raw("wide", vt::array, b.bytes);
        });
      },
      "nested arrays in total");
  add(
      "array nested count overflow",
      [] {
        return with_kv([](gguf_writer& w) {
          byte_writer b;
          b.u32(vt::array).u64(u64_max / 4);
          w.kv_raw("a", vt::array, b.bytes);
        });
      },
      "needs more than");
  // Keys and alignment.
  add(
      "duplicate key", [] { return with_kv([](gguf_writer& w) { w.kv_u32("dup", 1).kv_str("dup", "again"); }); },
      "duplicate key 'dup'");
  add(
      "alignment 0", [] { return with_kv([](gguf_writer& w) { w.kv_u32("general.alignment", 0); }); },
      "general.alignment 0 is not a non-zero power of two");
  add(
      "alignment 48", [] { return with_kv([](gguf_writer& w) { w.kv_u32("general.alignment", 48); }); },
      "general.alignment 48 is not a non-zero power of two");
  add(
      "alignment negative", [] { return with_kv([](gguf_writer& w) { w.kv_i32("general.alignment", -32); }); },
      "general.alignment -32");
  add(
      "alignment 2^40",
      [] { return with_kv([](gguf_writer& w) { w.kv_u64("general.alignment", uint64_t{1} << 40); }); },
      "exceeds the limit");
  add(
      "alignment is a string", [] { return with_kv([](gguf_writer& w) { w.kv_str("general.alignment", "32"); }); },
      "general.alignment has type string");
  // Tensor infos.
  add(
      "unknown ggml type 4 (removed Q4_2)",
      [] {
        auto s = f32_spec("t4", {8});
        s.type = 4;
        return with_tensor(s);
      },
      "tensor 't4': unknown ggml type 4");
  add(
      "unknown ggml type 1000",
      [] {
        auto s = f32_spec("t", {8});
        s.type = 1000;
        return with_tensor(s);
      },
      "unknown ggml type 1000");
  add(
      "n_dims 0",
      [] {
        auto s = f32_spec("t", {});
        s.data = zeros(32);
        return with_tensor(s);
      },
      "n_dims 0 is not in 1..4");
  add(
      "n_dims 5",
      [] {
        return with_tensor(f32_spec("t5", {1, 1, 1, 1, 8}));
      },
      "tensor 't5': n_dims 5");
  add(
      "n_dims 0xffffffff",
      [] {
        auto s = f32_spec("t", {8});
        s.n_dims = 0xFFFFFFFFu;
        return with_tensor(s);
      },
      "n_dims 4294967295");
  add(
      "dimension 0",
      [] {
        auto s = f32_spec("t", {8});
        s.dims = {8, 0};
        return with_tensor(s);
      },
      "dimension 1 is 0");
  add(
      "dimension 2^63",
      [] {
        auto s = f32_spec("t", {8});
        s.dims = {uint64_t{1} << 63};
        return with_tensor(s);
      },
      "dimension 0 is 9223372036854775808");
  add(
      "element count overflow",
      [] {
        auto s = f32_spec("t", {8});
        s.dims = {uint64_t{1} << 32, uint64_t{1} << 32};
        return with_tensor(s);
      },
      "element count overflows");
  add(
      "byte size overflow",
      [] {
        auto s = f32_spec("t", {8});
        s.dims = {uint64_t{1} << 62};
        return with_tensor(s);
      },
      "byte size overflows");
  add(
      "row not a whole number of blocks",
      [] {
        auto s = f32_spec("q", {8});
        s.type = 2;
        s.dims = {33};
        s.data = zeros(18);
        return with_tensor(s);
      },
      "row length 33 is not a multiple of the Q4_0 block size 32");
  add(
      "misaligned offset",
      [] {
        auto s = f32_spec("m", {8});
        s.offset = 48;
        return with_tensor(s, 64);
      },
      "tensor 'm': data offset 48 is not a multiple of the alignment 32");
  add(
      "overlapping tensors",
      [] {
        auto s = f32_spec("over", {8});
        s.offset = 0;
        return with_tensor(s, 64);
      },
      "overlaps tensor");
  add(
      "tensor past the end of the file",
      [] {
        auto s = f32_spec("far", {8});
        s.offset = 4096;
        return with_tensor(s);
      },
      "tensor 'far' [8] of 32 bytes at data offset 4096");
  add(
      "tensor offset overflow",
      [] {
        auto s = f32_spec("wrap", {8});
        s.offset = u64_max - 31;
        return with_tensor(s);
      },
      "runs past the end of the file");
  add(
      "tensor data truncated",
      [] {
        auto out = with_tensor(f32_spec("big", {64}));
        out.resize(out.size() - 1);
        return out;
      },
      "tensor 'big'");
  add(
      "duplicate tensor name", [] { return with_tensor(f32_spec("first", {8})); }, "duplicate tensor name 'first'");
  add(
      "empty tensor name", [] { return with_tensor(f32_spec("", {8})); }, "tensor 1 has an empty name");
  add(
      "data section missing",
      [] {
        gguf_writer w;
        w.f32_tensor("t", {8}, [](uint64_t) { return 1.0; });
        auto out = w.build();
        out.resize(w.header_bytes());
        return out;
      },
      "past the end");
  add(
      "data section padding missing",
      [] {
        gguf_writer w;
        w.f32_tensor("t", {8}, [](uint64_t) { return 1.0; });
        auto out = w.build();
        out.resize(w.header_bytes() + 1);
        return out;
      },
      "past the end");
  return c;
}

TEST(GgufReader, RefusesEveryFileOfTheHostileCorpus) {
  const auto corpus = hostile_corpus();
  EXPECT_GE(corpus.size(), 30u);
  for (const auto& h : corpus) expect_refused(h.make(), h.expect, h.label);
}

TEST(GgufReader, ErrorsNameTheByteOffset) {
  // The string length of key 0 sits right after the 24-byte header.
  gguf_writer w;
  w.kv_count_override = 1;
  auto bytes = w.build();
  byte_writer b;
  b.u64(4294967295u);
  bytes.insert(bytes.end(), b.bytes.begin(), b.bytes.end());
  bytes.resize(bytes.size() + 812);
  expect_refused(bytes,
                 "string length 4294967295 of key of metadata entry 0 exceeds the 812 bytes that remain (at offset 24)",
                 "offset named");
}

// Random damage to a valid file: every result is either a parse or a load_error (never a crash,
// hang or over-read; the ASan build checks the last). Mutations target the header and metadata,
// where the numbers live, and sometimes overwrite a whole 8-byte field with an extreme value.
TEST(GgufReader, SurvivesRandomCorruption) {
  const auto original = sample_writer().build();
  std::mt19937_64 rng(12345);
  int refused = 0;
  const auto t0 = clock_type::now();
  for (int iter = 0; iter < 3000; ++iter) {
    auto bytes = original;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % std::min<size_t>(bytes.size(), 700);
      switch (rng() % 4) {
        case 0: bytes[at] ^= static_cast<std::byte>(1u << (rng() % 8)); break;
        case 1: bytes[at] = static_cast<std::byte>(rng()); break;
        case 2: {
          static constexpr uint64_t extremes[] = {0,       1,           0x7FFFFFFF, 0xFFFFFFFF, 0x8000000000000000ull,
                                                  u64_max, u64_max - 7, 1u << 24};
          const uint64_t v = extremes[rng() % std::size(extremes)];
          const size_t n = std::min<size_t>(8, bytes.size() - at);
          std::memcpy(bytes.data() + at, &v, n);
          break;
        }
        default: bytes.resize(at); break;
      }
      if (bytes.empty()) break;
    }
    try {
      gguf_file::from_bytes(bytes);
    } catch (const load_error&) { ++refused; }
  }
  EXPECT_GT(refused, 1000);  // most damage is detected (some lands in string contents or data)
  EXPECT_LT(std::chrono::duration<double>(clock_type::now() - t0).count(), 10.0);
}

// ---- open(): the mmap path ----------------------------------------------------------------------

class GgufOpen : public ::testing::Test {
 protected:
  std::filesystem::path write_temp(const std::vector<std::byte>& bytes, const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() / ("tessera_gguf_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    dirs_.push_back(dir);
    const auto path = dir / name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  void TearDown() override {
    for (const auto& d : dirs_) std::filesystem::remove_all(d);
  }
  std::vector<std::filesystem::path> dirs_;
};

TEST_F(GgufOpen, MapsAValidFile) {
  const auto path = write_temp(sample_writer().build(), "valid.gguf");
  const auto f = gguf_file::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  const gguf_tensor_info* mat = f->tensor("f32.mat");
  ASSERT_NE(mat, nullptr);
  float v = 0;
  std::memcpy(&v, mat->data + 4 * 5, 4);
  EXPECT_EQ(v, 2.5f);
}

TEST_F(GgufOpen, RefusesHostileFilesNamingThePath) {
  const auto corpus = hostile_corpus();
  for (size_t i = 0; i < corpus.size(); i += 7) {  // a spread of the corpus through the mmap path
    const auto path = write_temp(corpus[i].make(), "hostile" + std::to_string(i) + ".gguf");
    SCOPED_TRACE(corpus[i].label);
    try {
      gguf_file::open(path);
      ADD_FAILURE() << "accepted";
    } catch (const load_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(corpus[i].expect), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(gguf_file::open(write_temp({}, "empty.gguf")), load_error);
  const auto dir = write_temp({}, "x").parent_path();
  EXPECT_THROW(gguf_file::open(dir), load_error);  // a directory
  try {
    gguf_file::open(dir / "does-not-exist.gguf");
    ADD_FAILURE();
  } catch (const load_error& e) { EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos); }
}

// ---- the real model ----------------------------------------------------------------------------

TEST(GgufRealModel, SmolLM2Metadata) {
  const std::filesystem::path path = std::filesystem::path(TESSERA_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model file not present: " << path;
  const auto t0 = clock_type::now();
  const auto f = gguf_file::open(path);
  EXPECT_LT(std::chrono::duration<double>(clock_type::now() - t0).count(), 5.0);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 272u);
  EXPECT_EQ(f->keys().size(), 33u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.block_count"), 30);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f->get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), false);
  ASSERT_NE(f->get_string_array("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")->size(), 49152u);
  EXPECT_NE(f->get_string("tokenizer.chat_template")->find("<|im_start|>"), std::string::npos);
  const gguf_tensor_info* embd = f->tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, ggml_type::q8_0);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(f->tensor("blk.29.ffn_down.weight")->type, ggml_type::q4_1);
  EXPECT_EQ(f->tensor("blk.0.attn_norm.weight")->type, ggml_type::f32);
  EXPECT_EQ(f->tensor("output.weight"), nullptr);  // tied embeddings
  EXPECT_NE(f->describe("tokenizer.ggml.tokens").find("(49152 elements)"), std::string::npos);
}

}  // namespace
}  // namespace tessera
