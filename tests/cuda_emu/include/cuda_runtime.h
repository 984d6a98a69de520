// CPU emulation of CUDA (tests/cuda_emu): this <cuda_runtime.h> stands in for the toolkit's when
// TESSERA_CUDA_EMULATION is defined (tests/cuda_emu/include comes first on the include path), so gpu/*.cu
// build with the host compiler and run without a GPU. See docs/gpu_executor.md, "CPU emulation".
#pragma once
// Order matters: the runtime API defines cudaError_t, which the others use.
#include "../runtime_api.hpp"

#include "../device_api.hpp"
#include "../not_emulated.hpp"
