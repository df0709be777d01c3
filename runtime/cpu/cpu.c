/* cpu.c: which CPU kernel set runs (cpu.h). The CPU's features are read once through gcc's
 * __builtin_cpu_supports; SHARD_CPU_ISA, once, at the first question. */
#include "cpu_internal.h"
#include "core/status_internal.h"
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[] = {"generic", "avx2", "avx512", "avx512bf16"};
enum { SETS = sizeof NAMES / sizeof NAMES[0] };

int sh_cpu_isa_current = -1;
static int best = SH_CPU_GENERIC, env_bad;
static char env_error[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

const char *sh_cpu_isa_name(int isa) { return isa >= 0 && isa < SETS ? NAMES[isa] : "?"; }

/* Each set needs every feature its builds are compiled for (cpu_internal.h's targets). */
static int detect_best(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return SH_CPU_GENERIC;
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl"))
    return SH_CPU_AVX2;
  return __builtin_cpu_supports("avx512bf16") ? SH_CPU_AVX512BF16 : SH_CPU_AVX512;
}

static int isa_by_name(const char *name) {
  for (int i = 0; i < SETS; i++)
    if (strcmp(name, NAMES[i]) == 0) return i;
  return -1;
}

static void init(void) {
  best = detect_best();
  int isa = best;
  const char *env = getenv("SHARD_CPU_ISA");
  if (env && *env) {
    isa = isa_by_name(env);
    if (isa < 0)
      snprintf(env_error, sizeof env_error, "SHARD_CPU_ISA=%s is not a kernel set (generic, avx2, avx512, avx512bf16)", env);
    else if (isa > best)
      snprintf(env_error, sizeof env_error, "SHARD_CPU_ISA=%s: this CPU (%s) runs at most %s", env, sh_cpu_model(),
               NAMES[best]);
    env_bad = env_error[0] != 0;
    if (env_bad) isa = best;
  }
  __atomic_store_n(&sh_cpu_isa_current, isa, __ATOMIC_RELEASE);
}

int sh_cpu_check(void) {
  pthread_once(&once, init);
  return env_bad ? sh_fail(SH_ERR_ARG, "%s", env_error) : SH_OK;
}

int sh_cpu_isa_slow(void) {
  if (sh_cpu_check() != SH_OK) {
    fprintf(stderr, "shard: %s\n", env_error);
    exit(2);
  }
  return __atomic_load_n(&sh_cpu_isa_current, __ATOMIC_ACQUIRE);
}

int sh_cpu_isa(void) { return sh_cpu_isa_fast(); }

int sh_cpu_isa_best(void) {
  pthread_once(&once, init);
  return best;
}

int sh_cpu_set_isa(int isa) {
  pthread_once(&once, init);
  if (isa < 0 || isa >= SETS) return sh_fail(SH_ERR_ARG, "cpu: %d is not a kernel set (0..%d)", isa, SETS - 1);
  if (isa > best)
    return sh_fail(SH_ERR_ARG, "cpu: kernel set %s: this CPU (%s) runs at most %s", NAMES[isa], sh_cpu_model(), NAMES[best]);
  __atomic_store_n(&sh_cpu_isa_current, isa, __ATOMIC_RELEASE);
  return SH_OK;
}

static char model[49];

/* cpuid's brand string (leaves 0x80000002-4), leading and repeated spaces dropped. */
static void read_model(void) {
  unsigned int r[12] = {0};
  if (__get_cpuid_max(0x80000000u, NULL) < 0x80000004u) { strcpy(model, "unknown x86-64"); return; }
  for (unsigned int i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
  const char *s = (const char *)r;
  size_t n = 0;
  for (size_t i = 0; i < sizeof r && s[i]; i++)
    if (s[i] != ' ' || (n > 0 && model[n - 1] != ' ')) model[n++] = s[i];
  while (n > 0 && model[n - 1] == ' ') n--;
  model[n] = 0;
}

const char *sh_cpu_model(void) {
  static pthread_once_t model_once = PTHREAD_ONCE_INIT;
  pthread_once(&model_once, read_model);
  return model;
}
