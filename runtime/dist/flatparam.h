/* flatparam.h: the FlatParameter, a wrap unit's parameters sharded across a group.
 * The parameters are laid end to end in registration order (a tensor given twice, a tied
 * weight, is stored once), padded with zeros to a multiple of the group size N, and cut in
 * N equal shards of ceil(numel / N) elements; rank r keeps shard r in the master dtype.
 *
 * Life cycle (the Lua schedule drives it):
 *   create     copies each rank's slice into its shard and drops the parameters' storages:
 *              the parameter structs stay (Lua holds them) but are "resharded"
 *   unshard    casts the shard to the param dtype into this rank's slot of a full buffer
 *              and all-gathers in place (so bf16 halves the traffic), then re-points every
 *              parameter struct in place as a contiguous view of it (storage, offset,
 *              strides, dtype = param dtype); under no_shard the full buffer is the shard
 *              itself (same dtype) or a cast copy, and no collective runs
 *   reshard    drops the full buffer; the parameters have no storage again, and any use of
 *              them is an SH_ERR_FREED error, never a crash
 *   reduce_grad gathers each parameter's .grad into a flat buffer in the reduce dtype (zeros
 *              for frozen parameters, for parameters without a grad and for the padding),
 *              frees those grads, reduce-scatters it (all-reduce under no_shard), all-reduces
 *              the result across `replicate` when given (hybrid sharding), and accumulates it
 *              into the sharded grad (master dtype) or sets it after zero_grad
 * The _start/_wait pairs split unshard and reduce_grad so the schedule can prefetch; the
 * plain calls are start + wait. unshard_wait with nothing started is the plain unshard;
 * reduce_grad_wait with nothing started does nothing. With `replicate`, the all-reduce
 * across it runs inside reduce_grad_wait.
 *
 * On a CUDA device nothing here waits on the host (comm.h's device ordering): unshard_wait
 * makes the caller's stream wait for the gather on the device; reduce_grad_wait queues the
 * replica all-reduce and the accumulation into the sharded grad on the reduction's own
 * stream and frees the flat buffers in that stream's order, so the backward's stream never
 * waits for a reduction it just issued; grad_shard and zero_grad order the caller's stream
 * after the last reduction (the optimizer waits for the reductions it reads). On the CPU
 * the waits are host waits.
 *
 * Gather state (sh_flatparam_state; FSDP2's ShardedState), kept here and nowhere else:
 *   SH_FP_SHARDED    only the shard: the parameters have no storage
 *   SH_FP_GATHERING  unshard_start ran: the full buffer exists and its all-gather may be in
 *                    flight; the parameters still have no storage
 *   SH_FP_UNSHARDED  the parameters are views of the full buffer
 * unshard_start moves SHARDED -> GATHERING and does nothing in the other two; unshard_wait
 * moves either to UNSHARDED; reshard moves any state to SHARDED (finishing a gather that
 * nobody waited for).
 *
 * Memory tags: the shard and the full gathered buffer are SH_TAG_PARAM (the full buffer is
 * parameter memory while it lives), the sharded and flat grads SH_TAG_GRAD (MPI's staging
 * for bf16 reductions is SH_TAG_COMM). Under offload the shard and the sharded grad are
 * counted in the CPU's stats (pinned blocks), under the same tags.
 *
 * The parameter structs must outlive the FlatParameter (shard.flatparam keeps them).
 *
 * Parameters may come without storage (sh_tensor_release'd, shape only): their shard slice
 * starts at zero, for sharded init through sh_flatparam_shard_view / sh_flatparam_init_param. */
#pragma once
#include <stdint.h>
#include <stddef.h>

typedef struct sh_flatparam sh_flatparam;

typedef enum sh_fp_state { SH_FP_SHARDED = 0, SH_FP_GATHERING = 1, SH_FP_UNSHARDED = 2 } sh_fp_state;

typedef struct sh_flatparam_info {
  int64_t numel;          /* elements of the unique parameters */
  int64_t padded_numel;   /* numel rounded up to a multiple of the group size */
  int64_t shard_numel;    /* padded_numel / group size (padded_numel under no_shard) */
  int32_t n_params;       /* parameters given, repeats of a tied one included */
  int32_t n_unique;
  int32_t group_size;     /* the group the shards are spread over (1 under no_shard) */
  int32_t rank;           /* this rank's shard index */
  int32_t master_dtype, param_dtype, reduce_dtype;
  int32_t no_shard;
  int32_t state;          /* sh_fp_state */
  int32_t has_grad;       /* 1 when the sharded grad holds a value */
  int32_t device;
  int32_t offload;        /* 1: shard and sharded grad live in pinned host memory */
} sh_flatparam_info;

/* Where parameter i (0-based, in the order given) lives, and the part of it rank `rank`
 * (-1: this rank) owns: elements [own_start, own_start + own_numel) of the flattened
 * parameter, at shard_offset in that rank's shard. */
typedef struct sh_flatparam_slot {
  int64_t offset;         /* in the flat buffer */
  int64_t numel;
  int64_t own_start, own_numel, shard_offset;
  int32_t tied_to;        /* index of the first occurrence of this tensor, or -1 */
  int32_t frozen;         /* requires_grad was 0 */
} sh_flatparam_slot;

/* The padding rule, the one place it is written (shard estimate calls it too): the flat
 * buffer of numel elements spread over group_size ranks (1 under no_shard) has numel rounded
 * up to a multiple of group_size; each shard is that over group_size. -1 when numel < 0 or
 * group_size < 1. */
int64_t sh_flatparam_padded_numel(int64_t numel, int group_size);

/* params: n tensors in registration order, all on one device, floating point. group: the
 * shard group (all-reduce group under no_shard); NULL is a group of one. dtypes -1: master =
 * first parameter's dtype, param = master, reduce = param. align (>= 1): the shard is a
 * multiple of align elements (the flat buffer padded to a multiple of group size x align;
 * FSDP's deterministic mode aligns to its norm blocks, so no block straddles two shards).
 * A parameter already held by another live FlatParameter is an error (a tied weight split
 * across units). */
int sh_flatparam_create(sh_flatparam **out, sh_tensor *const *params, int n, struct sh_comm *group,
                        int master_dtype, int param_dtype, int reduce_dtype, int no_shard, int align);
/* Frees the shard, grads and buffers without touching the parameter structs (reshard
 * first to leave them without storage). */
void sh_flatparam_destroy(sh_flatparam *fp);

int sh_flatparam_get_info(const sh_flatparam *fp, sh_flatparam_info *out);
/* The gather state (sh_fp_state); -1 for a NULL FlatParameter. */
int sh_flatparam_state(const sh_flatparam *fp);
int sh_flatparam_get_slot(const sh_flatparam *fp, int i, int rank, sh_flatparam_slot *out);

int sh_flatparam_unshard(sh_flatparam *fp);
int sh_flatparam_unshard_start(sh_flatparam *fp);
int sh_flatparam_unshard_wait(sh_flatparam *fp);
int sh_flatparam_reshard(sh_flatparam *fp);

/* Before a backward: allocates the zeroed flat grad buffer and makes each trainable
 * parameter's .grad a view of its segment, so backward accumulates in place and reduce_grad
 * needs no gather copy. Needs the unit unsharded; a no-op when the reduce dtype differs from
 * the param dtype (grads then come in the compute dtype and are cast while flattening). */
int sh_flatparam_prepare_grads(sh_flatparam *fp);

/* op: SH_RED_SUM or SH_RED_AVG; replicate may be NULL. */
int sh_flatparam_reduce_grad(sh_flatparam *fp, int op, struct sh_comm *replicate);
int sh_flatparam_reduce_grad_start(sh_flatparam *fp, int op, struct sh_comm *replicate);
int sh_flatparam_reduce_grad_wait(sh_flatparam *fp);
/* The deterministic reduction's two ends (lua/shard/fsdp/determ.lua): take_grad lays the
 * parameters' grads into the flat buffer as reduce_grad does (zeros for padding, frozen and
 * absent grads), frees them and hands the caller that buffer (reduce dtype, padded numel)
 * with no collective; add_grad lands a reduced shard (shard numel, reduce dtype, the
 * FlatParameter's device; the caller keeps it) in the sharded grad as reduce_grad_wait does:
 * set after zero_grad, else added. */
int sh_flatparam_take_grad(sh_tensor **out, sh_flatparam *fp);
int sh_flatparam_add_grad(sh_flatparam *fp, const sh_tensor *shard);
/* The sharded grad's sum of squares per block of `block` elements (which must divide the
 * shard) into out, a contiguous f64 CPU tensor of shard numel / block elements (zeros without
 * a grad): each block summed in f64 in one fixed order of its own elements, so a block's sum
 * is the same bits whatever the world size and the thread count. An f32 grad (a CUDA one is
 * summed from a host copy). */
int sh_flatparam_grad_block_sumsq(sh_flatparam *fp, int64_t block, sh_tensor *out);
/* Forgets the sharded grad (the next reduce_grad sets it instead of adding); with free_it
 * the buffer is released too. */
int sh_flatparam_zero_grad(sh_flatparam *fp, int free_it);
/* Drops the unsharded grads that backwards left on the parameters without reducing them
 * (gradient accumulation with sync off) and their flat buffer. An error while a reduce_grad
 * is in flight. */
int sh_flatparam_drop_local_grads(sh_flatparam *fp);

/* Aliases of the local shards for the optimizer (in-place updates reach the FlatParameter):
 * the parameter shard (master dtype, 1-D, shard_numel) and the sharded grad (*out = NULL
 * when there is none). Ask again after zero_grad with free_it. */
int sh_flatparam_shard(sh_tensor **out, sh_flatparam *fp);
int sh_flatparam_grad_shard(sh_tensor **out, sh_flatparam *fp);
/* Buffers in flight across every FlatParameter of the process: full gathered buffers alive
 * (a gather started and not resharded) and flat grad buffers alive (prepared or reducing),
 * with their peaks since the last reset. The schedule bounds both (shard.fsdp's prefetch and
 * reduces_in_flight), which keeps the memory peak the same every step. */
typedef struct sh_fp_stats { int32_t gathers, gathers_peak, reduces, reduces_peak; } sh_fp_stats;
void sh_flatparam_stats(sh_fp_stats *out);
void sh_flatparam_reset_peaks(void);

/* CPU offload (FSDP1's CPUOffload(offload_params=True)): moves the shard into pinned host
 * memory, where the sharded grad will live too, so the optimizer steps on the CPU. Call it
 * while the FlatParameter is sharded and holds no grad (after create). From then on:
 *   unshard_start  copies the shard into this rank's slot of the full buffer on the device's
 *                  host-copy stream, then all-gathers from that stream, so the gather waits
 *                  only for its own copy; unshard_wait orders the caller's stream after them.
 *                  Under mixed precision what is copied is a pinned host copy in the param
 *                  dtype, cast on the host when the shard may have changed (once a step:
 *                  after the optimizer), so the device never holds an f32 shard and the
 *                  copy moves half the bytes
 *   reduce_grad    after the reduction (on its stream) casts the reduced shard to the master
 *                  dtype on the device and copies it into the host grad (a second reduction
 *                  before the grad was read lands in a host buffer and is added on the host)
 *   grad_shard     the host waits for this FlatParameter's last grad copy, which is ordered
 *                  after its last shard copy: the one host wait per unit that a CPU optimizer
 *                  needs; then the host shard and grad may be read and written (shard and
 *                  shard_view, writable aliases, mark the param-dtype copy stale too)
 *   zero_grad      keeps the pinned grad buffer (freeing it would pin a new one next step)
 * A FlatParameter on the CPU has nothing to move: the call does nothing (info.offload stays
 * 0). One on the meta device (a dry run) moves to the meta device's host side (meta.h), which
 * accounts what a GPU would pin, through the same calls (its copy stream and marks do nothing
 * and are always reached). no_shard refuses it (its parameters are the full model on every rank: offloading them
 * copies the whole model to the device twice a step); on/off: 0 on an offloaded one refuses. */
int sh_flatparam_set_offload(sh_flatparam *fp, int on);

/* A 1-D view of the part of parameter i this rank owns (own_numel elements of the shard). */
int sh_flatparam_shard_view(sh_tensor **out, sh_flatparam *fp, int i);
/* Copies this rank's part of a full-size value of parameter i (same numel) into the shard. */
int sh_flatparam_init_param(sh_flatparam *fp, int i, const sh_tensor *value);
