// CPU emulation of CUDA (tests/cuda_emu): the toolkit header <mma.h> is not emulated.
// gpu/mma.cuh wraps mma.sync and ldmatrix.
// This stand-in stops the build with the reason, rather than letting a toolkit copy elsewhere on the
// include path half work.
#error "<mma.h> (nvcuda::wmma) is not emulated by the CPU emulation of CUDA (see docs/cuda_emulation.md)"
