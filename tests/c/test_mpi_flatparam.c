/* test_mpi_flatparam.c: the FlatParameter at world sizes 1..4 (tests/run.sh runs it under
 * mpirun): flatten/unshard/reshard round trips, padding and shard sizes, uneven ownership,
 * tied and frozen parameters, grads reduced against sums computed locally, no_shard, hybrid,
 * sharded init, collective counts and the memory peak. */
#include "core/tensor_internal.h"
#include "core/alloc.h"
#include "dist/comm.h"
#include "dist/flatparam.h"
#include "check.h"
#include <string.h>

enum { NP = 5 };
/* p0 [3,5], p1 [7], p2 [2,2,3] frozen, p0 again (tied), p3 [1]: 35 unique elements. */
static const int NDIM[NP] = { 2, 1, 3, 2, 1 };
static const int64_t SHAPE[NP][3] = { { 3, 5 }, { 7 }, { 2, 2, 3 }, { 3, 5 }, { 1 } };
static const int SRC[NP] = { 0, 1, 2, 0, 4 };   /* which tensor each entry is */
static const int64_t TOTAL = 35;

static double pval(int k, int64_t i) { return k * 10.0 + i * 0.013 - 0.5; }
static double gval(int r, int k, int64_t i) { return r * 1.5 + k - i * 0.25; }

static double at(const sh_tensor *t, int64_t i) { return sh_load(sh_tensor_data(t), t->dtype, i); }
static double as(double v, int dtype) { double b[1]; sh_store(b, dtype, 0, v); return sh_load(b, dtype, 0); }

/* The parameters, with values, requires_grad set except on p2; entry 3 is entry 0. */
static void make_params(sh_tensor **p, int with_values) {
  for (int k = 0; k < NP; k++) {
    if (SRC[k] != k) { p[k] = p[SRC[k]]; continue; }
    sh_tensor_empty(&p[k], NDIM[k], SHAPE[k], SH_F32, -1);
    for (int64_t i = 0; i < sh_tensor_numel(p[k]); i++) sh_store(sh_tensor_data(p[k]), SH_F32, i, pval(k, i));
    p[k]->requires_grad = k != 2;
    if (!with_values) sh_tensor_release(p[k]);
  }
}

static void free_params(sh_tensor **p) {
  for (int k = 0; k < NP; k++) if (SRC[k] == k) sh_tensor_destroy(p[k]);
}

/* Flat index of element i of entry k, in the unpadded concatenation. */
static int64_t flat_of(int k, int64_t i) {
  static const int64_t off[NP] = { 0, 15, 22, 0, 34 };
  return off[k] + i;
}

/* The value at flat index j of the full (unpadded + padding) buffer. */
static double flat_val(int64_t j) {
  for (int k = 0; k < NP; k++) {
    if (SRC[k] != k) continue;
    int64_t n = 1;
    for (int d = 0; d < NDIM[k]; d++) n *= SHAPE[k][d];
    if (j >= flat_of(k, 0) && j < flat_of(k, 0) + n) return pval(k, j - flat_of(k, 0));
  }
  return 0;   /* padding */
}

/* The summed grad at flat j over ranks (0 for frozen p2 and padding). */
static double flat_grad(int64_t j, int size, int r0, int step) {
  for (int k = 0; k < NP; k++) {
    if (SRC[k] != k || k == 2) continue;
    int64_t n = 1;
    for (int d = 0; d < NDIM[k]; d++) n *= SHAPE[k][d];
    if (j >= flat_of(k, 0) && j < flat_of(k, 0) + n) {
      double s = 0;
      for (int r = r0; r < r0 + size * step; r += step) s += gval(r, k, j - flat_of(k, 0));
      return s;
    }
  }
  return 0;
}

static void set_grads(sh_tensor **p, int rank) {
  for (int k = 0; k < NP; k++) {
    if (SRC[k] != k) continue;
    sh_tensor *g = NULL;
    sh_tensor_empty(&g, p[k]->ndim, p[k]->shape, p[k]->dtype, -1);
    for (int64_t i = 0; i < sh_tensor_numel(g); i++) sh_store(sh_tensor_data(g), g->dtype, i, gval(rank, k, i));
    sh_tensor_set_grad(p[k], g);   /* the frozen p2 gets one too: it must be ignored */
    sh_tensor_destroy(g);
  }
}

static int params_match(sh_tensor **p, int dtype) {
  int bad = 0;
  for (int k = 0; k < NP; k++) {
    if (sh_tensor_check(p[k], "test") || p[k]->dtype != dtype) { bad++; continue; }
    for (int64_t i = 0; i < sh_tensor_numel(p[k]); i++) bad += at(p[k], i) != as(pval(SRC[k], i), dtype);
  }
  return bad;
}

static void test_layout_roundtrip(sh_comm *w, int rank, int size) {
  sh_tensor *p[NP];
  make_params(p, 1);
  sh_flatparam *fp = NULL;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, w, -1, -1, -1, 0, 1));
  if (!fp) return;
  sh_flatparam_info info;
  CHECK_OK(sh_flatparam_get_info(fp, &info));
  int64_t S = (TOTAL + size - 1) / size;
  CHECK(info.numel == TOTAL && info.shard_numel == S && info.padded_numel == S * size,
        "numel %lld shard %lld padded %lld", (long long)info.numel, (long long)info.shard_numel, (long long)info.padded_numel);
  CHECK(info.n_params == NP && info.n_unique == 4 && info.group_size == size && info.rank == rank, "counts");
  /* Parameters are sharded: no storage, and using one is an error, not a crash. */
  for (int k = 0; k < NP; k++) CHECK(p[k]->storage == NULL, "param %d kept its storage", k);
  CHECK_FAILS(sh_tensor_check(p[0], "use"), SH_ERR_FREED, "used after");
  /* The shard holds this rank's slice of the concatenation, zero padded. */
  sh_tensor *shard = NULL;
  CHECK_OK(sh_flatparam_shard(&shard, fp));
  int bad = 0;
  for (int64_t i = 0; i < S; i++) bad += at(shard, i) != as(flat_val(rank * S + i), SH_F32);
  CHECK(bad == 0 && sh_tensor_numel(shard) == S, "shard contents: %d wrong", bad);
  sh_tensor_destroy(shard);
  /* Every element of every parameter is owned by exactly one rank. */
  for (int k = 0; k < NP; k++) {
    sh_flatparam_slot s;
    int64_t owned = 0;
    for (int r = 0; r < size; r++) { CHECK_OK(sh_flatparam_get_slot(fp, k, r, &s)); owned += s.own_numel; }
    CHECK(owned == s.numel, "param %d: %lld of %lld elements owned", k, (long long)owned, (long long)s.numel);
    CHECK(s.tied_to == (k == 3 ? 0 : -1) && s.frozen == (k == 2), "param %d tied %d frozen %d", k, s.tied_to, s.frozen);
  }
  /* unshard gives back the exact values; reshard frees and the peak falls back. */
  sh_mem_stats before, during, after;
  sh_mem_stats_get(-1, &before);
  CHECK_OK(sh_flatparam_unshard(fp));
  sh_mem_stats_get(-1, &during);
  CHECK(params_match(p, SH_F32) == 0, "unshard round trip: %d wrong", params_match(p, SH_F32));
  CHECK(p[0]->storage == p[1]->storage && p[1]->offset == 15, "params view one buffer (offset %lld)", (long long)p[1]->offset);
  CHECK(during.by_tag[SH_TAG_PARAM] - before.by_tag[SH_TAG_PARAM] >= (int64_t)(S * size * 4), "full buffer counted as PARAM");
  CHECK_OK(sh_flatparam_unshard(fp));   /* idempotent */
  CHECK_OK(sh_flatparam_reshard(fp));
  sh_mem_stats_get(-1, &after);
  CHECK(after.allocated == before.allocated, "allocated %lld after reshard, %lld before", (long long)after.allocated, (long long)before.allocated);
  CHECK_FAILS(sh_tensor_fill_(p[1], 0), SH_ERR_FREED, "used after");
  /* A tied parameter given to a second unit is refused. */
  sh_flatparam *other = NULL;
  CHECK_FAILS(sh_flatparam_create(&other, &p[3], 1, w, -1, -1, -1, 0, 1), SH_ERR_ARG, "already belongs to another FlatParameter");
  sh_flatparam_destroy(fp);
  free_params(p);
}

/* How many elements of fp's grad shard differ from `times` x the reference grad by more than
 * tol relative (tol 0: any difference); -1 when the shard is missing or not f32. */
static int f32_grad_shard_mismatches(sh_flatparam *fp, int rank, int size, double times, double tol) {
  sh_tensor *g = NULL;
  CHECK_OK(sh_flatparam_grad_shard(&g, fp));
  if (!g || g->dtype != SH_F32) { sh_tensor_destroy(g); return -1; }
  int64_t S = (TOTAL + size - 1) / size;
  int bad = 0;
  for (int64_t i = 0; i < S; i++) {
    double want = times * flat_grad(rank * S + i, size, 0, 1);
    bad += fabs(at(g, i) - want) > tol * (1 + fabs(want));
  }
  sh_tensor_destroy(g);
  return bad;
}

static void test_mixed_precision(sh_comm *w, int rank, int size) {
  sh_tensor *p[NP];
  make_params(p, 1);
  sh_flatparam *fp = NULL;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, w, SH_F32, SH_BF16, SH_F32, 0, 1));
  if (!fp) return;
  CHECK_OK(sh_flatparam_unshard_start(fp));
  CHECK_OK(sh_flatparam_unshard_wait(fp));
  CHECK(params_match(p, SH_BF16) == 0, "bf16 unshard: %d wrong", params_match(p, SH_BF16));
  /* bf16 grads, reduced in f32 into the f32 sharded grad. */
  set_grads(p, rank);
  CHECK_OK(sh_flatparam_reshard(fp));
  CHECK_OK(sh_flatparam_reduce_grad(fp, SH_RED_SUM, NULL));
  int bad = f32_grad_shard_mismatches(fp, rank, size, 1, 1e-5);
  CHECK(bad == 0, "mixed precision grad: %d wrong", bad);
  sh_flatparam_destroy(fp);
  free_params(p);
}

/* bf16 grads reduced in bf16, then two backwards: the second adds the bf16 reduction into
 * the f32 sharded grad (every value here is exact in bf16, so the sum is exact). */
static void test_mixed_precision_accumulate(sh_comm *w, int rank, int size) {
  sh_tensor *p[NP];
  make_params(p, 1);
  sh_flatparam *fp = NULL;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, w, SH_F32, SH_BF16, SH_BF16, 0, 1));
  if (!fp) return;
  for (int step = 0; step < 2; step++) {
    CHECK_OK(sh_flatparam_unshard(fp));
    set_grads(p, rank);
    CHECK_OK(sh_flatparam_reshard(fp));
    CHECK_OK(sh_flatparam_reduce_grad(fp, SH_RED_SUM, NULL));
  }
  int bad = f32_grad_shard_mismatches(fp, rank, size, 2, 0);
  CHECK(bad == 0, "bf16-reduced grads accumulated in f32: %d wrong", bad);
  sh_flatparam_destroy(fp);
  free_params(p);
}

static void test_grads(sh_comm *w, int rank, int size) {
  sh_tensor *p[NP];
  make_params(p, 1);
  sh_flatparam *fp = NULL;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, w, -1, -1, -1, 0, 1));
  if (!fp) return;
  int64_t S = (TOTAL + size - 1) / size;
  sh_comm_reset_counts(NULL);
  CHECK_OK(sh_flatparam_unshard(fp));
  set_grads(p, rank);
  CHECK_OK(sh_flatparam_reduce_grad_start(fp, SH_RED_SUM, NULL));
  CHECK_FAILS(sh_flatparam_reduce_grad_start(fp, SH_RED_SUM, NULL), SH_ERR_ARG, "still in flight");
  CHECK_OK(sh_flatparam_reduce_grad_wait(fp));
  CHECK_OK(sh_flatparam_reshard(fp));
  CHECK(sh_comm_count(w, SH_COLL_ALL_GATHER) == 1 && sh_comm_count(w, SH_COLL_REDUCE_SCATTER) == 1 &&
        sh_comm_count(NULL, SH_COLL_ALL_REDUCE) == 0, "one all_gather and one reduce_scatter");
  for (int k = 0; k < NP; k++) CHECK(p[k]->grad == NULL, "param %d's grad was not consumed", k);
  sh_tensor *g = NULL;
  CHECK_OK(sh_flatparam_grad_shard(&g, fp));
  int bad = 0;
  for (int64_t i = 0; g && i < S; i++) bad += fabs(at(g, i) - flat_grad(rank * S + i, size, 0, 1)) > 1e-4;
  CHECK(g && bad == 0, "summed grads: %d wrong", bad);
  sh_tensor_destroy(g);
  /* A second backward accumulates into the sharded grad. */
  CHECK_OK(sh_flatparam_unshard(fp));
  set_grads(p, rank);
  CHECK_OK(sh_flatparam_reduce_grad(fp, SH_RED_SUM, NULL));
  CHECK_OK(sh_flatparam_grad_shard(&g, fp));
  bad = 0;
  for (int64_t i = 0; g && i < S; i++) bad += fabs(at(g, i) - 2 * flat_grad(rank * S + i, size, 0, 1)) > 1e-4;
  CHECK(g && bad == 0, "accumulated grads: %d wrong", bad);
  sh_tensor_destroy(g);
  /* zero_grad, then avg. */
  CHECK_OK(sh_flatparam_zero_grad(fp, 1));
  CHECK_OK(sh_flatparam_grad_shard(&g, fp));
  CHECK(g == NULL, "no grad after zero_grad");
  set_grads(p, rank);   /* still unsharded: the grads land on the parameters */
  CHECK_OK(sh_flatparam_reduce_grad(fp, SH_RED_AVG, NULL));
  CHECK_OK(sh_flatparam_grad_shard(&g, fp));
  bad = 0;
  for (int64_t i = 0; g && i < S; i++) bad += fabs(at(g, i) - flat_grad(rank * S + i, size, 0, 1) / size) > 1e-5;
  CHECK(g && bad == 0, "averaged grads: %d wrong", bad);
  sh_tensor_destroy(g);
  CHECK_FAILS(sh_flatparam_reduce_grad(fp, SH_RED_MAX, NULL), SH_ERR_ARG, "sum (0) or avg (1)");
  sh_flatparam_destroy(fp);
  free_params(p);
}

/* Deterministic mode's pieces: align pads the shard to whole blocks; take_grad hands over the
 * flat grad with no collective (its elements are this rank's grads, zeros for the frozen p2
 * and the padding); add_grad lands a shard (set, then added); grad_block_sumsq sums each
 * block's squares in f64 against a sum computed here over the same elements. */
static void test_deterministic_ends(sh_comm *w, int rank, int size) {
  sh_tensor *p[NP];
  make_params(p, 1);
  sh_flatparam *fp = NULL;
  const int align = 8;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, w, -1, -1, -1, 0, align));
  if (!fp) return;
  sh_flatparam_info info;
  CHECK_OK(sh_flatparam_get_info(fp, &info));
  int64_t S = info.shard_numel;
  CHECK(S % align == 0 && info.padded_numel == S * size && info.padded_numel >= TOTAL && info.padded_numel - TOTAL < align * size,
        "align %d at world %d: padded %lld, shard %lld", align, size, (long long)info.padded_numel, (long long)S);
  sh_flatparam *none = NULL;
  CHECK_FAILS(sh_flatparam_create(&none, p, NP, w, -1, -1, -1, 0, 0), SH_ERR_ARG, "align 0");
  sh_comm_reset_counts(NULL);
  CHECK_OK(sh_flatparam_unshard(fp));
  set_grads(p, rank);
  sh_tensor *flat = NULL;
  CHECK_OK(sh_flatparam_take_grad(&flat, fp));
  CHECK(sh_comm_count(NULL, SH_COLL_REDUCE_SCATTER) == 0 && sh_comm_count(NULL, SH_COLL_ALL_REDUCE) == 0, "take_grad reduced");
  for (int k = 0; k < NP; k++) CHECK(p[k]->grad == NULL, "param %d's grad was not taken", k);
  int bad = 0;
  for (int64_t j = 0; flat && j < info.padded_numel; j++) bad += at(flat, j) != as(j < TOTAL ? flat_grad(j, 1, rank, 1) : 0, SH_F32);
  CHECK(flat && sh_tensor_numel(flat) == info.padded_numel && bad == 0, "take_grad's flat grad: %d wrong", bad);
  /* add_grad: this rank's slice of its flat grad, twice: set, then added */
  sh_tensor *slice = NULL;
  if (flat) CHECK_OK(sh_view_narrow(&slice, flat, 0, rank * S, S));
  CHECK_OK(sh_flatparam_add_grad(fp, slice));
  CHECK_OK(sh_flatparam_add_grad(fp, slice));
  sh_tensor *g = NULL;
  CHECK_OK(sh_flatparam_grad_shard(&g, fp));
  bad = 0;
  for (int64_t i = 0; g && i < S; i++) bad += at(g, i) != 2 * at(slice, i);
  CHECK(g && bad == 0, "add_grad twice: %d wrong", bad);
  /* block sums of squares of the sharded grad */
  sh_tensor *sums = NULL;
  int64_t nb = S / align;
  sh_tensor_empty(&sums, 1, &nb, SH_F64, -1);
  CHECK_FAILS(sh_flatparam_add_grad(fp, sums), SH_ERR_ARG, "expected");
  CHECK_OK(sh_flatparam_grad_block_sumsq(fp, align, sums));
  bad = 0;
  for (int64_t b = 0; g && b < nb; b++) {
    double ref = 0;
    for (int64_t i = b * align; i < (b + 1) * align; i++) ref += at(g, i) * at(g, i);
    bad += fabs(at(sums, b) - ref) > 1e-12 * (1 + ref);
  }
  CHECK(bad == 0, "block sums of squares: %d wrong", bad);
  CHECK_FAILS(sh_flatparam_grad_block_sumsq(fp, 7, sums), SH_ERR_ARG, "does not divide");
  CHECK_OK(sh_flatparam_zero_grad(fp, 1));
  CHECK_OK(sh_flatparam_grad_block_sumsq(fp, align, sums));
  CHECK(at(sums, 0) == 0, "no grad: zero sums");
  sh_tensor_destroy(sums);
  sh_tensor_destroy(g);
  sh_tensor_destroy(slice);
  sh_tensor_destroy(flat);
  sh_flatparam_destroy(fp);
  free_params(p);
}

static void test_no_shard(sh_comm *w, int rank, int size) {
  sh_tensor *p[NP];
  make_params(p, 1);
  sh_flatparam *fp = NULL;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, w, -1, -1, -1, 1, 1));
  if (!fp) return;
  sh_flatparam_info info;
  sh_flatparam_get_info(fp, &info);
  CHECK(info.shard_numel == TOTAL && info.padded_numel == TOTAL && info.no_shard, "no_shard keeps everything");
  sh_comm_reset_counts(NULL);
  CHECK_OK(sh_flatparam_unshard(fp));
  CHECK(params_match(p, SH_F32) == 0, "no_shard unshard");
  set_grads(p, rank);
  CHECK_OK(sh_flatparam_reduce_grad(fp, SH_RED_SUM, NULL));
  CHECK(sh_comm_count(NULL, SH_COLL_ALL_GATHER) == 0 && sh_comm_count(NULL, SH_COLL_REDUCE_SCATTER) == 0 &&
        sh_comm_count(w, SH_COLL_ALL_REDUCE) == 1, "no_shard: all-reduces only");
  sh_tensor *g = NULL;
  CHECK_OK(sh_flatparam_grad_shard(&g, fp));
  int bad = 0;
  for (int64_t i = 0; g && i < TOTAL; i++) bad += fabs(at(g, i) - flat_grad(i, size, 0, 1)) > 1e-4;
  CHECK(g && bad == 0, "no_shard grads: %d wrong", bad);
  sh_tensor_destroy(g);
  CHECK_OK(sh_flatparam_reshard(fp));
  sh_flatparam_destroy(fp);
  free_params(p);
}

/* Hybrid: shard within pairs of ranks, all-reduce the grad shards across the pairs. */
static void test_hybrid(sh_comm *w, int rank, int size) {
  if (size % 2) return;
  sh_comm *shard = NULL, *rep = NULL;
  CHECK_OK(sh_comm_split(&shard, w, rank / 2, rank));
  CHECK_OK(sh_comm_split(&rep, w, rank % 2, rank));
  sh_tensor *p[NP];
  make_params(p, 1);
  sh_flatparam *fp = NULL;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, shard, -1, -1, -1, 0, 1));
  if (fp) {
    int64_t S = (TOTAL + 1) / 2;
    CHECK_OK(sh_flatparam_unshard(fp));
    CHECK(params_match(p, SH_F32) == 0, "hybrid unshard");
    set_grads(p, rank);
    CHECK_OK(sh_flatparam_reduce_grad(fp, SH_RED_AVG, rep));
    sh_tensor *g = NULL;
    CHECK_OK(sh_flatparam_grad_shard(&g, fp));
    int bad = 0;
    for (int64_t i = 0; g && i < S; i++) bad += fabs(at(g, i) - flat_grad((rank % 2) * S + i, size, 0, 1) / size) > 1e-5;
    CHECK(g && bad == 0, "hybrid grads (avg over the world): %d wrong", bad);
    sh_tensor_destroy(g);
    sh_flatparam_destroy(fp);
  }
  free_params(p);
  sh_comm_destroy(shard);
  sh_comm_destroy(rep);
}

/* Sharded init: parameters without storage; each rank writes only its own part, which must
 * give the same full parameters as an unsharded init. */
static void test_sharded_init(sh_comm *w, int rank, int size) {
  sh_tensor *p[NP];
  make_params(p, 0);
  sh_flatparam *fp = NULL;
  CHECK_OK(sh_flatparam_create(&fp, p, NP, w, -1, -1, -1, 0, 1));
  if (!fp) return;
  for (int k = 0; k < NP; k++) {
    if (SRC[k] != k) continue;
    sh_flatparam_slot s;
    sh_tensor *view = NULL;
    CHECK_OK(sh_flatparam_get_slot(fp, k, -1, &s));
    CHECK_OK(sh_flatparam_shard_view(&view, fp, k));
    if (!view) continue;
    CHECK(sh_tensor_numel(view) == s.own_numel, "view of param %d", k);
    for (int64_t i = 0; i < s.own_numel; i++) sh_store(sh_tensor_data(view), SH_F32, i, pval(k, s.own_start + i));
    sh_tensor_destroy(view);
  }
  CHECK_OK(sh_flatparam_unshard(fp));
  CHECK(params_match(p, SH_F32) == 0, "shard-only init: %d wrong", params_match(p, SH_F32));
  CHECK_OK(sh_flatparam_reshard(fp));
  /* init_param from a full value, for recipes that compute it whole. */
  sh_tensor *v = NULL;
  int64_t n7 = 7;
  sh_tensor_empty(&v, 1, &n7, SH_F64, -1);
  for (int64_t i = 0; i < 7; i++) sh_store(sh_tensor_data(v), SH_F64, i, -i);
  CHECK_OK(sh_flatparam_init_param(fp, 1, v));
  CHECK_OK(sh_flatparam_unshard(fp));
  int bad = 0;
  for (int64_t i = 0; i < 7; i++) bad += at(p[1], i) != -i;
  CHECK(bad == 0, "init_param: %d wrong", bad);
  CHECK_FAILS(sh_flatparam_init_param(fp, 0, v), SH_ERR_ARG, "has 15 elements");
  sh_tensor_destroy(v);
  sh_flatparam_destroy(fp);
  free_params(p);
}

static void test_errors(sh_comm *w) {
  sh_flatparam *fp = NULL;
  sh_tensor *i = NULL, *a = NULL, *b = NULL;
  int64_t n = 4;
  sh_tensor_empty(&i, 1, &n, SH_I32, -1);
  sh_tensor_empty(&a, 1, &n, SH_F32, -1);
  sh_view_narrow(&b, a, 0, 1, 2);
  CHECK_FAILS(sh_flatparam_create(&fp, &i, 1, w, -1, -1, -1, 0, 1), SH_ERR_ARG, "floating point");
  CHECK_FAILS(sh_flatparam_create(&fp, NULL, 0, w, -1, -1, -1, 0, 1), SH_ERR_ARG, "at least one");
  sh_tensor *ab[2] = { a, b };
  CHECK_FAILS(sh_flatparam_create(&fp, ab, 2, w, -1, -1, -1, 0, 1), SH_ERR_ARG, "sharing one storage");
  CHECK_FAILS(sh_flatparam_create(&fp, &a, 1, w, SH_I64, -1, -1, 0, 1), SH_ERR_ARG, "master dtype");
  CHECK(fp == NULL, "no FlatParameter on error");
  sh_tensor_destroy(i); sh_tensor_destroy(b); sh_tensor_destroy(a);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  sh_comm *w = NULL;
  CHECK_OK(sh_comm_init_world(&w));
  if (!w) return check_summary("test_mpi_flatparam");
  int rank = sh_comm_rank(w), size = sh_comm_size(w);
  RUN(test_layout_roundtrip, w, rank, size);
  RUN(test_mixed_precision, w, rank, size);
  RUN(test_mixed_precision_accumulate, w, rank, size);
  RUN(test_grads, w, rank, size);
  RUN(test_deterministic_ends, w, rank, size);
  RUN(test_no_shard, w, rank, size);
  RUN(test_hybrid, w, rank, size);
  RUN(test_sharded_init, w, rank, size);
  RUN(test_errors, w);
  sh_comm_destroy(w);
  sh_comm_finalize();
  return check_summary("test_mpi_flatparam");
}
