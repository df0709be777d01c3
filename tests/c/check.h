/* check.h: a minimal C test harness. Each CHECK prints "ok"/"not ok" with its location;
 * main returns check_summary(), which prints "C <file>: N passed, N failed" and fails if any did.
 * main calls check_args(argc, argv) and runs each test function through RUN, so that
 * `build/tests/test_ops matmul` runs only the functions whose name contains "matmul". */
#pragma once
#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;
static const char *check_only;

static inline void check_args(int argc, char **argv) { check_only = argc > 1 && argv[1][0] ? argv[1] : NULL; }

#define RUN(test, ...) do { if (!check_only || strstr(#test, check_only)) test(__VA_ARGS__); } while (0)

#define CHECK(cond, ...) do { \
    if (cond) check_passed++; \
    else { check_failed++; printf("not ok %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
  } while (0)

#define CHECK_OK(expr) do { int rc_ = (expr); \
    CHECK(rc_ == 0, "%s returned %d: %s", #expr, rc_, sh_last_error()); } while (0)

#define CHECK_FAILS(expr, code, substring) do { int rc_ = (expr); \
    CHECK(rc_ == (code) && strstr(sh_last_error(), substring) != NULL, \
          "%s: expected error %d containing \"%s\", got %d \"%s\"", #expr, code, substring, rc_, sh_last_error()); \
  } while (0)

#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); \
    CHECK(fabs(a_ - b_) <= (tol) || (isnan(a_) && isnan(b_)), "%s = %.9g, expected %.9g (tol %g)", #a, a_, b_, (double)(tol)); } while (0)

static int check_summary(const char *name) {
  printf("C %s: %d passed, %d failed\n", name, check_passed, check_failed);
  return check_failed ? 1 : 0;
}
