/* mma_sm80.cuh (CUDA emulator): the stand-in of kernels/mma_sm80.cuh, the sm_80+ warp-level
 * instructions as the PTX ISA defines them, for kernels compiled by g++ and run as fibers by
 * the emulator's core. Test infrastructure only (tests/cuda_emu).
 *
 *  - ldsm_x4 / ldsm_x4_trans (ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16) and
 *    mma_bf16_16816 (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32) are warp-collective
 *    (".sync.aligned": every lane of the warp executes the same instruction): each is a
 *    rendezvous of the whole warp through emu::warp_collective, so a diverged or missing lane
 *    fails the launch with a divergence report naming the kernel's line. Every row address
 *    ldmatrix is given must be 16-byte aligned (PTX ISA): checked.
 *  - The fragment layouts are the PTX ISA's, element for element (kernels/mma_sm80.cuh lists
 *    them), so a kernel that assumes another layout computes the wrong numbers here too.
 *  - mma: the bf16 products are exact in f32 and accumulated with fmaf, k in order, from C.
 *  - cp_async16 copies at once (or zero-fills), so the data is there before cp_async_wait; a
 *    read that skips the wait is not caught here, one that skips the barrier after it is (the
 *    other threads' copies are missing under SHARD_EMU_THREAD_ORDER=reverse). */
#pragma once
#include <cstdint>
#include <cstring>
#include "cuda_bf16.h"
#include "mma.h"

namespace emu_sm80 {

using nvcuda::wmma::emu_detail::check_warp;
using nvcuda::wmma::emu_detail::rendezvous;

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t half_of(uint32_t r, int hi) { return (uint16_t)(hi ? r >> 16 : r & 0xffff); }

/* Lane l's four registers of an ldmatrix.x4 from the 32 published row addresses. */
inline void ldsm_read(uint32_t r[4], const void *const *rows, int l, bool trans) {
  for (int j = 0; j < 4; j++) {
    uint16_t e[2];
    for (int h = 0; h < 2; h++) {
      const uint16_t *row = static_cast<const uint16_t *>(rows[8 * j + (trans ? 2 * (l % 4) + h : l / 4)]);
      e[h] = trans ? row[l / 4] : row[2 * (l % 4) + h];
    }
    r[j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
  }
}

inline void ldsm(uint32_t r[4], const void *row, bool trans, const char *file, int line) {
  const char *what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
  check_warp(what);
  if (((uintptr_t)row & 15) != 0)
    emu::device_fail("%s at %s:%d: row address %p is not 16-byte aligned (PTX ISA, ldmatrix)", what, file, line, row);
  const void **table = static_cast<const void **>(emu::warp_scratch());
  int l = emu::lane();
  table[l] = row;
  rendezvous(what, nullptr, 0, file, line);
  uint32_t out[4];
  ldsm_read(out, table, l, trans);
  rendezvous("ldmatrix (rows read)", nullptr, 0, file, line);
  memcpy(r, out, sizeof out);
}

/* A[row][k], B[k][col], C[row][col] of the warp's fragments, found in the lane that owns them. */
inline float a_elem(void *const *table, int row, int k) {
  const uint32_t *a = static_cast<const uint32_t *>(table[3 * ((row % 8) * 4 + (k % 8) / 2) + 0]);
  return bf16_bits_to_float(half_of(a[row / 8 + 2 * (k / 8)], k % 2));
}

inline float b_elem(void *const *table, int k, int col) {
  const uint32_t *b = static_cast<const uint32_t *>(table[3 * (col * 4 + (k % 8) / 2) + 1]);
  return bf16_bits_to_float(half_of(b[k / 8], k % 2));
}

inline float c_elem(void *const *table, int row, int col) {
  const float *c = static_cast<const float *>(table[3 * ((row % 8) * 4 + col / 2) + 2]);
  return c[(row / 8) * 2 + col % 2];
}

}  // namespace emu_sm80

inline void ldsm_x4(uint32_t r[4], const void *row, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu_sm80::ldsm(r, row, false, file, line);
}

inline void ldsm_x4_trans(uint32_t r[4], const void *row, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu_sm80::ldsm(r, row, true, file, line);
}

inline void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const char *file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
  const char *what = "mma.m16n8k16.bf16";
  emu_sm80::check_warp(what);
  void **table = static_cast<void **>(emu::warp_scratch());
  int l = emu::lane(), g = l / 4, t = l % 4;
  table[3 * l + 0] = (void *)a;
  table[3 * l + 1] = (void *)b;
  table[3 * l + 2] = (void *)d;
  emu_sm80::rendezvous(what, nullptr, 0, file, line);
  float out[4];
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float acc = emu_sm80::c_elem(table, row, col);
    for (int k = 0; k < 16; k++) acc = std::fma(emu_sm80::a_elem(table, row, k), emu_sm80::b_elem(table, k, col), acc);
    out[i] = acc;
  }
  emu_sm80::rendezvous("mma.m16n8k16.bf16 (operands read)", nullptr, 0, file, line);
  memcpy(d, out, sizeof out);
}

inline void cp_async16(void *dst, const void *src, bool valid) {
  if (valid) memcpy(dst, src, 16);
  else memset(dst, 0, 16);
}

inline void cp_async_commit() {}

template <int n>
inline void cp_async_wait() {}

inline uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, sizeof r);
  return r;
}
