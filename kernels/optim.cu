/* optim.cu: AdamW and SGD over flat f32 master buffers on CUDA, and the gradient-norm part,
 * with the formulas and the f32 evaluation order of runtime/cpu/optim.c (PyTorch's single-tensor
 * path):
 *   AdamW: g = grad * grad_scale;  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;
 *          v = b2 v + (1 - b2) g^2;  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   SGD:   g = grad * grad_scale + wd p;  buf = g on the first step, else
 *          momentum buf + (1 - dampening) g;  g = nesterov ? g + momentum buf : buf;  p -= lr g
 * AdamW is multi-tensor: one launch walks a table of up to MT_MAX buffers (a FlatParameter
 * shard each) cut into chunks, one chunk per block, reading grad (f32 or bf16), p, m, v once
 * and writing p, m, v and the optional bf16/f16/f32 shadow (the compute copy) once, with
 * 16-byte accesses where every buffer of a parameter is 16-byte aligned (8 elements a step);
 * a clip's coefficient, left on the device by grad_clip_coef, is read once per block into the
 * gradient scale. In a captured CUDA graph the per-step constants (the lr of each step's
 * schedule, the bias correction) come from a buffer of the graph filled before each launch;
 * SGD's too. The gradient-norm part walks the same kind of table into one f64 on the device. */
#include <memory>
#include "common.cuh"
#include "core/backend_internal.h"
extern "C" {

}

enum { MT_MAX = 16, MT_CHUNK = 8192, OPT_THREADS = 256 };

/* Up to MT_MAX non-empty flat buffers cut into chunks of MT_CHUNK elements, one chunk per
 * block: buffer b has the chunks [first_chunk[b], first_chunk[b + 1]). */
struct mt_chunks {
  int n;
  int64_t numel[MT_MAX];
  int64_t first_chunk[MT_MAX + 1];
};

static void mt_add(mt_chunks *c, int64_t numel) {
  c->numel[c->n] = numel;
  c->first_chunk[c->n + 1] = c->first_chunk[c->n] + (numel + MT_CHUNK - 1) / MT_CHUNK;
  c->n++;
}

/* The buffer of this block's chunk, and the chunk's element range [*i0, *i1) in it. */
__device__ __forceinline__ int mt_locate(const mt_chunks &c, int64_t *i0, int64_t *i1) {
  int64_t chunk = blockIdx.x;
  int b = 0;
  while (b + 1 < c.n && chunk >= c.first_chunk[b + 1]) b++;
  *i0 = (chunk - c.first_chunk[b]) * MT_CHUNK;
  *i1 = min(c.numel[b], *i0 + MT_CHUNK);
  return b;
}

/* ---- AdamW ------------------------------------------------------------------------------ */

struct adamw_table {
  mt_chunks c;
  float *p[MT_MAX], *m[MT_MAX], *v[MT_MAX];
  const void *g[MT_MAX];
  void *shadow[MT_MAX];
  int g_bf16[MT_MAX], shadow_dt[MT_MAX];
  int wide[MT_MAX];                  /* every buffer 16-byte aligned: the 16-byte path */
  const float *clip[MT_MAX];         /* NULL, or the clip coefficient on the device */
};

/* The per-step constants of one launch: the hyper-parameters and each buffer's decay factor
 * 1 - lr wd (the weight decay is the parameter's own), all following the lr and step count. */
struct adamw_consts {
  sh_adamw_hyper h;
  float decay[MT_MAX];
};

/* One element's update, returning the new p: the one formula of both paths, so they give the
 * same bits. */
__device__ __forceinline__ float adamw_elem(float g, float p, float *m, float *v, float decay, const sh_adamw_hyper &h) {
  float pi = p * decay;
  float mi = *m * h.b1 + g * h.omb1;
  float vi = *v * h.b2 + g * g * h.omb2;
  pi -= h.step_size * (mi / (sqrtf(vi) / h.bc2_sqrt + h.eps));
  *m = mi;
  *v = vi;
  return pi;
}

/* AW consecutive elements go through 16-byte accesses: two of f32 (p, m, v, an f32 grad or
 * shadow), one of bf16/f16 (the grad, the shadow). */
enum { AW = 8 };
struct f32x8 { float4 lo, hi; };

__device__ __forceinline__ void load_f32x8(const float *p, float *x) {
  f32x8 r = *reinterpret_cast<const f32x8 *>(p);
  const float *f = reinterpret_cast<const float *>(&r);
#pragma unroll
  for (int k = 0; k < AW; k++) x[k] = f[k];
}

__device__ __forceinline__ void store_f32x8(float *p, const float *x) {
  f32x8 r;
  float *f = reinterpret_cast<float *>(&r);
#pragma unroll
  for (int k = 0; k < AW; k++) f[k] = x[k];
  *reinterpret_cast<f32x8 *>(p) = r;
}

__device__ __forceinline__ void load_grad8(const adamw_table &t, int b, int64_t i, float *g) {
  if (!t.g_bf16[b]) { load_f32x8((const float *)t.g[b] + i, g); return; }
  int4 r = *reinterpret_cast<const int4 *>((const __nv_bfloat16 *)t.g[b] + i);
  const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&r);
#pragma unroll
  for (int k = 0; k < AW; k++) g[k] = __bfloat162float(h[k]);
}

template <typename T> __device__ __forceinline__ void store_half8(void *dst, const float *x) {
  int4 r;
  T *h = reinterpret_cast<T *>(&r);
#pragma unroll
  for (int k = 0; k < AW; k++) h[k] = from_f<T>(x[k]);
  *reinterpret_cast<int4 *>(dst) = r;
}

__device__ __forceinline__ void store_shadow8(const adamw_table &t, int b, int64_t i, const float *x) {
  switch (t.shadow_dt[b]) {
    case SH_F32: store_f32x8((float *)t.shadow[b] + i, x); break;
    case SH_BF16: store_half8<__nv_bfloat16>((__nv_bfloat16 *)t.shadow[b] + i, x); break;
    default: store_half8<__half>((__half *)t.shadow[b] + i, x); break;
  }
}

/* Elements [i, i + AW) of buffer b, all 16-byte aligned. */
__device__ __forceinline__ void adamw_wide(const adamw_table &t, int b, int64_t i, float scale, float decay,
                                           const sh_adamw_hyper &h) {
  float g[AW], p[AW], m[AW], v[AW];
  load_grad8(t, b, i, g);
  load_f32x8(t.p[b] + i, p);
  load_f32x8(t.m[b] + i, m);
  load_f32x8(t.v[b] + i, v);
#pragma unroll
  for (int k = 0; k < AW; k++) p[k] = adamw_elem(g[k] * scale, p[k], &m[k], &v[k], decay, h);
  store_f32x8(t.p[b] + i, p);
  store_f32x8(t.m[b] + i, m);
  store_f32x8(t.v[b] + i, v);
  if (t.shadow[b]) store_shadow8(t, b, i, p);
}

/* Element i of buffer b, one access each. */
__device__ __forceinline__ void adamw_one(const adamw_table &t, int b, int64_t i, float scale, float decay,
                                          const sh_adamw_hyper &h) {
  float g = t.g_bf16[b] ? __bfloat162float(((const __nv_bfloat16 *)t.g[b])[i]) : ((const float *)t.g[b])[i];
  float pi = adamw_elem(g * scale, t.p[b][i], &t.m[b][i], &t.v[b][i], decay, h);
  t.p[b][i] = pi;
  if (t.shadow[b]) ew_store<float>((char *)t.shadow[b], t.shadow_dt[b], i, pi);
}

/* A chunk starts at a multiple of MT_CHUNK (a multiple of AW) elements, so on an aligned buffer
 * its whole groups of AW are aligned; the rest of the chunk (a buffer's last AW - 1 elements at
 * most) and unaligned buffers go one element at a time. The constants are k_arg's, or in a
 * captured graph those at k_dev. */
__global__ void adamw_mt_kernel(const adamw_table t, const adamw_consts k_arg, const adamw_consts *k_dev) {
  const sh_adamw_hyper h = k_dev ? k_dev->h : k_arg.h;
  int64_t i0, i1;
  int b = mt_locate(t.c, &i0, &i1);
  float decay = k_dev ? k_dev->decay[b] : k_arg.decay[b];
  float scale = t.clip[b] ? h.scale * *t.clip[b] : h.scale;   /* as optim.c: one f32 product */
  int64_t tail = i0;
  if (t.wide[b]) {
    tail = i0 + (i1 - i0) / AW * AW;
    for (int64_t i = i0 + (int64_t)threadIdx.x * AW; i < tail; i += (int64_t)blockDim.x * AW)
      adamw_wide(t, b, i, scale, decay, h);
  }
  for (int64_t i = tail + threadIdx.x; i < i1; i += blockDim.x) adamw_one(t, b, i, scale, decay, h);
}

/* What one launch's constants follow from: the optimizer's settings, the step's lr and
 * count, and the weight decay of each buffer of the table. */
struct adamw_step {
  double beta1, beta2, eps, grad_scale;
  int n;                             /* buffers in the table */
  double wd[MT_MAX];
};

/* The constants of the step with this lr and count, by optim.c's formula (rules.c), so a
 * graph's launch gives the bits of the eager step. */
static adamw_consts adamw_consts_of(const adamw_step &s, double lr, int64_t step) {
  adamw_consts k;
  memset(&k, 0, sizeof k);
  k.h = sh_adamw_hyper_of(lr, s.beta1, s.beta2, s.eps, 0, step, s.grad_scale);
  for (int b = 0; b < s.n; b++)
    k.decay[b] = sh_adamw_hyper_of(lr, s.beta1, s.beta2, s.eps, s.wd[b], step, s.grad_scale).decay;
  return k;
}

/* In a captured graph the lr (a schedule's) and the step count (the bias correction) change
 * with every launch, so an optimizer's kernel reads its constants (a T) from a buffer of the
 * graph, filled on the host before each launch with make(launch, lr): the constants of the
 * step that launch runs (the captured one is launch 0), at the lr the graph was given for it
 * (captured_lr until then). *out: the buffer. */
template <class T, class F>
static int graph_consts(const char *op, sh_cuda_graph *g, double captured_lr, F make, const T **out) {
  T *buf = (T *)sh_cuda_graph_buffer(g, sizeof(T));
  if (!buf) return sh_fail_context("%s: the graph's step constants: ", op);
  *out = buf;
  return sh_cuda_graph_before_launch(g, captured_lr, [=](cudaStream_t stream, int64_t launch, double lr) -> int {
    T k = make(launch, lr);
    CU_TRY(op, cudaMemcpyAsync(buf, &k, sizeof k, cudaMemcpyHostToDevice, stream));
    return SH_OK;
  });
}

/* Launches t's group (s: its weight decays) and empties it. */
static int adamw_launch(adamw_table *t, adamw_step *s, double lr, int64_t step, int device, cudaStream_t st) {
  s->n = t->c.n;
  const adamw_consts *k_dev = NULL;
  if (sh_cuda_graph *g = sh_cuda_graph_capturing(device)) {   /* betas, eps, grad_scale and decays: the capture's */
    adamw_step c = *s;
    auto make = [=](int64_t launch, double lr_now) { return adamw_consts_of(c, lr_now, step + launch); };
    SH_TRY(graph_consts("adamw", g, lr, make, &k_dev));
  }
  adamw_mt_kernel<<<(unsigned)t->c.first_chunk[t->c.n], OPT_THREADS, 0, st>>>(*t, adamw_consts_of(*s, lr, step), k_dev);
  CU_LAUNCHED("adamw");
  memset(t, 0, sizeof *t);
  return SH_OK;
}

/* The table's kernel: runtime/cpu/optim.c checked every buffer (flat, param's numel, one device)
 * and hyper-parameter, and bumps the versions. One launch per MT_MAX non-empty parameters. */
extern "C" int sh_kcuda_adamw_step_multi_(int n, const sh_adamw_param *ps, double lr, double beta1, double beta2,
                                          double eps, int64_t step, double grad_scale) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter("adamw", ps[0].param->device, &st));
  adamw_step s;
  memset(&s, 0, sizeof s);
  s.beta1 = beta1, s.beta2 = beta2, s.eps = eps, s.grad_scale = grad_scale;
  adamw_table t;
  memset(&t, 0, sizeof t);
  for (int i = 0; i < n; i++) {
    const sh_adamw_param *e = &ps[i];
    int64_t numel = sh_tensor_numel(e->param);
    if (numel == 0) continue;
    int k = t.c.n;
    t.p[k] = (float *)sh_tensor_data(e->param);
    t.m[k] = (float *)sh_tensor_data(e->m);
    t.v[k] = (float *)sh_tensor_data(e->v);
    t.g[k] = sh_tensor_data(e->grad);
    t.g_bf16[k] = e->grad->dtype == SH_BF16;
    t.shadow[k] = e->shadow ? sh_tensor_data(e->shadow) : NULL;
    t.shadow_dt[k] = e->shadow ? e->shadow->dtype : SH_F32;
    t.clip[k] = e->clip ? (const float *)sh_tensor_data(e->clip) : NULL;
    t.wide[k] = sh_aligned16(t.p[k]) && sh_aligned16(t.m[k]) && sh_aligned16(t.v[k]) && sh_aligned16(t.g[k]) &&
                (!t.shadow[k] || sh_aligned16(t.shadow[k]));
    s.wd[k] = e->weight_decay;
    mt_add(&t.c, numel);
    if (t.c.n == MT_MAX) SH_TRY(adamw_launch(&t, &s, lr, step, ps[0].param->device, st));
  }
  if (t.c.n > 0) SH_TRY(adamw_launch(&t, &s, lr, step, ps[0].param->device, st));
  return SH_OK;
}

/* ---- gradient-norm part ----------------------------------------------------------------- */

/* Each block writes the part of its chunk (weighted by its buffer's weight, except for the
 * max) to partial[block]; one block then reduces the partials in a fixed order, so the result
 * does not depend on the schedule. Accumulation is in f64. */
struct norm_table {
  mt_chunks c;
  const char *x[MT_MAX];
  int dt[MT_MAX];
  double w[MT_MAX];
};

__device__ __forceinline__ double nan_max(double a, double b) { return (b > a || b != b) ? b : a; }

__device__ __forceinline__ double norm_acc(int kind, double acc, double x) {
  return kind == SH_NORM_L2 ? acc + x * x : kind == SH_NORM_L1 ? acc + fabs(x) : nan_max(acc, fabs(x));
}

/* The sum or (kind SH_NORM_MAX) the NaN-propagating max over the block; `shared` holds 32. */
__device__ double norm_block(int kind, double v, double *shared) {
  if (kind != SH_NORM_MAX) return block_sum_d(v, shared);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void norm_mt_kernel(const norm_table t, int kind, double *partial) {
  __shared__ double shared[32];
  int64_t i0, i1;
  int b = mt_locate(t.c, &i0, &i1);
  double acc = 0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc = norm_acc(kind, acc, ew_load<double>(t.x[b], t.dt[b], i));
  acc = norm_block(kind, acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = kind == SH_NORM_MAX ? acc : acc * t.w[b];
}

__global__ void norm_total_kernel(const double *partial, int64_t n, int kind, double *out) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    acc = kind == SH_NORM_MAX ? nan_max(acc, partial[i]) : acc + partial[i];
  acc = norm_block(kind, acc, shared);
  if (threadIdx.x == 0) *out = acc;
}

/* Launches t's group, writing partial[*done ...), and empties t. */
static int norm_launch(norm_table *t, int kind, double *partial, int64_t *done, cudaStream_t st) {
  int64_t blocks = t->c.first_chunk[t->c.n];
  norm_mt_kernel<<<(unsigned)blocks, OPT_THREADS, 0, st>>>(*t, kind, partial + *done);
  CU_LAUNCHED("grad_norm");
  *done += blocks;
  memset(t, 0, sizeof *t);
  return SH_OK;
}

/* The table's kernel (optim.c checked the float tensors, on out's device): strided tensors
 * are made contiguous, the partials of all chunks go to one device buffer (one launch per
 * MT_MAX tensors), and one more launch sums them into out. */
extern "C" int sh_kcuda_grad_norm_part(sh_tensor *out, int n, const sh_tensor *const *ts, const double *weights, int kind) {
  const char *op = "grad_norm";
  int device = out->device;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, device, &st));
  std::unique_ptr<sh_tguard[]> dense(new sh_tguard[n]);
  int64_t chunks = 0;
  for (int i = 0; i < n; i++) {
    SH_TRY(sh_cuda_contiguous_as(dense[i].out(), ts[i], ts[i]->dtype));
    chunks += (sh_tensor_numel(ts[i]) + MT_CHUNK - 1) / MT_CHUNK;
  }
  sh_tguard buf;   /* the partials */
  int64_t len[1] = {chunks};
  if (chunks > 0) SH_TRY(sh_tensor_empty(buf.out(), 1, len, SH_F64, device));
  double *partial = buf.t ? (double *)sh_tensor_data(buf.t) : NULL;
  norm_table t;
  memset(&t, 0, sizeof t);
  int64_t done = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = sh_tensor_numel(dense[i].t);
    if (numel == 0) continue;
    int k = t.c.n;
    t.x[k] = (const char *)sh_tensor_data(dense[i].t);
    t.dt[k] = dense[i].t->dtype;
    t.w[k] = weights ? weights[i] : 1.0;
    mt_add(&t.c, numel);
    if (t.c.n == MT_MAX) SH_TRY(norm_launch(&t, kind, partial, &done, st));
  }
  if (t.c.n > 0) SH_TRY(norm_launch(&t, kind, partial, &done, st));
  norm_total_kernel<<<1, 1024, 0, st>>>(partial, chunks, kind, (double *)sh_tensor_data(out));
  CU_LAUNCHED(op);
  return SH_OK;
}

__global__ void clip_coef_kernel(float *coef, double *norm, const double *part, int kind, double max_norm) {
  double n = sh_clip_norm_of(*part, kind);
  *norm = n;
  *coef = sh_clip_coef_of(n, max_norm);
}

extern "C" int sh_kcuda_grad_clip_coef(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, int kind, double max_norm) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter("grad_clip_coef", part->device, &st));
  clip_coef_kernel<<<1, 1, 0, st>>>((float *)sh_tensor_data(coef), (double *)sh_tensor_data(norm),
                                    (const double *)sh_tensor_data(part), kind, max_norm);
  CU_LAUNCHED("grad_clip_coef");
  return SH_OK;
}

/* The constants are h_arg's, or in a captured graph those at h_dev. */
__global__ void sgd_kernel(float *p, const void *gp, int g_bf16, float *buf, int64_t n, const sh_sgd_hyper h_arg,
                           const sh_sgd_hyper *h_dev) {
  const sh_sgd_hyper h = h_dev ? *h_dev : h_arg;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float g = (g_bf16 ? __bfloat162float(((const __nv_bfloat16 *)gp)[i]) : ((const float *)gp)[i]) * h.scale;
    if (h.wd != 0.0f) g += h.wd * p[i];
    if (buf) {
      float b = h.first ? g : buf[i] * h.momentum + g * h.omd;
      buf[i] = b;
      g = h.nesterov ? g + h.momentum * b : b;
    }
    p[i] -= h.lr * g;
  }
}

extern "C" int sh_kcuda_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
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
    const sh_sgd_hyper *h_dev = NULL;
    if (sh_cuda_graph *g = sh_cuda_graph_capturing(dev)) {   /* only the captured step (launch 0) can be the first */
      auto make = [=](int64_t launch, double lr_now) {
        int first = first_step && launch == 0;
        return sh_sgd_hyper_of(lr_now, momentum, dampening, weight_decay, nesterov, first, grad_scale);
      };
      SH_TRY(graph_consts(op, g, lr, make, &h_dev));
    }
    sgd_kernel<<<sh_blocks(n, OPT_THREADS), OPT_THREADS, 0, st>>>((float *)sh_tensor_data(param), sh_tensor_data(grad),
                                                                  grad->dtype == SH_BF16, buf, n, h, h_dev);
    CU_LAUNCHED(op);
  }
  return SH_OK;
}
