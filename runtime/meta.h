/* meta.h: the meta device, for dry runs (lua/shard/dryrun.lua: `shard estimate --dry-run`).
 * A meta tensor has a shape, a dtype and a storage that the caching allocator accounts like
 * any other (tags, peak, limit), but no bytes behind it: its address is one no process can
 * read, so a path that forgot the device faults at once instead of computing on garbage. Its
 * kernels compute nothing and count the work a real device would do: the floating-point
 * operations of the products (matmul, gemm, linear and its fusions, attention) and the bytes
 * each kernel's tensors span. A copy into a meta tensor moves nothing; a copy out of one
 * gives zeros, so a value read from a meta tensor (:item(), a loss) is 0. Lua names the
 * device "meta". */
#pragma once
#include <stdint.h>

enum { SH_DEVICE_META = -2 };

typedef enum sh_meta_kind {
  SH_META_FLOPS_MATMUL = 0,     /* 2*M*N*K per product: matmul, gemm_, linear forward and backward */
  SH_META_FLOPS_ATTENTION = 1,  /* QK^T and PV over the whole T x T square: 4*B*H*T*T*D forward, 8x backward */
  SH_META_BYTES = 2,            /* bytes of every tensor a kernel reads or writes (a lower bound on traffic) */
  SH_META_KERNELS = 3,          /* kernel calls */
  SH_META_N = 4
} sh_meta_kind;

int64_t sh_meta_count(int kind);      /* since the last reset; 0 for an unknown kind */
void sh_meta_reset_counts(void);
