// The block scheduler of the CPU emulation of CUDA (internal to tests/cuda_emu).
#pragma once
#include <functional>
#include <string>

#include "include/cuda_emu/launch.hpp"

namespace tessera::gpu::emu {

// Runs every block of the grid, one after another, on the calling OS thread; within a block every
// CUDA thread is a fiber run by a cooperative scheduler. Throws std::logic_error for a deadlock, a
// divergent barrier or warp collective, or an error raised by a kernel (__trap). Pre: a valid config.
void run_grid(const launch_config& config, const std::function<void()>& thread_body);

// "kernel K, block (x,y,z), thread (x,y,z)" for the CUDA thread running on this OS thread, or "host
// code" outside kernels (for crash reports).
std::string describe_running_thread();

}  // namespace tessera::gpu::emu
