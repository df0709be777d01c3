/* cub.cpp: the CUDA emulator's cub::DeviceRadixSort (tests/cuda_emu/include/cub/cub.cuh, where
 * the documented behaviour is listed). Test infrastructure only. */
#include <cub/cub.cuh>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include "emu_api.h"

namespace cub {
namespace emu_detail {

namespace {

size_t up256(size_t x) { return (x + 255) / 256 * 256; }

/* Temporary storage: the radix digits (8 bytes per item) and the permutation (8 bytes). */
size_t temp_needed(long long n) { return up256((size_t)n * 8) + up256((size_t)n * 8) + 256; }

uint64_t load_key(const unsigned char *p, size_t bytes) {
  uint64_t v = 0;
  memcpy(&v, p, bytes);   /* little-endian: the low bytes */
  return v;
}

/* The radix form: unsigned order equals the key order. */
uint64_t radix_form(uint64_t v, size_t bytes, int kind) {
  int bits = (int)bytes * 8;
  uint64_t sign = uint64_t(1) << (bits - 1), all = bits == 64 ? ~uint64_t(0) : ((uint64_t(1) << bits) - 1);
  if (kind == KEY_SIGNED) return v ^ sign;
  if (kind == KEY_FLOAT) {
    if (v == sign) v = 0;                            /* -0.0 sorts as +0.0 */
    return (v & sign) ? (~v & all) : (v | sign);
  }
  return v;
}

bool overlap(const void *a, size_t an, const void *b, size_t bn) {
  if (!a || !b || !an || !bn) return false;
  const char *x = (const char *)a, *y = (const char *)b;
  return x < y + bn && y < x + an;
}

struct sort_job {
  void *temp;
  size_t temp_bytes;
  const void *keys_in, *values_in;
  void *keys_out, *values_out;
  size_t kb, vb;
  int kind;
  long long n;
  int begin_bit, end_bit;
  bool descending;
  const char *what;
};

void run(const sort_job &j) {
  size_t n = (size_t)j.n;
  struct { const void *p; size_t bytes; const char *name; } bufs[] = {
      {j.keys_in, n * j.kb, "d_keys_in"}, {j.keys_out, n * j.kb, "d_keys_out"}, {j.values_in, n * j.vb, "d_values_in"},
      {j.values_out, n * j.vb, "d_values_out"}, {j.temp, j.temp_bytes, "d_temp_storage"}};
  for (auto &b : bufs)
    if (b.p && b.bytes && !emu::is_device_range(b.p, b.bytes)) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s [%p, +%zu bytes) is not device memory when the queued sort runs", b.name, b.p, b.bytes);
      emu::fail_async(cudaErrorIllegalAddress, msg);
      return;
    }
  uint64_t *digit = (uint64_t *)j.temp;
  uint64_t *perm = (uint64_t *)((char *)j.temp + up256(n * 8));
  int width = j.end_bit - j.begin_bit;
  uint64_t mask = width >= 64 ? ~uint64_t(0) : width <= 0 ? 0 : ((uint64_t(1) << width) - 1);
  const unsigned char *ki = (const unsigned char *)j.keys_in;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = radix_form(load_key(ki + i * j.kb, j.kb), j.kb, j.kind);
    digit[i] = width <= 0 ? 0 : (r >> j.begin_bit) & mask;
    if (j.descending) digit[i] = mask & ~digit[i];
    perm[i] = i;
  }
  std::stable_sort(perm, perm + n, [digit](uint64_t a, uint64_t b) { return digit[a] < digit[b]; });
  /* Gather through host copies: the outputs do not overlap the inputs (checked at the call). */
  unsigned char *ko = (unsigned char *)j.keys_out;
  for (size_t i = 0; i < n; i++) memcpy(ko + i * j.kb, ki + perm[i] * j.kb, j.kb);
  if (j.values_out) {
    const unsigned char *vi = (const unsigned char *)j.values_in;
    unsigned char *vo = (unsigned char *)j.values_out;
    for (size_t i = 0; i < n; i++) memcpy(vo + i * j.vb, vi + perm[i] * j.vb, j.vb);
  }
}

}  // namespace

cudaError_t radix_sort(void *d_temp_storage, size_t &temp_storage_bytes, const void *keys_in, void *keys_out, size_t key_bytes, int key_kind,
                       const void *values_in, void *values_out, size_t value_bytes, long long num_items, int begin_bit, int end_bit,
                       bool descending, cudaStream_t stream, const char *what) {
  if (num_items < 0) {
    fprintf(stderr, "%s: num_items %lld is negative\n", what, num_items);
    return cudaErrorInvalidValue;
  }
  size_t need = temp_needed(num_items);
  if (!d_temp_storage) {                     /* the size query: no work is done */
    temp_storage_bytes = need;
    return cudaSuccess;
  }
  if (temp_storage_bytes < need) {
    fprintf(stderr, "%s: temp_storage_bytes %zu is less than the %zu the size query returns\n", what, temp_storage_bytes, need);
    return cudaErrorInvalidValue;
  }
  if (begin_bit < 0 || end_bit > (int)(key_bytes * 8) || begin_bit > end_bit) {
    fprintf(stderr, "%s: bit range [%d, %d) is not within the %zu-bit key\n", what, begin_bit, end_bit, key_bytes * 8);
    return cudaErrorInvalidValue;
  }
  size_t n = (size_t)num_items;
  if (overlap(keys_in, n * key_bytes, keys_out, n * key_bytes) || overlap(values_in, n * value_bytes, values_out, n * value_bytes) ||
      overlap(keys_out, n * key_bytes, values_out, n * value_bytes) || overlap(d_temp_storage, need, keys_out, n * key_bytes) ||
      overlap(d_temp_storage, need, values_out, n * value_bytes)) {
    fprintf(stderr, "%s: input, output and temporary ranges overlap (CUB: they \"shall not overlap in any way\")\n", what);
    return cudaErrorInvalidValue;
  }
  if (values_out && !values_in) {
    fprintf(stderr, "%s: d_values_in is NULL\n", what);
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  auto j = std::make_shared<sort_job>(sort_job{d_temp_storage, temp_storage_bytes, keys_in, values_in, keys_out, values_out, key_bytes,
                                               value_bytes, key_kind, num_items, begin_bit, end_bit, descending, what});
  return emu::enqueue(stream, what, [j]() { run(*j); });
}

}  // namespace emu_detail
}  // namespace cub
