/* cublaslt.cpp: the CUDA emulator's cuBLASLt (tests/cuda_emu/include/cublasLt.h). Test
 * infrastructure only: never linked into lib/libshard.so or bin/shard.
 *
 * Written from the cuBLAS library documentation, section "Using the cuBLASLt API" (the
 * datatypes reference 3.3 and the API reference 3.4; cited below as [Lt 3.3.x] / [Lt 3.4.x]).
 * Every refusal names its rule. Where the documentation does not say which status a violated
 * rule gives, the comment says so and what the emulator returns.
 *
 * What runs: the product D = alpha op(A) op(B) + beta C over strided batches, in the compute
 * precision (OpenBLAS cblas_sgemm on float copies of 16F/16BF/32F data, cblas_dgemm for 64F;
 * CUBLAS_COMPUTE_32F_FAST_TF32 / _FAST_16F / _FAST_16BF first round the inputs to TF32 / half /
 * bfloat16, as those tensor-core modes do), then the epilogue in the compute precision, then one
 * rounding to D's type. The work is queued on the caller's stream (emu::enqueue) and runs when
 * the emulator's scheduler gets to it, like a kernel; pointers are checked against live device
 * allocations both when the call is made and when the work runs (a buffer freed in between is
 * a device fault, cudaErrorIllegalAddress, reported asynchronously as CUDA reports faults).
 *
 * Emulated subset (a configuration outside it returns CUBLAS_STATUS_NOT_SUPPORTED, which is
 * also what the library returns for "data type combination ... not currently supported"):
 * real types 16F, 16BF, 32F, 64F (no 8-bit integer or FP8 or complex), orders COL and ROW,
 * pointer modes HOST and DEVICE, epilogues DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_AUX,
 * GELU_BIAS, GELU_AUX_BIAS, DGELU, DGELU_BGRAD, BGRADA, BGRADB (the ReLU bit-mask epilogues are
 * not emulated). Set CUBLASLT_LOG_LEVEL=1 (the library's own logging switch) to have every
 * refusal explained on stderr. Test knob: SHARD_EMU_LT_REFUSE_EPILOGUE=1 makes cublasLtMatmul
 * refuse every epilogue with NOT_SUPPORTED at run time (after the heuristic offered an
 * algorithm), as the library may; the caller's unfused fallback then has to run. */
#include <cublasLt.h>
#include <cblas.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <vector>
#include "emu_api.h"
#include "emu_fpconv.h"

struct cublasLtContext {
  uint64_t magic;
};
struct cublasLtMatmulDescOpaque_t {
  int32_t compute, scale, pointer_mode, transa, transb, transc, fill_mode;
  uint32_t epilogue;
  const void *bias;
  int64_t bias_batch_stride;
  const void *aux;
  int64_t aux_ld, aux_batch_stride, alpha_vector_batch_stride;
  int32_t sm_count_target;
  const void *a_scale, *b_scale, *c_scale, *d_scale;
  void *amax_d;
  int32_t aux_type, bias_type;
};
struct cublasLtMatrixLayoutOpaque_t {
  uint32_t type;
  int32_t order;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride, plane_offset;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint32_t search_mode;
  uint64_t max_workspace;
  uint32_t reduction_mask;
  uint32_t min_align[4];   /* A, B, C, D */
  float max_waves;
  uint32_t pointer_mode_mask, epilogue_mask;
  uint64_t impl_mask;
};

namespace {

/* What a caller made: descriptors, layouts and preferences created and destroyed, heuristic
 * queries and cublasLtMatmul calls (sh_emu_lt_counts below). */
enum { LT_DESCS, LT_LAYOUTS, LT_PREFS, LT_HEURISTICS, LT_DESTROYED, LT_MATMULS, LT_NCOUNTS };
std::atomic<long> g_counts[LT_NCOUNTS];
void count(int what) { g_counts[what].fetch_add(1, std::memory_order_relaxed); }

const uint64_t HANDLE_MAGIC = 0x48544c5553414c42ull, ALGO_MAGIC = 0x4f474c41544c554dull;
std::mutex g_lock;
std::set<const cublasLtContext *> g_handles;

int log_level() {
  const char *v = getenv("CUBLASLT_LOG_LEVEL");
  return v ? atoi(v) : 0;
}

/* Read at every call, so a test may set it around one call. */
bool refuse_epilogues() {
  const char *v = getenv("SHARD_EMU_LT_REFUSE_EPILOGUE");
  return v && v[0] && strcmp(v, "0") != 0;
}

const char *status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

/* Returns s after logging why (CUBLASLT_LOG_LEVEL >= 1). */
__attribute__((format(printf, 3, 4))) cublasStatus_t refuse(const char *fn, cublasStatus_t s, const char *fmt, ...) {
  if (log_level() >= 1) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[cublasLt emu] %s: %s: ", fn, status_name(s));
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
  }
  return s;
}

bool handle_ok(cublasLtHandle_t h) {
  std::lock_guard<std::mutex> g(g_lock);
  return h && g_handles.count(h) && h->magic == HANDLE_MAGIC;
}

size_t type_size(uint32_t t) {
  switch (t) {
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    default: return 0;
  }
}
const char *type_name(uint32_t t) {
  switch (t) {
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    default: return "an unemulated cudaDataType";
  }
}

uint32_t pow2_align(uint64_t a) {   /* the largest power of two (<= 256) dividing a; 256 for 0 */
  uint32_t r = 256;
  while (r > 1 && (a % r)) r >>= 1;
  return r;
}

/* Attribute storage: (pointer, size) of each attribute, for Set/Get with the documented size
 * check ("INVALID_VALUE if buf is NULL or sizeInBytes doesn't match size of internal storage
 * for the selected attribute" [Lt 3.4.29, 3.4.34, 3.4.41]). */
bool desc_field(cublasLtMatmulDescOpaque_t *d, int attr, void **p, size_t *n) {
#define F(name, field) case name: *p = &d->field; *n = sizeof d->field; return true;
  switch (attr) {
    F(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute)
    F(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale)
    F(CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode)
    F(CUBLASLT_MATMUL_DESC_TRANSA, transa)
    F(CUBLASLT_MATMUL_DESC_TRANSB, transb)
    F(CUBLASLT_MATMUL_DESC_TRANSC, transc)
    F(CUBLASLT_MATMUL_DESC_FILL_MODE, fill_mode)
    F(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue)
    F(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias)
    F(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride)
    F(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux)
    F(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld)
    F(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_batch_stride)
    F(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, alpha_vector_batch_stride)
    F(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sm_count_target)
    F(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale)
    F(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale)
    F(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, c_scale)
    F(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale)
    F(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax_d)
    F(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type)
    F(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type)
    default: return false;
  }
}
bool layout_field(cublasLtMatrixLayoutOpaque_t *d, int attr, void **p, size_t *n) {
  switch (attr) {
    F(CUBLASLT_MATRIX_LAYOUT_TYPE, type)
    F(CUBLASLT_MATRIX_LAYOUT_ORDER, order)
    F(CUBLASLT_MATRIX_LAYOUT_ROWS, rows)
    F(CUBLASLT_MATRIX_LAYOUT_COLS, cols)
    F(CUBLASLT_MATRIX_LAYOUT_LD, ld)
    F(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch)
    F(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride)
    F(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, plane_offset)
    default: return false;
  }
}
bool pref_field(cublasLtMatmulPreferenceOpaque_t *d, int attr, void **p, size_t *n) {
  switch (attr) {
    F(CUBLASLT_MATMUL_PREF_SEARCH_MODE, search_mode)
    F(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace)
    F(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_mask)
    F(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, min_align[0])
    F(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, min_align[1])
    F(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, min_align[2])
    F(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, min_align[3])
    F(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, max_waves)
    F(CUBLASLT_MATMUL_PREF_POINTER_MODE_MASK, pointer_mode_mask)
    F(CUBLASLT_MATMUL_PREF_EPILOGUE_MASK, epilogue_mask)
    F(CUBLASLT_MATMUL_PREF_IMPL_MASK, impl_mask)
    default: return false;
  }
#undef F
}

template <class Obj, class Field>
cublasStatus_t set_attr(const char *fn, Obj *o, int attr, const void *buf, size_t size, Field field) {
  void *p;
  size_t n;
  if (!o) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "NULL descriptor");
  if (!field(o, attr, &p, &n)) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "attribute %d is not one the emulator knows", attr);
  /* [Lt 3.4.29/34/41]: "If buf is NULL or sizeInBytes doesn't match the size of the internal
   * storage for the selected attribute" -> INVALID_VALUE. */
  if (!buf) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "buf is NULL");
  if (size != n) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "attribute %d takes %zu bytes, got sizeInBytes %zu", attr, n, size);
  memcpy(p, buf, n);
  return CUBLAS_STATUS_SUCCESS;
}

template <class Obj, class Field>
cublasStatus_t get_attr(const char *fn, Obj *o, int attr, void *buf, size_t size, size_t *written, Field field) {
  void *p;
  size_t n;
  if (!o) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "NULL descriptor");
  if (!field(o, attr, &p, &n)) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "attribute %d is not one the emulator knows", attr);
  /* [Lt 3.4.28/33/40]: INVALID_VALUE "if sizeInBytes is 0 and sizeWritten is NULL, or if
   * sizeInBytes is non-zero and buf is NULL, or sizeInBytes doesn't match size of internal
   * storage"; with sizeInBytes 0, sizeWritten is the number of bytes needed. */
  if (size == 0) {
    if (!written) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "sizeInBytes is 0 and sizeWritten is NULL");
    *written = n;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "buf is NULL");
  if (size != n) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "attribute %d has %zu bytes, got sizeInBytes %zu", attr, n, size);
  memcpy(buf, p, n);
  if (written) *written = n;
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- the problem a descriptor set describes ---------------------------------------------- */

enum {
  EPI_BIAS_IN = 1,       /* reads bias[m] */
  EPI_BIAS_OUT_A = 2,    /* writes bias[m] = sum_k op(A) */
  EPI_BIAS_OUT_B = 4,    /* writes bias[n] = sum_k op(B) */
  EPI_BIAS_OUT_D = 8,    /* writes bias[m] = sum_j D (DGELU_BGRAD) */
  EPI_AUX_OUT = 16,      /* writes the GELU input */
  EPI_AUX_IN = 32,       /* reads the GELU input */
  EPI_RELU = 64,
  EPI_GELU = 128,
  EPI_DGELU = 256,
  EPI_ACT_WITH_BIAS = 512
};

struct problem {
  int64_t m, n, k;
  int32_t batch;
  int compute;               /* cublasComputeType_t */
  bool f64;
  int in_round;              /* 0 none, 1 tf32, 2 half, 3 bf16 */
  uint32_t atype, ctype;     /* A and B share atype; C and D share ctype */
  unsigned epi;              /* EPI_* flags */
};

unsigned epilogue_flags(uint32_t e, bool *known, bool *emulated) {
  *known = *emulated = true;
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return 0;
    case CUBLASLT_EPILOGUE_RELU: return EPI_RELU;
    case CUBLASLT_EPILOGUE_BIAS: return EPI_BIAS_IN;
    case CUBLASLT_EPILOGUE_RELU_BIAS: return EPI_BIAS_IN | EPI_RELU | EPI_ACT_WITH_BIAS;
    case CUBLASLT_EPILOGUE_GELU: return EPI_GELU;
    case CUBLASLT_EPILOGUE_GELU_AUX: return EPI_GELU | EPI_AUX_OUT;
    case CUBLASLT_EPILOGUE_GELU_BIAS: return EPI_BIAS_IN | EPI_GELU | EPI_ACT_WITH_BIAS;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return EPI_BIAS_IN | EPI_GELU | EPI_AUX_OUT | EPI_ACT_WITH_BIAS;
    case CUBLASLT_EPILOGUE_DGELU: return EPI_DGELU | EPI_AUX_IN;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return EPI_DGELU | EPI_AUX_IN | EPI_BIAS_OUT_D | EPI_ACT_WITH_BIAS;
    case CUBLASLT_EPILOGUE_BGRADA: return EPI_BIAS_OUT_A;
    case CUBLASLT_EPILOGUE_BGRADB: return EPI_BIAS_OUT_B;
    case CUBLASLT_EPILOGUE_RELU_AUX: case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
      *emulated = false;
      return 0;
    default:
      *known = false;
      return 0;
  }
}

bool is_trans(int32_t op) { return op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

/* Checks one matrix layout; `name` is "A", "B", "C", "D". */
cublasStatus_t check_layout(const char *fn, const char *name, const cublasLtMatrixLayoutOpaque_t *l, bool c_out_of_place) {
  /* [Lt 3.3.23] COL32, COL4_4R2_8C, COL32_2R_4R4 are the IMMA orders ([Lt 3.4.17]: "Using the
   * IMMA-specific data ordering on Ampere or Turing (but not Hopper ... or later)"): not on the
   * emulated H100. */
  if (l->order != CUBLASLT_ORDER_COL && l->order != CUBLASLT_ORDER_ROW)
    return refuse(fn, l->order >= 0 && l->order <= 4 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE,
                  "matrix %s: order %d is not CUBLASLT_ORDER_COL or CUBLASLT_ORDER_ROW", name, l->order);
  /* [Lt 3.3.19] PLANE_OFFSET != 0 describes planar complex data, which real types are not. */
  if (l->plane_offset != 0)
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "matrix %s: PLANE_OFFSET %lld describes a planar-complex layout", name,
                  (long long)l->plane_offset);
  /* [Lt 3.3.19] ROWS/COLS: "Normally only values that can be expressed as int32_t are
   * supported". */
  if (l->rows > (uint64_t)INT32_MAX || l->cols > (uint64_t)INT32_MAX)
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "matrix %s: %llu x %llu does not fit int32_t", name,
                  (unsigned long long)l->rows, (unsigned long long)l->cols);
  /* [Lt 3.3.19] LD: "Currently only non-negative values are supported. Must be large enough so
   * that matrix memory locations are not overlapping (e.g., greater or equal to ROWS in case of
   * CUBLASLT_ORDER_COL)." The status is not named there; INVALID_VALUE is [Lt 3.4.17]'s "in
   * an impossible configuration". [Lt 3.4.17]: an out-of-place C may have ld 0 (broadcast). */
  if (l->ld < 0) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "matrix %s: negative leading dimension %lld", name, (long long)l->ld);
  uint64_t need = l->order == CUBLASLT_ORDER_COL ? l->rows : l->cols;
  if (!(c_out_of_place && l->ld == 0) && (uint64_t)l->ld < need)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "matrix %s: leading dimension %lld is less than its %s (%llu)", name, (long long)l->ld,
                  l->order == CUBLASLT_ORDER_COL ? "rows" : "cols", (unsigned long long)need);
  /* [Lt 3.3.19] BATCH_COUNT: the number of matmuls; 0 or negative is no batch. */
  if (l->batch < 1) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "matrix %s: BATCH_COUNT %d", name, l->batch);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t describe(const char *fn, const cublasLtMatmulDescOpaque_t *d, const cublasLtMatrixLayoutOpaque_t *A,
                        const cublasLtMatrixLayoutOpaque_t *B, const cublasLtMatrixLayoutOpaque_t *C,
                        const cublasLtMatrixLayoutOpaque_t *D, problem *p) {
  if (!d || !A || !B || !C || !D) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "a NULL descriptor");
  memset(p, 0, sizeof *p);
  /* Types: the table "Datatypes Supported" of [Lt 3.4.17] (cublasLtMatmul). A and B share
   * Atype/Btype; out of place, "C != D, both matrices must have the same data type". */
  int ct = d->compute;
  uint32_t at = A->type, bt = B->type, ctp = C->type, dt = D->type;
  if (at != bt) return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "Atype %s and Btype %s differ (the table lists them together)", type_name(at), type_name(bt));
  if (ctp != dt)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "Ctype %s and Dtype %s differ (C and D \"must have the same data type\")", type_name(ctp),
                  type_name(dt));
  bool ok = false;
  switch (ct) {
    case CUBLAS_COMPUTE_16F: case CUBLAS_COMPUTE_16F_PEDANTIC:
      ok = d->scale == CUDA_R_16F && at == CUDA_R_16F && ctp == CUDA_R_16F;
      p->in_round = 0;
      break;
    case CUBLAS_COMPUTE_32F: case CUBLAS_COMPUTE_32F_PEDANTIC:
      ok = d->scale == CUDA_R_32F && ((at == CUDA_R_16BF && (ctp == CUDA_R_16BF || ctp == CUDA_R_32F)) ||
                                      (at == CUDA_R_16F && (ctp == CUDA_R_16F || ctp == CUDA_R_32F)) ||
                                      (at == CUDA_R_32F && ctp == CUDA_R_32F));
      break;
    case CUBLAS_COMPUTE_32F_FAST_16F: case CUBLAS_COMPUTE_32F_FAST_16BF: case CUBLAS_COMPUTE_32F_FAST_TF32:
      ok = d->scale == CUDA_R_32F && at == CUDA_R_32F && ctp == CUDA_R_32F;
      p->in_round = ct == CUBLAS_COMPUTE_32F_FAST_TF32 ? 1 : ct == CUBLAS_COMPUTE_32F_FAST_16F ? 2 : 3;
      break;
    case CUBLAS_COMPUTE_64F: case CUBLAS_COMPUTE_64F_PEDANTIC:
      ok = d->scale == CUDA_R_64F && at == CUDA_R_64F && ctp == CUDA_R_64F;
      p->f64 = true;
      break;
    default:
      ok = false;
  }
  if (!ok)
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED,
                  "computeType %d, scaleType %s, Atype/Btype %s, Ctype %s is not a supported combination (or not one the emulator runs)", ct,
                  type_name(d->scale), type_name(at), type_name(ctp));
  p->compute = ct;
  p->atype = at;
  p->ctype = ctp;
  /* [Lt 3.3.9] TRANSC: "Currently only CUBLAS_OP_N is supported." */
  if (d->transc != CUBLAS_OP_N) return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "TRANSC %d: only CUBLAS_OP_N is supported", d->transc);
  if (d->transa < CUBLAS_OP_N || d->transa > CUBLAS_OP_C || d->transb < CUBLAS_OP_N || d->transb > CUBLAS_OP_C)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "TRANSA %d / TRANSB %d is not a cublasOperation_t", d->transa, d->transb);
  /* [Lt 3.3.9] FILL_MODE: "not supported for bfloat16 ... and is not supported on the
   * following GPUs: Hopper, Blackwell" (the emulated device is an H100). */
  if (d->fill_mode != CUBLAS_FILL_MODE_FULL)
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "FILL_MODE %d is not supported on Hopper", d->fill_mode);
  /* Pointer modes: HOST and DEVICE are emulated; the vector modes are not. */
  if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST && d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
    return refuse(fn, d->pointer_mode >= 0 && d->pointer_mode <= 4 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE,
                  "POINTER_MODE %d is not emulated", d->pointer_mode);
  /* [Lt 3.1.4] "Scales are only applicable to narrow precisions matmuls. If any scale is set
   * for a non-narrow precisions matmul, cuBLAS will return an error"; [Lt 3.3.9] AMAX_D_POINTER
   * "If set for an unsupported matrix data, scale, and compute type combination, calling
   * cublasLtMatmul() will return CUBLAS_INVALID_VALUE". */
  if (d->a_scale || d->b_scale || d->c_scale || d->d_scale || d->amax_d)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "a scale or amax pointer is set for a matmul without narrow-precision data");

  bool c_oop = C != D;
  cublasStatus_t s;
  if ((s = check_layout(fn, "A", A, false)) || (s = check_layout(fn, "B", B, false)) || (s = check_layout(fn, "C", C, c_oop)) ||
      (s = check_layout(fn, "D", D, false)))
    return s;
  /* Shapes: op(A) is m x k, op(B) is k x n, C and D are m x n ([Lt 3.4.17]: D = alpha*(A*B) +
   * beta*(C)); mismatched dimensions are "in conflict" -> INVALID_VALUE. */
  int64_t m = is_trans(d->transa) ? A->cols : A->rows, k = is_trans(d->transa) ? A->rows : A->cols;
  int64_t kb = is_trans(d->transb) ? B->cols : B->rows, n = is_trans(d->transb) ? B->rows : B->cols;
  if (k != kb)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "op(A) is %lld x %lld but op(B) is %lld x %lld", (long long)m, (long long)k, (long long)kb,
                  (long long)n);
  if ((int64_t)D->rows != m || (int64_t)D->cols != n)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "D is %llu x %llu, op(A) op(B) is %lld x %lld", (unsigned long long)D->rows,
                  (unsigned long long)D->cols, (long long)m, (long long)n);
  /* [Lt 3.4.17] out of place, C and D "must have the same data type, number of rows, number
   * of columns, batch size, and memory order". */
  if (C->rows != D->rows || C->cols != D->cols || C->batch != D->batch || C->order != D->order)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "C (%llu x %llu, batch %d, order %d) does not match D (%llu x %llu, batch %d, order %d)",
                  (unsigned long long)C->rows, (unsigned long long)C->cols, C->batch, C->order, (unsigned long long)D->rows,
                  (unsigned long long)D->cols, D->batch, D->order);
  /* Batches: every matrix describes the same number of products (A or B repeat one matrix with
   * a stride of 0, the documented default). The documentation does not name the status. */
  if (A->batch != D->batch || B->batch != D->batch)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "BATCH_COUNT of A (%d), B (%d) and D (%d) differ", A->batch, B->batch, D->batch);
  p->m = m;
  p->n = n;
  p->k = k;
  p->batch = D->batch;

  /* Epilogue [Lt 3.3.2]. */
  bool known, emulated;
  unsigned f = epilogue_flags(d->epilogue, &known, &emulated);
  if (!known) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE %u is not a cublasLtEpilogue_t", d->epilogue);
  if (!emulated) return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "EPILOGUE %u (a ReLU bit-mask epilogue) is not emulated", d->epilogue);
  p->epi = f;
  /* [Lt 3.3.9] BIAS_POINTER: an input for the BIAS epilogues, an output for the BGRAD ones. A
   * missing pointer is "unexpectedly NULL" [Lt 3.4.17] -> INVALID_VALUE. */
  if ((f & (EPI_BIAS_IN | EPI_BIAS_OUT_A | EPI_BIAS_OUT_B | EPI_BIAS_OUT_D)) && !d->bias)
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", d->epilogue);
  /* [Lt 3.3.9] BIAS_DATA_TYPE: unset (-1) means Dtype; the datatypes table of [Lt 3.4.17] lists
   * Bias Type = Ctype for every emulated row, so another type is not supported. */
  if ((f & (EPI_BIAS_IN | EPI_BIAS_OUT_A | EPI_BIAS_OUT_B | EPI_BIAS_OUT_D)) && d->bias_type != -1 && (uint32_t)d->bias_type != dt)
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "BIAS_DATA_TYPE %s differs from Dtype %s", type_name(d->bias_type), type_name(dt));
  if (f & (EPI_AUX_IN | EPI_AUX_OUT)) {
    /* [Lt 3.3.9] EPILOGUE_AUX_POINTER "Requires setting the CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
     * attribute"; EPILOGUE_AUX_LD for GELU: "Must be divisible by 8 and be no less than the
     * number of rows in the output matrix"; EPILOGUE_AUX_BATCH_STRIDE: "Must be divisible by 8".
     * The status is not named; INVALID_VALUE ("in an impossible configuration"). */
    if (!d->aux) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", d->epilogue);
    if (d->aux_ld % 8 != 0 || d->aux_ld < (int64_t)D->rows)
      return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE_AUX_LD %lld must be divisible by 8 and at least D's rows (%llu)",
                    (long long)d->aux_ld, (unsigned long long)D->rows);
    if (p->batch > 1 && d->aux_batch_stride % 8 != 0)
      return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE_AUX_BATCH_STRIDE %lld must be divisible by 8", (long long)d->aux_batch_stride);
    /* [Lt 3.3.9] EPILOGUE_AUX_DATA_TYPE: outside FP8 "the data type should be left unset or set
     * to the default value of -1. If set for an unsupported ... combination, calling
     * cublasLtMatmul() will return CUBLAS_INVALID_VALUE". */
    if (d->aux_type != -1 && (uint32_t)d->aux_type != dt)
      return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE_AUX_DATA_TYPE %s is set for a non-FP8 matmul", type_name(d->aux_type));
  }
  /* [Lt 3.4.17] footnote 6: "Epilogue modes that combine ReLU, dReLu, GELU, or dGELU with Bias
   * ... are not supported when D matrix memory order is defined as CUBLASLT_ORDER_ROW." */
  if ((f & EPI_ACT_WITH_BIAS) && D->order == CUBLASLT_ORDER_ROW)
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "EPILOGUE %u combines an activation with bias and D is CUBLASLT_ORDER_ROW", d->epilogue);
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- algorithms --------------------------------------------------------------------------- */

/* An emulated algorithm: the signature of the problem it was chosen for and the alignments
 * it needs. A kernel chosen under MIN_ALIGNMENT_X_BYTES = P needs min(P, 16) bytes of X (16
 * bytes is the widest vector access a Hopper GEMM kernel makes), but no more than the layout
 * itself guarantees (leading dimension and batch stride in bytes), since the heuristic sees
 * those. For the bias and aux pointers, which the preferences do not cover, the alignment the
 * pointer had at AlgoGetHeuristic ([Lt 3.3.9]: "Routines that don't dereference this pointer,
 * like cublasLtMatmulAlgoGetHeuristic() depend on its value to determine expected pointer
 * alignment"). */
struct algo_info {
  uint64_t magic;
  uint32_t compute, scale, atype, ctype;
  uint32_t epilogue, trans;     /* transa | transb << 8 */
  uint32_t orders;              /* order A | B << 8 | C << 16 | D << 24 */
  uint16_t align[4];            /* A, B, C, D */
  uint16_t bias_align, aux_align;
  uint32_t pointer_mode;
};
static_assert(sizeof(algo_info) <= sizeof(cublasLtMatmulAlgo_t), "algo_info fits cublasLtMatmulAlgo_t");

uint32_t layout_align(const cublasLtMatrixLayoutOpaque_t *l) {
  size_t es = type_size(l->type);
  uint32_t a = pow2_align((uint64_t)l->ld * es);
  if (l->batch > 1 && l->stride != 0) a = std::min(a, pow2_align((uint64_t)std::llabs(l->stride) * es));
  return a;
}

algo_info make_algo(const cublasLtMatmulDescOpaque_t *d, const cublasLtMatrixLayoutOpaque_t *L[4], const uint32_t pref_align[4]) {
  algo_info a;
  memset(&a, 0, sizeof a);
  a.magic = ALGO_MAGIC;
  a.compute = d->compute;
  a.scale = d->scale;
  a.atype = L[0]->type;
  a.ctype = L[3]->type;
  a.epilogue = d->epilogue;
  a.trans = (uint32_t)d->transa | (uint32_t)d->transb << 8;
  a.orders = (uint32_t)L[0]->order | (uint32_t)L[1]->order << 8 | (uint32_t)L[2]->order << 16 | (uint32_t)L[3]->order << 24;
  for (int i = 0; i < 4; i++) {
    uint32_t need = std::min<uint32_t>(pow2_align(pref_align[i] ? pref_align[i] : 256), 16);
    need = std::min(need, layout_align(L[i]));
    a.align[i] = (uint16_t)std::max<uint32_t>(need, (uint32_t)type_size(L[i]->type));
  }
  a.bias_align = (uint16_t)std::min<uint32_t>(16, d->bias ? pow2_align((uintptr_t)d->bias) : 16);
  a.aux_align = (uint16_t)std::min<uint32_t>(16, d->aux ? pow2_align((uintptr_t)d->aux) : 16);
  a.pointer_mode = d->pointer_mode;
  return a;
}

bool algo_matches(const algo_info &a, const cublasLtMatmulDescOpaque_t *d, const cublasLtMatrixLayoutOpaque_t *L[4]) {
  return a.magic == ALGO_MAGIC && a.compute == (uint32_t)d->compute && a.scale == (uint32_t)d->scale && a.atype == L[0]->type &&
         a.ctype == L[3]->type && a.epilogue == d->epilogue && a.trans == ((uint32_t)d->transa | (uint32_t)d->transb << 8) &&
         a.orders == ((uint32_t)L[0]->order | (uint32_t)L[1]->order << 8 | (uint32_t)L[2]->order << 16 | (uint32_t)L[3]->order << 24) &&
         a.pointer_mode == (uint32_t)d->pointer_mode;
}

float waves(const problem &p) {
  double tiles = std::ceil(p.m / 128.0) * std::ceil(p.n / 128.0) * p.batch;
  return (float)std::max(tiles / 132.0, 1.0 / 132.0);
}

/* ---- arithmetic ---------------------------------------------------------------------------- */

/* Byte range [lo, hi) of a matrix relative to its pointer over all batches. */
void extent(const cublasLtMatrixLayoutOpaque_t *l, int64_t *lo, int64_t *hi) {
  int64_t es = (int64_t)type_size(l->type);
  int64_t inner = l->order == CUBLASLT_ORDER_COL ? (int64_t)l->rows : (int64_t)l->cols;
  int64_t outer = l->order == CUBLASLT_ORDER_COL ? (int64_t)l->cols : (int64_t)l->rows;
  if (inner == 0 || outer == 0) { *lo = *hi = 0; return; }
  int64_t one = ((outer - 1) * l->ld + inner) * es;
  int64_t last = (int64_t)(l->batch - 1) * l->stride * es;
  *lo = std::min<int64_t>(0, last);
  *hi = std::max<int64_t>(0, last) + one;
}

template <class P> P load_elem(const void *base, uint32_t type, int64_t i) {
  switch (type) {
    case CUDA_R_16F: return (P)emu_fp::half_to_f32(((const uint16_t *)base)[i]);
    case CUDA_R_16BF: return (P)emu_fp::bf16_to_f32(((const uint16_t *)base)[i]);
    case CUDA_R_32F: return (P)((const float *)base)[i];
    default: return (P)((const double *)base)[i];
  }
}
template <class P> void store_elem(void *base, uint32_t type, int64_t i, P v) {
  switch (type) {
    case CUDA_R_16F: ((uint16_t *)base)[i] = emu_fp::from_f64((double)v, emu_fp::HALF, emu_fp::RN); break;
    case CUDA_R_16BF: ((uint16_t *)base)[i] = emu_fp::from_f64((double)v, emu_fp::BF16, emu_fp::RN); break;
    case CUDA_R_32F: ((float *)base)[i] = (float)v; break;
    default: ((double *)base)[i] = (double)v; break;
  }
}
/* A float value rounded to what a FAST_* compute mode feeds the tensor cores. */
float round_input(float x, int mode) {
  switch (mode) {
    case 1: {                                    /* TF32: 10 fraction bits, to nearest even */
      uint32_t u = emu_fp::f32_bits(x);
      if ((u & 0x7f800000u) == 0x7f800000u) return x;
      u += 0xfffu + ((u >> 13) & 1);
      u &= ~0x1fffu;
      return emu_fp::bits_f32(u);
    }
    case 2: return emu_fp::half_to_f32(emu_fp::from_f32(x, emu_fp::HALF, emu_fp::RN));
    case 3: return emu_fp::bf16_to_f32(emu_fp::from_f32(x, emu_fp::BF16, emu_fp::RN));
    default: return x;
  }
}
int64_t elem_index(const cublasLtMatrixLayoutOpaque_t *l, int64_t r, int64_t c) {
  return l->order == CUBLASLT_ORDER_COL ? r + c * l->ld : r * l->ld + c;
}
/* The stored matrix (its layout's rows x cols) as a dense column-major array. */
template <class P> std::vector<P> gather(const void *base, const cublasLtMatrixLayoutOpaque_t *l, int round_mode) {
  std::vector<P> out((size_t)(l->rows * l->cols));
  for (int64_t c = 0; c < (int64_t)l->cols; c++)
    for (int64_t r = 0; r < (int64_t)l->rows; r++) {
      P v = load_elem<P>(base, l->type, elem_index(l, r, c));
      if (round_mode) v = (P)round_input((float)v, round_mode);
      out[(size_t)(r + c * l->rows)] = v;
    }
  return out;
}

const double GELU_K = 0.7978845608028654;      /* sqrt(2 / pi) */
const double GELU_C = 0.044715;
/* [Lt 3.3.2] note 5: GELU "is approximated by 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))". */
template <class P> P gelu(P x) { return (P)0.5 * x * ((P)1 + std::tanh((P)GELU_K * (x + (P)GELU_C * x * x * x))); }
template <class P> P gelu_grad(P x) {
  P t = std::tanh((P)GELU_K * (x + (P)GELU_C * x * x * x));
  return (P)0.5 * ((P)1 + t) + (P)0.5 * x * ((P)1 - t * t) * (P)GELU_K * ((P)1 + (P)3 * (P)GELU_C * x * x);
}

void gemm(bool trA, bool trB, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
          float beta, float *C) {
  cblas_sgemm(CblasColMajor, trA ? CblasTrans : CblasNoTrans, trB ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, A, (int)lda,
              B, (int)ldb, beta, C, (int)m);
}
void gemm(bool trA, bool trB, int64_t m, int64_t n, int64_t k, double alpha, const double *A, int64_t lda, const double *B, int64_t ldb,
          double beta, double *C) {
  cblas_dgemm(CblasColMajor, trA ? CblasTrans : CblasNoTrans, trB ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, A, (int)lda,
              B, (int)ldb, beta, C, (int)m);
}

/* Everything a queued product needs, copied at the call. */
struct job {
  problem p;
  cublasLtMatmulDescOpaque_t d;
  cublasLtMatrixLayoutOpaque_t L[4];
  const void *A, *B, *C;
  void *D;
  double alpha, beta;
  const void *alpha_dev, *beta_dev;   /* DEVICE pointer mode: read when the work runs */
  uint16_t bias_align, aux_align;
};

bool in_device(const void *p, int64_t lo, int64_t hi) {
  if (hi <= lo) return true;
  return emu::is_device_range((const char *)p + lo, (size_t)(hi - lo));
}

/* The device memory a job touches, as (pointer, lo, hi, name). */
struct span { const void *p; int64_t lo, hi; const char *name; };
std::vector<span> spans(const job &j, bool reads_c) {
  std::vector<span> v;
  int64_t lo, hi;
  const char *names[4] = {"A", "B", "C", "D"};
  const void *ptrs[4] = {j.A, j.B, j.C, j.D};
  for (int i = 0; i < 4; i++) {
    if (i == 2 && !reads_c) continue;
    if (i < 2 && j.p.k == 0) continue;
    extent(&j.L[i], &lo, &hi);
    v.push_back({ptrs[i], lo, hi, names[i]});
  }
  int64_t es = (int64_t)type_size(j.p.ctype);
  unsigned f = j.p.epi;
  if (f & (EPI_BIAS_IN | EPI_BIAS_OUT_A | EPI_BIAS_OUT_B | EPI_BIAS_OUT_D)) {
    int64_t len = (f & EPI_BIAS_OUT_B) ? j.p.n : j.p.m, last = (int64_t)(j.p.batch - 1) * j.d.bias_batch_stride * es;
    v.push_back({j.d.bias, std::min<int64_t>(0, last), std::max<int64_t>(0, last) + len * es, "bias"});
  }
  if ((f & (EPI_AUX_IN | EPI_AUX_OUT)) && j.p.m > 0 && j.p.n > 0) {
    int64_t last = (int64_t)(j.p.batch - 1) * j.d.aux_batch_stride * es;
    v.push_back({j.d.aux, std::min<int64_t>(0, last), std::max<int64_t>(0, last) + ((j.p.n - 1) * j.d.aux_ld + j.p.m) * es, "aux"});
  }
  return v;
}

template <class P> void run_job(job &j) {
  const problem &p = j.p;
  unsigned f = p.epi;
  int64_t m = p.m, n = p.n, k = p.k;
  size_t ce = type_size(p.ctype), ae = type_size(p.atype);
  P alpha = (P)j.alpha, beta = (P)j.beta;
  if (j.alpha_dev) alpha = load_elem<P>(j.alpha_dev, j.d.scale, 0);
  if (j.beta_dev) beta = load_elem<P>(j.beta_dev, j.d.scale, 0);
  bool trA = is_trans(j.d.transa), trB = is_trans(j.d.transb);
  for (int32_t b = 0; b < p.batch; b++) {
    const char *Ab = (const char *)j.A + (int64_t)b * j.L[0].stride * (int64_t)ae;
    const char *Bb = (const char *)j.B + (int64_t)b * j.L[1].stride * (int64_t)ae;
    const char *Cb = (const char *)j.C + (int64_t)b * j.L[2].stride * (int64_t)ce;
    char *Db = (char *)j.D + (int64_t)b * j.L[3].stride * (int64_t)ce;
    std::vector<P> R((size_t)(m * n), (P)0);
    /* [Lt 3.4.17] D = alpha*(A*B) + beta*(C): C is read only when beta is not zero (as in
     * BLAS, a zero beta means C need not hold numbers). */
    if (beta != (P)0)
      for (int64_t c = 0; c < n; c++)
        for (int64_t r = 0; r < m; r++) R[(size_t)(r + c * m)] = load_elem<P>(Cb, j.L[2].type, elem_index(&j.L[2], r, c));
    std::vector<P> Ad, Bd;
    if (k > 0) {
      Ad = gather<P>(Ab, &j.L[0], p.in_round);
      Bd = gather<P>(Bb, &j.L[1], p.in_round);
      if (m > 0 && n > 0) gemm(trA, trB, m, n, k, alpha, Ad.data(), (int64_t)j.L[0].rows, Bd.data(), (int64_t)j.L[1].rows, beta, R.data());
    } else {
      for (auto &x : R) x *= beta;
    }
    /* Epilogue [Lt 3.3.2], in the compute precision; bias and aux have D's type. */
    char *bias = (char *)j.d.bias + (int64_t)b * j.d.bias_batch_stride * (int64_t)ce;
    char *aux = (char *)j.d.aux + (int64_t)b * j.d.aux_batch_stride * (int64_t)ce;
    for (int64_t c = 0; c < n; c++)
      for (int64_t r = 0; r < m; r++) {
        P &x = R[(size_t)(r + c * m)];
        if (f & EPI_BIAS_IN) x += load_elem<P>(bias, p.ctype, r);
        if (f & EPI_AUX_OUT) store_elem<P>(aux, p.ctype, r + c * j.d.aux_ld, x);
        if (f & EPI_GELU) x = gelu(x);
        if (f & EPI_RELU) x = x > (P)0 ? x : (P)0;   /* NaN -> 0, as the library's ReLU epilogue */
        if (f & EPI_DGELU) x *= gelu_grad(load_elem<P>(aux, p.ctype, r + c * j.d.aux_ld));
      }
    if (f & EPI_BIAS_OUT_D)                          /* DGELU_BGRAD: bias gradient of the result */
      for (int64_t r = 0; r < m; r++) {
        P s = 0;
        for (int64_t c = 0; c < n; c++) s += R[(size_t)(r + c * m)];
        store_elem<P>(bias, p.ctype, r, s);
      }
    if (f & EPI_BIAS_OUT_A)                          /* BGRADA: bias[i] = sum_k op(A)[i, k] */
      for (int64_t r = 0; r < m; r++) {
        P s = 0;
        for (int64_t kk = 0; kk < k; kk++) s += trA ? Ad[(size_t)(kk + r * j.L[0].rows)] : Ad[(size_t)(r + kk * j.L[0].rows)];
        store_elem<P>(bias, p.ctype, r, s);
      }
    if (f & EPI_BIAS_OUT_B)                          /* BGRADB: bias[j] = sum_k op(B)[k, j] */
      for (int64_t c = 0; c < n; c++) {
        P s = 0;
        for (int64_t kk = 0; kk < k; kk++) s += trB ? Bd[(size_t)(c + kk * j.L[1].rows)] : Bd[(size_t)(kk + c * j.L[1].rows)];
        store_elem<P>(bias, p.ctype, c, s);
      }
    for (int64_t c = 0; c < n; c++)
      for (int64_t r = 0; r < m; r++) store_elem<P>(Db, p.ctype, elem_index(&j.L[3], r, c), R[(size_t)(r + c * m)]);
  }
}

void run_checked(job &j, bool reads_c) {
  /* The buffers must still be device memory when the product runs: one freed (or reused by
   * another allocation) since the call is what a GPU would fault on, asynchronously. */
  for (const span &s : spans(j, reads_c))
    if (!in_device(s.p, s.lo, s.hi)) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s [%p, +%lld bytes) is no longer device memory when the queued product runs", s.name,
               (const void *)((const char *)s.p + s.lo), (long long)(s.hi - s.lo));
      emu::fail_async(cudaErrorIllegalAddress, msg);
      return;
    }
  /* Bias and aux less aligned than the kernel chosen for them expects: a misaligned vector
   * access on a GPU (the preferences do not cover these pointers). */
  if (j.d.bias && (j.p.epi & (EPI_BIAS_IN | EPI_BIAS_OUT_A | EPI_BIAS_OUT_B | EPI_BIAS_OUT_D)) && pow2_align((uintptr_t)j.d.bias) < j.bias_align) {
    char msg[256];
    snprintf(msg, sizeof msg, "bias %p is %u-byte aligned but the algorithm was chosen for a %u-byte aligned bias", j.d.bias,
             pow2_align((uintptr_t)j.d.bias), j.bias_align);
    emu::fail_async(cudaErrorMisalignedAddress, msg);
    return;
  }
  if (j.d.aux && (j.p.epi & (EPI_AUX_IN | EPI_AUX_OUT)) && pow2_align((uintptr_t)j.d.aux) < j.aux_align) {
    char msg[256];
    snprintf(msg, sizeof msg, "aux %p is %u-byte aligned but the algorithm was chosen for a %u-byte aligned aux", j.d.aux,
             pow2_align((uintptr_t)j.d.aux), j.aux_align);
    emu::fail_async(cudaErrorMisalignedAddress, msg);
    return;
  }
  if (j.p.f64) run_job<double>(j);
  else run_job<float>(j);
}

}  // namespace

/* ---- the API -------------------------------------------------------------------------------- */

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (!h) return refuse("cublasLtCreate", CUBLAS_STATUS_INVALID_VALUE, "lightHandle is NULL");
  cublasLtContext *c = new (std::nothrow) cublasLtContext{HANDLE_MAGIC};
  if (!c) return CUBLAS_STATUS_ALLOC_FAILED;
  std::lock_guard<std::mutex> g(g_lock);
  g_handles.insert(c);
  *h = c;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  {
    std::lock_guard<std::mutex> g(g_lock);
    if (!h || !g_handles.count(h)) return refuse("cublasLtDestroy", CUBLAS_STATUS_NOT_INITIALIZED, "not a live handle");
    g_handles.erase(h);
  }
  h->magic = 0;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return 120800; }
const char *cublasLtGetStatusName(cublasStatus_t s) { return status_name(s); }
const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
  }
  return "unknown error";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (!desc) return refuse("cublasLtMatmulDescCreate", CUBLAS_STATUS_INVALID_VALUE, "matmulDesc is NULL");
  cublasLtMatmulDescOpaque_t *d = new (std::nothrow) cublasLtMatmulDescOpaque_t;
  if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
  memset(d, 0, sizeof *d);
  d->compute = computeType;
  d->scale = scaleType;
  d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;            /* [Lt 3.3.9] defaults */
  d->transa = d->transb = d->transc = CUBLAS_OP_N;
  d->fill_mode = CUBLAS_FILL_MODE_FULL;
  d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d->aux_type = d->bias_type = -1;
  *desc = d;
  count(LT_DESCS);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  if (d) count(LT_DESTROYED);
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void *buf, size_t size) {
  return set_attr("cublasLtMatmulDescSetAttribute", d, attr, buf, size, desc_field);
}
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, void *buf, size_t size,
                                              size_t *written) {
  return get_attr("cublasLtMatmulDescGetAttribute", d, attr, buf, size, written, desc_field);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout) return refuse("cublasLtMatrixLayoutCreate", CUBLAS_STATUS_INVALID_VALUE, "matLayout is NULL");
  cublasLtMatrixLayoutOpaque_t *l = new (std::nothrow) cublasLtMatrixLayoutOpaque_t;
  if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
  memset(l, 0, sizeof *l);
  l->type = type;
  l->order = CUBLASLT_ORDER_COL;                             /* [Lt 3.3.19] defaults */
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  l->batch = 1;
  *layout = l;
  count(LT_LAYOUTS);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  if (l) count(LT_DESTROYED);
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const void *buf, size_t size) {
  return set_attr("cublasLtMatrixLayoutSetAttribute", l, attr, buf, size, layout_field);
}
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, void *buf, size_t size,
                                                size_t *written) {
  return get_attr("cublasLtMatrixLayoutGetAttribute", l, attr, buf, size, written, layout_field);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  if (!pref) return refuse("cublasLtMatmulPreferenceCreate", CUBLAS_STATUS_INVALID_VALUE, "pref is NULL");
  cublasLtMatmulPreferenceOpaque_t *q = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t;
  if (!q) return CUBLAS_STATUS_ALLOC_FAILED;
  memset(q, 0, sizeof *q);
  q->reduction_mask = 0x7;                                   /* [Lt 3.3.13] defaults */
  for (int i = 0; i < 4; i++) q->min_align[i] = 256;
  q->pointer_mode_mask = 0x1f;
  q->epilogue_mask = 0xffffffffu;
  q->impl_mask = ~0ull;
  *pref = q;
  count(LT_PREFS);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t q) {
  if (q) count(LT_DESTROYED);
  delete q;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t q, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
  return set_attr("cublasLtMatmulPreferenceSetAttribute", q, attr, buf, size, pref_field);
}
cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t q, cublasLtMatmulPreferenceAttributes_t attr, void *buf,
                                                    size_t size, size_t *written) {
  return get_attr("cublasLtMatmulPreferenceGetAttribute", q, attr, buf, size, written, pref_field);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t results[], int *returned) {
  const char *fn = "cublasLtMatmulAlgoGetHeuristic";
  count(LT_HEURISTICS);
  if (returned) *returned = 0;
  if (!handle_ok(h)) return refuse(fn, CUBLAS_STATUS_NOT_INITIALIZED, "not a live cublasLt handle");
  /* [Lt 3.4.22]: INVALID_VALUE "If requestedAlgoCount is less or equal to zero". */
  if (requested <= 0) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "requestedAlgoCount %d", requested);
  if (!results || !returned || !pref) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "a NULL argument");
  problem p;
  cublasStatus_t s = describe(fn, d, A, B, C, D, &p);
  if (s) return s;
  const cublasLtMatrixLayoutOpaque_t *L[4] = {A, B, C, D};
  /* [Lt 3.3.13] MIN_ALIGNMENT_X_BYTES: "Selecting a smaller value will exclude algorithms that
   * can not work with matrix X, which is not as strictly aligned as the algorithms need". No
   * kernel works on elements that are not aligned to their own size; with none left, [Lt
   * 3.4.22]: NOT_SUPPORTED "If no heuristic function available for current configuration". */
  const char *names = "ABCD";
  for (int i = 0; i < 4; i++)
    if (pow2_align(pref->min_align[i] ? pref->min_align[i] : 256) < type_size(L[i]->type))
      return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "MIN_ALIGNMENT_%c_BYTES %u is below the %zu-byte elements: no algorithm", names[i],
                    pref->min_align[i], type_size(L[i]->type));
  /* [Lt 3.3.13] EPILOGUE_MASK / POINTER_MODE_MASK filter the algorithms. */
  if ((pref->epilogue_mask & d->epilogue) != d->epilogue)
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "EPILOGUE_MASK 0x%x excludes epilogue %u", pref->epilogue_mask, d->epilogue);
  if (!(pref->pointer_mode_mask & (1u << d->pointer_mode)))
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "POINTER_MODE_MASK 0x%x excludes pointer mode %d", pref->pointer_mode_mask, d->pointer_mode);
  algo_info a = make_algo(d, L, pref->min_align);
  memset(&results[0], 0, sizeof results[0]);
  memcpy(&results[0].algo, &a, sizeof a);
  results[0].workspaceSize = 0;       /* the emulated kernels need no workspace */
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = waves(p);
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                       cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, const cublasLtMatmulAlgo_t *algo,
                                       cublasLtMatmulHeuristicResult_t *result) {
  const char *fn = "cublasLtMatmulAlgoCheck";
  if (!handle_ok(h)) return refuse(fn, CUBLAS_STATUS_NOT_INITIALIZED, "not a live cublasLt handle");
  if (!algo || !result) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "a NULL argument");
  problem p;
  cublasStatus_t s = describe(fn, d, A, B, C, D, &p);
  if (s) return s;
  const cublasLtMatrixLayoutOpaque_t *L[4] = {A, B, C, D};
  algo_info a;
  memcpy(&a, algo, sizeof a);
  /* [Lt 3.4.19]: INVALID_VALUE "If matrix layout descriptors or the operation descriptor do not
   * match the algo descriptor". */
  if (!algo_matches(a, d, L)) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "the descriptors do not match the algo");
  result->workspaceSize = 0;
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = waves(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc,
                              void *D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSize,
                              cudaStream_t stream) {
  const char *fn = "cublasLtMatmul";
  count(LT_MATMULS);
  /* [Lt 3.4.17] Returns: NOT_INITIALIZED "If cuBLASLt handle has not been initialized". */
  if (!handle_ok(h)) return refuse(fn, CUBLAS_STATUS_NOT_INITIALIZED, "not a live cublasLt handle");
  if (!Cdesc) Cdesc = Ddesc;          /* [Lt 3.4.17] "If Cdesc is omitted ... equal to Ddesc" */
  problem p;
  cublasStatus_t s = describe(fn, d, Adesc, Bdesc, Cdesc, Ddesc, &p);
  if (s) return s;
  const cublasLtMatrixLayoutOpaque_t *L[4] = {Adesc, Bdesc, Cdesc, Ddesc};
  /* INVALID_VALUE "If the parameters are unexpectedly NULL". */
  if (!alpha || !beta) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "alpha or beta is NULL");
  if (!D && p.m > 0 && p.n > 0) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "D is NULL");
  if ((!A || !B) && p.k > 0 && p.m > 0 && p.n > 0) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "A or B is NULL");
  if (!C) C = D;
  /* [Lt 3.4.17]: "This function supports both in-place matrix multiplication (C == D and
   * Cdesc == Ddesc) and out-of-place": C == D with another layout is neither. */
  if (C == D && Cdesc != Ddesc &&
      (Cdesc->ld != Ddesc->ld || Cdesc->stride != Ddesc->stride || Cdesc->order != Ddesc->order || Cdesc->type != Ddesc->type))
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "C == D but Cdesc describes another layout than Ddesc");
  /* [Lt 3.4.17] workspace: "Must be 256B aligned (i.e. lowest 8 bits of address must be 0)". */
  if (workspaceSize > 0 && !workspace) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "workspaceSizeInBytes %zu with a NULL workspace", workspaceSize);
  if (workspace && ((uintptr_t)workspace & 255))
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "workspace %p is not 256-byte aligned", workspace);
  if (workspace && workspaceSize && !emu::is_device_range(workspace, workspaceSize))
    return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "workspace [%p, +%zu) is not device memory", workspace, workspaceSize);

  /* Test knob, not the library's: SHARD_EMU_LT_REFUSE_EPILOGUE=1 refuses every matmul with an
   * epilogue here, at run time, although the heuristic offered an algorithm for it. The library
   * documents that it may ([Lt 3.4.17] Returns: NOT_SUPPORTED "If the current implementation on
   * the selected device doesn't support the configured operation"); callers must cope. */
  if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && refuse_epilogues())
    return refuse(fn, CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u refused at run time (SHARD_EMU_LT_REFUSE_EPILOGUE)", d->epilogue);

  job j;
  memset(&j, 0, sizeof j);
  j.p = p;
  j.d = *d;
  for (int i = 0; i < 4; i++) j.L[i] = *L[i];
  j.A = A;
  j.B = B;
  j.C = C;
  j.D = D;
  const void *ptrs[4] = {A, B, C, D};
  if (algo) {
    algo_info a;
    memcpy(&a, algo, sizeof a);
    /* An algo from another problem's heuristic: [Lt 3.4.19] "do not match the algo descriptor"
     * -> INVALID_VALUE. */
    if (!algo_matches(a, d, L)) return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "the descriptors do not match the algo (types, transposes, orders, epilogue)");
    /* [Lt 3.4.19] note: "The algo will fail if, for example, the buffers are not correctly
     * aligned": a matrix less aligned than the preferences the algo was chosen under promised.
     * Which status the library gives is not documented; the emulator returns INVALID_VALUE
     * ("parameters ... in conflict"). */
    const char *names = "ABCD";
    for (int i = 0; i < 4; i++) {
      if (i < 2 && p.k == 0) continue;
      uint32_t have = pow2_align((uintptr_t)ptrs[i]);
      if (ptrs[i] && have < a.align[i])
        return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "matrix %c at %p is %u-byte aligned; the algo was chosen for %u", names[i], ptrs[i], have,
                      a.align[i]);
    }
    j.bias_align = a.bias_align;
    j.aux_align = a.aux_align;
  } else {
    /* [Lt 3.4.17] algo NULL: "an implicit heuristics query with default search preferences";
     * it sees the actual pointers, so whatever it picks fits them. */
    j.bias_align = 1;
    j.aux_align = 1;
  }
  /* Scalars: host mode reads them now; device mode when the work runs. */
  if (d->pointer_mode == CUBLASLT_POINTER_MODE_HOST) {
    j.alpha = p.f64 ? *(const double *)alpha : d->scale == CUDA_R_16F ? emu_fp::half_to_f32(*(const uint16_t *)alpha) : *(const float *)alpha;
    j.beta = p.f64 ? *(const double *)beta : d->scale == CUDA_R_16F ? emu_fp::half_to_f32(*(const uint16_t *)beta) : *(const float *)beta;
  } else {
    size_t ss = type_size(d->scale);
    if (!emu::is_device_range(alpha, ss) || !emu::is_device_range(beta, ss))
      return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "POINTER_MODE_DEVICE but alpha/beta are not device memory");
    j.alpha_dev = alpha;
    j.beta_dev = beta;
  }
  bool reads_c = j.beta_dev || j.beta != 0.0;
  /* The pointers must be device memory of the current device: the library would fault on
   * anything else; the emulator refuses at the call (INVALID_VALUE) so the caller sees where. */
  for (const span &sp : spans(j, reads_c))
    if (!in_device(sp.p, sp.lo, sp.hi))
      return refuse(fn, CUBLAS_STATUS_INVALID_VALUE, "%s [%p, +%lld bytes) is not (all) device memory", sp.name,
                    (const void *)((const char *)sp.p + sp.lo), (long long)(sp.hi - sp.lo));
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  auto shared = std::make_shared<job>(j);
  cudaError_t e = emu::enqueue(stream, "cublasLtMatmul", [shared, reads_c]() { run_checked(*shared, reads_c); });
  if (e != cudaSuccess)
    return refuse(fn, CUBLAS_STATUS_EXECUTION_FAILED, "the stream did not take the work: %s", cudaGetErrorName(e));
  return CUBLAS_STATUS_SUCCESS;
}

/* Test infrastructure, not the library's: what callers made since the last reset, for the
 * tests of a caller's plan cache (tests/gpu/test_matmul_plans.c declares these weakly, so it
 * links on a real GPU too, where they are absent):
 *   out[0] descriptors created, out[1] layouts created, out[2] preferences created,
 *   out[3] heuristic queries, out[4] descriptors, layouts and preferences destroyed,
 *   out[5] cublasLtMatmul calls (refused ones included). */
void sh_emu_lt_counts(long out[6]) {
  for (int i = 0; i < LT_NCOUNTS; i++) out[i] = g_counts[i].load();
}
void sh_emu_lt_counts_reset(void) {
  for (int i = 0; i < LT_NCOUNTS; i++) g_counts[i].store(0);
}

}  // extern "C"
