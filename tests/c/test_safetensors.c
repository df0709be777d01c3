/* test_safetensors.c: the safetensors reader as a validator. One malformed file per rule,
 * each refused with its message (and never a crash); what a valid file reads back, byte for
 * byte, against the bytes written here by hand; range checks on reads; the writer's layout
 * (sorted keys, 8-byte padded header) and atomicity. The independent reference is the file
 * format itself: every file below is assembled byte by byte in this test. */
#include "check.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static const char *tmp_path(const char *name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

/* Writes an 8-byte length (hlen, or the header's length when hlen is -1), the header, and
 * body_len bytes 0, 1, 2, ... */
static const char *write_file(const char *name, const char *header, size_t header_len, int64_t hlen, int64_t body_len) {
  const char *path = tmp_path(name);
  FILE *f = fopen(path, "wb");
  uint64_t n = hlen == -1 ? header_len : (uint64_t)hlen;   /* -1: the header's own length */
  for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xff), f);
  fwrite(header, 1, header_len, f);
  for (int64_t i = 0; i < body_len; i++) fputc((int)(i & 0xff), f);
  fclose(f);
  return path;
}

static const char *write_st(const char *header, int64_t body_len) {
  return write_file("case.safetensors", header, strlen(header), -1, body_len);
}

/* Opening path must fail with code and a message holding every one of the substrings. */
static void refused(const char *path, int code, const char *want, const char *why) {
  sh_st_file *f = (sh_st_file *)0x1;
  sh_clear_error();
  int rc = sh_st_open(&f, path);
  CHECK(rc == code && f == NULL && strstr(sh_last_error(), want) && strstr(sh_last_error(), path),
        "%s: expected error %d naming the file and containing \"%s\", got %d \"%s\"", why, code, want, rc, sh_last_error());
  if (rc == 0) sh_st_close(f);
}

#define T(body) "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}" body "}"

static void test_rules(void) {
  static const struct { const char *why, *header; int64_t body; const char *want; } cases[] = {
    {"empty header", "", 0, "must be a JSON object starting with '{'"},
    {"not an object", "[1,2]", 0, "must be a JSON object starting with '{'"},
    {"leading space", " {}", 0, "must be a JSON object starting with '{'"},
    {"unterminated object", "{\"a\":", 0, "found the end of the header"},
    {"missing colon", "{\"a\" 1}", 0, "expected ':'"},
    {"trailing bytes after the object", "{} x", 0, "trailing bytes after the header object"},
    {"two objects", "{}{}", 0, "trailing bytes after the header object"},
    {"unterminated string", "{\"abc", 0, "unterminated string"},
    {"bad UTF-8", "{\"a\xff\":{}}", 0, "invalid UTF-8"},
    {"overlong UTF-8", "{\"a\xc0\x80\":{}}", 0, "invalid UTF-8"},
    {"encoded surrogate", "{\"a\xed\xa0\x80\":{}}", 0, "invalid UTF-8"},
    {"control character", "{\"a\tb\":{}}", 0, "control character in a string"},
    {"bad escape", "{\"a\\x\":{}}", 0, "invalid escape"},
    {"short \\u escape", "{\"a\\u12\":{}}", 0, "invalid escape"},
    {"lone high surrogate", "{\"a\\ud800\":{}}", 0, "unpaired surrogate"},
    {"lone low surrogate", "{\"a\\udc00\":{}}", 0, "unpaired surrogate"},
    {"NUL in a name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "NUL character"},
    {"tensor entry not an object", "{\"a\":[1]}", 0, "expected an object {dtype, shape, data_offsets}"},
    {"duplicate tensor", T(",\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}"), 16, "tensor 't': duplicate name"},
    {"duplicate __metadata__", T(",\"__metadata__\":{},\"__metadata__\":{}"), 8, "duplicate key '__metadata__'"},
    {"duplicate metadata key", T(",\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}"), 8, "__metadata__: duplicate key 'k'"},
    {"metadata not an object", T(",\"__metadata__\":[]"), 8, "__metadata__ must be an object of strings"},
    {"metadata value not a string", T(",\"__metadata__\":{\"k\":1}"), 8, "__metadata__ values must be strings"},
    {"metadata value an object", T(",\"__metadata__\":{\"k\":{}}"), 8, "__metadata__ values must be strings"},
    {"unknown dtype", "{\"t\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "tensor 't': unknown dtype 'F8_E4M3' (known: F64"},
    {"lower-case dtype", "{\"t\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'f32'"},
    {"dtype with a NUL", "{\"t\":{\"dtype\":\"F32\\u0000\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype"},
    {"dtype not a string", "{\"t\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype must be a string"},
    {"unknown field", "{\"t\":{\"dtype\":\"F32\",\"foo\":1}}", 8, "tensor 't': unknown field 'foo'"},
    {"duplicate field", "{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\"}}", 8, "tensor 't': duplicate field 'dtype'"},
    {"missing data_offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor 't': missing 'data_offsets'"},
    {"missing dtype", "{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 't': missing 'dtype'"},
    {"missing shape", "{\"t\":{}}", 0, "tensor 't': missing 'dtype'"},
    {"shape not an array", "{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "shape must be an array"},
    {"negative dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "tensor 't': shape dim -2 is negative"},
    {"fractional dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape dim 2.0 is not an integer"},
    {"exponent dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2e0],\"data_offsets\":[0,8]}}", 8, "shape dim 2e0 is not an integer"},
    {"leading zero", "{\"t\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", 8, "leading zero"},
    {"dim of 2^63", "{\"t\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,8]}}", 8, "is 2^63 or more"},
    {"dim not a number", "{\"t\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, "expected an integer"},
    {"product overflows", "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
     "tensor 't': shape [4294967296,4294967296] of F32 is 2^63 bytes or more"},
    {"bytes overflow", "{\"t\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}", 8, "is 2^63 bytes or more"},
    {"size differs from range", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
     "tensor 't': F32[2,3] is 24 bytes but data_offsets [0, 20] hold 20"},
    {"end before begin", "{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "data_offsets [8, 0] end before they begin"},
    {"huge negative offset (the issue's segfault)", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1099511627776,-1099511627768]}}", 8,
     "tensor 't': data_offsets begin -1099511627776 is negative"},
    {"small negative offset (the issue's memory leak)", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
     "data_offsets begin -8 is negative"},
    {"negative end", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8, "data_offsets end -8 is negative"},
    {"offset of 2^64", "{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[18446744073709551616,0]}}", 0, "is 2^63 or more"},
    {"offsets far past the data", "{\"t\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[9223372036854775799,9223372036854775807]}}", 8,
     "data_offsets [9223372036854775799, 9223372036854775807] run past the data section's 8 bytes"},
    {"offsets just past the data", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8, "run past the data section's 8 bytes"},
    {"one offset", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}}", 8, "exactly two integers"},
    {"three offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8, "exactly two integers"},
    {"a gap at the start", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
     "tensor 't': data_offsets [4, 8] leave bytes [0, 4) of the data section unused (a gap)"},
    {"a gap between", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", 5,
     "tensor 'b': data_offsets [3, 5] leave bytes [2, 3) of the data section unused (a gap)"},
    {"an overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6,
     "tensor 'b': data_offsets [2, 6] overlap tensor 'a', which ends at 4"},
    {"the same range twice", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
     "tensor 'b': data_offsets [0, 4] overlap tensor 'a'"},
    {"trailing data bytes", T(""), 12, "the tensors end at byte 8 of the data section but it has 12 bytes (trailing bytes)"},
    {"data for no tensors", "{}", 4, "the tensors end at byte 0 of the data section but it has 4 bytes"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    refused(write_st(cases[i].header, cases[i].body), SH_ERR_ARG, cases[i].want, cases[i].why);
}

static void test_file_level(void) {
  FILE *f = fopen(tmp_path("short.safetensors"), "wb");
  fwrite("\x02\0\0\0\0", 1, 5, f);
  fclose(f);
  refused(tmp_path("short.safetensors"), SH_ERR_ARG, "the file is 5 bytes, too short for the 8-byte header length", "short file");
  refused(write_file("big.safetensors", "{}", 2, 200000000, 0), SH_ERR_ARG, "header length 200000000 is above the limit of 100000000 bytes", "header limit");
  refused(write_file("huge.safetensors", "{}", 2, INT64_MAX, 0), SH_ERR_ARG, "is above the limit", "header length 2^63-1");
  refused(write_file("all1.safetensors", "{}", 2, -2, 0), SH_ERR_ARG, "header length 18446744073709551614 is above the limit", "header length 2^64-2");
  refused(write_file("past.safetensors", "{}", 2, 3, 0), SH_ERR_ARG, "header length 3 runs past the end of the 10-byte file", "header past the end");
  refused(tmp_path("does-not-exist.safetensors"), SH_ERR_IO, "cannot open", "missing file");
  refused(dir, SH_ERR_IO, "not a regular file", "a directory");
}

/* A valid file with every dtype and odd spacing reads back byte for byte. */
static void test_valid(void) {
  const char *header =
    "{ \"__metadata__\" : { \"format\" : \"pt\", \"z\\u0000\" : \"\\u00e9\\ud83d\\ude00\\n\" } ,\n"
    "  \"w\\u00e9ight\": {\"shape\": [2, 3], \"dtype\": \"F32\", \"data_offsets\": [8, 32]},\n"
    "  \"a\": {\"data_offsets\": [0, 8], \"dtype\": \"I64\", \"shape\": []},\n"
    "  \"empty\": {\"dtype\": \"BF16\", \"shape\": [0, 4], \"data_offsets\": [32, 32]},\n"
    "  \"i8\": {\"dtype\": \"I8\", \"shape\": [3], \"data_offsets\": [32, 35]},\n"
    "  \"h\": {\"dtype\": \"F16\", \"shape\": [1, 1], \"data_offsets\": [35, 37]}\n"
    "}     ";
  const char *path = write_st(header, 37);
  sh_st_file *f = NULL;
  CHECK_OK(sh_st_open(&f, path));
  if (!f) return;
  CHECK(sh_st_count(f) == 5, "count %d", sh_st_count(f));
  static const char *sorted[] = {"a", "empty", "h", "i8", "w\xc3\xa9ight"};
  for (int i = 0; i < 5; i++) {
    CHECK(!strcmp(sh_st_at(f, i)->name, sorted[i]), "name %d is %s", i, sh_st_at(f, i)->name);
    CHECK(sh_st_find(f, sorted[i]) == i, "find %s", sorted[i]);
  }
  CHECK(sh_st_find(f, "nope") == -1 && sh_st_at(f, 5) == NULL && sh_st_at(f, -1) == NULL, "absent names");
  const sh_st_tensor *w = sh_st_at(f, 4);
  CHECK(w->dtype == SH_F32 && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3 && w->numel == 6 && w->begin == 8 && w->end == 32,
        "weight info");
  const sh_st_tensor *i8 = sh_st_at(f, 3);
  CHECK(i8->dtype == -1 && !strcmp(i8->dtype_name, "I8") && i8->elem_size == 1, "I8 is valid but has no shard dtype");
  CHECK(sh_st_at(f, 0)->ndim == 0 && sh_st_at(f, 0)->numel == 1, "a scalar");
  CHECK(sh_st_at(f, 1)->numel == 0, "an empty tensor");
  CHECK(sh_st_metadata_count(f) == 2, "metadata count");
  const char *k, *v;
  size_t kl, vl;
  sh_st_metadata_at(f, 1, &k, &kl, &v, &vl);
  CHECK(kl == 2 && !memcmp(k, "z\0", 2) && vl == 7 && !memcmp(v, "\xc3\xa9\xf0\x9f\x98\x80\n", 7), "metadata with a NUL and escapes");
  int64_t data = sh_st_data_offset(f);
  CHECK(data == 8 + (int64_t)strlen(header), "data offset %lld", (long long)data);

  /* body byte i is i: elements [2, 5) of weight are bytes 8 + 8 .. 8 + 20 */
  unsigned char buf[64];
  memset(buf, 0xee, sizeof buf);
  CHECK_OK(sh_st_read_bytes(f, 4, 2, 3, buf));
  int same = 1;
  for (int i = 0; i < 12; i++) same &= buf[i] == 16 + i;
  CHECK(same && buf[12] == 0xee, "read bytes of elements [2, 5)");
  int64_t shape[1] = {3};
  sh_tensor *t = NULL;
  CHECK_OK(sh_tensor_empty(&t, 1, shape, SH_F32, -1));
  CHECK_OK(sh_st_read(f, 4, 3, 3, t));
  CHECK(!memcmp(sh_tensor_data(t), "\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", 12), "read into a tensor");
  CHECK_FAILS(sh_st_read(f, 4, 4, 3, t), SH_ERR_ARG, "tensor 'w\xc3\xa9ight': 3 elements from element 4 are outside its 6");
  CHECK_FAILS(sh_st_read(f, 4, -1, 3, t), SH_ERR_ARG, "outside its 6");
  CHECK_FAILS(sh_st_read_bytes(f, 4, 1, INT64_MAX, buf), SH_ERR_ARG, "outside its 6");
  CHECK_FAILS(sh_st_read_bytes(f, 4, INT64_MAX, 1, buf), SH_ERR_ARG, "outside its 6");
  CHECK_FAILS(sh_st_read(f, 4, 0, 2, t), SH_ERR_ARG, "needs a contiguous cpu f32 tensor of 2 elements, got f32[3] cpu");
  CHECK_FAILS(sh_st_read(f, 0, 0, 1, t), SH_ERR_ARG, "tensor 'a': reading 1 I64 elements needs a contiguous cpu i64 tensor");
  CHECK_FAILS(sh_st_read(f, 3, 0, 3, t), SH_ERR_ARG, "tensor 'i8': dtype I8 has no shard equivalent");
  CHECK_FAILS(sh_st_read(f, 7, 0, 3, t), SH_ERR_ARG, "no tensor number 7");
  sh_tensor_destroy(t);
  CHECK_OK(sh_st_read_bytes(f, 1, 0, 0, NULL));   /* empty tensor: nothing to read */

  /* The file shrinks after open: a read of the lost bytes is an I/O error, not garbage. */
  CHECK(truncate(path, data + 20) == 0, "truncate");
  CHECK_FAILS(sh_st_read_bytes(f, 4, 0, 6, buf), SH_ERR_IO, "the file is shorter than when it was opened");
  sh_st_close(f);
  sh_st_close(NULL);

  f = NULL;
  CHECK_OK(sh_st_open(&f, write_st("{}", 0)));   /* no tensors, no data: valid */
  CHECK(f && sh_st_count(f) == 0, "an empty file");
  sh_st_close(f);
}

static sh_tensor *filled(int ndim, const int64_t *shape, int dtype, int seed) {
  sh_tensor *t = NULL;
  CHECK_OK(sh_tensor_empty(&t, ndim, shape, dtype, -1));
  unsigned char *p = sh_tensor_data(t);
  int64_t n = sh_tensor_numel(t) * sh_dtype_size(dtype);
  for (int64_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + 7 * i);
  return t;
}

static void test_save(void) {
  int64_t s1[2] = {2, 3}, s2[1] = {5}, s0[1] = {0};
  sh_tensor *ts[3] = {filled(2, s1, SH_F32, 1), filled(1, s2, SH_BF16, 2), filled(1, s0, SH_U8, 3)};
  const char *names[3] = {"zeta", "alpha\"q", "mid"};
  const char *keys[2] = {"format", "note"}, *values[2] = {"pt", "tab\there"};
  const char *path = tmp_path("saved.safetensors");
  CHECK_OK(sh_st_save(path, 3, names, ts, 2, keys, values));
  FILE *fp = fopen(path, "rb");
  unsigned char bytes[1024];
  size_t n = fread(bytes, 1, sizeof bytes, fp);
  fclose(fp);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | bytes[i];
  const char *want =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"tab\\u0009here\"},"
    "\"alpha\\\"q\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[0,10]},"
    "\"mid\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[10,10]},"
    "\"zeta\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[10,34]}}";
  size_t wl = strlen(want);
  int pad_ok = hlen % 8 == 0 && hlen >= wl && hlen < wl + 8;
  for (size_t i = wl; i < hlen && pad_ok; i++) pad_ok = bytes[8 + i] == ' ';
  CHECK(pad_ok && !memcmp(bytes + 8, want, wl), "header: %.*s", (int)hlen, bytes + 8);
  CHECK(n == 8 + hlen + 34, "file size %zu", n);
  CHECK(!memcmp(bytes + 8 + hlen, sh_tensor_data(ts[1]), 10) && !memcmp(bytes + 8 + hlen + 10, sh_tensor_data(ts[0]), 24),
        "data in name order");

  sh_st_file *f = NULL;
  CHECK_OK(sh_st_open(&f, path));
  if (f) {
    CHECK(sh_st_count(f) == 3 && sh_st_metadata_count(f) == 2, "reopened");
    sh_st_close(f);
  }

  /* Refusals leave the previous file as it was and no temporary behind. */
  const char *dup[3] = {"a", "b", "a"};
  CHECK_FAILS(sh_st_save(path, 3, dup, ts, 0, NULL, NULL), SH_ERR_ARG, "tensor 'a': duplicate name");
  const char *reserved[1] = {"__metadata__"};
  CHECK_FAILS(sh_st_save(path, 1, reserved, ts, 0, NULL, NULL), SH_ERR_ARG, "reserved");
  const char *badutf[1] = {"a\xff"};
  CHECK_FAILS(sh_st_save(path, 1, badutf, ts, 0, NULL, NULL), SH_ERR_ARG, "not UTF-8");
  const char *dupkeys[2] = {"k", "k"};
  CHECK_FAILS(sh_st_save(path, 1, names, ts, 2, dupkeys, values), SH_ERR_ARG, "__metadata__: duplicate key 'k'");
  sh_tensor *tr = NULL;
  CHECK_OK(sh_view_transpose(&tr, ts[0], 0, 1));
  CHECK_FAILS(sh_st_save(path, 1, names, &tr, 0, NULL, NULL), SH_ERR_ARG, "save needs a contiguous cpu tensor, got f32[3,2]");
  sh_tensor_destroy(tr);
  fp = fopen(path, "rb");
  unsigned char again[1024];
  size_t n2 = fread(again, 1, sizeof again, fp);
  fclose(fp);
  CHECK(n2 == n && !memcmp(again, bytes, n), "a refused save leaves the file as it was");
  CHECK_FAILS(sh_st_save(tmp_path("no/such/dir/x.safetensors"), 3, names, ts, 0, NULL, NULL), SH_ERR_IO, "cannot create");
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp >/dev/null", dir);
  CHECK(system(cmd) != 0, "no temporary left in %s", dir);
  for (int i = 0; i < 3; i++) sh_tensor_destroy(ts[i]);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  snprintf(dir, sizeof dir, "/tmp/shard_st_test_XXXXXX");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  RUN(test_rules);
  RUN(test_file_level);
  RUN(test_valid);
  RUN(test_save);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) {}
  return check_summary("test_safetensors");
}
