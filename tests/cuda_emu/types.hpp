// Built-in CUDA types of the CPU emulation (tests/cuda_emu): dim3, the vector types, and the per-thread
// coordinates threadIdx/blockIdx/blockDim/gridDim. See docs/gpu_executor.md, "CPU emulation".
#pragma once
#include <cstdint>

// Vector types with CUDA's sizes and alignments (uint4/float4 16 bytes, uint2/float2 8), so
// reinterpret_cast'ed vector loads keep their alignment requirements.
#define TESSERA_EMU_VEC2(name, T, A) \
  struct alignas(A) name {           \
    T x, y;                          \
  };
#define TESSERA_EMU_VEC3(name, T) \
  struct name {                   \
    T x, y, z;                    \
  };
#define TESSERA_EMU_VEC4(name, T, A) \
  struct alignas(A) name {           \
    T x, y, z, w;                    \
  };
TESSERA_EMU_VEC2(uint2, unsigned int, 8)
TESSERA_EMU_VEC2(int2, int, 8)
TESSERA_EMU_VEC2(float2, float, 8)
TESSERA_EMU_VEC2(ushort2, unsigned short, 4)
TESSERA_EMU_VEC2(short2, short, 4)
TESSERA_EMU_VEC2(longlong2, long long, 16)
TESSERA_EMU_VEC2(ulonglong2, unsigned long long, 16)
TESSERA_EMU_VEC2(double2, double, 16)
TESSERA_EMU_VEC3(uint3, unsigned int)
TESSERA_EMU_VEC3(int3, int)
TESSERA_EMU_VEC3(float3, float)
TESSERA_EMU_VEC4(uint4, unsigned int, 16)
TESSERA_EMU_VEC4(int4, int, 16)
TESSERA_EMU_VEC4(float4, float, 16)
TESSERA_EMU_VEC4(ushort4, unsigned short, 8)
TESSERA_EMU_VEC4(uchar4, unsigned char, 4)
TESSERA_EMU_VEC4(char4, signed char, 4)
#undef TESSERA_EMU_VEC2
#undef TESSERA_EMU_VEC3
#undef TESSERA_EMU_VEC4

inline uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

namespace tessera::gpu::emu {
// The coordinates of the emulated CUDA thread running now on this OS thread: the block scheduler
// (tests/cuda_emu/scheduler.cpp) writes them before it resumes a thread's fiber.
inline thread_local uint3 current_thread_idx{0, 0, 0};
inline thread_local uint3 current_block_idx{0, 0, 0};
inline thread_local dim3 current_block_dim{1, 1, 1};
inline thread_local dim3 current_grid_dim{1, 1, 1};
}  // namespace tessera::gpu::emu

#define threadIdx (::tessera::gpu::emu::current_thread_idx)
#define blockIdx (::tessera::gpu::emu::current_block_idx)
#define blockDim (::tessera::gpu::emu::current_block_dim)
#define gridDim (::tessera::gpu::emu::current_grid_dim)
inline constexpr int warpSize = 32;
