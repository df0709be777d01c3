/* test_emu_capture.cu: stream capture and graphs as the Programming Guide ("CUDA Graphs",
 * "Creating a Graph Using Stream Capture", "Prohibited and Unhandled Operations",
 * "Invalidation") and the Runtime API describe them: captured work does not run; a launch
 * replays kernels, copies, memsets and library work with their recorded arguments on the
 * memory as it is then, in the order of the captured edges (cross-stream fork and join
 * through events), behind the stream's earlier work; a launch is one host call; and each
 * illegal call during capture gets its documented error and invalidates the capture. A lost
 * event wait inside the capture gives a wrong answer on replay. Compiled through the kernels'
 * rewrite. Prints "C test_emu_capture: N passed, N failed". */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmath>
#include <thread>
#include <vector>
#include "check.h"
#include "emu_api.h"
#include "emu_test.h"
#include "test_kernels.h"


enum { N = 64 };

static std::vector<float> read(const float *d) {
  std::vector<float> h(N);
  cudaMemcpy(h.data(), d, N * sizeof(float), cudaMemcpyDeviceToHost);
  return h;
}

static void write(float *d, float v) {
  std::vector<float> h(N, v);
  cudaMemcpy(d, h.data(), N * sizeof(float), cudaMemcpyHostToDevice);
}

static float *dev() {
  float *p = nullptr;
  cudaMalloc((void **)&p, N * sizeof(float));
  return p;
}

static cudaStream_t stream() {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}

static cudaGraphExec_t instantiate(cudaGraph_t g) {
  cudaGraphExec_t x = nullptr;
  CHECK(cudaGraphInstantiate(&x, g, 0) == cudaSuccess, "instantiate");
  return x;
}

/* Captured work does not run; each launch runs it on the memory as it is then. */
static void test_replay() {
  cudaStream_t s = stream();
  float *x = dev(), *y = dev(), *z = dev();
  write(x, 1.0f);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
  CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone, "not capturing: %d", st);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive, "capturing: %d", st);
  twice_kernel<<<1, N, 0, s>>>(x, y, N);
  CHECK(cudaMemcpyAsync(z, y, N * sizeof(float), cudaMemcpyDeviceToDevice, s) == cudaSuccess, "captured copy");
  CHECK(cudaMemsetAsync(x, 0, 4, s) == cudaSuccess, "captured memset");
  int runs = 0;
  CHECK(emu::enqueue(s, "host work", [&runs] { runs++; }) == cudaSuccess, "captured library work");
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "end");
  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &nodes) == cudaSuccess && nodes == 4, "4 nodes, got %zu", nodes);
  cudaStreamSynchronize(s);
  CHECK(std::isnan(read(y)[0]) && std::isnan(read(z)[5]) && read(x)[0] == 1.0f && runs == 0, "capture ran nothing");
  cudaGraphExec_t e = instantiate(g);
  emu::reset_counters();
  CHECK(cudaGraphLaunch(e, s) == cudaSuccess, "launch");
  emu::counters c = emu::get_counters();
  CHECK(c.launches == 0 && c.graph_launches == 1 && c.graph_nodes == 4, "one host launch: %ld kernel launches, %ld graph "
        "launches, %ld nodes", c.launches, c.graph_launches, c.graph_nodes);
  cudaStreamSynchronize(s);
  std::vector<float> hz = read(z), hx = read(x);
  CHECK(hz[0] == 2.0f && hz[N - 1] == 2.0f && hx[0] == 0.0f && hx[1] == 1.0f && runs == 1, "first launch: z %g, x %g %g, runs %d",
        hz[0], hx[0], hx[1], runs);
  /* the input changes between launches: the recorded pointers read the new values */
  write(x, 5.0f);
  cudaGraphLaunch(e, s);
  cudaGraphLaunch(e, s);
  cudaStreamSynchronize(s);
  hz = read(z);
  CHECK(hz[0] == 0.0f && hz[1] == 10.0f && runs == 3, "later launches: z %g %g (0 from the first launch's memset), runs %d",
        hz[0], hz[1], runs);
  /* a launch is ordered behind the stream's earlier work and before its later work */
  fill_kernel<<<1, N, 0, s>>>(x, N, 100.0f);
  cudaGraphLaunch(e, s);
  twice_kernel<<<1, N, 0, s>>>(z, y, N);
  cudaStreamSynchronize(s);
  std::vector<float> hy = read(y);
  CHECK(hy[0] == 400.0f && hy[3] == 412.0f, "stream order around a launch: y %g %g", hy[0], hy[3]);
  CHECK(cudaGraphExecDestroy(e) == cudaSuccess && cudaGraphDestroy(g) == cudaSuccess, "destroy");
  CHECK(cudaGraphLaunch(e, s) == cudaErrorInvalidValue, "launch of a destroyed instance");
  cudaGetLastError();
  cudaFree(x); cudaFree(y); cudaFree(z);
  cudaStreamDestroy(s);
}

/* A side stream joins through an event recorded in the capture and is joined back; the
 * graph keeps exactly those edges. `lose_wait` drops the consumer's wait (the join is
 * recorded after it): the replay then reads the producer's old output. */
static bool fork_join(bool lose_wait, unsigned long long seed) {
  emu::set_drain_seed(seed);
  cudaStream_t s1 = stream(), s2 = stream();
  cudaEvent_t fork, join;
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  float *a = dev(), *b = dev();
  write(a, -1.0f);
  cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
  cudaEventRecord(fork, s1);
  CHECK(cudaStreamWaitEvent(s2, fork, 0) == cudaSuccess, "s2 joins the capture");
  cudaStreamCaptureStatus st;
  unsigned long long id1 = 0, id2 = 1;
  cudaStreamGetCaptureInfo(s1, &st, &id1);
  cudaStreamGetCaptureInfo(s2, &st, &id2);
  CHECK(st == cudaStreamCaptureStatusActive && id1 == id2, "one capture sequence: %llu %llu", id1, id2);
  fill_kernel<<<1, N, 0, s2>>>(a, N, 3.0f);
  cudaEventRecord(join, s2);
  if (!lose_wait) cudaStreamWaitEvent(s1, join, 0);
  twice_kernel<<<1, N, 0, s1>>>(a, b, N);
  if (lose_wait) cudaStreamWaitEvent(s1, join, 0);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s1, &g) == cudaSuccess, "end after the join");
  CHECK(cudaStreamIsCapturing(s2, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone, "s2 left the capture");
  cudaGraphExec_t e = instantiate(g);
  cudaGraphLaunch(e, s1);
  cudaStreamSynchronize(s1);
  std::vector<float> hb = read(b);
  bool right = hb[0] == 6.0f && hb[N - 1] == 2.0f * (3.0f + N - 1);
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaEventDestroy(fork); cudaEventDestroy(join);
  cudaFree(a); cudaFree(b);
  cudaStreamDestroy(s1); cudaStreamDestroy(s2);
  emu::set_drain_seed(0);
  return right;
}

static void test_fork_join() {
  for (unsigned long long seed = 0; seed <= 2; seed++)
    CHECK(fork_join(false, seed), "fork/join replay (drain seed %llu)", seed);
  CHECK(!fork_join(true, 0), "a lost event wait in the capture must give a wrong answer on replay");
}

static cudaError_t end_status(cudaStream_t s, cudaGraph_t *g) {
  *g = (cudaGraph_t)1;
  cudaError_t e = cudaStreamEndCapture(s, g);
  cudaGetLastError();
  return e;
}

/* An illegal call returns `want` and leaves the capture invalidated: EndCapture answers
 * cudaErrorStreamCaptureInvalidated and no graph. */
static void expect_invalidated(cudaStream_t s, cudaError_t got, cudaError_t want, const char *what) {
  cudaGetLastError();
  CHECK(got == want, "%s: %s, expected %s", what, cudaGetErrorName(got), cudaGetErrorName(want));
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(s, &st);
  CHECK(st == cudaStreamCaptureStatusInvalidated, "%s: status %d, expected invalidated", what, st);
  twice_kernel<<<1, N, 0, s>>>(nullptr, nullptr, N);
  cudaError_t later = cudaGetLastError();
  CHECK(later == cudaErrorStreamCaptureInvalidated, "%s: a later launch got %s", what, cudaGetErrorName(later));
  cudaGraph_t g;
  cudaError_t e = end_status(s, &g);
  CHECK(e == cudaErrorStreamCaptureInvalidated && g == nullptr, "%s: end capture %s, graph %p", what, cudaGetErrorName(e),
        (void *)g);
}

static void test_errors() {
  cudaStream_t s = stream(), s2 = stream(), blocking;
  cudaStreamCreate(&blocking);
  float *a = dev();
  cudaGraph_t g;
  /* begin and end */
  CHECK(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) == cudaErrorInvalidValue, "begin on the legacy stream");
  CHECK(cudaStreamBeginCapture(s, (cudaStreamCaptureMode)7) == cudaErrorInvalidValue, "begin with a bad mode");
  CHECK(end_status(s, &g) == cudaErrorIllegalState, "end without a capture");
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState, "begin twice");
  CHECK(end_status(s, &g) == cudaSuccess && g, "an empty capture");
  cudaGraphDestroy(g);
  /* synchronising or querying a capturing stream, the device */
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  expect_invalidated(s, cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize");
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  expect_invalidated(s, cudaStreamQuery(s), cudaErrorStreamCaptureUnsupported, "cudaStreamQuery");
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  expect_invalidated(s, cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize");
  /* unsafe calls by mode */
  void *p = nullptr;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  expect_invalidated(s, cudaMalloc(&p, 256), cudaErrorStreamCaptureUnsupported, "cudaMalloc in global mode");
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  expect_invalidated(s, cudaFree(a), cudaErrorStreamCaptureUnsupported, "cudaFree in global mode");
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  CHECK(cudaMalloc(&p, 256) == cudaSuccess && cudaFree(p) == cudaSuccess, "cudaMalloc/cudaFree in relaxed mode");
  CHECK(end_status(s, &g) == cudaSuccess, "relaxed capture stays valid");
  cudaGraphDestroy(g);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  CHECK(cudaThreadExchangeStreamCaptureMode(&m) == cudaSuccess && m == cudaStreamCaptureModeGlobal, "exchange: old mode %d", m);
  CHECK(cudaMalloc(&p, 256) == cudaSuccess, "cudaMalloc with the thread's mode relaxed");
  cudaThreadExchangeStreamCaptureMode(&m);
  CHECK(end_status(s, &g) == cudaSuccess, "still valid after the relaxed thread's cudaMalloc");
  cudaGraphDestroy(g);
  cudaFree(p);
  /* another thread: a global capture forbids its unsafe calls, a thread-local one does not */
  for (cudaStreamCaptureMode mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
    cudaStreamBeginCapture(s, mode);
    cudaError_t other = cudaSuccess;
    std::thread t([&] { void *q = nullptr; other = cudaMalloc(&q, 256); if (q) cudaFree(q); });
    t.join();
    cudaError_t want = mode == cudaStreamCaptureModeGlobal ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
    CHECK(other == want, "cudaMalloc on another thread during a %s capture: %s", mode == cudaStreamCaptureModeGlobal ?
          "global" : "thread-local", cudaGetErrorName(other));
    cudaError_t e = end_status(s, &g);
    CHECK(e == (mode == cudaStreamCaptureModeGlobal ? cudaErrorStreamCaptureInvalidated : cudaSuccess), "end: %s",
          cudaGetErrorName(e));
    if (e == cudaSuccess) cudaGraphDestroy(g);
  }
  /* ending on another thread (not relaxed) */
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaError_t other = cudaSuccess;
  std::thread t([&] { cudaGraph_t q; other = cudaStreamEndCapture(s, &q); });
  t.join();
  CHECK(other == cudaErrorStreamCaptureWrongThread, "end on another thread: %s", cudaGetErrorName(other));
  CHECK(end_status(s, &g) == cudaSuccess, "end on the capturing thread");
  cudaGraphDestroy(g);
  /* captured events */
  cudaEvent_t ev, eager;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&eager, cudaEventDisableTiming);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaEventRecord(ev, s);
  expect_invalidated(s, cudaEventQuery(ev), cudaErrorCapturedEvent, "cudaEventQuery on a captured event");
  CHECK(cudaEventSynchronize(ev) == cudaErrorCapturedEvent, "cudaEventSynchronize on an event of an ended capture");
  CHECK(cudaStreamWaitEvent(s2, ev, 0) == cudaErrorCapturedEvent, "waiting outside on an event of an ended capture");
  cudaEventRecord(ev, s);
  CHECK(cudaEventSynchronize(ev) == cudaSuccess, "recorded again outside capture: an ordinary event");
  cudaGetLastError();
  /* waits across the capture's boundary */
  fill_kernel<<<1, N, 0, s2>>>(a, N, 1.0f);
  cudaEventRecord(eager, s2);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  expect_invalidated(s, cudaStreamWaitEvent(s, eager, 0), cudaErrorStreamCaptureIsolation, "waiting on an uncaptured event");
  cudaStream_t s3 = stream();
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaStreamBeginCapture(s3, cudaStreamCaptureModeGlobal);
  cudaEventRecord(ev, s);
  cudaError_t merge = cudaStreamWaitEvent(s3, ev, 0);
  CHECK(merge == cudaErrorStreamCaptureMerge, "merging two captures: %s", cudaGetErrorName(merge));
  CHECK(end_status(s3, &g) == cudaErrorStreamCaptureInvalidated, "the merged-into capture is invalidated");
  CHECK(end_status(s, &g) == cudaErrorStreamCaptureInvalidated, "and the other one");
  /* joining and ending */
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaEventRecord(ev, s);
  cudaStreamWaitEvent(s2, ev, 0);
  fill_kernel<<<1, N, 0, s2>>>(a, N, 1.0f);
  CHECK(end_status(s2, &g) == cudaErrorStreamCaptureUnmatched, "end on a stream that joined");
  CHECK(end_status(s, &g) == cudaErrorStreamCaptureInvalidated, "which invalidates the capture");
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaEventRecord(ev, s);
  cudaStreamWaitEvent(s2, ev, 0);
  fill_kernel<<<1, N, 0, s2>>>(a, N, 1.0f);
  cudaError_t unjoined = end_status(s, &g);
  CHECK(unjoined == cudaErrorStreamCaptureUnjoined && g == nullptr, "a side stream not joined back: %s",
        cudaGetErrorName(unjoined));
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
  CHECK(cudaStreamIsCapturing(s2, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone, "the side stream left the capture");
  /* pageable memory cannot be replayed */
  std::vector<float> host(N, 1.0f);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  expect_invalidated(s, cudaMemcpyAsync(a, host.data(), N * 4, cudaMemcpyHostToDevice, s), cudaErrorStreamCaptureUnsupported,
                     "a copy from pageable memory");
  /* the legacy stream while a blocking stream captures (not while only non-blocking ones do) */
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  CHECK(cudaMemset(a, 0, 4) == cudaSuccess, "the legacy stream beside a non-blocking capture");
  CHECK(end_status(s, &g) == cudaSuccess, "non-blocking capture stays valid");
  cudaGraphDestroy(g);
  cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal);
  expect_invalidated(blocking, cudaMemset(a, 0, 4), cudaErrorStreamCaptureImplicit, "the legacy stream beside a blocking capture");
  cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal);
  fill_kernel<<<1, N>>>(a, N, 1.0f);
  expect_invalidated(blocking, cudaGetLastError(), cudaErrorStreamCaptureImplicit, "a kernel on the legacy stream");
  cudaEventDestroy(ev);
  cudaEventDestroy(eager);
  cudaFree(a);
  cudaStreamDestroy(s); cudaStreamDestroy(s2); cudaStreamDestroy(s3); cudaStreamDestroy(blocking);
}

/* Eager mode (SHARD_EMU_SCHED=eager) runs work when queued, but never captured work. */
static void test_eager() {
  emu::set_eager(true);
  cudaStream_t s = stream();
  float *x = dev(), *y = dev();
  write(x, 2.0f);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  twice_kernel<<<1, N, 0, s>>>(x, y, N);
  cudaGraph_t g;
  cudaStreamEndCapture(s, &g);
  CHECK(std::isnan(read(y)[0]), "eager mode: the capture ran nothing");
  cudaGraphExec_t e = instantiate(g);
  cudaGraphLaunch(e, s);
  CHECK(read(y)[0] == 4.0f, "eager mode: the launch ran it");
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaFree(x); cudaFree(y);
  cudaStreamDestroy(s);
  emu::set_eager(false);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_replay);
  RUN(test_fork_join);
  RUN(test_errors);
  RUN(test_eager);
  return check_summary("test_emu_capture");
}
