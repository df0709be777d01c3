/* gpu_test.h: what the CUDA test programs (tests/gpu/test_*.c) share: their start, a seeded
 * random tensor and a copy to a device. */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include "core/cuda.h"
#include "ops/ops.h"
#include "core/status.h"
#include "core/tensor.h"

/* Starts cuda:device for the program `name`: -1 to go on, else the status main returns: 0
 * after the "skipped (0 passed, 0 failed)" line that tests/run_gpu.sh counts where there is no
 * device, 1 when the device does not start. */
static inline int cuda_test_start(const char *name, int device) {
  if (sh_cuda_device_count() == 0) {
    printf("C %s: no CUDA device; skipped (0 passed, 0 failed)\n", name);
    return 0;
  }
  if (sh_cuda_init(device)) {
    printf("cuda init: %s\n", sh_last_error());
    return 1;
  }
  return -1;
}

/* A host tensor of dtype with normal(mean, std) values from the runtime's seeded generator
 * (drawn in f32, then rounded to dtype); the program stops (exit 2) when it cannot be made. */
static inline sh_tensor *gpu_random(int ndim, const int64_t *shape, int dtype, uint64_t seed, double mean, double std) {
  sh_tensor *t = NULL, *f = NULL;
  if (sh_tensor_empty(&f, ndim, shape, SH_F32, -1) || sh_random_normal_(f, seed, 0, mean, std) ||
      sh_tensor_to(&t, f, dtype, -1)) {
    printf("making a tensor: %s\n", sh_last_error());
    exit(2);
  }
  sh_tensor_destroy(f);
  return t;
}

/* A copy of t (NULL: NULL) on device; the program stops (exit 2) when it cannot be made. */
static inline sh_tensor *gpu_on(const sh_tensor *t, int device) {
  sh_tensor *r = NULL;
  if (t && sh_tensor_to(&r, t, t->dtype, device)) { printf("moving a tensor: %s\n", sh_last_error()); exit(2); }
  return r;
}
