/* staging_internal.h: what the CPU kernel families share (not in the FFI).
 * - Staging: the kernels compute on f32 buffers whose rows are contiguous. An input that is
 *   already such a buffer is used in place (an alias); anything else (bf16, f16, f64, other
 *   strides) is converted once into a fresh f32 copy. Outputs are allocated in f32 and
 *   converted at the end when the caller's tensors are in another float dtype.
 * - Accumulation: parameter gradients are summed into the caller's tensor (dw += ...). An f32
 *   contiguous dw is written in place; any other dw goes through an f32 copy written back.
 * - Vector math: exp-based functions written so that gcc vectorizes loops calling them (the
 *   libm ones are opaque calls), and SH_CPU_KERNEL (cpu_internal.h), which builds a hot
 *   kernel once per CPU kernel set and runs the set in use. */
#pragma once
#include "core/bf16_internal.h"
#include "cpu_internal.h"
#include "fastmath_internal.h"
#include <stdint.h>
#include <string.h>
#include "core/tensor_internal.h"
#include "core/backend_internal.h"


/* Elementwise loops below this many elements stay on one thread: waking the team costs
 * more than the work. */
enum { SH_STAGE_PAR_MIN = 1 << 15 };

/* Calls fn(arg, i0, i1) over [0, n) split into one contiguous range per thread; one call
 * on the calling thread when work (elements touched) is below SH_STAGE_PAR_MIN (sh_parallel_for
 * of parallel.h). Kernels are written as such range functions, built by SH_CPU_KERNEL. */
typedef void (*sh_stage_range_fn)(const void *arg, int64_t i0, int64_t i1);
void sh_stage_parallel_for(int64_t n, int64_t work, sh_stage_range_fn fn, const void *arg);


/* *out = t as a contiguous f32 tensor: an alias when it already is one, else a converted copy. */
int sh_stage_f32(sh_tensor **out, const sh_tensor *t, const char *op, const char *name);
/* Like sh_stage_f32 but only the last dim must be unit-stride (rows may be strided views). */
int sh_stage_f32_rows(sh_tensor **out, const sh_tensor *t, const char *op, const char *name);
/* A new contiguous f32 tensor of the given shape. */
int sh_stage_new_f32(sh_tensor **out, int ndim, const int64_t *shape);
/* A new contiguous f32 tensor of the given shape, zero-filled. */
int sh_stage_zeros_f32(sh_tensor **out, int ndim, const int64_t *shape);
/* Hands the f32 result *t to the caller in `dtype`: kept when dtype is f32, else converted
 * (and the f32 buffer freed). On failure *t is freed and NULL. */
int sh_stage_finish(sh_tensor **t, int dtype);

/* Accumulator for a parameter gradient: buf is f32 contiguous and holds dst's current
 * values; after the kernel added into buf, sh_stage_accum_end writes it back (when buf is a
 * copy) and bumps dst's version. */
typedef struct sh_stage_accum { sh_tensor *dst, *buf; } sh_stage_accum;
int sh_stage_accum_begin(sh_stage_accum *a, sh_tensor *dst, const char *op, const char *name);
/* The same for an output the kernel overwrites (a front-allocated tensor): buf is dst itself
 * when dst is f32 contiguous, else an uninitialised f32 buffer that sh_stage_accum_end copies
 * into dst. */
int sh_stage_out_begin(sh_stage_accum *a, sh_tensor *dst);
/* The same for a kernel that writes rows through strides: buf is also dst itself when dst is
 * an f32 view with a unit last stride whose elements do not overlap (a transposed head view,
 * a slice of a wider row). */
int sh_stage_out_rows_begin(sh_stage_accum *a, sh_tensor *dst);
int sh_stage_accum_end(sh_stage_accum *a);
void sh_stage_accum_drop(sh_stage_accum *a);   /* on an error path: forget without writing back */

/* gelu (GPT-2's tanh form) over n f32 values on the calling thread, the CPU kernels' own
 * loops, for fusions: y = gelu(x), and dx = dy * gelu'(x) (dx may be dy: in place). */
void sh_stage_gelu_f32(const float *x, float *y, int64_t n);
void sh_stage_gelu_backward_f32(const float *dy, const float *x, float *dx, int64_t n);


static inline float *sh_stage_ptr(const sh_tensor *t) { return (float *)sh_tensor_data(t); }

static inline float sh_sigmoidf(float x) { return 1.0f / (1.0f + sh_expf(-x)); }

/* Row reductions. gcc finishes an `omp simd reduction` with a serial chain of scalar adds
 * that costs as much as a 128-wide row itself, so row sums are written as 16 lanes
 * (SH_LANES: one AVX-512 vector) added up by a tree at the end. */
enum { SH_LANES = 16 };
static inline float sh_lanes_sum(const float *t) {
  float u[8];
  for (int k = 0; k < 8; k++) u[k] = t[k] + t[k + 8];
  for (int k = 0; k < 4; k++) u[k] += u[k + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

