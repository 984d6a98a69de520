// Reader for the safetensors format (Hugging Face, https://github.com/huggingface/safetensors, "Format"):
//
//   [8 bytes: N, unsigned little-endian] [N bytes: UTF-8 JSON header] [byte buffer]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the start of the byte buffer, row-major, little-endian); the optional "__metadata__"
// entry maps strings to strings. Files are untrusted: the reader checks the header size (at most
// 100 MB), that every tensor's bytes lie inside the file, that tensors neither overlap nor leave
// gaps (as the reference implementation requires), that byte sizes equal dtype size * shape, and
// that names are unique; any violation throws load_error naming the file and the tensor.
// The file is memory-mapped; tensor data stays valid while the safetensors_file lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/ggml_types.hpp"

namespace tessera {

struct safetensors_tensor {
  std::string name;
  std::string dtype;                // as written: "F32", "BF16", "I64", ...
  bool supported = false;           // dtype is F32, F16 or BF16 (the types `type` can name)
  ggml_type type = ggml_type::f32;  // meaningful only when supported
  std::vector<int64_t> shape;       // outermost first (PyTorch order); empty for a scalar
  const std::byte* data = nullptr;
  int64_t num_bytes = 0;

  int64_t num_elements() const noexcept;
};

class safetensors_file {
 public:
  // Maps and validates `path`. Throws load_error.
  static std::shared_ptr<const safetensors_file> open(const std::filesystem::path& path);
  // Validates an in-memory image (tests, fuzzing); `name` is used in error messages. Throws load_error.
  static std::shared_ptr<const safetensors_file> from_bytes(std::vector<std::byte> bytes, std::string name);

  ~safetensors_file();
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;

  const std::string& name() const noexcept;                                // the path or the name given to from_bytes
  std::span<const safetensors_tensor> tensors() const noexcept;            // in header order
  const safetensors_tensor* tensor(std::string_view name) const noexcept;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const noexcept;

  static constexpr uint64_t max_header_bytes = 100ull << 20;

 private:
  struct impl;
  explicit safetensors_file(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tessera
