/* test_cuda_device.c (make test-gpu; needs a GPU, or the emulated device of make test): what
 * cuda.h promises beyond the ops, through the public API only: the caching allocator reuses a
 * block freed on one stream on another once ordered by an event, and with SHARD_CUDA_POISON=1
 * hands blocks out filled with NaN bytes; events order streams, report completion and time;
 * pinned host buffers are cached, and handed out again only once the copies that read them
 * ran; asynchronous copies round-trip; tensors copy between two devices; an op given tensors
 * on two devices fails naming the op; a CUDA graph of the compute stream replays what it
 * captured and keeps its memory. The ops themselves are checked by test_op_table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/alloc.h"
#include "ops/ops.h"
#include "core/cuda.h"
#include "gpu_test.h"

#define S(...) (int64_t[]){__VA_ARGS__}

static const int DEV = 0;

static sh_tensor *filled(int64_t n, int device, double value) {
  sh_tensor *t = NULL;
  if (sh_tensor_empty(&t, 1, S(n), SH_F32, device) || sh_tensor_fill_(t, value)) {
    printf("making a tensor: %s\n", sh_last_error());
    exit(2);
  }
  return t;
}

static double item_of(const sh_tensor *t) {
  sh_tensor *h = NULL;
  double v = NAN;
  if (!sh_tensor_to(&h, t, SH_F64, -1)) sh_tensor_item(h, &v);
  sh_tensor_destroy(h);
  return v;
}

/* Every element of t (any device) equals value. */
static int all_equal(const sh_tensor *t, double value) {
  int64_t n = sh_tensor_numel(t);
  sh_tensor *h = NULL;
  double *v = malloc(sizeof(double) * (size_t)n);
  int ok = v && !sh_tensor_to(&h, t, SH_F64, -1) && !sh_tensor_read_f64(h, v);
  for (int64_t i = 0; ok && i < n; i++) ok = v[i] == value;
  sh_tensor_destroy(h);
  free(v);
  return ok;
}

static void test_info(void) {
  sh_cuda_device_info info;
  CHECK_OK(sh_cuda_device_info_get(DEV, &info));
  CHECK(info.name[0] && info.major >= 1 && info.sm_count > 0 && info.total_memory > 0,
        "device info: %s sm_%d%d, %d SMs, %lld bytes", info.name, info.major, info.minor, info.sm_count,
        (long long)info.total_memory);
  int64_t free_b = 0, total_b = 0;
  CHECK_OK(sh_cuda_mem_info(DEV, &free_b, &total_b));
  CHECK(free_b > 0 && free_b <= total_b, "mem info: %lld free of %lld", (long long)free_b, (long long)total_b);
}

/* The snapshot stream: made when first asked for, one per device, none of the others. */
static void test_snapshot_stream(void) {
  sh_cuda_stream *snap = NULL, *again = NULL, *other = NULL;
  CHECK_OK(sh_cuda_stream_get(&snap, DEV, SH_STREAM_SNAPSHOT));
  CHECK_OK(sh_cuda_stream_get(&again, DEV, SH_STREAM_SNAPSHOT));
  CHECK(snap && snap == again, "the snapshot stream is the same each time");
  for (int k = SH_STREAM_COMPUTE; k < SH_STREAM_SNAPSHOT; k++) {
    CHECK_OK(sh_cuda_stream_get(&other, DEV, k));
    CHECK(other != snap, "the snapshot stream is not stream kind %d", k);
  }
  CHECK_FAILS(sh_cuda_stream_get(&other, DEV, SH_STREAM_SNAPSHOT + 1), SH_ERR_ARG, "kind 4 is not compute (0)");
}

static void test_streams_and_events(void) {
  sh_mem_stats s0, s1;
  sh_tensor *a = NULL, *b = NULL;
  CHECK_OK(sh_tensor_empty(&a, 1, S(1 << 20), SH_F32, DEV));
  sh_tensor_destroy(a);
  CHECK_OK(sh_mem_stats_get(DEV, &s0));
  /* freed on compute, reused on the all-gather stream: same block, ordered by an event */
  sh_cuda_stream *ag = NULL, *comp = NULL;
  CHECK_OK(sh_cuda_stream_get(&ag, DEV, SH_STREAM_ALL_GATHER));
  CHECK_OK(sh_cuda_stream_get(&comp, DEV, SH_STREAM_COMPUTE));
  CHECK_OK(sh_cuda_set_stream(ag));
  sh_cuda_stream *cur = NULL;
  CHECK_OK(sh_cuda_current_stream(&cur, DEV));
  CHECK(cur == ag, "the current stream is the one set");
  CHECK_OK(sh_tensor_empty(&b, 1, S(1 << 20), SH_F32, DEV));
  CHECK_OK(sh_tensor_fill_(b, 3.0));
  CHECK_OK(sh_mem_stats_get(DEV, &s1));
  CHECK(s1.n_system_alloc == s0.n_system_alloc, "cached block reused across streams (%lld system allocs, was %lld)",
        (long long)s1.n_system_alloc, (long long)s0.n_system_alloc);
  sh_cuda_event *e = NULL, *t0 = NULL, *t1 = NULL;
  CHECK_OK(sh_cuda_event_create(&e, DEV, 0));
  CHECK_OK(sh_cuda_event_record(e, ag));
  CHECK_OK(sh_cuda_set_stream(comp));
  CHECK_OK(sh_cuda_stream_wait_event(comp, e));
  sh_tensor *r = NULL;
  CHECK_OK(sh_reduce_all(&r, SH_OP_SUM, b));
  double sum = r ? item_of(r) : NAN;
  CHECK(sum == 3.0 * (1 << 20), "fill on the all-gather stream seen by compute after the event: %g", sum);
  int done = 0;
  CHECK_OK(sh_cuda_event_synchronize(e));
  CHECK_OK(sh_cuda_event_query(e, &done));
  CHECK(done == 1, "event done after synchronize");
  CHECK_OK(sh_cuda_event_create(&t0, DEV, 1));
  CHECK_OK(sh_cuda_event_create(&t1, DEV, 1));
  CHECK_OK(sh_cuda_event_record(t0, comp));
  CHECK_OK(sh_tensor_fill_(b, 1.0));
  CHECK_OK(sh_cuda_event_record(t1, comp));
  CHECK_OK(sh_cuda_event_synchronize(t1));
  double ms = -1;
  CHECK_OK(sh_cuda_event_elapsed(t0, t1, &ms));
  CHECK(ms >= 0, "elapsed %g ms", ms);
  CHECK_OK(sh_cuda_stream_synchronize(comp));
  sh_cuda_event_destroy(e);
  sh_cuda_event_destroy(t0);
  sh_cuda_event_destroy(t1);
  sh_tensor_destroy(b);
  sh_tensor_destroy(r);
}

/* A block freed while compute still reads it, handed to the all-gather stream and written
 * there: the all-gather stream must wait for compute (the allocator's event) or the late
 * compute work overwrites b (the emulator runs the newest stream's work first). */
static void test_cross_stream_reuse_waits(void) {
  const int64_t n = 1 << 16;
  sh_cuda_stream *ag = NULL, *comp = NULL;
  CHECK_OK(sh_cuda_stream_get(&ag, DEV, SH_STREAM_ALL_GATHER));
  CHECK_OK(sh_cuda_stream_get(&comp, DEV, SH_STREAM_COMPUTE));
  sh_tensor *a = filled(n, DEV, 2.0), *c = NULL, *b = NULL;
  CHECK_OK(sh_binary_scalar(&c, SH_OP_MUL, a, 1.0, 0));
  void *block = sh_tensor_data(a);
  sh_tensor_destroy(a);
  CHECK_OK(sh_cuda_set_stream(ag));
  CHECK_OK(sh_tensor_empty(&b, 1, S(n), SH_F32, DEV));
  CHECK(sh_tensor_data(b) == block, "a's block is reused for b on the all-gather stream");
  CHECK_OK(sh_tensor_fill_(b, 3.0));
  CHECK_OK(sh_cuda_set_stream(comp));
  CHECK_OK(sh_cuda_synchronize(DEV));
  CHECK(all_equal(c, 2.0), "c = a * 1 read a before the reuse");
  CHECK(all_equal(b, 3.0), "b = 3 written after compute was done with a's block");
  sh_tensor_destroy(b);
  sh_tensor_destroy(c);
}

/* The emulator's counters: present only under the emulator (tests/cuda_emu), NULL on a GPU. */
long sh_emu_host_waits(void) __attribute__((weak));

/* a, allocated on compute, is read on the all-gather stream (c = a * 1), then freed on compute
 * and its block handed to b on compute, which writes 3. Returns c's value after the device
 * sync: 2 when the read ran first. `record` names the all-gather stream's use of a
 * (sh_cuda_record_stream), so the reuse waits for it. */
static double read_on_other_stream_then_reuse(int record) {
  const int64_t n = 1 << 12;
  sh_cuda_stream *ag = NULL, *comp = NULL;
  sh_cuda_event *e = NULL;
  CHECK_OK(sh_cuda_stream_get(&ag, DEV, SH_STREAM_ALL_GATHER));
  CHECK_OK(sh_cuda_stream_get(&comp, DEV, SH_STREAM_COMPUTE));
  CHECK_OK(sh_cuda_event_create(&e, DEV, 0));
  sh_tensor *a = filled(n, DEV, 2.0), *b = NULL, *c = NULL;
  void *block = sh_tensor_data(a);
  CHECK_OK(sh_cuda_event_record(e, comp));
  CHECK_OK(sh_cuda_stream_wait_event(ag, e));
  CHECK_OK(sh_cuda_set_stream(ag));
  CHECK_OK(sh_binary_scalar(&c, SH_OP_MUL, a, 1.0, 0));
  if (record) CHECK_OK(sh_cuda_record_stream(a, ag));
  CHECK_OK(sh_cuda_set_stream(comp));
  sh_tensor_destroy(a);
  CHECK_OK(sh_tensor_empty(&b, 1, S(n), SH_F32, DEV));
  CHECK(sh_tensor_data(b) == block, "a's block is reused for b on compute");
  CHECK_OK(sh_tensor_fill_(b, 3.0));
  CHECK_OK(sh_cuda_synchronize(DEV));
  double v = all_equal(c, 2.0) ? 2.0 : all_equal(c, 3.0) ? 3.0 : NAN;
  sh_cuda_event_destroy(e);
  sh_tensor_destroy(b);
  sh_tensor_destroy(c);
  return v;
}

/* The same for a pinned buffer: read by a copy on the all-gather stream, freed on compute,
 * asked for again once compute is done, and written by the host (5). Returns what the copy
 * read. */
static double pinned_read_on_other_stream_then_reuse(int record) {
  const int64_t n = 1024;
  sh_cuda_stream *ag = NULL, *comp = NULL;
  void *h1 = NULL, *h2 = NULL;
  sh_tensor *src = NULL, *other = NULL, *d = NULL;
  CHECK_OK(sh_cuda_stream_get(&ag, DEV, SH_STREAM_ALL_GATHER));
  CHECK_OK(sh_cuda_stream_get(&comp, DEV, SH_STREAM_COMPUTE));
  CHECK_OK(sh_tensor_empty(&d, 1, S(n), SH_F32, DEV));
  CHECK_OK(sh_cuda_synchronize(DEV));
  CHECK_OK(sh_cuda_host_empty_cache());   /* h1 is then the only buffer the cache can hand out */
  CHECK_OK(sh_cuda_host_alloc(&h1, n * sizeof(float)));
  CHECK_OK(sh_tensor_wrap_external(&src, h1, n * sizeof(float), 1, S(n), SH_F32));
  CHECK_OK(sh_tensor_fill_(src, 1.0));
  CHECK_OK(sh_cuda_set_stream(ag));
  CHECK_OK(sh_cuda_copy_async(d, src));
  if (record) CHECK_OK(sh_cuda_record_stream(src, ag));
  CHECK_OK(sh_cuda_set_stream(comp));
  sh_tensor_destroy(src);
  sh_cuda_host_free(h1);
  CHECK_OK(sh_cuda_stream_synchronize(comp));   /* the free's own stream is done */
  CHECK_OK(sh_cuda_host_alloc(&h2, n * sizeof(float)));
  CHECK_OK(sh_tensor_wrap_external(&other, h2, n * sizeof(float), 1, S(n), SH_F32));
  CHECK_OK(sh_tensor_fill_(other, 5.0));
  CHECK_OK(sh_cuda_synchronize(DEV));
  double v = all_equal(d, 1.0) ? 1.0 : all_equal(d, 5.0) && h2 == h1 ? 5.0 : NAN;
  sh_tensor_destroy(other);
  sh_tensor_destroy(d);
  sh_cuda_host_free(h2);
  return v;
}

/* Memory used on a stream other than the one current at its free: its reuse must wait for
 * that stream too. */
static void test_record_stream(void) {
  CHECK(read_on_other_stream_then_reuse(1) == 2.0, "with sh_cuda_record_stream the reuse waited for the other stream's read");
  CHECK(pinned_read_on_other_stream_then_reuse(1) == 1.0, "a pinned buffer named for the other stream waits for its copy");
  /* The emulator's newest-first order always loses these races; a GPU or another order may not. */
  const char *seed = getenv("SHARD_EMU_DRAIN_SEED");
  if (sh_emu_host_waits && (!seed || atoi(seed) == 0)) {
    CHECK(read_on_other_stream_then_reuse(0) == 3.0, "without it the emulator shows the reuse overwriting a block still read");
    CHECK(pinned_read_on_other_stream_then_reuse(0) == 5.0, "and the host overwriting a pinned buffer a copy still reads");
  }
  sh_tensor *h = filled(4, -1, 1.0);
  sh_cuda_stream *comp = NULL;
  CHECK_OK(sh_cuda_stream_get(&comp, DEV, SH_STREAM_COMPUTE));
  CHECK_FAILS(sh_cuda_record_stream(h, comp), SH_ERR_ARG, "not memory of the CUDA allocator");
  sh_tensor_destroy(h);
}

/* SHARD_CUDA_POISON=1 (set by main): a reused block comes back as 0xFF bytes, not as the
 * values its last tensor left. */
static void test_poison(void) {
  const char *p = getenv("SHARD_CUDA_POISON");
  if (!p || strcmp(p, "1") != 0) { printf("# SHARD_CUDA_POISON is not 1: poisoning not tested\n"); return; }
  const int64_t n = 1 << 12;
  sh_tensor *a = filled(n, DEV, 1.0), *b = NULL, *h = NULL;
  void *block = sh_tensor_data(a);
  sh_tensor_destroy(a);
  CHECK_OK(sh_tensor_empty(&b, 1, S(n), SH_F32, DEV));
  CHECK(sh_tensor_data(b) == block, "the block is reused");
  CHECK_OK(sh_tensor_to(&h, b, SH_F32, -1));
  int poisoned = h != NULL;
  for (int64_t i = 0; poisoned && i < n * 4; i++) poisoned = ((const unsigned char *)sh_tensor_data(h))[i] == 0xFF;
  CHECK(poisoned, "a reused block is handed out as 0xFF bytes under SHARD_CUDA_POISON=1");
  sh_tensor_destroy(b);
  sh_tensor_destroy(h);
}

/* A pinned buffer freed while an async copy still reads it: the next host_alloc must not hand
 * it out (and let the host overwrite it) before the copy ran. */
static void test_pinned_reuse_waits_for_copies(void) {
  const int64_t n = 4096;
  void *h1 = NULL, *h2 = NULL;
  sh_tensor *src = NULL, *other = NULL, *d = NULL;
  CHECK_OK(sh_cuda_host_alloc(&h1, n * sizeof(float)));
  CHECK_OK(sh_tensor_wrap_external(&src, h1, n * sizeof(float), 1, S(n), SH_F32));
  CHECK_OK(sh_tensor_fill_(src, 1.0));
  CHECK_OK(sh_tensor_empty(&d, 1, S(n), SH_F32, DEV));
  CHECK_OK(sh_cuda_copy_async(d, src));
  sh_tensor_destroy(src);
  sh_cuda_host_free(h1);
  CHECK_OK(sh_cuda_host_alloc(&h2, n * sizeof(float)));
  CHECK_OK(sh_tensor_wrap_external(&other, h2, n * sizeof(float), 1, S(n), SH_F32));
  CHECK_OK(sh_tensor_fill_(other, 5.0));
  CHECK_OK(sh_cuda_synchronize(DEV));
  CHECK(all_equal(d, 1.0), "the copy read the pinned buffer before it was handed out again (%s)",
        h1 == h2 ? "same buffer" : "another buffer");
  sh_tensor_destroy(other);
  sh_tensor_destroy(d);
  sh_cuda_host_free(h2);
}

static void test_pinned_and_async_copies(void) {
  /* pinned buffers are cached, and async copies round-trip */
  void *h1 = NULL, *h2 = NULL;
  CHECK_OK(sh_cuda_host_alloc(&h1, 1 << 16));
  sh_cuda_host_free(h1);
  CHECK_OK(sh_cuda_synchronize(DEV));   /* the event recorded at the free is done */
  CHECK_OK(sh_cuda_host_alloc(&h2, 1 << 16));
  CHECK(h1 == h2, "pinned buffer reused from the cache once the device is idle");
  sh_tensor *hp = NULL, *hq = NULL, *d = NULL, *x = NULL;
  CHECK_OK(sh_tensor_empty(&x, 1, S(4096), SH_F32, -1));
  CHECK_OK(sh_random_normal_(x, 42, 0, 0, 1));
  CHECK_OK(sh_tensor_wrap_external(&hp, h2, 1 << 16, 1, S(4096), SH_F32));
  CHECK_OK(sh_tensor_copy_(hp, x));
  CHECK_OK(sh_tensor_empty(&d, 1, S(4096), SH_F32, DEV));
  CHECK_OK(sh_tensor_empty(&hq, 1, S(4096), SH_F32, -1));
  CHECK_OK(sh_cuda_copy_async(d, hp));
  CHECK_OK(sh_cuda_copy_async(hq, d));
  CHECK_OK(sh_cuda_synchronize(DEV));
  CHECK(hq && x && memcmp(sh_tensor_data(hq), sh_tensor_data(x), 4096 * sizeof(float)) == 0,
        "copy_async round trip is exact");
  sh_tensor_destroy(hp);
  sh_tensor_destroy(hq);
  sh_tensor_destroy(d);
  sh_tensor_destroy(x);
  sh_cuda_host_free(h2);
  CHECK_OK(sh_cuda_host_empty_cache());
}

/* t (any device) holds exactly want's values (a cpu tensor of the same shape). */
static int equal_to(const sh_tensor *t, const sh_tensor *want) {
  int64_t n = sh_tensor_numel(want);
  sh_tensor *h = NULL;
  double *v = malloc(sizeof(double) * (size_t)n), *w = malloc(sizeof(double) * (size_t)n);
  int ok = v && w && sh_tensor_numel(t) == n && !sh_tensor_to(&h, t, SH_F64, -1) && !sh_tensor_read_f64(h, v) &&
           !sh_tensor_read_f64(want, w) && memcmp(v, w, sizeof(double) * (size_t)n) == 0;
  sh_tensor_destroy(h);
  free(v);
  free(w);
  return ok;
}

/* cuda:0 -> cuda:1: a contiguous copy, then a strided one with a dtype change and a
 * broadcast, each equal to the same copy made on the CPU. */
static void test_copy_between_devices(void) {
  if (sh_cuda_device_count() < 2) { printf("# one CUDA device: copies between devices not tested\n"); return; }
  CHECK_OK(sh_cuda_init(1));
  CHECK_OK(sh_cuda_init(DEV));
  sh_tensor *x = NULL, *a = NULL, *b = NULL, *xt = NULL, *at = NULL, *want = NULL, *dst = NULL;
  CHECK_OK(sh_tensor_empty(&x, 2, S(6, 5), SH_F32, -1));
  CHECK_OK(sh_random_normal_(x, 7, 0, 0, 1));
  CHECK_OK(sh_tensor_to(&a, x, SH_F32, DEV));
  CHECK_OK(sh_tensor_to(&b, a, SH_F32, 1));
  CHECK(b && b->device == 1 && equal_to(b, x), "cuda:0 -> cuda:1 contiguous copy is exact");
  CHECK_OK(sh_view_transpose(&xt, x, 0, 1));
  CHECK_OK(sh_view_transpose(&at, a, 0, 1));
  CHECK_OK(sh_tensor_empty(&want, 3, S(2, 5, 6), SH_BF16, -1));
  CHECK_OK(sh_tensor_copy_(want, xt));
  CHECK_OK(sh_tensor_empty(&dst, 3, S(2, 5, 6), SH_BF16, 1));
  CHECK_OK(sh_tensor_copy_(dst, at));
  CHECK(equal_to(dst, want), "cuda:0 f32 transposed -> cuda:1 bf16 broadcast equals the CPU's copy");
  sh_tensor *all[] = {x, a, b, xt, at, want, dst};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sh_tensor_destroy(all[i]);
}

static void test_errors(void) {
  /* an op given tensors on two devices fails naming the op, and makes no output */
  sh_tensor *c = filled(3, -1, 1.0), *dc = filled(3, DEV, 2.0), *o = NULL;
  CHECK_FAILS(sh_binary(&o, SH_OP_ADD, dc, c), SH_ERR_DEVICE, "add");
  CHECK(o == NULL, "no output on error");
  sh_tensor_destroy(c);
  sh_tensor_destroy(dc);
  sh_tensor *t = NULL;
  CHECK_FAILS(sh_tensor_empty(&t, 1, S(3), SH_F32, 1000), SH_ERR_DEVICE, "1000");
  CHECK(t == NULL, "no tensor on a device that does not exist");
}

/* A CUDA graph of the compute stream (cuda.h): what is captured runs only when launched, on
 * the memory as it is then; a block handed out or freed during the capture is the graph's
 * (no allocation outside it gets that block) until the graph is destroyed; a host copy during
 * the capture fails naming it; a synchronisation there makes the end fail naming CUDA's error. */
static void test_graph(void) {
  sh_tensor *src = filled(1024, DEV, 1.0), *dst = filled(1024, DEV, 0.0);
  CHECK_OK(sh_cuda_synchronize(DEV));
  CHECK_OK(sh_cuda_graph_begin(DEV));
  CHECK_FAILS(sh_cuda_graph_begin(DEV), SH_ERR_ARG, "already capturing");
  sh_tensor *mid = NULL, *host = NULL;
  CHECK_OK(sh_binary(&mid, SH_OP_ADD, src, src));   /* handed out during the capture */
  CHECK_OK(sh_tensor_copy_(dst, mid));
  void *graph_block = sh_tensor_data(mid);
  sh_tensor_destroy(mid);                             /* freed during it: stays the graph's */
  CHECK_FAILS(sh_tensor_to(&host, dst, SH_F64, -1), SH_ERR_DEVICE, "while a CUDA graph is captured");
  sh_cuda_graph *g = NULL;
  CHECK_OK(sh_cuda_graph_end(DEV, &g));
  CHECK(all_equal(dst, 0.0), "the capture ran nothing");
  sh_tensor *other = filled(1024, DEV, 5.0);
  CHECK(sh_tensor_data(other) != graph_block, "an allocation outside the graph got the graph's block");
  CHECK_OK(sh_cuda_graph_launch(g));
  CHECK(all_equal(dst, 2.0), "the first launch");
  CHECK_OK(sh_tensor_fill_(src, 3.0));
  CHECK_OK(sh_cuda_graph_launch(g));
  CHECK(all_equal(dst, 6.0) && sh_cuda_graph_launches(g) == 2, "the second launch reads src as it is then");
  CHECK(all_equal(other, 5.0), "the launches left the other block alone");
  sh_cuda_graph_destroy(g);
  sh_tensor *again = filled(1024, DEV, 7.0);
  CHECK(sh_tensor_data(again) == graph_block, "the graph's blocks go back to the cache when it is destroyed");
  /* a synchronisation inside the capture: the end fails and names the error */
  CHECK_OK(sh_cuda_graph_begin(DEV));
  CHECK_FAILS(sh_cuda_synchronize(DEV), SH_ERR_DEVICE, "cudaErrorStreamCaptureUnsupported");
  CHECK_FAILS(sh_cuda_graph_end(DEV, &g), SH_ERR_DEVICE, "cudaErrorStreamCaptureInvalidated");
  CHECK(g == NULL, "no graph from a failed capture");
  CHECK_FAILS(sh_cuda_graph_end(DEV, &g), SH_ERR_ARG, "not capturing");
  CHECK(all_equal(again, 7.0), "the device works after a failed capture");
  sh_tensor_destroy(src);
  sh_tensor_destroy(dst);
  sh_tensor_destroy(other);
  sh_tensor_destroy(again);
}

int main(void) {
  /* The emulator reads these at its first call; a real GPU ignores the first. */
  setenv("SHARD_EMU_DEVICES", "2", 0);
  setenv("SHARD_CUDA_POISON", "1", 0);
  int rc = cuda_test_start("test_cuda_device", DEV);
  if (rc >= 0) return rc;
  test_info();
  test_snapshot_stream();
  test_streams_and_events();
  test_cross_stream_reuse_waits();
  test_record_stream();
  test_poison();
  test_pinned_and_async_copies();
  test_pinned_reuse_waits_for_copies();
  test_copy_between_devices();
  test_errors();
  test_graph();
  CHECK_OK(sh_cuda_synchronize(DEV));
  return check_summary("test_cuda_device");
}
