// AVX512-VNNI kernels: the quantized and float matmuls on 512-bit vectors (two legacy blocks per
// vpdpbusd, 64 K-quant values per vpmaddubsw + vpdpwssd, 2x4 register tiles; 16 float lanes, BF16 by
// vdpbf16ps where available); the remaining helpers on 256-bit vectors.
#define TESSERA_SIMD_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define TESSERA_SIMD_NAME "avx512vnni"
#define TESSERA_SIMD_GETTER avx512vnni_kernels
#define TESSERA_SIMD_SUPPORTED                                                                         \
  __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") && \
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")
#define TESSERA_DPBUSD(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#define TESSERA_SIMD_512 1
// BF16 weights use vdpbf16ps where the CPU has AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4),
// checked per call; without it they are widened for FMA like in the other tables.
#define TESSERA_SIMD_TARGET_BF16 "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16"
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() values, which -Wuninitialized
// reports at every inlined use (a known false positive of the compiler's own headers).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TESSERA_DPWSSD(c, a, b) _mm256_dpwssd_epi32((c), (a), (b))
#define TESSERA_DPBUSD_ACC(c, u, s) _mm256_dpbusd_epi32((c), (u), (s))
#define TESSERA_HAS_VNNI 1
#include "cpu/kernels_simd.inc"
