/* lib_nccl.cpp: the emulator's NCCL (tests/cuda_emu/nccl.cpp) with ranks as forked processes:
 * every collective, data type and reduction against a host reference (counts per rank as NCCL
 * defines them, bf16 sums rounded once), several rounds per collective (a small
 * SHARD_EMU_NCCL_CHUNK_BYTES), in place and the overlap refusal, roots, ncclCommSplit (colors,
 * key order, NCCL_SPLIT_NOCOLOR), stream order behind a kernel, group calls, ncclCommAbort, a
 * dead peer, a timeout, ranks disagreeing on one communicator, two ranks issuing on two
 * communicators in opposite orders on one stream (the deadlock diagnosis), communicators
 * progressing independently (no order between two but the streams'), the issue-order record,
 * ncclSend/ncclRecv (an all-to-all of uneven sizes, a lone pair, mismatched sizes refused).
 * Each scenario forks N ranks (N = 2, 3, 4 for the data checks); each rank counts its own
 * checks and sends them to the parent, which also fails a scenario whose ranks hang. */
#include <nccl.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "emu_api.h"
#include "emu_fpconv.h"
#include "tests/lib_check.h"

/* ---- forking ranks ------------------------------------------------------------------- */

typedef std::function<void(int rank, int n, ncclUniqueId id)> rank_fn;

/* Runs fn on n forked ranks; `dies` is a rank that is expected to exit without a report. */
static void ranks(const char *name, int n, rank_fn fn, int dies = -1, double limit_s = 15) {
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  fflush(stdout);
  std::vector<pid_t> pids(n);
  std::vector<int> fds(n);
  for (int r = 0; r < n; r++) {
    int p[2];
    if (pipe(p) != 0) { perror("pipe"); exit(2); }
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      lib_passed = lib_failed = 0;
      fn(r, n, id);
      int res[2] = {lib_passed, lib_failed};
      if (write(p[1], res, sizeof res) != (ssize_t)sizeof res) _exit(3);
      fflush(stdout);
      fflush(stderr);
      exit(0);   /* atexit handlers run (SHARD_EMU_NCCL_TRACE) */
    }
    close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  /* Every rank must be done within the limit: a hang is a failure, not a stuck test run. */
  double waited = 0;
  std::vector<bool> done(n, false);
  int left = n;
  while (left > 0 && waited < limit_s) {
    for (int r = 0; r < n; r++) {
      int st;
      if (!done[r] && waitpid(pids[r], &st, WNOHANG) == pids[r]) { done[r] = true; left--; }
    }
    if (left) { usleep(10000); waited += 0.01; }
  }
  CHECK(left == 0, "%s: %d rank(s) still running after %g s (hang)", name, left, limit_s);
  for (int r = 0; r < n; r++) {
    if (!done[r]) { kill(pids[r], SIGKILL); waitpid(pids[r], nullptr, 0); }
    int res[2] = {0, 0};
    ssize_t got = read(fds[r], res, sizeof res);
    close(fds[r]);
    if (r == dies) continue;
    CHECK(got == (ssize_t)sizeof res, "%s: rank %d of %d sent no result (crashed?)", name, r, n);
    lib_passed += res[0];
    lib_failed += res[1];
  }
}

/* ---- typed host values ---------------------------------------------------------------- */

static const ncclDataType_t ALL_TYPES[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64,
                                           ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
static const char *const TNAME[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16"};
static size_t tsize(ncclDataType_t t) {
  static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return s[t];
}
static bool is_float(ncclDataType_t t) { return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16; }
static bool is_unsigned(ncclDataType_t t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }

static void put(ncclDataType_t t, std::vector<char> &b, size_t i, double v) {
  char *p = b.data() + i * tsize(t);
  switch (t) {
    case ncclInt8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case ncclUint8: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case ncclInt32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case ncclInt64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case ncclFloat16: { uint16_t x = emu_fp::from_f64(v, emu_fp::HALF, emu_fp::RN); memcpy(p, &x, 2); break; }
    case ncclBfloat16: { uint16_t x = emu_fp::from_f64(v, emu_fp::BF16, emu_fp::RN); memcpy(p, &x, 2); break; }
    case ncclFloat32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case ncclFloat64: memcpy(p, &v, 8); break;
    default: break;
  }
}
static double get(ncclDataType_t t, const std::vector<char> &b, size_t i) {
  const char *p = b.data() + i * tsize(t);
  switch (t) {
    case ncclInt8: { int8_t x; memcpy(&x, p, 1); return x; }
    case ncclUint8: { uint8_t x; memcpy(&x, p, 1); return x; }
    case ncclInt32: { int32_t x; memcpy(&x, p, 4); return x; }
    case ncclUint32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case ncclInt64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclUint64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclFloat16: { uint16_t x; memcpy(&x, p, 2); return emu_fp::half_to_f32(x); }
    case ncclBfloat16: { uint16_t x; memcpy(&x, p, 2); return emu_fp::bf16_to_f32(x); }
    case ncclFloat32: { float x; memcpy(&x, p, 4); return x; }
    case ncclFloat64: { double x; memcpy(&x, p, 8); return x; }
    default: return 0;
  }
}
/* The value a rank holds at element i: small integers, exact in every type. */
static double val(ncclDataType_t t, int op, int rank, size_t i) {
  if (op == ncclProd) return (double)((rank + i) % 3 + 1);
  double v = (double)((rank * 7 + i * 3) % 11);
  return is_unsigned(t) ? v : v - 5;
}
/* The reference: reduce in double (exact here), the average as the emulator documents it
 * (integer division for integers, the sum divided in f32 / f64 and rounded once). */
static double ref(ncclDataType_t t, int op, int n, size_t i) {
  double a = val(t, op, 0, i);
  for (int r = 1; r < n; r++) {
    double v = val(t, op, r, i);
    if (op == ncclSum || op == ncclAvg) a += v;
    else if (op == ncclProd) a *= v;
    else if (op == ncclMax) a = std::max(a, v);
    else a = std::min(a, v);
  }
  if (op == ncclAvg) {
    if (!is_float(t)) a = (double)(long long)(a / n);
    else if (t == ncclFloat64) a = a / n;
    else a = (float)a / (float)n;
    std::vector<char> b(8);
    put(t, b, 0, a);
    a = get(t, b, 0);
  }
  return a;
}

static void *dev_bytes(const std::vector<char> &h) {
  void *d = nullptr;
  cudaMalloc(&d, h.size() ? h.size() : 1);
  if (!h.empty()) cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice);
  return d;
}
static std::vector<char> host_bytes(const void *d, size_t n) {
  std::vector<char> h(n);
  if (n) cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost);
  return h;
}

static ncclComm_t world(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = nullptr;
  ncclResult_t r = ncclCommInitRank(&c, n, id, rank);
  CHECK(r == ncclSuccess && c, "rank %d: ncclCommInitRank: %s", rank, ncclGetErrorString(r));
  return c;
}

/* ---- every op and type ---------------------------------------------------------------- */

static void check_all_ops(int rank, int n, ncclUniqueId id) {
  setenv("SHARD_EMU_NCCL_CHUNK_BYTES", "64", 1);   /* several rounds per collective */
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  cudaStream_t s;
  cudaStreamCreate(&s);
  const size_t cnt = 37;
  const int OPS[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  for (ncclDataType_t t : ALL_TYPES) {
    size_t es = tsize(t);
    for (int op : OPS) {
      /* all-reduce */
      std::vector<char> in(cnt * es);
      for (size_t i = 0; i < cnt; i++) put(t, in, i, val(t, op, rank, i));
      void *d_in = dev_bytes(in), *d_out = dev_bytes(std::vector<char>(cnt * es, 0));
      ncclResult_t r = ncclAllReduce(d_in, d_out, cnt, t, (ncclRedOp_t)op, c, s);
      std::vector<char> out = host_bytes(d_out, cnt * es);
      int bad = 0;
      for (size_t i = 0; i < cnt; i++) bad += get(t, out, i) != ref(t, op, n, i);
      CHECK(r == ncclSuccess && bad == 0, "n=%d rank %d all_reduce %s op %d: %d wrong (r=%d; [0] = %g, expected %g)", n, rank,
            TNAME[t], op, bad, r, get(t, out, 0), ref(t, op, n, 0));
      cudaFree(d_in);
      cudaFree(d_out);
      /* reduce-scatter: recvcount per rank; this rank's block of the reduction of n blocks */
      const size_t rc = 11;
      std::vector<char> rin(n * rc * es);
      for (size_t i = 0; i < n * rc; i++) put(t, rin, i, val(t, op, rank, i));
      d_in = dev_bytes(rin);
      d_out = dev_bytes(std::vector<char>(rc * es, 0));
      r = ncclReduceScatter(d_in, d_out, rc, t, (ncclRedOp_t)op, c, s);
      out = host_bytes(d_out, rc * es);
      bad = 0;
      for (size_t i = 0; i < rc; i++) bad += get(t, out, i) != ref(t, op, n, rank * rc + i);
      CHECK(r == ncclSuccess && bad == 0, "n=%d rank %d reduce_scatter %s op %d: %d wrong", n, rank, TNAME[t], op, bad);
      cudaFree(d_in);
      cudaFree(d_out);
      /* reduce to every root */
      if (op == ncclSum || op == ncclMin)
        for (int root = 0; root < n; root++) {
          d_in = dev_bytes(in);
          std::vector<char> sentinel(cnt * es, 0);
          d_out = dev_bytes(sentinel);
          r = ncclReduce(d_in, d_out, cnt, t, (ncclRedOp_t)op, root, c, s);
          out = host_bytes(d_out, cnt * es);
          bad = 0;
          for (size_t i = 0; i < cnt; i++) bad += get(t, out, i) != (rank == root ? ref(t, op, n, i) : 0);
          CHECK(r == ncclSuccess && bad == 0, "n=%d rank %d reduce %s op %d root %d: %d wrong", n, rank, TNAME[t], op, root, bad);
          cudaFree(d_in);
          cudaFree(d_out);
        }
    }
    /* all-gather: sendcount per rank, rank p's block at p * sendcount */
    const size_t sc = 13;
    std::vector<char> gin(sc * es);
    for (size_t i = 0; i < sc; i++) put(t, gin, i, val(t, ncclSum, rank, i));
    void *d_in = dev_bytes(gin), *d_out = dev_bytes(std::vector<char>(n * sc * es, 0));
    ncclResult_t r = ncclAllGather(d_in, d_out, sc, t, c, s);
    std::vector<char> out = host_bytes(d_out, n * sc * es);
    int bad = 0;
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < sc; i++) bad += get(t, out, p * sc + i) != val(t, ncclSum, p, i);
    CHECK(r == ncclSuccess && bad == 0, "n=%d rank %d all_gather %s: %d wrong", n, rank, TNAME[t], bad);
    cudaFree(d_in);
    cudaFree(d_out);
    /* broadcast from every root (non-roots pass no send buffer: only the root's is read) */
    for (int root = 0; root < n; root++) {
      d_in = rank == root ? dev_bytes(gin) : nullptr;
      d_out = dev_bytes(std::vector<char>(sc * es, 0));
      r = ncclBroadcast(d_in, d_out, sc, t, root, c, s);
      out = host_bytes(d_out, sc * es);
      bad = 0;
      for (size_t i = 0; i < sc; i++) bad += get(t, out, i) != val(t, ncclSum, root, i);
      CHECK(r == ncclSuccess && bad == 0, "n=%d rank %d broadcast %s root %d: %d wrong", n, rank, TNAME[t], root, bad);
      if (d_in) cudaFree(d_in);
      cudaFree(d_out);
    }
  }
  /* bf16 sums accumulate in f32 and round once: 1 + (n-1) * 2^-8, where adding in bf16 would
   * round every partial sum back to 1. */
  {
    std::vector<char> in(2), want(2);
    put(ncclBfloat16, in, 0, rank == 0 ? 1.0 : 1.0 / 256);
    put(ncclBfloat16, want, 0, 1.0 + (n - 1) / 256.0);
    void *d = dev_bytes(in);
    ncclAllReduce(d, d, 1, ncclBfloat16, ncclSum, c, s);
    std::vector<char> out = host_bytes(d, 2);
    CHECK(get(ncclBfloat16, out, 0) == get(ncclBfloat16, want, 0) && (n < 3 || get(ncclBfloat16, out, 0) > 1.0),
          "n=%d bf16 sum rounded once: got %.9g, expected %.9g", n, get(ncclBfloat16, out, 0), get(ncclBfloat16, want, 0));
    cudaFree(d);
  }
  ncclResult_t ae = ncclInternalError;
  CHECK(ncclCommGetAsyncError(c, &ae) == ncclSuccess && ae == ncclSuccess, "async error %d after the op checks", ae);
  ncclCommDestroy(c);
  cudaStreamDestroy(s);
}

/* ---- in place, overlap, bad pointers ------------------------------------------------- */

static void check_in_place(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  cudaStream_t s;
  cudaStreamCreate(&s);
  const size_t k = 8;
  std::vector<float> h(n * k);
  for (size_t i = 0; i < h.size(); i++) h[i] = (float)(rank * 100 + i);
  float *d;
  cudaMalloc((void **)&d, n * k * 4);
  /* all-gather in place: sendbuff = recvbuff + rank * sendcount */
  cudaMemcpy(d + rank * k, h.data(), k * 4, cudaMemcpyHostToDevice);
  CHECK(ncclAllGather(d + rank * k, d, k, ncclFloat32, c, s) == ncclSuccess, "in-place all_gather refused");
  std::vector<float> o(n * k);
  cudaMemcpy(o.data(), d, n * k * 4, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < k; i++) bad += o[p * k + i] != (float)(p * 100 + i);
  CHECK(bad == 0, "in-place all_gather: %d wrong", bad);
  /* reduce-scatter in place: recvbuff = sendbuff + rank * recvcount */
  cudaMemcpy(d, h.data(), n * k * 4, cudaMemcpyHostToDevice);
  CHECK(ncclReduceScatter(d, d + rank * k, k, ncclFloat32, ncclSum, c, s) == ncclSuccess, "in-place reduce_scatter refused");
  cudaMemcpy(o.data(), d, n * k * 4, cudaMemcpyDeviceToHost);
  bad = 0;
  for (size_t i = 0; i < k; i++) {
    float want = 0;
    for (int p = 0; p < n; p++) want += (float)(p * 100 + rank * k + i);
    bad += o[rank * k + i] != want;
  }
  CHECK(bad == 0, "in-place reduce_scatter: %d wrong", bad);
  /* all-reduce and broadcast in place */
  cudaMemcpy(d, h.data(), k * 4, cudaMemcpyHostToDevice);
  CHECK(ncclAllReduce(d, d, k, ncclFloat32, ncclMax, c, s) == ncclSuccess, "in-place all_reduce refused");
  CHECK(ncclBroadcast(d, d, k, ncclFloat32, n - 1, c, s) == ncclSuccess, "in-place broadcast refused");
  cudaMemcpy(o.data(), d, k * 4, cudaMemcpyDeviceToHost);
  CHECK(o[3] == (float)((n - 1) * 100 + 3), "in-place all_reduce + broadcast: %g", o[3]);
  /* any other overlap is refused at the call, nothing queued */
  long before = shard_emu_nccl_collectives();
  CHECK(ncclAllReduce(d + 1, d, k, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument &&
        strstr(shard_emu_nccl_last_report(), "overlap"), "overlapping all_reduce: %s", shard_emu_nccl_last_report());
  CHECK(ncclAllGather(d + 1, d, 2, ncclFloat32, c, s) == ncclInvalidArgument, "overlapping all_gather accepted");
  CHECK(ncclReduceScatter(d, d + 1, 2, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument, "overlapping reduce_scatter accepted");
  CHECK(ncclBroadcast(d, d + 1, k, ncclFloat32, rank, c, s) == ncclInvalidArgument, "overlapping broadcast accepted at its root");
  /* host memory, a buffer too small, NULL */
  std::vector<float> hostbuf(k);
  CHECK(ncclAllReduce(hostbuf.data(), d, k, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument &&
        strstr(shard_emu_nccl_last_report(), "ncclAllReduce"), "host sendbuff: %s", shard_emu_nccl_last_report());
  CHECK(ncclAllGather(d, d + n * k - 1, 2, ncclFloat32, c, s) == ncclInvalidArgument, "short recvbuff accepted");
  CHECK(ncclAllReduce(d, d, k, ncclFloat32, ncclSum, nullptr, s) == ncclInvalidArgument, "NULL comm accepted");
  CHECK(ncclBroadcast(d, d, k, ncclFloat32, n, c, s) == ncclInvalidArgument, "root out of range accepted");
  CHECK(shard_emu_nccl_collectives() == before, "refused calls counted as collectives");
  cudaStreamSynchronize(s);
  CHECK(cudaGetLastError() == cudaSuccess, "a refused NCCL call left a CUDA error");
  ncclCommDestroy(c);
  cudaFree(d);
}

/* ---- stream order, group calls, trace ------------------------------------------------- */

static __global__ void fill_kernel(float *p, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

static void check_stream_order_group_trace(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  cudaStream_t s1, s2;
  cudaStreamCreate(&s1);
  cudaStreamCreate(&s2);
  float *a, *b;
  cudaMalloc((void **)&a, 64 * 4);   /* NaN until the kernel writes it */
  cudaMalloc((void **)&b, 64 * 4);
  /* queued behind a kernel on its stream: it must see the kernel's output */
  emu::launch(fill_kernel, "fill_kernel", __FILE__, __LINE__, dim3(1), dim3(64), 0, s1)(a, 64, (float)(rank + 1));
  CHECK(ncclAllReduce(a, b, 64, ncclFloat32, ncclSum, c, s1) == ncclSuccess, "all_reduce behind a kernel");
  std::vector<float> o(64);
  cudaMemcpy(o.data(), b, 256, cudaMemcpyDeviceToHost);
  CHECK(o[0] == n * (n + 1) / 2.0f && o[63] == o[0], "all_reduce behind a kernel: %g (expected %g)", o[0], n * (n + 1) / 2.0);
  /* two communicators in opposite orders inside a group: no deadlock */
  ncclComm_t x = nullptr, y = nullptr;
  ncclCommSplit(c, 0, rank, &x, nullptr);
  ncclCommSplit(c, 0, rank, &y, nullptr);
  cudaMemcpy(a, std::vector<float>(64, (float)rank).data(), 256, cudaMemcpyHostToDevice);
  ncclGroupStart();
  ncclGroupStart();   /* nested: launched at the outermost end */
  if (rank == 0) {
    ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, x, s1);
    ncclAllReduce(a + 8, b + 8, 8, ncclFloat32, ncclMax, y, s2);
  } else {
    ncclAllReduce(a + 8, b + 8, 8, ncclFloat32, ncclMax, y, s2);
    ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, x, s1);
  }
  ncclGroupEnd();
  ncclResult_t r = ncclGroupEnd();
  cudaDeviceSynchronize();
  cudaMemcpy(o.data(), b, 256, cudaMemcpyDeviceToHost);
  ncclResult_t ex = ncclInternalError, ey = ncclInternalError;
  ncclCommGetAsyncError(x, &ex);
  ncclCommGetAsyncError(y, &ey);
  CHECK(r == ncclSuccess && ex == ncclSuccess && ey == ncclSuccess && o[0] == n * (n - 1) / 2.0f && o[8] == n - 1,
        "group in opposite orders: r=%d errors %d %d, %g %g", r, ex, ey, o[0], o[8]);
  /* the issue-order record */
  CHECK(shard_emu_nccl_comm_inits() == 3, "comm inits %ld, expected 3", shard_emu_nccl_comm_inits());
  CHECK(shard_emu_nccl_collectives() == 3, "collectives %ld, expected 3", shard_emu_nccl_collectives());
  char path[128];
  snprintf(path, sizeof path, "/tmp/lib_nccl_trace.%d", (int)getpid());
  CHECK(shard_emu_nccl_trace_dump(path) == 0, "trace dump failed");
  FILE *f = fopen(path, "r");
  std::vector<std::string> lines;
  char line[512];
  while (f && fgets(line, sizeof line, f)) lines.push_back(line);
  if (f) fclose(f);
  unlink(path);
  CHECK(lines.size() == 3, "trace has %zu lines", lines.size());
  /* "1 b358660c:world #1 ...": the job's id prefix names the communicator across ranks */
  for (std::string &l : lines) {
    size_t sp = l.find(' '), colon = l.find(':');
    CHECK(colon == sp + 9, "trace line without a job prefix: %s", l.c_str());
    if (colon == sp + 9) l = l.substr(0, sp + 1) + l.substr(colon + 1);
  }
  if (lines.size() == 3) {
    CHECK(lines[0] == "1 world #1 all_reduce count=64 dtype=float32 op=sum\n", "trace line 1: %s", lines[0].c_str());
    const char *first = rank == 0 ? "2 world/split1/color0 #1 all_reduce count=8 dtype=float32 op=sum\n"
                                  : "2 world/split2/color0 #1 all_reduce count=8 dtype=float32 op=max\n";
    CHECK(lines[1] == first, "trace line 2: %s", lines[1].c_str());
  }
  ncclCommDestroy(x);
  ncclCommDestroy(y);
  ncclCommDestroy(c);
}

/* ---- CUDA graphs ----------------------------------------------------------------------- */

/* A collective captured into a graph (with a group of two on a side stream that joined the
 * capture) runs at each launch, on the inputs of that launch, numbered on its communicator
 * then: nothing at the capture; eager collectives after the launches follow them. */
static void check_graph(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  cudaStream_t s, side;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t fork, join;
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  float *a, *b, *g2;
  cudaMalloc((void **)&a, 64 * 4);
  cudaMalloc((void **)&b, 64 * 4);
  cudaMalloc((void **)&g2, 64 * 4 * n);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  CHECK(ncclAllReduce(a, b, 64, ncclFloat32, ncclSum, c, s) == ncclSuccess, "captured all_reduce");
  cudaEventRecord(fork, s);
  cudaStreamWaitEvent(side, fork, 0);
  ncclGroupStart();
  ncclAllGather(b, g2, 32, ncclFloat32, c, side);
  ncclAllGather(b + 32, g2 + 32 * n, 32, ncclFloat32, c, side);
  CHECK(ncclGroupEnd() == ncclSuccess, "captured group");
  cudaEventRecord(join, side);
  cudaStreamWaitEvent(s, join, 0);
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  CHECK(e == cudaSuccess && g, "end capture: %s", cudaGetErrorName(e));
  CHECK(shard_emu_nccl_collectives() == 0, "the capture ran or numbered %ld collectives", shard_emu_nccl_collectives());
  cudaGraphExec_t x = nullptr;
  cudaGraphInstantiate(&x, g, 0);
  for (int k = 1; k <= 3; k++) {
    cudaMemcpy(a, std::vector<float>(64, (float)(k * (rank + 1))).data(), 256, cudaMemcpyHostToDevice);
    CHECK(cudaGraphLaunch(x, s) == cudaSuccess, "launch %d", k);
    cudaStreamSynchronize(s);
    std::vector<float> hb(64), hg(64 * n);
    cudaMemcpy(hb.data(), b, 256, cudaMemcpyDeviceToHost);
    cudaMemcpy(hg.data(), g2, 256 * n, cudaMemcpyDeviceToHost);
    float want = k * n * (n + 1) / 2.0f;
    CHECK(hb[0] == want && hb[63] == want && hg[0] == want && hg[64 * n - 1] == want, "launch %d: %g %g %g, expected %g",
          k, hb[0], hg[0], hg[64 * n - 1], want);
  }
  CHECK(ncclAllReduce(a, b, 64, ncclFloat32, ncclMax, c, s) == ncclSuccess, "an eager all_reduce after the launches");
  cudaStreamSynchronize(s);
  std::vector<float> hb(64);
  cudaMemcpy(hb.data(), b, 256, cudaMemcpyDeviceToHost);
  CHECK(hb[0] == 3.0f * n, "eager after the graph: %g", hb[0]);
  CHECK(shard_emu_nccl_collectives() == 10, "collectives %ld, expected 3 launches of 3 and 1", shard_emu_nccl_collectives());
  char path[128];
  snprintf(path, sizeof path, "/tmp/lib_nccl_graph.%d", (int)getpid());
  shard_emu_nccl_trace_dump(path);
  FILE *f = fopen(path, "r");
  char line[512];
  std::string last;
  int lines = 0;
  while (f && fgets(line, sizeof line, f)) { last = line; lines++; }
  if (f) fclose(f);
  unlink(path);
  CHECK(lines == 10 && last.find(" #10 all_reduce count=64 dtype=float32 op=max") != std::string::npos, "trace: %d lines, last %s",
        lines, last.c_str());
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  ncclCommDestroy(c);
}

/* ---- split ------------------------------------------------------------------------------ */

static void check_split(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  cudaStream_t s;
  cudaStreamCreate(&s);
  /* colors by parity, the last rank of 3+ without a color; key = -rank reverses the order */
  int color = n >= 3 && rank == n - 1 ? NCCL_SPLIT_NOCOLOR : rank % 2;
  ncclComm_t sub = (ncclComm_t)1;
  ncclResult_t r = ncclCommSplit(c, color, -rank, &sub, nullptr);
  CHECK(r == ncclSuccess, "split: %d", r);
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(sub == nullptr, "NOCOLOR gave a communicator");
  } else if (sub) {
    std::vector<int> members;
    for (int p = 0; p < n; p++)
      if (!(n >= 3 && p == n - 1) && p % 2 == color) members.push_back(p);
    int m = (int)members.size(), sr = -1, sc = -1;
    ncclCommUserRank(sub, &sr);
    ncclCommCount(sub, &sc);
    int pos = 0;
    for (int p : members) pos += p > rank;   /* descending parent rank */
    CHECK(sc == m && sr == pos, "split rank %d/%d, expected %d/%d", sr, sc, pos, m);
    float *d;
    cudaMalloc((void **)&d, 4 * 16);
    float mine = (float)rank;
    cudaMemcpy(d + sr, &mine, 4, cudaMemcpyHostToDevice);
    ncclAllGather(d + sr, d, 1, ncclFloat32, sub, s);
    std::vector<float> o(m);
    cudaMemcpy(o.data(), d, 4 * m, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int q = 0; q < m; q++) bad += o[q] != (float)members[m - 1 - q];
    CHECK(bad == 0, "split all_gather order: %d wrong", bad);
    /* a split of the split */
    ncclComm_t sub2 = nullptr;
    CHECK(ncclCommSplit(sub, 7, 0, &sub2, nullptr) == ncclSuccess && sub2, "split of a split");
    int c2 = 0;
    if (sub2) ncclCommCount(sub2, &c2);
    CHECK(c2 == m, "split of a split: %d ranks", c2);
    if (sub2) ncclCommDestroy(sub2);
    cudaFree(d);
    ncclCommDestroy(sub);
  }
  /* the parent still works after the split */
  float *d;
  cudaMalloc((void **)&d, 4);
  float one = 1;
  cudaMemcpy(d, &one, 4, cudaMemcpyHostToDevice);
  ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s);
  cudaMemcpy(&one, d, 4, cudaMemcpyDeviceToHost);
  CHECK(one == (float)n, "parent after split: %g", one);
  CHECK(ncclCommSplit(c, -5, 0, &sub, nullptr) == ncclInvalidArgument, "negative color accepted");
  cudaFree(d);
  ncclCommDestroy(c);
}

/* ---- failures: abort, dead peer, timeout, mismatch, deadlock ------------------------- */

static float *sentinel_buf(size_t k) {
  float *d;
  cudaMalloc((void **)&d, k * 4);
  cudaMemcpy(d, std::vector<float>(k, 42.0f).data(), k * 4, cudaMemcpyHostToDevice);
  return d;
}
static bool untouched(const float *d, size_t k) {
  std::vector<float> o(k);
  cudaMemcpy(o.data(), d, k * 4, cudaMemcpyDeviceToHost);
  for (float v : o)
    if (v != 42.0f) return false;
  return true;
}

static void check_abort(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  if (rank == 1) { ncclCommAbort(c); return; }
  float *a = sentinel_buf(16), *b = sentinel_buf(16);
  CHECK(ncclAllReduce(a, b, 16, ncclFloat32, ncclSum, c, 0) == ncclSuccess, "all_reduce after a peer's abort: issue");
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "a failed collective is not a CUDA error");
  ncclResult_t e = ncclSuccess;
  ncclCommGetAsyncError(c, &e);
  CHECK(e == ncclRemoteError && strstr(shard_emu_nccl_last_report(), "ncclCommAbort"), "after a peer's abort: %d, %s", e,
        shard_emu_nccl_last_report());
  CHECK(untouched(b, 16), "output written by a failed collective");
  ncclCommAbort(c);
}

static void check_dead_peer(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  if (rank == n - 1) _exit(0);   /* dies without a word */
  float *a = sentinel_buf(16), *b = sentinel_buf(16);
  ncclAllReduce(a, b, 16, ncclFloat32, ncclSum, c, 0);
  cudaDeviceSynchronize();
  ncclResult_t e = ncclSuccess;
  ncclCommGetAsyncError(c, &e);
  CHECK(e == ncclRemoteError && strstr(shard_emu_nccl_last_report(), "died"), "dead peer: %d, %s", e, shard_emu_nccl_last_report());
  CHECK(untouched(b, 16), "output written by a failed collective");
  ncclCommAbort(c);
}

static void check_timeout(int rank, int n, ncclUniqueId id) {
  setenv("SHARD_EMU_NCCL_TIMEOUT", "0.5", 1);
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  float *a = sentinel_buf(4);
  if (rank == 0) {
    ncclAllReduce(a, a, 4, ncclFloat32, ncclSum, c, 0);
    cudaDeviceSynchronize();
    ncclResult_t e = ncclSuccess;
    ncclCommGetAsyncError(c, &e);
    CHECK(e == ncclRemoteError && strstr(shard_emu_nccl_last_report(), "timed out"), "timeout: %d %s", e,
          shard_emu_nccl_last_report());
  } else {
    usleep(1200000);   /* alive, but never issues the collective */
  }
  ncclCommAbort(c);
}

static void check_mismatch(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  float *a = sentinel_buf(4 * n), *b = sentinel_buf(4 * n);
  if (rank == 0) ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, c, 0);
  else ncclAllGather(a, b, 4, ncclFloat32, c, 0);
  cudaDeviceSynchronize();
  ncclResult_t e = ncclSuccess;
  ncclCommGetAsyncError(c, &e);
  CHECK(e == ncclInvalidUsage && strstr(shard_emu_nccl_last_report(), "disagree"), "mismatch: %d %s", e,
        shard_emu_nccl_last_report());
  CHECK(untouched(b, 4 * n), "output written by a failed collective");
  ncclCommAbort(c);
}

/* ---- send / receive -------------------------------------------------------------------- */

/* What rank `from` sends rank `to`: a count that differs per pair (several rounds of a small
 * SHARD_EMU_NCCL_CHUNK_BYTES for most), values naming pair and index. */
static size_t p2p_count(int from, int to) { return (size_t)(from + 1) * (to + 2) * 5; }
static float p2p_val(int from, int to, size_t i) { return (float)(from * 1000 + to * 100) + (float)i * 0.5f; }

/* An all-to-all of uneven sizes through ncclSend/ncclRecv in a group (itself included), then
 * a lone send/receive pair outside a group, then the refusals: a receive that does not match
 * its send, two sends to one peer in a group. */
static void check_send_recv(int rank, int n, ncclUniqueId id) {
  setenv("SHARD_EMU_NCCL_CHUNK_BYTES", "256", 1);   /* 256 / n bytes per peer and round: several rounds */
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  std::vector<float *> sendb(n), recvb(n);
  for (int q = 0; q < n; q++) {
    std::vector<float> h(p2p_count(rank, q));
    for (size_t i = 0; i < h.size(); i++) h[i] = p2p_val(rank, q, i);
    cudaMalloc((void **)&sendb[q], h.size() * 4);
    cudaMemcpy(sendb[q], h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    cudaMalloc((void **)&recvb[q], p2p_count(q, rank) * 4);
  }
  ncclGroupStart();
  for (int q = 0; q < n; q++) {   /* receives first on odd ranks: the order inside a group is free */
    int p = rank % 2 ? n - 1 - q : q;
    ncclRecv(recvb[p], p2p_count(p, rank), ncclFloat32, p, c, 0);
    ncclSend(sendb[q], p2p_count(rank, q), ncclFloat32, q, c, 0);
  }
  ncclResult_t r = ncclGroupEnd();
  CHECK(r == ncclSuccess, "rank %d: ncclGroupEnd of the all-to-all: %s", rank, ncclGetErrorString(r));
  cudaDeviceSynchronize();
  for (int p = 0; p < n; p++) {
    std::vector<float> h(p2p_count(p, rank));
    cudaMemcpy(h.data(), recvb[p], h.size() * 4, cudaMemcpyDeviceToHost);
    size_t bad = h.size();
    for (size_t i = 0; i < h.size() && bad == h.size(); i++)
      if (h[i] != p2p_val(p, rank, i)) bad = i;
    CHECK(bad == h.size(), "rank %d of %d: from rank %d element %zu of %zu is %g, want %g", rank, n, p, bad, h.size(),
          bad < h.size() ? h[bad] : 0.0, bad < h.size() ? p2p_val(p, rank, bad) : 0.0);
  }
  if (n == 2) {   /* outside a group: each rank's one call is the whole exchange */
    if (rank == 0) ncclSend(sendb[1], p2p_count(0, 1), ncclFloat32, 1, c, 0);
    else {
      cudaMemset(recvb[0], 0, p2p_count(0, 1) * 4);
      ncclRecv(recvb[0], p2p_count(0, 1), ncclFloat32, 0, c, 0);
    }
    cudaDeviceSynchronize();
    if (rank == 1) {
      std::vector<float> h(p2p_count(0, 1));
      cudaMemcpy(h.data(), recvb[0], h.size() * 4, cudaMemcpyDeviceToHost);
      CHECK(h.back() == p2p_val(0, 1, h.size() - 1), "lone send/recv: last element %g", h.back());
    }
  }
  ncclGroupStart();
  ncclSend(sendb[0], 4, ncclFloat32, 0, c, 0);
  ncclSend(sendb[0], 4, ncclFloat32, 0, c, 0);
  r = ncclGroupEnd();
  CHECK(r == ncclInvalidUsage && strstr(shard_emu_nccl_last_report(), "one send and one receive per peer"),
        "two sends to one peer: %s, %s", ncclGetErrorString(r), shard_emu_nccl_last_report());
  /* every rank sends 8 floats to the next; each receives 4 from the previous */
  float *sent = sentinel_buf(8), *got = sentinel_buf(8);
  ncclGroupStart();
  ncclSend(sent, 8, ncclFloat32, (rank + 1) % n, c, 0);
  ncclRecv(got, 4, ncclFloat32, (rank + n - 1) % n, c, 0);
  ncclGroupEnd();
  cudaDeviceSynchronize();
  ncclResult_t e = ncclSuccess;
  ncclCommGetAsyncError(c, &e);
  CHECK(e == ncclInvalidUsage && strstr(shard_emu_nccl_last_report(), "sends and receives must match"),
        "mismatched send/recv: %d %s", e, shard_emu_nccl_last_report());
  CHECK(untouched(got, 8), "a failed send/recv wrote its output");
  ncclCommAbort(c);
}

static void check_deadlock(int rank, int n, ncclUniqueId id) {
  ncclComm_t c = world(rank, n, id);
  if (!c) return;
  ncclComm_t g = nullptr, r = nullptr;
  ncclCommSplit(c, 0, rank, &g, nullptr);   /* world/split1/color0 */
  ncclCommSplit(c, 0, rank, &r, nullptr);   /* world/split2/color0 */
  cudaStream_t s;   /* one stream: its order is the order the collectives must run in */
  cudaStreamCreate(&s);
  float *a = sentinel_buf(4 * n), *b = sentinel_buf(4 * n), *x = sentinel_buf(4), *y = sentinel_buf(4);
  /* one warm-up on each, so the failing ones are #2 */
  ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, g, s);
  ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, r, s);
  cudaDeviceSynchronize();
  cudaMemcpy(x, std::vector<float>(4, 42.0f).data(), 16, cudaMemcpyHostToDevice);
  if (rank == 0) {
    ncclAllGather(a, b, 4, ncclFloat32, g, s);
    ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, r, s);
  } else {
    ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, r, s);
    ncclAllGather(a, b, 4, ncclFloat32, g, s);
  }
  cudaStreamSynchronize(s);
  ncclResult_t eg = ncclSuccess, er = ncclSuccess;
  ncclCommGetAsyncError(g, &eg);
  ncclCommGetAsyncError(r, &er);
  const char *rep = shard_emu_nccl_last_report();
  CHECK(eg == ncclInvalidUsage && er == ncclInvalidUsage, "deadlock: errors %d %d", eg, er);
  CHECK(strstr(rep, "rank 0 waits in all_gather #2 on world/split1/color0") &&
        strstr(rep, "rank 1 waits in all_reduce #2 on world/split2/color0"), "deadlock diagnosis: %s", rep);
  CHECK(untouched(b, 4 * n) && untouched(y, 4), "output written by a failed collective");
  CHECK(cudaGetLastError() == cudaSuccess, "the deadlock became a CUDA error");
  ncclCommAbort(g);
  ncclCommAbort(r);
  ncclCommDestroy(c);
}

/* Two split communicators and two non-blocking streams for the independence checks. */
struct two_comms {
  ncclComm_t c = nullptr, g = nullptr, r = nullptr;
  cudaStream_t s1 = nullptr, s2 = nullptr;
  two_comms(int rank, int n, ncclUniqueId id) {
    if (!(c = world(rank, n, id))) return;
    ncclCommSplit(c, 0, rank, &g, nullptr);
    ncclCommSplit(c, 0, rank, &r, nullptr);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  }
  ~two_comms() {
    if (!c) return;
    ncclCommDestroy(g);
    ncclCommDestroy(r);
    ncclCommDestroy(c);
  }
};

/* Communicators progress independently: opposite issue orders on two streams complete (a GPU
 * runs both collectives at once; one process-wide order deadlocked here). */
static void check_opposite_orders_two_streams(int rank, int n, ncclUniqueId id) {
  two_comms t(rank, n, id);
  if (!t.c) return;
  float *x = sentinel_buf(4), *y = sentinel_buf(4), *all = sentinel_buf(4 * n);
  if (rank == 0) {
    ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, t.r, t.s1);
    ncclAllGather(x, all, 4, ncclFloat32, t.g, t.s2);
  } else {
    ncclAllGather(x, all, 4, ncclFloat32, t.g, t.s2);
    ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, t.r, t.s1);
  }
  cudaDeviceSynchronize();
  ncclResult_t eg = ncclInternalError, er = ncclInternalError;
  ncclCommGetAsyncError(t.g, &eg);
  ncclCommGetAsyncError(t.r, &er);
  std::vector<float> o(4);
  cudaMemcpy(o.data(), y, 16, cudaMemcpyDeviceToHost);
  CHECK(eg == ncclSuccess && er == ncclSuccess && o[0] == 42.0f * n, "opposite orders on two streams: errors %d %d, %g",
        eg, er, o[0]);
}

/* The planted bug: an all-gather on one communicator reads what an all-reduce on another
 * wrote, with no stream order between them. It relied on the order one process issued them
 * in, which a GPU does not keep: it reads the old bytes (the all-gather's stream was issued
 * last, so it runs first). With an event between the streams it reads the sum. */
static void check_order_between_comms(int rank, int n, ncclUniqueId id) {
  two_comms t(rank, n, id);
  if (!t.c) return;
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  float *x = sentinel_buf(4), *y = sentinel_buf(4), *all = sentinel_buf(4 * n);
  cudaMemcpy(x, std::vector<float>(4, 1.0f).data(), 16, cudaMemcpyHostToDevice);
  std::vector<float> o(4 * n);
  for (int wait = 0; wait < 2; wait++) {
    cudaMemcpy(y, std::vector<float>(4, 42.0f).data(), 16, cudaMemcpyHostToDevice);
    ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, t.r, t.s1);
    if (wait) {
      cudaEventRecord(ev, t.s1);
      cudaStreamWaitEvent(t.s2, ev, 0);
    }
    ncclAllGather(y, all, 4, ncclFloat32, t.g, t.s2);   /* reads y */
    cudaDeviceSynchronize();
    cudaMemcpy(o.data(), all, 16 * n, cudaMemcpyDeviceToHost);
    if (wait) CHECK(o[0] == (float)n && o[4 * n - 1] == (float)n, "with the event the gather reads the sum: %g", o[0]);
    else CHECK(o[0] == 42.0f && o[4 * n - 1] == 42.0f, "without it the gather reads y before the reduction: %g", o[0]);
  }
  cudaEventDestroy(ev);
}

int main() {
  for (int n = 2; n <= 4; n++) {
    char name[64];
    snprintf(name, sizeof name, "ops n=%d", n);
    ranks(name, n, check_all_ops);
  }
  ranks("in place n=3", 3, check_in_place);
  /* SHARD_EMU_NCCL_TRACE=DIR: every rank writes DIR/nccl.<pid>.log at exit */
  char dir[] = "/tmp/lib_nccl_XXXXXX";
  if (mkdtemp(dir)) {
    setenv("SHARD_EMU_NCCL_TRACE", dir, 1);
    ranks("stream order, group, trace n=2", 2, check_stream_order_group_trace);
    unsetenv("SHARD_EMU_NCCL_TRACE");
    int logs = 0, lines = 0;
    DIR *d = opendir(dir);
    while (struct dirent *ent = d ? readdir(d) : nullptr) {
      if (strncmp(ent->d_name, "nccl.", 5)) continue;
      logs++;
      std::string path = std::string(dir) + "/" + ent->d_name;
      FILE *f = fopen(path.c_str(), "r");
      for (int ch; f && (ch = fgetc(f)) != EOF;) lines += ch == '\n';
      if (f) fclose(f);
      unlink(path.c_str());
    }
    if (d) closedir(d);
    rmdir(dir);
    CHECK(logs == 2 && lines == 6, "SHARD_EMU_NCCL_TRACE: %d logs, %d lines (expected 2 and 6)", logs, lines);
  }
  /* SHARD_EMU_SCHED=eager: collectives run when issued (every rank blocks in the call) */
  setenv("SHARD_EMU_SCHED", "eager", 1);
  ranks("eager n=3", 3, check_in_place);
  ranks("eager split n=3", 3, check_split);
  ranks("eager group n=2", 2, check_stream_order_group_trace);
  ranks("eager deadlock n=2", 2, check_deadlock);
  unsetenv("SHARD_EMU_SCHED");
  ranks("split n=2", 2, check_split);
  ranks("split n=4", 4, check_split);
  ranks("abort n=3", 3, check_abort);
  ranks("dead peer n=3", 3, check_dead_peer, 2);
  ranks("timeout n=2", 2, check_timeout);
  ranks("mismatch n=2", 2, check_mismatch);
  for (int n = 2; n <= 4; n++) {
    char name[64];
    snprintf(name, sizeof name, "send/recv n=%d", n);
    ranks(name, n, check_send_recv);
  }
  ranks("deadlock n=2", 2, check_deadlock);
  ranks("deadlock n=3", 3, check_deadlock);
  ranks("opposite orders on two streams n=2", 2, check_opposite_orders_two_streams);
  ranks("order between communicators n=2", 2, check_order_between_comms);
  ranks("order between communicators n=3", 3, check_order_between_comms);
  ranks("graph n=2", 2, check_graph);
  ranks("graph n=3", 3, check_graph);
  return lib_summary("lib_nccl");
}
