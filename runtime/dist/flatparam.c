/* flatparam.c: the FlatParameter (see flatparam.h). The parameter structs belong to Lua;
 * this file only swaps what they point at: a view of the full buffer while unsharded, no
 * storage while sharded. Their .grad is kept across those swaps until reduce_grad takes it. */
#include "core/tensor_internal.h"
#include "core/alloc_internal.h"
#include "ops/meta_backend_internal.h"
#include "core/bf16_internal.h"
#include "comm.h"
#include "flatparam.h"
#include "ops/ops.h"
#include "core/parallel.h"
#include <stdlib.h>
#include <string.h>

typedef struct fp_slot {
  sh_tensor *p;                 /* Lua's parameter struct (not owned) */
  int64_t offset, numel;        /* in the flat buffer */
  int tied_to;                  /* first occurrence of the same tensor, or -1 */
  int frozen;
} fp_slot;

struct sh_flatparam {
  int n, n_unique;
  fp_slot *slots;
  int64_t numel, padded, shard_numel;
  sh_comm *group;               /* shard group (all-reduce group under no_shard); may be NULL */
  int group_size, rank, no_shard;
  int master, pdt, rdt, device;
  sh_tensor *shard;             /* master dtype, shard_numel (PARAM) */
  sh_tensor *grad;              /* master dtype, shard_numel (GRAD); valid when has_grad */
  int has_grad;
  sh_fp_state state;            /* see flatparam.h */
  sh_tensor *full;              /* param dtype, padded (PARAM) unless SH_FP_SHARDED */
  sh_comm_work *gather;         /* the all-gather in flight (SH_FP_GATHERING only) */
  sh_tensor *flat_grad;         /* reduce dtype, padded (GRAD) while a reduce is in flight */
  sh_tensor *red_out;           /* its reduced shard (or flat_grad itself) */
  sh_comm_work *reduce;
  sh_comm_work *grad_ready;     /* the last reduction that wrote grad: readers order after it */
  sh_comm *replicate;
  int red_op;
  /* CPU offload (flatparam.h): shard and grad are pinned host tensors */
  int offload;
  void *h2d_mark, *d2h_mark;    /* the last shard copy to the device, the last grad copy back */
  int h2d_newer;                /* a shard copy was queued after the last grad copy */
  int grad_pending;             /* grad copy in flight: 1 into grad, 2 into grad_stage (to add) */
  sh_tensor *grad_stage;        /* pinned, master dtype: a second grad before the first was read */
  sh_tensor *cast;              /* pinned, param dtype: what the device gets (param != master) */
  int cast_stale;               /* the shard may have changed since `cast` was made */
  sh_flatparam *next;           /* the list of live FlatParameters */
};

static sh_flatparam *g_live;    /* live FlatParameters: a parameter may belong to one only */
static sh_fp_stats g_stats;     /* buffers in flight, for the schedule's limits */

static void count_gather(int delta) {
  g_stats.gathers += delta;
  if (g_stats.gathers > g_stats.gathers_peak) g_stats.gathers_peak = g_stats.gathers;
}

static void count_reduce(int delta) {
  g_stats.reduces += delta;
  if (g_stats.reduces > g_stats.reduces_peak) g_stats.reduces_peak = g_stats.reduces;
}

void sh_flatparam_stats(sh_fp_stats *out) { *out = g_stats; }
void sh_flatparam_reset_peaks(void) {
  g_stats.gathers_peak = g_stats.gathers;
  g_stats.reduces_peak = g_stats.reduces;
}

/* ---- small tensor helpers ---------------------------------------------------------------- */

static int new_tagged(sh_tensor **out, int64_t numel, int dtype, int device, int tag) {
  int old = sh_mem_set_tag(tag);
  int rc = sh_tensor_empty(out, 1, &numel, dtype, device);
  sh_mem_set_tag(old);
  return rc;
}

/* Drops a parameter's storage but keeps its grad (sh_tensor_release drops both). */
static void drop_storage(sh_tensor *p) {
  sh_tensor *g = p->grad;
  p->grad = NULL;
  sh_tensor_release(p);
  p->grad = g;
}

/* Makes p a contiguous view of `buf` at element offset `at`, in buf's dtype. */
static void point_into(sh_tensor *p, const sh_tensor *buf, int64_t at) {
  drop_storage(p);
  p->storage = buf->storage;
  p->storage->refcount++;
  p->offset = buf->offset + at;
  p->dtype = buf->dtype;
  p->device = buf->device;
  int64_t s = 1;
  for (int d = p->ndim - 1; d >= 0; d--) { p->stride[d] = s; s *= p->shape[d] > 0 ? p->shape[d] : 1; }
  p->version++;
}

/* dst (1-D view) = elements [start, start + n) of t flattened in row-major order. */
static int copy_flat_range(sh_tensor *dst, const sh_tensor *t, int64_t start, int64_t n) {
  if (n == 0) return SH_OK;
  sh_tensor *c = NULL, *flat = NULL, *part = NULL;
  int64_t numel = sh_tensor_numel(t);
  int rc = sh_tensor_contiguous(&c, t);
  if (!rc) rc = sh_view_reshape(&flat, c, 1, &numel);
  if (!rc) rc = sh_view_narrow(&part, flat, 0, start, n);
  if (!rc) rc = sh_tensor_copy_(dst, part);
  sh_tensor_destroy(part);
  sh_tensor_destroy(flat);
  sh_tensor_destroy(c);
  return rc;
}

typedef struct add_job { float *d; const void *s; } add_job;

static void add_f32(void *arg, int64_t i0, int64_t i1) {
  const add_job *j = arg;
  const float *s = j->s;
  for (int64_t i = i0; i < i1; i++) j->d[i] += s[i];
}

static void add_bf16(void *arg, int64_t i0, int64_t i1) {
  const add_job *j = arg;
  const uint16_t *s = j->s;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) j->d[i] += sh_bf16_to_f32_inline(s[i]);
}

/* dst += src elementwise (same numel, contiguous, 1-D). */
static int accumulate(sh_tensor *dst, const sh_tensor *src) {
  if (dst->device != -1) return sh_axpy_(dst, 1.0, src);
  int64_t n = sh_tensor_numel(dst);
  void *d = sh_tensor_data(dst);
  const void *s = sh_tensor_data(src);
  add_job job = { d, s };
  if (dst->dtype == SH_F32 && src->dtype == SH_F32) { sh_parallel_for(n, n > 65536, add_f32, &job); return SH_OK; }
  if (dst->dtype == SH_F32 && src->dtype == SH_BF16) {   /* the f32 grad += a bf16 reduction */
    sh_parallel_for(n, n > 65536, add_bf16, &job);
    return SH_OK;
  }
  for (int64_t i = 0; i < n; i++) sh_store(d, dst->dtype, i, sh_load(d, dst->dtype, i) + sh_load(s, src->dtype, i));
  return SH_OK;
}

/* ---- creation ---------------------------------------------------------------------------- */

static int owner_of(const sh_tensor *p) {
  for (sh_flatparam *f = g_live; f; f = f->next)
    for (int i = 0; i < f->n; i++)
      if (f->slots[i].p == p) return 1;
  return 0;
}

static int check_params(sh_tensor *const *params, int n, int master) {
  if (!params || n <= 0) return sh_fail(SH_ERR_ARG, "flatparam: expected at least one parameter, got %d", n);
  for (int i = 0; i < n; i++) {
    const sh_tensor *p = params[i];
    if (!p) return sh_fail(SH_ERR_ARG, "flatparam: parameter %d is nil", i + 1);
    if (!sh_dtype_is_float(p->dtype))
      return sh_fail(SH_ERR_ARG, "flatparam: parameter %d is %s; parameters must be floating point", i + 1, sh_desc(p));
    if (p->device != params[0]->device)
      return sh_fail(SH_ERR_ARG, "flatparam: parameter %d is %s but parameter 1 is %s; one unit lives on one device",
                     i + 1, sh_desc(p), sh_desc(params[0]));
    if (owner_of(p))
      return sh_fail(SH_ERR_ARG, "flatparam: parameter %d (%s) already belongs to another FlatParameter; a tied "
                     "parameter must be wrapped in one unit with every module that uses it", i + 1, sh_desc(p));
    for (int j = 0; j < i; j++)
      if (params[j] != p && p->storage && params[j]->storage == p->storage)
        return sh_fail(SH_ERR_ARG, "flatparam: parameters %d and %d are different tensors sharing one storage; "
                       "tie parameters by passing the same tensor", j + 1, i + 1);
  }
  if (master != -1 && !sh_dtype_is_float(master))
    return sh_fail(SH_ERR_ARG, "flatparam: master dtype %s is not a float dtype", sh_dtype_name(master));
  return SH_OK;
}

static int fill_shard(sh_flatparam *fp) {
  SH_TRY(sh_tensor_fill_(fp->shard, 0));
  for (int i = 0; i < fp->n; i++) {
    if (fp->slots[i].tied_to >= 0 || !fp->slots[i].p->storage) continue;
    sh_tensor *view = NULL;
    SH_TRY(sh_flatparam_shard_view(&view, fp, i));
    sh_flatparam_slot s;
    sh_flatparam_get_slot(fp, i, -1, &s);
    int rc = copy_flat_range(view, fp->slots[i].p, s.own_start, s.own_numel);
    sh_tensor_destroy(view);
    if (rc) return sh_fail_context("flatparam: parameter %d: ", i + 1);
  }
  return SH_OK;
}

int64_t sh_flatparam_padded_numel(int64_t numel, int group_size) {
  if (numel < 0 || group_size < 1) return -1;
  int64_t g = group_size;
  return (numel + g - 1) / g * g;
}

int sh_flatparam_create(sh_flatparam **out, sh_tensor *const *params, int n, struct sh_comm *group,
                        int master, int pdt, int rdt, int no_shard, int align) {
  *out = NULL;
  if (align < 1) return sh_fail(SH_ERR_ARG, "flatparam: align %d; shards are a multiple of align >= 1 elements", align);
  SH_TRY(check_params(params, n, master));
  if (master == -1) master = params[0]->dtype;
  if (pdt == -1) pdt = master;
  if (rdt == -1) rdt = pdt;
  if (!sh_dtype_is_float(pdt) || !sh_dtype_is_float(rdt))
    return sh_fail(SH_ERR_ARG, "flatparam: param dtype %s and reduce dtype %s must be float dtypes",
                   sh_dtype_name(pdt), sh_dtype_name(rdt));
  sh_flatparam *fp = calloc(1, sizeof *fp);
  fp_slot *slots = calloc((size_t)n, sizeof *slots);
  if (!fp || !slots) { free(fp); free(slots); return sh_fail(SH_ERR_OOM, "flatparam: out of host memory"); }
  *fp = (sh_flatparam){ .n = n, .slots = slots, .group = group, .no_shard = no_shard != 0,
                        .master = master, .pdt = pdt, .rdt = rdt, .device = params[0]->device };
  fp->group_size = no_shard ? 1 : sh_comm_size(group);
  fp->rank = no_shard ? 0 : sh_comm_rank(group);
  for (int i = 0; i < n; i++) {
    fp_slot *s = &slots[i];
    s->p = params[i];
    s->tied_to = -1;
    for (int j = 0; j < i && s->tied_to < 0; j++)
      if (slots[j].p == s->p) s->tied_to = j;
    s->numel = sh_tensor_numel(s->p);
    s->frozen = !s->p->requires_grad;
    if (s->tied_to >= 0) { s->offset = slots[s->tied_to].offset; continue; }
    s->offset = fp->numel;
    fp->numel += s->numel;
    fp->n_unique++;
  }
  if (fp->numel == 0) { free(slots); free(fp); return sh_fail(SH_ERR_ARG, "flatparam: the %d parameters have no elements", n); }
  fp->padded = sh_flatparam_padded_numel(fp->numel, fp->group_size * align);
  fp->shard_numel = fp->padded / fp->group_size;
  int rc = new_tagged(&fp->shard, fp->shard_numel, master, fp->device, SH_TAG_PARAM);
  if (!rc) rc = fill_shard(fp);
  if (rc) { sh_tensor_destroy(fp->shard); free(slots); free(fp); return rc; }
  /* The full values now live in the shards; the parameters keep only their shapes. */
  for (int i = 0; i < n; i++) if (slots[i].tied_to < 0) sh_tensor_release(slots[i].p);
  fp->next = g_live;
  g_live = fp;
  *out = fp;
  return SH_OK;
}

/* ---- CPU offload (flatparam.h) ------------------------------------------------------------ */

/* The host side and its copies: pinned host memory and the CUDA backend's copy stream and
 * events; for a meta FlatParameter (a dry run) the meta device's host side and no-ops
 * (meta_internal.h), so the same code runs and the host memory is accounted. */
static const sh_mem_backend *offload_backend(const sh_flatparam *fp) {
  return fp->device == SH_DEVICE_META ? sh_meta_offload_backend() : sh_mem_cuda();
}

static int new_pinned(const sh_flatparam *fp, sh_tensor **out, int64_t numel, int dtype, int tag) {
  int old = sh_mem_set_pinned(1);
  int rc = new_tagged(out, numel, dtype, fp->device == SH_DEVICE_META ? SH_DEVICE_META_HOST : -1, tag);
  sh_mem_set_pinned(old);
  return rc;
}

int sh_flatparam_set_offload(sh_flatparam *fp, int on) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam offload: expected a FlatParameter, got nil");
  if (!on) {
    if (fp->offload) return sh_fail(SH_ERR_ARG, "flatparam offload: an offloaded FlatParameter cannot be brought back to the device");
    return SH_OK;
  }
  if (fp->offload || (fp->device < 0 && fp->device != SH_DEVICE_META)) return SH_OK;   /* done, or on the host already */
  if (fp->no_shard)
    return sh_fail(SH_ERR_ARG, "flatparam offload: no_shard keeps the full parameters on every rank; offload needs a "
                   "sharded FlatParameter (full_shard, shard_grad_op, hybrid)");
  if (fp->state != SH_FP_SHARDED || fp->has_grad || fp->red_out || fp->grad_ready)
    return sh_fail(SH_ERR_ARG, "flatparam offload: set it while the FlatParameter is sharded and holds no grad (state %d, grad %d)",
                   (int)fp->state, fp->has_grad);
  if (!offload_backend(fp)) return sh_fail(SH_ERR_DEVICE, "flatparam offload: cuda:%d has no CUDA backend", fp->device);
  sh_tensor *host = NULL, *cast = NULL;
  int rc = new_pinned(fp, &host, fp->shard_numel, fp->master, SH_TAG_PARAM);
  if (!rc) rc = sh_tensor_copy_(host, fp->shard);
  if (!rc && fp->pdt != fp->master) rc = new_pinned(fp, &cast, fp->shard_numel, fp->pdt, SH_TAG_PARAM);
  if (rc) { sh_tensor_destroy(host); sh_tensor_destroy(cast); return sh_fail_context("flatparam offload: "); }
  fp->cast = cast;
  fp->cast_stale = 1;
  sh_tensor_destroy(fp->shard);
  sh_tensor_destroy(fp->grad);
  fp->grad = NULL;
  fp->shard = host;
  fp->offload = 1;
  return SH_OK;
}

/* The shard's copy into this rank's slot of the full buffer, on the current (host-copy)
 * stream: straight in the master dtype, else from the host copy in the param dtype, cast
 * again when the shard may have changed since (before the host writes that copy, the copies
 * that read it must be done: after offload_settle they are; else the host waits). */
static int offload_copy_in(sh_flatparam *fp, sh_tensor *slot) {
  const sh_mem_backend *be = offload_backend(fp);
  if (!fp->cast) return be->copy_async(slot, fp->shard);
  if (fp->cast_stale) {
    if (fp->h2d_newer) {
      SH_TRY(be->mark_wait(fp->h2d_mark));
      fp->h2d_newer = 0;
    }
    SH_TRY(sh_tensor_copy_(fp->cast, fp->shard));
    fp->cast_stale = 0;
  }
  return be->copy_async(slot, fp->cast);
}

/* A writable alias of the shard went out: the host copy in the param dtype may be stale. */
static void offload_shard_out(sh_flatparam *fp) { fp->cast_stale = 1; }

/* unshard_start of an offloaded FlatParameter: the full buffer is taken, filled and gathered
 * with the host-copy stream current, so the allocator orders its reuse on that stream and
 * the gather waits for that stream only. */
static int offload_unshard_start(sh_flatparam *fp) {
  const sh_mem_backend *be = offload_backend(fp);
  void *saved = NULL;
  SH_TRY(be->copy_stream_enter(fp->device, &saved));
  int rc = new_tagged(&fp->full, fp->padded, fp->pdt, fp->device, SH_TAG_PARAM);
  sh_tensor *slot = NULL;
  if (!rc) {
    count_gather(1);
    rc = sh_view_narrow(&slot, fp->full, 0, fp->rank * fp->shard_numel, fp->shard_numel);
  }
  if (!rc) rc = offload_copy_in(fp, slot);
  if (!rc) rc = be->mark_record(fp->device, &fp->h2d_mark);
  if (!rc) fp->h2d_newer = 1;
  if (!rc && fp->group) rc = sh_comm_all_gather_into_async(&fp->gather, fp->group, fp->full, slot);
  sh_tensor_destroy(slot);
  int left = be->copy_stream_leave(fp->device, saved);
  return rc ? rc : left;
}

/* The caller's stream waits for the shard's copy (when no gather stands between them). */
static int offload_order_copy_in(sh_flatparam *fp) {
  if (!fp->offload || fp->gather) return SH_OK;
  return offload_backend(fp)->mark_order(fp->device, fp->h2d_mark);
}

/* The host waits for the last grad copy, then adds a staged grad: the host grad may be read. */
static int offload_settle_grad(sh_flatparam *fp) {
  if (!fp->grad_pending) return SH_OK;
  SH_TRY(offload_backend(fp)->mark_wait(fp->d2h_mark));
  int staged = fp->grad_pending == 2;
  fp->grad_pending = 0;
  return staged ? accumulate(fp->grad, fp->grad_stage) : SH_OK;
}

/* And for the shard's copies to the device: after the grad copy, which the device ordered
 * after them, unless a copy was queued since (then the host waits for that one): the host
 * shard may be written. */
static int offload_settle(sh_flatparam *fp) {
  SH_TRY(offload_settle_grad(fp));
  offload_shard_out(fp);
  if (!fp->h2d_newer) return SH_OK;
  SH_TRY(offload_backend(fp)->mark_wait(fp->h2d_mark));
  fp->h2d_newer = 0;
  return SH_OK;
}

/* finish_reduce of an offloaded FlatParameter, on the reduction's stream: the reduced shard
 * in the master dtype goes to the host grad (set) or to the stage (added when read). The
 * copy waits on the device for the last shard copy, so its mark covers both. */
static int offload_grad_out(sh_flatparam *fp) {
  const sh_mem_backend *be = offload_backend(fp);
  SH_TRY(offload_settle_grad(fp));   /* a second reduction before the grad was read waits here */
  if (!fp->grad) SH_TRY(new_pinned(fp, &fp->grad, fp->shard_numel, fp->master, SH_TAG_GRAD));
  if (fp->has_grad && !fp->grad_stage) SH_TRY(new_pinned(fp, &fp->grad_stage, fp->shard_numel, fp->master, SH_TAG_GRAD));
  sh_tensor *src = fp->red_out, *cast = NULL;
  if (fp->rdt != fp->master) {
    SH_TRY(new_tagged(&cast, fp->shard_numel, fp->master, fp->device, SH_TAG_GRAD));
    int rc = sh_tensor_copy_(cast, fp->red_out);
    if (rc) { sh_tensor_destroy(cast); return rc; }
    src = cast;
  }
  int rc = fp->h2d_newer ? be->mark_order(fp->device, fp->h2d_mark) : SH_OK;
  if (!rc) rc = be->copy_async(fp->has_grad ? fp->grad_stage : fp->grad, src);
  if (!rc) rc = be->mark_record(fp->device, &fp->d2h_mark);
  sh_tensor_destroy(cast);      /* reused in the reduction stream's order */
  if (rc) return rc;
  fp->grad_pending = fp->has_grad ? 2 : 1;
  fp->h2d_newer = 0;
  return SH_OK;
}

static void offload_destroy(sh_flatparam *fp) {
  if (!fp->offload) return;
  const sh_mem_backend *be = offload_backend(fp);
  be->mark_free(fp->h2d_mark);
  be->mark_free(fp->d2h_mark);
  sh_tensor_destroy(fp->grad_stage);
  sh_tensor_destroy(fp->cast);
}

/* ---- queries ----------------------------------------------------------------------------- */

int sh_flatparam_get_info(const sh_flatparam *fp, sh_flatparam_info *out) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam info: expected a FlatParameter, got nil");
  *out = (sh_flatparam_info){ .numel = fp->numel, .padded_numel = fp->padded, .shard_numel = fp->shard_numel,
                              .n_params = fp->n, .n_unique = fp->n_unique, .group_size = fp->group_size,
                              .rank = fp->rank, .master_dtype = fp->master, .param_dtype = fp->pdt,
                              .reduce_dtype = fp->rdt, .no_shard = fp->no_shard, .state = fp->state,
                              .has_grad = fp->has_grad, .device = fp->device, .offload = fp->offload };
  return SH_OK;
}

int sh_flatparam_state(const sh_flatparam *fp) { return fp ? (int)fp->state : -1; }

int sh_flatparam_get_slot(const sh_flatparam *fp, int i, int rank, sh_flatparam_slot *out) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam slot: expected a FlatParameter, got nil");
  if (i < 0 || i >= fp->n) return sh_fail(SH_ERR_ARG, "flatparam slot: index %d out of range for %d parameters", i, fp->n);
  if (rank == -1) rank = fp->rank;
  if (rank < 0 || rank >= fp->group_size)
    return sh_fail(SH_ERR_ARG, "flatparam slot: rank %d out of range for a group of %d", rank, fp->group_size);
  const fp_slot *s = &fp->slots[i];
  int64_t lo0 = rank * fp->shard_numel, hi0 = lo0 + fp->shard_numel;
  int64_t lo = s->offset > lo0 ? s->offset : lo0;
  int64_t hi = s->offset + s->numel < hi0 ? s->offset + s->numel : hi0;
  *out = (sh_flatparam_slot){ .offset = s->offset, .numel = s->numel, .tied_to = s->tied_to, .frozen = s->frozen };
  if (hi > lo) { out->own_start = lo - s->offset; out->own_numel = hi - lo; out->shard_offset = lo - lo0; }
  return SH_OK;
}

/* Readers of the sharded grad (the optimizer, clipping, zero_grad) order their stream after
 * the reduction that wrote it. */
static int order_grad(sh_flatparam *fp) {
  if (!fp->grad_ready) return SH_OK;
  int rc = sh_comm_work_order(fp->grad_ready);
  sh_comm_work_free(fp->grad_ready);
  fp->grad_ready = NULL;
  return rc;
}

int sh_flatparam_shard(sh_tensor **out, sh_flatparam *fp) {
  *out = NULL;
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam shard: expected a FlatParameter, got nil");
  offload_shard_out(fp);
  return sh_tensor_alias(out, fp->shard);
}

int sh_flatparam_grad_shard(sh_tensor **out, sh_flatparam *fp) {
  *out = NULL;
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam grad_shard: expected a FlatParameter, got nil");
  if (order_grad(fp)) return sh_fail_context("flatparam grad_shard: ");
  if (fp->offload && offload_settle(fp)) return sh_fail_context("flatparam grad_shard: ");
  return fp->has_grad ? sh_tensor_alias(out, fp->grad) : SH_OK;
}

int sh_flatparam_shard_view(sh_tensor **out, sh_flatparam *fp, int i) {
  *out = NULL;
  sh_flatparam_slot s;
  SH_TRY(sh_flatparam_get_slot(fp, i, -1, &s));
  offload_shard_out(fp);
  return sh_view_narrow(out, fp->shard, 0, s.shard_offset, s.own_numel);
}

int sh_flatparam_init_param(sh_flatparam *fp, int i, const sh_tensor *value) {
  sh_flatparam_slot s;
  SH_TRY(sh_flatparam_get_slot(fp, i, -1, &s));
  SH_TRY(sh_tensor_check(value, "flatparam init_param"));
  if (sh_tensor_numel(value) != s.numel)
    return sh_fail(SH_ERR_ARG, "flatparam init_param: parameter %d has %lld elements, the value %s has %lld",
                   i + 1, (long long)s.numel, sh_desc(value), (long long)sh_tensor_numel(value));
  sh_tensor *view = NULL;
  SH_TRY(sh_flatparam_shard_view(&view, fp, i));
  int rc = copy_flat_range(view, value, s.own_start, s.own_numel);
  sh_tensor_destroy(view);
  return rc;
}

/* ---- unshard / reshard ------------------------------------------------------------------- */

/* The full buffer goes (an alias of the shard under no_shard is not a gathered buffer). */
static void drop_full(sh_flatparam *fp) {
  if (fp->full && fp->full->storage != fp->shard->storage) count_gather(-1);
  sh_tensor_destroy(fp->full);
  fp->full = NULL;
}

static void point_params(sh_flatparam *fp) {
  for (int i = 0; i < fp->n; i++)
    if (fp->slots[i].tied_to < 0) point_into(fp->slots[i].p, fp->full, fp->slots[i].offset);
  fp->state = SH_FP_UNSHARDED;
}

int sh_flatparam_unshard_start(sh_flatparam *fp) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam unshard: expected a FlatParameter, got nil");
  if (fp->state != SH_FP_SHARDED) return SH_OK;
  if (fp->no_shard && fp->pdt == fp->master) {
    SH_TRY(sh_tensor_alias(&fp->full, fp->shard));
    fp->state = SH_FP_GATHERING;
    return SH_OK;
  }
  if (fp->offload) {
    int rc = offload_unshard_start(fp);
    if (rc) { drop_full(fp); return sh_fail_context("flatparam unshard: "); }
    fp->state = SH_FP_GATHERING;
    return SH_OK;
  }
  SH_TRY(new_tagged(&fp->full, fp->padded, fp->pdt, fp->device, SH_TAG_PARAM));
  count_gather(1);
  sh_tensor *slot = NULL;
  int rc = sh_view_narrow(&slot, fp->full, 0, fp->rank * fp->shard_numel, fp->shard_numel);
  if (!rc) rc = sh_tensor_copy_(slot, fp->shard);
  if (!rc && !fp->no_shard && fp->group) rc = sh_comm_all_gather_into_async(&fp->gather, fp->group, fp->full, slot);
  sh_tensor_destroy(slot);
  if (rc) { drop_full(fp); return sh_fail_context("flatparam unshard: "); }
  fp->state = SH_FP_GATHERING;
  return SH_OK;
}

int sh_flatparam_unshard_wait(sh_flatparam *fp) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam unshard: expected a FlatParameter, got nil");
  if (fp->state == SH_FP_UNSHARDED) return SH_OK;
  if (fp->state == SH_FP_SHARDED) SH_TRY(sh_flatparam_unshard_start(fp));
  if (offload_order_copy_in(fp)) return sh_fail_context("flatparam unshard: ");
  if (fp->gather) {     /* the caller's stream waits for the gather on the device, not the host */
    int rc = sh_comm_work_order(fp->gather);
    if (rc) return sh_fail_context("flatparam unshard: ");
    sh_comm_work_free(fp->gather);
    fp->gather = NULL;
  }
  point_params(fp);
  return SH_OK;
}

int sh_flatparam_unshard(sh_flatparam *fp) {
  SH_TRY(sh_flatparam_unshard_start(fp));
  return sh_flatparam_unshard_wait(fp);
}

int sh_flatparam_reshard(sh_flatparam *fp) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam reshard: expected a FlatParameter, got nil");
  if (fp->gather) {                 /* a prefetch nobody used: order it before freeing its buffer */
    int rc = sh_comm_work_order(fp->gather);
    sh_comm_work_free(fp->gather);
    fp->gather = NULL;
    if (rc) return sh_fail_context("flatparam reshard: ");
  }
  if (fp->state == SH_FP_GATHERING && offload_order_copy_in(fp)) return sh_fail_context("flatparam reshard: ");
  for (int i = 0; i < fp->n; i++) if (fp->slots[i].tied_to < 0) drop_storage(fp->slots[i].p);
  drop_full(fp);
  fp->state = SH_FP_SHARDED;
  return SH_OK;
}

/* ---- gradients --------------------------------------------------------------------------- */

static int new_flat_grad(sh_flatparam *fp) {
  SH_TRY(new_tagged(&fp->flat_grad, fp->padded, fp->rdt, fp->device, SH_TAG_GRAD));
  count_reduce(1);
  return sh_tensor_fill_(fp->flat_grad, 0);
}

/* True when g is parameter slot s's view of the flat grad buffer (set by prepare_grads). */
static int is_flat_view(const sh_flatparam *fp, const fp_slot *s, const sh_tensor *g) {
  return fp->flat_grad && g->storage == fp->flat_grad->storage && g->offset == fp->flat_grad->offset + s->offset &&
         sh_tensor_is_contiguous(g);
}

int sh_flatparam_prepare_grads(sh_flatparam *fp) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam prepare_grads: expected a FlatParameter, got nil");
  if (fp->reduce) return sh_fail(SH_ERR_ARG, "flatparam prepare_grads: a reduce_grad is still in flight; wait for it first");
  if (fp->state != SH_FP_UNSHARDED) return sh_fail(SH_ERR_ARG, "flatparam prepare_grads: unshard first (the parameters have no storage)");
  if (fp->flat_grad || fp->rdt != fp->pdt) return SH_OK;   /* prepared already, or grads need a cast */
  SH_TRY(new_flat_grad(fp));
  for (int i = 0; i < fp->n; i++) {
    fp_slot *s = &fp->slots[i];
    if (s->tied_to >= 0 || s->frozen || s->p->grad) continue;
    sh_tensor *seg = NULL, *g = NULL;
    int rc = sh_view_narrow(&seg, fp->flat_grad, 0, s->offset, s->numel);
    if (!rc) rc = sh_view_reshape(&g, seg, s->p->ndim, s->p->shape);
    sh_tensor_destroy(seg);
    if (rc) return sh_fail_context("flatparam prepare_grads: parameter %d: ", i + 1);
    s->p->grad = g;
  }
  return SH_OK;
}

/* Lays every trainable parameter's .grad into a zeroed flat buffer and frees those grads;
 * grads that already are views of the buffer (prepare_grads) need no copy. */
static int flatten_grads(sh_flatparam *fp) {
  if (!fp->flat_grad) SH_TRY(new_flat_grad(fp));
  for (int i = 0; i < fp->n; i++) {
    fp_slot *s = &fp->slots[i];
    sh_tensor *g = s->p->grad;
    if (s->tied_to >= 0 || !g) continue;
    if (!s->frozen && !is_flat_view(fp, s, g)) {
      if (sh_tensor_numel(g) != s->numel)
        return sh_fail(SH_ERR_ARG, "flatparam reduce_grad: parameter %d has %lld elements but its grad is %s",
                       i + 1, (long long)s->numel, sh_desc(g));
      SH_TRY(sh_tensor_check(g, "flatparam reduce_grad"));
      sh_tensor *seg = NULL;
      SH_TRY(sh_view_narrow(&seg, fp->flat_grad, 0, s->offset, s->numel));
      int rc = copy_flat_range(seg, g, 0, s->numel);
      sh_tensor_destroy(seg);
      if (rc) return sh_fail_context("flatparam reduce_grad: parameter %d: ", i + 1);
    }
    sh_tensor_destroy(g);
    s->p->grad = NULL;
  }
  return SH_OK;
}

static void drop_reduce_buffers(sh_flatparam *fp) {
  if (fp->red_out != fp->flat_grad) sh_tensor_destroy(fp->red_out);
  if (fp->flat_grad) count_reduce(-1);
  sh_tensor_destroy(fp->flat_grad);
  fp->red_out = fp->flat_grad = NULL;
}

int sh_flatparam_reduce_grad_start(sh_flatparam *fp, int op, struct sh_comm *replicate) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam reduce_grad: expected a FlatParameter, got nil");
  if (op != SH_RED_SUM && op != SH_RED_AVG)
    return sh_fail(SH_ERR_ARG, "flatparam reduce_grad: op %d; grads are reduced with sum (0) or avg (1)", op);
  if (fp->reduce || fp->red_out) return sh_fail(SH_ERR_ARG, "flatparam reduce_grad: the previous reduce_grad is still in flight; wait for it first");
  int rc = flatten_grads(fp);
  if (!rc) {
    if (fp->no_shard || !fp->group || fp->group_size == 1) fp->red_out = fp->flat_grad;
    else rc = new_tagged(&fp->red_out, fp->shard_numel, fp->rdt, fp->device, SH_TAG_GRAD);
  }
  if (!rc && fp->group) {
    if (fp->no_shard) rc = sh_comm_all_reduce_async(&fp->reduce, fp->group, fp->flat_grad, op, -1);
    else rc = sh_comm_reduce_scatter_async(&fp->reduce, fp->group, fp->red_out, fp->flat_grad, op, -1);
  }
  if (rc) { drop_reduce_buffers(fp); return sh_fail_context("flatparam reduce_grad: "); }
  fp->replicate = replicate;
  fp->red_op = op;
  return SH_OK;
}

/* After the reduction: the all-reduce across replicas, then the sum lands in the sharded
 * grad (master dtype) and the flat buffers go. With a device collective this is queued on
 * the collective's own stream (sh_comm_work_then_begin), so the caller's stream never waits
 * for a reduction and the buffers are reused in that stream's order. */
static int finish_reduce(sh_flatparam *fp) {
  int rc = fp->replicate ? sh_comm_all_reduce(fp->replicate, fp->red_out, fp->red_op, -1) : SH_OK;
  if (fp->offload) {
    if (!rc) rc = offload_grad_out(fp);
    drop_reduce_buffers(fp);
    if (!rc) fp->has_grad = 1;
    return rc;
  }
  if (!rc) rc = order_grad(fp);
  if (!rc && !fp->grad) rc = new_tagged(&fp->grad, fp->shard_numel, fp->master, fp->device, SH_TAG_GRAD);
  if (!rc) rc = fp->has_grad ? accumulate(fp->grad, fp->red_out) : sh_tensor_copy_(fp->grad, fp->red_out);
  drop_reduce_buffers(fp);
  if (!rc) fp->has_grad = 1;
  return rc;
}

/* The finished reduction's work holds aliases of its buffers (the flat grad and its reduced
 * shard). On a device the grad's readers order their stream after it, so it is kept until
 * one reads the grad. On the CPU the host waited for it: nothing is left to order, and
 * keeping it would hold every unit's flat grad until the optimizer, a full copy of the
 * grads (what accumulating into sharded grads across micro-batches must not cost). */
static void keep_for_readers(sh_flatparam *fp) {
  if (fp->device < 0) sh_comm_work_free(fp->reduce);
  else fp->grad_ready = fp->reduce;
  fp->reduce = NULL;
}

int sh_flatparam_reduce_grad_wait(sh_flatparam *fp) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam reduce_grad: expected a FlatParameter, got nil");
  if (!fp->red_out) return SH_OK;
  if (!fp->reduce) {
    int rc = finish_reduce(fp);
    return rc ? sh_fail_context("flatparam reduce_grad: ") : SH_OK;
  }
  int rc = sh_comm_work_then_begin(fp->reduce);
  if (rc) return sh_fail_context("flatparam reduce_grad: ");
  rc = finish_reduce(fp);
  int end = sh_comm_work_then_end(fp->reduce);
  keep_for_readers(fp);
  if (rc || end) return sh_fail_context("flatparam reduce_grad: ");
  return SH_OK;
}

int sh_flatparam_reduce_grad(sh_flatparam *fp, int op, struct sh_comm *replicate) {
  SH_TRY(sh_flatparam_reduce_grad_start(fp, op, replicate));
  return sh_flatparam_reduce_grad_wait(fp);
}

int sh_flatparam_take_grad(sh_tensor **out, sh_flatparam *fp) {
  *out = NULL;
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam take_grad: expected a FlatParameter, got nil");
  if (fp->reduce || fp->red_out) return sh_fail(SH_ERR_ARG, "flatparam take_grad: a reduce_grad is in flight; wait for it first");
  if (flatten_grads(fp)) return sh_fail_context("flatparam take_grad: ");
  *out = fp->flat_grad;
  fp->flat_grad = NULL;
  count_reduce(-1);
  return SH_OK;
}

int sh_flatparam_add_grad(sh_flatparam *fp, const sh_tensor *shard) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam add_grad: expected a FlatParameter, got nil");
  if (fp->reduce || fp->red_out || fp->flat_grad)
    return sh_fail(SH_ERR_ARG, "flatparam add_grad: a reduce_grad is in flight or grads are prepared; finish it first");
  SH_TRY(sh_tensor_check(shard, "flatparam add_grad"));
  if (sh_tensor_numel(shard) != fp->shard_numel || shard->dtype != fp->rdt || shard->device != fp->device)
    return sh_fail(SH_ERR_ARG, "flatparam add_grad: expected %lld elements of %s on the FlatParameter's device, got %s",
                   (long long)fp->shard_numel, sh_dtype_name(fp->rdt), sh_desc(shard));
  SH_TRY(sh_tensor_alias(&fp->red_out, shard));
  fp->replicate = NULL;
  return finish_reduce(fp) ? sh_fail_context("flatparam add_grad: ") : SH_OK;
}

/* Block b's sum of squares: eight f64 lanes over its elements (element i in lane i % 8, each
 * lane in element order), then the lanes in a fixed tree. The order depends only on the
 * block's own elements, never on the thread or on where the block sits. */
static double block_sumsq(const float *g, int64_t n) {
  double lane[8] = { 0 };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) lane[l] += (double)g[i + l] * g[i + l];
  for (int l = 0; i < n; i++, l++) lane[l] += (double)g[i] * g[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

typedef struct { const float *g; double *out; int64_t block; } sumsq_job;
static void sumsq_range(void *ctx, int64_t b0, int64_t b1) {
  sumsq_job *j = ctx;
  for (int64_t b = b0; b < b1; b++) j->out[b] = block_sumsq(j->g + b * j->block, j->block);
}

int sh_flatparam_grad_block_sumsq(sh_flatparam *fp, int64_t block, sh_tensor *out) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam grad_block_sumsq: expected a FlatParameter, got nil");
  if (block < 1 || fp->shard_numel % block != 0)
    return sh_fail(SH_ERR_ARG, "flatparam grad_block_sumsq: block %lld does not divide the shard's %lld elements "
                   "(create the FlatParameter with that align)", (long long)block, (long long)fp->shard_numel);
  int64_t nb = fp->shard_numel / block;
  SH_TRY(sh_tensor_check(out, "flatparam grad_block_sumsq"));
  if (out->dtype != SH_F64 || out->device != -1 || sh_tensor_numel(out) != nb || !sh_tensor_is_contiguous(out))
    return sh_fail(SH_ERR_ARG, "flatparam grad_block_sumsq: expected a contiguous f64 CPU tensor of %lld elements, got %s",
                   (long long)nb, sh_desc(out));
  if (fp->master != SH_F32)
    return sh_fail(SH_ERR_ARG, "flatparam grad_block_sumsq: an f32 sharded grad only, got %s",
                   fp->has_grad ? sh_desc(fp->grad) : sh_dtype_name(fp->master));
  if (order_grad(fp) || (fp->offload && offload_settle_grad(fp))) return sh_fail_context("flatparam grad_block_sumsq: ");
  if (!fp->has_grad) return sh_tensor_fill_(out, 0);
  /* A CUDA grad is summed on the host from a copy: the same fixed order on every device and
   * world size, for one copy of the shard per step. */
  sh_tensor *host = NULL;
  if (fp->grad->device >= 0 && sh_tensor_to(&host, fp->grad, SH_F32, -1))
    return sh_fail_context("flatparam grad_block_sumsq: ");
  sumsq_job job = { sh_tensor_data(host ? host : fp->grad), sh_tensor_data(out), block };
  sh_parallel_for(nb, fp->shard_numel >= (1 << 15), sumsq_range, &job);
  sh_tensor_destroy(host);
  return SH_OK;
}

int sh_flatparam_zero_grad(sh_flatparam *fp, int free_it) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam zero_grad: expected a FlatParameter, got nil");
  if (free_it && order_grad(fp)) return sh_fail_context("flatparam zero_grad: ");
  if (fp->offload) {            /* the pinned buffer stays: a grad still landing is waited for first */
    if (offload_settle_grad(fp)) return sh_fail_context("flatparam zero_grad: ");
    fp->has_grad = 0;
    return SH_OK;
  }
  fp->has_grad = 0;
  if (free_it) { sh_tensor_destroy(fp->grad); fp->grad = NULL; }
  return SH_OK;
}

int sh_flatparam_drop_local_grads(sh_flatparam *fp) {
  if (!fp) return sh_fail(SH_ERR_ARG, "flatparam drop_local_grads: expected a FlatParameter, got nil");
  if (fp->reduce || fp->red_out)
    return sh_fail(SH_ERR_ARG, "flatparam drop_local_grads: a reduce_grad is in flight; wait for it first");
  for (int i = 0; i < fp->n; i++) {
    fp_slot *s = &fp->slots[i];
    if (s->tied_to >= 0 || !s->p->grad) continue;
    sh_tensor_destroy(s->p->grad);
    s->p->grad = NULL;
  }
  drop_reduce_buffers(fp);
  return SH_OK;
}

/* ---- lifetime ---------------------------------------------------------------------------- */

void sh_flatparam_destroy(sh_flatparam *fp) {
  if (!fp) return;
  if (fp->gather) { sh_comm_work_free(fp->gather); fp->gather = NULL; }
  if (fp->reduce) { sh_comm_work_free(fp->reduce); fp->reduce = NULL; }
  if (fp->grad_ready) { sh_comm_work_free(fp->grad_ready); fp->grad_ready = NULL; }
  drop_reduce_buffers(fp);
  offload_destroy(fp);
  /* The parameter structs are not touched: Lua's finalizers may have freed them already. A
   * parameter still viewing the full buffer keeps that storage alive until it goes. */
  drop_full(fp);
  for (sh_flatparam **p = &g_live; *p; p = &(*p)->next)
    if (*p == fp) { *p = fp->next; break; }
  sh_tensor_destroy(fp->shard);
  sh_tensor_destroy(fp->grad);
  free(fp->slots);
  free(fp);
}
