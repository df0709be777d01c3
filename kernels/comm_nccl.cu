/* comm_nccl.cu: the NCCL backend of runtime/comm for CUDA tensors (all NCCL code lives here).
 * A group's NCCL communicator is made on its first CUDA collective: the unique id travels
 * over the group's MPI communicator when it has one, else (the torchrun-style world) over a
 * TCP rendezvous on MASTER_ADDR:MASTER_PORT. Sub-groups split from a group that already has
 * NCCL use ncclCommSplit. Gathers and broadcasts run on the device's all-gather stream,
 * reductions on its reduce-scatter stream, each after an event on the caller's current
 * stream so they see its writes. bf16/f16 reductions (and any explicit reduce dtype) go
 * through f32 (or f64) staging buffers with cast kernels around the NCCL call, so sums
 * accumulate wide and round once. comm.c polls test(), which checks the completion event and
 * ncclCommGetAsyncError; its timeout abandons the op and aborts the communicator. */
#include "common.cuh"
#include <nccl.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "comm_internal.h"


struct nccl_group {
  ncclComm_t comm;
  int device;
  int aborted;
};

struct nccl_work {
  cudaEvent_t done;
  void *stage_in, *stage_out;      /* SH_TAG_COMM device buffers, or NULL */
  size_t in_bytes, out_bytes;
  int device;
};

static int nccl_fail(ncclResult_t r, const char *what) {
  return sh_fail(SH_ERR_COMM, "%s failed: %s", what, ncclGetErrorString(r));
}
#define NCCL_TRY(call, what) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) return nccl_fail(r_, what); } while (0)

/* ---- bootstrap ------------------------------------------------------------------------- */

/* Rank 0 listens on MASTER_PORT and hands the id to every other rank, which connects to
 * MASTER_ADDR (retrying while rank 0 comes up), all within the group's timeout. */
static int tcp_rendezvous(sh_comm *c, ncclUniqueId *id) {
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (!addr || !port)
    return sh_fail(SH_ERR_COMM, "nccl bootstrap of %s: MASTER_ADDR and MASTER_PORT must be set (torchrun-style launch)", c->name);
  double t0 = sh_comm_now();
  if (c->rank == 0) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (s < 0) return sh_fail(SH_ERR_COMM, "nccl bootstrap: socket: %s", strerror(errno));
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons((uint16_t)atoi(port));
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, c->size)) {
      int e = errno;
      close(s);
      return sh_fail(SH_ERR_COMM, "nccl bootstrap: cannot listen on port %s: %s", port, strerror(e));
    }
    for (int served = 1; served < c->size;) {
      struct pollfd pfd = { s, POLLIN, 0 };
      int left_ms = (int)((c->timeout - (sh_comm_now() - t0)) * 1000);
      if (left_ms <= 0 || poll(&pfd, 1, left_ms) <= 0) {
        close(s);
        return sh_fail(SH_ERR_COMM, "nccl bootstrap of %s timed out on rank 0: %d of %d ranks connected to port %s",
                       c->name, served, c->size, port);
      }
      int peer = accept(s, NULL, NULL);
      if (peer < 0) continue;
      ssize_t n = send(peer, id, sizeof *id, 0);
      close(peer);
      if (n == (ssize_t)sizeof *id) served++;
    }
    close(s);
    return SH_OK;
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr, port, &hints, &res) || !res)
    return sh_fail(SH_ERR_COMM, "nccl bootstrap: cannot resolve MASTER_ADDR %s", addr);
  for (;;) {
    int s = socket(res->ai_family, res->ai_socktype, 0);
    if (s >= 0 && connect(s, res->ai_addr, res->ai_addrlen) == 0) {
      size_t got = 0;
      while (got < sizeof *id) {
        ssize_t n = recv(s, (char *)id + got, sizeof *id - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
      }
      close(s);
      if (got == sizeof *id) { freeaddrinfo(res); return SH_OK; }
    } else if (s >= 0) {
      close(s);
    }
    if (sh_comm_now() - t0 > c->timeout) {
      freeaddrinfo(res);
      return sh_fail(SH_ERR_COMM, "nccl bootstrap of %s timed out on rank %d: no id from %s:%s", c->name, c->rank, addr, port);
    }
    usleep(100000);
  }
}

static int ensure_group(sh_comm *c, int device) {
  nccl_group *g = (nccl_group *)c->gpu_state;
  if (g) {
    if (g->device != device)
      return sh_fail(SH_ERR_ARG, "nccl: group %s is bound to cuda:%d, got a tensor on cuda:%d", c->name, g->device, device);
    if (g->aborted) return sh_fail(SH_ERR_COMM, "nccl: group %s was aborted after an error or timeout", c->name);
    return SH_OK;
  }
  cudaStream_t s;
  SH_TRY(sh_cuda_enter("nccl init", device, &s));
  ncclUniqueId id;
  if (c->rank == 0) NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (c->size > 1) {
    if (c->cpu == &sh_comm_mpi_backend) SH_TRY(sh_comm_mpi_bcast_bytes(c, &id, (int)sizeof id, 0));
    else if (c->is_world) SH_TRY(tcp_rendezvous(c, &id));
    else return sh_fail(SH_ERR_COMM, "nccl: group %s has neither MPI nor a parent with NCCL to bootstrap from "
                        "(run a CUDA collective on the parent before splitting it)", c->name);
  }
  ncclComm_t comm;
  NCCL_TRY(ncclCommInitRank(&comm, c->size, id, c->rank), "ncclCommInitRank");
  g = (nccl_group *)calloc(1, sizeof *g);
  if (!g) { ncclCommDestroy(comm); return sh_fail(SH_ERR_OOM, "nccl: out of host memory"); }
  g->comm = comm;
  g->device = device;
  c->gpu_state = g;
  return SH_OK;
}

/* ---- staging kernels ------------------------------------------------------------------- */

template <typename A> __device__ __forceinline__ A round_to(A v, int rd) {
  switch (rd) {
    case SH_BF16: return (A)__bfloat162float(__float2bfloat16_rn((float)v));
    case SH_F16: return (A)__half2float(__float2half_rn((float)v));
    case SH_F32: return (A)(float)v;
    default: return v;
  }
}

/* dst[i] = round_to(src[i] * scale, rd), any dtypes, through the accumulation type A. */
template <typename A>
__global__ void stage_kernel(const char *src, int sdt, char *dst, int ddt, int64_t n, int rd, A scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    ew_store<A>(dst, ddt, i, round_to<A>(ew_load<A>(src, sdt, i) * scale, rd));
}

static int launch_stage(const void *src, int sdt, void *dst, int ddt, int64_t n, int rd, int acc, double scale, cudaStream_t s) {
  if (n == 0) return SH_OK;
  int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
  if (acc == SH_F64) stage_kernel<double><<<blocks, 256, 0, s>>>((const char *)src, sdt, (char *)dst, ddt, n, rd, scale);
  else stage_kernel<float><<<blocks, 256, 0, s>>>((const char *)src, sdt, (char *)dst, ddt, n, rd, (float)scale);
  CU_LAUNCHED("nccl staging");
  return SH_OK;
}

/* ---- collectives ----------------------------------------------------------------------- */

static ncclDataType_t nccl_type(int dtype) {
  switch (dtype) {
    case SH_F64: return ncclFloat64;
    case SH_F32: return ncclFloat32;
    case SH_BF16: return ncclBfloat16;
    case SH_F16: return ncclFloat16;
    case SH_I64: return ncclInt64;
    case SH_I32: return ncclInt32;
    default: return ncclUint8;
  }
}

static ncclRedOp_t nccl_op(int op) {
  switch (op) {
    case SH_RED_AVG: return ncclAvg;
    case SH_RED_MAX: return ncclMax;
    case SH_RED_MIN: return ncclMin;
    default: return ncclSum;
  }
}

static void work_free_buffers(nccl_work *m) {
  if (m->stage_in) sh_mem_free(m->device, m->stage_in, m->in_bytes, SH_TAG_COMM);
  if (m->stage_out && m->stage_out != m->stage_in) sh_mem_free(m->device, m->stage_out, m->out_bytes, SH_TAG_COMM);
  m->stage_in = m->stage_out = NULL;
}

static int post_reduction(sh_comm_work *w, nccl_work *m, ncclComm_t comm, cudaStream_t s) {
  const sh_tensor *in = w->in;
  sh_tensor *out = w->out;
  int dt = in->dtype, rd = w->reduce_dtype < 0 ? dt : w->reduce_dtype;
  int acc = sh_comm_acc_dtype(dt, rd);
  int64_t nin = sh_tensor_numel(in), nout = sh_tensor_numel(out);
  int all = w->kind == SH_COLL_ALL_REDUCE;
  int staged = sh_dtype_is_float(dt) && (acc != dt || rd != dt);
  if (!staged) {
    ncclRedOp_t op = nccl_op(w->op);
    if (all) NCCL_TRY(ncclAllReduce(sh_tensor_data(in), sh_tensor_data(out), (size_t)nin, nccl_type(dt), op, comm, s), "ncclAllReduce");
    else NCCL_TRY(ncclReduceScatter(sh_tensor_data(in), sh_tensor_data(out), (size_t)nout, nccl_type(dt), op, comm, s), "ncclReduceScatter");
    return SH_OK;
  }
  int es = sh_dtype_size(acc);
  m->in_bytes = (size_t)(nin * es);
  m->stage_in = sh_mem_alloc(m->device, m->in_bytes ? m->in_bytes : 1, SH_TAG_COMM);
  if (!m->stage_in) return sh_fail_context("nccl staging: ");
  if (all) { m->stage_out = m->stage_in; m->out_bytes = m->in_bytes; }
  else {
    m->out_bytes = (size_t)(nout * es);
    m->stage_out = sh_mem_alloc(m->device, m->out_bytes ? m->out_bytes : 1, SH_TAG_COMM);
    if (!m->stage_out) return sh_fail_context("nccl staging: ");
  }
  SH_TRY(launch_stage(sh_tensor_data(in), dt, m->stage_in, acc, nin, rd, acc, 1.0, s));
  ncclRedOp_t op = w->op == SH_RED_AVG ? ncclSum : nccl_op(w->op);
  if (all) NCCL_TRY(ncclAllReduce(m->stage_in, m->stage_out, (size_t)nin, nccl_type(acc), op, comm, s), "ncclAllReduce");
  else NCCL_TRY(ncclReduceScatter(m->stage_in, m->stage_out, (size_t)nout, nccl_type(acc), op, comm, s), "ncclReduceScatter");
  double scale = w->op == SH_RED_AVG ? 1.0 / w->comm->size : 1.0;
  return launch_stage(m->stage_out, acc, sh_tensor_data(out), dt, nout, rd, acc, scale, s);
}

static int post(sh_comm_work *w, nccl_work *m) {
  sh_comm *c = w->comm;
  const sh_tensor *any = w->in ? w->in : w->out;
  if (any) m->device = any->device;
  else CU_TRY("nccl barrier", cudaGetDevice(&m->device));
  SH_TRY(ensure_group(c, m->device));
  ncclComm_t comm = ((nccl_group *)c->gpu_state)->comm;
  cudaStream_t compute;
  SH_TRY(sh_cuda_enter("nccl", m->device, &compute));
  sh_cuda_stream *cs = NULL;
  int kind = w->kind == SH_COLL_ALL_GATHER || w->kind == SH_COLL_BROADCAST ? SH_STREAM_ALL_GATHER : SH_STREAM_REDUCE_SCATTER;
  SH_TRY(sh_cuda_stream_get(&cs, m->device, kind));
  cudaStream_t s = sh_cuda_stream_raw(cs);
  /* The collective must see everything the caller's stream wrote into its inputs. */
  cudaEvent_t ready;
  CU_TRY("nccl", cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CU_TRY("nccl", cudaEventRecord(ready, compute));
  CU_TRY("nccl", cudaStreamWaitEvent(s, ready, 0));
  CU_TRY("nccl", cudaEventDestroy(ready));
  switch (w->kind) {
    case SH_COLL_ALL_GATHER:
      NCCL_TRY(ncclAllGather(sh_tensor_data(w->in), sh_tensor_data(w->out), (size_t)sh_tensor_numel(w->in),
                             nccl_type(w->in->dtype), comm, s), "ncclAllGather");
      break;
    case SH_COLL_BROADCAST:
      NCCL_TRY(ncclBroadcast(sh_tensor_data(w->out), sh_tensor_data(w->out), (size_t)sh_tensor_numel(w->out),
                             nccl_type(w->out->dtype), w->root, comm, s), "ncclBroadcast");
      break;
    case SH_COLL_BARRIER: {   /* NCCL has no barrier: a one-element all-reduce is one */
      m->in_bytes = m->out_bytes = sizeof(float);
      m->stage_in = m->stage_out = sh_mem_alloc(m->device, sizeof(float), SH_TAG_COMM);
      if (!m->stage_in) return sh_fail_context("nccl barrier: ");
      CU_TRY("nccl barrier", cudaMemsetAsync(m->stage_in, 0, sizeof(float), s));
      NCCL_TRY(ncclAllReduce(m->stage_in, m->stage_in, 1, ncclFloat32, ncclSum, comm, s), "ncclAllReduce");
      break;
    }
    default:
      SH_TRY(post_reduction(w, m, comm, s));
  }
  CU_TRY("nccl", cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming));
  CU_TRY("nccl", cudaEventRecord(m->done, s));
  return SH_OK;
}

static int nccl_start(sh_comm_work *w) {
  nccl_work *m = (nccl_work *)calloc(1, sizeof *m);
  if (!m) return sh_fail(SH_ERR_OOM, "nccl: out of host memory for a request");
  int rc = post(w, m);
  if (rc) {
    /* Nothing was enqueued after a failure, or the group is broken anyway: free at once. */
    work_free_buffers(m);
    if (m->done) cudaEventDestroy(m->done);
    free(m);
    return rc;
  }
  w->state = m;
  return SH_OK;
}

static int nccl_test(sh_comm_work *w, int *done) {
  nccl_work *m = (nccl_work *)w->state;
  nccl_group *g = (nccl_group *)w->comm->gpu_state;
  ncclResult_t async_err = ncclSuccess;
  if (ncclCommGetAsyncError(g->comm, &async_err) == ncclSuccess && async_err != ncclSuccess && async_err != ncclInProgress) {
    ncclCommAbort(g->comm);
    g->aborted = 1;
    return nccl_fail(async_err, "nccl collective");
  }
  cudaError_t e = cudaEventQuery(m->done);
  if (e == cudaErrorNotReady) return SH_OK;
  if (e != cudaSuccess) return sh_cuda_fail("nccl wait", e, __FILE__, __LINE__);
  cudaEventDestroy(m->done);
  work_free_buffers(m);
  free(m);
  w->state = NULL;
  *done = 1;
  return SH_OK;
}

/* After a timeout: abort the communicator so the enqueued kernels return; its staging
 * buffers may still be written until then, so they are left allocated. */
static void nccl_abandon(sh_comm_work *w) {
  nccl_group *g = (nccl_group *)w->comm->gpu_state;
  if (g && !g->aborted) { ncclCommAbort(g->comm); g->aborted = 1; }
  free(w->state);
  w->state = NULL;
}

/* Collective over parent: an NCCL communicator for the child by ncclCommSplit. When the
 * parent has no MPI (torchrun-style world), this also decides the child's rank and size. */
static int nccl_split(sh_comm *parent, int color, int key, sh_comm *child) {
  if (!parent->gpu_state) {
    int device = 0;
    CU_TRY("nccl split", cudaGetDevice(&device));
    SH_TRY(ensure_group(parent, device));
  }
  nccl_group *pg = (nccl_group *)parent->gpu_state;
  ncclComm_t comm = NULL;
  NCCL_TRY(ncclCommSplit(pg->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, NULL), "ncclCommSplit");
  if (color < 0 || !comm) { child->size = 0; return SH_OK; }
  nccl_group *g = (nccl_group *)calloc(1, sizeof *g);
  if (!g) { ncclCommDestroy(comm); return sh_fail(SH_ERR_OOM, "nccl: out of host memory"); }
  g->comm = comm;
  g->device = pg->device;
  NCCL_TRY(ncclCommUserRank(comm, &child->rank), "ncclCommUserRank");
  NCCL_TRY(ncclCommCount(comm, &child->size), "ncclCommCount");
  child->gpu_state = g;
  return SH_OK;
}

static void nccl_destroy(sh_comm *c) {
  nccl_group *g = (nccl_group *)c->gpu_state;
  if (!g) return;
  if (!g->aborted) ncclCommDestroy(g->comm);
  free(g);
  c->gpu_state = NULL;
}

extern "C" const sh_comm_backend sh_comm_nccl_backend = {
  "nccl", nccl_start, nccl_test, nccl_abandon, nccl_split, nccl_destroy
};
