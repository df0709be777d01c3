/* comm_nccl.cu: the NCCL backend of runtime/comm for CUDA tensors (all NCCL code lives here).
 * A group's NCCL communicators are made on its first CUDA collective: the unique id travels
 * over the group's MPI communicator when it has one, else (the torchrun-style world) over a
 * TCP rendezvous near MASTER_ADDR:MASTER_PORT. Each group has two communicators, split once
 * at init: gathers and broadcasts run on one, on the device's all-gather stream, reductions
 * on the other, on its reduce-scatter stream. NCCL runs one communicator's collectives one
 * at a time, so with a single communicator a gather could never overlap a reduction. Every
 * rank issues the same collectives in the same order, so the two communicators see the same
 * order on every rank (NCCL's rule for several communicators, or a job may deadlock).
 *
 * A collective waits on the device for an event on the caller's current stream, so it sees
 * that stream's writes. Completion is an event on the collective's stream: sh_comm_work_order
 * makes another stream wait for it on the device, and then_begin/then_end run follow-up work
 * on the collective's own stream; the host waits only in sh_comm_wait (test() polls the event
 * and ncclCommGetAsyncError; comm.c's timeout aborts the communicators). bf16/f16 reductions
 * (and any explicit reduce dtype) go through f32 (or f64) staging buffers with cast kernels
 * around the NCCL call, so sums accumulate wide and round once; the staging buffers are freed
 * in the collective stream's order as soon as the work is queued. */
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
#include "dist/comm_internal.h"
#include <mutex>
#include <vector>

/* gather: all-gathers and broadcasts; reduce: reductions and barriers. */
struct nccl_group {
  ncclComm_t gather, reduce;
  int device;
  int aborted;
};

struct nccl_work {
  cudaEvent_t done;                /* recorded on stream after the collective (and then-work) */
  sh_cuda_stream *stream;          /* the collective's stream */
  sh_cuda_stream *saved;           /* the thread's current stream during then_begin/then_end */
  void *stage_in, *stage_out;      /* SH_TAG_COMM device buffers, or NULL */
  size_t in_bytes, out_bytes;
  int device;
};

/* Events for ordering collectives, reused: a collective takes one for its inputs and one for
 * its completion, so creating and destroying them would be two driver calls per collective.
 * An event goes back once no one will wait on it again (re-recording it later is legal even
 * while earlier waits are still queued: a wait binds to the record before it). Per device, since
 * an event belongs to the device current when it was made; they live as long as the process. */
enum { MAX_DEVICES = 16 };
static std::mutex event_lock;
static std::vector<cudaEvent_t> free_events[MAX_DEVICES];

/* An event of `device`, which is current. */
static int event_take(int device, cudaEvent_t *e) {
  {
    std::lock_guard<std::mutex> g(event_lock);
    std::vector<cudaEvent_t> &pool = free_events[device];
    if (!pool.empty()) { *e = pool.back(); pool.pop_back(); return SH_OK; }
  }
  CU_TRY("nccl", cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  return SH_OK;
}

static void event_give(int device, cudaEvent_t e) {
  std::lock_guard<std::mutex> g(event_lock);
  free_events[device].push_back(e);
}

static void abort_group(nccl_group *g) {
  if (g->aborted) return;
  ncclCommAbort(g->gather);
  if (g->reduce) ncclCommAbort(g->reduce);
  g->aborted = 1;
}

static int nccl_fail(ncclResult_t r, const char *what) {
  return sh_fail(SH_ERR_COMM, "%s failed: %s", what, ncclGetErrorString(r));
}
#define NCCL_TRY(call, what) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) return nccl_fail(r_, what); } while (0)

/* ---- bootstrap ------------------------------------------------------------------------- */

/* A torchrun-style launcher keeps its own store on MASTER_PORT, so rank 0 serves the id on
 * the first port it can bind among the next RENDEZVOUS_PORTS ones, and the others try them
 * in turn. A token made from the job's variables tells our server from another job's. */
enum { RENDEZVOUS_PORTS = 32 };

struct rendezvous_msg { char magic[8]; uint64_t token; ncclUniqueId id; };

static uint64_t job_token(const sh_comm *c, const char *addr, const char *port) {
  const char *run = getenv("TORCHELASTIC_RUN_ID");
  char key[512];
  snprintf(key, sizeof key, "%s:%s:%d:%s", addr, port, c->size, run ? run : "");
  uint64_t h = 1469598103934665603ull;   /* FNV-1a */
  for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

static int serve_id(sh_comm *c, const rendezvous_msg *msg, int base_port, double t0) {
  int s = -1, port = 0;
  for (int k = 1; k <= RENDEZVOUS_PORTS && s < 0; k++) {
    s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return sh_fail(SH_ERR_COMM, "nccl bootstrap: socket: %s", strerror(errno));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons((uint16_t)(base_port + k));
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, c->size)) { close(s); s = -1; continue; }
    port = base_port + k;
  }
  if (s < 0)
    return sh_fail(SH_ERR_COMM, "nccl bootstrap: rank 0 cannot listen on any port from %d to %d (MASTER_PORT + 1..%d)",
                   base_port + 1, base_port + RENDEZVOUS_PORTS, RENDEZVOUS_PORTS);
  for (int served = 1; served < c->size;) {
    struct pollfd pfd = { s, POLLIN, 0 };
    int left_ms = (int)((c->timeout - (sh_comm_now() - t0)) * 1000);
    if (left_ms <= 0 || poll(&pfd, 1, left_ms) <= 0) {
      close(s);
      return sh_fail(SH_ERR_COMM, "nccl bootstrap of %s timed out on rank 0: %d of %d ranks fetched the id from port %d",
                     c->name, served, c->size, port);
    }
    int peer = accept(s, NULL, NULL);
    if (peer < 0) continue;
    char ack = 0;
    struct pollfd ppfd = { peer, POLLIN, 0 };
    if (send(peer, msg, sizeof *msg, MSG_NOSIGNAL) == (ssize_t)sizeof *msg && poll(&ppfd, 1, 5000) == 1 &&
        recv(peer, &ack, 1, 0) == 1 && ack == 1)
      served++;
    close(peer);
  }
  close(s);
  return SH_OK;
}

/* Connects to each candidate port of MASTER_ADDR until one serves this job's id. */
static int fetch_id(sh_comm *c, rendezvous_msg *want, const char *addr, int base_port, double t0) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr, NULL, &hints, &res) || !res)
    return sh_fail(SH_ERR_COMM, "nccl bootstrap: cannot resolve MASTER_ADDR %s", addr);
  struct sockaddr_in sa = *(struct sockaddr_in *)res->ai_addr;
  freeaddrinfo(res);
  for (;;) {
    for (int k = 1; k <= RENDEZVOUS_PORTS; k++) {
      sa.sin_port = htons((uint16_t)(base_port + k));
      int s = socket(AF_INET, SOCK_STREAM, 0);
      if (s < 0) continue;
      rendezvous_msg got;
      size_t n = 0;
      if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0) {
        struct pollfd pfd = { s, POLLIN, 0 };
        while (n < sizeof got && poll(&pfd, 1, 2000) == 1) {
          ssize_t r = recv(s, (char *)&got + n, sizeof got - n, 0);
          if (r <= 0) break;
          n += (size_t)r;
        }
      }
      int ours = n == sizeof got && !memcmp(got.magic, want->magic, sizeof got.magic) && got.token == want->token;
      char ack = ours ? 1 : 0;
      if (n == sizeof got) send(s, &ack, 1, MSG_NOSIGNAL);
      close(s);
      if (ours) { want->id = got.id; return SH_OK; }
    }
    if (sh_comm_now() - t0 > c->timeout)
      return sh_fail(SH_ERR_COMM, "nccl bootstrap of %s timed out on rank %d: no id from %s ports %d..%d",
                     c->name, c->rank, addr, base_port + 1, base_port + RENDEZVOUS_PORTS);
    usleep(100000);
  }
}

static int tcp_rendezvous(sh_comm *c, ncclUniqueId *id) {
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (!addr || !port)
    return sh_fail(SH_ERR_COMM, "nccl bootstrap of %s: MASTER_ADDR and MASTER_PORT must be set (torchrun-style launch)", c->name);
  int base = atoi(port);
  if (base <= 0 || base + RENDEZVOUS_PORTS > 65535)
    return sh_fail(SH_ERR_COMM, "nccl bootstrap: MASTER_PORT %s is not a port below %d", port, 65535 - RENDEZVOUS_PORTS);
  rendezvous_msg msg;
  memcpy(msg.magic, "shardid1", 8);
  msg.token = job_token(c, addr, port);
  msg.id = *id;
  double t0 = sh_comm_now();
  if (c->rank == 0) return serve_id(c, &msg, base, t0);
  SH_TRY(fetch_id(c, &msg, addr, base, t0));
  *id = msg.id;
  return SH_OK;
}

/* The reduction communicator: a split of the gather one, made once with it. */
static int add_reduce_comm(nccl_group *g, int rank) {
  NCCL_TRY(ncclCommSplit(g->gather, 0, rank, &g->reduce, NULL), "ncclCommSplit (reduction communicator)");
  return SH_OK;
}

static int new_group(sh_comm *c, ncclComm_t gather, int device) {
  nccl_group *g = (nccl_group *)calloc(1, sizeof *g);
  if (!g) { ncclCommDestroy(gather); return sh_fail(SH_ERR_OOM, "nccl: out of host memory"); }
  g->gather = gather;
  g->device = device;
  int rc = add_reduce_comm(g, c->rank);
  if (rc) { ncclCommDestroy(gather); free(g); return rc; }
  c->gpu_state = g;
  return SH_OK;
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
  memset(&id, 0, sizeof id);
  if (c->rank == 0) NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (c->size > 1) {
    if (c->cpu == &sh_comm_mpi_backend) SH_TRY(sh_comm_mpi_bcast_bytes(c, &id, (int)sizeof id, 0));
    else if (c->is_world) SH_TRY(tcp_rendezvous(c, &id));
    else return sh_fail(SH_ERR_COMM, "nccl: group %s has neither MPI nor a parent with NCCL to bootstrap from "
                        "(run a CUDA collective on the parent before splitting it)", c->name);
  }
  ncclComm_t comm;
  NCCL_TRY(ncclCommInitRank(&comm, c->size, id, c->rank), "ncclCommInitRank");
  return new_group(c, comm, device);
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

/* Makes s the thread's current stream on its device until the scope ends. */
struct stream_scope {
  sh_cuda_stream *saved = NULL;
  stream_scope(int device, sh_cuda_stream *s) { sh_cuda_current_stream(&saved, device); sh_cuda_set_stream(s); }
  ~stream_scope() { if (saved) sh_cuda_set_stream(saved); }
};

/* The staging buffers are only touched by work queued on m->stream: freed in its order. */
static void free_staging(nccl_work *m) {
  if (!m->stage_in) return;
  stream_scope on(m->device, m->stream);
  sh_mem_free(m->device, m->stage_in, m->in_bytes, SH_TAG_COMM);
  if (m->stage_out != m->stage_in) sh_mem_free(m->device, m->stage_out, m->out_bytes, SH_TAG_COMM);
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

/* all_to_all: block q of in to rank q, block p of out from rank p, as bytes; one send and one
 * receive per peer in a group (NCCL has no all-to-all collective). It moves and sums nothing,
 * so it goes where the reductions go that it stands in for (deterministic mode's). */
static int post_all_to_all(sh_comm_work *w, ncclComm_t comm, cudaStream_t s) {
  int n = w->comm->size;
  size_t block = (size_t)(sh_tensor_numel(w->in) / n) * (size_t)sh_dtype_size(w->in->dtype);
  const char *in = (const char *)sh_tensor_data(w->in);
  char *out = (char *)sh_tensor_data(w->out);
  NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  for (int q = 0; q < n && r == ncclSuccess; q++) {
    r = ncclSend(in + q * block, block, ncclInt8, q, comm, s);
    if (r == ncclSuccess) r = ncclRecv(out + q * block, block, ncclInt8, q, comm, s);
  }
  ncclResult_t e = ncclGroupEnd();   /* always closed, whatever failed inside */
  NCCL_TRY(r, "ncclSend/ncclRecv (all_to_all)");
  NCCL_TRY(e, "ncclGroupEnd (all_to_all)");
  return SH_OK;
}

static int post(sh_comm_work *w, nccl_work *m) {
  sh_comm *c = w->comm;
  const sh_tensor *any = w->in ? w->in : w->out;
  if (any) m->device = any->device;
  else CU_TRY("nccl barrier", cudaGetDevice(&m->device));
  SH_TRY(ensure_group(c, m->device));
  nccl_group *g = (nccl_group *)c->gpu_state;
  cudaStream_t caller;
  SH_TRY(sh_cuda_enter("nccl", m->device, &caller));
  int gathers = w->kind == SH_COLL_ALL_GATHER || w->kind == SH_COLL_BROADCAST;
  ncclComm_t comm = gathers ? g->gather : g->reduce;
  SH_TRY(sh_cuda_stream_get(&m->stream, m->device, gathers ? SH_STREAM_ALL_GATHER : SH_STREAM_REDUCE_SCATTER));
  cudaStream_t s = sh_cuda_stream_raw(m->stream);
  /* The collective must see everything the caller's stream wrote into its inputs. */
  if (caller != s) {
    cudaEvent_t ready;
    SH_TRY(event_take(m->device, &ready));
    cudaError_t e = cudaEventRecord(ready, caller);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, ready, 0);
    event_give(m->device, ready);   /* s's wait is bound to this record */
    CU_TRY("nccl", e);
  }
  /* Staging memory is allocated and freed in the collective stream's order, so reusing it
   * never makes the caller's stream wait for a collective. */
  stream_scope on(m->device, m->stream);
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
    case SH_COLL_ALL_TO_ALL:
      SH_TRY(post_all_to_all(w, comm, s));
      break;
    default:
      SH_TRY(post_reduction(w, m, comm, s));
  }
  SH_TRY(event_take(m->device, &m->done));
  CU_TRY("nccl", cudaEventRecord(m->done, s));
  free_staging(m);
  return SH_OK;
}

static void work_free(nccl_work *m) {
  free_staging(m);
  if (m->done) event_give(m->device, m->done);   /* its waits are queued, its test answered */
  free(m);
}

static int nccl_start(sh_comm_work *w) {
  nccl_work *m = (nccl_work *)calloc(1, sizeof *m);
  if (!m) return sh_fail(SH_ERR_OOM, "nccl: out of host memory for a request");
  int rc = post(w, m);
  if (rc) { work_free(m); return rc; }   /* nothing was queued, or the group is broken anyway */
  w->state = m;
  return SH_OK;
}

/* An error NCCL reported asynchronously aborts the group's communicators. */
static int check_async(sh_comm *c) {
  nccl_group *g = (nccl_group *)c->gpu_state;
  ncclResult_t e = ncclSuccess;
  if (g->aborted) return sh_fail(SH_ERR_COMM, "nccl: group %s was aborted after an error or timeout", c->name);
  ncclComm_t comms[2] = { g->gather, g->reduce };
  for (int i = 0; i < 2; i++)
    if (ncclCommGetAsyncError(comms[i], &e) == ncclSuccess && e != ncclSuccess && e != ncclInProgress) {
      abort_group(g);
      return nccl_fail(e, "nccl collective");
    }
  return SH_OK;
}

static int nccl_test(sh_comm_work *w, int *done) {
  nccl_work *m = (nccl_work *)w->state;
  SH_TRY(check_async(w->comm));
  cudaError_t e = cudaEventQuery(m->done);
  if (e == cudaErrorNotReady) return SH_OK;
  if (e != cudaSuccess) return sh_cuda_fail("nccl wait", e, __FILE__, __LINE__);
  work_free(m);
  w->state = NULL;
  *done = 1;
  return SH_OK;
}

/* The caller's current stream waits for the collective on the device; the host never does. */
static int nccl_order(sh_comm_work *w) {
  nccl_work *m = (nccl_work *)w->state;
  SH_TRY(check_async(w->comm));
  cudaStream_t caller;
  SH_TRY(sh_cuda_enter("nccl order", m->device, &caller));
  if (caller != sh_cuda_stream_raw(m->stream)) CU_TRY("nccl order", cudaStreamWaitEvent(caller, m->done, 0));
  work_free(m);
  w->state = NULL;
  return SH_OK;
}

static int nccl_then_begin(sh_comm_work *w) {
  nccl_work *m = (nccl_work *)w->state;
  if (m->saved) return sh_fail(SH_ERR_ARG, "nccl: then_begin twice on %s", w->what);
  SH_TRY(sh_cuda_current_stream(&m->saved, m->device));
  return sh_cuda_set_stream(m->stream);
}

static int nccl_then_end(sh_comm_work *w) {
  nccl_work *m = (nccl_work *)w->state;
  if (!m->saved) return sh_fail(SH_ERR_ARG, "nccl: then_end without then_begin on %s", w->what);
  int rc = sh_cuda_set_stream(m->saved);
  m->saved = NULL;
  SH_TRY(rc);
  CU_TRY("nccl", cudaEventRecord(m->done, sh_cuda_stream_raw(m->stream)));
  return SH_OK;
}

/* After a timeout: abort the communicators so the enqueued kernels return; their buffers may
 * still be written until then, so they are left allocated. */
static void nccl_abandon(sh_comm_work *w) {
  nccl_group *g = (nccl_group *)w->comm->gpu_state;
  if (g) abort_group(g);
  free(w->state);
  w->state = NULL;
}

/* Collective over parent: NCCL communicators for the child by ncclCommSplit. When the parent
 * has no MPI (torchrun-style world), this also decides the child's rank and size. */
static int nccl_split(sh_comm *parent, int color, int key, sh_comm *child) {
  if (!parent->gpu_state) {
    int device = 0;
    CU_TRY("nccl split", cudaGetDevice(&device));
    SH_TRY(ensure_group(parent, device));
  }
  nccl_group *pg = (nccl_group *)parent->gpu_state;
  ncclComm_t comm = NULL;
  NCCL_TRY(ncclCommSplit(pg->gather, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, NULL), "ncclCommSplit");
  if (color < 0 || !comm) { child->size = 0; return SH_OK; }
  NCCL_TRY(ncclCommUserRank(comm, &child->rank), "ncclCommUserRank");
  NCCL_TRY(ncclCommCount(comm, &child->size), "ncclCommCount");
  return new_group(child, comm, pg->device);
}

static void nccl_destroy(sh_comm *c) {
  nccl_group *g = (nccl_group *)c->gpu_state;
  if (!g) return;
  if (!g->aborted) {
    if (g->reduce) ncclCommDestroy(g->reduce);
    ncclCommDestroy(g->gather);
  }
  free(g);
  c->gpu_state = NULL;
}

extern "C" const sh_comm_backend sh_comm_nccl_backend = {
  .name = "nccl", .start = nccl_start, .test = nccl_test, .abandon = nccl_abandon, .split = nccl_split,
  .destroy = nccl_destroy, .order = nccl_order, .then_begin = nccl_then_begin, .then_end = nccl_then_end,
};
