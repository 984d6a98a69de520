#include "engine/model/safetensors.hpp"

#include <simdjson.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "engine/base/error.hpp"
#include "engine/base/regular_file.hpp"

namespace tessera {

namespace {

namespace sj = simdjson;

// Element widths of the dtypes the format defines (safetensors/src/tensor.rs, enum Dtype). Only
// F32/F16/BF16 can be computed with; the rest are still sized so that their offsets are checked.
struct dtype_info {
  std::string_view name;
  int64_t bits;
  bool supported;
  ggml_type type;
};

constexpr dtype_info k_dtypes[] = {
    {"F32", 32, true, ggml_type::f32},     {"F16", 16, true, ggml_type::f16},     {"BF16", 16, true, ggml_type::bf16},
    {"F64", 64, false, ggml_type::f32},    {"I64", 64, false, ggml_type::f32},    {"U64", 64, false, ggml_type::f32},
    {"I32", 32, false, ggml_type::f32},    {"U32", 32, false, ggml_type::f32},    {"I16", 16, false, ggml_type::f32},
    {"U16", 16, false, ggml_type::f32},    {"I8", 8, false, ggml_type::f32},      {"U8", 8, false, ggml_type::f32},
    {"BOOL", 8, false, ggml_type::f32},    {"F8_E4M3", 8, false, ggml_type::f32}, {"F8_E5M2", 8, false, ggml_type::f32},
    {"F8_E8M0", 8, false, ggml_type::f32}, {"F6_E2M3", 6, false, ggml_type::f32}, {"F6_E3M2", 6, false, ggml_type::f32},
    {"F4", 4, false, ggml_type::f32},
};

const dtype_info* find_dtype(std::string_view name) {
  for (const auto& d : k_dtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// A read-only view of the whole file: either a mapping or bytes owned by the object.
struct file_bytes {
  const std::byte* data = nullptr;
  size_t size = 0;
  void* mapping = nullptr;  // munmap on destruction when set
  std::vector<std::byte> owned;

  file_bytes() = default;
  file_bytes(const file_bytes&) = delete;
  file_bytes& operator=(const file_bytes&) = delete;
  ~file_bytes() {
    if (mapping != nullptr) ::munmap(mapping, size);
  }
};

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

int64_t safetensors_tensor::num_elements() const noexcept {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // the reader checked that this does not overflow
  return n;
}

struct safetensors_file::impl {
  std::string name;
  file_bytes bytes;
  std::vector<safetensors_tensor> tensors;
  std::unordered_map<std::string_view, size_t> by_name;  // views into tensors[i].name
  std::map<std::string, std::string> metadata;

  [[noreturn]] void fail(const std::string& what) const { throw load_error(name + ": safetensors: " + what); }

  void parse();
  void parse_tensor(std::string_view key, sj::dom::element value, const std::byte* buffer, uint64_t buffer_size);
};

void safetensors_file::impl::parse() {
  const std::byte* base = bytes.data;
  const uint64_t size = bytes.size;
  if (size < 8) fail("file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint64_t header_len = read_le64(base);
  if (header_len > max_header_bytes) {
    fail("header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len > size - 8) {
    fail("header length " + std::to_string(header_len) + " runs past the end of the file (" + std::to_string(size) +
         " bytes): truncated?");
  }
  if (header_len < 2) fail("header of " + std::to_string(header_len) + " bytes cannot be a JSON object");
  const char* header = reinterpret_cast<const char*>(base + 8);
  if (header[0] != '{') fail("header does not start with '{'");

  const sj::padded_string padded(header, static_cast<size_t>(header_len));
  sj::dom::parser parser;
  sj::dom::element root;
  if (const auto err = parser.parse(padded).get(root); err) {
    fail(std::string("header is not valid JSON: ") + sj::error_message(err));
  }
  sj::dom::object object;
  if (root.get_object().get(object)) fail("header is not a JSON object");

  const std::byte* buffer = base + 8 + header_len;
  const uint64_t buffer_size = size - 8 - header_len;
  std::unordered_map<std::string_view, int> seen;  // views into the parser's strings, alive here
  for (auto field : object) {
    const std::string_view key = field.key;
    if (++seen[key] > 1) fail("duplicate entry '" + std::string(key) + "' in the header");
    if (key == "__metadata__") {
      sj::dom::object meta;
      if (field.value.get_object().get(meta)) fail("'__metadata__' is not an object");
      for (auto m : meta) {
        std::string_view v;
        if (m.value.get_string().get(v)) fail("'__metadata__' value of '" + std::string(m.key) + "' is not a string");
        if (!metadata.emplace(std::string(m.key), std::string(v)).second) {
          fail("duplicate '__metadata__' key '" + std::string(m.key) + "'");
        }
      }
      continue;
    }
    parse_tensor(key, field.value, buffer, buffer_size);
  }

  // The tensors must tile the byte buffer exactly: sorted by offset, each starts where the previous
  // one ended and the last ends at the end of the file (no overlap, no hidden bytes).
  std::vector<const safetensors_tensor*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return a->data != b->data ? a->data < b->data : a->num_bytes < b->num_bytes;
  });
  uint64_t expected = 0;
  const safetensors_tensor* previous = nullptr;
  for (const auto* t : order) {
    const auto begin = static_cast<uint64_t>(t->data - buffer);
    if (begin < expected) {
      fail("tensor '" + t->name + "' (bytes " + std::to_string(begin) + "..) overlaps tensor '" + previous->name +
           "' (ending at " + std::to_string(expected) + ")");
    }
    if (begin > expected) {
      fail("tensor '" + t->name + "' starts at byte " + std::to_string(begin) + " but the previous tensor ends at " +
           std::to_string(expected) + " (gap in the data)");
    }
    expected = begin + static_cast<uint64_t>(t->num_bytes);
    previous = t;
  }
  if (expected != buffer_size) {
    fail("tensor data ends at byte " + std::to_string(expected) + " of a " + std::to_string(buffer_size) +
         "-byte data section (trailing bytes)");
  }
}

void safetensors_file::impl::parse_tensor(std::string_view key, sj::dom::element value, const std::byte* buffer,
                                          uint64_t buffer_size) {
  const std::string name(key);
  auto bad = [&](const std::string& what) { fail("tensor '" + name + "': " + what); };
  sj::dom::object entry;
  if (value.get_object().get(entry)) bad("entry is not an object");

  std::string_view dtype_name;
  if (entry["dtype"].get_string().get(dtype_name)) bad("'dtype' is missing or not a string");
  const dtype_info* dtype = find_dtype(dtype_name);
  if (dtype == nullptr) bad("unknown dtype '" + std::string(dtype_name) + "'");

  sj::dom::array shape_array;
  if (entry["shape"].get_array().get(shape_array)) bad("'shape' is missing or not an array");
  safetensors_tensor t;
  t.name = name;
  t.dtype = std::string(dtype_name);
  t.supported = dtype->supported;
  t.type = dtype->type;
  // Element count in bits must not overflow: cap it at 2^62.
  constexpr uint64_t k_limit = uint64_t{1} << 62;
  uint64_t bits = static_cast<uint64_t>(dtype->bits);
  for (auto dim : shape_array) {
    uint64_t d = 0;
    if (dim.get_uint64().get(d)) bad("shape holds something other than a non-negative integer");
    if (d > k_limit || (d != 0 && bits > k_limit / d)) bad("shape is too large");
    bits *= d;
    t.shape.push_back(static_cast<int64_t>(d));
  }
  if (bits % 8 != 0) bad("shape does not fill whole bytes for dtype " + t.dtype);

  sj::dom::array offsets;
  if (entry["data_offsets"].get_array().get(offsets)) bad("'data_offsets' is missing or not an array");
  uint64_t range[2] = {0, 0};
  size_t n = 0;
  for (auto v : offsets) {
    if (n == 2) bad("'data_offsets' has more than two entries");
    if (v.get_uint64().get(range[n])) bad("'data_offsets' holds something other than a non-negative integer");
    ++n;
  }
  if (n != 2) bad("'data_offsets' must be [begin, end]");
  if (range[1] < range[0]) {
    bad("data_offsets [" + std::to_string(range[0]) + ", " + std::to_string(range[1]) + "] end before they begin");
  }
  if (range[1] > buffer_size) {
    bad("data_offsets end at " + std::to_string(range[1]) + ", past the " + std::to_string(buffer_size) +
        "-byte data section (truncated file?)");
  }
  const uint64_t num_bytes = range[1] - range[0];
  if (num_bytes != bits / 8) {
    bad("holds " + std::to_string(num_bytes) + " bytes but dtype " + t.dtype + " x shape needs " +
        std::to_string(bits / 8));
  }
  t.data = buffer + range[0];
  t.num_bytes = static_cast<int64_t>(num_bytes);
  tensors.push_back(std::move(t));
}

safetensors_file::safetensors_file(std::unique_ptr<impl> p) : impl_(std::move(p)) {
  // Index only after parsing: the vector no longer moves, so the name views stay valid. (parse()
  // already refused duplicate names.)
  for (size_t i = 0; i < impl_->tensors.size(); ++i) impl_->by_name.emplace(impl_->tensors[i].name, i);
}

safetensors_file::~safetensors_file() = default;

std::shared_ptr<const safetensors_file> safetensors_file::open(const std::filesystem::path& path) {
  auto p = std::make_unique<impl>();
  p->name = path.string();
  // Refuses FIFOs, devices and directories without blocking (engine/base/regular_file.hpp). Its
  // "<path>: <reason>" becomes this reader's "<path>: safetensors: <reason>".
  const regular_file file = [&] {
    try {
      return regular_file::open(path);
    } catch (const load_error& e) {
      std::string_view reason = e.what();
      if (reason.starts_with(p->name + ": ")) reason.remove_prefix(p->name.size() + 2);
      p->fail(std::string(reason));
    }
  }();
  const uint64_t size = file.size();
  if (size > 0) {
    // The mapping keeps its own reference to the file; `file` closes the descriptor on return.
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (m == MAP_FAILED) p->fail(std::string("mmap failed: ") + std::strerror(errno));
    p->bytes.mapping = m;
    p->bytes.data = static_cast<const std::byte*>(m);
  }
  p->bytes.size = size;
  p->parse();
  return std::shared_ptr<const safetensors_file>(new safetensors_file(std::move(p)));
}

std::shared_ptr<const safetensors_file> safetensors_file::from_bytes(std::vector<std::byte> bytes, std::string name) {
  auto p = std::make_unique<impl>();
  p->name = std::move(name);
  p->bytes.owned = std::move(bytes);
  p->bytes.data = p->bytes.owned.data();
  p->bytes.size = p->bytes.owned.size();
  p->parse();
  return std::shared_ptr<const safetensors_file>(new safetensors_file(std::move(p)));
}

const std::string& safetensors_file::name() const noexcept { return impl_->name; }

std::span<const safetensors_tensor> safetensors_file::tensors() const noexcept { return impl_->tensors; }

const safetensors_tensor* safetensors_file::tensor(std::string_view name) const noexcept {
  const auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

const std::map<std::string, std::string>& safetensors_file::metadata() const noexcept { return impl_->metadata; }

}  // namespace tessera
