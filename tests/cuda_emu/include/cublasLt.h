// CPU emulation of CUDA (tests/cuda_emu): the toolkit header <cublasLt.h> is not emulated.
// The GEMMs of <cublas_v2.h> are.
// This stand-in stops the build with the reason, rather than letting a toolkit copy elsewhere on the
// include path half work.
#error "<cublasLt.h> is not emulated by the CPU emulation of CUDA (see docs/cuda_emulation.md)"
