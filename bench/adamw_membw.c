/* adamw_membw.c: the machine's memory bandwidth, the bound of bench/adamw_bench.c's step, at
 * each thread count given, over arrays far larger than the caches (four of N floats each). Five STREAM-like kernels, each split into one contiguous range per thread,
 * counted as STREAM counts (the bytes the program reads and writes, once each):
 *   memcpy  a = b             glibc's (non-temporal stores at this size)    2 arrays
 *   copy    a[i] = b[i]                                                     2 arrays
 *   triad   a[i] = b[i] + s c[i]                                            3 arrays
 *   update  a[i] = s a[i] + b[i]  in place                                   3 arrays
 *   streams a[i] = s a[i] + d[i], b[i] = s b[i] + d[i], c[i] = s c[i] + d[i]  7 arrays
 *           AdamW's access pattern: four arrays read, three of them written in place
 *           (param, m, v and grad), and as many streams in flight
 * At each thread count T of the list, prints "NAME_gb_per_s_Tt G" for each (the best of REPS
 * timed runs after one untimed run) and "gb_per_s_Tt G", the best of the five: the bandwidth
 * the machine can be seen to reach.
 *   adamw_membw N REPS THREADS...        e.g. adamw_membw 67108864 5 1 2  (256 MB arrays) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct arrays { float *a, *b, *c, *d; int64_t n; } arrays;

/* This thread's range of [0, n). */
static void my_range(int64_t n, int64_t *i0, int64_t *i1) {
  int t = omp_get_thread_num(), k = omp_get_num_threads();
  *i0 = n * t / k;
  *i1 = n * (t + 1) / k;
}

static void k_memcpy(arrays *x) {
#pragma omp parallel
  {
    int64_t i0, i1;
    my_range(x->n, &i0, &i1);
    memcpy(x->a + i0, x->b + i0, (size_t)(i1 - i0) * sizeof(float));
  }
}

static void k_copy(arrays *x) {
#pragma omp parallel
  {
    int64_t i0, i1;
    my_range(x->n, &i0, &i1);
    float *restrict a = x->a;
    const float *restrict b = x->b;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) a[i] = b[i];
  }
}

static void k_triad(arrays *x) {
#pragma omp parallel
  {
    int64_t i0, i1;
    my_range(x->n, &i0, &i1);
    float *restrict a = x->a;
    const float *restrict b = x->b, *restrict c = x->c;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) a[i] = b[i] + 0.5f * c[i];
  }
}

static void k_update(arrays *x) {
#pragma omp parallel
  {
    int64_t i0, i1;
    my_range(x->n, &i0, &i1);
    float *restrict a = x->a;
    const float *restrict b = x->b;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) a[i] = 0.5f * a[i] + b[i];
  }
}

static void k_streams(arrays *x) {
#pragma omp parallel
  {
    int64_t i0, i1;
    my_range(x->n, &i0, &i1);
    float *restrict a = x->a, *restrict b = x->b, *restrict c = x->c;
    const float *restrict d = x->d;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
      a[i] = 0.5f * a[i] + d[i];
      b[i] = 0.5f * b[i] + d[i];
      c[i] = 0.5f * c[i] + d[i];
    }
  }
}

/* The best GB/s of reps timed runs of fn, counting `arrays` arrays of n floats per run. */
static double best_gbps(void (*fn)(arrays *), arrays *x, int narrays, int reps) {
  double best = 1e30;
  for (int r = 0; r <= reps; r++) {
    double t0 = omp_get_wtime();
    fn(x);
    double dt = omp_get_wtime() - t0;
    if (r > 0 && dt < best) best = dt;   /* run 0 warms pages and threads */
  }
  return (double)narrays * (double)x->n * sizeof(float) / best / 1e9;
}

static long arg(int argc, char **argv, int i, long dflt, long max) {
  if (argc <= i) return dflt;
  char *end;
  long v = strtol(argv[i], &end, 10);
  if (*argv[i] == '\0' || *end != '\0' || v < 1 || v > max) {
    fprintf(stderr, "adamw_membw: argument %d must be a whole number from 1 to %ld, not '%s'\n", i, max, argv[i]);
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  arrays x = {.n = arg(argc, argv, 1, 1L << 26, 1L << 32)};
  int reps = (int)arg(argc, argv, 2, 5, 1000);
  size_t bytes = (size_t)x.n * sizeof(float);
  x.a = malloc(bytes); x.b = malloc(bytes); x.c = malloc(bytes); x.d = malloc(bytes);
  if (!x.a || !x.b || !x.c || !x.d) { fprintf(stderr, "adamw_membw: out of memory for 4 x %zu bytes\n", bytes); return 1; }
#pragma omp parallel
  {   /* each thread first touches the pages it will use */
    int64_t i0, i1;
    my_range(x.n, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) { x.a[i] = 0; x.b[i] = 1; x.c[i] = 2; x.d[i] = 3; }
  }
  struct { const char *name; void (*fn)(arrays *); int narrays; } k[] = {
    {"memcpy", k_memcpy, 2}, {"copy", k_copy, 2}, {"triad", k_triad, 3}, {"update", k_update, 3}, {"streams", k_streams, 7},
  };
  for (int a = 3; a < argc; a++) {
    int t = (int)arg(argc, argv, a, 1, 1024);
    omp_set_num_threads(t);
    double best = 0;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
      double g = best_gbps(k[i].fn, &x, k[i].narrays, reps);
      printf("%s_gb_per_s_%dt %.2f\n", k[i].name, t, g);
      if (g > best) best = g;
    }
    printf("gb_per_s_%dt %.2f\n", t, best);
    fflush(stdout);
  }
  free(x.a); free(x.b); free(x.c); free(x.d);
  return 0;
}
