// CPU emulation of CUDA (tests/cuda_emu): the toolkit header <cuda_fp16.h> is not emulated.
// f16 data reaches gpu/mma.cuh as raw 16-bit patterns.
// This stand-in stops the build with the reason, rather than letting a toolkit copy elsewhere on the
// include path half work.
#error "<cuda_fp16.h> (__half) is not emulated by the CPU emulation of CUDA (see docs/cuda_emulation.md)"
