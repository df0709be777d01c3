/* optim_internal.h: the per-step constants of an optimizer update, formed once per call from
 * the hyper-parameters (which optim.c's fronts have checked) by the kernels of every backend
 * (optim.c's CPU loops, kernels/optim.cu), the kinds of gradient-norm part and the clip's
 * formulas, and what optim.c's
 * CPU AdamW shares with its AVX-512 loop (optim_cpu_avx512.c). */
#pragma once
#include <math.h>
#include "core/rules_internal.h"

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
