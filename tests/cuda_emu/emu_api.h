/* emu_api.h: what the CUDA emulator's core (streams, memory, launches, errors) offers to the
 * stand-in libraries built on it (cuBLASLt, CUB, NCCL). Test infrastructure only: never linked
 * into lib/libshard.so or bin/shard. C++17. */
#pragma once
#include <cstddef>
#include <functional>
#include <vector>
#include <cuda_runtime.h>

namespace emu {

/* Queues host work on a stream: it runs in stream order, deferred like a kernel, at the
 * point the scheduler chooses (in adversarial mode as late as CUDA allows). `what` names the
 * work in diagnostics ("cublasLtMatmul", "cub::DeviceRadixSort::SortPairs"). stream 0 is the
 * legacy default stream. Returns cudaErrorInvalidResourceHandle for a destroyed stream. */
cudaError_t enqueue(cudaStream_t stream, const char *what, std::function<void()> work);

/* A point in a stream's queue: the work enqueue_after queued there. `stream` is the
 * emulator's own name for the stream (the legacy stream's included): pass it back in `after`,
 * never to the runtime API. */
struct work_ref { cudaStream_t stream; unsigned long long seq; };

/* At each cudaGraphLaunch of a graph that captured the work: called on the host, in the
 * graph's node order, to remake the work for that launch. It may add points the launch's work
 * must also run after (`after`) and learns where that work is queued (`at`). The NCCL
 * stand-in numbers a collective on its communicator and chains it to the one before there. */
using relaunch_fn = std::function<std::function<void()>(std::vector<work_ref> &after, work_ref at)>;

/* Like enqueue, plus: the work runs only after each of the n_after points in `after` has run
 * (work on other streams, as if the stream waited on an event recorded there); *out (when not
 * null) receives the new work's point. A point whose work has already run is no constraint.
 * The NCCL stand-in chains every collective to the one issued before it on its communicator.
 * On a capturing stream the work becomes a node of the capture's graph: a point in `after`
 * must then be one this capture made (*out names such a point), else
 * cudaErrorStreamCaptureIsolation; each launch of the graph runs `work` again, or what
 * `relaunch` (when not empty) makes for that launch. */
cudaError_t enqueue_after(cudaStream_t stream, const char *what, std::function<void()> work,
                          const work_ref *after, int n_after, work_ref *out, relaunch_fn relaunch = {});

/* The host waits until the work at `at` has run (as cudaEventSynchronize on an event recorded
 * right after it; counted so, a `work_sync` hostwait line); returns the device's sticky error. */
cudaError_t wait_work(work_ref at);

/* True when `stream` is capturing (cudaStreamIsCapturing: active or invalidated). */
bool is_capturing(cudaStream_t stream);

/* Runs queued work that may run now beside the work in progress: the front of a stream
 * nobody is running, whose waits are done. For queued work that waits for other processes
 * (an NCCL collective waiting for its peers): a GPU runs the other streams' work meanwhile.
 * True when a piece of work finished or moved (requeue_work(true)), false when none did. */
bool run_ready_work();

/* Called by work that run_ready_work runs (never by other work): it cannot finish now, so it
 * goes back to the front of its stream and runs again later (the host's wait or the next
 * run_ready_work); `moved` says whether it got any further this time. */
void requeue_work(bool moved);

/* True when [p, p + bytes) lies inside one live device allocation (cudaMalloc) on the current
 * device. Library stand-ins call it before touching a pointer, and return their own
 * documented error (CUBLAS_STATUS_INVALID_VALUE, ncclInvalidArgument, ...) when false. */
bool is_device_range(const void *p, size_t bytes);

/* The same for host memory from cudaHostAlloc / cudaMallocHost (pinned). */
bool is_pinned_range(const void *p, size_t bytes);

/* Reports a failure found while running queued work (a library's execution-time error) the
 * way CUDA reports asynchronous errors: sticky, returned by the next sync and
 * cudaGetLastError. `what` becomes part of the message printed in verbose mode. */
void fail_async(cudaError_t err, const char *what);

/* Counters the tests read (and reset): cudaMalloc calls, cudaFree calls, kernel launches
 * (from the host: a capturing stream's count, a graph's replayed ones do not), host
 * synchronisations (stream/event/device sync, synchronous copies), library calls (enqueue),
 * host waits (the host synchronisations plus every cudaEventQuery/cudaStreamQuery that
 * answered cudaErrorNotReady: the host blocking on or polling the device), cudaGraphLaunch
 * calls, and the graph nodes those launches queued. */
struct counters { long mallocs, frees, launches, host_syncs, library_calls, host_waits, graph_launches, graph_nodes; };
counters get_counters();
void reset_counters();

}  // namespace emu
