/* cuda_start.h: the start every CUDA test program (tests/gpu/test_*.c) shares. */
#pragma once
#include <stdio.h>
#include "cuda.h"
#include "status.h"

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
