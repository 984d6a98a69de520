// The CUDA runtime API of the CPU emulation (tests/cuda_emu/runtime_api.hpp): one emulated device, shaped
// like an H200 (132 SMs, 227 KiB of opt-in shared memory per block).
//
// Memory: cudaMalloc'd memory is host memory, tracked, so that cudaFree of a pointer that is not a
// live allocation, a copy or memset that runs past an allocation, a kernel pointer argument that is
// not inside a live allocation (e.g. a stale pointer replayed by a graph), and leaks are reported.
// The emulated device has TESSERA_EMU_DEVICE_MEMORY bytes (default 16 GiB; suffixes K, M, G), which
// cudaMemGetInfo reports and cudaMalloc enforces. Allocations up to 64 MiB start filled with 0xFF
// bytes (NaN as floats or bf16) so that reading memory nobody wrote shows.
//
// Work runs in the calling thread: at once on the legacy default stream, and, on created streams,
// when something waits for it (deferred streams, below); cudaEventElapsedTime is the wall time
// between the two records running. Stream capture records every launch,
// copy, memset and cuBLAS call into a graph instead of running it; cudaGraphLaunch replays them in
// order (re-checking copy ranges and kernel pointer arguments). While a thread captures in global or
// thread-local mode, the calls CUDA forbids then (cudaMalloc, cudaFree, synchronous copies,
// synchronisation) fail with cudaErrorStreamCaptureUnsupported and invalidate the capture, as on a GPU.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "emulator.hpp"
#include "include/cuda_emu/launch.hpp"
#include "runtime_internal.hpp"
#include "scheduler.hpp"

namespace tessera::gpu::emu {
namespace {

using clock = std::chrono::steady_clock;

constexpr size_t kPoisonLimit = size_t{64} << 20;
constexpr size_t kStaticSharedLimit = 48 * 1024;
constexpr int kSharedOptin = 232448;  // 227 KiB, sm_90

size_t parse_bytes(const char* v, size_t fallback) {
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double n = std::strtod(v, &end);
  if (end == v || n <= 0) return fallback;
  double scale = 1;
  if (*end == 'K' || *end == 'k') scale = 1024.0;
  if (*end == 'M' || *end == 'm') scale = 1024.0 * 1024;
  if (*end == 'G' || *end == 'g') scale = 1024.0 * 1024 * 1024;
  return static_cast<size_t>(n * scale);
}

size_t device_limit() {
  static const size_t limit = parse_bytes(std::getenv("TESSERA_EMU_DEVICE_MEMORY"), size_t{16} << 30);
  return limit;
}

// Every allocation has its own mapping, placed so that its last byte (rounded to 16) is followed
// by an inaccessible guard page, with another guard page before it: a kernel that reads or writes
// past either end faults at once, and the SIGSEGV handler below names the allocation. Freed mappings
// stay inaccessible for a while (quarantine), so a use after cudaFree faults too.
struct allocation {
  size_t bytes = 0;      // accessible: the request rounded up to 16
  size_t accounted = 0;  // what cudaMemGetInfo counts: rounded up to 256, as CUDA's granularity
  bool device = true;
  char* map = nullptr;  // the whole mapping, guard pages included
  size_t map_bytes = 0;
};

struct state {
  std::mutex mu;
  std::map<uintptr_t, allocation> allocs;
  std::deque<std::pair<uintptr_t, size_t>> quarantine;  // freed mappings, oldest first
  size_t quarantine_bytes = 0;
  size_t device_bytes = 0, host_bytes = 0, device_count = 0, host_count = 0;
  std::set<const void*> streams, events, graphs, execs;
  std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute
  int largest_dynamic_shared = 0;
  std::atomic<int> global_captures{0};

  ~state() {
    if (device_count + host_count > 0) {
      std::fprintf(
          stderr,
          "gpu emulation: at exit, %zu device allocation(s) (%zu bytes) and %zu host allocation(s) (%zu bytes) "
          "were never freed\n",
          device_count, device_bytes, host_count, host_bytes);
    }
  }
};

void on_segv(int sig, siginfo_t* info, void* ctx);

state& g() {
  static state s;
  static const bool handler = [] {
    // The guard pages turn an out-of-bounds access into SIGSEGV: say which allocation it missed.
    struct sigaction sa {};
    sa.sa_sigaction = &on_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    return true;
  }();
  (void)handler;
  return s;
}

void on_segv(int, siginfo_t* info, void*) {
  // Crash path (the process dies right after): no locks, best-effort formatting.
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  char msg[1024];
  int n = 0;
  const std::string who = describe_running_thread();
  const char* what =
      "a segmentation fault outside every emulated allocation (a wild pointer, or a fiber stack overflow: "
      "TESSERA_EMU_STACK_KIB)";
  static state& st = g();
  for (const auto& [base, a] : st.allocs) {
    const auto map = reinterpret_cast<uintptr_t>(a.map);
    if (addr < map || addr >= map + a.map_bytes) continue;
    if (addr >= base + a.bytes) {
      n = std::snprintf(
          msg, sizeof msg,
          "gpu emulation: %s accessed %#lx, %lu bytes past the end of a %zu-byte %s allocation [%#lx, +%zu)\n",
          who.c_str(), static_cast<unsigned long>(addr), static_cast<unsigned long>(addr - (base + a.bytes)), a.bytes,
          a.device ? "device" : "pinned host", static_cast<unsigned long>(base), a.bytes);
    } else {
      n = std::snprintf(
          msg, sizeof msg,
          "gpu emulation: %s accessed %#lx, %lu bytes before the start of a %zu-byte %s allocation [%#lx, +%zu)\n",
          who.c_str(), static_cast<unsigned long>(addr), static_cast<unsigned long>(base - addr), a.bytes,
          a.device ? "device" : "pinned host", static_cast<unsigned long>(base), a.bytes);
    }
    break;
  }
  if (n == 0) {
    for (const auto& [base, len] : st.quarantine) {
      if (addr >= base && addr < base + len) {
        n = std::snprintf(msg, sizeof msg,
                          "gpu emulation: %s accessed %#lx in memory already given back with cudaFree/cudaFreeHost\n",
                          who.c_str(), static_cast<unsigned long>(addr));
        break;
      }
    }
  }
  if (n == 0)
    n = std::snprintf(msg, sizeof msg, "gpu emulation: %s: %s at %#lx\n", who.c_str(), what,
                      static_cast<unsigned long>(addr));
  if (n > 0) (void)!write(2, msg, static_cast<size_t>(std::min<int>(n, sizeof msg - 1)));
  // SA_RESETHAND restored the default action: returning re-runs the access, which now kills us.
}

thread_local cudaError_t tl_last_error = cudaSuccess;

size_t page_size() {
  static const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

cudaError_t fail(cudaError_t e, const std::string& why) {
  tl_last_error = e;
  std::fprintf(stderr, "gpu emulation: %s: %s\n", cudaGetErrorName(e), why.c_str());
  return e;
}

}  // namespace
}  // namespace tessera::gpu::emu

// ---- handles ---------------------------------------------------------------------------------

struct tessera_emu_op {
  std::string what;
  std::function<void()> run;
};

struct tessera_emu_capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::string why;
  std::vector<tessera_emu_op> ops;
};

struct tessera_emu_queued {
  uint64_t seq = 0;
  std::function<void()> run;
};

struct CUstream_st {
  unsigned int flags = 0;
  std::unique_ptr<tessera_emu_capture> capture;
  // Deferred work (non-legacy streams), oldest first, and the sequence number of the last enqueued.
  std::deque<tessera_emu_queued> queue;
  uint64_t last_seq = 0;
};
struct CUevent_st {
  unsigned int flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
  const tessera_emu_capture* captured_in = nullptr;
  // A record still queued on `stream` as operation `seq`.
  CUstream_st* stream = nullptr;
  uint64_t seq = 0;
};
struct CUgraph_st {
  std::vector<tessera_emu_op> ops;
};
struct CUgraphExec_st {
  std::shared_ptr<const std::vector<tessera_emu_op>> ops;
};

namespace tessera::gpu::emu {
namespace {

CUstream_st g_legacy_stream;

// Deferred streams (the default; TESSERA_EMU_STREAMS=immediate runs everything at once): work on a
// stream other than the legacy default stream is queued and runs only when something waits for it
// (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a stream that waits on an
// event recorded after it, cudaFree, a synchronous copy for blocking streams). Running it as late as
// CUDA allows makes a missing cudaStreamWaitEvent or synchronisation show as wrong results instead
// of being hidden by in-order execution.
bool deferred_streams() {
  static const bool deferred = [] {
    const char* v = std::getenv("TESSERA_EMU_STREAMS");
    return !(v && std::string(v) == "immediate");
  }();
  return deferred;
}

std::recursive_mutex g_queue_mu;

// Runs s's queued work up to and including operation `seq`.
void flush_until(CUstream_st* s, uint64_t seq) {
  std::lock_guard lock(g_queue_mu);
  while (!s->queue.empty() && s->queue.front().seq <= seq) {
    tessera_emu_queued op = std::move(s->queue.front());
    s->queue.pop_front();
    op.run();
  }
}

void flush(CUstream_st* s) { flush_until(s, ~uint64_t{0}); }

// Every stream (blocking_only: those the legacy default stream synchronises with).
void flush_streams(bool blocking_only) {
  std::lock_guard lock(g_queue_mu);
  for (bool again = true; again;) {
    again = false;
    std::vector<const void*> streams;
    {
      std::lock_guard glock(g().mu);
      streams.assign(g().streams.begin(), g().streams.end());
    }
    for (const void* h : streams) {
      auto* s = const_cast<CUstream_st*>(static_cast<const CUstream_st*>(h));
      if (blocking_only && (s->flags & cudaStreamNonBlocking)) continue;
      if (!s->queue.empty()) {
        flush(s);
        again = true;
      }
    }
  }
}
// The streams this thread captures on in global or thread-local mode.
thread_local std::vector<CUstream_st*> tl_strict_captures;

void invalidate(CUstream_st* s, const std::string& why) {
  if (s->capture && !s->capture->invalidated) {
    s->capture->invalidated = true;
    s->capture->why = why;
  }
}

// A call CUDA forbids while this thread captures (or any thread captures in global mode).
cudaError_t check_capture_safe(const char* call) {
  if (tl_strict_captures.empty() && g().global_captures.load() == 0) return cudaSuccess;
  const std::string why =
      std::string(call) + " while a stream is being captured (not allowed in global/thread-local capture mode)";
  for (CUstream_st* s : tl_strict_captures) invalidate(s, why);
  return fail(cudaErrorStreamCaptureUnsupported, why);
}

bool resolve_stream(cudaStream_t s, CUstream_st** out) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
    *out = &g_legacy_stream;
    return true;
  }
  std::lock_guard lock(g().mu);
  if (!g().streams.count(s)) return false;
  *out = s;
  return true;
}

// Runs `op` now, or records it when the stream is being captured.
cudaError_t enqueue(cudaStream_t stream, std::string what, std::function<void()> op) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, what + " on a stream that does not exist (destroyed?)");
  if (s->capture) {
    if (s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated, what + " on an invalidated capture");
    s->capture->ops.push_back({std::move(what), std::move(op)});
    return cudaSuccess;
  }
  if (s == &g_legacy_stream) {
    for (CUstream_st* c : tl_strict_captures) {
      if (!(c->flags & cudaStreamNonBlocking)) {  // the legacy stream would wait on the capturing stream
        invalidate(c, what + " on the legacy default stream");
        return fail(cudaErrorStreamCaptureImplicit,
                    what + " on the legacy default stream while a blocking stream is captured");
      }
    }
    flush_streams(true);  // the legacy stream waits for the blocking streams' earlier work
    op();
    return cudaSuccess;
  }
  if (!deferred_streams()) {
    op();
    return cudaSuccess;
  }
  std::lock_guard lock(g_queue_mu);
  s->queue.push_back({++s->last_seq, std::move(op)});
  return cudaSuccess;
}

// The allocation holding [p, p + bytes), if any.
const allocation* find_allocation(const void* p, size_t bytes, uintptr_t* base_out = nullptr) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto& allocs = g().allocs;
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin()) return nullptr;
  --it;
  if (a < it->first || a + bytes > it->first + it->second.bytes || a + bytes < a) return nullptr;
  if (base_out) *base_out = it->first;
  return &it->second;
}

std::string ptr_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Empty when [p, p + bytes) lies in one live allocation of the wanted kind.
std::string check_range(const void* p, size_t bytes, bool want_device, const char* role) {
  if (bytes == 0) return {};
  std::lock_guard lock(g().mu);
  uintptr_t base = 0;
  const allocation* a = find_allocation(p, 1, &base);
  if (!a)
    return std::string(role) + " " + ptr_text(p) + " is not inside a live " + (want_device ? "cudaMalloc" : "") +
           " allocation";
  if (want_device && !a->device)
    return std::string(role) + " " + ptr_text(p) + " is pinned host memory, not device memory";
  if (reinterpret_cast<uintptr_t>(p) + bytes > base + a->bytes) {
    return std::string(role) + " range [" + ptr_text(p) + ", +" + std::to_string(bytes) + ") runs " +
           std::to_string(reinterpret_cast<uintptr_t>(p) + bytes - (base + a->bytes)) + " bytes past the end of its " +
           std::to_string(a->bytes) + "-byte allocation";
  }
  return {};
}

bool is_device_memory(const void* p) {
  std::lock_guard lock(g().mu);
  const allocation* a = find_allocation(p, 1);
  return a && a->device;
}

cudaError_t allocate(void** ptr, size_t bytes, bool device, const char* call) {
  if (!ptr) return fail(cudaErrorInvalidValue, std::string(call) + " with a null result pointer");
  *ptr = nullptr;
  if (const cudaError_t e = check_capture_safe(call); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  const size_t accessible = (bytes + 15) / 16 * 16;
  const size_t rounded = (bytes + 255) / 256 * 256;
  {
    std::lock_guard lock(g().mu);
    if (device && g().device_bytes + rounded > device_limit()) {
      return fail(cudaErrorMemoryAllocation,
                  std::string(call) + " of " + std::to_string(bytes) + " bytes: the emulated device has " +
                      std::to_string(device_limit() - g().device_bytes) + " bytes free (TESSERA_EMU_DEVICE_MEMORY)");
    }
  }
  const size_t page = page_size();
  const size_t data_bytes = (accessible + page - 1) / page * page;
  const size_t map_bytes = data_bytes + 2 * page;
  void* m = mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED || mprotect(static_cast<char*>(m) + page, data_bytes, PROT_READ | PROT_WRITE) != 0) {
    if (m != MAP_FAILED) munmap(m, map_bytes);
    return fail(cudaErrorMemoryAllocation,
                std::string(call) + " of " + std::to_string(bytes) + " bytes: host mapping failed");
  }
  auto* map = static_cast<char*>(m);
  char* p = map + page + data_bytes - accessible;
  // Fresh memory reads as 0xFF bytes (NaN as fp32 and bf16): a kernel that uses memory nobody wrote
  // gets NaNs, not a friendly zero. Huge allocations (a KV pool sized from the device's memory) are
  // left as the kernel's zero pages: writing them all would commit them.
  if (accessible <= kPoisonLimit) std::memset(p, 0xFF, accessible);
  std::lock_guard lock(g().mu);
  g().allocs[reinterpret_cast<uintptr_t>(p)] = {accessible, rounded, device, map, map_bytes};
  (device ? g().device_bytes : g().host_bytes) += rounded;
  ++(device ? g().device_count : g().host_count);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t release(void* p, bool device, const char* call) {
  if (!p) return cudaSuccess;
  if (const cudaError_t e = check_capture_safe(call); e != cudaSuccess) return e;
  allocation a;
  {
    std::lock_guard lock(g().mu);
    auto it = g().allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == g().allocs.end() || it->second.device != device) {
      return fail(device ? cudaErrorInvalidDevicePointer : cudaErrorInvalidValue,
                  std::string(call) + "(" + ptr_text(p) + "): not the start of a live " +
                      (device ? "cudaMalloc" : "cudaHostAlloc/cudaMallocHost") +
                      " allocation (double free or wrong pointer)");
    }
    a = it->second;
    g().allocs.erase(it);
    (device ? g().device_bytes : g().host_bytes) -= a.accounted;
    --(device ? g().device_count : g().host_count);
    // Quarantine: inaccessible until enough newer frees push it out (up to 4 GiB of address space).
    mprotect(a.map, a.map_bytes, PROT_NONE);
    g().quarantine.push_back({reinterpret_cast<uintptr_t>(a.map), a.map_bytes});
    g().quarantine_bytes += a.map_bytes;
    while (g().quarantine_bytes > (size_t{4} << 30)) {
      const auto [base, len] = g().quarantine.front();
      munmap(reinterpret_cast<void*>(base), len);
      g().quarantine_bytes -= len;
      g().quarantine.pop_front();
    }
  }
  return cudaSuccess;
}

cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* call) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection, call);
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ||
                          (kind == cudaMemcpyDefault && is_device_memory(dst));
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ||
                          (kind == cudaMemcpyDefault && is_device_memory(src));
  std::string why;
  if (dst_device) why = check_range(dst, bytes, true, "destination");
  if (why.empty() && src_device) why = check_range(src, bytes, true, "source");
  if (why.empty() && !dst_device && bytes > 0 && is_device_memory(dst))
    why = "destination is device memory but the kind says host";
  if (why.empty() && !src_device && bytes > 0 && is_device_memory(src))
    why = "source is device memory but the kind says host";
  if (!why.empty()) return fail(cudaErrorInvalidValue, std::string(call) + ": " + why);
  return cudaSuccess;
}

}  // namespace

// ---- shared with cublas.cpp and launch -------------------------------------------------------

cudaError_t enqueue_work(cudaStream_t stream, std::string what, std::function<void()> op) {
  return enqueue(stream, std::move(what), std::move(op));
}

std::string check_device_range(const void* p, size_t bytes, const char* role) {
  if (bytes == 0) return {};
  std::lock_guard lock(g().mu);
  uintptr_t base = 0;
  const allocation* a = find_allocation(p, 1, &base);
  if (!a) return std::string(role) + " " + ptr_text(p) + " is not inside a live cudaMalloc/cudaHostAlloc allocation";
  if (reinterpret_cast<uintptr_t>(p) + bytes > base + a->bytes) {
    return std::string(role) + " [" + ptr_text(p) + ", +" + std::to_string(bytes) +
           " bytes) runs past the end of its " + std::to_string(a->bytes) + "-byte allocation";
  }
  return {};
}

cudaError_t report(cudaError_t e, const std::string& why) { return fail(e, why); }

namespace {

void check_kernel_pointers(const launch_config& c, const std::vector<const void*>& pointers, const char* when) {
  for (size_t i = 0; i < pointers.size(); ++i) {
    const void* p = pointers[i];
    if (!p) continue;
    std::lock_guard lock(g().mu);
    if (!find_allocation(p, 1)) {
      throw std::logic_error(std::string("gpu emulation: kernel ") + c.kernel + when + ": pointer argument " +
                             std::to_string(i + 1) + " (" + ptr_text(p) +
                             ") is not inside a live cudaMalloc/cudaHostAlloc allocation (freed, host memory, "
                             "or out of range)");
    }
  }
}

}  // namespace

void launch(const launch_config& c, std::function<void()> thread_body, std::vector<const void*> pointers) {
  const dim3 b = c.block, gr = c.grid;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  std::string why;
  if (b.x == 0 || b.y == 0 || b.z == 0 || gr.x == 0 || gr.y == 0 || gr.z == 0) {
    why = "a zero grid or block dimension";
  } else if (b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024) {
    why = "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
          ") has more than 1024 threads or a dimension over its limit";
  } else if (gr.x > 2147483647u || gr.y > 65535 || gr.z > 65535) {
    why =
        "grid (" + std::to_string(gr.x) + "," + std::to_string(gr.y) + "," + std::to_string(gr.z) + ") over its limits";
  }
  cudaError_t err = why.empty() ? cudaSuccess : cudaErrorInvalidConfiguration;
  if (err == cudaSuccess && c.shared_bytes > kStaticSharedLimit) {
    std::lock_guard lock(g().mu);
    if (c.shared_bytes > static_cast<size_t>(kSharedOptin)) {
      why = std::to_string(c.shared_bytes) + " bytes of dynamic shared memory (the device allows " +
            std::to_string(kSharedOptin) + ")";
      err = cudaErrorInvalidValue;
    } else if (static_cast<size_t>(g().largest_dynamic_shared) < c.shared_bytes) {
      // The emulator cannot tell which kernel a launch runs (only its text), so any kernel's attribute
      // counts: a real GPU is stricter (per kernel).
      why = std::to_string(c.shared_bytes) +
            " bytes of dynamic shared memory without cudaFuncSetAttribute(kernel, "
            "cudaFuncAttributeMaxDynamicSharedMemorySize, n)";
      err = cudaErrorInvalidValue;
    }
  }
  if (err != cudaSuccess) {
    CUstream_st* s = nullptr;
    if (resolve_stream(c.stream, &s)) invalidate(s, std::string("invalid launch of ") + c.kernel);
    fail(err, std::string("launch of ") + c.kernel + ": " + why);
    return;
  }
  check_kernel_pointers(c, pointers, "");
  const launch_config config = c;
  enqueue(c.stream, c.kernel, [config, body = std::move(thread_body), pointers = std::move(pointers)] {
    check_kernel_pointers(config, pointers, " (when run: deferred on its stream, or replayed by a graph)");
    run_grid(config, body);
  });
}

cudaError_t set_function_attribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute of a null function");
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > kSharedOptin) {
      return fail(cudaErrorInvalidValue, "cudaFuncAttributeMaxDynamicSharedMemorySize " + std::to_string(value) +
                                             " over " + std::to_string(kSharedOptin));
    }
    std::lock_guard lock(g().mu);
    g().max_dynamic_shared[func] = value;
    g().largest_dynamic_shared = std::max(g().largest_dynamic_shared, value);
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) {
    return (value >= -1 && value <= 100) ? cudaSuccess : fail(cudaErrorInvalidValue, "carveout out of [-1, 100]");
  }
  return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute not emulated");
}

// The emulation has no register file and cannot see a kernel's static shared memory, so occupancy is
// the limits it can see: 2048 threads and 32 CTAs per SM, and 228 KiB of shared memory per SM for the
// launch's dynamic shared memory plus the 1 KiB sm_90 reserves per CTA. A real GPU's answer is at most
// this (its registers usually decide: gpu_attention_bench prints them on the device).
cudaError_t max_active_blocks_per_sm(int* blocks, const void* func, int block_size, size_t dynamic_shared) {
  if (!blocks || !func) return fail(cudaErrorInvalidValue, "cudaOccupancyMaxActiveBlocksPerMultiprocessor(nullptr)");
  if (block_size < 1 || block_size > 1024) {
    return fail(cudaErrorInvalidValue,
                "cudaOccupancyMaxActiveBlocksPerMultiprocessor: block size " + std::to_string(block_size));
  }
  constexpr int kThreadsPerSm = 2048, kCtasPerSm = 32, kSharedPerSm = 233472, kReservedPerCta = 1024;
  size_t allowed = kStaticSharedLimit;
  {
    std::lock_guard lock(g().mu);
    if (const auto it = g().max_dynamic_shared.find(func); it != g().max_dynamic_shared.end()) {
      allowed = static_cast<size_t>(it->second);
    }
  }
  if (dynamic_shared > allowed) {  // the launch would fail: no CTA fits
    *blocks = 0;
    return cudaSuccess;
  }
  const int warps = (block_size + 31) / 32;
  const auto by_shared = static_cast<int>(kSharedPerSm / (dynamic_shared + kReservedPerCta));
  *blocks = std::min({kThreadsPerSm / (32 * warps), kCtasPerSm, by_shared});
  return cudaSuccess;
}

memory_stats memory() {
  std::lock_guard lock(g().mu);
  memory_stats m;
  m.device_bytes = g().device_bytes;
  m.device_allocations = g().device_count;
  m.host_bytes = g().host_bytes;
  m.host_allocations = g().host_count;
  m.device_limit = device_limit();
  return m;
}

}  // namespace tessera::gpu::emu

using namespace tessera::gpu::emu;

// ---- errors ----------------------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
#define TESSERA_EMU_NAME(e) \
  case e: return #e;
    TESSERA_EMU_NAME(cudaSuccess)
    TESSERA_EMU_NAME(cudaErrorInvalidValue)
    TESSERA_EMU_NAME(cudaErrorMemoryAllocation)
    TESSERA_EMU_NAME(cudaErrorInitializationError)
    TESSERA_EMU_NAME(cudaErrorInvalidConfiguration)
    TESSERA_EMU_NAME(cudaErrorInvalidDevicePointer)
    TESSERA_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    TESSERA_EMU_NAME(cudaErrorNoDevice)
    TESSERA_EMU_NAME(cudaErrorInvalidDevice)
    TESSERA_EMU_NAME(cudaErrorInvalidResourceHandle)
    TESSERA_EMU_NAME(cudaErrorIllegalState)
    TESSERA_EMU_NAME(cudaErrorNotReady)
    TESSERA_EMU_NAME(cudaErrorIllegalAddress)
    TESSERA_EMU_NAME(cudaErrorLaunchOutOfResources)
    TESSERA_EMU_NAME(cudaErrorLaunchFailure)
    TESSERA_EMU_NAME(cudaErrorNotSupported)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureUnsupported)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureInvalidated)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureMerge)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureUnmatched)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureUnjoined)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureIsolation)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureImplicit)
    TESSERA_EMU_NAME(cudaErrorCapturedEvent)
    TESSERA_EMU_NAME(cudaErrorStreamCaptureWrongThread)
    TESSERA_EMU_NAME(cudaErrorUnknown)
#undef TESSERA_EMU_NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureIsolation:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return cudaGetErrorName(err);
  }
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = tl_last_error;
  tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return tl_last_error; }

// ---- device ----------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount(nullptr)");
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0
             ? cudaSuccess
             : fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): one emulated device");
}
cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue, "cudaGetDevice(nullptr)");
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute(nullptr)");
  if (device != 0) return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device " + std::to_string(device));
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 49152; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrClockRate: *value = 1980000; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMemoryClockRate: *value = 3201000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 6144; break;
    case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 233472; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kSharedOptin; break;
    default:
      return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string(attr) + " not emulated");
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties(nullptr)");
  if (device != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device " + std::to_string(device));
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "Tessera CPU emulation (H200-shaped)");
  p->totalGlobalMem = device_limit();
  p->sharedMemPerBlock = 49152;
  p->sharedMemPerBlockOptin = kSharedOptin;
  p->sharedMemPerMultiprocessor = 233472;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->clockRate = 1980000;
  p->memoryClockRate = 3201000;
  p->memoryBusWidth = 6144;
  p->l2CacheSize = 50 << 20;
  p->maxThreadsPerMultiProcessor = 2048;
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = check_capture_safe("cudaDeviceSynchronize"); e != cudaSuccess) return e;
  flush_streams(false);
  return cudaSuccess;
}
// Not emulated: a reset would have to free every allocation and handle behind the executor's back.
cudaError_t cudaDeviceReset() {
  return fail(cudaErrorNotSupported, "cudaDeviceReset is not emulated (docs/cuda_emulation.md)");
}

// ---- memory ----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) { return allocate(ptr, bytes, true, "cudaMalloc"); }
// cudaFree and cudaFreeHost synchronise the device first, as CUDA's do.
cudaError_t cudaFree(void* ptr) {
  if (ptr && tl_strict_captures.empty()) flush_streams(false);
  return release(ptr, true, "cudaFree");
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return allocate(ptr, bytes, false, "cudaMallocHost"); }
// Every flag means the same here (pinned host memory is host memory, and kernels may use it: unified
// addressing); unknown bits are an error as in CUDA.
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (flags & ~(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)) {
    return fail(cudaErrorInvalidValue, "cudaHostAlloc with unknown flags " + std::to_string(flags));
  }
  return allocate(ptr, bytes, false, "cudaHostAlloc");
}
cudaError_t cudaFreeHost(void* ptr) {
  if (ptr && tl_strict_captures.empty()) flush_streams(false);
  return release(ptr, false, "cudaFreeHost");
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaMallocAsync on a stream that does not exist");
  if (s->capture) {
    invalidate(s, "cudaMallocAsync");
    return fail(cudaErrorNotSupported, "cudaMallocAsync during stream capture is not emulated (memory nodes)");
  }
  return allocate(ptr, bytes, true, "cudaMallocAsync");
}
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaFreeAsync on a stream that does not exist");
  if (s->capture) {
    invalidate(s, "cudaFreeAsync");
    return fail(cudaErrorNotSupported, "cudaFreeAsync during stream capture is not emulated (memory nodes)");
  }
  flush(s);
  return release(ptr, true, "cudaFreeAsync");
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue, "cudaMemGetInfo(nullptr)");
  std::lock_guard lock(g().mu);
  *total_bytes = device_limit();
  *free_bytes = device_limit() - std::min(device_limit(), g().device_bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t e = check_capture_safe("cudaMemcpy"); e != cudaSuccess) return e;
  if (const cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpy"); e != cudaSuccess) return e;
  flush_streams(true);  // a synchronous copy runs on the legacy stream
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (const cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  return enqueue(stream, "cudaMemcpyAsync", [=] {
    // A replayed graph copies through the pointers it captured: they must still be valid.
    if (check_copy(dst, src, bytes, kind, "cudaMemcpyAsync (when run)") != cudaSuccess) {
      throw std::logic_error(
          "gpu emulation: a cudaMemcpyAsync copies through a stale pointer or range when it runs (deferred "
          "on its stream or replayed by a graph)");
    }
    if (bytes) std::memmove(dst, src, bytes);
  });
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (const cudaError_t e = check_capture_safe("cudaMemset"); e != cudaSuccess) return e;
  if (const std::string why = check_range(dst, bytes, true, "cudaMemset destination"); !why.empty())
    return fail(cudaErrorInvalidValue, why);
  flush_streams(true);
  if (bytes) std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (const std::string why = check_range(dst, bytes, true, "cudaMemsetAsync destination"); !why.empty()) {
    return fail(cudaErrorInvalidValue, why);
  }
  return enqueue(stream, "cudaMemsetAsync", [=] {
    if (!check_range(dst, bytes, true, "cudaMemsetAsync destination").empty()) {
      throw std::logic_error("gpu emulation: a cudaMemsetAsync writes through a stale pointer or range when it runs");
    }
    if (bytes) std::memset(dst, value, bytes);
  });
}

// ---- streams ---------------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream) return fail(cudaErrorInvalidValue, "cudaStreamCreate(nullptr)");
  if (flags & ~cudaStreamNonBlocking) {
    return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: unknown flags " + std::to_string(flags));
  }
  auto* s = new CUstream_st;
  s->flags = flags;
  std::lock_guard lock(g().mu);
  g().streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  {
    std::lock_guard lock(g().mu);
    if (!stream || !g().streams.count(stream)) {
      return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of a stream that does not exist");
    }
  }
  // Its queued work still runs (as on a GPU); flushing every stream also runs any queued wait that
  // refers to it.
  if (!stream->capture) flush_streams(false);
  {
    std::lock_guard lock(g().mu);
    if (!stream || !g().streams.count(stream)) {
      return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of a stream that does not exist");
    }
    g().streams.erase(stream);
  }
  if (stream->capture) {
    std::erase(tl_strict_captures, stream);
    if (stream->capture->mode == cudaStreamCaptureModeGlobal) --g().global_captures;
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize on a stream that does not exist");
  if (s->capture) {
    invalidate(s, "cudaStreamSynchronize");
    return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize of a stream being captured");
  }
  if (s == &g_legacy_stream) {
    if (const cudaError_t e = check_capture_safe("cudaStreamSynchronize(legacy stream)"); e != cudaSuccess) return e;
    flush_streams(true);
    return cudaSuccess;
  }
  flush(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery on a stream that does not exist");
  std::lock_guard lock(g_queue_mu);
  return s->queue.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  // cudaEventWaitExternal (a graph node waiting on an event from outside the capture) is not emulated.
  if (flags != 0) {
    return fail(cudaErrorNotSupported,
                "cudaStreamWaitEvent flags " + std::to_string(flags) + " are not emulated (only 0)");
  }
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent on a stream that does not exist");
  {
    std::lock_guard lock(g().mu);
    if (!event || !g().events.count(event))
      return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent on an event that does not exist");
  }
  if (s->capture && event->captured_in != s->capture.get()) {
    invalidate(s, "cudaStreamWaitEvent on an event from outside the capture");
    return fail(cudaErrorStreamCaptureIsolation,
                "cudaStreamWaitEvent: a captured stream waits on an event not recorded in its capture");
  }
  if (!s->capture && event->captured_in) {
    // CUDA would join this stream into the capture (fork/join across streams); the emulation captures
    // one stream per graph only, so refuse rather than run the waiting stream's work eagerly.
    return fail(cudaErrorNotSupported,
                "cudaStreamWaitEvent on an event recorded during a stream capture: joining another stream into a "
                "capture is not emulated");
  }
  if (s->capture || !event->stream) return cudaSuccess;  // in a capture, operations replay in order
  CUstream_st* src = event->stream;
  const uint64_t seq = event->seq;
  // The waiting stream's later work may run only after the event's stream reached the event.
  return enqueue(stream, "cudaStreamWaitEvent", [src, seq] { flush_until(src, seq); });
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture on a stream that does not exist");
  if (s == &g_legacy_stream)
    return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture on the legacy default stream");
  if (s->capture) return fail(cudaErrorIllegalState, "cudaStreamBeginCapture on a stream already being captured");
  s->capture = std::make_unique<tessera_emu_capture>();
  s->capture->mode = mode;
  s->capture->thread = std::this_thread::get_id();
  if (mode != cudaStreamCaptureModeRelaxed) tl_strict_captures.push_back(s);
  if (mode == cudaStreamCaptureModeGlobal) ++g().global_captures;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture on a stream that does not exist");
  if (!graph) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture(nullptr)");
  *graph = nullptr;
  if (!s->capture) return fail(cudaErrorIllegalState, "cudaStreamEndCapture on a stream that is not being captured");
  if (s->capture->mode != cudaStreamCaptureModeRelaxed && s->capture->thread != std::this_thread::get_id()) {
    return fail(cudaErrorStreamCaptureWrongThread,
                "cudaStreamEndCapture from another thread than the one that began it");
  }
  std::unique_ptr<tessera_emu_capture> c = std::move(s->capture);
  std::erase(tl_strict_captures, s);
  if (c->mode == cudaStreamCaptureModeGlobal) --g().global_captures;
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated, "the capture was invalidated by " + c->why);
  auto* gr = new CUgraph_st;
  gr->ops = std::move(c->ops);
  std::lock_guard lock(g().mu);
  g().graphs.insert(gr);
  *graph = gr;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing on a stream that does not exist");
  if (!status) return fail(cudaErrorInvalidValue, "cudaStreamIsCapturing(nullptr)");
  *status = !s->capture
                ? cudaStreamCaptureStatusNone
                : (s->capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive);
  return cudaSuccess;
}

// ---- events ----------------------------------------------------------------------------------

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event) return fail(cudaErrorInvalidValue, "cudaEventCreate(nullptr)");
  // cudaEventInterprocess and any other flag: not emulated.
  if (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) {
    return fail(cudaErrorNotSupported,
                "cudaEventCreateWithFlags: flags " + std::to_string(flags) + " are not emulated");
  }
  auto* e = new CUevent_st;
  e->flags = flags;
  std::lock_guard lock(g().mu);
  g().events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  {
    std::lock_guard lock(g().mu);
    if (!event || !g().events.count(event))
      return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy of an event that does not exist");
  }
  if (event->stream) flush_until(event->stream, event->seq);  // its queued record refers to it
  std::lock_guard lock(g().mu);
  g().events.erase(event);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  {
    std::lock_guard lock(g().mu);
    if (!event || !g().events.count(event))
      return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord of an event that does not exist");
  }
  CUstream_st* s = nullptr;
  if (!resolve_stream(stream, &s))
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord on a stream that does not exist");
  if (s->capture) {
    event->captured_in = s->capture.get();
    return cudaSuccess;
  }
  event->captured_in = nullptr;
  if (s == &g_legacy_stream || !deferred_streams()) {
    flush_streams(true);
    event->stream = nullptr;
    event->recorded = true;
    event->when = clock::now();
    return cudaSuccess;
  }
  std::lock_guard lock(g_queue_mu);
  event->recorded = false;
  event->stream = s;
  event->seq = ++s->last_seq;
  s->queue.push_back({event->seq, [event] {
                        event->stream = nullptr;
                        event->recorded = true;
                        event->when = clock::now();
                      }});
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  {
    std::lock_guard lock(g().mu);
    if (!event || !g().events.count(event))
      return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize of an event that does not exist");
  }
  if (event->stream) flush_until(event->stream, event->seq);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  {
    std::lock_guard lock(g().mu);
    if (!event || !g().events.count(event))
      return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery of an event that does not exist");
  }
  return event->stream ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime(nullptr)");
  std::lock_guard lock(g().mu);
  if (!start || !end || !g().events.count(start) || !g().events.count(end)) {
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event that does not exist");
  }
  if ((start->flags | end->flags) & cudaEventDisableTiming) {
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event created with cudaEventDisableTiming");
  }
  if (start->stream || end->stream)
    return fail(cudaErrorNotReady, "cudaEventElapsedTime of an event whose record has not run yet");
  if (!start->recorded || !end->recorded)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event never recorded");
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

// ---- graphs ----------------------------------------------------------------------------------

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (!exec) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate(nullptr)");
  // Auto-free on launch, device launch, upload, node priorities: not emulated.
  if (flags != 0) {
    return fail(cudaErrorNotSupported,
                "cudaGraphInstantiate flags " + std::to_string(flags) + " are not emulated (only 0)");
  }
  std::lock_guard lock(g().mu);
  if (!graph || !g().graphs.count(graph))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphInstantiate of a graph that does not exist");
  auto* x = new CUgraphExec_st;
  x->ops = std::make_shared<const std::vector<tessera_emu_op>>(graph->ops);
  g().execs.insert(x);
  *exec = x;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::shared_ptr<const std::vector<tessera_emu_op>> ops;
  {
    std::lock_guard lock(g().mu);
    if (!exec || !g().execs.count(exec))
      return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch of a graph exec that does not exist");
    ops = exec->ops;
  }
  return enqueue(stream, "cudaGraphLaunch", [ops] {
    for (const tessera_emu_op& op : *ops) op.run();
  });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard lock(g().mu);
  if (!exec || !g().execs.count(exec))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphExecDestroy of a graph exec that does not exist");
  g().execs.erase(exec);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard lock(g().mu);
  if (!graph || !g().graphs.count(graph))
    return fail(cudaErrorInvalidResourceHandle, "cudaGraphDestroy of a graph that does not exist");
  g().graphs.erase(graph);
  delete graph;
  return cudaSuccess;
}
