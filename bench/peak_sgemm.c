/* peak_sgemm.c: the machine's measured f32 matmul peak, for make bench's "distance to the
 * physical limit": OpenBLAS sgemm of an N x N square (C = A B, row-major), on THREADS
 * OpenBLAS threads. Prints "gflops G", the best of REPS timed calls after one untimed call
 * (the machine may be shared; the best call is the one least disturbed).
 *   peak_sgemm [N=2048] [THREADS=1] [REPS=5]
 * Built by bench/run.sh:  cc -O2 bench/peak_sgemm.c -lopenblas -o build/bench/peak_sgemm */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <cblas.h>

void openblas_set_num_threads(int);

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int arg(int argc, char **argv, int i, int dflt) {
  if (argc <= i) return dflt;
  char *end;
  long v = strtol(argv[i], &end, 10);
  if (*argv[i] == '\0' || *end != '\0' || v < 1 || v > 65536) {
    fprintf(stderr, "peak_sgemm: argument %d must be a whole number from 1 to 65536, not '%s'\n", i, argv[i]);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  int n = arg(argc, argv, 1, 2048), threads = arg(argc, argv, 2, 1), reps = arg(argc, argv, 3, 5);
  openblas_set_num_threads(threads);
  size_t count = (size_t)n * n;
  float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b), *c = malloc(count * sizeof *c);
  if (!a || !b || !c) { fprintf(stderr, "peak_sgemm: out of memory for n = %d\n", n); return 1; }
  srand(1);
  for (size_t i = 0; i < count; i++) {
    a[i] = (float)rand() / RAND_MAX - 0.5f;
    b[i] = (float)rand() / RAND_MAX - 0.5f;
  }
  double best = 1e30;
  for (int r = 0; r <= reps; r++) {
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double dt = now() - t0;
    if (r > 0 && dt < best) best = dt;   /* call 0 warms caches, pages and threads */
  }
  printf("n %d\nthreads %d\ngflops %.1f\n", n, threads, 2.0 * n * n * n / best / 1e9);
  free(a); free(b); free(c);
  return 0;
}
