// CPU emulation of CUDA (gpu/emu): see cuda_runtime.h.
#pragma once
#include "cuda_runtime.h"
