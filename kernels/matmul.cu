/* matmul.cu: every matrix product on CUDA goes through cuBLASLt; this file runs them
 * (lt_gemm_epi, matmul.cuh) for matmul (batched, broadcast batch dims), gemm_ and linear.cu,
 * whose fronts (runtime/ops/matmul.c, runtime/ops/linear.c) checked the arguments and
 * allocated the outputs. bf16 and f16 run on the tensor cores with f32 accumulation (outputs
 * in the input dtype, or f32 for gradient accumulation into an f32 dw); f32 runs in full f32
 * unless SHARD_TF32=1 allows TF32; f64 in f64.
 *
 * shard is row-major and cuBLASLt column-major: a row-major X[r, c] is the column-major
 * X^T, so D = op(A) op(B) is computed as D^T = op(B)^T op(A)^T with the operands swapped and
 * no copies. When the heuristic offers no kernel for an epilogue (linear.cu's fusions), or
 * cublasLtMatmul refuses the one it offered, the product runs plain and the caller does the
 * rest, so results never depend on what the library supports. SHARD_NO_LT_EPILOGUE=1 forces
 * that path (the GPU tests run both). A product's descriptor, layouts and algorithm (its
 * plan) are made once per device, shape, layout, dtype, epilogue, beta == 0 and alignment
 * (key_of) and kept in a bounded cache, so a steady-state call creates nothing and queries no
 * heuristic; each (device, stream) has one 32 MiB workspace, allocated once. */
#include "matmul.cuh"
#include <cublasLt.h>
#include <array>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdlib.h>
#include <string.h>

enum { LT_WORKSPACE = 32 << 20, MAX_DEVICES = 16 };

static cublasLtHandle_t lt_handles[MAX_DEVICES];
static std::map<cudaStream_t, void *> workspaces;
static std::mutex lt_lock;

static bool env_flag(const char *name) {
  const char *v = getenv(name);
  return v && v[0] && strcmp(v, "0") != 0;
}

/* cublasGetStatusString lives in libcublas, which shard does not otherwise link. */
static const char *lt_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "NOT_SUPPORTED";
    default: return "error";
  }
}

static int lt_fail(const char *op, cublasStatus_t s, int line) {
  return sh_fail(SH_ERR_DEVICE, "%s: cublasLt status %d (%s) at %s:%d", op, (int)s, lt_status_name(s), __FILE__, line);
}
#define LT_TRY(op, call) do { cublasStatus_t lt_s_ = (call); if (lt_s_ != CUBLAS_STATUS_SUCCESS) return lt_fail(op, lt_s_, __LINE__); } while (0)

static int lt_handle(const char *op, int device, cublasLtHandle_t *h) {
  std::lock_guard<std::mutex> g(lt_lock);
  if (!lt_handles[device]) LT_TRY(op, cublasLtCreate(&lt_handles[device]));
  *h = lt_handles[device];
  return SH_OK;
}

static int lt_workspace(const char *op, int device, cudaStream_t st, void **ws) {
  std::lock_guard<std::mutex> g(lt_lock);
  auto it = workspaces.find(st);
  if (it != workspaces.end()) { *ws = it->second; return SH_OK; }
  void *p = sh_mem_alloc(device, LT_WORKSPACE, SH_TAG_OTHER);
  if (!p) return sh_fail_context("%s: cublasLt workspace: ", op);
  workspaces[st] = p;
  *ws = p;
  return SH_OK;
}

static cudaDataType_t lt_type(int dt) {
  switch (dt) {
    case SH_F64: return CUDA_R_64F;
    case SH_BF16: return CUDA_R_16BF;
    case SH_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

static int align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int r = 256;
  while (r > 1 && (a % r)) r >>= 1;
  return r;
}

/* Everything a plan depends on: the device (its handle and its algorithms), shapes, leading
 * dims, batch and its strides, types, transposes, compute type, epilogue, beta == 0, and the
 * alignment of every pointer, bias and epilogue aux included (the heuristic reads those
 * pointers' values to know their alignment; an FSDP FlatParameter holds a bias at any element
 * offset). */
typedef std::array<int64_t, 23> lt_key;

static lt_key key_of(int device, const lt_gemm &g, cublasComputeType_t ct) {
  return lt_key{device, g.M, g.N, g.K, g.lda, g.ldb, g.ldd, g.batch, g.sA, g.sB, g.sD, g.ta, g.tb, g.in_dt, g.out_dt,
                (int64_t)ct, g.epi, g.beta != 0, align_of(g.A), align_of(g.B), align_of(g.D), align_of(g.bias),
                align_of(g.aux)};
}

/* One kind of product, made once: its descriptor, the layouts of A', B' and D', and the
 * algorithm the heuristic chose (ok false: none, or the library refused it at run time, so
 * calls go straight to the fallback). The bias and aux pointers differ per call, so a call
 * sets them on the descriptor and queues the product holding `use`. */
struct lt_plan {
  std::mutex use;
  cublasLtMatmulDesc_t desc = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  bool ok = false;
  cublasLtMatmulAlgo_t algo;
  ~lt_plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
  }
};
typedef std::shared_ptr<lt_plan> lt_plan_ref;

/* The plans, most recently used first; past PLAN_CAP the least recently used goes (a plan a
 * call still holds lives until that call ends). A training step uses a few dozen kinds of
 * product, so the bound only matters for a sweep of shapes. The cache, and with it every
 * descriptor, is destroyed with the process's static objects, as the devices go. */
enum { PLAN_CAP = 128 };
struct lt_plan_cache {
  std::list<std::pair<lt_key, lt_plan_ref>> lru;
  std::map<lt_key, std::list<std::pair<lt_key, lt_plan_ref>>::iterator> index;
};
static lt_plan_cache plans;

static lt_plan_ref plan_find(const lt_key &key) {
  std::lock_guard<std::mutex> lk(lt_lock);
  auto it = plans.index.find(key);
  if (it == plans.index.end()) return nullptr;
  plans.lru.splice(plans.lru.begin(), plans.lru, it->second);
  return it->second->second;
}

/* Adds p under key unless another thread got there first; returns the plan in the cache. */
static lt_plan_ref plan_insert(const lt_key &key, lt_plan_ref p) {
  std::lock_guard<std::mutex> lk(lt_lock);
  auto it = plans.index.find(key);
  if (it != plans.index.end()) return it->second->second;
  plans.lru.emplace_front(key, p);
  plans.index[key] = plans.lru.begin();
  while (plans.lru.size() > PLAN_CAP) {
    plans.index.erase(plans.lru.back().first);
    plans.lru.pop_back();
  }
  return p;
}

static cublasLtEpilogue_t lt_epilogue(int epi) {
  switch (epi) {
    case EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case EPI_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case EPI_BGRADB: return CUBLASLT_EPILOGUE_BGRADB;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

/* The per-call pointers of g's epilogue on desc. */
static int lt_set_pointers(const char *op, cublasLtMatmulDesc_t desc, const lt_gemm &g) {
  if (g.epi == EPI_BIAS || g.epi == EPI_GELU_AUX_BIAS || g.epi == EPI_BGRADB)
    LT_TRY(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  if (g.epi == EPI_GELU_AUX_BIAS || g.epi == EPI_DGELU)
    LT_TRY(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
  return SH_OK;
}

/* A layout of rows x cols at leading dim ld, over g's batch at batch stride `stride`. */
static int lt_layout(const char *op, cublasLtMatrixLayout_t *l, int dt, uint64_t rows, uint64_t cols, int64_t ld,
                     const lt_gemm &g, int64_t stride) {
  LT_TRY(op, cublasLtMatrixLayoutCreate(l, lt_type(dt), rows, cols, ld));
  if (g.batch > 1) {
    int32_t bc = (int32_t)g.batch;
    LT_TRY(op, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_TRY(op, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return SH_OK;
}

/* The heuristic's algorithm for p's descriptors under g's alignments; p->ok false when it has none. */
static int lt_choose(const char *op, cublasLtHandle_t h, const lt_gemm &g, lt_plan *p) {
  cublasLtMatmulPreference_t pref = NULL;
  LT_TRY(op, cublasLtMatmulPreferenceCreate(&pref));
  uint64_t wsb = LT_WORKSPACE;
  /* A' is our B, B' is our A. */
  uint32_t aa = (uint32_t)align_of(g.B), ab = (uint32_t)align_of(g.A), ad = (uint32_t)align_of(g.D);
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  /* A refusal here means no algorithm for this configuration, as found == 0 does. */
  p->ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p->ok) p->algo = res.algo;
  return SH_OK;
}

/* Makes the plan of g: descriptor, layouts (column-major: A' = B (N x K), B' = A (K x M),
 * D' = D (N x M)) and algorithm. */
static int lt_plan_make(const char *op, cublasLtHandle_t h, const lt_gemm &g, cublasComputeType_t ct, lt_plan *p) {
  cudaDataType_t scale_t = g.in_dt == SH_F64 ? CUDA_R_64F : CUDA_R_32F;
  cublasOperation_t opa = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = lt_epilogue(g.epi);
  LT_TRY(op, cublasLtMatmulDescCreate(&p->desc, ct, scale_t));
  LT_TRY(op, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT_TRY(op, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  LT_TRY(op, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (g.epi == EPI_GELU_AUX_BIAS || g.epi == EPI_DGELU) {
    int64_t aux_ld = g.N;
    LT_TRY(op, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  SH_TRY(lt_set_pointers(op, p->desc, g));
  SH_TRY(lt_layout(op, &p->la, g.in_dt, g.tb ? g.K : g.N, g.tb ? g.N : g.K, g.ldb, g, g.sB));
  SH_TRY(lt_layout(op, &p->lb, g.in_dt, g.ta ? g.M : g.K, g.ta ? g.K : g.M, g.lda, g, g.sA));
  SH_TRY(lt_layout(op, &p->ld, g.out_dt, (uint64_t)g.N, (uint64_t)g.M, g.ldd, g, g.sD));
  return lt_choose(op, h, g, p);
}

/* The cached plan of g, made on first use. */
static int lt_plan_of(const char *op, int device, cublasLtHandle_t h, const lt_gemm &g, cublasComputeType_t ct,
                      lt_plan_ref *out) {
  lt_key key = key_of(device, g, ct);
  if ((*out = plan_find(key))) return SH_OK;
  lt_plan_ref p = std::make_shared<lt_plan>();
  SH_TRY(lt_plan_make(op, h, g, ct, p.get()));
  *out = plan_insert(key, p);
  return SH_OK;
}

/* Runs g; returns SH_ERR_ARG (without a message) when no algorithm supports it or the library
 * refuses g's epilogue when it runs, so the caller can fall back to the epilogue-free product. */
static int lt_run(const char *op, int device, cudaStream_t st, const lt_gemm &g) {
  cublasLtHandle_t h = NULL;
  void *ws = NULL;
  SH_TRY(lt_handle(op, device, &h));
  SH_TRY(lt_workspace(op, device, st, &ws));
  bool f64 = g.in_dt == SH_F64;
  cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F
                         : (g.in_dt == SH_F32 ? (env_flag("SHARD_TF32") ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F)
                                              : CUBLAS_COMPUTE_32F);
  lt_plan_ref p;
  SH_TRY(lt_plan_of(op, device, h, g, ct, &p));
  std::lock_guard<std::mutex> use(p->use);
  if (!p->ok) return SH_ERR_ARG;
  SH_TRY(lt_set_pointers(op, p->desc, g));
  float af = (float)g.alpha, bf = (float)g.beta;
  const void *alpha = f64 ? (const void *)&g.alpha : (const void *)&af;
  const void *beta = f64 ? (const void *)&g.beta : (const void *)&bf;
  cublasStatus_t s = cublasLtMatmul(h, p->desc, alpha, g.B, p->la, g.A, p->lb, beta, g.D, p->ld, g.D, p->ld, &p->algo, ws,
                                    LT_WORKSPACE, st);
  if (s != CUBLAS_STATUS_SUCCESS && g.epi != EPI_NONE) {
    /* The library may refuse at run time an epilogue its heuristic offered ("not supported"
     * on this device): fall back, and have later calls of this plan go straight there. */
    p->ok = false;
    return SH_ERR_ARG;
  }
  LT_TRY(op, s);
  return SH_OK;
}

/* Runs g, its epilogue fused when the library can (matmul.cuh). */
int lt_gemm_epi(const char *op, int device, cudaStream_t st, lt_gemm g, int *fused) {
  *fused = 0;
  if (g.epi != EPI_NONE && !env_flag("SHARD_NO_LT_EPILOGUE")) {
    int rc = lt_run(op, device, st, g);
    if (rc == SH_OK) { *fused = 1; return SH_OK; }
    if (rc != SH_ERR_ARG) return rc;
  }
  g.epi = EPI_NONE;
  int rc = lt_run(op, device, st, g);
  if (rc == SH_ERR_ARG)
    return sh_fail(SH_ERR_DEVICE, "%s: cublasLt has no algorithm for [%lld x %lld] @ [%lld x %lld] in %s", op,
                   (long long)g.M, (long long)g.K, (long long)g.K, (long long)g.N, sh_dtype_name(g.in_dt));
  return rc;
}
/* ---- matmul and gemm_ ------------------------------------------------------------------------ */

/* A 2-D operand cuBLASLt can read in place: row-major (stride[1] == 1) or a transposed view
 * (stride[0] == 1); *ld and *trans describe it. */
static bool lt_operand(const sh_tensor *t, int64_t *ld, int *trans) {
  int64_t r = t->shape[0], c = t->shape[1], s0 = t->stride[0], s1 = t->stride[1];
  if ((s1 == 1 || c == 1) && s0 >= (c > 1 ? c : 1) && s0 > 0) { *ld = s0; *trans = 0; return true; }
  if ((s0 == 1 || r == 1) && s1 >= (r > 1 ? r : 1) && s1 > 0) { *ld = s1; *trans = 1; return true; }
  if (r <= 1 && c <= 1) { *ld = 1; *trans = 0; return true; }
  return false;
}

extern "C" int sh_kcuda_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b,
                              double alpha, double beta) {
  const char *op = "gemm_";
  int64_t M = c->shape[0], N = c->shape[1], K = trans_a ? a->shape[0] : a->shape[1];
  int dev = c->device;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, dev, &st));
  if (M == 0 || N == 0) return SH_OK;
  /* Inputs in c's dtype, except bf16/f16 inputs may feed an f32 c directly. */
  int in_dt = c->dtype;
  if (c->dtype == SH_F32 && a->dtype == b->dtype && (a->dtype == SH_BF16 || a->dtype == SH_F16)) in_dt = a->dtype;
  sh_tguard ac, bc, cc;
  int64_t lda, ldb, ldc;
  int ta, tb, tc;
  if (a->dtype != in_dt || !lt_operand(a, &lda, &ta)) { SH_TRY(sh_cuda_contiguous_as(ac.out(), a, in_dt)); lt_operand(ac.t, &lda, &ta); }
  if (b->dtype != in_dt || !lt_operand(b, &ldb, &tb)) { SH_TRY(sh_cuda_contiguous_as(bc.out(), b, in_dt)); lt_operand(bc.t, &ldb, &tb); }
  const sh_tensor *A = ac.t ? ac.t : a, *B = bc.t ? bc.t : b;
  bool c_direct = lt_operand(c, &ldc, &tc) && tc == 0;
  if (!c_direct) { SH_TRY(sh_cuda_contiguous_as(cc.out(), c, c->dtype)); ldc = N; }
  if (K == 0) {
    sh_tensor *cs = c_direct ? c : cc.t;
    cs->version++;
    SH_TRY(sh_kcuda_scale_(cs, beta));
  } else {
    lt_gemm g;
    memset(&g, 0, sizeof g);
    g.M = M; g.N = N; g.K = K;
    g.A = sh_tensor_data(A); g.lda = lda; g.ta = trans_a ^ ta;
    g.B = sh_tensor_data(B); g.ldb = ldb; g.tb = trans_b ^ tb;
    g.D = sh_tensor_data(c_direct ? c : cc.t); g.ldd = ldc;
    g.in_dt = in_dt; g.out_dt = c->dtype; g.alpha = alpha; g.beta = beta; g.batch = 1;
    int fused;
    SH_TRY(lt_gemm_epi(op, dev, st, g, &fused));
  }
  if (!c_direct) SH_TRY(sh_kernel_copy_(c, cc.t));
  return SH_OK;
}

/* Batched product of contiguous a [batch_a..., M, K] and b [batch_b..., K, N] into o, whose
 * leading dims are the batch dims the front broadcast: one strided-batched call when each
 * side's batch is either full or a single matrix (stride 0); otherwise the operands are
 * expanded into dense copies first. */
extern "C" int sh_kcuda_matmul(sh_tensor *o, const sh_tensor *a, const sh_tensor *b) {
  const char *op = "matmul";
  int dt = o->dtype, dev = a->device;
  /* 1-D operands become [1, K] and [K, 1]; their unit dim is dropped from the result. */
  int64_t as[SH_MAX_DIMS + 1], bs[SH_MAX_DIMS + 1];
  int an = a->ndim, bn = b->ndim;
  memcpy(as, a->shape, sizeof(int64_t) * an);
  memcpy(bs, b->shape, sizeof(int64_t) * bn);
  if (an == 1) { as[1] = as[0]; as[0] = 1; an = 2; }
  if (bn == 1) { bs[1] = 1; bn = 2; }
  int64_t M = as[an - 2], K = as[an - 1], N = bs[bn - 1];
  int nb = o->ndim - (a->ndim > 1) - (b->ndim > 1);
  int64_t batch = 1, batch_a = 1, batch_b = 1;
  for (int d = 0; d < nb; d++) batch *= o->shape[d];
  for (int d = 0; d < an - 2; d++) batch_a *= as[d];
  for (int d = 0; d < bn - 2; d++) batch_b *= bs[d];
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, dev, &st));
  if (batch == 0 || M == 0 || N == 0) return SH_OK;
  if (K == 0) return sh_kernel_fill_(o, 0.0);
  /* Views with the 1-D promotion applied, then dense copies in dt. */
  sh_tguard av, bv, ae, be, ac, bc;
  SH_TRY(sh_view_reshape(av.out(), a, an, as));
  SH_TRY(sh_view_reshape(bv.out(), b, bn, bs));
  const sh_tensor *A = av.t, *B = bv.t;
  /* A side whose batch is neither full nor one matrix is expanded to the full batch. */
  int64_t full[SH_MAX_DIMS];
  memcpy(full, o->shape, sizeof(int64_t) * nb);
  if (batch_a != batch && batch_a != 1) {
    full[nb] = M; full[nb + 1] = K;
    SH_TRY(sh_view_expand(ae.out(), A, nb + 2, full));
    A = ae.t;
    batch_a = batch;
  }
  if (batch_b != batch && batch_b != 1) {
    full[nb] = K; full[nb + 1] = N;
    SH_TRY(sh_view_expand(be.out(), B, nb + 2, full));
    B = be.t;
    batch_b = batch;
  }
  SH_TRY(sh_cuda_contiguous_as(ac.out(), A, dt));
  SH_TRY(sh_cuda_contiguous_as(bc.out(), B, dt));
  lt_gemm g;
  memset(&g, 0, sizeof g);
  g.K = K; g.N = N;
  g.B = sh_tensor_data(bc.t); g.ldb = N; g.tb = 0;
  g.A = sh_tensor_data(ac.t); g.lda = K; g.ta = 0;
  g.D = sh_tensor_data(o); g.ldd = N;
  g.in_dt = dt; g.out_dt = dt; g.alpha = 1; g.beta = 0;
  if (batch_b == 1) {         /* a shared right operand: fold the batch into the rows */
    g.M = batch * M; g.batch = 1;
  } else {
    g.M = M; g.batch = batch;
    g.sA = batch_a == 1 ? 0 : M * K;
    g.sB = N * K;
    g.sD = M * N;
  }
  int fused;
  return lt_gemm_epi(op, dev, st, g, &fused);
}
