/* test_kernels.h: the two small kernels the emulator's stream and graph self-tests
 * (test_emu_graph.cu, test_emu_capture.cu) produce and consume data with. */
#pragma once
#include <cuda_runtime.h>

/* y[i] = v + i */
__global__ void fill_kernel(float *y, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = v + (float)i;
}

/* y[i] = 2 x[i] */
__global__ void twice_kernel(const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
