/* sgemm_tiles_internal.h: one kernel set's half of sgemm.c: its packing of op(b) into panels and its
 * micro-kernels. sgemm.c includes it once per set, having defined
 *   SET       the set's name, the suffix of every function here (pack_b_avx2, ...)
 *   TARGET    the set's target attribute
 *   MR, VW    rows of a tile; lanes of a vector (a panel is NR = 2 VW columns, a tail one VW)
 *   VF        the vector type, and on it V_ZERO(), V_SET1(x), V_LOADU(p), V_STOREU(p, v),
 *             V_LOADN(p, n) / V_STOREN(p, v, n) (the first n lanes, the others zero / left
 *             alone), V_FMA(a, b, c) = a b + c, V_MUL(a, b), and V_TRANSPOSE(in, out) (VW
 *             vectors of VW floats)
 * and leaves sgemm_set NAME(sgemm): what sgemm.c's driver calls. */
#define NR (2 * VW)
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define NAME(x) CAT(x, SET)

/* op(b)[k0 .. k0+kc, j0 .. j0+n] into panels: panel jp at dst + jp NR kc, row q of it at
 * + q width (NR, or VW for a tail of at most VW columns); columns past n are zero. b as
 * stored: k x n, or n x k when trans. */
TARGET static void NAME(pack_b)(float *dst, const float *b, int ldb, int trans, int k0, int kc, int j0, int n) {
  for (int jp = 0; jp * NR < n; jp++) {
    float *panel = dst + (size_t)jp * NR * kc;
    int cols = n - jp * NR, w = cols > VW ? NR : VW;
    if (!trans) {
      const float *src = b + (size_t)k0 * ldb + j0 + jp * NR;
      for (int q = 0; q < kc; q++)
        for (int h = 0; h < w; h += VW) {
          const float *row = src + (size_t)q * ldb + h;
          V_STOREU(panel + q * w + h, cols - h >= VW ? V_LOADU(row) : V_LOADN(row, cols - h));
        }
      continue;
    }
    /* VW columns x VW rows of k at a time: rows of the stored b, transposed */
    for (int h = 0; h < w; h += VW)
      for (int q0 = 0; q0 < kc; q0 += VW) {
        VF in[VW], out[VW];
#pragma GCC unroll 16
        for (int r = 0; r < VW; r++)
          in[r] = h + r < cols ? V_LOADN(b + (size_t)(j0 + jp * NR + h + r) * ldb + k0 + q0, kc - q0) : V_ZERO();
        V_TRANSPOSE(in, out);
        for (int q = 0; q < VW && q0 + q < kc; q++) V_STOREU(panel + (q0 + q) * w + h, out[q]);
      }
  }
}

/* c[0:mr, 0:nr] = alpha (a tile . panel) + beta c over kc, the tile's element (r, q) at
 * a[r rs + q cs]; a panel row is V vectors (NR or VW columns), rows ps floats apart. Inlined
 * into one function per tile layout and width, so rs, cs and V are constants where it
 * matters. Each accumulator takes its k products in order, one FMA after another. */
TARGET static inline __attribute__((always_inline)) void NAME(tile)(
    int kc, const float *a, size_t rs, size_t cs, const float *panel, size_t ps, int V, int PF, float *c, int ldc,
    int mr, int nr, float alpha, float beta) {
  VF acc[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = V_ZERO();
  for (int q = 0; q < kc; q++) {
    if (PF & PREFETCH_A) {   /* both lines the tile's row q + PF_DIST may touch */
      _mm_prefetch((const char *)(a + (q + PF_DIST) * cs), _MM_HINT_T0);
      _mm_prefetch((const char *)(a + (q + PF_DIST) * cs + (MR - 1) * rs), _MM_HINT_T0);
    }
    if (PF & PREFETCH_B) {   /* the panel's row q + PF_DIST */
      _mm_prefetch((const char *)(panel + (q + PF_DIST) * ps), _MM_HINT_T0);
      _mm_prefetch((const char *)(panel + (q + PF_DIST) * ps + NR - 1), _MM_HINT_T0);
    }
    VF b0 = V_LOADU(panel + q * ps);
    VF b1 = V == 2 ? V_LOADU(panel + q * ps + VW) : b0;
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      VF av = V_SET1(a[r * rs + q * cs]);
      acc[r][0] = V_FMA(av, b0, acc[r][0]);
      if (V == 2) acc[r][1] = V_FMA(av, b1, acc[r][1]);
    }
  }
  VF va = V_SET1(alpha), vb = V_SET1(beta);
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < V; v++) {
      float *p = c + (size_t)r * ldc + VW * v;
      int n = nr - VW * v;
      VF x = V_MUL(acc[r][v], va);
      /* masked only at a tail: AVX2's masked store costs many times a plain one */
      if (beta != 0.0f) x = V_FMA(vb, n >= VW ? V_LOADU(p) : V_LOADN(p, n), x);
      if (n >= VW) V_STOREU(p, x);
      else V_STOREN(p, x, n);
    }
}

/* a's tile as MR stored rows (ld apart), or as MR adjacent elements of stored rows ld apart */
#define TILE_FN(name, RS, CS, V, PF)                                                                          \
  TARGET static void NAME(name)(int kc, const float *a, size_t ld, const float *panel, size_t ps, float *c, int ldc, \
                                int mr, int nr, float alpha, float beta) {                                     \
    NAME(tile)(kc, a, RS, CS, panel, ps, V, PF, c, ldc, mr, nr, alpha, beta);                                 \
  }
TILE_FN(tile_rows2, ld, 1, 2, 0)
TILE_FN(tile_rows2_b, ld, 1, 2, PREFETCH_B)
TILE_FN(tile_rows1, ld, 1, 1, 0)
TILE_FN(tile_cols2, 1, ld, 2, 0)
TILE_FN(tile_cols2_a, 1, ld, 2, PREFETCH_A)
TILE_FN(tile_cols2_b, 1, ld, 2, PREFETCH_B)
TILE_FN(tile_cols2_ab, 1, ld, 2, PREFETCH_A | PREFETCH_B)
TILE_FN(tile_cols1, 1, ld, 1, 0)
TILE_FN(tile_cols1_a, 1, ld, 1, PREFETCH_A)
#undef TILE_FN

/* Only a transposed a prefetches a, and only a whole panel read in place prefetches b: the
 * other entries repeat the kernel without the prefetch they never ask for. */
static const sgemm_set NAME(sgemm) = {
  MR, NR, NAME(pack_b),
  { { { NAME(tile_cols1), NAME(tile_cols1_a), NAME(tile_cols1), NAME(tile_cols1_a) },
      { NAME(tile_cols2), NAME(tile_cols2_a), NAME(tile_cols2_b), NAME(tile_cols2_ab) } },
    { { NAME(tile_rows1), NAME(tile_rows1), NAME(tile_rows1), NAME(tile_rows1) },
      { NAME(tile_rows2), NAME(tile_rows2), NAME(tile_rows2_b), NAME(tile_rows2_b) } } },
};

#undef NR
#undef NAME
#undef CAT
#undef CAT_
