/* lib_cublaslt.cpp: the emulator's cuBLASLt (cublaslt.cpp) against a float64 reference and
 * against the rules of the cuBLAS documentation.
 *  - every emulated epilogue x every TRANSA/TRANSB combination x the type rows of the
 *    datatypes table shard uses (16BF->16BF, 16BF->32F, 16F->16F, 32F, 32F_FAST_TF32, 64F),
 *    with alpha and beta, in place, through AlgoGetHeuristic + Matmul on a stream;
 *  - strided batches (a broadcast operand with stride 0, aux with a batch stride);
 *  - a zero beta never reads C (device memory starts as NaN);
 *  - TF32 really rounds the inputs;
 *  - configurations the library refuses return its status (each names its rule);
 *  - a bias less aligned than the algorithm was chosen for faults asynchronously. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "emu_api.h"
#include "emu_test.h"
#include "tests/lib_check.h"

namespace {

std::mt19937 rng(77);
double uni(double lo = -1, double hi = 1) { return std::uniform_real_distribution<double>(lo, hi)(rng); }

size_t tsize(cudaDataType t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }
double rd(const std::vector<unsigned char> &b, cudaDataType t, size_t i) {
  switch (t) {
    case CUDA_R_16BF: { __nv_bfloat16 v; memcpy(&v, &b[i * 2], 2); return __bfloat162float(v); }
    case CUDA_R_16F: { __half v; memcpy(&v, &b[i * 2], 2); return __half2float(v); }
    case CUDA_R_32F: { float v; memcpy(&v, &b[i * 4], 4); return v; }
    default: { double v; memcpy(&v, &b[i * 8], 8); return v; }
  }
}
void wr(std::vector<unsigned char> &b, cudaDataType t, size_t i, double x) {
  switch (t) {
    case CUDA_R_16BF: { __nv_bfloat16 v = __double2bfloat16(x); memcpy(&b[i * 2], &v, 2); break; }
    case CUDA_R_16F: { __half v = __double2half(x); memcpy(&b[i * 2], &v, 2); break; }
    case CUDA_R_32F: { float v = (float)x; memcpy(&b[i * 4], &v, 4); break; }
    default: memcpy(&b[i * 8], &x, 8);
  }
}
double eps_of(cudaDataType t) { return t == CUDA_R_16BF ? 1.0 / 256 : t == CUDA_R_16F ? 1.0 / 2048 : t == CUDA_R_32F ? 1.2e-7 : 2.3e-16; }

struct dbuf {
  void *p = nullptr;
  size_t bytes = 0;
  explicit dbuf(size_t n) : bytes(n) { cudaMalloc(&p, n ? n : 1); }
  ~dbuf() { cudaFree(p); }
  void put(const std::vector<unsigned char> &h) { cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice); }
  std::vector<unsigned char> get() {
    std::vector<unsigned char> h(bytes);
    cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
};

double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

struct spec {
  cudaDataType at, ct;
  cublasComputeType_t comp;
  int ta, tb;
  int64_t m, n, k;
  int batch;
  bool bcast_a;             /* A repeats one matrix across the batch (stride 0) */
  cublasLtEpilogue_t epi;
  double alpha, beta;
};

unsigned flags(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return 1;
    case CUBLASLT_EPILOGUE_RELU: return 2;
    case CUBLASLT_EPILOGUE_RELU_BIAS: return 1 | 2;
    case CUBLASLT_EPILOGUE_GELU: return 4;
    case CUBLASLT_EPILOGUE_GELU_AUX: return 4 | 8;
    case CUBLASLT_EPILOGUE_GELU_BIAS: return 1 | 4;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return 1 | 4 | 8;
    case CUBLASLT_EPILOGUE_DGELU: return 16;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return 16 | 32;
    case CUBLASLT_EPILOGUE_BGRADA: return 64;
    case CUBLASLT_EPILOGUE_BGRADB: return 128;
    default: return 0;
  }
}

cublasLtHandle_t H;

/* Runs one product through heuristic + matmul and compares D (and aux / bias) with float64.
 * Returns the number of wrong elements; -1 when a call failed. */
int run_case(const spec &s, const char *tag) {
  unsigned f = flags(s.epi);
  int64_t arows = s.ta ? s.k : s.m, acols = s.ta ? s.m : s.k, brows = s.tb ? s.n : s.k, bcols = s.tb ? s.k : s.n;
  int64_t lda = arows + 3, ldb = brows + 1, ldd = s.m + 2, auxld = (s.m + 7) / 8 * 8 + 8;
  int64_t sa = s.bcast_a ? 0 : lda * acols + 5, sb = ldb * bcols + 3, sd = ldd * s.n + 7, saux = auxld * s.n;
  size_t ae = tsize(s.at), ce = tsize(s.ct);
  int batches_a = s.bcast_a ? 1 : s.batch;
  std::vector<unsigned char> hA((size_t)((batches_a - 1) * sa + lda * acols) * ae), hB((size_t)((s.batch - 1) * sb + ldb * bcols) * ae),
      hD((size_t)((s.batch - 1) * sd + ldd * s.n) * ce), hBias((size_t)std::max(s.m, s.n) * ce), hAux((size_t)((s.batch - 1) * saux + auxld * s.n) * ce);
  for (size_t i = 0; i < hA.size() / ae; i++) wr(hA, s.at, i, uni());
  for (size_t i = 0; i < hB.size() / ae; i++) wr(hB, s.at, i, uni());
  for (size_t i = 0; i < hD.size() / ce; i++) wr(hD, s.ct, i, uni());
  for (size_t i = 0; i < hBias.size() / ce; i++) wr(hBias, s.ct, i, uni());
  for (size_t i = 0; i < hAux.size() / ce; i++) wr(hAux, s.ct, i, uni(-3, 3));
  dbuf A(hA.size()), B(hB.size()), D(hD.size()), Bias(hBias.size()), Aux(hAux.size());
  A.put(hA);
  B.put(hB);
  D.put(hD);
  if (f & (1 | 16 | 32)) Bias.put(hBias);
  if (f & 16) Aux.put(hAux);

  bool f64 = s.comp == CUBLAS_COMPUTE_64F;
  cudaDataType scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulDescCreate(&desc, s.comp, scale);
  cublasOperation_t opa = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &s.epi, sizeof s.epi);
  void *bp = Bias.p, *xp = Aux.p;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp, sizeof xp);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld, sizeof auxld);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &saux, sizeof saux);
  cublasLtMatrixLayoutCreate(&la, s.at, arows, acols, lda);
  cublasLtMatrixLayoutCreate(&lb, s.at, brows, bcols, ldb);
  cublasLtMatrixLayoutCreate(&ld, s.ct, s.m, s.n, ldd);
  if (s.batch > 1) {
    int32_t bc = s.batch;
    cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof sa);
    cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb);
    cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sd, sizeof sd);
  }
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(H, desc, la, lb, ld, ld, pref, 1, &res, &found);
  float af = (float)s.alpha, bf = (float)s.beta;
  const void *alpha = f64 ? (const void *)&s.alpha : (const void *)&af, *beta = f64 ? (const void *)&s.beta : (const void *)&bf;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  if (st == CUBLAS_STATUS_SUCCESS && found == 1)
    st = cublasLtMatmul(H, desc, alpha, A.p, la, B.p, lb, beta, D.p, ld, D.p, ld, &res.algo, nullptr, 0, stream);
  cudaError_t ce_ = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  if (st != CUBLAS_STATUS_SUCCESS || found != 1 || ce_ != cudaSuccess) {
    printf("  %s: status %s, found %d, sync %s\n", tag, cublasLtGetStatusName(st), found, cudaGetErrorName(ce_));
    return -1;
  }
  std::vector<unsigned char> gD = D.get(), gBias = Bias.get(), gAux = Aux.get();

  double ceps = s.comp == CUBLAS_COMPUTE_32F_FAST_TF32 ? 1.0 / 1024 : f64 ? 1e-15 : 1e-6;
  double oeps = eps_of(s.ct);
  int bad = 0;
  auto opA = [&](int b, int64_t i, int64_t kk) { return rd(hA, s.at, (size_t)(b * sa + (s.ta ? i * lda + kk : kk * lda + i))); };
  auto opB = [&](int b, int64_t kk, int64_t j) { return rd(hB, s.at, (size_t)(b * sb + (s.tb ? kk * ldb + j : j * ldb + kk))); };
  /* gelu' is evaluated in the compute precision: an absolute error of a few ulps of 1 */
  double gerr = f64 ? 1e-15 : 1e-6;
  auto close = [&](double got, double ref, double mag, const char *what, int b, int64_t i, int64_t j, double slack = 0) {
    if (std::fabs(got - ref) <= oeps * std::fabs(ref) + 4 * ceps * mag + slack + 1e-300) return;
    if (bad < 3) printf("  %s: %s[%d][%lld][%lld] = %.9g, reference %.9g\n", tag, what, b, (long long)i, (long long)j, got, ref);
    bad++;
  };
  for (int b = 0; b < s.batch; b++) {
    std::vector<double> dcol(s.m, 0.0);
    for (int64_t j = 0; j < s.n; j++)
      for (int64_t i = 0; i < s.m; i++) {
        double acc = 0, mag = 0;
        for (int64_t kk = 0; kk < s.k; kk++) {
          double p = opA(s.bcast_a ? 0 : b, i, kk) * opB(b, kk, j);
          acc += p;
          mag += std::fabs(p);
        }
        acc *= s.alpha;
        mag *= std::fabs(s.alpha);
        double c0 = rd(hD, s.ct, (size_t)(b * sd + i + j * ldd));
        acc += s.beta * c0;
        mag += std::fabs(s.beta * c0);
        if (f & 1) { acc += rd(hBias, s.ct, (size_t)i); mag += std::fabs(rd(hBias, s.ct, (size_t)i)); }
        size_t ax = (size_t)(b * saux + i + j * auxld);
        if (f & 8) close(rd(gAux, s.ct, ax), acc, mag, "aux", b, i, j);
        if (f & 2) acc = acc > 0 ? acc : 0;
        if (f & 4) acc = gelu(acc);
        double slack = 0;
        if (f & 16) { double g = gelu_grad(rd(hAux, s.ct, ax)); slack = std::fabs(acc) * gerr; acc *= g; mag *= std::fabs(g); }
        close(rd(gD, s.ct, (size_t)(b * sd + i + j * ldd)), acc, mag, "D", b, i, j, slack);
        dcol[i] += acc;
      }
    if (s.batch == 1 && (f & 32))
      for (int64_t i = 0; i < s.m; i++) close(rd(gBias, s.ct, (size_t)i), dcol[i], std::fabs(dcol[i]) + s.n, "dbias", b, i, 0, s.n * s.k * gerr);
    if (s.batch == 1 && (f & 64))
      for (int64_t i = 0; i < s.m; i++) {
        double sum = 0, mag = 0;
        for (int64_t kk = 0; kk < s.k; kk++) { sum += opA(0, i, kk); mag += std::fabs(opA(0, i, kk)); }
        close(rd(gBias, s.ct, (size_t)i), sum, mag, "bgrada", b, i, 0);
      }
    if (s.batch == 1 && (f & 128))
      for (int64_t j = 0; j < s.n; j++) {
        double sum = 0, mag = 0;
        for (int64_t kk = 0; kk < s.k; kk++) { sum += opB(0, kk, j); mag += std::fabs(opB(0, kk, j)); }
        close(rd(gBias, s.ct, (size_t)j), sum, mag, "bgradb", b, j, 0);
      }
  }
  return bad;
}

/* A small descriptor set for the refusal checks. */
struct lt {
  cublasLtMatmulDesc_t d = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t p = nullptr;
  lt(cublasComputeType_t comp, cudaDataType scale, cudaDataType at, cudaDataType ct, int64_t m, int64_t n, int64_t k) {
    cublasLtMatmulDescCreate(&d, comp, scale);
    cublasLtMatrixLayoutCreate(&a, at, m, k, m);
    cublasLtMatrixLayoutCreate(&b, at, k, n, k);
    cublasLtMatrixLayoutCreate(&c, ct, m, n, m);
    cublasLtMatmulPreferenceCreate(&p);
  }
  ~lt() {
    cublasLtMatmulDescDestroy(d);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulPreferenceDestroy(p);
  }
  cublasStatus_t heur(int *found, cublasLtMatmulHeuristicResult_t *r = nullptr) {
    cublasLtMatmulHeuristicResult_t tmp;
    return cublasLtMatmulAlgoGetHeuristic(H, d, a, b, c, c, p, 1, r ? r : &tmp, found);
  }
  template <class T> void set(cublasLtMatmulDescAttributes_t attr, T v) { cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v); }
};

}  // namespace

int main() {
  CHECK(cublasLtCreate(&H) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");

  /* 1. Every epilogue x every transpose pair x every type row, in place, alpha and beta. */
  struct trow { cudaDataType at, ct; cublasComputeType_t comp; const char *name; };
  const trow rows[] = {{CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, "16BF"},       {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, "16BF->32F"},
                       {CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, "16F"},          {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, "32F"},
                       {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, "TF32"}, {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, "64F"}};
  const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,      CUBLASLT_EPILOGUE_RELU,
                                     CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_GELU,    CUBLASLT_EPILOGUE_GELU_AUX,
                                     CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU,
                                     CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB};
  for (const trow &r : rows) {
    int bad = 0, failed = 0, n = 0;
    for (cublasLtEpilogue_t e : epis)
      for (int t = 0; t < 4; t++) {
        spec s{r.at, r.ct, r.comp, t & 1, t >> 1, 24, 16, 40, 1, false, e, 1.0, 0.0};
        if (n % 3 == 1) { s.alpha = 0.5; s.beta = 0.75; }   /* C is D's old content */
        if (n % 3 == 2) { s.alpha = -1.25; s.beta = 1.0; }
        n++;
        char tag[96];
        snprintf(tag, sizeof tag, "%s epilogue %d trans %d%d", r.name, (int)e, t & 1, t >> 1);
        int b = run_case(s, tag);
        if (b < 0) failed++;
        else bad += b;
      }
    CHECK(failed == 0 && bad == 0, "%s: %d epilogue/transpose cases off the float64 reference (%d elements), %d calls failed", r.name,
          bad ? 1 : 0, bad, failed);
  }

  /* 2. Strided batches: a broadcast A (stride 0), aux with a batch stride. */
  {
    int bad = 0;
    for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU})
      for (int bc = 0; bc < 2; bc++) {
        spec s{CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1, 0, 16, 24, 8, 3, bc == 1, e, 1.0, 0.0};
        int b = run_case(s, "batched bf16");
        bad += b < 0 ? 1000 : b;
        spec s2{CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 0, 1, 16, 24, 8, 4, bc == 1, e, 0.5, 0.5};
        b = run_case(s2, "batched f32");
        bad += b < 0 ? 1000 : b;
      }
    CHECK(bad == 0, "strided batches: %d wrong", bad);
  }

  /* 3. TF32 really rounds the inputs; plain 32F does not. */
  {
    float one_plus = 1.0f + std::ldexp(1.0f, -20), one = 1.0f;
    for (int tf32 = 0; tf32 < 2; tf32++) {
      lt L(tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 1, 1, 1);
      dbuf a(4), b(4), d(4);
      cudaMemcpy(a.p, &one_plus, 4, cudaMemcpyHostToDevice);
      cudaMemcpy(b.p, &one, 4, cudaMemcpyHostToDevice);
      float al = 1, be = 0, out = 0;
      cublasStatus_t st = cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, nullptr, nullptr, 0, 0);
      cudaMemcpy(&out, d.p, 4, cudaMemcpyDeviceToHost);
      CHECK(st == CUBLAS_STATUS_SUCCESS && out == (tf32 ? 1.0f : one_plus), "%s: (1 + 2^-20) * 1 = %a", tf32 ? "FAST_TF32" : "32F", out);
    }
  }

  /* 4. A zero beta never reads C: D (= C) holds NaN, the result is a number. */
  {
    lt L(CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
    dbuf a(128), b(128), d(128);   /* fresh device memory: NaN bytes */
    std::vector<unsigned char> ones(128);
    for (int i = 0; i < 64; i++) wr(ones, CUDA_R_16BF, i, 1.0);
    a.put(ones);
    b.put(ones);
    float al = 1, be = 0;
    cublasStatus_t st = cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, nullptr, nullptr, 0, 0);
    std::vector<unsigned char> g = d.get();
    int nans = 0;
    for (int i = 0; i < 64; i++) nans += std::isnan(rd(g, CUDA_R_16BF, i)) || rd(g, CUDA_R_16BF, i) != 8.0;
    CHECK(st == CUBLAS_STATUS_SUCCESS && nans == 0, "beta 0 with a NaN C: %d elements not 8", nans);
  }

  /* 5. Refusals, with the documented status. */
  {
    int found = -1;
    { lt L(CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 24, 16, 8);   /* AUX_LD divisible by 8 [Lt 3.3.9] */
      dbuf bias(64), aux(24 * 16 * 2 + 64);
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p);
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.p);
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)25);
      CHECK(L.heur(&found) == CUBLAS_STATUS_INVALID_VALUE && found == 0, "GELU_AUX_BIAS with AUX_LD 25: INVALID_VALUE");
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)16);
      CHECK(L.heur(&found) == CUBLAS_STATUS_INVALID_VALUE, "AUX_LD 16 below D's 24 rows: INVALID_VALUE");
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)24);
      CHECK(L.heur(&found) == CUBLAS_STATUS_SUCCESS && found == 1, "AUX_LD 24: an algorithm");
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (void *)nullptr);
      CHECK(L.heur(&found) == CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX_BIAS without an aux pointer: INVALID_VALUE");
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (void *)nullptr);
      CHECK(L.heur(&found) == CUBLAS_STATUS_INVALID_VALUE, "BIAS without a bias pointer: INVALID_VALUE");
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BGRADB);
      CHECK(L.heur(&found) == CUBLAS_STATUS_INVALID_VALUE, "BGRADB without a bias pointer: INVALID_VALUE");
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p);
      L.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)CUDA_R_32F);
      CHECK(L.heur(&found) == CUBLAS_STATUS_NOT_SUPPORTED, "a 32F bias for a 16BF D: NOT_SUPPORTED (datatypes table)");
      L.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)-1);
      CHECK(L.heur(&found) == CUBLAS_STATUS_SUCCESS, "BGRADB with its bias: an algorithm"); }
    { lt L(CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
      CHECK(L.heur(&found) == CUBLAS_STATUS_NOT_SUPPORTED, "FAST_TF32 with 16BF inputs: NOT_SUPPORTED (datatypes table)"); }
    { lt L(CUBLAS_COMPUTE_32F, CUDA_R_64F, CUDA_R_32F, CUDA_R_32F, 8, 8, 8);
      CHECK(L.heur(&found) == CUBLAS_STATUS_NOT_SUPPORTED, "COMPUTE_32F with a 64F scale: NOT_SUPPORTED"); }
    { lt L(CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
      cublasLtMatrixLayout_t d32;
      cublasLtMatrixLayoutCreate(&d32, CUDA_R_32F, 8, 8, 8);
      cublasLtMatmulHeuristicResult_t r;
      CHECK(cublasLtMatmulAlgoGetHeuristic(H, L.d, L.a, L.b, L.c, d32, L.p, 1, &r, &found) == CUBLAS_STATUS_INVALID_VALUE,
            "Ctype 16BF with Dtype 32F: INVALID_VALUE (C and D must have the same type)");
      cublasLtMatrixLayoutDestroy(d32);
      uint64_t ld4 = 4;
      cublasLtMatrixLayoutSetAttribute(L.a, CUBLASLT_MATRIX_LAYOUT_ROWS, &ld4, sizeof ld4);
      CHECK(L.heur(&found) == CUBLAS_STATUS_INVALID_VALUE, "op(A) 4 x 8 against D 8 x 8: INVALID_VALUE");
      uint64_t r8 = 8;
      int64_t ld5 = 5;
      cublasLtMatrixLayoutSetAttribute(L.a, CUBLASLT_MATRIX_LAYOUT_ROWS, &r8, sizeof r8);
      cublasLtMatrixLayoutSetAttribute(L.a, CUBLASLT_MATRIX_LAYOUT_LD, &ld5, sizeof ld5);
      CHECK(L.heur(&found) == CUBLAS_STATUS_INVALID_VALUE, "A with ld 5 < 8 rows: INVALID_VALUE [Lt 3.3.19]");
      int64_t ld8 = 8;
      cublasLtMatrixLayoutSetAttribute(L.a, CUBLASLT_MATRIX_LAYOUT_LD, &ld8, sizeof ld8);
      L.set(CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_T);
      CHECK(L.heur(&found) == CUBLAS_STATUS_NOT_SUPPORTED, "TRANSC = T: NOT_SUPPORTED (only CUBLAS_OP_N)");
      L.set(CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_N);
      int32_t row = CUBLASLT_ORDER_ROW;
      cublasLtMatrixLayoutSetAttribute(L.c, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row);
      dbuf bias(64);
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_BIAS);
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p);
      CHECK(L.heur(&found) == CUBLAS_STATUS_NOT_SUPPORTED, "GELU_BIAS with a ROW-order D: NOT_SUPPORTED (footnote 6)");
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      CHECK(L.heur(&found) == CUBLAS_STATUS_SUCCESS, "BIAS alone with a ROW-order D: allowed");
      int32_t col32 = CUBLASLT_ORDER_COL32;
      cublasLtMatrixLayoutSetAttribute(L.c, CUBLASLT_MATRIX_LAYOUT_ORDER, &col32, sizeof col32);
      CHECK(L.heur(&found) == CUBLAS_STATUS_NOT_SUPPORTED, "ORDER_COL32 (IMMA, not Hopper): NOT_SUPPORTED");
      int32_t colo = CUBLASLT_ORDER_COL;
      cublasLtMatrixLayoutSetAttribute(L.c, CUBLASLT_MATRIX_LAYOUT_ORDER, &colo, sizeof colo);
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
      uint32_t one = 1;
      cublasLtMatmulPreferenceSetAttribute(L.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &one, sizeof one);
      CHECK(L.heur(&found) == CUBLAS_STATUS_NOT_SUPPORTED && found == 0, "MIN_ALIGNMENT_A 1 byte for 2-byte elements: no algorithm");
      uint32_t two = 2;
      cublasLtMatmulPreferenceSetAttribute(L.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &two, sizeof two);
      CHECK(L.heur(&found) == CUBLAS_STATUS_SUCCESS && found == 1, "2 bytes: an algorithm");
      cublasLtMatmulHeuristicResult_t r2[1];
      CHECK(cublasLtMatmulAlgoGetHeuristic(H, L.d, L.a, L.b, L.c, L.c, L.p, 0, r2, &found) == CUBLAS_STATUS_INVALID_VALUE,
            "requestedAlgoCount 0: INVALID_VALUE [Lt 3.4.22]");
      /* attribute sizes [Lt 3.4.29/28] */
      int64_t big = 1;
      CHECK(cublasLtMatmulDescSetAttribute(L.d, CUBLASLT_MATMUL_DESC_TRANSA, &big, sizeof big) == CUBLAS_STATUS_INVALID_VALUE,
            "TRANSA set with 8 bytes: INVALID_VALUE");
      CHECK(cublasLtMatmulDescSetAttribute(L.d, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4) == CUBLAS_STATUS_INVALID_VALUE, "NULL buf: INVALID_VALUE");
      size_t need = 0;
      CHECK(cublasLtMatmulDescGetAttribute(L.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, &need) == CUBLAS_STATUS_SUCCESS && need == 8,
            "size query of AUX_LD: %zu", need);
      CHECK(cublasLtMatmulDescGetAttribute(L.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE,
            "size query without sizeWritten: INVALID_VALUE"); }

    /* Matmul-time refusals. */
    { lt L(CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
      dbuf a(256), b(256), d(256), ws(1024);
      std::vector<unsigned char> h(256);
      for (int i = 0; i < 128; i++) wr(h, CUDA_R_16BF, i, 0.5);
      a.put(h);
      b.put(h);
      uint32_t al16 = 16;
      for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        cublasLtMatmulPreferenceSetAttribute(L.p, attr, &al16, sizeof al16);
      cublasLtMatmulHeuristicResult_t r;
      CHECK(L.heur(&found, &r) == CUBLAS_STATUS_SUCCESS, "heuristic for 16-byte aligned matrices");
      float al = 1, be = 0;
      CHECK(cublasLtMatmul(H, L.d, &al, (char *)a.p + 2, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0) ==
                CUBLAS_STATUS_INVALID_VALUE,
            "A 2-byte aligned under an algo chosen for 16: INVALID_VALUE");
      CHECK(cublasLtMatmul(H, L.d, &al, (char *)a.p + 32, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0) ==
                CUBLAS_STATUS_SUCCESS,
            "A 32-byte aligned: runs");
      std::vector<unsigned char> host(256);
      CHECK(cublasLtMatmul(H, L.d, &al, host.data(), L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0) ==
                CUBLAS_STATUS_INVALID_VALUE,
            "A in host memory: INVALID_VALUE");
      CHECK(cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, (char *)ws.p + 64, 512, 0) ==
                CUBLAS_STATUS_INVALID_VALUE,
            "a workspace that is not 256-byte aligned: INVALID_VALUE [Lt 3.4.17]");
      CHECK(cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, ws.p, 1024, 0) == CUBLAS_STATUS_SUCCESS,
            "an aligned workspace: runs");
      cublasOperation_t t = CUBLAS_OP_T;
      cublasLtMatmulDescSetAttribute(L.d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
      CHECK(cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0) == CUBLAS_STATUS_INVALID_VALUE,
            "an algo from an NN heuristic used for TN: INVALID_VALUE [Lt 3.4.19]");
      CHECK(cudaDeviceSynchronize() == cudaSuccess, "the accepted calls ran");
      cublasLtHandle_t dead;
      cublasLtCreate(&dead);
      cublasLtDestroy(dead);
      CHECK(cublasLtMatmul(dead, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, nullptr, nullptr, 0, 0) == CUBLAS_STATUS_NOT_INITIALIZED,
            "a destroyed handle: NOT_INITIALIZED"); }

    /* A bias less aligned than at the heuristic: the kernel faults (asynchronously). */
    { lt L(CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
      dbuf a(256), b(256), d(256), bias(256);
      std::vector<unsigned char> h(256);
      for (int i = 0; i < 128; i++) wr(h, CUDA_R_16BF, i, 0.5);
      a.put(h);
      b.put(h);
      bias.put(h);
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p);
      cublasLtMatmulHeuristicResult_t r;
      CHECK(L.heur(&found, &r) == CUBLAS_STATUS_SUCCESS, "heuristic with a 256-byte aligned bias");
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (void *)((char *)bias.p + 2));
      float al = 1, be = 0;
      cublasStatus_t st = cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0);
      cudaError_t e = cudaDeviceSynchronize();
      CHECK(st == CUBLAS_STATUS_SUCCESS && e == cudaErrorMisalignedAddress && strstr(emu::last_report(), "bias"),
            "a 2-byte aligned bias under that algo faults: %s / %s", cudaGetErrorName(e), emu::last_report());
      emu::test_reset();
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p);
      st = cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0);
      e = cudaDeviceSynchronize();
      CHECK(st == CUBLAS_STATUS_SUCCESS && e == cudaSuccess, "the aligned bias runs: %s", cudaGetErrorName(e)); }

    /* The test knob SHARD_EMU_LT_REFUSE_EPILOGUE: an epilogue the heuristic offered an algo for
     * is refused at run time (NOT_SUPPORTED); a plain product still runs. */
    { lt L(CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 8, 8, 8);
      dbuf a(256), b(256), d(256), bias(256);
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      L.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p);
      cublasLtMatmulHeuristicResult_t r;
      CHECK(L.heur(&found, &r) == CUBLAS_STATUS_SUCCESS, "heuristic for BIAS");
      float al = 1, be = 0;
      setenv("SHARD_EMU_LT_REFUSE_EPILOGUE", "1", 1);
      CHECK(cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0) == CUBLAS_STATUS_NOT_SUPPORTED,
            "with SHARD_EMU_LT_REFUSE_EPILOGUE=1, BIAS is refused at run time: NOT_SUPPORTED");
      L.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
      CHECK(L.heur(&found, &r) == CUBLAS_STATUS_SUCCESS, "heuristic for the plain product");
      CHECK(cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, &r.algo, nullptr, 0, 0) == CUBLAS_STATUS_SUCCESS,
            "with SHARD_EMU_LT_REFUSE_EPILOGUE=1, the plain product runs");
      unsetenv("SHARD_EMU_LT_REFUSE_EPILOGUE");
      CHECK(cudaDeviceSynchronize() == cudaSuccess, "the accepted call ran"); }
  }

  /* 6. The work is queued on the stream (a library call), not done at the call. */
  {
    emu::reset_counters();
    lt L(CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 4, 4, 4);
    dbuf a(64), b(64), d(64);
    float al = 1, be = 0;
    cublasLtMatmul(H, L.d, &al, a.p, L.a, b.p, L.b, &be, d.p, L.c, d.p, L.c, nullptr, nullptr, 0, 0);
    CHECK(emu::get_counters().library_calls == 1, "one library call queued: %ld", emu::get_counters().library_calls);
    cudaDeviceSynchronize();
  }
  cublasLtDestroy(H);
  return lib_summary("lib_cublaslt");
}
