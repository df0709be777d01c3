/* optim.cu: AdamW and SGD over flat f32 master buffers on CUDA, with the formulas and the
 * f32 evaluation order of runtime/optim.c (PyTorch's single-tensor path):
 *   AdamW: g = grad * grad_scale;  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;
 *          v = b2 v + (1 - b2) g^2;  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   SGD:   g = grad * grad_scale + wd p;  buf = g on the first step, else
 *          momentum buf + (1 - dampening) g;  g = nesterov ? g + momentum buf : buf;  p -= lr g
 * AdamW is multi-tensor: one launch walks a table of up to MT_MAX buffers (a FlatParameter
 * shard each) cut into chunks, one chunk per block, reading grad (f32 or bf16), p, m, v once
 * and writing p, m, v and the optional bf16/f16/f32 shadow (the compute copy) once. */
#include "common.cuh"
#include "backend_internal.h"
extern "C" {
#include "optim_internal.h"
}

enum { MT_MAX = 16, MT_CHUNK = 8192, OPT_THREADS = 256 };


struct adamw_table {
  int n;
  float *p[MT_MAX], *m[MT_MAX], *v[MT_MAX];
  const void *g[MT_MAX];
  void *shadow[MT_MAX];
  int g_bf16[MT_MAX], shadow_dt[MT_MAX];
  int64_t numel[MT_MAX];
  int64_t first_chunk[MT_MAX + 1];   /* prefix sums of chunks per buffer */
};

__global__ void adamw_mt_kernel(const adamw_table t, const sh_adamw_hyper h) {
  int64_t c = blockIdx.x;
  int b = 0;
  while (b + 1 < t.n && c >= t.first_chunk[b + 1]) b++;
  int64_t i0 = (c - t.first_chunk[b]) * MT_CHUNK, i1 = min(t.numel[b], i0 + MT_CHUNK);
  float *p = t.p[b], *m = t.m[b], *v = t.v[b];
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    float g = (t.g_bf16[b] ? __bfloat162float(((const __nv_bfloat16 *)t.g[b])[i]) : ((const float *)t.g[b])[i]) * h.scale;
    float pi = p[i] * h.decay;
    float mi = m[i] * h.b1 + g * h.omb1;
    float vi = v[i] * h.b2 + g * g * h.omb2;
    pi -= h.step_size * (mi / (sqrtf(vi) / h.bc2_sqrt + h.eps));
    p[i] = pi; m[i] = mi; v[i] = vi;
    if (t.shadow[b]) ew_store<float>((char *)t.shadow[b], t.shadow_dt[b], i, pi);
  }
}


/* The table's kernels: runtime/optim.c checked every buffer (flat, param's numel and
 * device) and hyper-parameter, and bumps the versions. */
static int cuda_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                            sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                            double weight_decay, int64_t step, double grad_scale) {
  const char *op = "adamw";
  sh_adamw_hyper h = sh_adamw_hyper_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  int64_t n = sh_tensor_numel(param);
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, param->device, &st));
  adamw_table t;
  memset(&t, 0, sizeof t);
  t.n = 1;
  t.p[0] = (float *)sh_tensor_data(param);
  t.m[0] = (float *)sh_tensor_data(m);
  t.v[0] = (float *)sh_tensor_data(v);
  t.g[0] = sh_tensor_data(grad);
  t.g_bf16[0] = grad->dtype == SH_BF16;
  t.shadow[0] = shadow ? sh_tensor_data(shadow) : NULL;
  t.shadow_dt[0] = shadow ? shadow->dtype : SH_F32;
  t.numel[0] = n;
  t.first_chunk[1] = (n + MT_CHUNK - 1) / MT_CHUNK;
  if (t.first_chunk[t.n] > 0) {
    adamw_mt_kernel<<<(unsigned)t.first_chunk[t.n], OPT_THREADS, 0, st>>>(t, h);
    CU_LAUNCHED(op);
  }
  return SH_OK;
}

__global__ void sgd_kernel(float *p, const void *gp, int g_bf16, float *buf, int64_t n, float scale, float lr, float wd,
                           float momentum, float omd, int nesterov, int first) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float g = (g_bf16 ? __bfloat162float(((const __nv_bfloat16 *)gp)[i]) : ((const float *)gp)[i]) * scale;
    if (wd != 0.0f) g += wd * p[i];
    if (buf) {
      float b = first ? g : buf[i] * momentum + g * omd;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p[i] -= lr * g;
  }
}

static int cuda_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                          double momentum, double dampening, double weight_decay, int nesterov, int first_step,
                          double grad_scale) {
  const char *op = "sgd";
  sh_sgd_hyper h = sh_sgd_hyper_of(lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale);
  int64_t n = sh_tensor_numel(param);
  int dev = param->device;
  float *buf = h.has_buf ? (float *)sh_tensor_data(momentum_buf) : NULL;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, dev, &st));
  if (n > 0) {
    sgd_kernel<<<sh_blocks(n, OPT_THREADS), OPT_THREADS, 0, st>>>((float *)sh_tensor_data(param), sh_tensor_data(grad),
                                                                  grad->dtype == SH_BF16, buf, n, h.scale, h.lr, h.wd,
                                                                  h.momentum, h.omd, h.nesterov, h.first);
    CU_LAUNCHED(op);
  }
  return SH_OK;
}

extern "C" void sh_optim_register_cuda(sh_backend *b) {
  b->adamw_step_ = cuda_adamw_step_;
  b->sgd_step_ = cuda_sgd_step_;
}
