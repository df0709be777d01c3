/* test_mpi_comm.c: every collective against the values computed locally, at any world size
 * (tests/run.sh runs it under mpirun -np 1..4). Rank r's inputs are a formula of (r, i), so
 * each rank can compute what every other rank sent. */
#include "core/tensor_internal.h"
#include "dist/comm.h"
#include "check.h"
#include <string.h>
#include <time.h>
#include <unistd.h>

static sh_tensor *vec(int64_t n, int dtype) {
  sh_tensor *t = NULL;
  sh_tensor_empty(&t, 1, &n, dtype, -1);
  return t;
}

/* Distinct per rank and element, with fractions that bf16 cannot always hold. */
static double val(int r, int64_t i) { return r * 3.0 + i * 0.37 - 2.0 + (r % 2) * 0.0039; }

/* v stored in dtype and read back. */
static double as(double v, int dtype) {
  double buf[1];
  sh_store(buf, dtype, 0, v);
  return sh_load(buf, dtype, 0);
}

static void fill(sh_tensor *t, int r) {
  for (int64_t i = 0; i < sh_tensor_numel(t); i++) sh_store(sh_tensor_data(t), t->dtype, i, val(r, i));
}

static double at(const sh_tensor *t, int64_t i) { return sh_load(sh_tensor_data(t), t->dtype, i); }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_all_gather(sh_comm *w, int rank, int size) {
  int dtypes[] = { SH_F32, SH_BF16, SH_F16, SH_F64, SH_I64 };
  for (int k = 0; k < 5; k++) {
    sh_tensor *in = vec(5, dtypes[k]), *out = vec(5 * size, dtypes[k]);
    fill(in, rank);
    CHECK_OK(sh_comm_all_gather_into(w, out, in));
    int bad = 0;
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 5; i++) bad += at(out, r * 5 + i) != as(val(r, i), dtypes[k]);
    CHECK(bad == 0, "all_gather %s: %d wrong elements", sh_dtype_name(dtypes[k]), bad);
    sh_tensor_destroy(in);
    sh_tensor_destroy(out);
  }
  /* In place: the input is this rank's slot of the output. */
  sh_tensor *out = vec(3 * size, SH_F32), *slot = NULL;
  sh_tensor_fill_(out, -1);
  sh_view_narrow(&slot, out, 0, 3 * rank, 3);
  fill(slot, rank);
  CHECK_OK(sh_comm_all_gather_into(w, out, slot));
  int bad = 0;
  for (int r = 0; r < size; r++)
    for (int i = 0; i < 3; i++) bad += at(out, r * 3 + i) != as(val(r, i), SH_F32);
  CHECK(bad == 0, "in-place all_gather: %d wrong elements", bad);
  sh_tensor_destroy(slot);
  sh_tensor_destroy(out);
}

/* all_to_all: rank r sends val(r, q * n + i) as element i of block q; rank q must hold it at
 * r * n + i, bit for bit, in every dtype (bf16 and f16 included: it moves bytes). */
static void test_all_to_all(sh_comm *w, int rank, int size) {
  int dtypes[] = { SH_F32, SH_BF16, SH_F16, SH_F64, SH_I64 };
  const int n = 3;
  for (int k = 0; k < 5; k++) {
    sh_tensor *in = vec(n * size, dtypes[k]), *out = vec(n * size, dtypes[k]);
    fill(in, rank);
    sh_tensor_fill_(out, -7);
    CHECK_OK(sh_comm_all_to_all_into(w, out, in));
    int bad = 0;
    for (int r = 0; r < size; r++)
      for (int i = 0; i < n; i++) bad += at(out, r * n + i) != as(val(r, rank * n + i), dtypes[k]);
    CHECK(bad == 0, "all_to_all %s: %d wrong elements", sh_dtype_name(dtypes[k]), bad);
    sh_tensor_destroy(in);
    sh_tensor_destroy(out);
  }
  sh_tensor *a = vec(2 * size + 1, SH_F32), *b = vec(2 * size + 1, SH_F32), *c = vec(2 * size, SH_F32);
  if (size > 1) CHECK_FAILS(sh_comm_all_to_all_into(w, b, a), SH_ERR_ARG, "a multiple of");
  CHECK_FAILS(sh_comm_all_to_all_into(w, c, a), SH_ERR_ARG, "the same number of elements");
  if (size > 1) CHECK_FAILS(sh_comm_all_to_all_into(w, c, c), SH_ERR_ARG, "share a storage");
  sh_tensor_destroy(a);
  sh_tensor_destroy(b);
  sh_tensor_destroy(c);
}

/* The reference of a reduction of element i over every rank: inputs as stored in dtype,
 * rounded to rd, accumulated in f64 (f32 sums of these few values are exact enough that the
 * tolerance covers the difference), divided for avg, rounded to rd and stored in dtype. */
static double reduced(int size, int64_t i, int dtype, int rd, int op) {
  double acc = op == SH_RED_MAX ? -1e300 : op == SH_RED_MIN ? 1e300 : 0;
  for (int r = 0; r < size; r++) {
    double v = as(as(val(r, i), dtype), rd);
    if (op == SH_RED_MAX) acc = v > acc ? v : acc;
    else if (op == SH_RED_MIN) acc = v < acc ? v : acc;
    else acc += v;
  }
  if (op == SH_RED_AVG) acc /= size;
  return as(as(acc, rd), dtype);
}

static void test_reductions(sh_comm *w, int rank, int size) {
  struct { int dtype, rd, op; double tol; } cases[] = {
    { SH_F32, -1, SH_RED_SUM, 1e-5 }, { SH_F32, -1, SH_RED_AVG, 1e-5 }, { SH_F32, -1, SH_RED_MAX, 0 },
    { SH_F32, -1, SH_RED_MIN, 0 }, { SH_F64, -1, SH_RED_SUM, 1e-12 }, { SH_BF16, -1, SH_RED_SUM, 0 },
    { SH_BF16, -1, SH_RED_AVG, 0 }, { SH_F16, -1, SH_RED_SUM, 0 }, { SH_F32, SH_BF16, SH_RED_SUM, 0 },
    { SH_I64, -1, SH_RED_SUM, 0 },
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int dt = cases[k].dtype, rd = cases[k].rd < 0 ? dt : cases[k].rd, op = cases[k].op;
    double tol = cases[k].tol;
    /* reduce_scatter: 4 elements per rank */
    sh_tensor *in = vec(4 * size, dt), *out = vec(4, dt);
    fill(in, rank);
    CHECK_OK(sh_comm_reduce_scatter(w, out, in, op, cases[k].rd));
    int bad = 0;
    for (int i = 0; i < 4; i++) {
      double want = reduced(size, rank * 4 + i, dt, rd, op);
      /* bf16 results can land one rounding step away when the f32 sum is not exact */
      double t = tol + (dt == SH_BF16 || rd == SH_BF16 ? fabs(want) / 128 : dt == SH_F16 ? fabs(want) / 1024 : 0);
      bad += fabs(at(out, i) - want) > t;
    }
    CHECK(bad == 0, "reduce_scatter %s op %d rd %d: %d wrong", sh_dtype_name(dt), op, cases[k].rd, bad);
    /* all_reduce in place */
    fill(in, rank);
    CHECK_OK(sh_comm_all_reduce(w, in, op, cases[k].rd));
    bad = 0;
    for (int i = 0; i < 4 * size; i++) {
      double want = reduced(size, i, dt, rd, op);
      double t = tol + (dt == SH_BF16 || rd == SH_BF16 ? fabs(want) / 128 : dt == SH_F16 ? fabs(want) / 1024 : 0);
      bad += fabs(at(in, i) - want) > t;
    }
    CHECK(bad == 0, "all_reduce %s op %d rd %d: %d wrong", sh_dtype_name(dt), op, cases[k].rd, bad);
    sh_tensor_destroy(in);
    sh_tensor_destroy(out);
  }
}

/* bf16 sums accumulate in f32: 1 + (n-1) * 2^-8 rounds once at the end. Adding in bf16 one
 * rank at a time would stay at 1 (each 1 + 2^-8 ties back to 1). */
static void test_bf16_accumulates_in_f32(sh_comm *w, int rank, int size) {
  sh_tensor *t = vec(1, SH_BF16);
  sh_store(sh_tensor_data(t), SH_BF16, 0, rank == 0 ? 1.0 : 1.0 / 256);
  CHECK_OK(sh_comm_all_reduce(w, t, SH_RED_SUM, -1));
  CHECK(at(t, 0) == as(1.0 + (size - 1) / 256.0, SH_BF16), "bf16 sum %g, want %g", at(t, 0), as(1.0 + (size - 1) / 256.0, SH_BF16));
  sh_tensor_destroy(t);
}

/* A group of one (the local backend) rounds an f32 reduction in bf16 element by element: the
 * bits of each result are the inline rounding's (ties to even, NaN quiet, denormals kept),
 * widened back to f32, in place and into another tensor; 37 elements. */
static void test_local_bf16_rounding(sh_comm *w, int rank, int size) {
  if (size != 1) return;
  static const uint32_t bits[] = { 0x3f808000u, 0x3f818000u, 0xbf818000u, 0x3f808001u, 0x00018000u, 0x807fffffu,
                                   0x7f7fffffu, 0x7f800000u, 0xff800001u, 0x7fc00000u, 0x80000000u };
  enum { N = 37, NB = sizeof bits / sizeof bits[0] };
  sh_tensor *t = vec(N, SH_F32), *out = vec(N, SH_F32);
  float in[N];
  for (int i = 0; i < N; i++) {
    uint32_t u = i < NB ? bits[i] : 0x3e000000u + (uint32_t)i * 0x1234567u % 0x02000000u;
    memcpy(&in[i], &u, 4);
  }
  memcpy(sh_tensor_data(t), in, sizeof in);
  CHECK_OK(sh_comm_reduce_scatter(w, out, t, SH_RED_SUM, SH_BF16));
  CHECK_OK(sh_comm_all_reduce(w, t, SH_RED_SUM, SH_BF16));
  int bad = 0;
  for (int i = 0; i < N; i++) {
    uint16_t h = sh_f32_to_bf16(in[i]);
    uint32_t got, got_out;
    memcpy(&got, (float *)sh_tensor_data(t) + i, 4);
    memcpy(&got_out, (float *)sh_tensor_data(out) + i, 4);
    bad += got != (uint32_t)h << 16 || got_out != (uint32_t)h << 16;
  }
  CHECK(bad == 0, "local bf16 rounding of f32: %d elements wrong", bad);
  sh_tensor_destroy(out);
  sh_tensor_destroy(t);
}

static void test_broadcast_barrier(sh_comm *w, int rank, int size) {
  sh_tensor *t = vec(7, SH_BF16);
  fill(t, rank);
  CHECK_OK(sh_comm_broadcast(w, t, size - 1));
  int bad = 0;
  for (int i = 0; i < 7; i++) bad += at(t, i) != as(val(size - 1, i), SH_BF16);
  CHECK(bad == 0, "broadcast from %d: %d wrong", size - 1, bad);
  CHECK_OK(sh_comm_barrier(w));
  CHECK_FAILS(sh_comm_broadcast(w, t, size), SH_ERR_ARG, "root");
  sh_tensor_destroy(t);
}

static void test_async(sh_comm *w, int rank, int size) {
  sh_tensor *a = vec(6, SH_F32), *b = vec(6, SH_F32);
  fill(a, rank);
  fill(b, rank + 1);
  sh_comm_work *wa = NULL, *wb = NULL;
  CHECK_OK(sh_comm_all_reduce_async(&wa, w, a, SH_RED_SUM, -1));
  CHECK_OK(sh_comm_all_reduce_async(&wb, w, b, SH_RED_MAX, -1));
  int done = 0, rc = 0;
  for (int polls = 0; !done && !rc && polls < 1000000; polls++) rc = sh_comm_test(wb, &done);
  CHECK(done && rc == 0, "test never reported the max done (status %d)", rc);
  CHECK_OK(sh_comm_wait(wa));
  CHECK_OK(sh_comm_wait(wa));   /* waiting again is fine */
  int bad = 0;
  for (int i = 0; i < 6; i++) {
    bad += fabs(at(a, i) - reduced(size, i, SH_F32, SH_F32, SH_RED_SUM)) > 1e-5;
    bad += at(b, i) != as(val(size, i), SH_F32);
  }
  CHECK(bad == 0, "async results: %d wrong", bad);
  sh_comm_work_free(wa);
  sh_comm_work_free(wb);
  /* The handle keeps the storages alive: Lua may :free() the tensors before the wait. */
  sh_tensor *all = vec(6 * size, SH_F32), *alias = NULL;
  fill(a, rank);
  CHECK_OK(sh_comm_all_gather_into_async(&wa, w, all, a));
  sh_tensor_alias(&alias, all);
  sh_tensor_release(a);
  sh_tensor_release(all);
  CHECK_OK(sh_comm_wait(wa));
  sh_comm_work_free(wa);
  bad = 0;
  for (int r = 0; r < size; r++)
    for (int i = 0; i < 6; i++) bad += at(alias, r * 6 + i) != as(val(r, i), SH_F32);
  CHECK(bad == 0, "gather into a released tensor: %d wrong", bad);
  sh_tensor_destroy(alias);
  sh_tensor_destroy(all);
  sh_tensor_destroy(a);
  sh_tensor_destroy(b);
}

static void test_errors(sh_comm *w, int rank, int size) {
  sh_tensor *a = vec(4, SH_F32), *b = vec(5, SH_F32), *i = vec(4, SH_I32), *m = NULL, *tr = NULL;
  int64_t shape[2] = { 2, 2 };
  sh_tensor_empty(&m, 2, shape, SH_F32, -1);
  sh_view_transpose(&tr, m, 0, 1);
  CHECK_FAILS(sh_comm_all_gather_into(w, b, a), SH_ERR_ARG, "all_gather on world");
  CHECK_FAILS(sh_comm_all_gather_into(w, b, a), SH_ERR_ARG, "f32[5]");
  CHECK_FAILS(sh_comm_reduce_scatter(w, a, b, SH_RED_SUM, -1), SH_ERR_ARG, "reduce_scatter");
  CHECK_FAILS(sh_comm_all_reduce(w, i, SH_RED_AVG, -1), SH_ERR_ARG, "avg needs a float");
  CHECK_FAILS(sh_comm_all_reduce(w, a, 9, -1), SH_ERR_ARG, "unknown reduce op");
  CHECK_FAILS(sh_comm_all_reduce(w, a, SH_RED_SUM, SH_I32), SH_ERR_ARG, "reduce dtype");
  CHECK_FAILS(sh_comm_all_reduce(w, tr, SH_RED_SUM, -1), SH_ERR_ARG, "contiguous");
  CHECK_FAILS(sh_comm_all_gather_into(w, a, i), SH_ERR_ARG, "same dtype");
  sh_tensor_release(b);
  CHECK_FAILS(sh_comm_all_reduce(w, b, SH_RED_SUM, -1), SH_ERR_FREED, "after :free()");
  CHECK_FAILS(sh_comm_set_timeout(w, -1), SH_ERR_ARG, "positive");
  CHECK_FAILS(sh_comm_all_reduce(NULL, a, SH_RED_SUM, -1), SH_ERR_ARG, "expected a group");
  sh_tensor_destroy(a); sh_tensor_destroy(b); sh_tensor_destroy(i);
  sh_tensor_destroy(tr); sh_tensor_destroy(m);
}

/* Shard groups of 2 consecutive ranks and replicate groups across them (2x2 at world 4). */
static void test_split(sh_comm *w, int rank, int size) {
  sh_comm *shard = NULL, *rep = NULL, *none = NULL;
  CHECK_OK(sh_comm_split(&shard, w, rank / 2, rank));
  CHECK_OK(sh_comm_split(&rep, w, rank % 2, rank));
  int shard_size = (rank / 2) * 2 + 2 <= size ? 2 : size - (rank / 2) * 2;
  int rep_size = (size - rank % 2 + 1) / 2;
  CHECK(sh_comm_size(shard) == shard_size, "shard group size %d, want %d", sh_comm_size(shard), shard_size);
  CHECK(sh_comm_rank(shard) == rank % 2, "shard group rank %d, want %d", sh_comm_rank(shard), rank % 2);
  CHECK(sh_comm_size(rep) == rep_size, "replicate group size %d, want %d", sh_comm_size(rep), rep_size);
  CHECK(sh_comm_rank(rep) == rank / 2, "replicate group rank %d, want %d", sh_comm_rank(rep), rank / 2);
  char name[32];
  snprintf(name, sizeof name, "shard group %d", rank / 2);
  CHECK_OK(sh_comm_set_name(shard, name));
  CHECK(strcmp(sh_comm_name(shard), name) == 0, "name %s", sh_comm_name(shard));
  /* A sum within each group: the members' ranks. */
  sh_tensor *t = vec(1, SH_F64);
  sh_store(sh_tensor_data(t), SH_F64, 0, rank);
  CHECK_OK(sh_comm_all_reduce(shard, t, SH_RED_SUM, -1));
  double want = 0;
  for (int r = (rank / 2) * 2; r < (rank / 2) * 2 + shard_size; r++) want += r;
  CHECK(at(t, 0) == want, "shard group sum %g, want %g", at(t, 0), want);
  sh_store(sh_tensor_data(t), SH_F64, 0, rank);
  CHECK_OK(sh_comm_all_reduce(rep, t, SH_RED_SUM, -1));
  want = 0;
  for (int r = rank % 2; r < size; r += 2) want += r;
  CHECK(at(t, 0) == want, "replicate group sum %g, want %g", at(t, 0), want);
  /* Counters are per group and process-wide. */
  sh_comm_reset_counts(NULL);
  CHECK_OK(sh_comm_all_reduce(shard, t, SH_RED_SUM, -1));
  CHECK_OK(sh_comm_all_reduce(rep, t, SH_RED_SUM, -1));
  CHECK(sh_comm_count(shard, SH_COLL_ALL_REDUCE) == 1 && sh_comm_count(rep, SH_COLL_ALL_REDUCE) == 1 &&
        sh_comm_count(NULL, SH_COLL_ALL_REDUCE) == 2 && sh_comm_count(w, SH_COLL_ALL_REDUCE) == 0,
        "split counters %lld %lld %lld", (long long)sh_comm_count(shard, SH_COLL_ALL_REDUCE),
        (long long)sh_comm_count(rep, SH_COLL_ALL_REDUCE), (long long)sh_comm_count(NULL, SH_COLL_ALL_REDUCE));
  /* color < 0 leaves a rank out. */
  CHECK_OK(sh_comm_split(&none, w, rank == 0 ? -1 : 0, 0));
  CHECK((rank == 0) == (none == NULL), "rank %d: split with color -1 gave %p", rank, (void *)none);
  if (none) CHECK(sh_comm_size(none) == size - 1, "size %d", sh_comm_size(none));
  sh_tensor_destroy(t);
  sh_comm_destroy(none);
  sh_comm_destroy(shard);
  sh_comm_destroy(rep);
}

static void test_counters(sh_comm *w, int rank, int size) {
  sh_tensor *in = vec(3, SH_F32), *out = vec(3 * size, SH_F32);
  fill(in, rank);
  sh_comm_reset_counts(NULL);
  CHECK_OK(sh_comm_all_gather_into(w, out, in));
  CHECK_OK(sh_comm_all_gather_into(w, out, in));
  CHECK_OK(sh_comm_reduce_scatter(w, in, out, SH_RED_AVG, -1));
  CHECK_OK(sh_comm_barrier(w));
  CHECK(sh_comm_count(w, SH_COLL_ALL_GATHER) == 2, "all_gather count %lld", (long long)sh_comm_count(w, SH_COLL_ALL_GATHER));
  CHECK(sh_comm_count(w, SH_COLL_REDUCE_SCATTER) == 1, "reduce_scatter count");
  CHECK(sh_comm_count(w, SH_COLL_BARRIER) == 1 && sh_comm_count(w, SH_COLL_ALL_REDUCE) == 0, "barrier/all_reduce count");
  CHECK(sh_comm_bytes(w, SH_COLL_ALL_GATHER) == 2 * 3 * 4, "all_gather bytes %lld", (long long)sh_comm_bytes(w, SH_COLL_ALL_GATHER));
  CHECK(sh_comm_count(NULL, SH_COLL_ALL_GATHER) == 2, "process-wide count");
  sh_comm_reset_counts(w);
  CHECK(sh_comm_count(w, SH_COLL_ALL_GATHER) == 0, "reset");
  sh_tensor_destroy(in);
  sh_tensor_destroy(out);
}

/* Ranks other than 0 join an all_reduce late; rank 0's short timeout must fire with a message
 * naming the op, the group and the rank, and waiting again must then complete it. */
static void test_timeout(sh_comm *w, int rank, int size) {
  if (size < 2) return;
  sh_tensor *t = vec(2, SH_F32);
  sh_tensor_fill_(t, 1);
  if (rank == 0) {
    sh_comm_work *wk = NULL;
    CHECK_OK(sh_comm_set_timeout(w, 0.2));
    double t0 = now();
    CHECK_OK(sh_comm_all_reduce_async(&wk, w, t, SH_RED_SUM, -1));
    int rc = sh_comm_wait(wk);
    double waited = now() - t0;
    CHECK(rc == SH_ERR_COMM, "timeout status %d", rc);
    const char *msg = sh_last_error();
    CHECK(strstr(msg, "all_reduce") && strstr(msg, "world") && strstr(msg, "rank 0") && strstr(msg, "timed out"),
          "timeout message: %s", msg);
    CHECK(waited < 2.0, "the timeout took %.2f s", waited);
    CHECK_OK(sh_comm_set_timeout(w, 60));
    CHECK_OK(sh_comm_wait(wk));
    sh_comm_work_free(wk);
  } else {
    struct timespec ts = { 0, 600 * 1000000L };
    nanosleep(&ts, NULL);
    CHECK_OK(sh_comm_all_reduce(w, t, SH_RED_SUM, -1));
  }
  CHECK(at(t, 0) == size, "late all_reduce gave %g", at(t, 0));
  sh_tensor_destroy(t);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  sh_comm *w = NULL;
  CHECK_OK(sh_comm_init_world(&w));
  if (!w) return check_summary("test_mpi_comm");
  sh_comm_env env;
  CHECK_OK(sh_comm_read_env(&env));
  int rank = sh_comm_rank(w), size = sh_comm_size(w);
  CHECK(rank == env.rank && size == env.size, "rank %d size %d, env says %d of %d", rank, size, env.rank, env.size);
  CHECK(strcmp(sh_comm_name(w), "world") == 0, "world name %s", sh_comm_name(w));
  CHECK(strcmp(sh_comm_backend_name(w), size > 1 ? "mpi" : "local") == 0, "backend %s", sh_comm_backend_name(w));
  CHECK(sh_comm_timeout(w) > 0, "default timeout %g", sh_comm_timeout(w));
  sh_comm *again = NULL;
  CHECK_OK(sh_comm_init_world(&again));
  CHECK(again == w, "init_world twice gives the same group");
  sh_comm_destroy(again);

  RUN(test_all_gather, w, rank, size);
  RUN(test_all_to_all, w, rank, size);
  RUN(test_reductions, w, rank, size);
  RUN(test_bf16_accumulates_in_f32, w, rank, size);
  RUN(test_local_bf16_rounding, w, rank, size);
  RUN(test_broadcast_barrier, w, rank, size);
  RUN(test_async, w, rank, size);
  RUN(test_errors, w, rank, size);
  RUN(test_split, w, rank, size);
  RUN(test_counters, w, rank, size);
  RUN(test_timeout, w, rank, size);
  CHECK_OK(sh_comm_barrier(w));
  sh_comm_destroy(w);
  CHECK_OK(sh_comm_finalize());
  CHECK_OK(sh_comm_finalize());
  return check_summary("test_mpi_comm");
}
