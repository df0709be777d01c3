/* test_cpu.c: the CPU kernel sets (runtime/cpu/cpu.h). The best set against the CPU's features as
 * cpuid reports them (read here, not through cpu.c's __builtin_cpu_supports), the names, and
 * switching: every set up to the best, and a clear error for anything else. SHARD_CPU_ISA's
 * parsing runs through bin/shard (tests/spec/cpu_spec.lua). */
#include "check.h"
#include "cpu/cpu.h"
#include "core/status.h"
#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

/* Whether the OS saves the ymm (bits 1-2) and, with zmm, the opmask and zmm state (5-7). */
static int os_saves(unsigned mask) {
  unsigned a, b, c, d;
  __cpuid(1, a, b, c, d);
  if (!(c & bit_OSXSAVE)) return 0;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & mask) == mask;
}

static int cpuid_best(void) {
  unsigned a, b, c, d, b7, c1, d1, a71 = 0;
  __cpuid(1, a, b, c1, d1);
  __cpuid_count(7, 0, a, b7, c, d);
  __cpuid_count(7, 1, a71, b, c, d);
  int avx2 = (b7 & bit_AVX2) && (c1 & bit_FMA) && os_saves(0x6);
  int avx512 = (b7 & bit_AVX512F) && (b7 & bit_AVX512BW) && (b7 & bit_AVX512DQ) && (b7 & bit_AVX512VL) && os_saves(0xE6);
  if (!avx2) return SH_CPU_GENERIC;
  if (!avx512) return SH_CPU_AVX2;
  return (a71 & (1u << 5)) ? SH_CPU_AVX512BF16 : SH_CPU_AVX512;   /* leaf 7.1 eax bit 5: AVX512_BF16 */
}

static void test_best(void) {
  CHECK(sh_cpu_isa_best() == cpuid_best(), "best set %s, cpuid says %s", sh_cpu_isa_name(sh_cpu_isa_best()),
        sh_cpu_isa_name(cpuid_best()));
  const char *env = getenv("SHARD_CPU_ISA");
  CHECK(strcmp(sh_cpu_isa_name(sh_cpu_isa()), env && *env ? env : sh_cpu_isa_name(sh_cpu_isa_best())) == 0,
        "set in use %s: SHARD_CPU_ISA's, or the best", sh_cpu_isa_name(sh_cpu_isa()));
  CHECK(strlen(sh_cpu_model()) > 0 && sh_cpu_model()[0] != ' ', "model \"%s\"", sh_cpu_model());
}

static void test_names(void) {
  static const char *const want[] = {"generic", "avx2", "avx512", "avx512bf16"};
  for (int i = 0; i < 4; i++) CHECK(strcmp(sh_cpu_isa_name(i), want[i]) == 0, "name %d: %s", i, sh_cpu_isa_name(i));
  CHECK(strcmp(sh_cpu_isa_name(4), "?") == 0 && strcmp(sh_cpu_isa_name(-1), "?") == 0, "names out of range");
}

static void test_switch(void) {
  int before = sh_cpu_isa();
  for (int isa = 0; isa <= sh_cpu_isa_best(); isa++) {
    CHECK_OK(sh_cpu_set_isa(isa));
    CHECK(sh_cpu_isa() == isa, "after set %d the set in use is %d", isa, sh_cpu_isa());
  }
  CHECK_FAILS(sh_cpu_set_isa(4), SH_ERR_ARG, "4 is not a kernel set");
  CHECK_FAILS(sh_cpu_set_isa(-1), SH_ERR_ARG, "-1 is not a kernel set");
  if (sh_cpu_isa_best() < SH_CPU_AVX512BF16) {
    CHECK_FAILS(sh_cpu_set_isa(sh_cpu_isa_best() + 1), SH_ERR_ARG, "runs at most");
  } else {
    printf("# this CPU runs every set: no set above its best to refuse\n");
  }
  CHECK(sh_cpu_isa() == sh_cpu_isa_best(), "a refused switch leaves the set as it was");
  CHECK_OK(sh_cpu_set_isa(before));
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_best);
  RUN(test_names);
  RUN(test_switch);
  return check_summary("test_cpu");
}
