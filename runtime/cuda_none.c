/* cuda_none.c: linked instead of kernels/ when nvcc is absent; CUDA requests fail cleanly. */
#include "status_internal.h"

int sh_cuda_device_count(void) { return 0; }
