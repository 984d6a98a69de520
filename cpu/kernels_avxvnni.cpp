// AVX-VNNI kernels (Alder Lake, Sapphire Rapids): vpdpbusd does the u8 x s8 dot to i32 in one op;
// K-quants: vpmaddubsw, then vpdpwssd multiplies by the sub-block scales and accumulates in one op.
#define TESSERA_SIMD_TARGET "avx2,fma,f16c,avxvnni"
#define TESSERA_SIMD_NAME "avxvnni"
#define TESSERA_SIMD_GETTER avxvnni_kernels
#define TESSERA_SIMD_SUPPORTED                                                                         \
  __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") && \
      __builtin_cpu_supports("avxvnni")
#define TESSERA_DPBUSD(u, s) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), (u), (s))
#define TESSERA_DPWSSD(c, a, b) _mm256_dpwssd_avx_epi32((c), (a), (b))
// Sapphire Rapids and Zen 4 also have AVX512_BF16: BF16 weights then use 256-bit (EVEX) vdpbf16ps.
#define TESSERA_SIMD_TARGET_BF16 "avx2,fma,f16c,avxvnni,avx512f,avx512vl,avx512bw,avx512bf16"
#define TESSERA_DPBUSD_ACC(c, u, s) _mm256_dpbusd_avx_epi32((c), (u), (s))
#define TESSERA_HAS_VNNI 1
#include "cpu/kernels_simd.inc"
