/* optim_internal.h: the per-step constants of an optimizer update, formed once per call from
 * the hyper-parameters (which optim.c's fronts have checked) by the kernels of every backend
 * (optim.c's CPU loops, kernels/optim.cu), the kinds of gradient-norm part and the clip's
 * formulas, and what optim.c's
 * CPU AdamW shares with its AVX-512 loop (optim_cpu_avx512.c). */
#pragma once
#include <math.h>
#include "tensor_internal.h"

/* The per-step constants of an AdamW update (optim.h's formula). */
typedef struct sh_adamw_hyper {
  float scale, decay, b1, omb1, b2, omb2, step_size, bc2_sqrt, eps;
} sh_adamw_hyper;

/* The per-step constants of an SGD update; has_buf when momentum is on. */
typedef struct sh_sgd_hyper {
  float scale, lr, wd, momentum, omd;
  int nesterov, first, has_buf;
} sh_sgd_hyper;

sh_adamw_hyper sh_adamw_hyper_of(double lr, double beta1, double beta2, double eps, double weight_decay,
                                 int64_t step, double grad_scale);
sh_sgd_hyper sh_sgd_hyper_of(double lr, double momentum, double dampening, double weight_decay, int nesterov,
                             int first_step, double grad_scale);

/* What sh_grad_norm_part sums over its tensors (norm_type 2, 1, INFINITY). */
enum { SH_NORM_MAX = 0, SH_NORM_L1 = 1, SH_NORM_L2 = 2 };

#ifdef __CUDACC__
#define SH_OPTIM_HD __host__ __device__ __forceinline__
#else
#define SH_OPTIM_HD static inline
#endif

/* sh_grad_clip_coef's formulas, for the kernels of both backends: the norm of a part in f64,
 * and the coefficient min(1, max_norm / (norm + 1e-6)) rounded once to f32 (NaN stays NaN). */
SH_OPTIM_HD double sh_clip_norm_of(double part, int kind) { return kind == SH_NORM_L2 ? sqrt(part) : part; }
SH_OPTIM_HD float sh_clip_coef_of(double norm, double max_norm) {
  double c = max_norm / (norm + 1e-6);
  return (float)(c > 1 ? 1 : c);
}

/* One parameter of a CPU AdamW step: its host buffers and constants. The grad is g32 (f32) or,
 * when g32 is NULL, g16 (bf16); shadow is NULL or a buffer of shadow_dtype. */
typedef struct sh_adamw_buf {
  float *p, *m, *v;
  const float *g32;
  const uint16_t *g16;
  void *shadow;
  int shadow_dtype;
  sh_adamw_hyper h;
} sh_adamw_buf;

/* The AVX-512 loop (optim_cpu_avx512.c), built on x86-64 with gcc or clang. sh_optim_avx512()
 * is 1 when the CPU loops use it: an avx512 kernel set is in use (cpu.h). sh_adamw_avx512 updates the whole vectors of 16 elements in
 * [i0, i1) of b and returns where it stopped (i0 when the shadow is neither bf16 nor f32). */
int sh_optim_avx512(void);
#if defined(__x86_64__) && defined(__GNUC__)
#define SH_OPTIM_HAVE_AVX512 1
int64_t sh_adamw_avx512(const sh_adamw_buf *b, int64_t i0, int64_t i1);
#else
#define SH_OPTIM_HAVE_AVX512 0
#endif
