/* optim_cpu_avx512.c: the AdamW loop of optim.c in AVX-512 intrinsics, 16 elements a vector,
 * run in the avx512 kernel sets (sh_optim_avx512, cpu.h); optim.c's portable loop does the tails and every other CPU. One pass: param, grad,
 * m and v are loaded once, and param, m, v and the bf16 or f32 shadow stored once.
 * The operations are optim.c's, one IEEE operation each in the same order (mul, add, sqrt,
 * div: no FMA, and the Makefile builds both files with -ffp-contract=off), so this loop and the
 * portable one give the same bits; bf16 rounding is sh_f32_to_bf16_inline's (nearest even, NaN
 * kept quiet). */
#include "optim_internal.h"
#include "cpu_internal.h"

#if !SH_OPTIM_HAVE_AVX512
int sh_optim_avx512(void) { return 0; }
#else
#include <immintrin.h>

int sh_optim_avx512(void) { return sh_cpu_isa_fast() >= SH_CPU_AVX512; }

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 load_bf16(const uint16_t *g) {
  __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

/* Rounds x to bf16 as sh_f32_to_bf16_inline does and stores the 16 halves at s. */
AVX512 static inline void store_bf16(uint16_t *s, __m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  __m512i nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  __m512i r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, nan);
  _mm256_storeu_si256((__m256i *)s, _mm512_cvtepi32_epi16(r));
}

/* The whole vectors of [i0, i1); G_BF16 and SHADOW are constants in each caller, so every
 * (grad dtype, shadow kind) pair compiles to a straight loop without branches. */
AVX512 static inline int64_t adamw_vectors(const sh_adamw_buf *b, int64_t i0, int64_t i1, int g_bf16, int shadow) {
  const sh_adamw_hyper *h = &b->h;
  const __m512 scale = _mm512_set1_ps(h->scale), decay = _mm512_set1_ps(h->decay);
  const __m512 b1 = _mm512_set1_ps(h->b1), omb1 = _mm512_set1_ps(h->omb1);
  const __m512 b2 = _mm512_set1_ps(h->b2), omb2 = _mm512_set1_ps(h->omb2);
  const __m512 step_size = _mm512_set1_ps(h->step_size), bc2_sqrt = _mm512_set1_ps(h->bc2_sqrt);
  const __m512 eps = _mm512_set1_ps(h->eps);
  float *p = b->p, *m = b->m, *v = b->v;
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    __m512 g = g_bf16 ? load_bf16(b->g16 + i) : _mm512_loadu_ps(b->g32 + i);
    g = _mm512_mul_ps(g, scale);
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), b1), _mm512_mul_ps(g, omb1));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2), _mm512_mul_ps(_mm512_mul_ps(g, g), omb2));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2_sqrt), eps);
    __m512 pi = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(p + i), decay),
                              _mm512_mul_ps(step_size, _mm512_div_ps(mi, denom)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
    if (shadow == SH_BF16) store_bf16((uint16_t *)b->shadow + i, pi);
    else if (shadow == SH_F32) _mm512_storeu_ps((float *)b->shadow + i, pi);
  }
  return i;
}

AVX512 int64_t sh_adamw_avx512(const sh_adamw_buf *b, int64_t i0, int64_t i1) {
  int shadow = b->shadow ? b->shadow_dtype : -1;
  if (shadow != -1 && shadow != SH_BF16 && shadow != SH_F32) return i0;
  int g_bf16 = b->g32 == NULL;
#define ADAMW_PAIR(G, S) if (g_bf16 == (G) && shadow == (S)) return adamw_vectors(b, i0, i1, G, S);
  ADAMW_PAIR(0, -1) ADAMW_PAIR(0, SH_BF16) ADAMW_PAIR(0, SH_F32)
  ADAMW_PAIR(1, -1) ADAMW_PAIR(1, SH_BF16) ADAMW_PAIR(1, SH_F32)
#undef ADAMW_PAIR
  return i0;
}

#endif
