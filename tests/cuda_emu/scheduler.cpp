// The block scheduler of the CPU emulation of CUDA: every CUDA thread of a block is a fiber (its own
// stack, switched cooperatively), so a kernel written for a GPU runs unchanged: __syncthreads is a
// block barrier, warp shuffles/votes/__syncwarp are warp barriers that exchange values, and a thread
// only ever gives the OS thread up inside one of them. Blocks run one after another.
//
// What is checked (each a std::logic_error naming the kernel, the block and the source lines):
//   * deadlock: no thread can run and some have not finished (e.g. one lane waits at a shuffle for
//     lanes that wait at __syncthreads);
//   * divergent __syncthreads: the block's threads wait at different __syncthreads calls;
//   * warp collectives: lanes of one mask calling different intrinsics or masks, a lane that calls
//     with a mask without itself, a lane of the mask that has exited (undefined on a GPU);
//   * __trap().
// Threads that have exited no longer count for __syncthreads (as on the GPU).
//
// The warp matrix instructions of gpu/mma.cuh (mma.sync, ldmatrix) are warp collectives here too,
// whose arithmetic lives in warp_matrix.cpp; cp.async copies are queued per thread and performed
// by the cp.async.wait_group / wait_all that covers them (see cp_async below).
#include "scheduler.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_api.hpp"
#include "emulator.hpp"
#include "include/cuda_emu/ptx.hpp"
#include "runtime_internal.hpp"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// ---- context switching -----------------------------------------------------------------------
// x86-64: our own switch (callee-saved registers, MXCSR and the x87 control word), about 20x
// cheaper than swapcontext, which makes a system call per switch to save the signal mask. Other
// architectures use ucontext.
#if defined(__x86_64__)
extern "C" void tessera_emu_switch(void** save_sp, void* load_sp);
extern "C" void tessera_emu_fiber_start();
asm(R"(
  .text
  .p2align 4
  .globl tessera_emu_switch
  .hidden tessera_emu_switch
  .type tessera_emu_switch,@function
tessera_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tessera_emu_switch, .-tessera_emu_switch

  .p2align 4
  .globl tessera_emu_fiber_start
  .hidden tessera_emu_fiber_start
  .type tessera_emu_fiber_start,@function
tessera_emu_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size tessera_emu_fiber_start, .-tessera_emu_fiber_start
)");
#endif

namespace tessera::gpu::emu {
namespace {

struct context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

void switch_context(context& from, context& to) {
#if defined(__x86_64__)
  tessera_emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

// A fresh context that calls fn(arg) on the stack [base, base + size) when first switched to.
void make_context(context& c, char* base, size_t size, void (*fn)(void*), void* arg) {
#if defined(__x86_64__)
  auto top = reinterpret_cast<uintptr_t>(base + size) & ~uintptr_t{15};
  top -= 16;  // slack; `top` is where rsp is after the switch's `ret` (16-byte aligned for the call)
  auto* frame = reinterpret_cast<uint64_t*>(top - 72);
  uint16_t fpcw = 0;
  uint32_t mxcsr = 0;
  asm volatile("fnstcw %0" : "=m"(fpcw));
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  frame[0] = fpcw;
  frame[1] = mxcsr;
  frame[2] = 0;                                                     // r15
  frame[3] = 0;                                                     // r14
  frame[4] = reinterpret_cast<uint64_t>(fn);                        // r13
  frame[5] = reinterpret_cast<uint64_t>(arg);                       // r12
  frame[6] = 0;                                                     // rbx
  frame[7] = 0;                                                     // rbp
  frame[8] = reinterpret_cast<uint64_t>(&tessera_emu_fiber_start);  // return address
  c.sp = frame;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = base;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  // makecontext passes int arguments: split the pointer.
  const auto p = reinterpret_cast<uintptr_t>(arg);
  static void (*entry)(void*) = nullptr;
  entry = fn;
  makecontext(&c.uc, reinterpret_cast<void (*)()>(+[](unsigned lo, unsigned hi) {
    entry(reinterpret_cast<void*>((uintptr_t{hi} << 32) | lo));
  }),
              2, static_cast<unsigned>(p & 0xffffffffu), static_cast<unsigned>(p >> 32));
#endif
}

size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (end && *end == '\0' && n > 0) ? static_cast<size_t>(n) : fallback;
}

// One fiber stack: mmap'd (pages are committed only when touched) with a guard page below it, so
// a stack overflow is a segmentation fault rather than silent corruption.
class fiber_stack {
 public:
  explicit fiber_stack(size_t bytes) : bytes_(bytes) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, bytes_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("gpu emulation: cannot map a fiber stack");
    mprotect(p, page, PROT_NONE);
    map_ = static_cast<char*>(p);
    base_ = map_ + page;
    map_bytes_ = bytes_ + page;
  }
  fiber_stack(const fiber_stack&) = delete;
  fiber_stack& operator=(const fiber_stack&) = delete;
  ~fiber_stack() { munmap(map_, map_bytes_); }
  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  char* map_ = nullptr;
  char* base_ = nullptr;
  size_t map_bytes_ = 0;
};

enum class fiber_state : uint8_t { ready, at_block_barrier, at_warp, exited };

// One cp.async: `bytes` to dst, the first `src_bytes` of them from src, the rest zeros.
struct async_copy {
  char* dst = nullptr;
  const char* src = nullptr;
  int bytes = 0;
  int src_bytes = 0;
  const char* file = "";
  unsigned line = 0;
};

struct fiber {
  context ctx;
  fiber_state state = fiber_state::ready;
  uint3 tid{0, 0, 0};
  int warp = 0;
  int lane = 0;
  // Where it waits (for barrier checks and deadlock reports).
  const char* file = "";
  unsigned line = 0;
  const char* func = "";
  // Its part of a warp collective.
  warp_op op = warp_op::sync;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = 32;
  uint64_t result = 0;
  // Its part of a warp matrix instruction: its operands/results and the arithmetic.
  void* payload = nullptr;
  warp_matrix_fn complete = nullptr;
  // Its cp.async copies not performed yet, in issue order, and the committed groups among them (the
  // index one past each group's last copy, oldest group first; the copies after the last one are
  // not committed yet).
  std::vector<async_copy> copies;
  std::vector<size_t> group_ends;
};

struct warp_collective_state {
  unsigned mask = 0;
  warp_op op = warp_op::sync;
  int width = 32;
  unsigned arrived = 0;  // lanes
};

struct warp_state {
  unsigned present = 0;  // lanes that exist in this block
  unsigned exited = 0;
  std::vector<warp_collective_state> pending;  // collectives some lanes wait in (disjoint masks)
};

const char* op_name(warp_op op) {
  switch (op) {
    case warp_op::sync: return "__syncwarp";
    case warp_op::shfl_idx: return "__shfl_sync";
    case warp_op::shfl_xor: return "__shfl_xor_sync";
    case warp_op::shfl_down: return "__shfl_down_sync";
    case warp_op::shfl_up: return "__shfl_up_sync";
    case warp_op::ballot: return "__ballot_sync";
    case warp_op::any: return "__any_sync";
    case warp_op::all: return "__all_sync";
    case warp_op::reduce_add: return "__reduce_add_sync";
    case warp_op::reduce_min_u32:
    case warp_op::reduce_min_i32: return "__reduce_min_sync";
    case warp_op::reduce_max_u32:
    case warp_op::reduce_max_i32: return "__reduce_max_sync";
    case warp_op::reduce_and: return "__reduce_and_sync";
    case warp_op::reduce_or: return "__reduce_or_sync";
    case warp_op::reduce_xor: return "__reduce_xor_sync";
    case warp_op::mma_m16n8k16_bf16: return "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
    case warp_op::mma_m16n8k16_f16: return "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
    case warp_op::mma_m16n8k8_bf16: return "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32";
    case warp_op::mma_m16n8k8_f16: return "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32";
    case warp_op::ldmatrix_x1: return "ldmatrix.sync.aligned.m8n8.x1.shared.b16";
    case warp_op::ldmatrix_x2: return "ldmatrix.sync.aligned.m8n8.x2.shared.b16";
    case warp_op::ldmatrix_x4: return "ldmatrix.sync.aligned.m8n8.x4.shared.b16";
    case warp_op::ldmatrix_x1_trans: return "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16";
    case warp_op::ldmatrix_x2_trans: return "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16";
    case warp_op::ldmatrix_x4_trans: return "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16";
  }
  return "?";
}

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

struct schedule_setting {
  schedule_order order = schedule_order::forward;
  uint32_t seed = 1;
  bool from_env = false;
};

schedule_setting env_schedule() {
  schedule_setting s;
  const char* v = std::getenv("TESSERA_EMU_SCHEDULE");
  if (!v || !*v) return s;
  const std::string text = v;
  if (text == "forward") {
    s.order = schedule_order::forward;
  } else if (text == "reverse") {
    s.order = schedule_order::reverse;
  } else if (text.rfind("shuffled", 0) == 0) {
    s.order = schedule_order::shuffled;
    if (text.size() > 9 && text[8] == ':') s.seed = static_cast<uint32_t>(std::strtoul(text.c_str() + 9, nullptr, 10));
  } else {
    std::fprintf(stderr,
                 "gpu emulation: TESSERA_EMU_SCHEDULE=%s is not forward, reverse or shuffled[:seed]; using forward\n",
                 v);
  }
  return s;
}

thread_local schedule_setting tl_schedule = env_schedule();
std::atomic<uint64_t> g_kernels{0}, g_blocks{0}, g_switches{0};

class block_runner;
thread_local block_runner* tl_active = nullptr;

class block_runner {
 public:
  void run(const launch_config& config, const std::function<void()>& body) {
    if (tl_active)
      throw std::logic_error(std::string("gpu emulation: kernel ") + config.kernel + " launched from inside a kernel");
    config_ = &config;
    body_ = &body;
    const dim3 b = config.block;
    n_ = static_cast<int>(b.x * b.y * b.z);
    ensure_fibers(n_);
    dynamic_shared_.resize(std::max<size_t>(config.shared_bytes, 1) + 128);
    const int num_warps = (n_ + 31) / 32;
    warps_.assign(static_cast<size_t>(num_warps), {});
    for (int w = 0; w < num_warps; ++w) {
      const int lanes = std::min(32, n_ - 32 * w);
      warps_[static_cast<size_t>(w)].present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    }
    order_.resize(static_cast<size_t>(n_));
    std::iota(order_.begin(), order_.end(), 0);
    if (tl_schedule.order == schedule_order::reverse) std::reverse(order_.begin(), order_.end());
    rng_.seed(tl_schedule.seed);

    current_grid_dim = config.grid;
    current_block_dim = config.block;
    tl_active = this;
    struct restore {
      ~restore() { tl_active = nullptr; }
    } restore_active;
    g_kernels.fetch_add(1, std::memory_order_relaxed);
    // Blocks in the schedule's order too: a kernel that relies on one block finishing before
    // another starts (which no GPU promises) gives a different answer under reverse or shuffled.
    const uint64_t gx = config.grid.x, gy = config.grid.y;
    const uint64_t num_blocks = gx * gy * config.grid.z;
    auto run_linear = [&](uint64_t blk) {
      current_block_idx = {static_cast<unsigned>(blk % gx), static_cast<unsigned>((blk / gx) % gy),
                           static_cast<unsigned>(blk / (gx * gy))};
      run_block();
    };
    if (tl_schedule.order == schedule_order::forward) {
      for (uint64_t blk = 0; blk < num_blocks; ++blk) run_linear(blk);
    } else if (tl_schedule.order == schedule_order::reverse) {
      for (uint64_t blk = num_blocks; blk-- > 0;) run_linear(blk);
    } else {
      std::vector<uint64_t> blocks(num_blocks);
      std::iota(blocks.begin(), blocks.end(), uint64_t{0});
      std::shuffle(blocks.begin(), blocks.end(), rng_);
      for (const uint64_t blk : blocks) run_linear(blk);
    }
  }

  // ---- called on a fiber (from the intrinsics) -----------------------------------------------

  std::pair<int, int> sync_threads_count(int predicate, const std::source_location& where) {
    fibers_[static_cast<size_t>(current_)].value = predicate != 0;
    sync_threads(where);
    const fiber& f = fibers_[static_cast<size_t>(current_)];
    return {static_cast<int>(f.result), f.arg};
  }

  void sync_threads(const std::source_location& where) {
    fiber& f = fibers_[static_cast<size_t>(current_)];
    f.state = fiber_state::at_block_barrier;
    f.file = where.file_name();
    f.line = where.line();
    f.func = where.function_name();
    ++at_barrier_;
    if (at_barrier_ == live_) release_block_barrier();
    yield(f);
  }

  uint64_t warp_collective(warp_op op, unsigned mask, uint64_t value, int arg, int width,
                           const std::source_location& where) {
    fiber& f = fibers_[static_cast<size_t>(current_)];
    warp_state& w = warps_[static_cast<size_t>(f.warp)];
    const unsigned me = 1u << f.lane;
    f.file = where.file_name();
    f.line = where.line();
    f.func = where.function_name();
    if (!(mask & me)) fail(f, std::string(op_name(op)) + " called by a lane whose bit is not in its mask " + hex(mask));
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
      fail(f, std::string(op_name(op)) + " with width " + std::to_string(width) + " (must be a power of 2 <= 32)");
    }
    const unsigned expected = mask & w.present;
    warp_collective_state* c = nullptr;
    for (auto& p : w.pending) {
      if (p.mask == mask) {
        c = &p;
      } else if (p.mask & mask) {
        fail(f, std::string("lanes of warp ") + std::to_string(f.warp) +
                    " call warp intrinsics with overlapping but different masks " + hex(p.mask) + " and " + hex(mask));
      }
    }
    if (!c) {
      if (mask & w.exited) {
        fail(f, std::string(op_name(op)) + " with mask " + hex(mask) + " names lanes that have exited (" +
                    hex(mask & w.exited) + "): undefined on a GPU");
      }
      w.pending.push_back({mask, op, width, 0});
      c = &w.pending.back();
    } else if (c->op != op || c->width != width) {
      fail(f, std::string("lanes of warp ") + std::to_string(f.warp) + " with mask " + hex(mask) +
                  " meet at different warp intrinsics: " + op_name(c->op) + " and " + op_name(op) +
                  describe_waiting_lanes(f.warp, mask));
    }
    f.state = fiber_state::at_warp;
    f.op = op;
    f.mask = mask;
    f.value = value;
    f.arg = arg;
    f.width = width;
    c->arrived |= me;
    if (c->arrived == expected) complete_collective(f.warp, *c);
    yield(f);
    return f.result;
  }

  void warp_matrix(warp_op op, void* lane_data, warp_matrix_fn complete, const std::source_location& where) {
    fiber& f = fibers_[static_cast<size_t>(current_)];
    const warp_state& w = warps_[static_cast<size_t>(f.warp)];
    if (w.present != 0xffffffffu) {
      f.file = where.file_name();
      f.line = where.line();
      fail(f, std::string(op_name(op)) + " in warp " + std::to_string(f.warp) + ", which has " +
                  std::to_string(std::popcount(w.present)) + " threads: the instruction needs a whole warp of 32");
    }
    f.payload = lane_data;
    f.complete = complete;
    // .aligned: all 32 lanes, none exited (the collective checks both, and that they meet at one variant).
    warp_collective(op, 0xffffffffu, 0, 0, 32, where);
  }

  // cp.async: queued; performed by the wait that covers it (PTX ISA: its writes are visible to the
  // thread only after cp.async.wait_group / wait_all), so a thread reading its destination before
  // that wait reads the old bytes, as a GPU may let it.
  void cp_async(void* dst, const void* src, int cp_size, int src_size, const std::source_location& where) {
    fiber& f = fibers_[static_cast<size_t>(current_)];
    f.file = where.file_name();
    f.line = where.line();
    const std::string what = "cp.async of " + std::to_string(cp_size) + " bytes";
    if (src_size < 0 || src_size > cp_size) {
      fail(f, what + " with src-size " + std::to_string(src_size) + " (0 to cp-size; undefined past it)");
    }
    const auto d = reinterpret_cast<uintptr_t>(dst), sa = reinterpret_cast<uintptr_t>(src);
    const auto alignment = static_cast<uintptr_t>(cp_size);
    if (d % alignment != 0) fail(f, what + ": destination " + pointer_text(dst) + " is not aligned to the copy size");
    if (std::string why = check_shared(dst, static_cast<size_t>(cp_size), "destination"); !why.empty()) {
      fail(f, what + ": " + why);
    }
    if (src_size > 0) {
      if (sa % alignment != 0) fail(f, what + ": source " + pointer_text(src) + " is not aligned to the copy size");
      if (std::string why = check_device_range(src, static_cast<size_t>(src_size), "source"); !why.empty()) {
        fail(f, what + ": " + why + " (the source must be global memory)");
      }
    }
    // Copies not yet waited for have no order among them (PTX ISA, cp.async and cp.async.commit_group):
    // two that write the same bytes leave either value.
    for (const async_copy& c : f.copies) {
      const auto cd = reinterpret_cast<uintptr_t>(c.dst);
      if (d < cd + static_cast<uintptr_t>(c.bytes) && cd < d + static_cast<uintptr_t>(cp_size)) {
        fail(f, what + " to " + pointer_text(dst) + " overlaps the destination of an earlier cp.async not waited for " +
                    "yet (at " + c.file + ":" + std::to_string(c.line) + "): their order is undefined");
      }
    }
    f.copies.push_back(
        {static_cast<char*>(dst), static_cast<const char*>(src), cp_size, src_size, where.file_name(), where.line()});
  }

  void cp_async_commit() {
    fiber& f = fibers_[static_cast<size_t>(current_)];
    f.group_ends.push_back(f.copies.size());
  }

  // Performs the copies of every committed group but the newest n (cp.async.wait_group n).
  void cp_async_wait(int n) {
    fiber& f = fibers_[static_cast<size_t>(current_)];
    const auto groups = static_cast<int>(f.group_ends.size());
    if (groups <= n) return;
    const size_t done = f.group_ends[static_cast<size_t>(groups - n - 1)];
    for (size_t i = 0; i < done; ++i) {
      const async_copy& c = f.copies[i];
      if (c.src_bytes > 0) std::memcpy(c.dst, c.src, static_cast<size_t>(c.src_bytes));
      if (c.src_bytes < c.bytes) std::memset(c.dst + c.src_bytes, 0, static_cast<size_t>(c.bytes - c.src_bytes));
    }
    f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(done));
    f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + (groups - n));
    for (size_t& end : f.group_ends) end -= done;
  }

  std::string check_shared(const void* p, size_t bytes, const char* role) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    if (!p) return std::string(role) + " is a null pointer, not shared memory";
    const auto buffer = reinterpret_cast<uintptr_t>(dynamic_shared_.data());
    if (a >= buffer && a < buffer + dynamic_shared_.size()) {
      const auto base = reinterpret_cast<uintptr_t>(const_cast<block_runner*>(this)->dynamic_shared());
      if (a < base || a + bytes > base + config_->shared_bytes) {
        return std::string(role) + " [" + pointer_text(p) + ", +" + std::to_string(bytes) +
               ") runs outside the launch's " + std::to_string(config_->shared_bytes) +
               " bytes of dynamic shared memory";
      }
      return {};
    }
    for (int i = 0; i < n_; ++i) {
      const auto lo = reinterpret_cast<uintptr_t>(stacks_[static_cast<size_t>(i)]->base());
      if (a >= lo && a < lo + stacks_[static_cast<size_t>(i)]->bytes()) {
        const uint3 t = fibers_[static_cast<size_t>(i)].tid;
        return std::string(role) + " " + pointer_text(p) + " is on the stack of thread (" + std::to_string(t.x) + "," +
               std::to_string(t.y) + "," + std::to_string(t.z) + ") (a local variable), not shared memory";
      }
    }
    if (check_device_range(p, 1, role).empty()) {
      return std::string(role) + " " + pointer_text(p) +
             " is inside a cudaMalloc/cudaHostAlloc allocation (global memory), not shared memory";
    }
    return {};
  }

  unsigned active_lanes() const {
    const fiber& f = fibers_[static_cast<size_t>(current_)];
    const warp_state& w = warps_[static_cast<size_t>(f.warp)];
    return w.present & ~w.exited;
  }

  void* dynamic_shared() {
    auto p = reinterpret_cast<uintptr_t>(dynamic_shared_.data());
    return reinterpret_cast<void*>((p + 127) & ~uintptr_t{127});
  }

  [[noreturn]] void trap(const char* why) { fail(fibers_[static_cast<size_t>(current_)], why); }

  std::string describe_current() const {
    std::string s = where().substr(std::string("gpu emulation: ").size());
    if (current_ >= 0) {
      const uint3 t = fibers_[static_cast<size_t>(current_)].tid;
      s += ", thread (" + std::to_string(t.x) + "," + std::to_string(t.y) + "," + std::to_string(t.z) + ")";
    }
    return s;
  }

 private:
  void ensure_fibers(int n) {
    if (static_cast<int>(fibers_.size()) >= n) return;
    const size_t stack_bytes = env_size("TESSERA_EMU_STACK_KIB", 256) * 1024;
    while (static_cast<int>(stacks_.size()) < n) stacks_.push_back(std::make_unique<fiber_stack>(stack_bytes));
    fibers_.resize(static_cast<size_t>(n));
  }

  static void fiber_main(void* self) {
    auto* r = static_cast<block_runner*>(self);
    try {
      (*r->body_)();
    } catch (...) {
      if (!r->error_) r->error_ = std::current_exception();
    }
    r->on_exit();
    fiber& f = r->fibers_[static_cast<size_t>(r->current_)];
    r->hand_off(f.ctx);
    std::abort();  // never resumed
  }

  void run_block() {
    g_blocks.fetch_add(1, std::memory_order_relaxed);
    const dim3 b = config_->block;
    for (int i = 0; i < n_; ++i) {
      fiber& f = fibers_[static_cast<size_t>(i)];
      f.state = fiber_state::ready;
      const auto u = static_cast<unsigned>(i);
      f.tid = {u % b.x, (u / b.x) % b.y, u / (b.x * b.y)};
      f.warp = i / 32;
      f.lane = i % 32;
      // cp.async copies a thread never waited for die with it: nothing could rely on their data.
      f.copies.clear();
      f.group_ends.clear();
      const fiber_stack& s = *stacks_[static_cast<size_t>(i)];
      make_context(f.ctx, s.base(), s.bytes(), &fiber_main, this);
    }
    for (auto& w : warps_) {
      w.exited = 0;
      w.pending.clear();
    }
    // Dynamic shared memory starts as 0xFF bytes (NaN floats) in every block: a kernel reading a
    // word it did not write in this block gets garbage, as on a GPU, rather than a friendly zero.
    if (config_->shared_bytes > 0) std::memset(dynamic_shared(), 0xFF, config_->shared_bytes);
    live_ = n_;
    at_barrier_ = 0;
    error_ = nullptr;
    if (tl_schedule.order == schedule_order::shuffled) std::shuffle(order_.begin(), order_.end(), rng_);
    switches_ = 0;
    // Rounds: resume the ready threads in `order_`; each thread that blocks or exits hands the OS
    // thread straight to the next ready one of the round (no trip through this loop), the last one
    // of the round comes back here.
    while (live_ > 0) {
      int k = 0;
      while (k < n_ && fibers_[static_cast<size_t>(order_[static_cast<size_t>(k)])].state != fiber_state::ready) ++k;
      if (k == n_) deadlock();
      resume(main_, k);
      if (error_) {
        current_ = -1;
        std::rethrow_exception(error_);
      }
      if (reshuffle_) {
        std::shuffle(order_.begin(), order_.end(), rng_);
        reshuffle_ = false;
      }
    }
    current_ = -1;
    g_switches.fetch_add(switches_, std::memory_order_relaxed);
  }

  // Switches from `from` to the thread at position k of the round.
  void resume(context& from, int k) {
    pos_ = k;
    current_ = order_[static_cast<size_t>(k)];
    fiber& g = fibers_[static_cast<size_t>(current_)];
    current_thread_idx = g.tid;
    ++switches_;
    switch_context(from, g.ctx);
  }

  // The running thread gives up the OS thread: to the next ready thread of this round, else (or
  // after an error) to the scheduler loop.
  void hand_off(context& from) {
    if (!error_) {
      for (int k = pos_ + 1; k < n_; ++k) {
        if (fibers_[static_cast<size_t>(order_[static_cast<size_t>(k)])].state == fiber_state::ready) {
          resume(from, k);
          return;
        }
      }
    }
    switch_context(from, main_);
  }

  void yield(fiber& f) { hand_off(f.ctx); }

  void on_exit() {
    fiber& f = fibers_[static_cast<size_t>(current_)];
    f.state = fiber_state::exited;
    --live_;
    warp_state& w = warps_[static_cast<size_t>(f.warp)];
    w.exited |= 1u << f.lane;
    if (!error_) {
      for (const auto& p : w.pending) {
        if (p.mask & (1u << f.lane)) {
          try {
            fail(f, "thread exited while lanes of its warp wait for it at " + std::string(op_name(p.op)) +
                        " with mask " + hex(p.mask) + describe_waiting_lanes(f.warp, p.mask));
          } catch (...) { error_ = std::current_exception(); }
          return;
        }
      }
    }
    if (!error_ && at_barrier_ > 0 && at_barrier_ == live_) {
      try {
        release_block_barrier();
      } catch (...) { error_ = std::current_exception(); }
    }
  }

  void release_block_barrier() {
    // Every waiting thread must be at the same __syncthreads.
    const fiber* first = nullptr;
    std::map<std::pair<std::string, unsigned>, int> sites;
    bool divergent = false;
    for (int i = 0; i < n_; ++i) {
      const fiber& g = fibers_[static_cast<size_t>(i)];
      if (g.state != fiber_state::at_block_barrier) continue;
      if (!first) first = &g;
      if (g.line != first->line || std::strcmp(g.file, first->file) != 0) divergent = true;
      ++sites[{g.file, g.line}];
    }
    if (divergent) {
      std::string what = "divergent __syncthreads: the block's threads wait at different calls (";
      bool comma = false;
      for (const auto& [site, count] : sites) {
        what += (comma ? ", " : "") + std::to_string(count) + " at " + site.first + ":" + std::to_string(site.second);
        comma = true;
      }
      what += "); every thread of a block must reach the same __syncthreads";
      fail(fibers_[static_cast<size_t>(current_)], what, false);
    }
    int count = 0;
    for (int i = 0; i < n_; ++i) {
      const fiber& g = fibers_[static_cast<size_t>(i)];
      if (g.state == fiber_state::at_block_barrier && g.value) ++count;
    }
    for (int i = 0; i < n_; ++i) {
      fiber& g = fibers_[static_cast<size_t>(i)];
      if (g.state != fiber_state::at_block_barrier) continue;
      g.state = fiber_state::ready;
      g.result = static_cast<uint64_t>(count);  // for __syncthreads_count/_and/_or
      g.arg = at_barrier_;
      g.value = 0;
    }
    at_barrier_ = 0;
    // A new phase of the block: a new order (per phase rather than per round, which would cost a
    // shuffle per warp collective).
    reshuffle_ = tl_schedule.order == schedule_order::shuffled;
  }

  void complete_collective(int warp, const warp_collective_state& c) {
    const warp_state& w = warps_[static_cast<size_t>(warp)];
    const unsigned participants = c.arrived;
    fiber* lanes[32] = {};
    for (int l = 0; l < 32; ++l) {
      if (participants & (1u << l)) lanes[l] = &fibers_[static_cast<size_t>(warp * 32 + l)];
    }
    if (c.op >= warp_op::mma_m16n8k16_bf16) {
      complete_matrix(warp, c, lanes);
      return;
    }
    unsigned votes = 0;
    uint32_t sum = 0, umin = ~0u, umax = 0, band = ~0u, bor = 0, bxor = 0;
    int32_t imin = INT32_MAX, imax = INT32_MIN;
    for (int l = 0; l < 32; ++l) {
      if (!lanes[l]) continue;
      if (lanes[l]->value) votes |= 1u << l;
      const auto v = static_cast<uint32_t>(lanes[l]->value);
      sum += v, umin = std::min(umin, v), umax = std::max(umax, v), band &= v, bor |= v, bxor ^= v;
      imin = std::min(imin, static_cast<int32_t>(v)), imax = std::max(imax, static_cast<int32_t>(v));
    }
    for (int l = 0; l < 32; ++l) {
      fiber* f = lanes[l];
      if (!f) continue;
      const int seg = l & ~(c.width - 1);
      int src = l;
      bool shuffle = true;
      switch (c.op) {
        case warp_op::sync: f->result = 0, shuffle = false; break;
        case warp_op::ballot: f->result = votes, shuffle = false; break;
        case warp_op::any: f->result = votes != 0, shuffle = false; break;
        case warp_op::all: f->result = votes == participants, shuffle = false; break;
        case warp_op::reduce_add: f->result = sum, shuffle = false; break;
        case warp_op::reduce_min_u32: f->result = umin, shuffle = false; break;
        case warp_op::reduce_max_u32: f->result = umax, shuffle = false; break;
        case warp_op::reduce_min_i32: f->result = static_cast<uint32_t>(imin), shuffle = false; break;
        case warp_op::reduce_max_i32: f->result = static_cast<uint32_t>(imax), shuffle = false; break;
        case warp_op::reduce_and: f->result = band, shuffle = false; break;
        case warp_op::reduce_or: f->result = bor, shuffle = false; break;
        case warp_op::reduce_xor: f->result = bxor, shuffle = false; break;
        case warp_op::shfl_idx: src = seg + (f->arg & (c.width - 1)); break;
        case warp_op::shfl_xor:
          src = l ^ f->arg;
          src = (src >= seg + c.width || src < 0 || src > 31) ? l : src;
          break;
        case warp_op::shfl_down:
          src = l + f->arg;
          src = src >= seg + c.width ? l : src;
          break;
        case warp_op::shfl_up:
          src = l - f->arg;
          src = src < seg ? l : src;
          break;
        default: break;  // the matrix instructions: complete_matrix
      }
      if (shuffle) {
        // Reading a lane that does not take part is undefined on a GPU: all-ones bits (a NaN for
        // floats) make such a read visible.
        f->result = (src >= 0 && src < 32 && lanes[src]) ? lanes[src]->value : ~uint64_t{0};
      }
      f->state = fiber_state::ready;
    }
    (void)w;
    auto& pending = warps_[static_cast<size_t>(warp)].pending;
    pending.erase(std::find_if(pending.begin(), pending.end(), [&](const auto& p) { return p.mask == c.mask; }));
  }

  void complete_matrix(int warp, const warp_collective_state& c, fiber* const (&lanes)[32]) {
    void* data[32] = {};
    for (int l = 0; l < 32; ++l) data[l] = lanes[l]->payload;
    fiber& f = fibers_[static_cast<size_t>(current_)];
    try {
      f.complete(c.op, data);
    } catch (const std::exception& e) { fail(f, e.what()); }
    for (int l = 0; l < 32; ++l) lanes[l]->state = fiber_state::ready;
    auto& pending = warps_[static_cast<size_t>(warp)].pending;
    pending.erase(std::find_if(pending.begin(), pending.end(), [&](const auto& p) { return p.mask == c.mask; }));
  }

  static std::string pointer_text(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return buf;
  }

  std::string describe_waiting_lanes(int warp, unsigned mask) const {
    std::string s;
    for (int l = 0; l < 32; ++l) {
      if (!(mask & (1u << l))) continue;
      const size_t i = static_cast<size_t>(warp * 32 + l);
      if (i >= static_cast<size_t>(n_)) break;
      const fiber& g = fibers_[i];
      if (g.state == fiber_state::at_warp) {
        s += "; lane " + std::to_string(l) + " at " + op_name(g.op) + " " + g.file + ":" + std::to_string(g.line);
      }
    }
    return s;
  }

  std::string where() const {
    const uint3 bi = current_block_idx;
    return std::string("gpu emulation: kernel ") + config_->kernel + ", block (" + std::to_string(bi.x) + "," +
           std::to_string(bi.y) + "," + std::to_string(bi.z) + ")";
  }

  [[noreturn]] void fail(const fiber& f, const std::string& what, bool with_site = true) const {
    std::string msg = where() + ", thread (" + std::to_string(f.tid.x) + "," + std::to_string(f.tid.y) + "," +
                      std::to_string(f.tid.z) + "): " + what;
    if (with_site && f.line) msg += " [at " + std::string(f.file) + ":" + std::to_string(f.line) + "]";
    throw std::logic_error(msg);
  }

  [[noreturn]] void deadlock() const {
    // Group the waiting threads by what they wait at.
    std::map<std::string, std::vector<int>> groups;
    for (int i = 0; i < n_; ++i) {
      const fiber& f = fibers_[static_cast<size_t>(i)];
      if (f.state == fiber_state::exited) continue;
      std::string key = f.state == fiber_state::at_block_barrier ? "__syncthreads" : op_name(f.op);
      if (f.state == fiber_state::at_warp) key += " (mask " + hex(f.mask) + ")";
      key += " at " + std::string(f.file) + ":" + std::to_string(f.line);
      groups[key].push_back(i);
    }
    std::string msg = where() + ": deadlock, no thread can run:";
    for (const auto& [key, threads] : groups) {
      msg += " " + std::to_string(threads.size()) + " thread(s) [" + std::to_string(threads.front()) +
             (threads.size() > 1 ? ".." + std::to_string(threads.back()) : "") + "] wait at " + key + ";";
    }
    msg += " (a barrier or warp intrinsic not reached by every thread it waits for)";
    throw std::logic_error(msg);
  }

  const launch_config* config_ = nullptr;
  const std::function<void()>* body_ = nullptr;
  int n_ = 0;
  int live_ = 0;
  int at_barrier_ = 0;
  int current_ = -1;
  int pos_ = 0;  // current_'s position in order_
  bool reshuffle_ = false;
  uint64_t switches_ = 0;
  std::exception_ptr error_;
  context main_;
  std::vector<fiber> fibers_;
  std::vector<std::unique_ptr<fiber_stack>> stacks_;
  std::vector<warp_state> warps_;
  std::vector<int> order_;
  std::vector<unsigned char> dynamic_shared_;
  std::mt19937 rng_;
};

thread_local block_runner tl_runner;

block_runner& active(const char* what) {
  if (!tl_active) { throw std::logic_error(std::string("gpu emulation: ") + what + " called outside a kernel launch"); }
  return *tl_active;
}

}  // namespace

void run_grid(const launch_config& config, const std::function<void()>& thread_body) {
  tl_runner.run(config, thread_body);
}

std::string describe_running_thread() {
  if (!tl_active) return "host code";
  return tl_active->describe_current();
}

void sync_threads(const std::source_location& where) { active("__syncthreads").sync_threads(where); }

std::pair<int, int> sync_threads_count(int predicate, const std::source_location& where) {
  return active("__syncthreads_count/_and/_or").sync_threads_count(predicate, where);
}

uint64_t warp_collective(warp_op op, unsigned mask, uint64_t value, int arg, int width,
                         const std::source_location& where) {
  return active("a warp intrinsic").warp_collective(op, mask, value, arg, width, where);
}

unsigned active_lanes() { return active("__activemask").active_lanes(); }

void* dynamic_shared_memory() { return active("dynamic shared memory").dynamic_shared(); }

void trap(const char* why) { active("__trap").trap(why); }

void warp_matrix_collective(warp_op op, void* lane_data, warp_matrix_fn complete, const std::source_location& where) {
  active("a warp matrix instruction (mma.sync / ldmatrix)").warp_matrix(op, lane_data, complete, where);
}

std::string check_shared_range(const void* p, size_t bytes, const char* role) {
  return active("a shared-memory address check").check_shared(p, bytes, role);
}

void cp_async(void* dst_shared, const void* src_global, int cp_size, int src_size, const std::source_location& where) {
  active("cp.async").cp_async(dst_shared, src_global, cp_size, src_size, where);
}

void cp_async_commit_group() { active("cp.async.commit_group").cp_async_commit(); }

void cp_async_wait_group(int n) { active("cp.async.wait_group").cp_async_wait(n); }

void cp_async_wait_all() {
  block_runner& r = active("cp.async.wait_all");
  r.cp_async_commit();  // PTX ISA: wait_all is commit_group; wait_group 0
  r.cp_async_wait(0);
}

void set_schedule(schedule_order order, uint32_t seed) {
  tl_schedule.order = order;
  tl_schedule.seed = seed;
}

schedule_order current_schedule() { return tl_schedule.order; }

run_stats stats() {
  run_stats s;
  s.kernels = g_kernels.load();
  s.blocks = g_blocks.load();
  s.thread_switches = g_switches.load();
  return s;
}

}  // namespace tessera::gpu::emu
