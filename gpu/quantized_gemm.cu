#include "gpu/quantized_gemm.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/launch.cuh"

namespace tessera::gpu {

namespace {

using detail::load_floats;
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

// Each type's block cut into chunks a lane dequantises at once: kRuns runs of 4 consecutive weights,
// run r at element offset off[r] of the block (the matrix and its rows kAlign-byte aligned), with the CPU dequantiser's
// arithmetic (same operations in the same order). Consecutive chunks are consecutive bytes of the block, so a warp's 32
// lanes read a contiguous stretch of the row.

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
};

// Q4_0 {d, qs[16]}: element j is the low nibble of qs[j], element 16 + j its high nibble; y = (q - 8) d.
struct q4_0_blocks {
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
struct q4_1_blocks {
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
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[kRuns][4], int (&off)[kRuns]) {
    const uint4 head = *reinterpret_cast<const uint4*>(b);
    const int p = c / 2, at = 16 * (c % 2);
    const uint4 qv = *reinterpret_cast<const uint4*>(b + 16 + 32 * p + at);
    const float d = half_bits_to_float(head.x & 0xFFFFu), dmin = half_bits_to_float(head.x >> 16);
    const auto scale_byte = [&](int i) {  // byte i of scales[12]: header bytes 4 + i
      const uint32_t word = i < 4 ? head.y : i < 8 ? head.z : head.w;
      return static_cast<int>((word >> (8 * (i % 4))) & 0xFFu);
    };
    int sc, mn;
    scale_min_k4(2 * p, scale_byte, sc, mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    scale_min_k4(2 * p + 1, scale_byte, sc, mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    const uint32_t q[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = (q[r] >> (8 * j)) & 0xFFu;  // little-endian: byte 4r + j of the 16
        w[r][j] = d1 * static_cast<float>(byte & 0x0F) - m1;
        w[4 + r][j] = d2 * static_cast<float>(byte >> 4) - m2;
      }
      off[r] = 64 * p + at + 4 * r;
      off[4 + r] = 64 * p + 32 + at + 4 * r;
    }
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
};

constexpr int kWarps = 8;  // output columns per CTA of the small-batch kernel

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
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) {
      float* o = out + static_cast<int64_t>(r) * ldc + col;
      *o = accumulate ? *o + v : v;
    }
  }
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
void check_shape(const void* w, int64_t row_bytes, int64_t n, int64_t k) {
  if (reinterpret_cast<uintptr_t>(w) % L::kAlign != 0 || row_bytes % L::kAlign != 0) {
    throw std::invalid_argument("quantized GEMM: the matrix and its rows must be " + std::to_string(L::kAlign) +
                                "-byte aligned");
  }
  if (n < 1 || k < 1 || k % L::kBlockElems != 0) {
    throw std::invalid_argument("quantized GEMM: k must be a positive multiple of " + std::to_string(L::kBlockElems));
  }
  if (row_bytes < k / L::kBlockElems * L::kBlockBytes) throw std::invalid_argument("quantized GEMM: row_bytes short");
}

template <class L, int R>
void launch_gemv(const void* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in, float* out, int64_t ldc,
                 bool accumulate, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>((n + kWarps - 1) / kWarps);
  TESSERA_LAUNCH_PDL(grid, kWarps * 32, 0, stream, quantized_gemv_kernel<L, R>)
  (static_cast<const uint8_t*>(w), row_bytes, n, k, in, out, ldc, accumulate);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool quantized_gemm_supports(ggml_type type) noexcept {
  return type == ggml_type::q8_0 || type == ggml_type::q4_0 || type == ggml_type::q4_1 || type == ggml_type::q4_k ||
         type == ggml_type::q6_k;
}

void quantized_small_batch_gemm(ggml_type type, const void* w, int64_t row_bytes, int64_t n, int64_t k, const bf16* in,
                                int32_t rows, float* out, int64_t ldc, bool accumulate, cudaStream_t stream) {
  if (rows < 1 || rows > kMaxQuantizedGemvRows) throw std::invalid_argument("quantized GEMM: rows must be 1..8");
  if (ldc < n) throw std::invalid_argument("quantized GEMM: ldc < n");
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0)
    throw std::invalid_argument("quantized GEMM: input not 16-byte aligned");
  with_blocks(type, [&](auto blocks) {
    using L = decltype(blocks);
    check_shape<L>(w, row_bytes, n, k);
    switch (rows) {
      case 1: return launch_gemv<L, 1>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
      case 2: return launch_gemv<L, 2>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
      case 3: return launch_gemv<L, 3>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
      case 4: return launch_gemv<L, 4>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
      case 5: return launch_gemv<L, 5>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
      case 6: return launch_gemv<L, 6>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
      case 7: return launch_gemv<L, 7>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
      default: return launch_gemv<L, 8>(w, row_bytes, n, k, in, out, ldc, accumulate, stream);
    }
  });
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
