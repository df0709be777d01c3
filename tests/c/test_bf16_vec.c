/* test_bf16_vec.c: the array conversions of runtime/cpu/bf16_vec.c and the copies, fills and
 * elementwise staging that go through them, under the CPU kernel set in use (16 lanes of
 * AVX-512F in the avx512 sets), under avx2 (8 lanes) and under generic's portable loop, in one
 * process (check_cpu.h's check_sets).
 * Reference: each element's bits against the scalar inline conversion (bf16_internal.h's,
 * itself checked against the nearest-value definition in test_tensor.c): every bf16 pattern
 * widened, and f32 inputs with NaN payloads, infinities, signed zeros, denormals, ties and
 * the largest values rounded, plus random bit patterns; lengths around both vector widths (8
 * and 16) for the tails, element strides on either side, unaligned starts, and untouched elements
 * between strided ones. Tensors: a transposed [B,H,T,D] view copied across dtypes (the
 * attention's staging), a copy large enough to be split over the threads, fill_ of bf16
 * (contiguous and strided), and bf16 add with a strided operand and a strided output. */
#include "check_cpu.h"
#include "core/bf16_internal.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rand32(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 32);
}

static float f32_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static const uint32_t SPECIAL[] = {
  0x00000000u, 0x80000000u,                                        /* signed zeros */
  0x00000001u, 0x00008000u, 0x00018000u, 0x007f8000u, 0x007fffffu, /* denormals, ties among them */
  0x80018000u, 0x807fffffu, 0x00800000u, 0x80800000u,              /* negative denormals, least normals */
  0x3f808000u, 0x3f818000u, 0xbf818000u, 0x3f808001u, 0x3f807fffu, /* ties to even, just past, just before */
  0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0xff7fffffu,              /* the largest: some round to inf */
  0x7f800000u, 0xff800000u,                                        /* infinities */
  0x7f800001u, 0xff800001u, 0x7fc00000u, 0xffffffffu, 0x7fbfffffu, /* NaNs: payload low, quiet, signalling */
};
enum { NSPECIAL = sizeof SPECIAL / sizeof SPECIAL[0], NIN = 4099 };

/* f32 inputs: the special values first and then again at odd places, the rest random bits. */
static float *f32_inputs(void) {
  float *x = malloc(sizeof(float) * NIN);
  for (int i = 0; i < NIN; i++) x[i] = f32_of(rand32());
  for (int i = 0; i < NSPECIAL; i++) x[i] = x[NIN - 1 - 3 * i] = x[37 + 5 * i] = f32_of(SPECIAL[i]);
  return x;
}

/* Whether element i of dst (bf16 when to16, else f32) is element j of src converted: rounded
 * by sh_f32_to_bf16_inline, or widened exactly. */
static int converted(const sh_tensor *dst, int64_t i, const sh_tensor *src, int64_t j, int to16) {
  if (to16) return ((const uint16_t *)sh_tensor_data(dst))[i] == sh_f32_to_bf16_inline(((const float *)sh_tensor_data(src))[j]);
  return bits_of(((const float *)sh_tensor_data(dst))[i]) == (uint32_t)((const uint16_t *)sh_tensor_data(src))[j] << 16;
}

static const int64_t STRIDES[][2] = {{1, 1}, {1, 3}, {2, 1}, {3, 2}};
static const int64_t LENGTHS[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, NIN};
static const int64_t STARTS[] = {0, 1, 7};

/* f32 -> bf16 for every stride pair, length and start: rounded elements match the inline
 * rounding, elements between them keep their sentinel. */
static void test_round_n(void) {
  float *x = f32_inputs();
  uint16_t *d = malloc(sizeof(uint16_t) * (3 * NIN + 16));
  for (int si = 0; si < check_sets(); si++) {
    const char *set = check_use_set(si);
    int bad = 0, cases = 0;
    for (size_t s = 0; s < sizeof STRIDES / sizeof STRIDES[0]; s++)
      for (size_t l = 0; l < sizeof LENGTHS / sizeof LENGTHS[0]; l++)
        for (size_t o = 0; o < sizeof STARTS / sizeof STARTS[0]; o++) {
          int64_t ds = STRIDES[s][0], ss = STRIDES[s][1], n = LENGTHS[l], off = STARTS[o];
          if (off + (n - 1) * ss >= NIN) n = (NIN - 1 - off) / ss + 1;
          for (int64_t i = 0; i < 3 * NIN + 16; i++) d[i] = 0xAAAA;
          sh_f32_to_bf16_n(d + off, ds, x + off, ss, n);
          cases++;
          for (int64_t i = 0; i < 3 * NIN + 16; i++) {
            int64_t k = i - off;
            int in_run = k >= 0 && k % ds == 0 && k / ds < n;
            uint16_t want = in_run ? sh_f32_to_bf16_inline(x[off + k / ds * ss]) : 0xAAAA;
            if (d[i] != want && bad++ < 3)
              printf("# %s ds=%lld ss=%lld n=%lld start=%lld: [%lld] = %04x, want %04x (from %08x)\n", set,
                     (long long)ds, (long long)ss, (long long)n, (long long)off, (long long)i, d[i], want,
                     in_run ? bits_of(x[off + k / ds * ss]) : 0u);
          }
        }
    CHECK(bad == 0, "f32 -> bf16 (%s): %d elements wrong over %d runs", set, bad, cases);
  }
  check_use_set(0);
  free(d);
  free(x);
}

/* bf16 -> f32: every one of the 65536 patterns, contiguous and strided. */
static void test_widen_n(void) {
  enum { N = 65536 };
  uint16_t *h = malloc(sizeof(uint16_t) * 3 * N);
  float *d = malloc(sizeof(float) * (3 * N + 16));
  for (int i = 0; i < 3 * N; i++) h[i] = (uint16_t)(i / 3 * 7 + i % 3);   /* every pattern at each stride */
  for (int si = 0; si < check_sets(); si++) {
    const char *set = check_use_set(si);
    int bad = 0;
    for (size_t s = 0; s < sizeof STRIDES / sizeof STRIDES[0]; s++)
      for (size_t o = 0; o < 2; o++) {
        int64_t ds = STRIDES[s][0], ss = STRIDES[s][1], off = STARTS[o], n = (3 * N - 1 - off) / ss + 1;
        if (off + (n - 1) * ds >= 3 * N + 16) n = (3 * N + 15 - off) / ds + 1;
        for (int64_t i = 0; i < 3 * N + 16; i++) d[i] = f32_of(0xAAAAAAAAu);
        sh_bf16_to_f32_n(d + off, ds, h + off, ss, n);
        for (int64_t i = 0; i < 3 * N + 16; i++) {
          int64_t k = i - off;
          int in_run = k >= 0 && k % ds == 0 && k / ds < n;
          uint32_t want = in_run ? (uint32_t)h[off + k / ds * ss] << 16 : 0xAAAAAAAAu;
          if (bits_of(d[i]) != want && bad++ < 3)
            printf("# %s ds=%lld ss=%lld: [%lld] = %08x, want %08x\n", set, (long long)ds, (long long)ss,
                   (long long)i, bits_of(d[i]), want);
        }
      }
    CHECK(bad == 0, "bf16 -> f32 (%s): %d elements wrong", set, bad);
  }
  check_use_set(0);
  free(d);
  free(h);
}

/* ---- through tensors ------------------------------------------------------------------- */

static sh_tensor *tensor(int ndim, const int64_t *shape, int dtype) {
  sh_tensor *t = NULL;
  CHECK_OK(sh_tensor_empty(&t, ndim, shape, dtype, -1));
  return t;
}

/* Element (b, h, t, d) of a [B, T, H, D] array, row-major. */
static int64_t bthd(const int64_t *s, int64_t b, int64_t h, int64_t t, int64_t d) {
  return ((b * s[1] + t) * s[2] + h) * s[3] + d;
}

/* A [B, T, H, D] tensor seen as [B, H, T, D] (rows of D contiguous, D = 40: two vectors and a
 * tail; big enough for the threads) copied to a contiguous tensor of the other dtype, both ways, on both paths; then the
 * same dtype pair over 200003 contiguous elements (split over the threads). */
static void test_copy_staging(void) {
  const int64_t s[4] = {12, 40, 4, 40};   /* 76800 elements: split over the threads */
  int64_t n = s[0] * s[1] * s[2] * s[3];
  float *x = f32_inputs();
  for (int si = 0; si < check_sets(); si++) {
    const char *set = check_use_set(si);
    for (int to16 = 0; to16 < 2; to16++) {
      int st = to16 ? SH_F32 : SH_BF16, dt = to16 ? SH_BF16 : SH_F32;
      sh_tensor *src = tensor(4, s, st), *view = NULL, *dst = tensor(4, (int64_t[]){s[0], s[2], s[1], s[3]}, dt);
      for (int64_t i = 0; i < n; i++) {
        if (to16) ((float *)sh_tensor_data(src))[i] = x[i % NIN];
        else ((uint16_t *)sh_tensor_data(src))[i] = (uint16_t)(rand32() >> 16);
      }
      CHECK_OK(sh_view_transpose(&view, src, 1, 2));
      CHECK_OK(sh_tensor_copy_(dst, view));
      int bad = 0;
      for (int64_t b = 0, i = 0; b < s[0]; b++)
        for (int64_t h = 0; h < s[2]; h++)
          for (int64_t t = 0; t < s[1]; t++)
            for (int64_t d = 0; d < s[3]; d++, i++) {
              bad += !converted(dst, i, src, bthd(s, b, h, t, d), to16);
            }
      CHECK(bad == 0, "copy of a transposed %s view to %s (%s): %d elements wrong", sh_dtype_name(st), sh_dtype_name(dt),
            set, bad);
      sh_tensor_destroy(dst);
      sh_tensor_destroy(view);
      sh_tensor_destroy(src);
    }
    int64_t big = 200003;
    sh_tensor *f = tensor(1, &big, SH_F32), *h = tensor(1, &big, SH_BF16), *back = tensor(1, &big, SH_F32);
    for (int64_t i = 0; i < big; i++) ((float *)sh_tensor_data(f))[i] = x[(i * 7) % NIN];
    CHECK_OK(sh_tensor_copy_(h, f));
    CHECK_OK(sh_tensor_copy_(back, h));
    int bad16 = 0, bad32 = 0;
    for (int64_t i = 0; i < big; i++) {
      uint16_t want = sh_f32_to_bf16_inline(((float *)sh_tensor_data(f))[i]), got = ((uint16_t *)sh_tensor_data(h))[i];
      bad16 += got != want;
      bad32 += bits_of(((float *)sh_tensor_data(back))[i]) != (uint32_t)got << 16;
    }
    CHECK(bad16 == 0 && bad32 == 0, "%lld contiguous elements f32 -> bf16 -> f32 (%s): %d and %d wrong", (long long)big,
          set, bad16, bad32);
    sh_tensor_destroy(f);
    sh_tensor_destroy(h);
    sh_tensor_destroy(back);
  }
  check_use_set(0);
  free(x);
}

/* Strided on the last dim: a contiguous [R, C] copied into the transpose of a [C, R] tensor of
 * the other dtype, both ways (element strides R on one side, 1 on the other). */
static void test_copy_transposed(void) {
  enum { R = 5, C = 37 };
  float *x = f32_inputs();
  for (int si = 0; si < check_sets(); si++) {
    const char *set = check_use_set(si);
    for (int to16 = 0; to16 < 2; to16++) {
      int st = to16 ? SH_F32 : SH_BF16, dt = to16 ? SH_BF16 : SH_F32;
      sh_tensor *src = tensor(2, (int64_t[]){R, C}, st), *dst = tensor(2, (int64_t[]){C, R}, dt), *view = NULL;
      for (int i = 0; i < R * C; i++) {
        if (to16) ((float *)sh_tensor_data(src))[i] = x[i];
        else ((uint16_t *)sh_tensor_data(src))[i] = (uint16_t)(rand32() >> 16);
      }
      CHECK_OK(sh_view_transpose(&view, dst, 0, 1));
      CHECK_OK(sh_tensor_copy_(view, src));
      int bad = 0;
      for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) bad += !converted(dst, j * R + i, src, i * C + j, to16);
      CHECK(bad == 0, "copy of %s into a transposed %s (%s): %d elements wrong", sh_dtype_name(st), sh_dtype_name(dt),
            set, bad);
      sh_tensor_destroy(view);
      sh_tensor_destroy(dst);
      sh_tensor_destroy(src);
    }
  }
  check_use_set(0);
  free(x);
}

/* fill_ of bf16 rounds the value once (nearest even) into every element it covers. */
static void test_fill_bf16(void) {
  sh_tensor *t = tensor(2, (int64_t[]){5, 33}, SH_BF16), *col = NULL;
  CHECK_OK(sh_tensor_fill_(t, 1.0 / 3.0));
  uint16_t third = sh_f32_to_bf16_inline((float)(1.0 / 3.0)), *d = sh_tensor_data(t);
  int bad = 0;
  for (int i = 0; i < 5 * 33; i++) bad += d[i] != third;
  CHECK(bad == 0 && third == 0x3eab, "fill_ bf16 with 1/3: %d elements not 0x3eab", bad);
  CHECK_OK(sh_view_narrow(&col, t, 1, 4, 1));   /* one column: strided */
  CHECK_OK(sh_tensor_fill_(col, 65535.0));      /* 0x477fff00: rounds up to 65536 */
  bad = 0;
  for (int i = 0; i < 5 * 33; i++) bad += d[i] != (i % 33 == 4 ? 0x4780 : third);
  CHECK(bad == 0, "fill_ of a strided bf16 column: %d elements wrong", bad);
  CHECK_OK(sh_tensor_fill_(t, -0.0));   /* the sign of zero kept */
  bad = 0;
  for (int i = 0; i < 5 * 33; i++) bad += d[i] != 0x8000;
  CHECK(bad == 0, "fill_ bf16 with -0: %d elements not 0x8000", bad);
  CHECK_OK(sh_tensor_fill_(t, 0.0));
  bad = 0;
  for (int i = 0; i < 5 * 33; i++) bad += d[i] != 0;
  CHECK(bad == 0, "fill_ bf16 with 0: %d elements not 0", bad);
  sh_tensor_destroy(col);
  sh_tensor_destroy(t);
}

/* bf16 + bf16 with the first operand transposed (strided gather) into a bf16 result, and then
 * in place into a transposed bf16 destination (strided scatter): each element is the f32 sum
 * of the widened operands, rounded as inline. 70 columns: vectors and a tail. */
static void test_elementwise_bf16(void) {
  enum { R = 9, C = 70 };
  for (int si = 0; si < check_sets(); si++) {
    const char *set = check_use_set(si);
    sh_tensor *a = tensor(2, (int64_t[]){C, R}, SH_BF16), *b = tensor(2, (int64_t[]){R, C}, SH_BF16);
    sh_tensor *at = NULL, *sum = NULL, *acc = tensor(2, (int64_t[]){C, R}, SH_BF16), *acct = NULL;
    uint16_t *ha = sh_tensor_data(a), *hb = sh_tensor_data(b), *hc = sh_tensor_data(acc);
    for (int i = 0; i < R * C; i++) {
      ha[i] = sh_f32_to_bf16_inline(f32_of(rand32() & 0xBFFFFFFFu));   /* finite: |x| < 4 */
      hb[i] = sh_f32_to_bf16_inline(f32_of(rand32() & 0xBFFFFFFFu));
    }
    for (int i = 0; i < R * C; i++) hc[i] = hb[(i % R) * C + i / R];   /* acc^T = b */
    CHECK_OK(sh_view_transpose(&at, a, 0, 1));
    CHECK_OK(sh_binary(&sum, SH_OP_ADD, at, b));
    CHECK_OK(sh_view_transpose(&acct, acc, 0, 1));
    CHECK_OK(sh_binary_(acct, SH_OP_ADD, at));   /* acc^T += a^T */
    int bad = 0, bad_inplace = 0;
    for (int i = 0; i < R; i++)
      for (int j = 0; j < C; j++) {
        float f = sh_bf16_to_f32_inline(ha[j * R + i]) + sh_bf16_to_f32_inline(hb[i * C + j]);
        bad += sum->dtype != SH_BF16 || ((uint16_t *)sh_tensor_data(sum))[i * C + j] != sh_f32_to_bf16_inline(f);
        bad_inplace += hc[j * R + i] != sh_f32_to_bf16_inline(f);
      }
    CHECK(bad == 0, "bf16 a^T + b (%s): %d elements wrong", set, bad);
    CHECK(bad_inplace == 0, "bf16 acc^T += a^T (%s): %d elements wrong", set, bad_inplace);
    sh_tensor_destroy(acct);
    sh_tensor_destroy(sum);
    sh_tensor_destroy(at);
    sh_tensor_destroy(acc);
    sh_tensor_destroy(b);
    sh_tensor_destroy(a);
  }
  check_use_set(0);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_round_n);
  RUN(test_widen_n);
  RUN(test_copy_staging);
  RUN(test_copy_transposed);
  RUN(test_fill_bf16);
  RUN(test_elementwise_bf16);
  return check_summary("test_bf16_vec");
}
