/* meta.h: the meta device, for dry runs (lua/shard/dryrun.lua: `shard estimate --dry-run`).
 * A meta tensor has a shape, a dtype and a storage that the caching allocator accounts like
 * any other (tags, peak, limit), but no bytes behind it: its address is one no process can
 * read, so a path that forgot the device faults at once instead of computing on garbage. Its
 * kernels compute nothing and count the work a real device would do: the floating-point
 * operations of the products (matmul, gemm, linear and its fusions, attention) and the bytes
 * each kernel's tensors span. A copy into a meta tensor moves nothing; a copy out of one
 * gives zeros, so a value read from a meta tensor (:item(), a loss) is 0. Lua names the
 * device "meta".
 *
 * The meta device has a host side, SH_DEVICE_META_HOST ("meta:host"), for CPU offload in a dry
 * run: what an offloaded FlatParameter keeps in pinned host memory on a GPU (its shard, sharded
 * grad and, following them, the AdamW state) lives there instead, accounted in a pool of its
 * own (sh_mem_stats_get(SH_DEVICE_META_HOST), by tag and peak like the device's), again with
 * no bytes behind it. Its kernels are the meta device's and count their bytes apart
 * (SH_META_HOST_BYTES: the CPU optimizer's traffic is not the device's); a copy between the
 * two sides moves nothing and counts SH_META_COPY_BYTES (what a GPU moves over PCIe). The
 * offload's copy stream and events are no-ops there (meta_internal.h). */
#pragma once
#include <stdint.h>

enum { SH_DEVICE_META = -2, SH_DEVICE_META_HOST = -3 };

typedef enum sh_meta_kind {
  SH_META_FLOPS_MATMUL = 0,     /* 2*M*N*K per product: matmul, gemm_, linear forward and backward */
  SH_META_FLOPS_ATTENTION = 1,  /* QK^T and PV over the whole T x T square: 4*B*H*T*T*D forward, 8x backward */
  SH_META_BYTES = 2,            /* bytes of every tensor a kernel reads or writes (a lower bound on traffic) */
  SH_META_KERNELS = 3,          /* kernel calls (both sides) */
  SH_META_HOST_BYTES = 4,       /* SH_META_BYTES of the kernels on the host side (any meta:host tensor) */
  SH_META_COPY_BYTES = 5,       /* bytes copied between the meta device and its host side */
  SH_META_N = 6
} sh_meta_kind;

int64_t sh_meta_count(int kind);      /* since the last reset; 0 for an unknown kind */
void sh_meta_reset_counts(void);
