/* meta.c: the meta device's counters and addresses (core/meta_internal.h); its kernels, which
 * only count, are ops/meta_backend.c's. */
#include <stdint.h>
#include "meta_internal.h"

static int64_t counts[SH_META_N];

int64_t sh_meta_count(int kind) {
  if (kind < 0 || kind >= SH_META_N) return 0;
  return __atomic_load_n(&counts[kind], __ATOMIC_RELAXED);
}

void sh_meta_reset_counts(void) {
  for (int k = 0; k < SH_META_N; k++) __atomic_store_n(&counts[k], 0, __ATOMIC_RELAXED);
}

void sh_meta_add(int kind, int64_t n) { __atomic_add_fetch(&counts[kind], n, __ATOMIC_RELAXED); }

void *sh_meta_address(size_t nbytes) {
  static uintptr_t next = (uintptr_t)1 << 63;
  void *p = (void *)next;
  next += (nbytes + 63) / 64 * 64 + 64;     /* a gap, so no two blocks share an address */
  return p;
}
