// GGUF reader. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
//
//   header:  magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv:      string key | u32 value_type | value            (kv_count times)
//   tensor:  string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset   (tensor_count times)
//   padding to general.alignment (default 32), then the tensor data section.
//   string:  u64 length | bytes (no terminator);  array: u32 elem_type | u64 count | elements
//
// Every number read from the file is hostile. The cursor below never reads past the end of the
// image; every count and length is compared with the bytes that remain BEFORE anything is
// allocated for it, and every sum/product uses checked arithmetic.
#include "engine/model/gguf.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <new>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "engine/base/error.hpp"
#include "engine/base/regular_file.hpp"

namespace tessera {
namespace {

constexpr uint64_t max_string_bytes = uint64_t{1} << 20;       // 1 MiB: a chat template is ~KB
constexpr uint64_t max_key_bytes = 65535;                      // the spec's limit for keys
constexpr uint64_t max_array_elems = uint64_t{1} << 24;        // 16M: a vocabulary is ~100K-256K
constexpr uint64_t max_total_array_elems = uint64_t{1} << 25;  // all arrays of one file together
constexpr uint64_t max_nested_arrays = uint64_t{1} << 16;      // nested array values in one file
constexpr int max_array_depth = 8;                             // arrays of arrays of ...
constexpr uint32_t max_dims = 4;                               // GGML_MAX_DIMS
constexpr uint64_t default_alignment = 32;                     // GGUF_DEFAULT_ALIGNMENT
constexpr size_t data_buffer_alignment = 64;                   // from_bytes copy: cache-line aligned

// Smallest encodings, used to bound counts by the bytes that remain.
constexpr uint64_t min_kv_bytes = 8 + 4 + 1;  // empty key, u8 value (keys must be non-empty, still a bound)
constexpr uint64_t min_tensor_info_bytes = 8 + 4 + 8 + 4 + 8;  // empty name, one dim

const char* value_type_name(uint32_t t) {
  switch (t) {
    case 0: return "u8";
    case 1: return "i8";
    case 2: return "u16";
    case 3: return "i16";
    case 4: return "u32";
    case 5: return "i32";
    case 6: return "f32";
    case 7: return "bool";
    case 8: return "string";
    case 9: return "array";
    case 10: return "u64";
    case 11: return "i64";
    case 12: return "f64";
    default: return "unknown";
  }
}

// Encoded size of a scalar of this type (0 for string/array, whose size is variable).
uint64_t scalar_bytes(gguf_value_type t) {
  switch (t) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean: return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16: return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32: return 4;
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64: return 8;
    case gguf_value_type::string:
    case gguf_value_type::array: return 0;
  }
  return 0;
}

// Smallest encoding of one array element of this type (a string: its u64 length; an array: its
// u32 type and u64 count).
uint64_t min_elem_bytes(gguf_value_type t) {
  if (t == gguf_value_type::string) return 8;
  if (t == gguf_value_type::array) return 12;
  return scalar_bytes(t);
}

bool is_integer(gguf_value_type t) {
  switch (t) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::u16:
    case gguf_value_type::i16:
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::u64:
    case gguf_value_type::i64: return true;
    default: return false;
  }
}

bool is_float(gguf_value_type t) { return t == gguf_value_type::f32 || t == gguf_value_type::f64; }

std::string quote_string(std::string_view s, size_t max_chars = 120) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7F) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

// Owns the bytes of the file: either a read-only mapping or an aligned heap copy.
class file_bytes {
 public:
  file_bytes() = default;
  file_bytes(const file_bytes&) = delete;
  file_bytes& operator=(const file_bytes&) = delete;
  ~file_bytes() { reset(); }

  void map(void* addr, size_t size) {
    reset();
    data_ = static_cast<const std::byte*>(addr);
    size_ = size;
    mapped_ = true;
  }
  void copy(std::span<const std::byte> bytes) {
    reset();
    auto* p = static_cast<std::byte*>(
        ::operator new (std::max<size_t>(bytes.size(), 1), std::align_val_t{data_buffer_alignment}));
    if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
    data_ = p;
    size_ = bytes.size();
    mapped_ = false;
  }
  std::span<const std::byte> span() const { return {data_, size_}; }

 private:
  void reset() {
    if (data_ == nullptr) return;
    if (mapped_) {
      ::munmap(const_cast<std::byte*>(data_), size_);
    } else {
      ::operator delete (const_cast<std::byte*>(data_), std::align_val_t{data_buffer_alignment});
    }
    data_ = nullptr;
    size_ = 0;
  }
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace

struct gguf_file::impl {
  file_bytes bytes;
  // File order. A deque, so that nothing is reserved from a hostile count and the keys never move.
  struct kv_entry {
    std::string key;
    gguf_value value;
    uint64_t value_offset = 0;  // of the value's encoding, for error messages
  };
  std::deque<kv_entry> kvs;
  std::unordered_map<std::string_view, size_t> kv_index;      // views into kvs' keys
  std::unordered_map<std::string_view, size_t> tensor_index;  // views into tensors_' names
};

namespace {

// A bounds-checked little-endian reader over the file image. Errors name the byte offset.
class cursor {
 public:
  explicit cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  uint64_t size() const { return bytes_.size(); }

  [[noreturn]] void fail(uint64_t at, const std::string& what) const {
    throw load_error("GGUF: " + what + " (at offset " + std::to_string(at) + ")");
  }

  // Throws unless n more bytes exist at the cursor; `what` names the field being read.
  void need(uint64_t n, const char* what) const {
    if (n > remaining()) {
      fail(pos_, std::string("file truncated: ") + what + " needs " + std::to_string(n) + " bytes but only " +
                     std::to_string(remaining()) + " remain");
    }
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // A GGUF string; what() names it ("key of metadata entry 3", ...), built only on error.
  template <class Describe>
  std::string read_string(Describe what, uint64_t max_bytes = max_string_bytes) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>("string length");
    if (len > remaining()) {
      fail(at, "string length " + std::to_string(len) + " of " + what() + " exceeds the " +
                   std::to_string(remaining()) + " bytes that remain");
    }
    if (len > max_bytes) {
      fail(at, "string length " + std::to_string(len) + " of " + what() + " exceeds the limit of " +
                   std::to_string(max_bytes) + " bytes");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  std::span<const std::byte> bytes_;
  uint64_t pos_ = 0;
};

class parser {
 public:
  explicit parser(std::span<const std::byte> bytes) : cur_(bytes) {}

  gguf_value read_value(gguf_value_type type, const std::string& key, int depth) {
    gguf_value v;
    v.type = type;
    const uint64_t at = cur_.offset();
    switch (type) {
      case gguf_value_type::u8: set_unsigned(v, cur_.read<uint8_t>("u8 value")); break;
      case gguf_value_type::i8: set_signed(v, cur_.read<int8_t>("i8 value")); break;
      case gguf_value_type::u16: set_unsigned(v, cur_.read<uint16_t>("u16 value")); break;
      case gguf_value_type::i16: set_signed(v, cur_.read<int16_t>("i16 value")); break;
      case gguf_value_type::u32: set_unsigned(v, cur_.read<uint32_t>("u32 value")); break;
      case gguf_value_type::i32: set_signed(v, cur_.read<int32_t>("i32 value")); break;
      case gguf_value_type::u64: set_unsigned(v, cur_.read<uint64_t>("u64 value")); break;
      case gguf_value_type::i64: set_signed(v, cur_.read<int64_t>("i64 value")); break;
      case gguf_value_type::f32: v.f = cur_.read<float>("f32 value"); break;
      case gguf_value_type::f64: v.f = cur_.read<double>("f64 value"); break;
      case gguf_value_type::boolean: {
        const auto b = cur_.read<uint8_t>("bool value");
        if (b > 1) cur_.fail(at, "bool value " + std::to_string(b) + " of key '" + key + "' is not 0 or 1");
        v.b = b != 0;
        break;
      }
      case gguf_value_type::string: v.s = cur_.read_string([&] { return "string value of key '" + key + "'"; }); break;
      case gguf_value_type::array: read_array(v, key, depth); break;
    }
    return v;
  }

  gguf_value_type read_value_type(const std::string& key, const char* what) {
    const uint64_t at = cur_.offset();
    const auto raw = cur_.read<uint32_t>(what);
    if (raw > static_cast<uint32_t>(gguf_value_type::f64)) {
      cur_.fail(at, std::string("unknown ") + what + " " + std::to_string(raw) + " for key '" + key + "'");
    }
    return static_cast<gguf_value_type>(raw);
  }

  void read_array(gguf_value& v, const std::string& key, int depth) {
    const uint64_t at = cur_.offset();
    if (depth >= max_array_depth) {
      cur_.fail(at, "arrays nested deeper than " + std::to_string(max_array_depth) + " in key '" + key + "'");
    }
    v.elem_type = read_value_type(key, "array element type");
    const uint64_t count_at = cur_.offset();
    const auto count = cur_.read<uint64_t>("array length");
    const uint64_t elem_min = min_elem_bytes(v.elem_type);
    uint64_t need = 0;
    if (__builtin_mul_overflow(count, elem_min, &need) || need > cur_.remaining()) {
      cur_.fail(count_at, "array of " + std::to_string(count) + " " +
                              value_type_name(static_cast<uint32_t>(v.elem_type)) + " elements in key '" + key +
                              "' needs more than the " + std::to_string(cur_.remaining()) + " bytes that remain");
    }
    if (count > max_array_elems) {
      cur_.fail(count_at, "array of " + std::to_string(count) + " elements in key '" + key + "' exceeds the limit of " +
                              std::to_string(max_array_elems));
    }
    if (count > max_total_array_elems - num_array_elems_) {
      cur_.fail(count_at, "array of " + std::to_string(count) + " elements in key '" + key +
                              "' exceeds the file's budget of " + std::to_string(max_total_array_elems) +
                              " array elements in total");
    }
    num_array_elems_ += count;
    v.array_size = count;
    const auto n = static_cast<size_t>(count);
    switch (v.elem_type) {
      case gguf_value_type::u8: read_ints<uint8_t>(v.ints, n); break;
      case gguf_value_type::i8: read_ints<int8_t>(v.ints, n); break;
      case gguf_value_type::u16: read_ints<uint16_t>(v.ints, n); break;
      case gguf_value_type::i16: read_ints<int16_t>(v.ints, n); break;
      case gguf_value_type::u32: read_ints<uint32_t>(v.ints, n); break;
      case gguf_value_type::i32: read_ints<int32_t>(v.ints, n); break;
      case gguf_value_type::i64: read_ints<int64_t>(v.ints, n); break;
      case gguf_value_type::u64: {
        const uint64_t first_at = cur_.offset();
        read_ints<uint64_t>(v.ints, n);
        for (size_t i = 0; i < n; ++i) {
          if (v.ints[i] < 0) {
            cur_.fail(first_at + 8 * i, "u64 array element " + std::to_string(static_cast<uint64_t>(v.ints[i])) +
                                            " of key '" + key + "' does not fit in int64");
          }
        }
        break;
      }
      case gguf_value_type::boolean: {
        // Bools are kept as 0/1 in `ints` (gguf_value has no vector<bool>; 0/1 is unambiguous).
        const uint64_t first_at = cur_.offset();
        read_ints<uint8_t>(v.ints, n);
        for (size_t i = 0; i < n; ++i) {
          if (v.ints[i] > 1) {
            cur_.fail(first_at + i,
                      "bool array element " + std::to_string(v.ints[i]) + " of key '" + key + "' is not 0 or 1");
          }
        }
        break;
      }
      case gguf_value_type::f32: read_floats<float>(v.floats, n); break;
      case gguf_value_type::f64: read_floats<double>(v.floats, n); break;
      case gguf_value_type::string:
        v.strings.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          v.strings.push_back(
              cur_.read_string([&] { return "string element " + std::to_string(i) + " of key '" + key + "'"; }));
        }
        break;
      case gguf_value_type::array:
        // Each nested array value costs a whole gguf_value (~200 bytes) for 12 file bytes: a
        // separate, small budget keeps "arrays of empty arrays" from amplifying memory.
        if (count > max_nested_arrays - num_nested_) {
          cur_.fail(count_at, "key '" + key + "' holds more than " + std::to_string(max_nested_arrays) +
                                  " nested arrays in total");
        }
        num_nested_ += count;
        v.arrays.reserve(n);
        for (size_t i = 0; i < n; ++i) v.arrays.push_back(read_value(gguf_value_type::array, key, depth + 1));
        break;
    }
  }

  cursor& cur() { return cur_; }

 private:
  // Callers have already checked that n elements of sizeof(T) fit in the bytes that remain.
  template <class T>
  void read_ints(std::vector<int64_t>& out, size_t n) {
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(cur_.read<T>("array element"));
  }
  template <class T>
  void read_floats(std::vector<double>& out, size_t n) {
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(cur_.read<T>("array element"));
  }

  static void set_unsigned(gguf_value& v, uint64_t x) {
    v.u = x;
    v.i = x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(x) : 0;
  }
  static void set_signed(gguf_value& v, int64_t x) {
    v.i = x;
    v.u = x >= 0 ? static_cast<uint64_t>(x) : 0;
  }

  cursor cur_;
  uint64_t num_nested_ = 0;
  uint64_t num_array_elems_ = 0;
};

std::string format_dims(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

gguf_file::~gguf_file() = default;

// The whole parse of a file image (mapped or copied). It fills the impl and, through the
// references, gguf_file's private fields; `tensors[i].data` point into `image`.
static void parse_image(gguf_file::impl& im, std::span<const std::byte> image, uint32_t& version, uint64_t& alignment,
                        std::vector<gguf_tensor_info>& tensors) {
  parser p(image);
  cursor& cur = p.cur();

  // ---- header ----
  cur.need(4, "magic");
  if (std::memcmp(image.data(), "GGUF", 4) != 0) {
    const auto* m = reinterpret_cast<const unsigned char*>(image.data());
    char hex[16];
    std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", m[0], m[1], m[2], m[3]);
    cur.fail(0, std::string("bad magic 0x") + hex + " (expected \"GGUF\"): not a GGUF file");
  }
  cur.read<uint32_t>("magic");
  const uint64_t version_at = cur.offset();
  version = cur.read<uint32_t>("version");
  if (version != 2 && version != 3) {
    const bool swapped = version == 0x02000000u || version == 0x03000000u;
    cur.fail(version_at,
             "unsupported version " + std::to_string(version) +
                 (swapped ? " (a big-endian GGUF file; only little endian is supported)" : " (supported: 2, 3)"));
  }
  const uint64_t tensor_count_at = cur.offset();
  const auto tensor_count = cur.read<uint64_t>("tensor count");
  const uint64_t kv_count_at = cur.offset();
  const auto kv_count = cur.read<uint64_t>("metadata count");
  uint64_t min_bytes = 0;
  if (__builtin_mul_overflow(kv_count, min_kv_bytes, &min_bytes) || min_bytes > cur.remaining()) {
    cur.fail(kv_count_at, "metadata count " + std::to_string(kv_count) + " needs more than the " +
                              std::to_string(cur.remaining()) + " bytes that remain");
  }
  uint64_t min_tensor_bytes = 0;
  if (__builtin_mul_overflow(tensor_count, min_tensor_info_bytes, &min_tensor_bytes) ||
      __builtin_add_overflow(min_bytes, min_tensor_bytes, &min_bytes) || min_bytes > cur.remaining()) {
    cur.fail(tensor_count_at, "tensor count " + std::to_string(tensor_count) + " needs more than the " +
                                  std::to_string(cur.remaining()) + " bytes that remain");
  }

  // ---- metadata ----
  for (uint64_t k = 0; k < kv_count; ++k) {
    const uint64_t key_at = cur.offset();
    std::string key = cur.read_string([&] { return "key of metadata entry " + std::to_string(k); }, max_key_bytes);
    if (key.empty()) cur.fail(key_at, "metadata entry " + std::to_string(k) + " has an empty key");
    if (im.kv_index.count(key) != 0) cur.fail(key_at, "duplicate key '" + key + "'");
    const gguf_value_type type = p.read_value_type(key, "value type");
    const uint64_t value_at = cur.offset();
    gguf_value value = p.read_value(type, key, 0);
    im.kvs.push_back({std::move(key), std::move(value), value_at});
    // kvs is a deque: push_back never moves earlier elements, so the views stay valid.
    im.kv_index.emplace(im.kvs.back().key, im.kvs.size() - 1);
  }

  alignment = default_alignment;
  if (auto it = im.kv_index.find("general.alignment"); it != im.kv_index.end()) {
    const gguf_file::impl::kv_entry& kv = im.kvs[it->second];
    const gguf_value& v = kv.value;
    if (!is_integer(v.type)) {
      cur.fail(kv.value_offset, std::string("general.alignment has type ") +
                                    value_type_name(static_cast<uint32_t>(v.type)) + ", expected an integer");
    }
    const uint64_t a = v.type == gguf_value_type::u64 ? v.u : (v.i > 0 ? static_cast<uint64_t>(v.i) : 0);
    if (a == 0 || (a & (a - 1)) != 0) {
      cur.fail(kv.value_offset, "general.alignment " +
                                    (v.type == gguf_value_type::u64 ? std::to_string(v.u) : std::to_string(v.i)) +
                                    " is not a non-zero power of two");
    }
    // Larger alignments are legal but absurd; refusing them keeps padding arithmetic trivially safe.
    if (a > (uint64_t{1} << 30)) {
      cur.fail(kv.value_offset, "general.alignment " + std::to_string(a) + " exceeds the limit of 2^30");
    }
    alignment = a;
  }

  // ---- tensor infos ----
  // Not reserved from the (hostile) count: the vector grows with what was actually parsed.
  std::vector<uint64_t> info_offsets;
  for (uint64_t t = 0; t < tensor_count; ++t) {
    const uint64_t info_at = cur.offset();
    gguf_tensor_info info;
    info.name = cur.read_string([&] { return "name of tensor " + std::to_string(t); }, max_key_bytes);
    if (info.name.empty()) cur.fail(info_at, "tensor " + std::to_string(t) + " has an empty name");
    const std::string who = "tensor '" + info.name + "'";
    const uint64_t ndims_at = cur.offset();
    const auto n_dims = cur.read<uint32_t>("n_dims");
    if (n_dims < 1 || n_dims > max_dims) {
      cur.fail(ndims_at, who + ": n_dims " + std::to_string(n_dims) + " is not in 1..4");
    }
    int64_t num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim_at = cur.offset();
      const auto ne = cur.read<uint64_t>("tensor dimension");
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        cur.fail(dim_at,
                 who + ": dimension " + std::to_string(d) + " is " + std::to_string(ne) + " (must be in 1..2^63-1)");
      }
      if (__builtin_mul_overflow(num_elements, static_cast<int64_t>(ne), &num_elements)) {
        cur.fail(dim_at,
                 who + ": element count overflows (dimension " + std::to_string(d) + " is " + std::to_string(ne) + ")");
      }
      info.dims.push_back(static_cast<int64_t>(ne));
    }
    info.num_elements = num_elements;
    const uint64_t type_at = cur.offset();
    const auto raw_type = cur.read<uint32_t>("tensor type");
    const ggml_type_info* ti = find_type_info(raw_type);
    if (ti == nullptr) cur.fail(type_at, who + ": unknown ggml type " + std::to_string(raw_type));
    info.type = ti->type;
    const int64_t rb = row_bytes(info.type, info.dims[0]);
    if (rb < 0 && info.dims[0] % ti->block_elems == 0) cur.fail(type_at, who + ": byte size overflows");
    if (rb < 0) {
      cur.fail(type_at, who + ": row length " + std::to_string(info.dims[0]) + " is not a multiple of the " +
                            std::string(ti->name) + " block size " + std::to_string(ti->block_elems));
    }
    int64_t num_bytes = 0;
    if (__builtin_mul_overflow(rb, num_elements / info.dims[0], &num_bytes)) {
      cur.fail(type_at, who + ": byte size overflows");
    }
    info.num_bytes = static_cast<uint64_t>(num_bytes);
    const uint64_t offset_at = cur.offset();
    info.offset = cur.read<uint64_t>("tensor offset");
    if (info.offset % alignment != 0) {
      cur.fail(offset_at, who + ": data offset " + std::to_string(info.offset) +
                              " is not a multiple of the alignment " + std::to_string(alignment));
    }
    tensors.push_back(std::move(info));
    info_offsets.push_back(info_at);
  }
  // Indexed once the vector has stopped growing (the views point into its names).
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!im.tensor_index.emplace(tensors[i].name, i).second) {
      cur.fail(info_offsets[i], "duplicate tensor name '" + tensors[i].name + "'");
    }
  }

  // ---- data section ----
  const uint64_t infos_end = cur.offset();
  uint64_t data_start = 0;
  if (__builtin_add_overflow(infos_end, (alignment - infos_end % alignment) % alignment, &data_start)) {
    cur.fail(infos_end, "data section start overflows");
  }
  if (tensors.empty()) return;
  if (data_start > cur.size()) {
    cur.fail(infos_end, "file truncated: the tensor data section would start at " + std::to_string(data_start) +
                            ", past the end of the file (" + std::to_string(cur.size()) + " bytes)");
  }
  const uint64_t data_size = cur.size() - data_start;

  // Each tensor must lie inside the data section, and no two may overlap: sort by offset and
  // compare neighbours.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (const auto& t : tensors) {
    uint64_t end = 0;
    if (__builtin_add_overflow(t.offset, t.num_bytes, &end) || end > data_size) {
      throw load_error("GGUF: tensor '" + t.name + "' " + format_dims(t.dims) + " of " + std::to_string(t.num_bytes) +
                       " bytes at data offset " + std::to_string(t.offset) + " (file offset " +
                       std::to_string(data_start) + " + " + std::to_string(t.offset) +
                       ") runs past the end of the file (" + std::to_string(cur.size()) + " bytes)");
    }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = tensors[order[i - 1]];
    const auto& next = tensors[order[i]];
    if (prev.offset + prev.num_bytes > next.offset) {
      throw load_error("GGUF: tensor '" + next.name + "' at data offset " + std::to_string(next.offset) +
                       " overlaps tensor '" + prev.name + "' (data offsets " + std::to_string(prev.offset) + ".." +
                       std::to_string(prev.offset + prev.num_bytes) + ")");
    }
  }
  for (auto& t : tensors) t.data = image.data() + data_start + t.offset;
}

std::shared_ptr<const gguf_file> gguf_file::from_bytes(std::span<const std::byte> bytes) {
  std::shared_ptr<gguf_file> f(new gguf_file());
  f->impl_ = std::make_unique<impl>();
  f->impl_->bytes.copy(bytes);
  parse_image(*f->impl_, f->impl_->bytes.span(), f->version_, f->alignment_, f->tensors_);
  return f;
}

std::shared_ptr<const gguf_file> gguf_file::open(const std::filesystem::path& path) {
  const std::string where = path.string();
  // Refuses FIFOs, devices and directories without blocking (engine/base/regular_file.hpp).
  const regular_file file = regular_file::open(path);
  const uint64_t size = file.size();
  if (size < 4 + 4 + 8 + 8) {
    throw load_error(where + ": GGUF: file truncated: " + std::to_string(size) +
                     " bytes is smaller than the 24-byte header (at offset 0)");
  }
  // The mapping keeps its own reference to the file; `file` closes the descriptor on return.
  void* addr = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (addr == MAP_FAILED) throw load_error(where + ": cannot mmap: " + std::strerror(errno));

  std::shared_ptr<gguf_file> f(new gguf_file());
  f->impl_ = std::make_unique<impl>();
  f->impl_->bytes.map(addr, static_cast<size_t>(size));
  f->path_ = path;
  try {
    parse_image(*f->impl_, f->impl_->bytes.span(), f->version_, f->alignment_, f->tensors_);
  } catch (const load_error& e) { throw load_error(where + ": " + e.what()); }
  return f;
}

// ---- metadata access ------------------------------------------------------------------------

const gguf_value* gguf_file::find(std::string_view key) const noexcept {
  auto it = impl_->kv_index.find(key);
  return it == impl_->kv_index.end() ? nullptr : &impl_->kvs[it->second].value;
}

std::vector<std::string> gguf_file::keys() const {
  std::vector<std::string> out;
  out.reserve(impl_->kvs.size());
  for (const auto& kv : impl_->kvs) out.push_back(kv.key);
  return out;
}

namespace {
[[noreturn]] void wrong_type(std::string_view key, const gguf_value& v, const char* expected) {
  std::string got = value_type_name(static_cast<uint32_t>(v.type));
  if (v.type == gguf_value_type::array)
    got += std::string(" of ") + value_type_name(static_cast<uint32_t>(v.elem_type));
  throw load_error("GGUF: key '" + std::string(key) + "' has type " + got + ", expected " + expected);
}
}  // namespace

std::optional<std::string> gguf_file::get_string(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != gguf_value_type::string) wrong_type(key, *v, "string");
  return v->s;
}

std::optional<int64_t> gguf_file::get_int(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!is_integer(v->type)) wrong_type(key, *v, "an integer");
  if (v->type == gguf_value_type::u64 && v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw load_error("GGUF: key '" + std::string(key) + "' value " + std::to_string(v->u) + " does not fit in int64");
  }
  return v->i;
}

std::optional<double> gguf_file::get_float(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (is_float(v->type)) return v->f;
  if (v->type == gguf_value_type::u64) return static_cast<double>(v->u);
  if (is_integer(v->type)) return static_cast<double>(v->i);
  wrong_type(key, *v, "a number");
}

std::optional<bool> gguf_file::get_bool(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != gguf_value_type::boolean) wrong_type(key, *v, "bool");
  return v->b;
}

const std::vector<std::string>* gguf_file::get_string_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return nullptr;
  if (v->type != gguf_value_type::array || v->elem_type != gguf_value_type::string) {
    wrong_type(key, *v, "array of string");
  }
  return &v->strings;
}

const std::vector<int64_t>* gguf_file::get_int_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return nullptr;
  if (v->type != gguf_value_type::array || !is_integer(v->elem_type)) wrong_type(key, *v, "array of integers");
  return &v->ints;
}

const std::vector<double>* gguf_file::get_float_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return nullptr;
  if (v->type != gguf_value_type::array || !is_float(v->elem_type)) wrong_type(key, *v, "array of floats");
  return &v->floats;
}

namespace {
std::string describe_value(const gguf_value& v) {
  constexpr size_t max_shown = 8;
  std::ostringstream out;
  switch (v.type) {
    case gguf_value_type::string: return quote_string(v.s);
    case gguf_value_type::boolean: return v.b ? "true" : "false";
    case gguf_value_type::f32:
    case gguf_value_type::f64: out << v.f; return out.str();
    case gguf_value_type::u64: return std::to_string(v.u);
    case gguf_value_type::array: {
      out << "[";
      const size_t n = static_cast<size_t>(v.array_size);
      for (size_t i = 0; i < n && i < max_shown; ++i) {
        if (i) out << ", ";
        if (is_integer(v.elem_type))
          out << v.ints[i];
        else if (v.elem_type == gguf_value_type::boolean)
          out << (v.ints[i] ? "true" : "false");
        else if (is_float(v.elem_type))
          out << v.floats[i];
        else if (v.elem_type == gguf_value_type::string)
          out << quote_string(v.strings[i], 40);
        else
          out << describe_value(v.arrays[i]);
      }
      if (n > max_shown) out << ", ... (" << n << " elements)";
      out << "]";
      return out.str();
    }
    default: return std::to_string(v.i);
  }
}
}  // namespace

std::string gguf_file::describe(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return "(absent)";
  return describe_value(*v);
}

const gguf_tensor_info* gguf_file::tensor(std::string_view name) const noexcept {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &tensors_[it->second];
}

}  // namespace tessera
