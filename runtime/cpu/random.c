/* random.c: arange and the random fills: the fronts (any device) and the CPU kernels.
 * Random element i (in row-major order of the target's shape, whatever its strides) takes
 * counter offset + i of the Philox stream (philox_internal.h), so a strided view, a
 * contiguous tensor and a CUDA tensor of the same shape get the same numbers, and drawing
 * n then m numbers equals drawing n + m. Every element is independent, so rows split over
 * threads without changing a single value. Uniform numbers lie in (low, high]
 * (philox's unit interval is (0, 1]), so a log of one is always finite.
 * The fronts are ops/random.c. */
#include "cpu_internal.h"
#include "core/rules_internal.h"
#include "core/philox_internal.h"
#include "core/parallel.h"
#include <math.h>
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

int sh_kcpu_arange(sh_tensor *out, double start, double step) {
  void *d = sh_tensor_data(out);
  for (int64_t i = 0; i < out->shape[0]; i++) sh_store(d, out->dtype, i, start + (double)i * step);
  return SH_OK;
}

/* Element offset of the start of row r (the row being the last dim) of t. */
static int64_t row_offset(const sh_tensor *t, int64_t r) {
  int64_t off = t->offset;
  for (int d = t->ndim - 2; d >= 0; d--) { off += (r % t->shape[d]) * t->stride[d]; r /= t->shape[d]; }
  return off;
}

/* Standard normals for the consecutive counters [c, c + n): each Philox block gives four
 * uniforms, so whole blocks take one block and two Box-Muller pairs for four numbers;
 * the expressions are sh_philox_normal's own, so every value is bit for bit the same. */
static void normal_run(uint64_t seed, uint64_t c, int64_t n, float *out) {
  int64_t k = 0;
  for (; k < n && ((c + k) & 3); k++) out[k] = sh_philox_normal(seed, 0, c + k);
  for (; k + 4 <= n; k += 4) {
    sh_philox_out o = sh_philox4x32(seed, (c + k) >> 2);
    for (int pair = 0; pair < 4; pair += 2) {
      float u1 = sh_u32_to_unit(o.v[pair]), u2 = sh_u32_to_unit(o.v[pair + 1]);
      float r = sqrtf(-2.0f * logf(u1));
      float th = 6.283185307179586f * u2;
      out[k + pair] = r * cosf(th);
      out[k + pair + 1] = r * sinf(th);
    }
  }
  for (; k < n; k++) out[k] = sh_philox_normal(seed, 0, c + k);
}

static void uniform_run(uint64_t seed, uint64_t c, int64_t n, float *out) {
  int64_t k = 0;
  for (; k < n && ((c + k) & 3); k++) out[k] = sh_philox_uniform(seed, 0, c + k);
  for (; k + 4 <= n; k += 4) {
    sh_philox_out o = sh_philox4x32(seed, (c + k) >> 2);
    for (int q = 0; q < 4; q++) out[k + q] = sh_u32_to_unit(o.v[q]);
  }
  for (; k < n; k++) out[k] = sh_philox_uniform(seed, 0, c + k);
}

/* Fills every element of the CPU tensor t with scale * z + shift (f32 math, as on the GPU),
 * z from run() for the counter offset + i of element i in row-major order. Chunks of CHUNK
 * elements are the unit of parallel work, so a single long row splits as well as many
 * short ones. */
enum { CHUNK = 4096 };

typedef struct random_job {
  const sh_tensor *t;
  void (*run)(uint64_t, uint64_t, int64_t, float *);
  uint64_t seed, offset;
  float scale, shift;
} random_job;

/* Chunks c0 .. c1 of CHUNK elements in index order. */
static void random_chunks(void *arg, int64_t c0, int64_t c1) {
  const random_job *jb = arg;
  const sh_tensor *t = jb->t;
  int64_t n = sh_tensor_numel(t);
  int64_t len = t->ndim ? t->shape[t->ndim - 1] : 1, inner = t->ndim ? t->stride[t->ndim - 1] : 0;
  char *base = t->storage->data;
  int dt = t->dtype;
  for (int64_t c = c0; c < c1; c++) {
    float z[CHUNK];
    int64_t i0 = c * CHUNK, i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
    jb->run(jb->seed, jb->offset + (uint64_t)i0, i1 - i0, z);
    int64_t r = i0 / len, j = i0 % len, off = row_offset(t, r);
    for (int64_t k = 0; k < i1 - i0; k++) {
      float v = jb->shift + jb->scale * z[k];
      if (dt == SH_F32) ((float *)base)[off + j * inner] = v;
      else sh_store(base, dt, off + j * inner, v);
      if (++j == len) { j = 0; off = row_offset(t, ++r); }
    }
  }
}

static void fill_random(sh_tensor *t, void (*run)(uint64_t, uint64_t, int64_t, float *), uint64_t seed,
                        uint64_t offset, float scale, float shift) {
  int64_t n = sh_tensor_numel(t);
  random_job job = {.t = t, .run = run, .seed = seed, .offset = offset, .scale = scale, .shift = shift};
  sh_parallel_for((n + CHUNK - 1) / CHUNK, n > 2 * CHUNK, random_chunks, &job);
}

int sh_kcpu_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  fill_random(t, normal_run, seed, offset, (float)std, (float)mean);
  return SH_OK;
}

int sh_kcpu_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high) {
  fill_random(t, uniform_run, seed, offset, (float)high - (float)low, (float)low);
  return SH_OK;
}
