/* check_cpu.h: for C tests that compare CPU kernel sets (runtime/cpu/cpu.h) in one process. */
#pragma once
#include "check.h"
#include "cpu/cpu.h"
#include "core/status.h"

/* Tests that compare CPU kernel sets in one process (cpu.h) run their cases under the set in
 * use (SHARD_CPU_ISA, or the CPU's best), then under avx2 when the set in use is above it (the
 * 8-lane builds of the kernels written once for both vector widths, simd_internal.h), then
 * under generic, whose portable loops the others must match:
 * `for (int s = 0; s < check_sets(); s++) { const char *set = check_use_set(s); ... }`,
 * then check_use_set(0) puts the set in use back. tests/run.sh runs every test once per set. */
static int check_isa_top = -1;
static inline int check_sets(void) {
  if (check_isa_top < 0) check_isa_top = sh_cpu_isa();
  return check_isa_top > SH_CPU_AVX2 ? 3 : check_isa_top > SH_CPU_GENERIC ? 2 : 1;
}
static inline const char *check_use_set(int i) {
  int n = check_sets();
  int isa = i == 0 ? check_isa_top : i == n - 1 ? SH_CPU_GENERIC : SH_CPU_AVX2;
  if (sh_cpu_set_isa(isa) != 0) { printf("not ok: kernel set %d: %s\n", isa, sh_last_error()); check_failed++; }
  return sh_cpu_isa_name(isa);
}
