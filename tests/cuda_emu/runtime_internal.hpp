// Shared between the parts of the CPU emulation of CUDA (internal to tests/cuda_emu).
#pragma once
#include <functional>
#include <string>

#include "runtime_api.hpp"

namespace tessera::gpu::emu {

// Runs `op` now, or records it into the stream's capture (named `what` in errors).
cudaError_t enqueue_work(cudaStream_t stream, std::string what, std::function<void()> op);
// Empty when [p, p + bytes) lies inside one live allocation (device or pinned host), else why not.
std::string check_device_range(const void* p, size_t bytes, const char* role);
// Records `e` as the thread's last error and prints why; returns e.
cudaError_t report(cudaError_t e, const std::string& why);

}  // namespace tessera::gpu::emu
