/* mma.h (CUDA emulator): nvcuda::wmma, the warp matrix functions of the CUDA C++ Programming
 * Guide ("Warp Matrix Functions"), for kernels compiled by g++ and run as fibers by the
 * emulator's core. Test infrastructure only (tests/cuda_emu).
 *
 * What the guide specifies and the emulator enforces:
 *  - fragment<Use, m, n, k, T, Layout>: matrix_a is m x k, matrix_b is k x n, accumulator is
 *    m x n; Layout (row_major / col_major) is part of matrix_a / matrix_b, an accumulator has
 *    none and gets one at load/store (mem_row_major / mem_col_major). Shapes: 16x16x16,
 *    32x8x16, 8x32x16 with __half / __nv_bfloat16 inputs and float or __half accumulators.
 *  - "The mapping of matrix elements into fragment internal storage is unspecified": here each
 *    lane owns num_elements = (rows * cols) / 32 elements of the tile, element (r, c) living in
 *    lane (r * cols + c) % 32 at x[(r * cols + c) / 32]. A uniform element-wise operation on
 *    x[0 .. num_elements) therefore applies to every element exactly once, as on hardware.
 *    A fragment that nothing filled or loaded holds NaN (hardware: whatever the registers held).
 *  - load_matrix_sync, store_matrix_sync, mma_sync "wait until all warp lanes have arrived":
 *    each is an emu::warp_collective rendezvous of the whole warp; a lane that does not
 *    arrive (diverged, exited, at another barrier) fails the launch with a divergence report.
 *    mptr, ldm and the layout "must be the same for all threads in the warp": checked.
 *    "mptr must be a 256-bit aligned pointer" and "ldm ... must be a multiple of 8 for
 *    __half element type or multiple of 4 for float element type (i.e. a multiple of 16 bytes)":
 *    checked; a violation fails the launch (emu::device_fail) naming the rule. The PTX ISA is
 *    stricter than the guide for some types ("Matrix Storage for WMMA": every row or column must
 *    start aligned to the lane's fragment size, e.g. 32 bytes for float accumulators, so ldm a
 *    multiple of 8 floats). That stricter rule is enforced too by default, since the code
 *    nvcc generates may rely on it; SHARD_EMU_WMMA_PTX=0 checks the guide's rule only.
 *  - fill_fragment is not a _sync function (the guide: "ordinarily called by all threads in the
 *    warp with a common value"): it sets the calling lane's elements only, with no rendezvous.
 *  - mma_sync computes D = A * B + C with the products of the (exact) half / bfloat16 inputs
 *    accumulated in float (fmaf, k in order, starting from C), then rounded to D's type;
 *    satf=true saturates (+-inf -> +-max finite, NaN -> 0) as documented. */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include "cuda_fp16.h"
#include "cuda_bf16.h"
#include "emu_device.h"

namespace emu {
/* Weak here: used when the core provides it (emu_device.h, LIBS request 2). */
void warp_collective_at(const char *what, const void *uniform, size_t bytes, const char *file, int line) __attribute__((weak));
}

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace emu_detail {

template <typename Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> { static constexpr int R = M, C = K; };
template <int M, int N, int K> struct dims<matrix_b, M, N, K> { static constexpr int R = K, C = N; };
template <int M, int N, int K> struct dims<accumulator, M, N, K> { static constexpr int R = M, C = N; };

template <int M, int N, int K> struct shape_ok {
  static constexpr bool value = (M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) || (M == 8 && N == 32 && K == 16);
};

template <typename T> inline float to_float(T v) { return float(v); }
template <> inline float to_float<__half>(__half v) { return __half2float(v); }
template <> inline float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> inline T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <typename T> inline T nan_value() { return from_float<T>(std::numeric_limits<float>::quiet_NaN()); }

template <typename T> struct type_id;
template <> struct type_id<__half> { static constexpr int v = 1; static constexpr const char *name = "__half"; };
template <> struct type_id<__nv_bfloat16> { static constexpr int v = 2; static constexpr const char *name = "__nv_bfloat16"; };
template <> struct type_id<float> { static constexpr int v = 3; static constexpr const char *name = "float"; };

/* The warp-uniform arguments of a load or store, compared across lanes by the core. */
struct mem_args {
  const void *ptr;
  unsigned ldm;
  int layout;                 /* 0 row, 1 col */
  int use, m, n, k, type;
};

inline void rendezvous(const char *what, const void *uniform, size_t bytes, const char *file, int line) {
  if (emu::warp_collective_at) emu::warp_collective_at(what, uniform, bytes, file, line);
  else emu::warp_collective(what, uniform, bytes);
}

inline void check_warp(const char *what) {
  if (!emu::in_kernel()) emu::device_fail("%s called outside a kernel", what);
  if (emu::warp_lanes() != 0xffffffffu)
    emu::device_fail("%s: warp %d has only some of its 32 lanes (lane mask 0x%08x); wmma needs the whole warp", what,
                     emu::warp(), emu::warp_lanes());
}

/* The size in bytes of a lane's fragment as the PTX ISA defines it ("Matrix Fragments for
 * WMMA"): .f16 A/B eight .f16x2 registers; .bf16 A/B per shape (m16n16k16: four .b32, m8n32k16:
 * A two / B eight, m32n8k16: A eight / B two); .f32 accumulators eight .f32; .f16 four .f16x2. */
template <typename Use, int m, int n, int k, typename T> constexpr unsigned ptx_fragment_bytes() {
  return std::is_same<Use, accumulator>::value ? (std::is_same<T, float>::value ? 32u : 16u)
         : std::is_same<T, __half>::value      ? 32u
         : (m == 16)                           ? 16u
         : (m == 8)                            ? (std::is_same<Use, matrix_a>::value ? 8u : 32u)
                                               : (std::is_same<Use, matrix_a>::value ? 32u : 8u);
}

/* The CUDA C++ Programming Guide's rules (always): "mptr must be a 256-bit aligned pointer";
 * ldm "must be a multiple of 8 for __half element type or multiple of 4 for float element type
 * (i.e., multiple of 16 bytes in both cases)". Unless SHARD_EMU_WMMA_PTX=0, also the PTX ISA's
 * stricter rule ("Matrix Storage for WMMA", Address Alignment): "The starting address of each
 * instance of the leading dimension (row or column) must be aligned with the size of the
 * corresponding fragment in bytes", i.e. ldm * sizeof(T) a multiple of the fragment size. */
template <typename Use, int m, int n, int k, typename T>
inline void check_mem(const char *what, const void *p, unsigned ldm, const char *file, int line) {
  if (((uintptr_t)p & 31) != 0)
    emu::device_fail("%s at %s:%d: mptr %p is not 256-bit (32-byte) aligned, as the CUDA Programming Guide requires", what, file, line, p);
  if (((size_t)ldm * sizeof(T)) % 16 != 0)
    emu::device_fail("%s at %s:%d: ldm %u is not a multiple of 16 bytes for %s elements (%s requires a multiple of %u)", what, file,
                     line, ldm, type_id<T>::name, what, (unsigned)(16 / sizeof(T)));
  const char *ptx = getenv("SHARD_EMU_WMMA_PTX");
  if (!ptx || strcmp(ptx, "0") != 0) {
    const unsigned fb = ptx_fragment_bytes<Use, m, n, k, T>();
    if (((size_t)ldm * sizeof(T)) % fb != 0)
      emu::device_fail("%s at %s:%d: ldm %u (%zu bytes) does not keep every row start aligned to the %u-byte %s fragment "
                       "(PTX ISA, Matrix Storage for WMMA: each row or column must start aligned to the fragment size)",
                       what, file, line, ldm, (size_t)ldm * sizeof(T), fb, type_id<T>::name);
  }
}

}  // namespace emu_detail

template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment {
  static_assert(emu_detail::shape_ok<m, n, k>::value, "wmma shape must be 16x16x16, 32x8x16 or 8x32x16 for half/bf16");
  static_assert(std::is_same<Use, accumulator>::value ? (std::is_same<Layout, void>::value)
                                                      : (std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value),
                "matrix_a / matrix_b fragments take row_major or col_major; accumulators take no layout");
  static_assert(std::is_same<Use, accumulator>::value ? (std::is_same<T, float>::value || std::is_same<T, __half>::value)
                                                      : (std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value),
                "wmma element types: __half / __nv_bfloat16 inputs, float / __half accumulators");

 public:
  typedef T element_type;
  typedef T storage_element_type;
  static constexpr int rows = emu_detail::dims<Use, m, n, k>::R;
  static constexpr int cols = emu_detail::dims<Use, m, n, k>::C;
  enum { num_elements = rows * cols / 32 };
  storage_element_type x[num_elements];

  fragment() {
    for (int i = 0; i < num_elements; i++) x[i] = emu_detail::nan_value<T>();
  }
};

namespace emu_detail {

/* Element (r, c) of a fragment lives in lane (r * cols + c) % 32 at x[(r * cols + c) / 32]. */
template <typename Frag> inline void coord(int lane, int i, int &r, int &c) {
  int idx = i * 32 + lane;
  r = idx / Frag::cols;
  c = idx % Frag::cols;
}
template <typename Frag> inline float element(void *const *table, int which, int r, int c) {
  int idx = r * Frag::cols + c;
  const Frag *f = static_cast<const Frag *>(table[(idx % 32) * 3 + which]);
  return to_float(f->x[idx / 32]);
}

template <typename Use> struct use_id;
template <> struct use_id<matrix_a> { static constexpr int v = 0; };
template <> struct use_id<matrix_b> { static constexpr int v = 1; };
template <> struct use_id<accumulator> { static constexpr int v = 2; };

template <typename Frag, typename Use, int m, int n, int k, typename T>
inline void load(Frag &a, const T *mptr, unsigned ldm, int col, const char *what, const char *file, int line) {
  check_warp(what);
  mem_args u = {mptr, ldm, col, use_id<Use>::v, m, n, k, type_id<T>::v};
  rendezvous(what, &u, sizeof u, file, line);
  check_mem<Use, m, n, k, T>(what, mptr, ldm, file, line);
  int lane = emu::lane();
  for (int i = 0; i < Frag::num_elements; i++) {
    int r, c;
    coord<Frag>(lane, i, r, c);
    a.x[i] = col ? mptr[(size_t)c * ldm + r] : mptr[(size_t)r * ldm + c];
  }
}

}  // namespace emu_detail

template <typename Use, int m, int n, int k, typename T, typename Layout>
inline void fill_fragment(fragment<Use, m, n, k, T, Layout> &a, const T &v) {
  for (int i = 0; i < a.num_elements; i++) a.x[i] = v;
}
/* A value of another type (fill_fragment(c, 0.0f) on a __half accumulator) converts first. */
template <typename Use, int m, int n, int k, typename T, typename Layout, typename V,
          typename = typename std::enable_if<!std::is_same<T, V>::value>::type>
inline void fill_fragment(fragment<Use, m, n, k, T, Layout> &a, const V &v) {
  fill_fragment(a, emu_detail::from_float<T>(float(v)));
}

template <typename Use, int m, int n, int k, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, m, n, k, T, Layout> &a, const T *mptr, unsigned ldm, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load needs a layout_t (mem_row_major / mem_col_major)");
  emu_detail::load<fragment<Use, m, n, k, T, Layout>, Use, m, n, k, T>(a, mptr, ldm, std::is_same<Layout, col_major>::value,
                                                                        "wmma::load_matrix_sync", file, line);
}

template <int m, int n, int k, typename T>
inline void load_matrix_sync(fragment<accumulator, m, n, k, T> &a, const T *mptr, unsigned ldm, layout_t layout,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (layout != mem_row_major && layout != mem_col_major)
    emu::device_fail("wmma::load_matrix_sync: layout %d is neither mem_row_major nor mem_col_major", (int)layout);
  emu_detail::load<fragment<accumulator, m, n, k, T>, accumulator, m, n, k, T>(a, mptr, ldm, layout == mem_col_major,
                                                                               "wmma::load_matrix_sync", file, line);
}

template <int m, int n, int k, typename T>
inline void store_matrix_sync(T *mptr, const fragment<accumulator, m, n, k, T> &a, unsigned ldm, layout_t layout,
                              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  typedef fragment<accumulator, m, n, k, T> Frag;
  const char *what = "wmma::store_matrix_sync";
  emu_detail::check_warp(what);
  if (layout != mem_row_major && layout != mem_col_major)
    emu::device_fail("%s: layout %d is neither mem_row_major nor mem_col_major", what, (int)layout);
  emu_detail::mem_args u = {mptr, ldm, layout == mem_col_major, 2, m, n, k, emu_detail::type_id<T>::v};
  emu_detail::rendezvous(what, &u, sizeof u, file, line);
  emu_detail::check_mem<accumulator, m, n, k, T>(what, mptr, ldm, file, line);
  int lane = emu::lane();
  for (int i = 0; i < Frag::num_elements; i++) {
    int r, c;
    emu_detail::coord<Frag>(lane, i, r, c);
    if (layout == mem_col_major) mptr[(size_t)c * ldm + r] = a.x[i];
    else mptr[(size_t)r * ldm + c] = a.x[i];
  }
}

template <int m, int n, int k, typename Td, typename Ta, typename La, typename Tb, typename Lb, typename Tc>
inline void mma_sync(fragment<accumulator, m, n, k, Td> &d, const fragment<matrix_a, m, n, k, Ta, La> &a,
                     const fragment<matrix_b, m, n, k, Tb, Lb> &b, const fragment<accumulator, m, n, k, Tc> &c,
                     bool satf = false, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(std::is_same<Ta, Tb>::value, "wmma::mma_sync: matrix_a and matrix_b must have the same element type");
  static_assert(!std::is_same<Ta, __nv_bfloat16>::value || (std::is_same<Tc, float>::value && std::is_same<Td, float>::value),
                "wmma::mma_sync: __nv_bfloat16 inputs take float accumulators only (PTX: .bf16 has .ctype .f32)");
  typedef fragment<matrix_a, m, n, k, Ta, La> FA;
  typedef fragment<matrix_b, m, n, k, Tb, Lb> FB;
  typedef fragment<accumulator, m, n, k, Tc> FC;
  typedef fragment<accumulator, m, n, k, Td> FD;
  const char *what = "wmma::mma_sync";
  emu_detail::check_warp(what);
  int sig[6] = {m, n, k, emu_detail::type_id<Ta>::v, emu_detail::type_id<Tc>::v * 4 + emu_detail::type_id<Td>::v, satf};
  void **table = static_cast<void **>(emu::warp_scratch());
  int lane = emu::lane();
  /* Publish this lane's fragments, meet the warp, read everyone's, meet again before any lane
   * writes D (which may be A, B or C of another lane) or reuses the table. */
  table[lane * 3 + 0] = (void *)&a;
  table[lane * 3 + 1] = (void *)&b;
  table[lane * 3 + 2] = (void *)&c;
  emu_detail::rendezvous(what, sig, sizeof sig, file, line);
  float out[FD::num_elements];
  for (int i = 0; i < FD::num_elements; i++) {
    int r, col;
    emu_detail::coord<FD>(lane, i, r, col);
    float acc = emu_detail::element<FC>(table, 2, r, col);
    for (int kk = 0; kk < k; kk++)
      acc = std::fma(emu_detail::element<FA>(table, 0, r, kk), emu_detail::element<FB>(table, 1, kk, col), acc);
    if (satf) {
      if (std::isnan(acc)) acc = 0.0f;
      float mx = std::is_same<Td, __half>::value ? 65504.0f : std::numeric_limits<float>::max();
      if (acc > mx) acc = mx;
      if (acc < -mx) acc = -mx;
    }
    out[i] = acc;
  }
  emu_detail::rendezvous("wmma::mma_sync (operands read)", nullptr, 0, file, line);
  for (int i = 0; i < FD::num_elements; i++) d.x[i] = emu_detail::from_float<Td>(out[i]);
}

}  // namespace wmma
}  // namespace nvcuda
