/* sgemm_tiles_internal.h: one kernel set's half of sgemm.c, its packing of op(b) into panels
 * and its micro-kernels. sgemm.c includes it once per set, having defined
 *   SET, ISA  the set's name, the suffix of every function here (pack_b_avx2, ...); its cpu.h id
 *   TARGET    the set's target attribute
 *   MR, VW, NV  rows of a tile; lanes of a vector; vectors in a row of a whole panel (a panel
 *             is NR = NV VW columns, a tail panel of at most VW columns one vector)
 *   PACK_TA   1 when a transposed a is packed (k-major tiles), 0 when it is read in place
 *   DIRECT_B  up to this many rows of c, a b not transposed is read in place, not packed
 *   VF        the vector type, and on it V_ZERO(), V_SET1(x), V_LOADU(p), V_STOREU(p, v),
 *             V_LOADN(p, n) / V_STOREN(p, v, n) (the first n lanes, 0 < n < VW: the others
 *             zero / left alone), V_FMA(a, b, c) = a b + c, V_MUL(a, b), and
 *             V_TRANSPOSE(in, out) (VW vectors of VW floats)
 * and leaves `static const sh_sgemm_kernel kernel_SET`, what sgemm.c's driver calls; it undefines
 * those names at its end, ready for the next set. */
#define NR (NV * VW)
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define NAME(x) CAT(x, SET)

/* The first n lanes at p (the others zero), or at p stored from v: plain whole vectors, masked
 * only at a tail (AVX2's masked store costs many times a plain one). */
TARGET static inline __attribute__((always_inline)) VF NAME(load_n)(const float *p, int n) {
  return n >= VW ? V_LOADU(p) : V_LOADN(p, n);
}
TARGET static inline __attribute__((always_inline)) void NAME(store_n)(float *p, VF v, int n) {
  if (n >= VW) V_STOREU(p, v);
  else V_STOREN(p, v, n);
}

/* op(b)[k0 .. k0+kc, j0 .. j0+n] into panels: panel jp at dst + jp NR kc, row q of it at
 * + q width (NR, or VW for a tail of at most VW columns); columns past n are zero. b as
 * stored: k x n, or n x k when trans. A b k x n is copied PACK_ROWS rows at a time, panel by
 * panel: its rows are read along their length, where the hardware's prefetchers follow, and
 * each panel gets PACK_ROWS rows in a row (panels lie a multiple of 4 KiB apart: a row at a
 * time into every panel evicted each other's lines; a panel at a time read b's rows a page
 * apart: either way about a third of a 128-row product's time, now a tenth). */
TARGET static void NAME(pack_b)(float *dst, const float *b, int ldb, int trans, int k0, int kc, int j0, int n) {
  if (!trans) {
    for (int q0 = 0; q0 < kc; q0 += PACK_ROWS)
      for (int jp = 0; jp * NR < n; jp++) {
        int cols = n - jp * NR, w = cols > VW ? NR : VW;
        const float *src = b + (size_t)(k0 + q0) * ldb + j0 + jp * NR;
        float *row = dst + (size_t)jp * NR * kc + (size_t)q0 * w;
        for (int q = 0; q < PACK_ROWS && q0 + q < kc; q++, src += ldb, row += w)
#pragma GCC unroll 4
          for (int h = 0; h < w; h += VW) V_STOREU(row + h, cols > h ? NAME(load_n)(src + h, cols - h) : V_ZERO());
      }
    return;
  }
  for (int jp = 0; jp * NR < n; jp++) {
    float *panel = dst + (size_t)jp * NR * kc;
    int cols = n - jp * NR, w = cols > VW ? NR : VW;
    /* VW columns x VW rows of k at a time: rows of the stored b, transposed */
    for (int h = 0; h < w; h += VW)
      for (int q0 = 0; q0 < kc; q0 += VW) {
        VF in[VW], out[VW];
#pragma GCC unroll 16
        for (int r = 0; r < VW; r++)
          in[r] = h + r < cols ? NAME(load_n)(b + (size_t)(j0 + jp * NR + h + r) * ldb + k0 + q0, kc - q0) : V_ZERO();
        V_TRANSPOSE(in, out);
        for (int q = 0; q < VW && q0 + q < kc; q++) V_STOREU(panel + (q0 + q) * w + h, out[q]);
      }
  }
}

/* A transposed a's rows i0 .. i0+mg of op(a) over k0 .. k0+kc (from stored rows k0 .. k0+kc)
 * into k-major tiles of MR rows: tile t at dst + t tile_stride, its element (r, q) at
 * [q MR + r], rows past mg zero. A row of k is read once for all the tiles, along its length;
 * each tile's row is stored as whole vectors, the next row overwriting what runs past this
 * one (tile_stride leaves VW floats to spare). The rows of k lie a page or more apart: it
 * prefetches PF_DIST rows ahead. */
TARGET static void NAME(pack_a)(float *dst, size_t tile_stride, const float *a, int lda, int i0, int mg, int k0,
                                int kc) {
  for (int q = 0; q < kc; q++) {
    const float *row = a + (size_t)(k0 + q) * lda + i0;
    for (int f = 0; f < mg; f += 16) _mm_prefetch((const char *)(row + (size_t)PF_DIST * lda + f), _MM_HINT_T0);
    _mm_prefetch((const char *)(row + (size_t)PF_DIST * lda + mg - 1), _MM_HINT_T0);
    for (int t = 0; t * MR < mg; t++)
#pragma GCC unroll 4
      for (int h = 0; h < MR; h += VW) {
        int left = mg - t * MR - h;
        V_STOREU(dst + t * tile_stride + (size_t)q * MR + h, left > 0 ? NAME(load_n)(row + t * MR + h, left) : V_ZERO());
      }
  }
}

/* c[0:mr, 0:nr] = alpha (a tile . panel) + beta c over kc, the tile's element (r, q) at
 * a[r rs + q cs]; a panel row is V vectors (NV, or 1 for a tail panel), rows ps floats apart.
 * Inlined into one function per tile layout and width, so rs, cs and V are constants where it
 * matters. Each accumulator takes its k products in order, one FMA after another. */
TARGET static inline __attribute__((always_inline)) void NAME(tile)(
    int kc, const float *a, size_t rs, size_t cs, const float *panel, size_t ps, int V, int PF, float *c, int ldc,
    int mr, int nr, float alpha, float beta) {
  VF acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[r][v] = V_ZERO();
  for (int q = 0; q < kc; q++) {
    if (PF & PREFETCH_A) {   /* both lines the tile's row q + PF_DIST may touch */
      _mm_prefetch((const char *)(a + (q + PF_DIST) * cs), _MM_HINT_T0);
      _mm_prefetch((const char *)(a + (q + PF_DIST) * cs + (MR - 1) * rs), _MM_HINT_T0);
    }
    if (PF & PREFETCH_B)     /* the panel's row q + PF_DIST: a line per 16 floats */
#pragma GCC unroll 4
      for (int f = 0; f < NR; f += 16) _mm_prefetch((const char *)(panel + (q + PF_DIST) * ps + f), _MM_HINT_T0);
    VF bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = v < V ? V_LOADU(panel + q * ps + v * VW) : V_ZERO();
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      VF av = V_SET1(a[r * rs + q * cs]);
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) acc[r][v] = V_FMA(av, bv[v], acc[r][v]);
    }
  }
  VF va = V_SET1(alpha), vb = V_SET1(beta);
  for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
      float *p = c + (size_t)r * ldc + VW * v;
      int n = nr - VW * v;
      if (n <= 0) break;
      VF x = V_MUL(acc[r][v], va);
      if (beta != 0.0f) x = V_FMA(vb, NAME(load_n)(p, n), x);
      NAME(store_n)(p, x, n);
    }
}

/* a's tile as MR stored rows (ld apart), or as MR adjacent elements of stored rows ld apart */
#define TILE_FN(name, RS, CS, V, PF)                                                                          \
  TARGET static void NAME(name)(int kc, const float *a, size_t ld, const float *panel, size_t ps, float *c, int ldc, \
                                int mr, int nr, float alpha, float beta) {                                     \
    NAME(tile)(kc, a, RS, CS, panel, ps, V, PF, c, ldc, mr, nr, alpha, beta);                                 \
  }
TILE_FN(tile_rows, ld, 1, NV, 0)
TILE_FN(tile_rows_b, ld, 1, NV, PREFETCH_B)
TILE_FN(tile_rows1, ld, 1, 1, 0)
TILE_FN(tile_cols, 1, ld, NV, 0)
TILE_FN(tile_cols_a, 1, ld, NV, PREFETCH_A)
TILE_FN(tile_cols_b, 1, ld, NV, PREFETCH_B)
TILE_FN(tile_cols_ab, 1, ld, NV, PREFETCH_A | PREFETCH_B)
TILE_FN(tile_cols1, 1, ld, 1, 0)
TILE_FN(tile_cols1_a, 1, ld, 1, PREFETCH_A)
#undef TILE_FN

/* tile[a as stored rows][whole panel][what it prefetches]: only a transposed a read in place
 * prefetches a, and only a whole panel read in place prefetches b, so the other entries repeat
 * the kernel without the prefetch they never ask for. */
static const sgemm_ops NAME(ops) = {
  VW, PACK_TA, DIRECT_B, NAME(pack_b), NAME(pack_a),
  { { { NAME(tile_cols1), NAME(tile_cols1_a), NAME(tile_cols1), NAME(tile_cols1_a) },
      { NAME(tile_cols), NAME(tile_cols_a), NAME(tile_cols_b), NAME(tile_cols_ab) } },
    { { NAME(tile_rows1), NAME(tile_rows1), NAME(tile_rows1), NAME(tile_rows1) },
      { NAME(tile_rows), NAME(tile_rows), NAME(tile_rows_b), NAME(tile_rows_b) } } },
};
static const sh_sgemm_kernel NAME(kernel) = { ISA, MR, NR, &NAME(ops) };

#undef NR
#undef NAME
#undef CAT
#undef CAT_
#undef SET
#undef ISA
#undef TARGET
#undef MR
#undef VW
#undef NV
#undef PACK_TA
#undef DIRECT_B
#undef VF
#undef V_ZERO
#undef V_SET1
#undef V_LOADU
#undef V_STOREU
#undef V_LOADN
#undef V_STOREN
#undef V_FMA
#undef V_MUL
#undef V_TRANSPOSE
