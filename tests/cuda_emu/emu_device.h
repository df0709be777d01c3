/* emu_device.h: the device-side hooks of the CUDA emulator's core, for the library stand-ins
 * whose device functions are warp-collective (nvcuda::wmma) or must fail a launch.
 * Test infrastructure only: never linked into lib/libshard.so or bin/shard. C++17.
 *
 * Execution model these hooks live in: every CUDA thread of a block is a fiber; all fibers of
 * all launches run on ONE executor (host) thread, one at a time, switching only at barriers
 * and collectives (__syncthreads, __syncwarp, __shfl_*_sync, __ballot_sync, warp_collective).
 * Between two such points a fiber runs alone, so a device function may use plain host code
 * and needs no locking. Called outside a kernel (host code), the functions below say so:
 * lane() is -1, in_kernel() false, warp_collective() returns at once. */
#pragma once
#include <cstddef>

namespace emu {

/* True while a CUDA thread (fiber) of a kernel is running. */
bool in_kernel();

/* The calling thread's lane in its warp (0..31), from its linear index in the block
 * (threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y); -1 on
 * the host. */
int lane();

/* The calling thread's warp in its block (linear index / 32); -1 on the host. */
int warp();

/* Lanes that exist in the calling thread's warp: 0xffffffff, or fewer bits for the last warp
 * of a block whose size is not a multiple of 32. */
unsigned warp_lanes();

/* The running kernel's name as written at its launch ("attn_fwd_tc_kernel",
 * "act_kernel<T>") followed by " (file:line of the launch)"; "host" outside a kernel. */
const char *kernel_name();

/* A warp-collective rendezvous (wmma::load_matrix_sync, mma_sync, store_matrix_sync,
 * fill_fragment are called by every lane of a warp together). Waits until every existing
 * lane of the calling warp (warp_lanes()) has called warp_collective with the same `what`;
 * then all of them continue. If a lane has exited, or waits at another barrier or collective,
 * or calls it with another `what`, the launch fails with a divergence report naming the
 * kernel, the block, `what` and the lanes. When `uniform` is not null, every lane must pass
 * the same `bytes` bytes there (arguments CUDA requires to be warp-uniform: pointer, ld,
 * layout); a lane whose bytes differ fails the launch the same way.
 * On the host (not in a kernel) it returns at once. */
void warp_collective(const char *what, const void *uniform = nullptr, size_t bytes = 0);

/* Fails the running launch from device code (a device function got an argument its
 * documentation forbids): prints "<kernel> block (x,y,z) thread (x,y,z): <message>", makes
 * the launch's error sticky (cudaErrorLaunchFailure, returned by the next sync as CUDA
 * reports a device-side fault) and abandons the block. Does not return. On the host it
 * prints the message and aborts. */
[[noreturn]] void device_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- LIBS proposals (the LIBS helper may add requests below this line; CORE implements
 * them or answers in a comment) ------------------------------------------------------ */

/* LIBS request 1 (nvcuda::wmma): per-warp scratch for a collective's data exchange.
 * mma_sync needs every lane's fragments (lane L's 8 elements of D depend on all lanes' A, B
 * and C elements), so each lane publishes pointers to its fragments in a table the whole warp
 * shares, meets the others at warp_collective, reads, and meets them again before anyone
 * reuses the table. Returns the same pointer to every lane of the calling warp, distinct for
 * every (launch, block, warp) alive at the same time, stable for the warp's lifetime, at least
 * WARP_SCRATCH_BYTES bytes, 16-byte aligned; contents undefined at the warp's start. On the
 * host, nullptr. (Until CORE defines it, tests/cuda_emu/wmma.cpp carries a weak stand-in.) */
enum { WARP_SCRATCH_BYTES = 1024 };
void *warp_scratch();
/* CORE: implemented (emu_core.cpp): one 1024-byte, 64-byte aligned area per warp of the
 * running block (blocks run one at a time); 0xFF bytes when each block starts. */

/* LIBS request 2 (nvcuda::wmma): warp_collective with the caller's source location, so a
 * divergence report names the kernel's line of the wmma call instead of emu_core.cpp. Same
 * semantics as warp_collective; mma.h passes __builtin_FILE()/__builtin_LINE() of the kernel's
 * call site. Until CORE defines it, mma.h calls warp_collective (its own location). */
void warp_collective_at(const char *what, const void *uniform, size_t bytes, const char *file, int line);
/* CORE: implemented (emu_core.cpp); plain warp_collective reports "?:0" as its site. */

}  // namespace emu
