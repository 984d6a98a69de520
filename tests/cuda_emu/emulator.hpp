// Controls and counters of the CPU emulation of CUDA (tests/cuda_emu), for tests: the order in which a
// block's threads are run, and the emulated device memory in use.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tessera::gpu::emu {

// The order the block scheduler runs a grid's blocks in and resumes a block's runnable threads in,
// each round. A kernel whose result depends on it has a race (a missing __syncthreads/__syncwarp, or
// blocks that assume an order among themselves); running a kernel under two orders and comparing is
// how tests look for one. Default: forward, or TESSERA_EMU_SCHEDULE
// (forward | reverse | shuffled[:seed]) from the environment.
enum class schedule_order { forward, reverse, shuffled };
void set_schedule(schedule_order order, uint32_t seed = 1);  // for launches from this OS thread
schedule_order current_schedule();

struct memory_stats {
  size_t device_bytes = 0;  // cudaMalloc'd and not freed
  size_t device_allocations = 0;
  size_t host_bytes = 0;  // cudaHostAlloc / cudaMallocHost'd and not freed
  size_t host_allocations = 0;
  size_t device_limit = 0;  // what cudaMemGetInfo reports as total
};
memory_stats memory();

// Kernel launches run (graph replays count each kernel), and barrier/warp-collective waits.
struct run_stats {
  uint64_t kernels = 0;
  uint64_t blocks = 0;
  uint64_t thread_switches = 0;
};
run_stats stats();

}  // namespace tessera::gpu::emu
