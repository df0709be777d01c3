/* fuzz_safetensors.c: a mutation fuzzer for the safetensors reader (runtime/io/safetensors.c,
 * compiled into this file with a counting allocator). Built with
 * -fsanitize=address,undefined by `make fuzz`; any sanitizer report aborts the run.
 *
 * Each iteration takes a seed file (a header and a body), mutates the header JSON (bit flips,
 * byte and token replacements, integers swapped for edge values, deletions, duplications,
 * splices from other seeds), the body (resized) and the 8-byte length (kept right most of
 * the time, so that mutations reach the parser, else edited), sometimes flips or truncates
 * the assembled bytes, writes the file and opens it. A file that opens must satisfy the
 * format's invariants (names sorted and unique, ranges tiling the data section, sizes equal
 * to shape x dtype), and every tensor, whole and in a random sub-range, must read back the
 * exact bytes of the file; out-of-range reads must be refused. After every iteration no
 * allocation may be live (no leak), and the peak of live bytes must stay within
 * 24 x file size + 64 KiB: memory bounded by the input, whatever the header claims.
 *
 *   fuzz_safetensors ITERATIONS [SEED]      (make fuzz: FUZZ_ITERS, FUZZ_SEED)
 *   fuzz_safetensors                        20,000 iterations as a C test of make test
 *                                           (built as build/tests/test_safetensors_fuzz)
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t fz_live, fz_peak;

typedef union { size_t n; max_align_t align; } fz_head;

static void *fz_malloc(size_t n) {
  fz_head *h = malloc(sizeof *h + n);
  if (!h) return NULL;
  h->n = n;
  fz_live += n;
  if (fz_live > fz_peak) fz_peak = fz_live;
  return h + 1;
}

static void fz_free(void *p) {
  if (!p) return;
  fz_head *h = (fz_head *)p - 1;
  fz_live -= h->n;
  free(h);
}

static void *fz_realloc(void *p, size_t n) {
  if (!p) return fz_malloc(n);
  fz_head *h = (fz_head *)p - 1;
  size_t old = h->n;
  fz_head *q = realloc(h, sizeof *q + n);
  if (!q) return NULL;
  q->n = n;
  fz_live += n - old;
  if (fz_live > fz_peak) fz_peak = fz_live;
  return q + 1;
}

#define ST_MALLOC fz_malloc
#define ST_REALLOC fz_realloc
#define ST_FREE fz_free
#include "../../runtime/io/safetensors.c"

/* The few tensor functions the reader calls, over a plain struct (no runtime allocator). */
int sh_tensor_check(const sh_tensor *t, const char *op) {
  return t && t->storage ? 0 : sh_fail(SH_ERR_FREED, "%s: no tensor", op);
}
int64_t sh_tensor_numel(const sh_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}
int sh_tensor_is_contiguous(const sh_tensor *t) { return 1; }
void *sh_tensor_data(const sh_tensor *t) { return (char *)t->storage->data + t->offset * sh_dtype_size(t->dtype); }
int sh_tensor_describe(const sh_tensor *t, char *buf, int size) { return snprintf(buf, size, "%s[%lld] cpu", sh_dtype_name(t->dtype), (long long)sh_tensor_numel(t)); }

/* ---------------------------------------------------------------- randomness */

static uint64_t rng_state;
static uint64_t rnd(void) {   /* xorshift64* */
  rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
  return rng_state * UINT64_C(2685821657736338717);
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* ---------------------------------------------------------------- seeds */

typedef struct bytes { unsigned char *p; size_t n, cap; } bytes;

static void b_reserve(bytes *b, size_t n) {
  if (n <= b->cap) return;
  size_t c = b->cap ? b->cap : 64;
  while (c < n) c *= 2;
  b->p = realloc(b->p, c);
  if (!b->p) { fprintf(stderr, "fuzz: out of memory\n"); exit(2); }
  b->cap = c;
}
static void b_set(bytes *b, const void *s, size_t n) { b_reserve(b, n + 1); memcpy(b->p, s, n); b->n = n; }
static void b_insert(bytes *b, size_t at, const void *s, size_t n) {
  b_reserve(b, b->n + n + 1);
  memmove(b->p + at + n, b->p + at, b->n - at);
  memcpy(b->p + at, s, n);
  b->n += n;
}
static void b_erase(bytes *b, size_t at, size_t n) {
  if (at + n > b->n) n = b->n - at;
  memmove(b->p + at, b->p + at + n, b->n - at - n);
  b->n -= n;
}

typedef struct seed { const char *header; size_t body; } seed;

static const seed SEEDS[] = {
  {"{}", 0},
  {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8},
  {"{\"__metadata__\":{\"format\":\"pt\",\"k\\u00e9\":\"v\\n\\ud83d\\ude00\"},"
   "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
   "\"b\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[12,20]},"
   "\"c\":{\"dtype\":\"U8\",\"shape\":[0,7],\"data_offsets\":[20,20]},"
   "\"d\":{\"dtype\":\"I8\",\"shape\":[5],\"data_offsets\":[20,25]}}   ", 25},
  {"{ \"x.weight\" : { \"shape\" : [ 4 , 1 ] , \"dtype\" : \"I64\" , \"data_offsets\" : [ 8 , 40 ] } ,\n"
   "  \"x.bias\" : { \"data_offsets\" : [ 0 , 8 ] , \"dtype\" : \"I32\" , \"shape\" : [ 2 ] } }\n", 40},
  {"{\"e\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[6,9]},\"f\":{\"dtype\":\"F16\",\"shape\":[1,1,1,3],\"data_offsets\":[0,6]},"
   "\"g\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[9,11]}}", 11},
  {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1099511627776,-1099511627768]}}", 8},
  {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6},
  {"{\"__metadata__\":{},\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8},
};
#define N_SEEDS ((int)(sizeof SEEDS / sizeof SEEDS[0]))

static const char *TOKENS[] = {
  "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u0000", "\\ud800", "\\udc00", "\\u00e9", "\xff", "\xc0\x80", "\xed\xa0\x80",
  "\xf4\x90\x80\x80", "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"F64\"", "\"BF16\"",
  "\"I8\"", "\"BOOL\"", "\"F8_E4M3\"", "null", "true", "[]", "{}", "[0,0]", "\"\"", " ", "\n", "\t", "\0",
};
static const char *INTS[] = {
  "0", "1", "-1", "-0", "8", "-8", "7", "9", "255", "256", "65536", "4294967295", "4294967296", "-1099511627776",
  "1099511627776", "2147483647", "2147483648", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
  "18446744073709551615", "18446744073709551616", "99999999999999999999999", "1e3", "1.5", "2.0", "1E400", "00", "01",
  "2305843009213693952", "4611686018427387904", "",
};
#define COUNT(a) (sizeof a / sizeof a[0])

/* One mutation of the header text. */
static void mutate_header(bytes *h) {
  switch (below(9)) {
  case 0:   /* bit flip */
    if (h->n) h->p[below(h->n)] ^= (unsigned char)(1u << below(8));
    break;
  case 1:   /* byte replaced */
    if (h->n) h->p[below(h->n)] = (unsigned char)(below(4) ? (uint64_t)(unsigned char)"{}[]\",:-0123456789\\ueE. \x80\xff"[below(27)] : rnd());
    break;
  case 2: { /* token inserted */
    const char *t = TOKENS[below(COUNT(TOKENS))];
    b_insert(h, below(h->n + 1), t, *t ? strlen(t) : 1);
    break;
  }
  case 3: case 4: { /* an integer (a run of digits, with its sign) replaced by an edge value */
    size_t at = below(h->n + 1), i = at;
    while (i < h->n && !(h->p[i] >= '0' && h->p[i] <= '9')) i++;
    if (i >= h->n) break;
    size_t s = i, e = i;
    if (s > 0 && h->p[s - 1] == '-') s--;
    while (e < h->n && ((h->p[e] >= '0' && h->p[e] <= '9') || h->p[e] == '.' || h->p[e] == 'e')) e++;
    char num[32];
    const char *v = INTS[below(COUNT(INTS))];
    if (below(3) == 0) { snprintf(num, sizeof num, "%llu", (unsigned long long)(rnd() >> below(64))); v = num; }
    b_erase(h, s, e - s);
    b_insert(h, s, v, strlen(v));
    break;
  }
  case 5:   /* a range deleted */
    if (h->n) { size_t at = below(h->n); b_erase(h, at, 1 + below(below(2) ? 4 : h->n - at)); }
    break;
  case 6:   /* a range duplicated in place (duplicate keys, repeated entries) */
    if (h->n) {
      size_t at = below(h->n), len = 1 + below(h->n - at);
      unsigned char *copy = malloc(len);
      memcpy(copy, h->p + at, len);
      b_insert(h, below(h->n + 1), copy, len);
      free(copy);
    }
    break;
  case 7: { /* a splice from another seed */
    const char *o = SEEDS[below(N_SEEDS)].header;
    size_t on = strlen(o);
    if (!on) break;
    size_t a = below(on), len = 1 + below(on - a);
    b_insert(h, below(h->n + 1), o + a, len);
    break;
  }
  case 8:   /* the tail cut */
    h->n = below(h->n + 1);
    break;
  }
}

static int fuzz(long long iters, uint64_t rng_seed) {
  rng_state = rng_seed ? rng_seed : 1;
  const char *tmpdir = getenv("TMPDIR");
  if (access("/dev/shm", W_OK) == 0) tmpdir = "/dev/shm";
  if (!tmpdir) tmpdir = "/tmp";
  char path[512];
  snprintf(path, sizeof path, "%s/fuzz_safetensors_%ld.bin", tmpdir, (long)getpid());

  bytes h = {0}, file = {0};
  long long opened = 0, refused = 0, codes[8] = {0};
  size_t max_file = 0, max_peak = 0;
  for (long long it = 0; it < iters; it++) {
    const seed *s = &SEEDS[below(N_SEEDS)];
    b_set(&h, s->header, strlen(s->header));
    int rounds = (int)below(5);   /* 0: the seed as it is */
    for (int r = 0; r < rounds; r++) mutate_header(&h);
    size_t body = s->body;
    if (below(4) == 0) {
      long moved = (long)body + (long)below(17) - 8;
      body = below(3) ? (size_t)(moved > 0 ? moved : 0) : below(4096);
    }
    uint64_t hlen = h.n;
    switch (below(10)) {
    case 0: hlen = rnd() >> below(64); break;
    case 1: hlen = h.n + below(17) - 8; break;
    case 2: hlen = (uint64_t)100000000 + below(3) - 1; break;
    default: break;
    }
    b_reserve(&file, 8 + h.n + body + 1);
    for (int i = 0; i < 8; i++) file.p[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(file.p + 8, h.p, h.n);
    for (size_t i = 0; i < body; i++) file.p[8 + h.n + i] = (unsigned char)(i * 131 + 7);
    file.n = 8 + h.n + body;
    if (below(8) == 0) file.p[below(file.n)] ^= (unsigned char)(1u << below(8));
    if (below(16) == 0) file.n = below(file.n + 1);
    if (file.n > max_file) max_file = file.n;

    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(file.p, 1, file.n, fp) != file.n || fclose(fp)) { perror(path); return 2; }

    fz_live = fz_peak = 0;
    sh_st_file *f = NULL;
    int rc = sh_st_open(&f, path);
    if (rc) {
      refused++;
      codes[rc & 7]++;
      if (f) { fprintf(stderr, "iteration %lld: a failed open returned a handle\n", it); return 1; }
      if (!strstr(sh_last_error(), "safetensors: ")) { fprintf(stderr, "iteration %lld: message without the prefix: %s\n", it, sh_last_error()); return 1; }
    } else {
      opened++;
      /* The invariants of a valid file, checked independently of the reader's own checks. */
      int64_t data_off = sh_st_data_offset(f), total = 0;
      uint64_t stored = 0;
      for (int i = 0; i < 8; i++) stored |= (uint64_t)file.p[i] << (8 * i);
      if ((uint64_t)data_off != 8 + stored || data_off > (int64_t)file.n) { fprintf(stderr, "iteration %lld: bad data offset\n", it); return 1; }
      int n = sh_st_count(f);
      for (int i = 0; i < n; i++) {
        const sh_st_tensor *t = sh_st_at(f, i);
        if (i && strcmp(sh_st_at(f, i - 1)->name, t->name) >= 0) { fprintf(stderr, "iteration %lld: names not sorted/unique\n", it); return 1; }
        if (sh_st_find(f, t->name) != i) { fprintf(stderr, "iteration %lld: find failed\n", it); return 1; }
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];   /* no overflow: validated */
        if (numel != t->numel || t->begin < 0 || t->end - t->begin != numel * t->elem_size || data_off + t->end > (int64_t)file.n) {
          fprintf(stderr, "iteration %lld: tensor '%s' breaks the size rules\n", it, t->name);
          return 1;
        }
        total += t->end - t->begin;
        /* whole tensor, exact bytes, into a buffer of exactly that size */
        size_t nb = (size_t)(t->end - t->begin);
        unsigned char *buf = malloc(nb ? nb : 1);
        if (sh_st_read_bytes(f, i, 0, t->numel, buf) || memcmp(buf, file.p + data_off + t->begin, nb)) {
          fprintf(stderr, "iteration %lld: tensor '%s' read wrong: %s\n", it, t->name, sh_last_error());
          return 1;
        }
        free(buf);
        /* a random sub-range, through the tensor path when shard has the dtype */
        int64_t first = t->numel ? (int64_t)below((size_t)t->numel + 1) : 0, count = (int64_t)below((size_t)(t->numel - first) + 1);
        unsigned char *part = malloc(count * t->elem_size + 1);
        if (t->dtype >= 0) {
          sh_storage st = { part, count * t->elem_size, 1, -1, 0, 1 };
          sh_tensor dst;
          memset(&dst, 0, sizeof dst);
          dst.storage = &st; dst.ndim = 1; dst.shape[0] = count; dst.stride[0] = 1; dst.dtype = t->dtype; dst.device = -1;
          rc = sh_st_read(f, i, first, count, &dst);
        } else {
          rc = sh_st_read_bytes(f, i, first, count, part);
        }
        if (rc || memcmp(part, file.p + data_off + t->begin + first * t->elem_size, count * t->elem_size)) {
          fprintf(stderr, "iteration %lld: tensor '%s' sub-range read wrong: %s\n", it, t->name, sh_last_error());
          return 1;
        }
        free(part);
        if (!sh_st_read_bytes(f, i, first, t->numel - first + 1, NULL) || !sh_st_read_bytes(f, i, -1, 1, NULL) ||
            !sh_st_read_bytes(f, i, INT64_MAX, INT64_MAX, NULL)) {
          fprintf(stderr, "iteration %lld: an out-of-range read was not refused\n", it);
          return 1;
        }
      }
      if (total != (int64_t)file.n - data_off) { fprintf(stderr, "iteration %lld: tensors do not tile the data\n", it); return 1; }
      for (int i = 0; i < sh_st_metadata_count(f); i++) {
        const char *k, *v;
        size_t kl, vl;
        sh_st_metadata_at(f, i, &k, &kl, &v, &vl);
        if (!k || !v || k[kl] || v[vl]) { fprintf(stderr, "iteration %lld: bad metadata entry\n", it); return 1; }
      }
      sh_st_close(f);
    }
    if (fz_live) { fprintf(stderr, "iteration %lld: %zu bytes leaked\n", it, fz_live); return 1; }
    if (fz_peak > 24 * file.n + 65536) {
      fprintf(stderr, "iteration %lld: %zu bytes allocated for a %zu-byte file\n", it, fz_peak, file.n);
      return 1;
    }
    if (fz_peak > max_peak) max_peak = fz_peak;
  }
  unlink(path);
  printf("fuzz_safetensors: %lld iterations, %lld files opened, %lld refused (%lld malformed, %lld I/O, %lld out of memory), "
         "largest file %zu bytes, peak allocation %zu bytes\n", iters, opened, refused, codes[SH_ERR_ARG], codes[SH_ERR_IO],
         codes[SH_ERR_OOM], max_file, max_peak);
  free(h.p);
  free(file.p);
  return 0;
}

int main(int argc, char **argv) {
  int as_test = argc < 2 || argv[1][0] < '0' || argv[1][0] > '9';   /* run.sh passes a case name or nothing */
  long long iters = as_test ? 20000 : atoll(argv[1]);
  uint64_t seed = !as_test && argc > 2 ? strtoull(argv[2], NULL, 10) : 0x5eed;
  int rc = fuzz(iters, seed);
  if (as_test) printf("C test_safetensors_fuzz: %d passed, %d failed\n", !rc, rc);
  return rc;
}
