/* cpu.h: the CPU kernel set. shard's CPU kernels exist in up to four builds, each a superset
 * of the one before:
 *   generic     the x86-64 baseline (SSE2): portable loops, OpenBLAS for f32 GEMM, bf16
 *               products widened to f32
 *   avx2        + AVX2 and FMA builds of the elementwise, norm, loss and attention loops,
 *               8-lane attention block kernels, AdamW and bf16 conversions (simd_internal.h),
 *               and shard's own f32 GEMM (sgemm.c: 6 x 16 tiles)
 *   avx512      + AVX-512 (F, BW, DQ, VL) builds of those loops and 16-lane builds of those
 *               kernels (the same source as avx2's), the f32 GEMM's 12 x 32 tiles (the same
 *               bits as avx2's)
 *   avx512bf16  + bf16 matrix products on vdpbf16ps
 * The set in use is the best the CPU has, or SHARD_CPU_ISA=generic|avx2|avx512|avx512bf16
 * (read at the first kernel call). Naming a set the CPU lacks, or an unknown name, is an
 * error: bin/shard says so and exits 2 before running anything. OpenBLAS picks its own
 * kernels (OPENBLAS_CORETYPE, e.g. Haswell for AVX2; tests/run.sh sets both). */
#pragma once

/* The sets, in order: each runs on every CPU that runs the next. */
enum sh_cpu_isa_id { SH_CPU_GENERIC = 0, SH_CPU_AVX2 = 1, SH_CPU_AVX512 = 2, SH_CPU_AVX512BF16 = 3 };

/* The kernel set in use. Exits 2 with a message if SHARD_CPU_ISA is unknown or more than
 * the CPU has (sh_cpu_check reports the same as a status first, for a clean error). */
int sh_cpu_isa(void);
/* SH_OK, or SH_ERR_ARG naming SHARD_CPU_ISA's value and what this CPU has. */
int sh_cpu_check(void);
/* The best set this CPU runs. */
int sh_cpu_isa_best(void);
/* Switches the set in use (tests compare the sets in one process): SH_OK, or SH_ERR_ARG when
 * isa is not a set or more than the CPU has. */
int sh_cpu_set_isa(int isa);
/* "generic", "avx2", "avx512", "avx512bf16"; "?" for anything else. */
const char *sh_cpu_isa_name(int isa);
/* The CPU's model name (cpuid's brand string, spaces trimmed), e.g. "AMD EPYC 9R14". */
const char *sh_cpu_model(void);
