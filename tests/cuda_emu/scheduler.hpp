// The block scheduler of the CPU emulation of CUDA (internal to tests/cuda_emu).
#pragma once
#include <cstddef>
#include <functional>
#include <source_location>
#include <string>

#include "device_api.hpp"
#include "include/cuda_emu/launch.hpp"

namespace tessera::gpu::emu {

// Runs every block of the grid, one after another, on the calling OS thread; within a block every
// CUDA thread is a fiber run by a cooperative scheduler. Throws std::logic_error for a deadlock, a
// divergent barrier or warp collective, or an error raised by a kernel (__trap). Pre: a valid config.
void run_grid(const launch_config& config, const std::function<void()>& thread_body);

// "kernel K, block (x,y,z), thread (x,y,z)" for the CUDA thread running on this OS thread, or "host
// code" outside kernels (for crash reports).
std::string describe_running_thread();

// A warp-synchronous matrix instruction (PTX .sync.aligned: every lane of a full warp, none exited,
// all at the same variant `op`): each lane passes a pointer to its own operands and results; when the
// last lane arrives, `complete(op, lanes)` runs once with the 32 lanes' pointers (index = lane id)
// and writes every lane's results, then the lanes resume. An exception from `complete` becomes the
// kernel's error, with the kernel, block, thread and source line added.
using warp_matrix_fn = void (*)(warp_op op, void* const (&lanes)[32]);
void warp_matrix_collective(warp_op op, void* lane_data, warp_matrix_fn complete, const std::source_location& where);

// Empty when [p, p + bytes) may be shared memory of the running block: inside the launch's dynamic
// shared memory, or (static __shared__ variables, which the emulator cannot delimit) neither on a
// thread's stack nor inside a device or host allocation. Otherwise why not, naming `role`.
std::string check_shared_range(const void* p, size_t bytes, const char* role);

}  // namespace tessera::gpu::emu
