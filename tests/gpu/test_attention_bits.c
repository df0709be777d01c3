/* test_attention_bits.c (make test-gpu; the emulated device in make test): what the CUDA
 * attention backward's bits owe to the order its blocks run in (kernels/attention.cu).
 *  - deterministic (sh_set_deterministic(1)): dq, dk and dv bit-identical whatever the order;
 *  - the one-pass backward (the default): dk and dv bit-identical to the deterministic ones
 *    (one writer per row, the same products in the same order), dq within rounding of them
 *    (its key tiles' shares are summed by atomicAdd in the blocks' order);
 *  - the control, on the emulator only: on inputs whose dq sums cancel across key tiles
 *    (cancelling), the one-pass dq differs in many bits between two block orders, so the
 *    orders do reach the sums and the first check would see a path that let them.
 * The emulator runs blocks in the order sh_emu_set_block_order sets (tests/cuda_emu/
 * emu_counters.cpp, weak here); on a GPU each run takes the hardware's schedule, the
 * deterministic checks hold there as they are and the control is skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/determinism.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/nn.h"
#include "gpu_test.h"

extern void sh_emu_set_block_order(int order, unsigned long long seed) __attribute__((weak));

enum { DEV = 0, ORDERS = 3 };

/* cancel: inputs whose dq sums cancel across key tiles (see cancelling), else normal(0, 1). */
typedef struct { int64_t B, H, Hkv, T, D; int cancel; } shape;

/* The three gradients of one backward, as host bf16 tensors. */
typedef struct { sh_tensor *g[3]; } grads;

static const char *NAMES[3] = {"dq", "dk", "dv"};

/* Block order o (0 forward, 1 reverse, 2 shuffled) for the launches that run next. */
static void set_order(int o) {
  if (sh_emu_set_block_order) sh_emu_set_block_order(o, 7);
}

/* Inputs that make dq's sum over key tiles order-sensitive in bf16: q = 0 (every visible key
 * gets the same probability), key tile 1 the negation of key tile 0 with the same values v
 * (so their dS are equal and their shares of dS K cancel), and the later key tiles 1000 times
 * smaller. A query row that sees 3 or more key tiles then adds two large shares that cancel
 * and small ones, and the f32 rounding of that sum depends on its order far above bf16's
 * last bit. in[0..3] = q, k, v, dout (host f32). */
static void cancelling(sh_tensor *in[4], const shape *s) {
  int64_t rows = s->B * s->Hkv * s->T, n = rows * s->D;
  double *k = malloc(sizeof(double) * (size_t)n), *v = malloc(sizeof(double) * (size_t)n);
  CHECK(k && v && !sh_tensor_read_f64(in[1], k) && !sh_tensor_read_f64(in[2], v), "reading the inputs: %s", sh_last_error());
  for (int64_t r = 0; k && v && r < rows; r++) {
    int64_t t = r % s->T, tile = t / 64;
    for (int64_t d = 0; d < s->D; d++) {
      double *kr = k + r * s->D + d, *vr = v + r * s->D + d;
      if (tile == 1) { *kr = -kr[-64 * s->D]; *vr = vr[-64 * s->D]; }
      else if (tile > 1) *kr *= 1e-3;
    }
  }
  CHECK(k && v && !sh_tensor_write_f64(in[1], k) && !sh_tensor_write_f64(in[2], v) && !sh_tensor_fill_(in[0], 0),
        "writing the inputs: %s", sh_last_error());
  free(k);
  free(v);
}

/* attention backward of fixed inputs on cuda:0 under block order o, deterministic or not. */
static grads backward(const shape *s, int o, int deterministic) {
  int64_t qs[4] = {s->B, s->H, s->T, s->D}, ks[4] = {s->B, s->Hkv, s->T, s->D};
  sh_tensor *f32[4] = {gpu_random(4, qs, SH_F32, 1, 0, 1), gpu_random(4, ks, SH_F32, 2, 0, 1),
                       gpu_random(4, ks, SH_F32, 3, 0, 1), gpu_random(4, qs, SH_F32, 4, 0, 1)};
  if (s->cancel) cancelling(f32, s);
  sh_tensor *d[4], *out = NULL, *lse = NULL;
  for (int i = 0; i < 4; i++) {
    sh_tensor *h = NULL;
    CHECK_OK(sh_tensor_to(&h, f32[i], SH_BF16, -1));
    d[i] = gpu_on(h, DEV);
    sh_tensor_destroy(h);
  }
  grads r = {{NULL, NULL, NULL}};
  sh_tensor *dev[3] = {NULL, NULL, NULL};
  int was = sh_set_deterministic(deterministic);
  set_order(o);
  CHECK_OK(sh_attention_forward(&out, &lse, d[0], d[1], d[2], 0));
  CHECK_OK(sh_attention_backward(&dev[0], &dev[1], &dev[2], d[3], d[0], d[1], d[2], out, lse, 0));
  CHECK_OK(sh_cuda_synchronize(DEV));   /* the emulator runs the work here, in order o */
  sh_set_deterministic(was);
  for (int i = 0; i < 3; i++) CHECK_OK(sh_tensor_to(&r.g[i], dev[i], SH_BF16, -1));
  for (int i = 0; i < 4; i++) { sh_tensor_destroy(f32[i]); sh_tensor_destroy(d[i]); }
  for (int i = 0; i < 3; i++) sh_tensor_destroy(dev[i]);
  sh_tensor_destroy(out);
  sh_tensor_destroy(lse);
  return r;
}

static void grads_free(grads *g) {
  for (int i = 0; i < 3; i++) sh_tensor_destroy(g->g[i]);
}

/* Elements whose bits differ (-1 when either is missing). */
static int64_t differing(const sh_tensor *a, const sh_tensor *b) {
  if (!a || !b) return -1;
  const uint16_t *x = sh_tensor_data(a), *y = sh_tensor_data(b);
  int64_t n = sh_tensor_numel(a), k = 0;
  for (int64_t i = 0; i < n; i++) k += x[i] != y[i];
  return k;
}

/* ||a - b|| / ||b|| in double. */
static double rel_err(const sh_tensor *a, const sh_tensor *b) {
  int64_t n = sh_tensor_numel(b);
  double *x = malloc(sizeof(double) * (size_t)n), *y = malloc(sizeof(double) * (size_t)n), num = 0, den = 0;
  if (!x || !y || sh_tensor_read_f64(a, x) || sh_tensor_read_f64(b, y)) num = INFINITY, den = 1;
  for (int64_t i = 0; den < INFINITY && num < INFINITY && i < n; i++) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  free(x);
  free(y);
  return sqrt(num / den);
}

static void check_shape(const shape *s) {
  char what[96];
  snprintf(what, sizeof what, "B %lld H %lld Hkv %lld T %lld D %lld%s", (long long)s->B, (long long)s->H,
           (long long)s->Hkv, (long long)s->T, (long long)s->D, s->cancel ? " (cancelling)" : "");
  grads det[ORDERS], fast[ORDERS];
  int orders = sh_emu_set_block_order ? ORDERS : 2;   /* on a GPU: two runs of the hardware's order */
  for (int o = 0; o < orders; o++) {
    det[o] = backward(s, o, 1);
    fast[o] = backward(s, o, 0);
  }
  for (int o = 1; o < orders; o++)
    for (int i = 0; i < 3; i++) {
      int64_t k = differing(det[o].g[i], det[0].g[i]);
      CHECK(k == 0, "%s: deterministic %s differs in %lld elements between block orders 0 and %d", what, NAMES[i],
            (long long)k, o);
    }
  for (int o = 0; o < orders; o++) {
    for (int i = 1; i < 3; i++) {
      int64_t k = differing(fast[o].g[i], det[0].g[i]);
      CHECK(k == 0, "%s: one-pass %s differs from the deterministic one in %lld elements (order %d)", what, NAMES[i],
            (long long)k, o);
    }
    double e = rel_err(fast[o].g[0], det[0].g[0]);
    CHECK(e < 2e-3, "%s: one-pass dq against the deterministic one: normwise error %.3g (order %d)", what, e, o);
  }
  if (sh_emu_set_block_order && s->cancel) {
    int64_t k = differing(fast[1].g[0], fast[0].g[0]);
    CHECK(k > 0, "%s: the control: one-pass dq has the same bits under forward and reverse block order", what);
    printf("%s: one-pass dq differs in %lld of %lld elements between forward and reverse block order\n", what,
           (long long)k, (long long)sh_tensor_numel(fast[0].g[0]));
  }
  for (int o = 0; o < orders; o++) { grads_free(&det[o]); grads_free(&fast[o]); }
}

int main(void) {
  int rc = cuda_test_start("test_attention_bits", DEV);
  if (rc >= 0) return rc;
  /* D 64 and 128 (the one-pass kernel's two register layouts), MHA and grouped-query, 4 and 3
   * key tiles (a dq row gets up to 4 key tiles' shares); the first is the control's */
  static const shape shapes[] = {{1, 1, 1, 256, 64, 1}, {1, 2, 1, 130, 128, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i]);
  return check_summary("test_attention_bits");
}
