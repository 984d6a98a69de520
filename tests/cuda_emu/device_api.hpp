// Device-side builtins of the CPU emulation of CUDA (tests/cuda_emu): function qualifiers, __shared__,
// barriers, warp shuffles and votes, atomics, the device math names. Included by the emulated
// <cuda_runtime.h>; kernels compile with the host C++ compiler and every CUDA thread runs as a fiber
// of tests/cuda_emu/scheduler.cpp. See docs/gpu_executor.md, "CPU emulation".
#pragma once
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <source_location>
#include <type_traits>
#include <utility>

#include "types.hpp"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
// Every fiber of a block runs on one OS thread, so a thread_local static is exactly one copy per
// block in flight (blocks run one after another). Static shared memory is NOT reset between blocks
// (as on a GPU, its contents at block start are undefined).
#define __shared__ static thread_local

namespace tessera::gpu::emu {

enum class warp_op : uint8_t {
  sync,
  shfl_idx,
  shfl_xor,
  shfl_down,
  shfl_up,
  ballot,
  any,
  all,
  reduce_add,
  reduce_min_u32,
  reduce_max_u32,
  reduce_min_i32,
  reduce_max_i32,
  reduce_and,
  reduce_or,
  reduce_xor,
  // The warp-wide matrix instructions of gpu/mma.cuh (.sync.aligned: the whole warp, one variant).
  mma_m16n8k16_bf16,
  mma_m16n8k16_f16,
  mma_m16n8k8_bf16,
  mma_m16n8k8_f16,
  ldmatrix_x1,
  ldmatrix_x2,
  ldmatrix_x4,
  ldmatrix_x1_trans,
  ldmatrix_x2_trans,
  ldmatrix_x4_trans,
};

// Block barrier: blocks this CUDA thread until every thread of the block that has not exited is
// waiting at the same __syncthreads (a different one is a "divergent __syncthreads" error).
void sync_threads(const std::source_location& where);
// __syncthreads_count/_and/_or: a block barrier that also counts the threads whose predicate is
// non-zero; returns (that count, the number of threads that took part).
std::pair<int, int> sync_threads_count(int predicate, const std::source_location& where);
// A warp collective over the lanes in `mask`: every non-exited lane of the mask must call the same
// intrinsic with the same mask. Returns this lane's result (the raw bits of the exchanged value).
uint64_t warp_collective(warp_op op, unsigned mask, uint64_t value, int arg, int width,
                         const std::source_location& where);
unsigned active_lanes();
void* dynamic_shared_memory();
[[noreturn]] void trap(const char* why);

template <class T>
inline uint64_t to_bits(const T& v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp shuffles move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace tessera::gpu::emu

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ::tessera::gpu::emu::sync_threads(where);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location where = std::source_location::current()) {
  ::tessera::gpu::emu::warp_collective(::tessera::gpu::emu::warp_op::sync, mask, 0, 0, 32, where);
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
                     std::source_location where = std::source_location::current()) {
  namespace e = ::tessera::gpu::emu;
  return e::from_bits<T>(e::warp_collective(e::warp_op::shfl_idx, mask, e::to_bits(var), src_lane, width, where));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                         std::source_location where = std::source_location::current()) {
  namespace e = ::tessera::gpu::emu;
  return e::from_bits<T>(e::warp_collective(e::warp_op::shfl_xor, mask, e::to_bits(var), lane_mask, width, where));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          std::source_location where = std::source_location::current()) {
  namespace e = ::tessera::gpu::emu;
  return e::from_bits<T>(
      e::warp_collective(e::warp_op::shfl_down, mask, e::to_bits(var), static_cast<int>(delta), width, where));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                        std::source_location where = std::source_location::current()) {
  namespace e = ::tessera::gpu::emu;
  return e::from_bits<T>(
      e::warp_collective(e::warp_op::shfl_up, mask, e::to_bits(var), static_cast<int>(delta), width, where));
}
inline unsigned __ballot_sync(unsigned mask, int pred, std::source_location where = std::source_location::current()) {
  namespace e = ::tessera::gpu::emu;
  return static_cast<unsigned>(e::warp_collective(e::warp_op::ballot, mask, pred != 0, 0, 32, where));
}
inline int __any_sync(unsigned mask, int pred, std::source_location where = std::source_location::current()) {
  namespace e = ::tessera::gpu::emu;
  return static_cast<int>(e::warp_collective(e::warp_op::any, mask, pred != 0, 0, 32, where));
}
inline int __all_sync(unsigned mask, int pred, std::source_location where = std::source_location::current()) {
  namespace e = ::tessera::gpu::emu;
  return static_cast<int>(e::warp_collective(e::warp_op::all, mask, pred != 0, 0, 32, where));
}
inline int __syncthreads_count(int pred, std::source_location where = std::source_location::current()) {
  return ::tessera::gpu::emu::sync_threads_count(pred, where).first;
}
inline int __syncthreads_and(int pred, std::source_location where = std::source_location::current()) {
  const auto [count, total] = ::tessera::gpu::emu::sync_threads_count(pred, where);
  return count == total;
}
inline int __syncthreads_or(int pred, std::source_location where = std::source_location::current()) {
  return ::tessera::gpu::emu::sync_threads_count(pred, where).first > 0;
}
// sm_80's warp reductions of 32-bit integers.
#define TESSERA_EMU_REDUCE(name, T, op)                                                                          \
  inline T name(unsigned mask, T value, std::source_location where = std::source_location::current()) {          \
    namespace e = ::tessera::gpu::emu;                                                                           \
    return static_cast<T>(e::warp_collective(e::warp_op::op, mask, static_cast<uint32_t>(value), 0, 32, where)); \
  }
TESSERA_EMU_REDUCE(__reduce_add_sync, unsigned, reduce_add)
TESSERA_EMU_REDUCE(__reduce_add_sync, int, reduce_add)
TESSERA_EMU_REDUCE(__reduce_min_sync, unsigned, reduce_min_u32)
TESSERA_EMU_REDUCE(__reduce_min_sync, int, reduce_min_i32)
TESSERA_EMU_REDUCE(__reduce_max_sync, unsigned, reduce_max_u32)
TESSERA_EMU_REDUCE(__reduce_max_sync, int, reduce_max_i32)
TESSERA_EMU_REDUCE(__reduce_and_sync, unsigned, reduce_and)
TESSERA_EMU_REDUCE(__reduce_or_sync, unsigned, reduce_or)
TESSERA_EMU_REDUCE(__reduce_xor_sync, unsigned, reduce_xor)
#undef TESSERA_EMU_REDUCE
inline unsigned __activemask() { return ::tessera::gpu::emu::active_lanes(); }
[[noreturn]] inline void __trap() { ::tessera::gpu::emu::trap("__trap() called"); }
// One OS thread runs a whole launch and fibers switch only inside the intrinsics above, so plain
// memory operations are already ordered: fences are compiler barriers only.
inline void __threadfence() { std::atomic_signal_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned) {}

// ---- atomics: plain read-modify-write (no other CUDA thread can run in between, see above) -----
#define TESSERA_EMU_ATOMIC(name, T, expr) \
  inline T name(T* address, T val) {      \
    const T old = *address;               \
    *address = (expr);                    \
    return old;                           \
  }
TESSERA_EMU_ATOMIC(atomicAdd, int, old + val)
TESSERA_EMU_ATOMIC(atomicAdd, unsigned int, old + val)
TESSERA_EMU_ATOMIC(atomicAdd, unsigned long long, old + val)
TESSERA_EMU_ATOMIC(atomicAdd, float, old + val)
TESSERA_EMU_ATOMIC(atomicAdd, double, old + val)
TESSERA_EMU_ATOMIC(atomicSub, int, old - val)
TESSERA_EMU_ATOMIC(atomicSub, unsigned int, old - val)
TESSERA_EMU_ATOMIC(atomicExch, int, val)
TESSERA_EMU_ATOMIC(atomicExch, unsigned int, val)
TESSERA_EMU_ATOMIC(atomicExch, unsigned long long, val)
TESSERA_EMU_ATOMIC(atomicExch, float, val)
TESSERA_EMU_ATOMIC(atomicMax, int, old < val ? val : old)
TESSERA_EMU_ATOMIC(atomicMax, unsigned int, old < val ? val : old)
TESSERA_EMU_ATOMIC(atomicMax, long long, old < val ? val : old)
TESSERA_EMU_ATOMIC(atomicMax, unsigned long long, old < val ? val : old)
TESSERA_EMU_ATOMIC(atomicMin, int, val < old ? val : old)
TESSERA_EMU_ATOMIC(atomicMin, unsigned int, val < old ? val : old)
TESSERA_EMU_ATOMIC(atomicMin, long long, val < old ? val : old)
TESSERA_EMU_ATOMIC(atomicMin, unsigned long long, val < old ? val : old)
TESSERA_EMU_ATOMIC(atomicAnd, int, old& val)
TESSERA_EMU_ATOMIC(atomicAnd, unsigned int, old& val)
TESSERA_EMU_ATOMIC(atomicOr, int, old | val)
TESSERA_EMU_ATOMIC(atomicOr, unsigned int, old | val)
TESSERA_EMU_ATOMIC(atomicXor, int, old ^ val)
TESSERA_EMU_ATOMIC(atomicXor, unsigned int, old ^ val)
TESSERA_EMU_ATOMIC(atomicInc, unsigned int, old >= val ? 0u : old + 1u)
TESSERA_EMU_ATOMIC(atomicDec, unsigned int, (old == 0u || old > val) ? val : old - 1u)
#undef TESSERA_EMU_ATOMIC
#define TESSERA_EMU_ATOMIC_CAS(T)                    \
  inline T atomicCAS(T* address, T compare, T val) { \
    const T old = *address;                          \
    if (old == compare) *address = val;              \
    return old;                                      \
  }
TESSERA_EMU_ATOMIC_CAS(int)
TESSERA_EMU_ATOMIC_CAS(unsigned int)
TESSERA_EMU_ATOMIC_CAS(unsigned long long)
TESSERA_EMU_ATOMIC_CAS(unsigned short)
#undef TESSERA_EMU_ATOMIC_CAS

// ---- device math ---------------------------------------------------------------------------
// The fast-math intrinsics (__expf, __logf, ...) are computed exactly here: the emulator checks
// logic, not the last bits of the GPU's approximations.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline void __sincosf(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return static_cast<unsigned>((uint64_t{a} * b) >> 32); }
// Four-way byte dot product with accumulate (PTX dp4a): the bytes of a and b as signed (int overload)
// or unsigned (unsigned overload) 8-bit integers, c + sum_i a_i b_i with 32-bit wrap-around.
inline int __dp4a(int a, int b, int c) {
  uint32_t sum = static_cast<uint32_t>(c);
  for (int i = 0; i < 4; ++i) {
    const int x = static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i));
    const int y = static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
    sum += static_cast<uint32_t>(x * y);
  }
  return static_cast<int>(sum);
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xFFu) * ((b >> (8 * i)) & 0xFFu);
  return c;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
using std::isfinite;
using std::isinf;
using std::isnan;

// CUDA's min/max overloads for every pair of arithmetic types (the usual arithmetic conversions).
template <class A, class B>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>) inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <class A, class B>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>) inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long llmin(long long a, long long b) { return a < b ? a : b; }
inline long long llmax(long long a, long long b) { return a < b ? b : a; }
