/* test_emu_graph.cu: the emulator's instrumentation shows what it claims: host waits are
 * counted (a polling loop once), the dependency graph of a small known program is exact, and
 * SHARD_EMU_DROP_EVENT_WAITS (emu::set_drop_event_waits) drops every cudaStreamWaitEvent so
 * that a producer/consumer pair across streams gives a wrong answer and loses its edge.
 * Compiled through the same rewrite as the kernels. Prints "C test_emu_graph: N passed, N failed". */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "check.h"
#include "emu_api.h"
#include "emu_test.h"
#include "test_kernels.h"

extern "C" void shard_emu_graph_begin(void);
extern "C" int shard_emu_graph_dump(const char *path);
extern "C" long shard_emu_host_waits(void);
extern "C" long shard_emu_launches(void);
extern "C" long shard_emu_frees_count(void);
extern "C" long shard_emu_malloc_count(void);
extern "C" void shard_emu_reset_counters(void);
extern "C" long sh_emu_host_waits(void);
extern "C" void sh_emu_counters_get(long out[4]);


/* ---- a parsed graph ------------------------------------------------------------------- */

struct graph {
  std::vector<std::string> lines;
  std::vector<std::string> of(const char *kind) const {
    std::vector<std::string> r;
    size_t k = strlen(kind);
    for (const std::string &l : lines)
      if (l.compare(0, k, kind) == 0 && l.size() > k && l[k] == ' ') r.push_back(l);
    return r;
  }
  size_t count(const char *kind) const { return of(kind).size(); }
  bool has(const std::string &line) const {
    for (const std::string &l : lines)
      if (l == line) return true;
    return false;
  }
  bool has_prefix(const std::string &p) const {
    for (const std::string &l : lines)
      if (l.compare(0, p.size(), p) == 0) return true;
    return false;
  }
};

static graph parse(const std::string &text) {
  graph g;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l))
    if (!l.empty() && l[0] != '#') g.lines.push_back(l);
  return g;
}

static std::string ptr(const void *p) {
  char b[32];
  snprintf(b, sizeof b, "%p", p);
  return b;
}

/* ---- the program: a producer on s1, an event, a consumer on s2 that waits for it ------ */

struct prog {
  int n = 1024;
  float *a = nullptr, *b = nullptr;
  cudaStream_t s1, s2, s3;
  cudaEvent_t ev, empty;
  std::vector<float> h;
};

static void prog_init(prog &p) {
  cudaMalloc((void **)&p.a, p.n * sizeof(float));
  cudaMalloc((void **)&p.b, p.n * sizeof(float));
  cudaStreamCreateWithFlags(&p.s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&p.s2, cudaStreamNonBlocking);
  cudaStreamCreate(&p.s3);
  cudaEventCreateWithFlags(&p.ev, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&p.empty, cudaEventDisableTiming);
  cudaDeviceSynchronize();
  p.h.assign(p.n, 0.0f);
}

static void prog_free(prog &p) {
  cudaDeviceSynchronize();
  cudaEventDestroy(p.ev);
  cudaEventDestroy(p.empty);
  cudaStreamDestroy(p.s1);
  cudaStreamDestroy(p.s2);
  cudaStreamDestroy(p.s3);
  cudaFree(p.a);
  cudaFree(p.b);
}

/* node 1: memset a on s1; node 2: fill a on s1; record ev on s1; record `empty` on s3 (nothing
 * queued there: an empty point); s2 waits for ev and for `empty`; node 3: twice a -> b on s2
 * (edge 2 -> 3); the host syncs s2; node 4: the copy of b back (legacy stream, synchronous). */
static void prog_run(prog &p) {
  cudaMemsetAsync(p.a, 0, p.n * sizeof(float), p.s1);
  fill_kernel<<<p.n / 256, 256, 0, p.s1>>>(p.a, p.n, 1.0f);
  cudaEventRecord(p.ev, p.s1);
  cudaEventRecord(p.empty, p.s3);
  cudaStreamWaitEvent(p.s2, p.ev, 0);
  cudaStreamWaitEvent(p.s2, p.empty, 0);
  twice_kernel<<<p.n / 256, 256, 0, p.s2>>>(p.a, p.b, p.n);
  cudaStreamSynchronize(p.s2);
  cudaMemcpy(p.h.data(), p.b, p.n * sizeof(float), cudaMemcpyDeviceToHost);
}

static bool prog_right(const prog &p) {
  for (int i = 0; i < p.n; i++)
    if (p.h[i] != 2.0f * (1.0f + i)) return false;
  return true;
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_host_waits() {
  int n = 256;
  float *y;
  cudaMalloc((void **)&y, n * sizeof(float));
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  cudaDeviceSynchronize();
  emu::reset_counters();
  /* queued work and a record: no host wait */
  fill_kernel<<<1, n, 0, s>>>(y, n, 0.0f);
  cudaEventRecord(ev, s);
  emu::counters c = emu::get_counters();
  CHECK(c.host_waits == 0 && c.host_syncs == 0, "queueing is not waiting: %ld %ld", c.host_waits, c.host_syncs);
  /* a polling loop on one event: the first query answers not ready and lets the work run */
  int polls = 0;
  while (cudaEventQuery(ev) == cudaErrorNotReady) polls++;
  c = emu::get_counters();
  CHECK(polls == 1 && c.host_waits == 1 && c.host_syncs == 0, "a polling loop: %d polls, %ld waits, %ld syncs", polls,
        c.host_waits, c.host_syncs);
  /* the same on a stream */
  fill_kernel<<<1, n, 0, s>>>(y, n, 1.0f);
  polls = 0;
  while (cudaStreamQuery(s) == cudaErrorNotReady) polls++;
  CHECK(polls == 1 && emu::get_counters().host_waits == 2, "cudaStreamQuery polling: %d polls, %ld waits", polls,
        emu::get_counters().host_waits);
  /* queries of finished work are not waits */
  CHECK(cudaEventQuery(ev) == cudaSuccess && cudaStreamQuery(s) == cudaSuccess && emu::get_counters().host_waits == 2,
        "a query that answers cudaSuccess is not a wait");
  /* every synchronisation is one, pending work or not (as host_syncs) */
  cudaStreamSynchronize(s);
  cudaEventSynchronize(ev);
  cudaDeviceSynchronize();
  std::vector<float> h(n);
  cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);               /* synchronous copy */
  cudaMemcpyAsync(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost, s);       /* into pageable memory */
  cudaMemcpyAsync(y, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);       /* from pageable: staged, async */
  c = emu::get_counters();
  CHECK(c.host_syncs == 5 && c.host_waits == 7, "syncs and synchronous copies: %ld syncs, %ld waits", c.host_syncs,
        c.host_waits);
  long out[4];
  sh_emu_counters_get(out);
  CHECK(out[3] == 5 && sh_emu_host_waits() == 7 && shard_emu_host_waits() == 7, "the C exports: %ld %ld %ld", out[3],
        sh_emu_host_waits(), shard_emu_host_waits());
  CHECK(shard_emu_launches() == 2 && shard_emu_frees_count() == 0 && shard_emu_malloc_count() == 0,
        "launches %ld, frees %ld, mallocs %ld", shard_emu_launches(), shard_emu_frees_count(), shard_emu_malloc_count());
  cudaDeviceSynchronize();
  shard_emu_reset_counters();
  c = emu::get_counters();
  CHECK(c.host_waits == 0 && c.launches == 0 && c.host_syncs == 0, "shard_emu_reset_counters");
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  cudaFree(y);
}

static void test_drop_event_waits() {
  prog p;
  prog_init(p);
  prog_run(p);
  CHECK(prog_right(p), "producer on s1, event, consumer on s2: right (h[1] = %g)", p.h[1]);
  emu::set_drop_event_waits(true);
  cudaMemsetAsync(p.b, 0xFF, p.n * sizeof(float), p.s2);
  cudaMemsetAsync(p.a, 0xFF, p.n * sizeof(float), p.s1);   /* NaN again */
  cudaDeviceSynchronize();
  CHECK(cudaStreamWaitEvent(p.s2, p.ev, 0) == cudaSuccess, "a dropped wait returns cudaSuccess");
  prog_run(p);
  CHECK(!prog_right(p), "without the event wait the consumer runs first: wrong (h[1] = %g)", p.h[1]);
  emu::set_drop_event_waits(false);
  cudaMemsetAsync(p.a, 0xFF, p.n * sizeof(float), p.s1);
  cudaDeviceSynchronize();
  prog_run(p);
  CHECK(prog_right(p), "the knob off again: right (h[1] = %g)", p.h[1]);
  CHECK(cudaStreamWaitEvent(p.s2, nullptr, 0) == cudaErrorInvalidResourceHandle, "a bad handle is still refused");
  cudaGetLastError();
  prog_free(p);
}

static void test_graph() {
  prog p;
  prog_init(p);
  cudaEventRecord(p.ev, p.s1);    /* recorded before the recording: no edge from it */
  emu::graph_begin();
  cudaStreamWaitEvent(p.s2, p.ev, 0);
  graph g0 = parse(emu::graph_end());
  std::string i1 = std::to_string(emu::graph_stream_id(p.s1)), i2 = std::to_string(emu::graph_stream_id(p.s2)),
              i3 = std::to_string(emu::graph_stream_id(p.s3));
  CHECK(g0.count("node") == 0 && g0.count("edge") == 0 && g0.has("wait " + i2 + " " + ptr(p.ev) + " -"),
        "an event recorded before graph_begin gives no edge (%zu lines)", g0.lines.size());

  emu::graph_begin();
  prog_run(p);
  graph g = parse(emu::graph_end());
  CHECK(prog_right(p), "the recorded program is right");
  /* legacy stream of device 0 is id 0; then the created streams in order (creation index id - 1) */
  int c1 = emu::graph_stream_id(p.s1) - 1;
  CHECK(emu::graph_stream_id(0) == 0 && emu::graph_stream_id(p.s2) == c1 + 2 && emu::graph_stream_id(p.s3) == c1 + 3,
        "stream ids in creation order");
  CHECK(g.has("stream 0 legacy 0 0") && g.has("stream " + i1 + " " + std::to_string(c1) + " 1 0") &&
            g.has("stream " + i2 + " " + std::to_string(c1 + 1) + " 1 0") &&
            g.has("stream " + i3 + " " + std::to_string(c1 + 2) + " 0 0") && g.count("stream") == 4,
        "stream lines (id, creation index, flags, device)");
  CHECK(g.count("node") == 4 && g.count("edge") == 1 && g.count("wait") == 2 && g.count("hostwait") == 2,
        "exact counts: %zu nodes, %zu edges, %zu waits, %zu hostwaits", g.count("node"), g.count("edge"), g.count("wait"),
        g.count("hostwait"));
  CHECK(g.has("node 1 " + i1 + " memset 4096 bytes") && g.has_prefix("node 2 " + i1 + " kernel fill_kernel (") &&
            g.has_prefix("node 3 " + i2 + " kernel twice_kernel (") &&
            g.has("node 4 0 memcpy 4096 bytes device -> pageable"),
        "nodes: id, stream, what");
  CHECK(g.has("edge 2 3 " + ptr(p.ev)), "the edge fill -> twice with the event's handle");
  CHECK(g.has("wait " + i2 + " " + ptr(p.ev) + " 2") && g.has("wait " + i2 + " " + ptr(p.empty) + " -"),
        "wait lines (an event recorded at an empty point: -)");
  CHECK(g.has("hostwait stream_sync stream " + i2) && g.has("hostwait memcpy stream 0 memcpy 4096 bytes device -> pageable"),
        "hostwait lines");
  /* chronological: the edge follows its node, the stream sync comes before the copy's node */
  auto at = [&](const std::string &pre) {
    for (size_t i = 0; i < g.lines.size(); i++)
      if (g.lines[i].compare(0, pre.size(), pre) == 0) return (long)i;
    return -1L;
  };
  CHECK(at("edge 2 3") == at("node 3 ") + 1 && at("hostwait stream_sync") < at("node 4 "), "lines in the order of events");

  /* the same program with the knob: the edge (and the wait lines) are gone, nodes the same */
  emu::set_drop_event_waits(true);
  cudaMemsetAsync(p.a, 0xFF, p.n * sizeof(float), p.s1);
  cudaDeviceSynchronize();
  emu::graph_begin();
  prog_run(p);
  graph d = parse(emu::graph_end());
  emu::set_drop_event_waits(false);
  CHECK(!prog_right(p), "with dropped waits the answer is wrong");
  CHECK(d.count("node") == 4 && d.count("edge") == 0 && d.count("wait") == 0,
        "dropped waits: %zu nodes, %zu edges, %zu waits", d.count("node"), d.count("edge"), d.count("wait"));

  /* the C export writes the same text to a file; queries and event syncs leave hostwait lines */
  char path[] = "/tmp/test_emu_graph_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  shard_emu_graph_begin();
  fill_kernel<<<p.n / 256, 256, 0, p.s1>>>(p.a, p.n, 3.0f);
  cudaEventRecord(p.ev, p.s1);
  while (cudaEventQuery(p.ev) == cudaErrorNotReady) {
  }
  cudaEventSynchronize(p.ev);
  emu::enqueue(p.s2, "test::library", [] {});
  CHECK(shard_emu_graph_dump(path) == 0, "shard_emu_graph_dump");
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  unlink(path);
  graph q = parse(ss.str());
  CHECK(q.count("node") == 2 && q.has("node 2 " + i2 + " test::library") &&
            q.has("hostwait event_query event " + ptr(p.ev) + " stream " + i1 + " not ready") &&
            q.has("hostwait event_sync event " + ptr(p.ev) + " stream " + i1) && q.count("hostwait") == 2,
        "the dump file: %zu lines, %zu nodes", q.lines.size(), q.count("node"));
  CHECK(shard_emu_graph_dump("/nonexistent-dir/x") == -1, "an unwritable path answers -1");
  /* off: nothing recorded */
  fill_kernel<<<p.n / 256, 256, 0, p.s1>>>(p.a, p.n, 3.0f);
  graph off = parse(emu::graph_end());
  CHECK(off.count("node") == 0, "nothing recorded when not recording");
  prog_free(p);
}

/* The environment variable is read like the other knobs: this program again, with it set. */
static void test_drop_env(const char *self) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    setenv("SHARD_EMU_DROP_EVENT_WAITS", "1", 1);
    execl("/proc/self/exe", self, (char *)nullptr);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SHARD_EMU_DROP_EVENT_WAITS=1 in the environment (status %d)", st);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  emu::set_eager(false);
  emu::set_thread_order(false);
  emu::set_block_order(2, 1);
  const char *drop = getenv("SHARD_EMU_DROP_EVENT_WAITS");
  if (drop && atoi(drop)) {
    /* the knob from the environment: the producer/consumer pair is wrong */
    prog p;
    prog_init(p);
    prog_run(p);
    CHECK(!prog_right(p), "SHARD_EMU_DROP_EVENT_WAITS=1: the consumer ran first (h[1] = %g)", p.h[1]);
    prog_free(p);
    return check_summary("test_emu_graph");
  }
  RUN(test_host_waits);
  RUN(test_drop_event_waits);
  RUN(test_graph);
  RUN(test_drop_env, argv[0]);
  return check_summary("test_emu_graph");
}
