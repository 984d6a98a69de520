#include "gpu/quantized_gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/env_setting.hpp"
#include "gpu/launch.cuh"
#include "gpu/mma.cuh"

namespace tessera::gpu {

namespace {

using detail::load_floats;
using detail::warp_max;
using detail::warp_sum;

// IEEE half (its 16 bits in the low half of h) as float.
__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);  // subnormal: m * 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return detail::bits_to_float(sign | 0x7F800000u | (m << 13));
  return detail::bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
}

// IEEE half at p (2-byte aligned in every block: the blocks' sizes and fields are even), as float.
__device__ __forceinline__ float half_at(const uint8_t* p) {
  return half_bits_to_float(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8));
}

// 4 bytes at p as a little-endian word; p 2-byte aligned (GGUF blocks have even sizes, their fields even
// offsets, and the executor's matrices even row lengths).
__device__ __forceinline__ uint32_t word_at(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

// 4 int8 activations at p (4-byte aligned in both activation blocks) as one word for dp4a.
__device__ __forceinline__ int int8x4_at(const int8_t* p) { return *reinterpret_cast<const int*>(p); }

// dp4a against this sums the 4 bytes of the other operand.
constexpr int kOnes = 0x01010101;
constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// Each type's block cut into chunks a lane dequantises at once: kRuns runs of 4 consecutive weights,
// run r at element offset off[r] of the block (the matrix and its rows kAlign-byte aligned), with the CPU dequantiser's
// arithmetic (same operations in the same order). Consecutive chunks are consecutive bytes of the block, so a warp's 32
// lanes read a contiguous stretch of the row.
// For the int8 path the same chunk is also read as integers (load_ints: the quants as bytes of words, its
// scales) and dotted with the chunk's activations (dot: exact int32 sums through dp4a, then the scales),
// `act` the activation block of the weights' block (gpu/quantized_gemm.hpp).

// Q8_0 {d, int8 qs[32]}: y = q * d. Chunk c: elements 8c .. 8c + 7.
struct q8_0_blocks {
  static constexpr int kBlockElems = 32, kBlockBytes = 34, kChunks = 4, kRuns = 2, kAlign = 1;
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[kRuns][4], int (&off)[kRuns]) {
    const float d = half_at(b);
    const auto* q = reinterpret_cast<const int8_t*>(b + 2) + 8 * c;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[0][j] = static_cast<float>(q[j]) * d;
      w[1][j] = static_cast<float>(q[4 + j]) * d;
    }
    off[0] = 8 * c;
    off[1] = 8 * c + 4;
  }
  using act = act_block;
  struct ints {
    int q[2];
    float d;
  };
  __device__ static ints load_ints(const uint8_t* b, int c) {
    return {{static_cast<int>(word_at(b + 2 + 8 * c)), static_cast<int>(word_at(b + 6 + 8 * c))}, half_at(b)};
  }
  __device__ static float dot(const ints& w, const act& a, int c) {
    const int s = __dp4a(w.q[0], int8x4_at(a.q + 8 * c), __dp4a(w.q[1], int8x4_at(a.q + 8 * c + 4), 0));
    return static_cast<float>(s) * (w.d * a.d);
  }
};

// The int8 path of Q4_0 and Q4_1 (qs at byte kQuants of the block; kMin: y = q d + m, else (q - 8) d):
// a chunk is 4 quant bytes, elements 4c .. 4c + 3 in their low nibbles and 16 + 4c .. in their high
// ones, dotted with the activations of the same elements as stored (0..15); the offset or the min
// applies to the activations' sum.
template <int kQuants, bool kMin>
struct nibble_int8_path {
  using act = act_block;
  struct ints {
    uint32_t lo, hi;
    float d, m;
  };
  __device__ static ints load_ints(const uint8_t* b, int c) {
    const uint32_t q = word_at(b + kQuants + 4 * c);
    return {q & kLowNibbles, (q >> 4) & kLowNibbles, half_at(b), kMin ? half_at(b + 2) : 0.0f};
  }
  __device__ static float dot(const ints& w, const act& a, int c) {
    const int a0 = int8x4_at(a.q + 4 * c), a1 = int8x4_at(a.q + 16 + 4 * c);
    const int sum_q = __dp4a(kOnes, a0, __dp4a(kOnes, a1, 0));
    const int s = __dp4a(static_cast<int>(w.lo), a0, __dp4a(static_cast<int>(w.hi), a1, 0));
    return kMin ? static_cast<float>(s) * (w.d * a.d) + w.m * (a.d * static_cast<float>(sum_q))
                : static_cast<float>(s - 8 * sum_q) * (w.d * a.d);
  }
};

// Q4_0 {d, qs[16]}: element j is the low nibble of qs[j], element 16 + j its high nibble; y = (q - 8) d.
struct q4_0_blocks : nibble_int8_path<2, false> {
  static constexpr int kBlockElems = 32, kBlockBytes = 18, kChunks = 4, kRuns = 2, kAlign = 1;
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[kRuns][4], int (&off)[kRuns]) {
    const float d = half_at(b);
    const uint8_t* q = b + 2 + 4 * c;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[0][j] = static_cast<float>((q[j] & 0x0F) - 8) * d;
      w[1][j] = static_cast<float>((q[j] >> 4) - 8) * d;
    }
    off[0] = 4 * c;
    off[1] = 16 + 4 * c;
  }
};

// Q4_1 {d, m, qs[16]}: nibbles as Q4_0; y = q d + m.
struct q4_1_blocks : nibble_int8_path<4, true> {
  static constexpr int kBlockElems = 32, kBlockBytes = 20, kChunks = 4, kRuns = 2, kAlign = 1;
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[kRuns][4], int (&off)[kRuns]) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint8_t* q = b + 4 + 4 * c;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[0][j] = static_cast<float>(q[j] & 0x0F) * d + m;
      w[1][j] = static_cast<float>(q[j] >> 4) * d + m;
    }
    off[0] = 4 * c;
    off[1] = 16 + 4 * c;
  }
};

// The eight 6-bit (scale, min) pairs of Q4_K, packed in 12 bytes (ggml's get_scale_min_k4); q(i) is
// byte i of the 12.
template <class Bytes>
__device__ __forceinline__ void scale_min_k4(int j, const Bytes& q, int& sc, int& mn) {
  if (j < 4) {
    sc = q(j) & 63;
    mn = q(j + 4) & 63;
  } else {
    sc = (q(j + 4) & 0x0F) | ((q(j - 4) >> 6) << 4);
    mn = (q(j + 4) >> 4) | ((q(j) >> 6) << 4);
  }
}

// Q4_K {d, dmin, scales[12], qs[128]}: eight groups of 32, y = d sc q - dmin m; the 32-byte run p of
// qs holds group 2p in its low nibbles and 2p + 1 in its high ones. Chunk c: the 16 bytes at 16 (c % 2)
// of run c / 2, i.e. 16 weights of group 2p and 16 of 2p + 1 (runs 0-3 and 4-7). Two 16-byte loads per
// chunk, the block's header (d, dmin, the 12 scale bytes) and the chunk's quants: blocks are 144 = 9 x 16
// bytes and rows whole blocks of a 16-byte aligned matrix (kAlign). (llama.cpp's mmvq also reads 16
// bytes of quants per thread; 4-byte chunks with the header re-read per chunk took 4x the loads.)
struct q4_k_blocks {
  static constexpr int kBlockElems = 256, kBlockBytes = 144, kChunks = 8, kRuns = 8, kAlign = 16;
  // The chunk as read: its 16 quant bytes, the (scale, min) pairs of groups 2p and 2p + 1, d and dmin.
  struct ints {
    uint32_t q[4];
    int sc1, mn1, sc2, mn2;
    float d, dmin;
  };
  __device__ static ints load_ints(const uint8_t* b, int c) {
    const uint4 head = *reinterpret_cast<const uint4*>(b);
    const int p = c / 2, at = 16 * (c % 2);
    const uint4 qv = *reinterpret_cast<const uint4*>(b + 16 + 32 * p + at);
    const auto scale_byte = [&](int i) {  // byte i of scales[12]: header bytes 4 + i
      const uint32_t word = i < 4 ? head.y : i < 8 ? head.z : head.w;
      return static_cast<int>((word >> (8 * (i % 4))) & 0xFFu);
    };
    ints w{{qv.x, qv.y, qv.z, qv.w},        0, 0, 0, 0, half_bits_to_float(head.x & 0xFFFFu),
           half_bits_to_float(head.x >> 16)};
    scale_min_k4(2 * p, scale_byte, w.sc1, w.mn1);
    scale_min_k4(2 * p + 1, scale_byte, w.sc2, w.mn2);
    return w;
  }
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[kRuns][4], int (&off)[kRuns]) {
    const ints q = load_ints(b, c);
    const int p = c / 2, at = 16 * (c % 2);
    const float d1 = q.d * static_cast<float>(q.sc1), m1 = q.dmin * static_cast<float>(q.mn1);
    const float d2 = q.d * static_cast<float>(q.sc2), m2 = q.dmin * static_cast<float>(q.mn2);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = (q.q[r] >> (8 * j)) & 0xFFu;  // little-endian: byte 4r + j of the 16
        w[r][j] = d1 * static_cast<float>(byte & 0x0F) - m1;
        w[4 + r][j] = d2 * static_cast<float>(byte >> 4) - m2;
      }
      off[r] = 64 * p + at + 4 * r;
      off[4 + r] = 64 * p + 32 + at + 4 * r;
    }
  }
  // int8: the low nibbles (group 2p) against activations 64p + at .. + 15, the high ones (2p + 1) against
  // 64p + 32 + at ..; the groups' mins against the activations' sums of those 16 (bsums).
  using act = act_block_k;
  __device__ static float dot(const ints& w, const act& a, int c) {
    const int p = c / 2, at = 16 * (c % 2), e = 64 * p + at;
    const int4 a1 = *reinterpret_cast<const int4*>(a.q + e), a2 = *reinterpret_cast<const int4*>(a.q + e + 32);
    const int x1[4] = {a1.x, a1.y, a1.z, a1.w}, x2[4] = {a2.x, a2.y, a2.z, a2.w};
    int d1 = 0, d2 = 0;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      d1 = __dp4a(static_cast<int>(w.q[r] & kLowNibbles), x1[r], d1);
      d2 = __dp4a(static_cast<int>((w.q[r] >> 4) & kLowNibbles), x2[r], d2);
    }
    const int s1 = w.sc1 * d1 + w.sc2 * d2;
    const int s2 = w.mn1 * a.bsums[e / 16] + w.mn2 * a.bsums[e / 16 + 2];
    return a.d * (w.d * static_cast<float>(s1) - w.dmin * static_cast<float>(s2));
  }
};

// Q6_K {ql[128], qh[64], int8 scales[16], d}: per half of 128, ql[l] and ql[l + 32] give the low
// nibbles of elements l, l + 32 (low) and l + 64, l + 96 (high), qh[l] their top 2 bits; y = d sc (q - 32)
// with a scale per 16 elements. Chunk c: l = 4 (c % 8) .. + 3 of half c / 8, all four quarters.
struct q6_k_blocks {
  static constexpr int kBlockElems = 256, kBlockBytes = 210, kChunks = 16, kRuns = 4, kAlign = 1;
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[kRuns][4], int (&off)[kRuns]) {
    const int h = c / 8, l0 = 4 * (c % 8), is = l0 / 16;
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
    const float d = half_at(b + 208);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int l = l0 + j;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      w[0][j] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      w[1][j] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      w[2][j] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      w[3][j] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) off[r] = 128 * h + 32 * r + l0;
  }
  // int8: quarter s of half h, elements 128h + 32s + l0 .. + 3, as bytes q + 32 (0..63: the 4 low bits
  // from ql, the top 2 from qh moved to bits 4-5), its group's scale sc[8h + 2s + l0 / 16].
  using act = act_block_k;
  struct ints {
    uint32_t u[4];
    int sc[4];
    float d;
  };
  __device__ static ints load_ints(const uint8_t* b, int c) {
    const int h = c / 8, l0 = 4 * (c % 8);
    const uint32_t lo = word_at(b + 64 * h + l0), hi = word_at(b + 64 * h + 32 + l0),
                   top = word_at(b + 128 + 32 * h + l0);
    constexpr uint32_t kBits45 = 0x30303030u;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + l0 / 16;
    return {{(lo & kLowNibbles) | ((top << 4) & kBits45), (hi & kLowNibbles) | ((top << 2) & kBits45),
             ((lo >> 4) & kLowNibbles) | (top & kBits45), ((hi >> 4) & kLowNibbles) | ((top >> 2) & kBits45)},
            {sc[0], sc[2], sc[4], sc[6]},
            half_at(b + 208)};
  }
  __device__ static float dot(const ints& w, const act& a, int c) {
    const int e = 128 * (c / 8) + 4 * (c % 8);
    int s = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int x = int8x4_at(a.q + e + 32 * q);
      s += w.sc[q] * (__dp4a(static_cast<int>(w.u[q]), x, 0) - 32 * __dp4a(kOnes, x, 0));
    }
    return a.d * (w.d * static_cast<float>(s));
  }
};

constexpr int kWarps = 8;  // output columns per CTA of the small-batch kernel

// A warp's per-row partial sums of one output column, reduced and written by lane 0.
template <int R>
__device__ __forceinline__ void store_column(float (&acc)[R], int lane, float* out, int64_t ldc, int64_t col,
                                             bool accumulate) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) {
      float* o = out + static_cast<int64_t>(r) * ldc + col;
      *o = accumulate ? *o + v : v;
    }
  }
}

// grid: ceil(n / kWarps), block: kWarps * 32. Warp = one output column; lane i takes chunks i, i + 32, ...
// of the column's row (so the warp reads the row front to back, 32 chunks at a time), each against
// every input row (R: accumulators in registers), then a warp reduction per row.
template <class L, int R>
__global__ void __launch_bounds__(kWarps * 32)
    quantized_gemv_kernel(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in, float* out,
                          int64_t ldc, bool accumulate) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (col >= n) return;  // a whole warp
  const uint8_t* row = w + col * row_bytes;
  const int64_t chunks = k / L::kBlockElems * L::kChunks;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t i = lane; i < chunks; i += 32) {
    const int64_t block = i / L::kChunks;
    float wv[L::kRuns][4];
    int off[L::kRuns];
    L::chunk(row + block * L::kBlockBytes, static_cast<int>(i % L::kChunks), wv, off);
    const bf16* x0 = in + block * L::kBlockElems;
#pragma unroll
    for (int run = 0; run < L::kRuns; ++run) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float x[4];
        load_floats<bf16, 4>(x0 + static_cast<int64_t>(r) * k + off[run], x);  // 8-byte aligned
        acc[r] += wv[run][0] * x[0] + wv[run][1] * x[1] + wv[run][2] * x[2] + wv[run][3] * x[3];
      }
    }
  }
  store_column(acc, lane, out, ldc, col, accumulate);
}

// The int8 form of quantized_gemv_kernel: the same walk over the column's chunks, each dotted with the
// matching activations of every input row (act: R rows of k / kBlockElems blocks).
template <class L, int R>
__global__ void __launch_bounds__(kWarps * 32)
    quantized_gemv_int8_kernel(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const typename L::act* act,
                               float* out, int64_t ldc, bool accumulate) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (col >= n) return;  // a whole warp
  const uint8_t* row = w + col * row_bytes;
  const int64_t blocks = k / L::kBlockElems, chunks = blocks * L::kChunks;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t i = lane; i < chunks; i += 32) {
    const int64_t block = i / L::kChunks;
    const int c = static_cast<int>(i % L::kChunks);
    const typename L::ints wq = L::load_ints(row + block * L::kBlockBytes, c);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += L::dot(wq, act[r * blocks + block], c);
  }
  store_column(acc, lane, out, ldc, col, accumulate);
}

// The activations' quantisation (gpu/quantized_gemm.hpp; the CPU executor's quantize_act and
// quantize_act_k rule: d = amax / 127, q = nearest-even(x * (127 / amax)), 0 for an all-zero block).
// One warp per block, kWarps a CTA; `blocks` blocks of the row-major input, which rows of whole blocks
// make one sequence. act_block: lane i quantises value i.
__global__ void __launch_bounds__(kWarps * 32) quantize_q8_kernel(const bf16* in, int64_t blocks, act_block* out) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (b >= blocks) return;  // a whole warp
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float x = __bfloat162float(in[b * 32 + lane]);
  const float amax = warp_max(fabsf(x));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int q = __float2int_rn(x * id);
  const int sum = __reduce_add_sync(0xffffffffu, q);
  act_block& o = out[b];
  o.q[lane] = static_cast<int8_t>(q);
  if (lane == 0) {
    const float d = amax / 127.0f;
    o.d = d;
    o.s = d * static_cast<float>(sum);
    o.sum = sum;
  }
}

// act_block_k: lane i quantises values 8i .. 8i + 7 (one 16-byte load), lanes 2j and 2j + 1 make
// group j's sum. in 16-byte aligned.
__global__ void __launch_bounds__(kWarps * 32) quantize_q8k_kernel(const bf16* in, int64_t blocks, act_block_k* out) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (b >= blocks) return;  // a whole warp
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float x[8];
  load_floats<bf16, 8>(in + b * 256 + 8 * lane, x);
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(x[j]));
  const float amax = warp_max(m);
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  uint32_t packed[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int q = __float2int_rn(x[j] * id);
    sum += q;
    packed[j / 4] |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * (j % 4));
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  act_block_k& o = out[b];
  *reinterpret_cast<uint2*>(o.q + 8 * lane) = make_uint2(packed[0], packed[1]);
  if (lane % 2 == 0) o.bsums[lane / 2] = static_cast<int16_t>(sum);
  if (lane == 0) o.d = amax / 127.0f;
}

// Two floats as the bf16 pair of an mma fragment register (round to nearest even, low element first).
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  return uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(lo))} |
         (uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(hi))} << 16);
}

// One thread per chunk of the whole matrix (grid-stride).
template <class L>
__global__ void dequantize_kernel(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, bf16* out) {
  pdl_prologue();  // first: see gpu/launch.cuh
  const int64_t per_row = k / L::kBlockElems * L::kChunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * per_row;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = i / per_row, j = i % per_row, block = j / L::kChunks;
    float wv[L::kRuns][4];
    int off[L::kRuns];
    L::chunk(w + col * row_bytes + block * L::kBlockBytes, static_cast<int>(j % L::kChunks), wv, off);
    bf16* dst = out + col * k + block * L::kBlockElems;
#pragma unroll
    for (int run = 0; run < L::kRuns; ++run) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[off[run] + e] = __float2bfloat16_rn(wv[run][e]);
    }
  }
}

// ---- the tiled tensor-core GEMM ----------------------------------------------------------------
//
// out[rows, n] over a grid of 64 x 64 output tiles (input rows x weight columns), 4 warps each a
// 32 x 32 quarter. Per K tile of 128 values: the input's 64 x 128 bf16 come by cp.async (rows past
// `rows` zero-filled), the weights' 64 x 128 are dequantised chunk by chunk (the float path's chunk(),
// rounded to bf16 as dequantize_rows_to_bf16 rounds) into shared memory, and each warp runs 8 k-steps
// of mma.m16n8k16 (2 x 4 fragments) from ldmatrix. Rows of both tiles are padded by 8 elements (272
// bytes: the 8 rows an ldmatrix reads fall in 8 different 16-byte bank groups). One stage: the next
// tile's loads wait for the current tile's k-steps (a cp.async double buffer is not built yet).
constexpr int kTileM = 64, kTileN = 64, kTileK = 128, kTilePitch = kTileK + 8, kTileWarps = 4;

// The chunks of one column's K tile `kt`: blocks of at most 128 values lie whole in a tile; a 256-value
// block (Q4_K, Q6_K) has its first kChunks / 2 chunks in its first 128 values (both types' chunk order).
template <class L>
struct tile_chunks {
  static constexpr int kBlocks = L::kBlockElems <= kTileK ? kTileK / L::kBlockElems : 1;
  static constexpr int kPerBlock = L::kBlockElems <= kTileK ? L::kChunks : L::kChunks / 2;
  static constexpr int kCount = kBlocks * kPerBlock;  // chunks per column and K tile
  // Chunk i of tile kt: its block (of the row) and its index in the block.
  __device__ static void locate(int64_t kt, int i, int64_t& block, int& chunk) {
    if constexpr (L::kBlockElems <= kTileK) {
      block = kt * kBlocks + i / kPerBlock;
      chunk = i % kPerBlock;
    } else {
      block = kt * kTileK / L::kBlockElems;
      chunk = static_cast<int>(kt % 2) * kPerBlock + i;
    }
  }
};

template <class L>
__global__ void __launch_bounds__(kTileWarps * 32)
    quantized_tiled_gemm_kernel(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in, int32_t rows,
                                float* out, int64_t ldc, bool accumulate) {
  pdl_prologue();  // first: see gpu/launch.cuh
  __shared__ __align__(16) __nv_bfloat16 a_s[kTileM][kTilePitch];
  __shared__ __align__(16) __nv_bfloat16 w_s[kTileN][kTilePitch];
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN, m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int wm = 32 * (warp / 2), wn = 32 * (warp % 2);  // this warp's quarter of the tile
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  }
  using chunks = tile_chunks<L>;
  for (int64_t kt = 0; kt < k / kTileK; ++kt) {
    __syncthreads();  // the previous tile's k-steps are done with both buffers
    // Input: 64 rows x 16 pieces of 16 bytes.
    for (int i = tid; i < kTileM * (kTileK / 8); i += kTileWarps * 32) {
      const int r = i / (kTileK / 8), piece = i % (kTileK / 8);
      const bool real = m0 + r < rows;
      const bf16* src = real ? in + (m0 + r) * k + kt * kTileK + 8 * piece : in;
      ptx::cp_async_cg_zfill(&a_s[r][8 * piece], src, real ? 16 : 0);
    }
    ptx::cp_async_commit_group();
    // Weights: each chunk's runs of 4 values as 4 bf16 (8 bytes). The rows of columns past n keep
    // what they held: each output column reads only its own row, and those columns are never stored.
    for (int i = tid; i < kTileN * chunks::kCount; i += kTileWarps * 32) {
      const int c = i / chunks::kCount;
      if (n0 + c >= n) break;  // i grows with c: this thread's later chunks are past n too
      int64_t block;
      int chunk;
      chunks::locate(kt, i % chunks::kCount, block, chunk);
      float wv[L::kRuns][4];
      int off[L::kRuns];
      L::chunk(w + (n0 + c) * row_bytes + block * L::kBlockBytes, chunk, wv, off);
      const int base = static_cast<int>(block * L::kBlockElems - kt * kTileK);
#pragma unroll
      for (int run = 0; run < L::kRuns; ++run) {
        *reinterpret_cast<uint2*>(&w_s[c][base + off[run]]) =
            make_uint2(bf16x2_bits(wv[run][0], wv[run][1]), bf16x2_bits(wv[run][2], wv[run][3]));
      }
    }
    ptx::cp_async_wait_all();
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kTileK / 16; ++s) {
      uint32_t a[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) ptx::ldmatrix<4>(a[i], &a_s[wm + 16 * i + lane % 16][16 * s + 8 * (lane / 16)]);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        ptx::ldmatrix<4>(b, &w_s[wn + 16 * np + 8 * (lane >> 4) + (lane & 7)][16 * s + 8 * ((lane >> 3) & 1)]);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          ptx::mma_m16n8k16_bf16(acc[i][2 * np], a[i], b0, acc[i][2 * np]);
          ptx::mma_m16n8k16_bf16(acc[i][2 * np + 1], a[i], b1, acc[i][2 * np + 1]);
        }
      }
    }
  }
  // Fragment element e of (i, j): row wm + 16 i + g + 8 (e / 2), column wn + 8 j + 2 t + e % 2.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t r = m0 + wm + 16 * i + g + 8 * (e / 2), col = n0 + wn + 8 * j + 2 * t + e % 2;
        if (r >= rows || col >= n) continue;
        float* o = out + r * ldc + col;
        *o = accumulate ? *o + acc[i][j][e] : acc[i][j][e];
      }
    }
  }
}

template <class F>
void with_blocks(ggml_type type, F&& f) {
  switch (type) {
    case ggml_type::q8_0: return f(q8_0_blocks{});
    case ggml_type::q4_0: return f(q4_0_blocks{});
    case ggml_type::q4_1: return f(q4_1_blocks{});
    case ggml_type::q4_k: return f(q4_k_blocks{});
    case ggml_type::q6_k: return f(q6_k_blocks{});
    default:
      throw std::invalid_argument("quantized GEMM: type " + std::string(type_info(type).name) +
                                  " is not read on the GPU (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)");
  }
}

template <class L>
void check_k(int64_t k) {
  if (k < 1 || k % L::kBlockElems != 0) {
    throw std::invalid_argument("quantized GEMM: k must be a positive multiple of " + std::to_string(L::kBlockElems));
  }
}

// align: the path's alignment of the matrix and its rows (the int8 path reads 2-byte words at least).
template <class L>
void check_shape(const void* w, int64_t row_bytes, int64_t n, int64_t k, int align = L::kAlign) {
  if (reinterpret_cast<uintptr_t>(w) % align != 0 || row_bytes % align != 0) {
    throw std::invalid_argument("quantized GEMM: the matrix and its rows must be " + std::to_string(align) +
                                "-byte aligned");
  }
  if (n < 1) throw std::invalid_argument("quantized GEMM: n must be positive");
  check_k<L>(k);
  if (row_bytes < k / L::kBlockElems * L::kBlockBytes) throw std::invalid_argument("quantized GEMM: row_bytes short");
}

// The output's checks every GEMM entry point shares: rows in [1, most], rows of at least n floats.
void check_output(int32_t rows, int32_t most, int64_t n, int64_t ldc) {
  if (rows < 1 || rows > most) {
    throw std::invalid_argument("quantized GEMM: rows must be 1.." + std::to_string(most));
  }
  if (ldc < n) throw std::invalid_argument("quantized GEMM: ldc < n");
}

// f(std::integral_constant<int, rows>{}) for rows in [1, kMaxQuantizedGemvRows], after the output's
// checks.
template <class F>
void with_rows(int32_t rows, int64_t n, int64_t ldc, F&& f) {
  check_output(rows, kMaxQuantizedGemvRows, n, ldc);
  switch (rows) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

unsigned warps_grid(int64_t units) { return static_cast<unsigned>((units + kWarps - 1) / kWarps); }

constexpr uintptr_t kActAlign = alignof(act_block_k);  // 32: the int8 activations' buffer

}  // namespace

bool quantized_gemm_supports(ggml_type type) noexcept {
  return type == ggml_type::q8_0 || type == ggml_type::q4_0 || type == ggml_type::q4_1 || type == ggml_type::q4_k ||
         type == ggml_type::q6_k;
}

void quantized_small_batch_gemm(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in,
                                int32_t rows, float* out, int64_t ldc, bool accumulate, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0)
    throw std::invalid_argument("quantized GEMM: input not 16-byte aligned");
  with_blocks(type, [&](auto blocks) {
    using L = decltype(blocks);
    check_shape<L>(w, row_bytes, n, k);
    with_rows(rows, n, ldc, [&](auto r) {
      TESSERA_LAUNCH_PDL(warps_grid(n), kWarps * 32, 0, stream, quantized_gemv_kernel<L, decltype(r)::value>)
      (static_cast<const uint8_t*>(w), row_bytes, n, k, in, out, ldc, accumulate);
      CUDA_CHECK(cudaGetLastError());
    });
  });
}

bool quantized_tiled_gemm_supports(ggml_type type, int64_t k) noexcept {
  return quantized_gemm_supports(type) && k > 0 && k % kTileK == 0;
}

void quantized_tiled_gemm(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in,
                          int32_t rows, float* out, int64_t ldc, bool accumulate, cudaStream_t stream) {
  check_output(rows, std::numeric_limits<int32_t>::max(), n, ldc);
  if (k % kTileK != 0) throw std::invalid_argument("quantized tiled GEMM: k must be a multiple of 128");
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0)
    throw std::invalid_argument("quantized GEMM: input not 16-byte aligned");
  with_blocks(type, [&](auto blocks) {
    using L = decltype(blocks);
    check_shape<L>(w, row_bytes, n, k);
    const dim3 grid(static_cast<unsigned>((n + kTileN - 1) / kTileN),
                    static_cast<unsigned>((rows + kTileM - 1) / kTileM));
    TESSERA_LAUNCH_PDL(grid, kTileWarps * 32, 0, stream, quantized_tiled_gemm_kernel<L>)
    (static_cast<const uint8_t*>(w), row_bytes, n, k, in, rows, out, ldc, accumulate);
    CUDA_CHECK(cudaGetLastError());
  });
}

int32_t quantized_tiled_gemm_rows_from_env() noexcept {
  static const int32_t rows = int_setting_from_env("TESSERA_QGEMM_ROWS", kDefaultQuantizedTiledGemmRows, 0, 1 << 20);
  return rows;
}

int64_t int8_activation_bytes(ggml_type type, int32_t rows, int64_t k) {
  int64_t bytes = 0;
  with_blocks(type, [&](auto blocks) {
    using L = decltype(blocks);
    check_k<L>(k);
    bytes = static_cast<int64_t>(sizeof(typename L::act)) * rows * (k / L::kBlockElems);
  });
  return bytes;
}

void quantize_activations_int8(ggml_type type, const bf16* in, int32_t rows, int64_t k, void* act,
                               cudaStream_t stream) {
  if (rows < 1) throw std::invalid_argument("quantized GEMM: rows must be positive");
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0 || reinterpret_cast<uintptr_t>(act) % kActAlign != 0)
    throw std::invalid_argument("quantized GEMM: input not 16-byte or activations not 32-byte aligned");
  with_blocks(type, [&](auto blocks) {
    using L = decltype(blocks);
    check_k<L>(k);
    const int64_t n_blocks = rows * (k / L::kBlockElems);
    if constexpr (std::is_same_v<typename L::act, act_block_k>) {
      TESSERA_LAUNCH_PDL(warps_grid(n_blocks), kWarps * 32, 0, stream, quantize_q8k_kernel)
      (in, n_blocks, static_cast<act_block_k*>(act));
    } else {
      TESSERA_LAUNCH_PDL(warps_grid(n_blocks), kWarps * 32, 0, stream, quantize_q8_kernel)
      (in, n_blocks, static_cast<act_block*>(act));
    }
    CUDA_CHECK(cudaGetLastError());
  });
}

void quantized_small_batch_gemm_int8(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k,
                                     const void* act, int32_t rows, float* out, int64_t ldc, bool accumulate,
                                     cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(act) % kActAlign != 0)
    throw std::invalid_argument("quantized GEMM: activations not 32-byte aligned");
  with_blocks(type, [&](auto blocks) {
    using L = decltype(blocks);
    check_shape<L>(w, row_bytes, n, k, std::max(L::kAlign, 2));
    with_rows(rows, n, ldc, [&](auto r) {
      TESSERA_LAUNCH_PDL(warps_grid(n), kWarps * 32, 0, stream, quantized_gemv_int8_kernel<L, decltype(r)::value>)
      (static_cast<const uint8_t*>(w), row_bytes, n, k, static_cast<const typename L::act*>(act), out, ldc, accumulate);
      CUDA_CHECK(cudaGetLastError());
    });
  });
}

bool int8_quantized_gemv_from_env() noexcept {
  static const bool int8 = [] {
    const char* env = std::getenv("TESSERA_QGEMV");
    return env != nullptr && std::string(env) == "int8";
  }();
  return int8;
}

void dequantize_rows_to_bf16(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k, bf16* out,
                             cudaStream_t stream) {
  with_blocks(type, [&](auto blocks) {
    using L = decltype(blocks);
    check_shape<L>(w, row_bytes, n, k);
    const int64_t chunks = n * (k / L::kBlockElems * L::kChunks);
    const auto grid = static_cast<unsigned>(std::min<int64_t>((chunks + 255) / 256, 65535));
    TESSERA_LAUNCH_PDL(grid, 256, 0, stream, dequantize_kernel<L>)
    (static_cast<const uint8_t*>(w), row_bytes, n, k, out);
    CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace tessera::gpu
