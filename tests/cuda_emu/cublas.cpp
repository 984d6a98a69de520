// cuBLAS of the CPU emulation (tests/cuda_emu/include/cublas_v2.h): handles and the GEMMs, with cuBLAS's
// column-major semantics (C = alpha op(A) op(B) + beta C, op(X) = X or X^T, leading dimensions),
// its argument checks and status codes, computed in fp32 on the host: bf16 operands are widened to
// fp32 first (exact), then OpenBLAS's sgemm when it was found at build time (TESSERA_EMU_OPENBLAS),
// else a plain loop. beta == 0 never reads C (as in cuBLAS, so C may hold NaNs). Every operand must
// lie inside a live allocation (std::logic_error otherwise, also when a captured GEMM is replayed).
// Not emulated: the GPU's summation order and Tensor Core rounding (TF32 / FAST_16BF compute types
// run in full fp32 here).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime_internal.hpp"

#if defined(TESSERA_EMU_OPENBLAS)
#include <cblas.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace tessera::gpu::emu {
namespace {

std::mutex g_mu;
std::set<const cublasContext*> g_handles;

bool valid(cublasHandle_t h) {
  std::lock_guard lock(g_mu);
  return h && g_handles.count(h);
}

size_t element_bytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}

// An operand stored as `rows` x `cols` column-major with leading dimension ld.
struct operand {
  const void* data;
  cudaDataType_t type;
  int rows, cols, ld;
  int64_t elements() const { return rows == 0 || cols == 0 ? 0 : int64_t{ld} * (cols - 1) + rows; }
};

void check_operand(const operand& o, const char* role) {
  const std::string why = check_device_range(o.data, static_cast<size_t>(o.elements()) * element_bytes(o.type), role);
  if (!why.empty()) throw std::logic_error("gpu emulation: cublasGemmEx: " + why);
}

// The operand as packed fp32 (ld = rows), or its own storage when it is fp32 already.
const float* as_f32(const operand& o, std::vector<float>& scratch, int* ld) {
  if (o.type == CUDA_R_32F) {
    *ld = o.ld;
    return static_cast<const float*>(o.data);
  }
  scratch.resize(static_cast<size_t>(o.rows) * static_cast<size_t>(o.cols));
  const auto* src = static_cast<const uint16_t*>(o.data);
  for (int c = 0; c < o.cols; ++c) {
    const uint16_t* col = src + static_cast<int64_t>(c) * o.ld;
    float* dst = scratch.data() + static_cast<size_t>(c) * static_cast<size_t>(o.rows);
    for (int r = 0; r < o.rows; ++r) dst[r] = bf16_to_float(col[r]);
  }
  *ld = std::max(1, o.rows);
  return scratch.data();
}

// C[m, n] (column-major, ldc) = alpha op(A) op(B) + beta C, fp32.
void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
  if (m == 0 || n == 0) return;
  if (beta == 0.0f) {
    for (int j = 0; j < n; ++j) std::fill_n(C + static_cast<int64_t>(j) * ldc, m, 0.0f);
  }
  if (k == 0 || alpha == 0.0f) {
    if (beta != 0.0f && beta != 1.0f) {
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) C[static_cast<int64_t>(j) * ldc + i] *= beta;
    }
    return;
  }
#if defined(TESSERA_EMU_OPENBLAS)
  // One OpenBLAS thread: the emulator runs where other work (the CPU executor it is compared with,
  // other tests) already uses the cores, and OpenBLAS's idle threads spin in sched_yield.
  static const bool single_threaded = (openblas_set_num_threads(1), true);
  (void)single_threaded;
  cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B,
              ldb, beta, C, ldc);
#else
  for (int j = 0; j < n; ++j) {
    float* c = C + static_cast<int64_t>(j) * ldc;
    if (beta != 0.0f && beta != 1.0f)
      for (int i = 0; i < m; ++i) c[i] *= beta;
    auto b_at = [&](int p) { return tb ? B[static_cast<int64_t>(p) * ldb + j] : B[static_cast<int64_t>(j) * ldb + p]; };
    if (!ta) {
      for (int p = 0; p < k; ++p) {
        const float s = alpha * b_at(p);
        const float* a = A + static_cast<int64_t>(p) * lda;
        for (int i = 0; i < m; ++i) c[i] += s * a[i];
      }
    } else {
      std::vector<float> bcol(static_cast<size_t>(k));
      for (int p = 0; p < k; ++p) bcol[static_cast<size_t>(p)] = b_at(p);
      for (int i = 0; i < m; ++i) {
        const float* a = A + static_cast<int64_t>(i) * lda;
        float s = 0.0f;
        for (int p = 0; p < k; ++p) s += a[p] * bcol[static_cast<size_t>(p)];
        c[i] += alpha * s;
      }
    }
  }
#endif
}

struct gemm_args {
  bool ta, tb;
  int m, n, k;
  operand a, b;
  void* c;
  cudaDataType_t ctype;
  int ldc;
};

// sum a[i] * b[i], b fp32, a fp32 or bf16 (widened on the fly): 16 lanes of partial sums.
template <class A>
float dot(const A* a, const float* b, int k) {
#if defined(__SSE2__)
  __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps(), s2 = _mm_setzero_ps(), s3 = _mm_setzero_ps();
  int i = 0;
  for (; i + 16 <= k; i += 16) {
    __m128 a0, a1, a2, a3;
    if constexpr (std::is_same_v<A, float>) {
      a0 = _mm_loadu_ps(a + i), a1 = _mm_loadu_ps(a + i + 4), a2 = _mm_loadu_ps(a + i + 8),
      a3 = _mm_loadu_ps(a + i + 12);
    } else {  // bf16: the 16 bits are the high half of the fp32 pattern
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8));
      const __m128i z = _mm_setzero_si128();
      a0 = _mm_castsi128_ps(_mm_unpacklo_epi16(z, lo)), a1 = _mm_castsi128_ps(_mm_unpackhi_epi16(z, lo));
      a2 = _mm_castsi128_ps(_mm_unpacklo_epi16(z, hi)), a3 = _mm_castsi128_ps(_mm_unpackhi_epi16(z, hi));
    }
    s0 = _mm_add_ps(s0, _mm_mul_ps(a0, _mm_loadu_ps(b + i)));
    s1 = _mm_add_ps(s1, _mm_mul_ps(a1, _mm_loadu_ps(b + i + 4)));
    s2 = _mm_add_ps(s2, _mm_mul_ps(a2, _mm_loadu_ps(b + i + 8)));
    s3 = _mm_add_ps(s3, _mm_mul_ps(a3, _mm_loadu_ps(b + i + 12)));
  }
  alignas(16) float part[4];
  _mm_store_ps(part, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
  float s = (part[0] + part[1]) + (part[2] + part[3]);
#else
  float s = 0.0f;
  int i = 0;
#endif
  for (; i < k; ++i) {
    if constexpr (std::is_same_v<A, float>) {
      s += a[i] * b[i];
    } else {
      s += bf16_to_float(a[i]) * b[i];
    }
  }
  return s;
}

// C = alpha A^T B + beta C for a few columns of B (decode: one per sequence): a dot product per
// output, reading each row of the stored A once per column, no packing, no fp32 copy of a bf16 A.
template <class A>
void gemm_tn_small(const gemm_args& g, const A* a, const float* b, int ldb, float alpha, float beta) {
  auto* C = static_cast<float*>(g.c);
  for (int j = 0; j < g.n; ++j) {
    const float* bj = b + static_cast<int64_t>(j) * ldb;
    float* cj = C + static_cast<int64_t>(j) * g.ldc;
    for (int i = 0; i < g.m; ++i) {
      const float v = alpha * dot(a + static_cast<int64_t>(i) * g.a.ld, bj, g.k);
      cj[i] = beta == 0.0f ? v : v + beta * cj[i];
    }
  }
}

void run_gemm(const gemm_args& g, float alpha, float beta) {
  check_operand(g.a, "A");
  check_operand(g.b, "B");
  const operand c{g.c, g.ctype, g.m, g.n, g.ldc};
  check_operand(c, "C");
  thread_local std::vector<float> sa, sb, sc;
  if (g.ta && !g.tb && g.n <= 16 && g.ctype == CUDA_R_32F) {
    int ldb = 0;
    const float* B = as_f32(g.b, sb, &ldb);
    if (g.a.type == CUDA_R_32F) {
      gemm_tn_small(g, static_cast<const float*>(g.a.data), B, ldb, alpha, beta);
    } else {
      gemm_tn_small(g, static_cast<const uint16_t*>(g.a.data), B, ldb, alpha, beta);
    }
    return;
  }
  int lda = 0, ldb = 0;
  const float* A = as_f32(g.a, sa, &lda);
  const float* B = as_f32(g.b, sb, &ldb);
  if (g.ctype == CUDA_R_32F) {
    sgemm(g.ta, g.tb, g.m, g.n, g.k, alpha, A, lda, B, ldb, beta, static_cast<float*>(g.c), g.ldc);
    return;
  }
  // bf16 output: fp32 accumulation, one rounding at the end.
  sc.assign(static_cast<size_t>(g.m) * static_cast<size_t>(g.n), 0.0f);
  auto* C16 = static_cast<uint16_t*>(g.c);
  if (beta != 0.0f) {
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i)
        sc[static_cast<size_t>(j) * g.m + i] = bf16_to_float(C16[static_cast<int64_t>(j) * g.ldc + i]);
  }
  sgemm(g.ta, g.tb, g.m, g.n, g.k, alpha, A, lda, B, ldb, beta, sc.data(), std::max(1, g.m));
  for (int j = 0; j < g.n; ++j)
    for (int i = 0; i < g.m; ++i)
      C16[static_cast<int64_t>(j) * g.ldc + i] = float_to_bf16_rn(sc[static_cast<size_t>(j) * g.m + i]);
}

cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                    const void* alpha, const void* A, cudaDataType_t Atype, int lda, long long strideA, const void* B,
                    cudaDataType_t Btype, int ldb, long long strideB, const void* beta, void* C, cudaDataType_t Ctype,
                    int ldc, long long strideC, int batch, cublasComputeType_t compute) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto bad = [](const std::string& why) {
    report(cudaErrorInvalidValue, "cuBLAS GEMM: " + why);
    return CUBLAS_STATUS_INVALID_VALUE;
  };
  if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) || (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T)) {
    return bad("only CUBLAS_OP_N and CUBLAS_OP_T (real types)");
  }
  if (m < 0 || n < 0 || k < 0 || batch < 0) return bad("negative m, n, k or batch count");
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  const int a_rows = ta ? k : m, b_rows = tb ? n : k;
  if (lda < std::max(1, a_rows))
    return bad("lda " + std::to_string(lda) + " < rows of the stored A (" + std::to_string(a_rows) + ")");
  if (ldb < std::max(1, b_rows))
    return bad("ldb " + std::to_string(ldb) + " < rows of the stored B (" + std::to_string(b_rows) + ")");
  if (ldc < std::max(1, m)) return bad("ldc " + std::to_string(ldc) + " < m (" + std::to_string(m) + ")");
  if (!alpha || !beta) return bad("null alpha or beta");
  const bool inputs_ok = Atype == Btype && (Atype == CUDA_R_32F || Atype == CUDA_R_16BF);
  const bool output_ok = Ctype == CUDA_R_32F || (Ctype == CUDA_R_16BF && Atype == CUDA_R_16BF);
  const bool compute_ok = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                          compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16BF;
  if (!inputs_ok || !output_ok || !compute_ok) {
    report(cudaErrorNotSupported,
           "cuBLAS GEMM: type combination not emulated (A/B both f32 or bf16, C f32 or bf16, f32 compute)");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool host_scalars = handle->pointer_mode == CUBLAS_POINTER_MODE_HOST;
  const float alpha_now = host_scalars ? *static_cast<const float*>(alpha) : 0.0f;
  const float beta_now = host_scalars ? *static_cast<const float*>(beta) : 0.0f;
  const auto* alpha_ptr = static_cast<const float*>(alpha);
  const auto* beta_ptr = static_cast<const float*>(beta);
  std::vector<gemm_args> work;
  for (int i = 0; i < batch; ++i) {
    gemm_args g;
    g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
    g.a = {static_cast<const char*>(A) + i * strideA * static_cast<long long>(element_bytes(Atype)), Atype, a_rows,
           ta ? m : k, lda};
    g.b = {static_cast<const char*>(B) + i * strideB * static_cast<long long>(element_bytes(Btype)), Btype, b_rows,
           tb ? k : n, ldb};
    g.c = static_cast<char*>(C) + i * strideC * static_cast<long long>(element_bytes(Ctype));
    g.ctype = Ctype;
    g.ldc = ldc;
    // Checked at the call too, so a bad operand fails where it is passed, not only when run.
    check_operand(g.a, "A");
    check_operand(g.b, "B");
    check_operand({g.c, Ctype, m, n, ldc}, "C");
    work.push_back(g);
  }
  const cudaError_t e = enqueue_work(handle->stream, "cublasGemmEx", [=] {
    const float al = host_scalars ? alpha_now : *alpha_ptr;
    const float be = host_scalars ? beta_now : *beta_ptr;
    for (const gemm_args& g : work) run_gemm(g, al, be);
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace
}  // namespace tessera::gpu::emu

using namespace tessera::gpu::emu;

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  auto* h = new cublasContext;
  std::lock_guard lock(g_mu);
  g_handles.insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  std::lock_guard lock(g_mu);
  if (!handle || !g_handles.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  g_handles.erase(handle);
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0) {
    const std::string why = check_device_range(workspace, bytes, "cublasSetWorkspace workspace");
    if (!why.empty()) {
      report(cudaErrorInvalidValue, why);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return valid(handle) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) { return cublasGetStatusName(status); }

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1,
              computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void* B, cudaDataType_t Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
              ldc, strideC, batchCount, computeType);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, beta, C, CUDA_R_32F,
              ldc, 0, 1, CUBLAS_COMPUTE_32F);
}
