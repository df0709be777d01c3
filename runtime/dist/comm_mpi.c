/* comm_mpi.c: the Open MPI backend for CPU tensors. Every collective is nonblocking
 * (MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier,
 * MPI_Ialltoall) and
 * polled with MPI_Test by comm.c, which owns the timeout. bf16/f16 reductions, and any
 * reduction in a reduce dtype other than the tensor's, go through f32 (or f64) staging
 * buffers: the sum accumulates in the wide type and is rounded once at the end. Gathers and
 * broadcasts move raw bits. Groups get MPI_ERRORS_RETURN so a failure becomes a status. */
#include "comm_internal.h"
#include "core/tensor_internal.h"
#include "core/alloc_internal.h"
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

typedef struct mpi_group { MPI_Comm comm; } mpi_group;

typedef struct mpi_work {
  MPI_Request req;
  void *send, *recv;            /* staging (SH_TAG_COMM), or NULL */
  size_t send_bytes, recv_bytes;
  int acc;                      /* staging dtype */
  int staged;                   /* results must be unstaged into out */
} mpi_work;

static int g_mpi_inited;        /* MPI_Init_thread was called by us */

static int mpi_fail(int err, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  int cls = 0;
  MPI_Error_class(err, &cls);
  /* what a truncated message means for us: the ranks did not issue the same collectives */
  const char *hint = cls == MPI_ERR_TRUNCATE
    ? " (the ranks gave this collective different sizes: they are out of step, e.g. an FSDP unit run on"
      " some ranks only; fsdp.wrap{ check_schedule = true } names the unit and the ranks)" : "";
  return sh_fail(SH_ERR_COMM, "%s failed: %s%s", what, msg, hint);
}
#define MPI_TRY(call, what) do { int e_ = (call); if (e_ != MPI_SUCCESS) return mpi_fail(e_, what); } while (0)

static MPI_Comm group_comm(const sh_comm *c) { return ((mpi_group *)c->cpu_state)->comm; }

static MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case SH_F64: return MPI_DOUBLE;
    case SH_F32: return MPI_FLOAT;
    case SH_BF16: case SH_F16: return MPI_UINT16_T;   /* raw bits; reductions are staged */
    case SH_I64: return MPI_INT64_T;
    case SH_I32: return MPI_INT32_T;
    default: return MPI_UINT8_T;
  }
}

static MPI_Op mpi_op(int op) {
  switch (op) {
    case SH_RED_MAX: return MPI_MAX;
    case SH_RED_MIN: return MPI_MIN;
    default: return MPI_SUM;    /* avg divides after the sum */
  }
}

static int new_group(sh_comm *c, MPI_Comm comm) {
  mpi_group *g = calloc(1, sizeof *g);
  if (!g) { MPI_Comm_free(&comm); return sh_fail(SH_ERR_OOM, "mpi: out of host memory"); }
  g->comm = comm;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &c->rank);
  MPI_Comm_size(comm, &c->size);
  c->cpu_state = g;
  return SH_OK;
}

int sh_comm_mpi_active(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  return inited && !finalized;
}

/* The node fields of the world, from MPI itself so that any launcher and any rank numbering
 * give the right ones: the ranks sharing memory with this one form its node, a node's leader
 * is its lowest world rank, and nodes are numbered in the order of their leaders. Blocking
 * collectives, once, at init (MPI_Init itself waited for every rank). */
static int node_layout(sh_comm *w) {
  MPI_Comm node;
  MPI_Comm comm = group_comm(w);
  MPI_TRY(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, w->rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int leader = w->rank;
  MPI_Comm_rank(node, &w->local_rank);
  MPI_Comm_size(node, &w->local_size);
  int e = MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Allreduce (node leader)");
  int *leaders = malloc(sizeof(int) * (size_t)w->size);
  if (!leaders) return sh_fail(SH_ERR_OOM, "mpi: out of host memory for the node layout");
  e = MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, comm);
  if (e != MPI_SUCCESS) { free(leaders); return mpi_fail(e, "MPI_Allgather (node leaders)"); }
  /* leaders[r] == r marks a node's leader; count them, and those before mine. */
  int n_nodes = 0, node_id = 0;
  for (int r = 0; r < w->size; r++) {
    if (leaders[r] != r) continue;
    n_nodes++;
    if (r < leader) node_id++;
  }
  w->node = node_id;
  w->n_nodes = n_nodes;
  w->nodes_uniform = w->size == n_nodes * w->local_size;
  for (int r = 0; r < w->size && w->nodes_uniform; r++) {   /* every node as large as mine */
    int count = 0;
    for (int q = 0; q < w->size; q++) count += leaders[q] == leaders[r];
    if (count != w->local_size) w->nodes_uniform = 0;
  }
  free(leaders);
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  if (MPI_Get_processor_name(host, &len) == MPI_SUCCESS) snprintf(w->node_name, sizeof w->node_name, "%.*s", len, host);
  return SH_OK;
}

int sh_comm_mpi_init_world(sh_comm *w) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) return sh_fail(SH_ERR_COMM, "comm: MPI was already finalized in this process");
  if (!inited) {
    int provided = 0;
    MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    g_mpi_inited = 1;
  }
  MPI_Comm dup;
  /* libnbc reports a failed nonblocking collective (e.g. ranks that gave it different sizes)
   * through MPI_COMM_WORLD's handler: a status here too, not an abort inside MPI */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  SH_TRY(new_group(w, dup));
  w->cpu = &sh_comm_mpi_backend;
  return node_layout(w);
}

void sh_comm_mpi_finalize(void) {
  if (g_mpi_inited && sh_comm_mpi_active()) MPI_Finalize();
  g_mpi_inited = 0;
}

/* ---- staging ---------------------------------------------------------------------------- */

static void *stage_alloc(size_t nbytes) { return sh_mem_alloc(-1, nbytes ? nbytes : 1, SH_TAG_COMM); }

static void stage_free(mpi_work *m) {
  if (m->send) sh_mem_free(-1, m->send, m->send_bytes ? m->send_bytes : 1, SH_TAG_COMM);
  if (m->recv && m->recv != m->send) sh_mem_free(-1, m->recv, m->recv_bytes ? m->recv_bytes : 1, SH_TAG_COMM);
  m->send = m->recv = NULL;
}

/* Widens src into a staging buffer of dtype acc, rounding each value to rd first. */
static void stage_in(void *dst, int acc, const sh_tensor *src, int rd) {
  int64_t n = sh_tensor_numel(src);
  const void *s = sh_tensor_data(src);
  for (int64_t i = 0; i < n; i++) sh_store(dst, acc, i, sh_comm_round(sh_load(s, src->dtype, i), rd));
}

/* Narrows a reduced staging buffer into dst: divide for avg, round to rd, store. */
static void stage_out(sh_tensor *dst, const void *src, int acc, int rd, double scale) {
  int64_t n = sh_tensor_numel(dst);
  void *d = sh_tensor_data(dst);
  for (int64_t i = 0; i < n; i++) sh_store(d, dst->dtype, i, sh_comm_round(sh_load(src, acc, i) * scale, rd));
}

static void scale_inplace(sh_tensor *t, double scale) {
  int64_t n = sh_tensor_numel(t);
  void *d = sh_tensor_data(t);
  if (t->dtype == SH_F32) { float *f = d; for (int64_t i = 0; i < n; i++) f[i] = (float)(f[i] * scale); }
  else if (t->dtype == SH_F64) { double *f = d; for (int64_t i = 0; i < n; i++) f[i] *= scale; }
}

static int overlaps(const sh_tensor *a, const sh_tensor *b) {
  const char *pa = sh_tensor_data(a), *pb = sh_tensor_data(b);
  int64_t na = sh_tensor_numel(a) * sh_dtype_size(a->dtype), nb = sh_tensor_numel(b) * sh_dtype_size(b->dtype);
  return pa < pb + nb && pb < pa + na;
}

/* ---- posting ---------------------------------------------------------------------------- */

static int check_count(int64_t n, const char *what) {
  if (n > INT_MAX) return sh_fail(SH_ERR_ARG, "mpi %s: %lld elements is more than one MPI call moves (%d)", what, (long long)n, INT_MAX);
  return SH_OK;
}

static int post_all_gather(sh_comm_work *w, mpi_work *m) {
  const sh_tensor *in = w->in;
  sh_tensor *out = w->out;
  int64_t n = sh_tensor_numel(in);
  SH_TRY(check_count(n, "all_gather"));
  MPI_Datatype t = mpi_type(in->dtype);
  const char *slot = (const char *)sh_tensor_data(out) + (size_t)(w->comm->rank * n * sh_dtype_size(in->dtype));
  const void *send = sh_tensor_data(in);
  if (send == slot) send = MPI_IN_PLACE;            /* the shard already sits in the output */
  else if (overlaps(in, out))
    return sh_fail(SH_ERR_ARG, "input overlaps the output other than at this rank's slot");
  MPI_TRY(MPI_Iallgather(send, (int)n, t, sh_tensor_data(out), (int)n, t, group_comm(w->comm), &m->req), "MPI_Iallgather");
  return SH_OK;
}

/* Blocks of n / size elements, moved as bytes (a dtype MPI has no type for moves the same). */
static int post_all_to_all(sh_comm_work *w, mpi_work *m) {
  int64_t bytes = sh_tensor_numel(w->in) / w->comm->size * sh_dtype_size(w->in->dtype);
  SH_TRY(check_count(bytes, "all_to_all"));
  MPI_TRY(MPI_Ialltoall(sh_tensor_data(w->in), (int)bytes, MPI_BYTE, sh_tensor_data(w->out), (int)bytes, MPI_BYTE,
                        group_comm(w->comm), &m->req), "MPI_Ialltoall");
  return SH_OK;
}

static int post_reduction(sh_comm_work *w, mpi_work *m) {
  const sh_tensor *in = w->in;
  sh_tensor *out = w->out;
  int dt = in->dtype, rd = w->reduce_dtype < 0 ? dt : w->reduce_dtype;
  int64_t nin = sh_tensor_numel(in), nout = sh_tensor_numel(out);
  SH_TRY(check_count(nin, sh_comm_kind_name(w->kind)));
  m->acc = sh_comm_acc_dtype(dt, rd);
  m->staged = sh_dtype_is_float(dt) && (m->acc != dt || rd != dt);
  const void *send = sh_tensor_data(in);
  void *recv = sh_tensor_data(out);
  int type_dtype = dt;
  if (m->staged) {
    int es = sh_dtype_size(m->acc);
    m->send_bytes = (size_t)(nin * es);
    m->send = stage_alloc(m->send_bytes);
    if (!m->send) return sh_fail_context("staging: ");
    stage_in(m->send, m->acc, in, rd);
    send = m->send;
    type_dtype = m->acc;
    if (w->kind == SH_COLL_ALL_REDUCE) recv = m->recv = m->send;
    else {
      m->recv_bytes = (size_t)(nout * es);
      m->recv = stage_alloc(m->recv_bytes);
      if (!m->recv) { stage_free(m); return sh_fail_context("staging: "); }
      recv = m->recv;
    }
  } else if (w->kind == SH_COLL_REDUCE_SCATTER && overlaps(in, out)) {
    /* MPI's in-place reduce_scatter means something else; receive aside and copy back. */
    m->acc = dt;
    m->staged = 1;
    m->recv_bytes = (size_t)(nout * sh_dtype_size(dt));
    m->recv = stage_alloc(m->recv_bytes);
    if (!m->recv) return sh_fail_context("staging: ");
    recv = m->recv;
  }
  MPI_Datatype t = mpi_type(type_dtype);
  MPI_Op op = mpi_op(w->op);
  MPI_Comm comm = group_comm(w->comm);
  if (w->kind == SH_COLL_ALL_REDUCE) {
    int e = MPI_Iallreduce(MPI_IN_PLACE, recv, (int)nin, t, op, comm, &m->req);
    if (e != MPI_SUCCESS) { stage_free(m); return mpi_fail(e, "MPI_Iallreduce"); }
  } else {
    int e = MPI_Ireduce_scatter_block(send, recv, (int)nout, t, op, comm, &m->req);
    if (e != MPI_SUCCESS) { stage_free(m); return mpi_fail(e, "MPI_Ireduce_scatter_block"); }
  }
  return SH_OK;
}

static int mpi_start(sh_comm_work *w) {
  mpi_work *m = calloc(1, sizeof *m);
  if (!m) return sh_fail(SH_ERR_OOM, "mpi: out of host memory for a request");
  int rc = SH_OK;
  switch (w->kind) {
    case SH_COLL_ALL_GATHER: rc = post_all_gather(w, m); break;
    case SH_COLL_ALL_TO_ALL: rc = post_all_to_all(w, m); break;
    case SH_COLL_REDUCE_SCATTER: case SH_COLL_ALL_REDUCE: rc = post_reduction(w, m); break;
    case SH_COLL_BROADCAST: {
      int64_t n = sh_tensor_numel(w->out);
      rc = check_count(n, "broadcast");
      if (!rc) {
        int e = MPI_Ibcast(sh_tensor_data(w->out), (int)n, mpi_type(w->out->dtype), w->root, group_comm(w->comm), &m->req);
        if (e != MPI_SUCCESS) rc = mpi_fail(e, "MPI_Ibcast");
      }
      break;
    }
    case SH_COLL_BARRIER: {
      int e = MPI_Ibarrier(group_comm(w->comm), &m->req);
      if (e != MPI_SUCCESS) rc = mpi_fail(e, "MPI_Ibarrier");
      break;
    }
  }
  if (rc) { free(m); return rc; }
  w->state = m;
  return SH_OK;
}

/* ---- completion ------------------------------------------------------------------------- */

static void finish(sh_comm_work *w, mpi_work *m) {
  if (w->kind != SH_COLL_REDUCE_SCATTER && w->kind != SH_COLL_ALL_REDUCE) return;
  int dt = w->out->dtype, rd = w->reduce_dtype < 0 ? dt : w->reduce_dtype;
  double scale = w->op == SH_RED_AVG ? 1.0 / w->comm->size : 1.0;
  if (m->staged) stage_out(w->out, m->recv, m->acc, sh_dtype_is_float(dt) ? rd : -1, scale);
  else if (scale != 1.0) scale_inplace(w->out, scale);
}

static int mpi_test(sh_comm_work *w, int *done) {
  mpi_work *m = w->state;
  int flag = 0;
  int e = MPI_Test(&m->req, &flag, MPI_STATUS_IGNORE);
  if (e != MPI_SUCCESS) { stage_free(m); free(m); w->state = NULL; return mpi_fail(e, "MPI_Test"); }
  if (!flag) return SH_OK;
  finish(w, m);
  stage_free(m);
  free(m);
  w->state = NULL;
  *done = 1;
  return SH_OK;
}

/* MPI may still write the staging buffers of an abandoned op, so they are left allocated. */
static void mpi_abandon(sh_comm_work *w) { free(w->state); w->state = NULL; }

static int mpi_split(sh_comm *parent, int color, int key, sh_comm *child) {
  MPI_Comm comm;
  MPI_TRY(MPI_Comm_split(group_comm(parent), color < 0 ? MPI_UNDEFINED : color, key, &comm), "MPI_Comm_split");
  if (comm == MPI_COMM_NULL) { child->size = 0; return SH_OK; }
  SH_TRY(new_group(child, comm));
  child->cpu = &sh_comm_mpi_backend;
  return SH_OK;
}

static void mpi_destroy(sh_comm *c) {
  mpi_group *g = c->cpu_state;
  if (!g) return;
  if (sh_comm_mpi_active() && !c->abandoned) MPI_Comm_free(&g->comm);
  free(g);
  c->cpu_state = NULL;
}

int sh_comm_mpi_bcast_bytes(sh_comm *c, void *buf, int nbytes, int root) {
  if (c->cpu != &sh_comm_mpi_backend) return sh_fail(SH_ERR_COMM, "bootstrap on %s: the group has no MPI", c->name);
  MPI_Request req;
  MPI_TRY(MPI_Ibcast(buf, nbytes, MPI_BYTE, root, group_comm(c), &req), "MPI_Ibcast");
  double t0 = sh_comm_now();
  for (;;) {
    int flag = 0;
    MPI_TRY(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return SH_OK;
    if (sh_comm_now() - t0 > c->timeout)
      return sh_fail(SH_ERR_COMM, "bootstrap broadcast on %s timed out after %.3g s on rank %d", c->name, c->timeout, c->rank);
  }
}

const sh_comm_backend sh_comm_mpi_backend = {
  .name = "mpi", .start = mpi_start, .test = mpi_test, .abandon = mpi_abandon, .split = mpi_split,
  .destroy = mpi_destroy,
};
