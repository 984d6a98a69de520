// Linked into a test binary, replaces the global operator new and delete: every heap block gets pages
// of its own, with an inaccessible (PROT_NONE) page right after its last byte, or, with
// TESSERA_GUARD_PAGES=before, right before its first byte. A read or write past either end of a
// std::vector a kernel is handed faults on the spot, in a build without any sanitizer: the CPU
// kernels are built uninstrumented in the sanitizer builds (cmake/sanitizers.cmake), and this is what
// checks their memory accesses instead (tests/CMakeLists.txt, guard_pages:*). The technique is
// Electric Fence's (Bruce Perens, 1987).
//
// Placement "after" puts the block's end exactly at the guard page, so its start is only as aligned
// as its size allows: the largest power of two dividing the size, at most 16. An array of T has a size
// that is a multiple of alignof(T), so every array gets its type's alignment (the standard asks 16 of
// plain operator new whatever the type; no type in these tests needs more than its own alignment, and
// over-aligned types come through the align_val_t overloads, which keep their alignment).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

enum class guard_side { after, before };

guard_side side() {
  static const guard_side s = [] {
    const char* v = std::getenv("TESSERA_GUARD_PAGES");
    if (v == nullptr || std::strcmp(v, "after") == 0) return guard_side::after;
    if (std::strcmp(v, "before") == 0) return guard_side::before;
    std::fprintf(stderr, "TESSERA_GUARD_PAGES must be after or before (got '%s')\n", v);
    std::abort();
  }();
  return s;
}

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Where a block's mapping starts and how long it is, kept just before the block, in accessible memory:
// "after" reserves room for it in the block's own pages; "before" puts it at the end of a page of its
// own that precedes the guard page.
struct mapping_record {
  void* base;
  size_t length;
};
constexpr size_t k_record_room = 64;  // >= sizeof(mapping_record), a multiple of every alignment used

void* guarded_alloc(size_t size, size_t alignment) {
  const size_t page = page_size();
  if (alignment > page) return nullptr;
  const size_t bytes = size == 0 ? 1 : size;
  size_t length = 0;
  if (side() == guard_side::after) {
    length = round_up(bytes + alignment + k_record_room, page) + page;
  } else {
    length = page + page + round_up(bytes, page);
  }
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  auto* b = static_cast<std::byte*>(base);
  std::byte* block = nullptr;
  if (side() == guard_side::after) {
    std::byte* guard = b + length - page;
    const auto start = reinterpret_cast<uintptr_t>(guard) - bytes;
    block = reinterpret_cast<std::byte*>(start & ~static_cast<uintptr_t>(alignment - 1));
    if (mprotect(guard, page, PROT_NONE) != 0) std::abort();
  } else {
    std::byte* guard = b + page;
    block = guard + page;
    if (mprotect(guard, page, PROT_NONE) != 0) std::abort();
  }
  const mapping_record record{base, length};
  std::memcpy((side() == guard_side::after ? block : b + page) - sizeof(mapping_record), &record, sizeof record);
  return block;
}

void guarded_free(void* p) {
  if (p == nullptr) return;
  auto* block = static_cast<std::byte*>(p);
  mapping_record record;
  std::memcpy(&record, (side() == guard_side::after ? block : block - page_size()) - sizeof(mapping_record),
              sizeof record);
  munmap(record.base, record.length);
}

// Plain new: as aligned as the size allows (see the top), at most 16.
size_t natural_alignment(size_t size) {
  size_t a = 1;
  while (a < 16 && size % (a * 2) == 0) a *= 2;
  return side() == guard_side::after ? a : 16;
}

void* checked(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(size_t size) { return checked(guarded_alloc(size, natural_alignment(size))); }
void* operator new[](size_t size) { return checked(guarded_alloc(size, natural_alignment(size))); }
void* operator new(size_t size, std::align_val_t al) { return checked(guarded_alloc(size, static_cast<size_t>(al))); }
void* operator new[](size_t size, std::align_val_t al) { return checked(guarded_alloc(size, static_cast<size_t>(al))); }
void* operator new(size_t size, const std::nothrow_t&) noexcept { return guarded_alloc(size, natural_alignment(size)); }
void* operator new[](size_t size, const std::nothrow_t&) noexcept {
  return guarded_alloc(size, natural_alignment(size));
}
void operator delete(void* p) noexcept { guarded_free(p); }
void operator delete[](void* p) noexcept { guarded_free(p); }
void operator delete(void* p, size_t) noexcept { guarded_free(p); }
void operator delete[](void* p, size_t) noexcept { guarded_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { guarded_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { guarded_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { guarded_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { guarded_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { guarded_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { guarded_free(p); }
