// Kernel launches of the CPU emulation of CUDA (tests/cuda_emu), behind gpu/launch.cuh's TESSERA_LAUNCH:
//
//   TESSERA_LAUNCH(grid, block, shared_bytes, stream, kernel<...>)(args...)
//
// becomes a launcher holding the configuration and a generic lambda that calls `kernel(args...)`
// (so template arguments are deduced from the arguments exactly as with <<<...>>>). The launcher
// copies the arguments at launch, as CUDA does, and hands one closure to the runtime, which runs it
// once per CUDA thread (tests/cuda_emu/scheduler.cpp) now, or records it when the stream is being captured.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tessera::gpu::emu {

struct launch_config {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  const char* kernel = "";  // the kernel expression as written, for error messages
};

// Validates the configuration (an invalid one sets cudaGetLastError's error and runs nothing), then
// runs every thread of the grid or records the launch into the stream's capture. `pointers` are the
// kernel's pointer arguments: each must be null or inside a live allocation, at launch and at every
// graph replay (std::logic_error otherwise).
void launch(const launch_config& config, std::function<void()> thread_body, std::vector<const void*> pointers);

template <class Call>
class launcher {
 public:
  launcher(const launch_config& config, Call call) : config_(config), call_(call) {}
  template <class... Args>
  void operator()(Args&&... args) const {
    std::vector<const void*> pointers;
    (add_pointer(pointers, args), ...);
    launch(
        config_,
        [call = call_, params = std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)]() {
          std::apply(call, params);
        },
        std::move(pointers));
  }

 private:
  template <class T>
  static void add_pointer(std::vector<const void*>& out, const T& arg) {
    if constexpr (std::is_pointer_v<std::decay_t<T>> && !std::is_function_v<std::remove_pointer_t<std::decay_t<T>>>) {
      out.push_back(static_cast<const void*>(arg));
    }
  }

  launch_config config_;
  Call call_;
};

}  // namespace tessera::gpu::emu
