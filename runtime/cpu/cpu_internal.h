/* cpu_internal.h: how a CPU kernel is built once per kernel set (cpu.h) and picked at the
 * call. SH_CPU_KERNEL(name, params, args) { body } defines `static void name params` whose
 * body is compiled three times, for the AVX-512 targets, for AVX2 + FMA, and for the x86-64
 * baseline (the body is an always-inline function; gcc inlines a baseline function into a
 * wider target and vectorizes it there). Each call runs the build of the set in use, so
 * SHARD_CPU_ISA and sh_cpu_set_isa reach every kernel; gcc's target_clones would pick once,
 * at load time, by the CPU alone. */
#pragma once
#include "cpu.h"

extern int sh_cpu_isa_current;   /* -1 until the first question */
int sh_cpu_isa_slow(void);

/* The set in use: one load after the first call. */
static inline int sh_cpu_isa_fast(void) {
  int isa = __atomic_load_n(&sh_cpu_isa_current, __ATOMIC_RELAXED);
  return isa >= 0 ? isa : sh_cpu_isa_slow();
}

/* The features each set's builds may use; cpu.c's detection asks for the same. */
#define SH_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SH_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define SH_TARGET_AVX512BF16 __attribute__((target("avx512bf16,avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SH_CPU_KERNEL(name, params, args)                                                \
  static inline __attribute__((always_inline)) void name##_body params;                  \
  SH_TARGET_AVX512 static void name##_avx512 params { name##_body args; }                \
  SH_TARGET_AVX2 static void name##_avx2 params { name##_body args; }                    \
  static void name##_generic params { name##_body args; }                                \
  static void name params {                                                              \
    int isa_ = sh_cpu_isa_fast();                                                        \
    if (isa_ >= SH_CPU_AVX512) name##_avx512 args;                                       \
    else if (isa_ == SH_CPU_AVX2) name##_avx2 args;                                      \
    else name##_generic args;                                                            \
  }                                                                                      \
  static inline __attribute__((always_inline)) void name##_body params
#else
#define SH_CPU_KERNEL(name, params, args) static void name params
#endif
