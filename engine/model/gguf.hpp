// GGUF reader: header, metadata, tensor infos, and a read-only mapping of the tensor data.
// Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3, little endian).
// Every number in the file is treated as hostile: counts, lengths, offsets, dimensions and types are
// checked against the bytes that remain before anything is allocated; failures throw load_error
// naming the problem and the byte offset.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/ggml_types.hpp"

namespace tessera {

// GGUF metadata value types (on-disk numbering).
enum class gguf_value_type : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

// One metadata value. Scalars use one of i/u/f/b/s; arrays keep their elements in the typed vector
// matching elem_type (integers of any width in `ints`, floats in `floats`, ...), nested arrays in `arrays`.
// Bool arrays are kept as 0/1 in `ints`; u64 array elements above INT64_MAX are refused at load.
struct gguf_value {
  gguf_value_type type = gguf_value_type::u8;
  gguf_value_type elem_type = gguf_value_type::u8;  // arrays only
  int64_t i = 0;                                    // signed integers, and unsigned ones that fit
  uint64_t u = 0;                                   // unsigned integers (also set for signed >= 0)
  double f = 0.0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<gguf_value> arrays;
  uint64_t array_size = 0;
};

struct gguf_tensor_info {
  std::string name;
  ggml_type type = ggml_type::f32;
  std::vector<int64_t> dims;  // ne[0] first: ne[0] is the contiguous (fastest) dimension
  int64_t num_elements = 0;
  uint64_t offset = 0;  // from the start of the tensor data section
  uint64_t num_bytes = 0;
  const std::byte* data = nullptr;  // inside the mapping
};

class gguf_file {
 public:
  // Maps the file read-only and parses it. Throws load_error.
  static std::shared_ptr<const gguf_file> open(const std::filesystem::path& path);
  // Parses an in-memory image (tests, fuzzing); the bytes are copied.
  static std::shared_ptr<const gguf_file> from_bytes(std::span<const std::byte> bytes);

  gguf_file(const gguf_file&) = delete;
  gguf_file& operator=(const gguf_file&) = delete;
  ~gguf_file();

  uint32_t version() const noexcept { return version_; }
  uint64_t alignment() const noexcept { return alignment_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  // ---- metadata -----------------------------------------------------------------------------
  const gguf_value* find(std::string_view key) const noexcept;
  std::vector<std::string> keys() const;
  // Typed getters: nullopt/nullptr when the key is absent; load_error when present with a wrong type.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;   // any integer type
  std::optional<double> get_float(std::string_view key) const;  // f32/f64 (integers accepted)
  std::optional<bool> get_bool(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  const std::vector<int64_t>* get_int_array(std::string_view key) const;
  const std::vector<double>* get_float_array(std::string_view key) const;
  // Human-readable rendering of one value (long arrays abbreviated), for `tessera inspect`.
  std::string describe(std::string_view key) const;

  // ---- tensors ------------------------------------------------------------------------------
  std::span<const gguf_tensor_info> tensors() const noexcept { return tensors_; }
  const gguf_tensor_info* tensor(std::string_view name) const noexcept;

  struct impl;

 private:
  gguf_file() = default;
  std::unique_ptr<impl> impl_;
  std::filesystem::path path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<gguf_tensor_info> tensors_;
};

}  // namespace tessera
