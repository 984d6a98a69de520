// AVX2 + FMA + F16C kernels: u8 x s8 dots with vpmaddubsw (pairs to i16, no saturation for |q| <= 127
// against u8 <= 128) then vpmaddwd against ones (to i32); K-quants: vpmaddubsw then vpmaddwd against the
// sub-block scales.
#define TESSERA_SIMD_TARGET "avx2,fma,f16c"
#define TESSERA_SIMD_NAME "avx2"
#define TESSERA_SIMD_GETTER avx2_kernels
#define TESSERA_SIMD_SUPPORTED \
  __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")
#define TESSERA_DPBUSD(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1))
#define TESSERA_DPWSSD(c, a, b) _mm256_add_epi32((c), _mm256_madd_epi16((a), (b)))
#define TESSERA_DPBUSD_ACC(c, u, s) _mm256_add_epi32((c), TESSERA_DPBUSD((u), (s)))
#include "cpu/kernels_simd.inc"
