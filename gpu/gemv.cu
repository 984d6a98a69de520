// The small-batch GEMM of gpu/gemv.hpp.
//
// Bandwidth reasoning (H200: 132 SMs, 4.8 TB/s HBM3e, ~0.6-0.8 us loaded DRAM latency):
// * The kernel is a pass over W, so all that matters is how many bytes are in flight. Little's law:
//   4.8 TB/s * ~0.7 us ~ 3.4 MB in flight over the chip, ~25-40 KB per SM.
// * One warp owns one output column j (or a part of it, below) and walks W's row j with 16-byte loads:
//   a warp-wide load is 512 contiguous bytes (fully coalesced, four whole 128-byte lines), and every
//   lane issues kLoadsInFlight independent loads before it uses any (the loop body loads into
//   registers first), so a warp has 2 KB in flight. ~20 resident warps per SM cover Little's law;
//   up to 64 registers per thread (sm_90 ptxas: every row count with one column per warp) allow 32,
//   the heaviest variant (8 rows, 2 columns: 86 registers) ~23.
// * Each loaded weight is used for every input row (rows is a template parameter, so the per-row
//   accumulators stay in registers): W is read once per step whatever the row count. The inputs
//   (rows * k elements, at most 8 * 14336 * 2 = 229 KB for Llama-3-8B's down projection) are read by
//   every warp, so they live in L1/L2; they are loaded as 16-byte words too.
// * When n gives too few warps to fill the GPU with bytes in flight (o_proj and down: n = 4096 ->
//   4096 warps, ~31 per SM, one uneven wave), warps_per_column warps split k of one column between
//   them (interleaved 16-byte chunks, so their loads together stay one contiguous stream) and add
//   their partial sums through shared memory.
// * With many rows the input loads (from L1) outnumber the weight loads (one 16-byte input load per
//   row per weight load): a warp then computes two columns, so each input load serves both
//   (columns_per_warp, see the kernel).
// * The reduction across lanes is a warp shuffle tree per row, once per column: negligible next to
//   the k / (32 * 8) loads per lane (bf16) that precede it.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/device_math.cuh"
#include "gpu/gemv.hpp"
#include "gpu/launch.cuh"

namespace tessera::gpu {

namespace {

using detail::to_float;
using detail::warp_sum;

constexpr int kThreads = 128;  // per CTA: 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kLoadsInFlight = 4;  // independent 16-byte W loads per lane per loop step
// Warps of work that keep every SM of an H200 busy (132 SMs * 64 resident warps): below this, the
// columns are split between several warps.
constexpr int64_t kFillWarps = 132 * 64;

template <class T>
constexpr int kPerChunk = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load

// acc[c][r] += dot(W chunk of column c, in[r] chunk) for every row and column: one 16-byte load of
// each input row per chunk step, shared by the C columns.
template <class T, int R, int C>
__device__ __forceinline__ void fma_chunk(const uint4 (&wv)[C], const uint4* in, int64_t row_chunks, int64_t c,
                                          float (&acc)[C][R]) {
  constexpr int E = kPerChunk<T>;
  float wf[C][E];
#pragma unroll
  for (int col = 0; col < C; ++col) {
    const T* wt = reinterpret_cast<const T*>(&wv[col]);
#pragma unroll
    for (int e = 0; e < E; ++e) wf[col][e] = to_float(wt[e]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint4 xv = __ldg(in + r * row_chunks + c);
    const T* xt = reinterpret_cast<const T*>(&xv);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float x = to_float(xt[e]);
#pragma unroll
      for (int col = 0; col < C; ++col) acc[col][r] = fmaf(wf[col][e], x, acc[col][r]);
    }
  }
}

// grid: ceil(n / (C * kWarps / split)); block: kThreads. Warp w of CTA b computes part (w % split)
// of columns j0 .. j0 + C - 1, j0 = (b * (kWarps / split) + w / split) * C.
// C (columns per warp) exists for the input traffic: every FMA needs one input value, so with C = 1
// and 8 rows a lane loads 8 x 16 bytes of inputs (from L1) per 16 bytes of W; at HBM speed that is
// ~140 B/clock/SM of L1 traffic, above L1's 128. Two columns per warp halve it.
template <class T, int R, int C>
__global__ void __launch_bounds__(kThreads)
    small_batch_gemm_kernel(const T* w, int64_t n, int64_t k, const T* in, float* out, int64_t ldc, bool accumulate,
                            int32_t split) {
  pdl_prologue();  // first: see gpu/launch.cuh
  static_assert(C * R <= 32, "one lane per (column, row) result");
  constexpr int kSteps = kLoadsInFlight / C;  // chunk steps per loop iteration: C * kSteps loads in flight
  __shared__ float partial_s[kWarps][C * R];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / split) + warp / split) * C;
  const int part = warp % split;
  const int64_t row_chunks = k / kPerChunk<T>;

  float acc[C][R];
#pragma unroll
  for (int col = 0; col < C; ++col) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[col][r] = 0.0f;
  }
  if (j0 < n) {  // the same for the whole warp: its shuffles below stay converged
    const uint4* wrow[C];
#pragma unroll
    for (int col = 0; col < C; ++col) {  // a column past n reads column n - 1 again; never written
      wrow[col] = reinterpret_cast<const uint4*>(w + min(j0 + col, n - 1) * k);
    }
    const uint4* x = reinterpret_cast<const uint4*>(in);
    const int64_t stride = 32 * static_cast<int64_t>(split);
    int64_t c = part * 32 + lane;
    // Main loop: C * kSteps loads issued before the first is used.
    for (; c + (kSteps - 1) * stride < row_chunks; c += kSteps * stride) {
      uint4 wv[kSteps][C];
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
#pragma unroll
        for (int col = 0; col < C; ++col) wv[u][col] = __ldg(wrow[col] + c + u * stride);
      }
#pragma unroll
      for (int u = 0; u < kSteps; ++u) fma_chunk<T, R, C>(wv[u], x, row_chunks, c + u * stride, acc);
    }
    // Tail: this lane's last < kSteps chunks (k need not be a multiple of the loop's step).
    for (; c < row_chunks; c += stride) {
      uint4 wv[C];
#pragma unroll
      for (int col = 0; col < C; ++col) wv[col] = __ldg(wrow[col] + c);
      fma_chunk<T, R, C>(wv, x, row_chunks, c, acc);
    }
  }
  // Lane col * R + r ends with result (col, r) (a register array indexed by a runtime lane would
  // spill to local memory).
  float mine = 0.0f;
#pragma unroll
  for (int col = 0; col < C; ++col) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[col][r]);
      if (lane == col * R + r) mine = v;
    }
  }
  if (split > 1) {  // uniform over the block
    if (lane < C * R) partial_s[warp][lane] = mine;
    __syncthreads();
    if (part != 0) return;
    for (int p = 1; p < split; ++p) mine += lane < C * R ? partial_s[warp + p][lane] : 0.0f;
  }
  const int64_t j = j0 + lane / R;
  if (lane < C * R && j < n) {
    float* o = out + static_cast<int64_t>(lane % R) * ldc + j;
    *o = accumulate ? *o + mine : mine;
  }
}

template <class T>
bool supports(const T* w, int64_t n, int64_t k, const T* in, int32_t rows) noexcept {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kMaxGemvRows && n >= 1 && k >= 1 && k % kPerChunk<T> == 0 && w != nullptr &&
         in != nullptr && aligned(w) && aligned(in) && n <= int64_t{kWarps} * 0x7fffffff;
}

template <class T, int R, int C>
void launch_shape(const T* w, int64_t n, int64_t k, const T* in, float* out, int64_t ldc, bool accumulate,
                  int32_t split, cudaStream_t stream) {
  const int64_t cols_per_cta = int64_t{C} * (kWarps / split);
  const auto grid = static_cast<unsigned>((n + cols_per_cta - 1) / cols_per_cta);
  TESSERA_LAUNCH_PDL(grid, kThreads, 0, stream, small_batch_gemm_kernel<T, R, C>)
  (w, n, k, in, out, ldc, accumulate, split);
  CUDA_CHECK(cudaGetLastError());
}

template <class T, int R>
void launch_rows(const T* w, int64_t n, int64_t k, const T* in, float* out, int64_t ldc, bool accumulate,
                 const small_batch_gemm_tuning& t, cudaStream_t stream) {
  if (t.columns_per_warp == 2)
    return launch_shape<T, R, 2>(w, n, k, in, out, ldc, accumulate, t.warps_per_column, stream);
  return launch_shape<T, R, 1>(w, n, k, in, out, ldc, accumulate, t.warps_per_column, stream);
}

template <class T>
void launch(const T* w, int64_t n, int64_t k, const T* in, int32_t rows, float* out, int64_t ldc, bool accumulate,
            const small_batch_gemm_tuning& t, cudaStream_t stream) {
  if (!supports(w, n, k, in, rows)) {
    throw std::invalid_argument("small_batch_gemm: unsupported shape or alignment (rows " + std::to_string(rows) +
                                ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")");
  }
  if (out == nullptr || ldc < n) throw std::invalid_argument("small_batch_gemm: out is null or ldc < n");
  if ((t.warps_per_column != 1 && t.warps_per_column != 2 && t.warps_per_column != 4) ||
      (t.columns_per_warp != 1 && t.columns_per_warp != 2)) {
    throw std::invalid_argument("small_batch_gemm: warps_per_column must be 1, 2 or 4 and columns_per_warp 1 or 2");
  }
  // One kernel per row count: the accumulators are a compile-time array (registers), and the inner
  // loop over rows has no guards.
  switch (rows) {
    case 1: return launch_rows<T, 1>(w, n, k, in, out, ldc, accumulate, t, stream);
    case 2: return launch_rows<T, 2>(w, n, k, in, out, ldc, accumulate, t, stream);
    case 3: return launch_rows<T, 3>(w, n, k, in, out, ldc, accumulate, t, stream);
    case 4: return launch_rows<T, 4>(w, n, k, in, out, ldc, accumulate, t, stream);
    case 5: return launch_rows<T, 5>(w, n, k, in, out, ldc, accumulate, t, stream);
    case 6: return launch_rows<T, 6>(w, n, k, in, out, ldc, accumulate, t, stream);
    case 7: return launch_rows<T, 7>(w, n, k, in, out, ldc, accumulate, t, stream);
    default: return launch_rows<T, 8>(w, n, k, in, out, ldc, accumulate, t, stream);
  }
}

}  // namespace

small_batch_gemm_tuning small_batch_gemm_default_tuning(int64_t n, int64_t k, int32_t rows,
                                                        int32_t elem_bytes) noexcept {
  small_batch_gemm_tuning t;
  t.columns_per_warp = rows > 4 ? 2 : 1;
  const int64_t row_chunks = elem_bytes > 0 ? k * elem_bytes / 16 : 0;
  const int64_t column_warps = (n + t.columns_per_warp - 1) / t.columns_per_warp;
  // Split further only while the columns alone are short of a full GPU of warps, and each part still
  // gives every lane at least two full loop steps (so the loads in flight are not cut short).
  const int64_t chunks_per_step = 32 * int64_t{kLoadsInFlight / t.columns_per_warp};
  while (t.warps_per_column < kWarps && column_warps * t.warps_per_column < kFillWarps &&
         row_chunks >= 2 * 2 * t.warps_per_column * chunks_per_step) {
    t.warps_per_column *= 2;
  }
  return t;
}

bool small_batch_gemm_supports(const float* w, int64_t n, int64_t k, const float* in, int32_t rows) noexcept {
  return supports(w, n, k, in, rows);
}
bool small_batch_gemm_supports(const bf16* w, int64_t n, int64_t k, const bf16* in, int32_t rows) noexcept {
  return supports(w, n, k, in, rows);
}

void small_batch_gemm(const float* w, int64_t n, int64_t k, const float* in, int32_t rows, float* out, int64_t ldc,
                      bool accumulate, cudaStream_t stream) {
  launch(w, n, k, in, rows, out, ldc, accumulate, small_batch_gemm_default_tuning(n, k, rows, sizeof(float)), stream);
}
void small_batch_gemm(const bf16* w, int64_t n, int64_t k, const bf16* in, int32_t rows, float* out, int64_t ldc,
                      bool accumulate, cudaStream_t stream) {
  launch(w, n, k, in, rows, out, ldc, accumulate, small_batch_gemm_default_tuning(n, k, rows, sizeof(bf16)), stream);
}
void small_batch_gemm_with(const float* w, int64_t n, int64_t k, const float* in, int32_t rows, float* out, int64_t ldc,
                           bool accumulate, const small_batch_gemm_tuning& tuning, cudaStream_t stream) {
  launch(w, n, k, in, rows, out, ldc, accumulate, tuning, stream);
}
void small_batch_gemm_with(const bf16* w, int64_t n, int64_t k, const bf16* in, int32_t rows, float* out, int64_t ldc,
                           bool accumulate, const small_batch_gemm_tuning& tuning, cudaStream_t stream) {
  launch(w, n, k, in, rows, out, ldc, accumulate, tuning, stream);
}

int32_t small_batch_gemm_rows_from_env() noexcept {
  static const int32_t rows = [] {
    const char* env = std::getenv("TESSERA_GEMV");
    const std::string v = env != nullptr ? env : "";
    if (v.size() == 1 && v[0] >= '0' && v[0] <= '0' + kMaxGemvRows) return static_cast<int32_t>(v[0] - '0');
    return 1;
  }();
  return rows;
}

}  // namespace tessera::gpu
