/* optim_simd_internal.h: optim.c's AdamW loop at SH_SIMD_W lanes (built per width in optim.c,
 * simd_internal.h). One pass: param, grad, m and v are loaded once, and param, m, v and the
 * bf16 or f32 shadow stored once. The operations are the portable loop's, one IEEE operation
 * each in the same order (mul, add, sqrt, div: no FMA, and the Makefile builds optim.c with
 * -ffp-contract=off), so every width and the portable loop give the same bits; bf16 rounding
 * is sh_f32_to_bf16_inline's (nearest even, NaN kept quiet). */

/* The whole vectors of [i0, i1); G_BF16 and SHADOW are constants in each caller, so every
 * (grad dtype, shadow kind) pair compiles to a straight loop without branches. */
SH_V_TARGET static inline __attribute__((always_inline)) int64_t SH_W_NAME(adamw_loop)(
    const adamw_buf *b, int64_t i0, int64_t i1, int g_bf16, int shadow) {
  const sh_adamw_hyper *h = &b->h;
  const SH_VF scale = SH_V(set1)(h->scale), decay = SH_V(set1)(h->decay);
  const SH_VF b1 = SH_V(set1)(h->b1), omb1 = SH_V(set1)(h->omb1);
  const SH_VF b2 = SH_V(set1)(h->b2), omb2 = SH_V(set1)(h->omb2);
  const SH_VF step_size = SH_V(set1)(h->step_size), bc2_sqrt = SH_V(set1)(h->bc2_sqrt);
  const SH_VF eps = SH_V(set1)(h->eps);
  float *p = b->p, *m = b->m, *v = b->v;
  int64_t i = i0;
  for (; i + SH_SIMD_W <= i1; i += SH_SIMD_W) {
    SH_VF g = g_bf16 ? SH_V(bf16_to_f32)(SH_V(loadu_bf16)(b->g16 + i)) : SH_V(loadu)(b->g32 + i);
    g = SH_V(mul)(g, scale);
    SH_VF mi = SH_V(add)(SH_V(mul)(SH_V(loadu)(m + i), b1), SH_V(mul)(g, omb1));
    SH_VF vi = SH_V(add)(SH_V(mul)(SH_V(loadu)(v + i), b2), SH_V(mul)(SH_V(mul)(g, g), omb2));
    SH_VF denom = SH_V(add)(SH_V(div)(SH_V(sqrt)(vi), bc2_sqrt), eps);
    SH_VF pi = SH_V(sub)(SH_V(mul)(SH_V(loadu)(p + i), decay), SH_V(mul)(step_size, SH_V(div)(mi, denom)));
    SH_V(storeu)(m + i, mi);
    SH_V(storeu)(v + i, vi);
    SH_V(storeu)(p + i, pi);
    if (shadow == SH_BF16) SH_V(storeu_bf16)((uint16_t *)b->shadow + i, SH_V(f32_to_bf16)(pi));
    else if (shadow == SH_F32) SH_V(storeu)((float *)b->shadow + i, pi);
  }
  return i;
}

/* The whole vectors of [i0, i1) of b; returns where it stopped (i0 when the shadow is neither
 * bf16 nor f32: the portable loop stores the others). */
SH_V_TARGET static int64_t SH_W_NAME(adamw_vectors)(const adamw_buf *b, int64_t i0, int64_t i1) {
  int shadow = b->shadow ? b->shadow_dtype : -1;
  if (shadow != -1 && shadow != SH_BF16 && shadow != SH_F32) return i0;
  int g_bf16 = b->g32 == NULL;
#define ADAMW_PAIR(G, S) if (g_bf16 == (G) && shadow == (S)) return SH_W_NAME(adamw_loop)(b, i0, i1, G, S);
  ADAMW_PAIR(0, -1) ADAMW_PAIR(0, SH_BF16) ADAMW_PAIR(0, SH_F32)
  ADAMW_PAIR(1, -1) ADAMW_PAIR(1, SH_BF16) ADAMW_PAIR(1, SH_F32)
#undef ADAMW_PAIR
  return i0;
}
