/* safetensors.c: the validating reader and the atomic writer (safetensors.h says the rules).
 * The header is parsed by a small strict JSON parser driven by the format's schema rather
 * than by a general JSON library: integers must be exact up to 2^63 - 1 (a double-based
 * parser rounds offsets above 2^53 and accepts 1.5 or 1e3), duplicate keys must be seen
 * (cJSON keeps both), and nothing nests deeper than two objects, so there is no recursion
 * and every allocation is bounded by the header's size, which is bounded by the file's. */
#define _GNU_SOURCE
#include "safetensors.h"
#include "core/dtype.h"
#include "core/status_internal.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The fuzz target counts allocations by defining these before including this file. */
#ifndef ST_MALLOC
#define ST_MALLOC malloc
#define ST_REALLOC realloc
#define ST_FREE free
#endif

#define ST_HEADER_LIMIT 100000000LL   /* the reference implementation's limit */
#define NAME_FMT "%.200s"              /* names and paths in messages are cut at 200 bytes */

static const struct { const char *name; int size; int dtype; } DTYPES[] = {
  {"F64", 8, SH_F64}, {"F32", 4, SH_F32}, {"F16", 2, SH_F16}, {"BF16", 2, SH_BF16},
  {"I64", 8, SH_I64}, {"I32", 4, SH_I32}, {"I16", 2, -1},     {"I8", 1, -1},
  {"U8", 1, SH_U8},   {"BOOL", 1, SH_BOOL},
};
#define N_DTYPES ((int)(sizeof DTYPES / sizeof DTYPES[0]))
#define KNOWN_DTYPES "F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL"

typedef struct meta_entry { char *key, *value; size_t key_len, value_len; } meta_entry;

struct sh_st_file {
  int fd;
  char *path;
  int64_t data_off, data_len;
  sh_st_tensor *t;     /* sorted by name once open */
  int n, cap;
  meta_entry *meta;    /* sorted by key once open */
  int nmeta, metacap;
};

/* ---------------------------------------------------------------- the parser */

typedef struct parser {
  const unsigned char *s;
  size_t n, pos;
  const char *path;
  int failed;
} parser;

static int syntax(parser *p, const char *what) {
  p->failed = 1;
  if (p->pos >= p->n)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": header: %s, found the end of the header", p->path, what);
  unsigned char c = p->s[p->pos];
  if (c >= 0x20 && c < 0x7f)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": header byte %zu: %s, found '%c'", p->path, p->pos, what, c);
  return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": header byte %zu: %s, found byte 0x%02x", p->path, p->pos, what, c);
}

static void skip_ws(parser *p) {
  while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
    p->pos++;
}

/* Skips whitespace, then consumes c if it is next; returns whether it was. */
static int accept(parser *p, char c) {
  skip_ws(p);
  if (p->pos < p->n && p->s[p->pos] == (unsigned char)c) { p->pos++; return 1; }
  return 0;
}

static int expect(parser *p, char c, const char *what) {
  if (accept(p, c)) return 0;
  return syntax(p, what);
}

static int hex4(const unsigned char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  *out = v;
  return 0;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid (overlong forms,
 * surrogates and code points above U+10FFFF are invalid). */
static int utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  int len; unsigned cp;
  if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
  else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
  else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
  else return 0;
  if ((size_t)len > n) return 0;
  for (int i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return len;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* Parses a JSON string into a fresh NUL-terminated buffer (*out, *len). The decoded text is
 * never longer than the quoted one, so the buffer is sized by the input. */
static int parse_string(parser *p, char **out, size_t *len) {
  *out = NULL;
  if (!accept(p, '"')) return syntax(p, "expected a string");
  size_t start = p->pos, end = start;
  while (end < p->n && p->s[end] != '"') end += (p->s[end] == '\\' && end + 1 < p->n) ? 2 : 1;
  if (end >= p->n) { p->pos = p->n; return syntax(p, "unterminated string"); }
  char *o = ST_MALLOC(end - start + 1);
  if (!o) { p->failed = 1; return sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory parsing the header", p->path); }
  size_t k = 0;
  while (p->pos < end) {
    unsigned char c = p->s[p->pos];
    if (c < 0x20) { ST_FREE(o); return syntax(p, "control character in a string"); }
    if (c != '\\') {
      int l = utf8_len(p->s + p->pos, end - p->pos);
      if (!l) { ST_FREE(o); return syntax(p, "invalid UTF-8 in a string"); }
      memcpy(o + k, p->s + p->pos, l);
      k += l; p->pos += l;
      continue;
    }
    unsigned char e = p->s[p->pos + 1];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      static const char map[] = "\"\\/\b\f\n\r\t";
      o[k++] = map[simple - "\"\\/bfnrt"];
      p->pos += 2;
      continue;
    }
    unsigned cp, lo;
    if (e != 'u' || p->pos + 6 > end || hex4(p->s + p->pos + 2, &cp)) { ST_FREE(o); return syntax(p, "invalid escape in a string"); }
    p->pos += 6;
    if (cp >= 0xdc00 && cp <= 0xdfff) { p->pos -= 6; ST_FREE(o); return syntax(p, "unpaired surrogate escape in a string"); }
    if (cp >= 0xd800 && cp <= 0xdbff) {
      if (p->pos + 6 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' || hex4(p->s + p->pos + 2, &lo) ||
          lo < 0xdc00 || lo > 0xdfff) {
        p->pos -= 6; ST_FREE(o); return syntax(p, "unpaired surrogate escape in a string");
      }
      p->pos += 6;
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    k += put_utf8(o + k, cp);
  }
  p->pos = end + 1;
  o[k] = 0;
  *out = o;
  *len = k;
  return 0;
}

/* A non-negative integer below 2^63, in strict JSON number syntax; *what names it for errors. */
static int parse_int(parser *p, int64_t *out, const char *ctx, const char *name) {
  skip_ws(p);
  size_t start = p->pos, i = start;
  const unsigned char *s = p->s;
  int neg = i < p->n && s[i] == '-';
  if (neg) i++;
  if (i >= p->n || s[i] < '0' || s[i] > '9') return syntax(p, "expected an integer");
  if (s[i] == '0' && i + 1 < p->n && s[i + 1] >= '0' && s[i + 1] <= '9') { p->pos = i + 1; return syntax(p, "leading zero in a number"); }
  uint64_t v = 0;
  int overflow = 0;
  for (; i < p->n && s[i] >= '0' && s[i] <= '9'; i++) {
    if (v > (UINT64_C(0x7fffffffffffffff) - (s[i] - '0')) / 10) overflow = 1;
    else v = v * 10 + (s[i] - '0');
  }
  int frac = i < p->n && (s[i] == '.' || s[i] == 'e' || s[i] == 'E');
  const char *why = frac ? "is not an integer" : neg ? "is negative" : overflow ? "is 2^63 or more" : NULL;
  if (why) {
    size_t e = i;
    while (e < p->n && e - start < 40 && strchr("0123456789+-.eE", s[e]) && s[e]) e++;
    p->failed = 1;
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': %s %.*s %s", p->path, name, ctx,
                   (int)(e - start), (const char *)s + start, why);
  }
  p->pos = i;
  *out = (int64_t)v;
  return 0;
}

/* ---------------------------------------------------------------- the header */

static void free_tensor(sh_st_tensor *t) {
  ST_FREE((void *)t->name);
  ST_FREE((void *)t->shape);
}

static void file_free(sh_st_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  for (int i = 0; i < f->n; i++) free_tensor(&f->t[i]);
  for (int i = 0; i < f->nmeta; i++) { ST_FREE(f->meta[i].key); ST_FREE(f->meta[i].value); }
  ST_FREE(f->t);
  ST_FREE(f->meta);
  ST_FREE(f->path);
  ST_FREE(f);
}

static int oom(parser *p) {
  p->failed = 1;
  return sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory parsing the header", p->path);
}

static int grow(void **buf, int *cap, int n, size_t elem) {
  if (n < *cap) return 0;
  int nc = *cap ? *cap * 2 : 16;
  void *b = ST_REALLOC(*buf, (size_t)nc * elem);
  if (!b) return -1;
  *buf = b;
  *cap = nc;
  return 0;
}

static int parse_metadata(parser *p, sh_st_file *f) {
  if (!accept(p, '{')) return syntax(p, "__metadata__ must be an object of strings");
  if (accept(p, '}')) return 0;
  do {
    char *k, *v;
    size_t kl, vl;
    SH_TRY(parse_string(p, &k, &kl));
    if (expect(p, ':', "expected ':'")) { ST_FREE(k); return SH_ERR_ARG; }
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] != '"') {
      ST_FREE(k);
      return syntax(p, "__metadata__ values must be strings");
    }
    if (parse_string(p, &v, &vl)) { ST_FREE(k); return SH_ERR_ARG; }
    if (grow((void **)&f->meta, &f->metacap, f->nmeta, sizeof *f->meta)) { ST_FREE(k); ST_FREE(v); return oom(p); }
    f->meta[f->nmeta++] = (meta_entry){ k, v, kl, vl };
  } while (accept(p, ','));
  return expect(p, '}', "expected ',' or '}' in __metadata__");
}

static int eq(const char *s, size_t len, const char *lit) { return len == strlen(lit) && !memcmp(s, lit, len); }

static int dtype_index(const char *s) {
  for (int i = 0; i < N_DTYPES; i++) if (!strcmp(s, DTYPES[i].name)) return i;
  return -1;
}

/* A tensor's "dtype": one of DTYPES' names. */
static int parse_dtype_field(parser *p, sh_st_tensor *t, const char *name) {
  char *d;
  size_t dl;
  skip_ws(p);
  if (p->pos < p->n && p->s[p->pos] != '"') return syntax(p, "dtype must be a string");
  SH_TRY(parse_string(p, &d, &dl));
  int di = strlen(d) == dl ? dtype_index(d) : -1;
  if (di < 0) {
    p->failed = 1;
    sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': unknown dtype '%.40s' (known: " KNOWN_DTYPES ")",
            p->path, name, d);
    ST_FREE(d);
    return SH_ERR_ARG;
  }
  ST_FREE(d);
  t->dtype_name = DTYPES[di].name;
  t->dtype = DTYPES[di].dtype;
  t->elem_size = DTYPES[di].size;
  return SH_OK;
}

/* A tensor's "shape": an array of integers (t->shape owns the array as soon as it exists). */
static int parse_shape_field(parser *p, sh_st_tensor *t, const char *name) {
  if (!accept(p, '[')) return syntax(p, "shape must be an array of integers");
  int cap = 0;
  int64_t *shape = NULL;
  int none = accept(p, ']');
  if (!none) do {
    int64_t d;
    if (grow((void **)&shape, &cap, t->ndim, sizeof *shape)) return oom(p);   /* t->shape frees it */
    t->shape = shape;
    SH_TRY(parse_int(p, &d, "shape dim", name));
    shape[t->ndim++] = d;
  } while (accept(p, ','));
  t->shape = shape;
  if (!none) SH_TRY(expect(p, ']', "expected ',' or ']' in shape"));
  return SH_OK;
}

/* A tensor's "data_offsets": exactly [begin, end]. */
static int parse_offsets_field(parser *p, sh_st_tensor *t, const char *name) {
  SH_TRY(expect(p, '[', "data_offsets must be an array [begin, end]"));
  SH_TRY(parse_int(p, &t->begin, "data_offsets begin", name));
  SH_TRY(expect(p, ',', "data_offsets must hold exactly two integers"));
  SH_TRY(parse_int(p, &t->end, "data_offsets end", name));
  return expect(p, ']', "data_offsets must hold exactly two integers");
}

/* The fields of one tensor entry, in any order, each exactly once. */
static int parse_tensor_fields(parser *p, sh_st_tensor *t, const char *name) {
  int have[4] = {0};   /* by field: 1 dtype, 2 shape, 3 data_offsets */
  int empty = accept(p, '}');
  if (!empty) do {
    char *key;
    size_t kl;
    SH_TRY(parse_string(p, &key, &kl));
    int which = eq(key, kl, "dtype") ? 1 : eq(key, kl, "shape") ? 2 : eq(key, kl, "data_offsets") ? 3 : 0;
    int dup = which && have[which];
    if (!which || dup) {
      p->failed = 1;
      sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': %s field '" NAME_FMT "'%s", p->path, name,
              dup ? "duplicate" : "unknown", key, dup ? "" : " (expected dtype, shape, data_offsets)");
      ST_FREE(key);
      return SH_ERR_ARG;
    }
    ST_FREE(key);
    SH_TRY(expect(p, ':', "expected ':'"));
    SH_TRY(which == 1 ? parse_dtype_field(p, t, name) : which == 2 ? parse_shape_field(p, t, name)
                                                       : parse_offsets_field(p, t, name));
    have[which] = 1;
  } while (accept(p, ','));
  if (!empty) SH_TRY(expect(p, '}', "expected ',' or '}' in a tensor entry"));
  if (!have[1] || !have[2] || !have[3]) {
    p->failed = 1;
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': missing '%s'", p->path, name,
                   !have[1] ? "dtype" : !have[2] ? "shape" : "data_offsets");
  }
  return SH_OK;
}

/* The shape as "d0,d1,..." for messages (",..." past what fits). */
static void dims_text(const sh_st_tensor *t, char *dims, size_t size) {
  int k = 0;
  for (int i = 0; i < t->ndim && k < (int)size - 24; i++)
    k += snprintf(dims + k, size - k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
  if (k >= (int)size - 24) snprintf(dims + k, size - k, ",...");
  else dims[k] = 0;
}

/* The entry's byte size against its data_offsets and the data section; sets t->numel. A zero
 * dim makes an empty tensor whatever the others are. */
static int check_tensor_bytes(parser *p, const sh_st_file *f, sh_st_tensor *t, const char *name) {
  int64_t numel = 1;
  int zero = 0, overflow = 0;
  for (int i = 0; i < t->ndim; i++) zero |= t->shape[i] == 0;
  for (int i = 0; i < t->ndim && !zero && !overflow; i++) overflow = __builtin_mul_overflow(numel, t->shape[i], &numel);
  int64_t nbytes = 0;
  if (zero) numel = 0;
  else if (!overflow) overflow = __builtin_mul_overflow(numel, (int64_t)t->elem_size, &nbytes);
  char dims[160];
  dims_text(t, dims, sizeof dims);
  p->failed = 1;
  if (overflow)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': shape [%s] of %s is 2^63 bytes or more",
                   p->path, name, dims, t->dtype_name);
  if (t->end < t->begin)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': data_offsets [%lld, %lld] end before they begin",
                   p->path, name, (long long)t->begin, (long long)t->end);
  if (t->end - t->begin != nbytes)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': %s[%s] is %lld bytes but data_offsets [%lld, %lld] "
                   "hold %lld", p->path, name, t->dtype_name, dims, (long long)nbytes, (long long)t->begin, (long long)t->end,
                   (long long)(t->end - t->begin));
  if (t->end > f->data_len)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': data_offsets [%lld, %lld] run past the data "
                   "section's %lld bytes", p->path, name, (long long)t->begin, (long long)t->end, (long long)f->data_len);
  p->failed = 0;
  t->numel = numel;
  return SH_OK;
}

/* One tensor entry: {"dtype": .., "shape": [..], "data_offsets": [begin, end]} in any order. */
static int parse_tensor(parser *p, sh_st_file *f, char *name, size_t name_len) {
  if (grow((void **)&f->t, &f->cap, f->n, sizeof *f->t)) { ST_FREE(name); return oom(p); }
  sh_st_tensor *t = &f->t[f->n++];
  memset(t, 0, sizeof *t);
  t->name = name;
  if (strlen(name) != name_len) return syntax(p, "a tensor name holds a NUL character");
  if (!accept(p, '{')) return syntax(p, "expected an object {dtype, shape, data_offsets} for a tensor");
  SH_TRY(parse_tensor_fields(p, t, name));
  return check_tensor_bytes(p, f, t, name);
}

static int parse_header(parser *p, sh_st_file *f) {
  if (p->n == 0 || p->s[0] != '{') { p->pos = 0; return syntax(p, "the header must be a JSON object starting with '{'"); }
  p->pos = 1;
  int have_meta = 0, empty = accept(p, '}');
  if (!empty) do {
    char *key;
    size_t kl;
    SH_TRY(parse_string(p, &key, &kl));
    if (expect(p, ':', "expected ':'")) { ST_FREE(key); return SH_ERR_ARG; }
    if (kl == 12 && !memcmp(key, "__metadata__", 12)) {
      ST_FREE(key);
      if (have_meta) { p->failed = 1; return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": duplicate key '__metadata__'", p->path); }
      have_meta = 1;
      SH_TRY(parse_metadata(p, f));
    } else {
      SH_TRY(parse_tensor(p, f, key, kl));
    }
  } while (accept(p, ','));
  if (!empty) SH_TRY(expect(p, '}', "expected ',' or '}' after a tensor entry"));
  skip_ws(p);
  if (p->pos != p->n) return syntax(p, "trailing bytes after the header object");
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const sh_st_tensor *)a)->name, ((const sh_st_tensor *)b)->name);
}

static int by_key(const void *a, const void *b) {
  const meta_entry *x = a, *y = b;
  size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
  int c = memcmp(x->key, y->key, n);
  return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static int by_offset(const void *a, const void *b) {
  const sh_st_tensor *x = *(const sh_st_tensor *const *)a, *y = *(const sh_st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Names unique, metadata keys unique, and the tensors' ranges tiling [0, data_len) exactly. */
static int check_layout(sh_st_file *f) {
  if (f->n > 1) qsort(f->t, f->n, sizeof *f->t, by_name);
  for (int i = 1; i < f->n; i++)
    if (!strcmp(f->t[i].name, f->t[i - 1].name))
      return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': duplicate name", f->path, f->t[i].name);
  if (f->nmeta > 1) qsort(f->meta, f->nmeta, sizeof *f->meta, by_key);
  for (int i = 1; i < f->nmeta; i++)
    if (!by_key(&f->meta[i], &f->meta[i - 1]))
      return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": __metadata__: duplicate key '%.*s'", f->path,
                     (int)(f->meta[i].key_len < 200 ? f->meta[i].key_len : 200), f->meta[i].key);
  const sh_st_tensor **order = ST_MALLOC((f->n ? f->n : 1) * sizeof *order);
  if (!order) return sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory checking the layout", f->path);
  for (int i = 0; i < f->n; i++) order[i] = &f->t[i];
  if (f->n > 1) qsort(order, f->n, sizeof *order, by_offset);
  int64_t at = 0;
  const char *prev = NULL;
  int rc = 0;
  for (int i = 0; i < f->n && !rc; i++) {
    const sh_st_tensor *t = order[i];
    if (t->begin > at)
      rc = sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': data_offsets [%lld, %lld] leave bytes [%lld, %lld) "
                   "of the data section unused (a gap)", f->path, t->name, (long long)t->begin, (long long)t->end,
                   (long long)at, (long long)t->begin);
    else if (t->begin < at)
      rc = sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': data_offsets [%lld, %lld] overlap tensor '"
                   NAME_FMT "', which ends at %lld", f->path, t->name, (long long)t->begin, (long long)t->end, prev,
                   (long long)at);
    at = t->end;
    prev = t->name;
  }
  ST_FREE(order);
  if (!rc && at != f->data_len)
    rc = sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": the tensors end at byte %lld of the data section but it has %lld bytes "
                 "(trailing bytes)", f->path, (long long)at, (long long)f->data_len);
  return rc;
}

/* ---------------------------------------------------------------- reading */

static int pread_all(int fd, void *buf, int64_t len, int64_t off) {
  char *b = buf;
  while (len > 0) {
    ssize_t r = pread(fd, b, len > (1 << 30) ? (1 << 30) : (size_t)len, off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -EIO - 100000;   /* the file shrank */
    b += r; off += r; len -= r;
  }
  return 0;
}

static int read_error(const char *path, int err) {
  if (err == -EIO - 100000)
    return sh_fail(SH_ERR_IO, "safetensors: " NAME_FMT ": the file is shorter than when it was opened", path);
  return sh_fail(SH_ERR_IO, "safetensors: " NAME_FMT ": read failed: %s", path, strerror(-err));
}

int sh_st_open(sh_st_file **out, const char *path) {
  if (!out || !path) return sh_fail(SH_ERR_ARG, "safetensors: open needs a path and an output");
  *out = NULL;
  sh_st_file *f = ST_MALLOC(sizeof *f);
  char *pathcopy = ST_MALLOC(strlen(path) + 1);
  if (!f || !pathcopy) { ST_FREE(f); ST_FREE(pathcopy); return sh_fail(SH_ERR_OOM, "safetensors: out of memory opening " NAME_FMT, path); }
  memset(f, 0, sizeof *f);
  f->path = strcpy(pathcopy, path);
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    int e = errno;
    file_free(f);
    return sh_fail(SH_ERR_IO, "safetensors: cannot open " NAME_FMT ": %s", path, strerror(e));
  }
  struct stat st;
  int rc = 0;
  unsigned char len8[8];
  char *header = NULL;
  if (fstat(f->fd, &st)) { rc = sh_fail(SH_ERR_IO, "safetensors: " NAME_FMT ": %s", path, strerror(errno)); goto done; }
  if (!S_ISREG(st.st_mode)) { rc = sh_fail(SH_ERR_IO, "safetensors: " NAME_FMT ": not a regular file", path); goto done; }
  int64_t size = st.st_size;
  if (size < 8) { rc = sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": the file is %lld bytes, too short for the 8-byte header length", path, (long long)size); goto done; }
  if ((rc = pread_all(f->fd, len8, 8, 0))) { rc = read_error(path, rc); goto done; }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  if (hlen > (uint64_t)ST_HEADER_LIMIT) {
    rc = sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": header length %llu is above the limit of %lld bytes", path,
                 (unsigned long long)hlen, ST_HEADER_LIMIT);
    goto done;
  }
  if ((int64_t)hlen > size - 8) {
    rc = sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": header length %llu runs past the end of the %lld-byte file", path,
                 (unsigned long long)hlen, (long long)size);
    goto done;
  }
  f->data_off = 8 + (int64_t)hlen;
  f->data_len = size - f->data_off;
  header = ST_MALLOC(hlen ? hlen : 1);
  if (!header) { rc = sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory for the %llu-byte header", path, (unsigned long long)hlen); goto done; }
  if ((rc = pread_all(f->fd, header, hlen, 8))) { rc = read_error(path, rc); goto done; }
  parser p = { (const unsigned char *)header, hlen, 0, f->path, 0 };
  if ((rc = parse_header(&p, f))) goto done;
  rc = check_layout(f);
done:
  ST_FREE(header);
  if (rc) { file_free(f); return rc; }
  *out = f;
  return 0;
}

void sh_st_close(sh_st_file *f) { file_free(f); }
int sh_st_count(const sh_st_file *f) { return f ? f->n : 0; }
const sh_st_tensor *sh_st_at(const sh_st_file *f, int i) { return f && i >= 0 && i < f->n ? &f->t[i] : NULL; }
int sh_st_metadata_count(const sh_st_file *f) { return f ? f->nmeta : 0; }
int64_t sh_st_data_offset(const sh_st_file *f) { return f ? f->data_off : 0; }

int sh_st_find(const sh_st_file *f, const char *name) {
  if (!f || !name) return -1;
  int lo = 0, hi = f->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(f->t[mid].name, name);
    if (!c) return mid;
    if (c < 0) lo = mid + 1; else hi = mid - 1;
  }
  return -1;
}

void sh_st_metadata_at(const sh_st_file *f, int i, const char **key, size_t *key_len, const char **value, size_t *value_len) {
  int ok = f && i >= 0 && i < f->nmeta;
  if (key) *key = ok ? f->meta[i].key : NULL;
  if (key_len) *key_len = ok ? f->meta[i].key_len : 0;
  if (value) *value = ok ? f->meta[i].value : NULL;
  if (value_len) *value_len = ok ? f->meta[i].value_len : 0;
}

static int check_range(const sh_st_file *f, int i, int64_t first, int64_t count) {
  if (!f) return sh_fail(SH_ERR_ARG, "safetensors: read from a closed file");
  if (i < 0 || i >= f->n) return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": no tensor number %d (%d tensors)", f->path, i, f->n);
  const sh_st_tensor *t = &f->t[i];
  if (first < 0 || count < 0 || first > t->numel || count > t->numel - first)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': %lld elements from element %lld are outside its %lld",
                   f->path, t->name, (long long)count, (long long)first, (long long)t->numel);
  return 0;
}

int sh_st_read_bytes(const sh_st_file *f, int i, int64_t first, int64_t count, void *dst) {
  SH_TRY(check_range(f, i, first, count));
  const sh_st_tensor *t = &f->t[i];
  if (count == 0) return 0;
  if (!dst) return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': no destination", f->path, t->name);
  int rc = pread_all(f->fd, dst, count * t->elem_size, f->data_off + t->begin + first * t->elem_size);
  if (rc) { read_error(f->path, rc); return sh_fail_context("tensor '" NAME_FMT "': ", t->name) ; }
  return 0;
}

int sh_st_read(const sh_st_file *f, int i, int64_t first, int64_t count, sh_tensor *dst) {
  SH_TRY(check_range(f, i, first, count));
  const sh_st_tensor *t = &f->t[i];
  SH_TRY(sh_tensor_check(dst, "safetensors read"));
  char want[64];
  sh_tensor_describe(dst, want, sizeof want);
  if (t->dtype < 0)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': dtype %s has no shard equivalent", f->path,
                   t->name, t->dtype_name);
  if (dst->device != -1 || dst->dtype != t->dtype || !sh_tensor_is_contiguous(dst) || sh_tensor_numel(dst) != count)
    return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': reading %lld %s elements needs a contiguous cpu "
                   "%s tensor of %lld elements, got %s", f->path, t->name, (long long)count, t->dtype_name,
                   sh_dtype_name(t->dtype), (long long)count, want);
  return sh_st_read_bytes(f, i, first, count, sh_tensor_data(dst));
}

/* ---------------------------------------------------------------- writing */

typedef struct buf { char *p; size_t n, cap; int oom; } buf;

static void put(buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->n + n + 1) nc *= 2;
    char *q = ST_REALLOC(b->p, nc);
    if (!q) { b->oom = 1; return; }
    b->p = q;
    b->cap = nc;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static void put_json_string(buf *b, const char *s) {
  put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; put(b, esc, 2); }
    else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); put(b, esc, 6); }
    else put(b, (const char *)&c, 1);
  }
  put(b, "\"", 1);
}

static int valid_utf8(const char *s) {
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    int l = utf8_len((const unsigned char *)s + i, n - i);
    if (!l) return 0;
    i += l;
  }
  return 1;
}

static const char *st_dtype_name(int dtype) {
  for (int i = 0; i < N_DTYPES; i++) if (DTYPES[i].dtype == dtype && dtype >= 0) return DTYPES[i].name;
  return NULL;
}

static int write_all(int fd, const void *data, int64_t len) {
  const char *b = data;
  while (len > 0) {
    ssize_t w = write(fd, b, len > (1 << 30) ? (1 << 30) : (size_t)len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    b += w; len -= w;
  }
  return 0;
}

typedef struct named { const char *name; const sh_tensor *t; int index; } named;
static int named_cmp(const void *a, const void *b) { return strcmp(((const named *)a)->name, ((const named *)b)->name); }
typedef struct kv { const char *k, *v; } kv;
static int kv_cmp(const void *a, const void *b) { return strcmp(((const kv *)a)->k, ((const kv *)b)->k); }

/* Checks every tensor (a valid unreserved name, a live contiguous cpu tensor of a storable
 * dtype) and sorts them by name into order, refusing a duplicate name. */
static int order_tensors(const char *path, int n, const char *const *names, sh_tensor *const *tensors, named *order) {
  for (int i = 0; i < n; i++) {
    const sh_tensor *t = tensors[i];
    const char *name = names[i];
    if (!name || !*name || !valid_utf8(name) || !strcmp(name, "__metadata__"))
      return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor name '" NAME_FMT "' is empty, not UTF-8 or reserved", path,
                     name ? name : "(null)");
    int rc = sh_tensor_check(t, "safetensors save");
    if (rc) { sh_fail_context("safetensors: " NAME_FMT ": tensor '" NAME_FMT "': ", path, name); return rc; }
    if (t->device != -1 || !sh_tensor_is_contiguous(t) || !st_dtype_name(t->dtype)) {
      char d[64];
      sh_tensor_describe(t, d, sizeof d);
      return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': save needs a contiguous cpu tensor, got %s", path, name, d);
    }
    order[i] = (named){ name, t, i };
  }
  qsort(order, n, sizeof *order, named_cmp);
  for (int i = 1; i < n; i++)
    if (!strcmp(order[i].name, order[i - 1].name))
      return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": tensor '" NAME_FMT "': duplicate name", path, order[i].name);
  return SH_OK;
}

/* Checks the metadata (UTF-8 keys and values) and sorts it by key into meta, refusing a
 * duplicate key. */
static int order_metadata(const char *path, int nmeta, const char *const *keys, const char *const *values, kv *meta) {
  for (int i = 0; i < nmeta; i++) {
    if (!keys[i] || !values[i] || !valid_utf8(keys[i]) || !valid_utf8(values[i]))
      return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": __metadata__ entry %d is missing or not UTF-8", path, i);
    meta[i] = (kv){ keys[i], values[i] };
  }
  qsort(meta, nmeta, sizeof *meta, kv_cmp);
  for (int i = 1; i < nmeta; i++)
    if (!strcmp(meta[i].k, meta[i - 1].k))
      return sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": __metadata__: duplicate key '" NAME_FMT "'", path, meta[i].k);
  return SH_OK;
}

/* The header's JSON: __metadata__ first, then each tensor by name with its data_offsets, its
 * data following the previous one's. */
static void put_header_json(buf *h, int n, const named *order, int nmeta, const kv *meta) {
  puts_(h, "{");
  if (nmeta) {
    puts_(h, "\"__metadata__\":{");
    for (int i = 0; i < nmeta; i++) {
      if (i) puts_(h, ",");
      put_json_string(h, meta[i].k);
      puts_(h, ":");
      put_json_string(h, meta[i].v);
    }
    puts_(h, "}");
  }
  int64_t offset = 0;
  for (int i = 0; i < n; i++) {
    const sh_tensor *t = order[i].t;
    char num[64];
    if (i || nmeta) puts_(h, ",");
    put_json_string(h, order[i].name);
    puts_(h, ":{\"dtype\":\"");
    puts_(h, st_dtype_name(t->dtype));
    puts_(h, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
      puts_(h, num);
    }
    int64_t nbytes = sh_tensor_numel(t) * sh_dtype_size(t->dtype);
    snprintf(num, sizeof num, "],\"data_offsets\":[%lld,%lld]}", (long long)offset, (long long)(offset + nbytes));
    puts_(h, num);
    offset += nbytes;
  }
  puts_(h, "}");
}

/* Checks the tensors and metadata and builds the file's first bytes into h: the 8-byte
 * length, then the header (__metadata__ first, the tensors by name, offsets in that order),
 * padded with spaces to a multiple of 8. order gets the tensors sorted by name: the order of
 * their data after the header. what names the file in messages. */
static int build_header(const char *what, int n, const char *const *names, sh_tensor *const *tensors,
                        int nmeta, const char *const *keys, const char *const *values, named *order, buf *h) {
  const char *path = what;
  kv *meta = ST_MALLOC((nmeta ? nmeta : 1) * sizeof *meta);
  if (!meta) return sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory", path);
  int rc = order_tensors(path, n, names, tensors, order);
  if (!rc) rc = order_metadata(path, nmeta, keys, values, meta);
  if (!rc) {
    put(h, "\0\0\0\0\0\0\0\0", 8);   /* the length, filled in below */
    put_header_json(h, n, order, nmeta, meta);
    while ((h->n - 8) % 8) puts_(h, " ");
    if (h->oom) rc = sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory for the header", path);
    else if (h->n - 8 > (size_t)ST_HEADER_LIMIT)
      rc = sh_fail(SH_ERR_ARG, "safetensors: " NAME_FMT ": the header would be %zu bytes, above the limit of %lld", path, h->n - 8, ST_HEADER_LIMIT);
    else
      for (int i = 0; i < 8; i++) h->p[i] = (char)(unsigned char)((uint64_t)(h->n - 8) >> (8 * i));
  }
  ST_FREE(meta);
  return rc;
}

int sh_st_header(const char *what, int n, const char *const *names, sh_tensor *const *tensors, int nmeta,
                 const char *const *keys, const char *const *values, char **out, int64_t *len, int32_t *data_order) {
  *out = NULL;
  *len = 0;
  if (!what || n < 0 || nmeta < 0 || (n && (!names || !tensors || !data_order)) || (nmeta && (!keys || !values)))
    return sh_fail(SH_ERR_ARG, "safetensors: header needs a name, names, tensors and an order array");
  named *order = ST_MALLOC((n ? n : 1) * sizeof *order);
  buf h = {0};
  if (!order) return sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory", what);
  int rc = build_header(what, n, names, tensors, nmeta, keys, values, order, &h);
  if (!rc) {
    for (int i = 0; i < n; i++) data_order[i] = order[i].index;
    *out = h.p;
    *len = (int64_t)h.n;
    h.p = NULL;
  }
  ST_FREE(h.p);
  ST_FREE(order);
  return rc;
}

void sh_st_free(void *p) { ST_FREE(p); }

/* Temporaries PATH.tmp.PID.N that a killed save left beside path: removed when process PID
 * is gone (a live one may be another process's save in progress). */
static void remove_stale_temporaries(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t dlen = slash ? (size_t)(slash - path) : 0, blen = strlen(base);
  char dir[4096], victim[4096];
  if (dlen + 1 >= sizeof dir) return;
  if (slash) { memcpy(dir, path, dlen ? dlen : 1); dir[dlen ? dlen : 1] = 0; } else strcpy(dir, ".");
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    long pid;
    int n;
    if (strncmp(e->d_name, base, blen) || sscanf(e->d_name + blen, ".tmp.%ld.%d", &pid, &n) != 2 || pid <= 0) continue;
    if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    if (snprintf(victim, sizeof victim, "%s/%s", dir, e->d_name) < (int)sizeof victim) unlink(victim);
  }
  closedir(d);
}

int sh_st_save(const char *path, int n, const char *const *names, sh_tensor *const *tensors,
               int nmeta, const char *const *keys, const char *const *values) {
  if (!path || n < 0 || nmeta < 0 || (n && (!names || !tensors)) || (nmeta && (!keys || !values)))
    return sh_fail(SH_ERR_ARG, "safetensors: save needs a path, names and tensors");
  named *order = ST_MALLOC((n ? n : 1) * sizeof *order);
  buf h = {0};
  char *tmp = NULL;
  int fd = -1, rc = 0;
  if (!order) { rc = sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory", path); goto done; }
  if ((rc = build_header(path, n, names, tensors, nmeta, keys, values, order, &h))) goto done;
  remove_stale_temporaries(path);

  /* A fresh temporary beside the target, so the rename stays within one file system. */
  size_t plen = strlen(path);
  tmp = ST_MALLOC(plen + 64);
  if (!tmp) { rc = sh_fail(SH_ERR_OOM, "safetensors: " NAME_FMT ": out of memory", path); goto done; }
  static int counter;
  for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
    snprintf(tmp, plen + 64, "%s.tmp.%ld.%d", path, (long)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) { rc = sh_fail(SH_ERR_IO, "safetensors: cannot create " NAME_FMT ": %s", tmp, strerror(errno)); ST_FREE(tmp); tmp = NULL; goto done; }
  int e = write_all(fd, h.p, h.n);
  for (int i = 0; i < n && !e; i++)
    e = write_all(fd, sh_tensor_data(order[i].t), sh_tensor_numel(order[i].t) * sh_dtype_size(order[i].t->dtype));
  if (!e && fsync(fd)) e = errno;
  if (close(fd) && !e) e = errno;
  fd = -1;
  if (!e && rename(tmp, path)) e = errno;
  if (e) { rc = sh_fail(SH_ERR_IO, "safetensors: cannot write " NAME_FMT ": %s", path, strerror(e)); goto done; }
  ST_FREE(tmp);
  tmp = NULL;
  /* Make the rename itself durable. */
  char *dir = ST_MALLOC(plen + 2);
  if (dir) {
    strcpy(dir, path);
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir ? 1 : 0] = 0; else strcpy(dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
    ST_FREE(dir);
  }
done:
  if (fd >= 0) close(fd);
  if (tmp) { unlink(tmp); ST_FREE(tmp); }
  ST_FREE(h.p);
  ST_FREE(order);
  return rc;
}
