/* lib_check.h: the checks of the library stand-ins' self-tests (tests/cuda_emu/tests/lib_*):
 * each CHECK counts, a failure prints its location; lib_summary prints the
 * "C <name>: N passed, N failed" line tests/run.sh reads and returns the exit status. */
#pragma once
#include <cstdio>

static int lib_passed, lib_failed;

#define CHECK(cond, ...) do { \
    if (cond) lib_passed++; \
    else { lib_failed++; if (lib_failed <= 40) { printf("not ok %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } \
  } while (0)

static inline int lib_summary(const char *name) {
  printf("C %s: %d passed, %d failed\n", name, lib_passed, lib_failed);
  return lib_failed ? 1 : 0;
}
