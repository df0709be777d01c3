/* gemm_pack.c: the CPU GEMMs' per-thread packing scratch (gemm_pack_internal.h). */
#include "gemm_pack_internal.h"
#include <stdlib.h>

void *sh_gemm_scratch(size_t bytes) {
  static __thread void *buf;
  static __thread size_t cap;
  if (bytes <= cap) return buf;
  free(buf);
  cap = 0;
  buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (buf) cap = bytes;
  return buf;
}
