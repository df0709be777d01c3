/* emu_api.h: what the CUDA emulator's core (streams, memory, launches, errors) offers to the
 * stand-in libraries built on it (cuBLASLt, CUB, NCCL). Test infrastructure only: never linked
 * into lib/libshard.so or bin/shard. C++17. */
#pragma once
#include <cstddef>
#include <functional>
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

/* Like enqueue, plus: the work runs only after each of the n_after points in `after` has run
 * (work on other streams, as if the stream waited on an event recorded there); *out (when not
 * null) receives the new work's point. A point whose work has already run is no constraint.
 * The NCCL stand-in chains every collective to the one issued before it on its communicator. */
cudaError_t enqueue_after(cudaStream_t stream, const char *what, std::function<void()> work,
                          const work_ref *after, int n_after, work_ref *out);

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

/* Counters the tests read (and reset): cudaMalloc calls, cudaFree calls, kernel launches,
 * host synchronisations (stream/event/device sync, synchronous copies), library calls
 * (enqueue), host waits (the host synchronisations plus every cudaEventQuery/cudaStreamQuery
 * that answered cudaErrorNotReady: the host blocking on or polling the device). */
struct counters { long mallocs, frees, launches, host_syncs, library_calls, host_waits; };
counters get_counters();
void reset_counters();

}  // namespace emu
