// CPU emulation of CUDA (tests/cuda_emu): the toolkit header <cub/cub.cuh> is not emulated.
// This stand-in stops the build with the reason, rather than letting a toolkit copy elsewhere on the
// include path half work.
#error "<cub/cub.cuh> is not emulated by the CPU emulation of CUDA (see docs/cuda_emulation.md)"
