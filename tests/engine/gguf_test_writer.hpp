// A small GGUF writer for tests: builds valid files in memory, and (through its knobs and the raw
// byte helpers) the hostile variants the reader must refuse. Independent of engine/model/gguf.cpp: it
// encodes the format from the spec (ggml docs/gguf.md), so reader bugs are not mirrored here.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::test {

// Little-endian byte sink.
struct byte_writer {
  std::vector<std::byte> bytes;

  template <class T>
  byte_writer& put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
    return *this;
  }
  byte_writer& u8(uint8_t v) { return put(v); }
  byte_writer& u32(uint32_t v) { return put(v); }
  byte_writer& u64(uint64_t v) { return put(v); }
  byte_writer& str(std::string_view s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  byte_writer& raw(const void* p, size_t n) {
    const size_t at = bytes.size();
    bytes.resize(at + n);
    if (n != 0) std::memcpy(bytes.data() + at, p, n);
    return *this;
  }
  byte_writer& raw(const std::vector<std::byte>& b) { return raw(b.data(), b.size()); }
  size_t size() const { return bytes.size(); }
};

// GGUF value type numbers (spec), kept separate from engine/model/gguf.hpp on purpose.
namespace vt {
constexpr uint32_t u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
                   u64 = 10, i64 = 11, f64 = 12;
}

class gguf_writer {
 public:
  struct tensor_spec {
    std::string name;
    uint32_t type = 0;               // ggml type number
    std::vector<uint64_t> dims;      // ne0 first
    std::vector<std::byte> data;     // exactly the tensor's bytes
    std::optional<uint64_t> offset;  // override the laid-out data offset
    std::optional<uint32_t> n_dims;  // override the written n_dims (dims are still all written)
  };

  char magic[4] = {'G', 'G', 'U', 'F'};
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count_override;
  std::optional<uint64_t> kv_count_override;
  uint64_t alignment = 32;      // layout alignment; add a general.alignment key yourself to change it
  size_t extra_tail_bytes = 0;  // bytes appended after the data section

  // ---- metadata: each call appends one encoded key/value ----
  gguf_writer& kv_raw(std::string_view key, uint32_t type, const std::vector<std::byte>& payload) {
    kvs_.str(key).u32(type).raw(payload);
    ++num_kvs_;
    return *this;
  }
  template <class T>
  gguf_writer& kv_scalar(std::string_view key, uint32_t type, T v) {
    byte_writer w;
    w.put(v);
    return kv_raw(key, type, w.bytes);
  }
  gguf_writer& kv_u32(std::string_view key, uint32_t v) { return kv_scalar(key, vt::u32, v); }
  gguf_writer& kv_i32(std::string_view key, int32_t v) { return kv_scalar(key, vt::i32, v); }
  gguf_writer& kv_u64(std::string_view key, uint64_t v) { return kv_scalar(key, vt::u64, v); }
  gguf_writer& kv_f32(std::string_view key, float v) { return kv_scalar(key, vt::f32, v); }
  gguf_writer& kv_bool(std::string_view key, bool v) { return kv_scalar(key, vt::boolean, uint8_t{v}); }
  gguf_writer& kv_str(std::string_view key, std::string_view v) {
    byte_writer w;
    w.str(v);
    return kv_raw(key, vt::string, w.bytes);
  }
  gguf_writer& kv_str_array(std::string_view key, const std::vector<std::string>& v) {
    byte_writer w;
    w.u32(vt::string).u64(v.size());
    for (const auto& s : v) w.str(s);
    return kv_raw(key, vt::array, w.bytes);
  }
  template <class T>
  gguf_writer& kv_array(std::string_view key, uint32_t elem_type, const std::vector<T>& v) {
    byte_writer w;
    w.u32(elem_type).u64(v.size());
    for (const T& x : v) w.put(x);
    return kv_raw(key, vt::array, w.bytes);
  }

  gguf_writer& tensor(tensor_spec t) {
    tensors_.push_back(std::move(t));
    return *this;
  }
  // An F32 tensor filled with value(i) for element i.
  template <class F>
  gguf_writer& f32_tensor(std::string name, std::vector<uint64_t> dims, F value) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    byte_writer w;
    for (uint64_t i = 0; i < n; ++i) w.put(static_cast<float>(value(i)));
    return tensor({std::move(name), 0, std::move(dims), std::move(w.bytes), std::nullopt, std::nullopt});
  }

  std::vector<std::byte> build() const {
    byte_writer w;
    w.raw(magic, 4).u32(version);
    w.u64(tensor_count_override.value_or(tensors_.size()));
    w.u64(kv_count_override.value_or(num_kvs_));
    w.raw(kvs_.bytes);
    // Lay the data out in order, each tensor aligned.
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      next = align_up(next);
      offsets.push_back(t.offset.value_or(next));
      next += t.data.size();
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      w.str(t.name).u32(t.n_dims.value_or(static_cast<uint32_t>(t.dims.size())));
      for (uint64_t d : t.dims) w.u64(d);
      w.u32(t.type).u64(offsets[i]);
    }
    header_bytes_ = w.size();
    if (!tensors_.empty()) {
      w.bytes.resize(align_up(w.size()));
      data_start_ = w.size();
      uint64_t data_end = 0;
      for (size_t i = 0; i < tensors_.size(); ++i) {
        const auto& t = tensors_[i];
        if (t.offset) continue;  // overridden offsets may be hostile: only laid-out tensors are written
        data_end = std::max<uint64_t>(data_end, offsets[i] + t.data.size());
        w.bytes.resize(std::max<size_t>(w.size(), data_start_ + offsets[i] + t.data.size()));
        if (!t.data.empty()) std::memcpy(w.bytes.data() + data_start_ + offsets[i], t.data.data(), t.data.size());
      }
      w.bytes.resize(data_start_ + align_up(data_end));
    }
    w.bytes.resize(w.size() + extra_tail_bytes);
    return w.bytes;
  }

  // Valid after build(): bytes up to the end of the tensor infos, and where the data starts.
  size_t header_bytes() const { return header_bytes_; }
  size_t data_start() const { return data_start_; }

 private:
  uint64_t align_up(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }

  byte_writer kvs_;
  uint64_t num_kvs_ = 0;
  std::vector<tensor_spec> tensors_;
  mutable size_t header_bytes_ = 0;
  mutable size_t data_start_ = 0;
};

}  // namespace tessera::test
