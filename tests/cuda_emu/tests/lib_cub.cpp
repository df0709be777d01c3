/* lib_cub.cpp: the emulator's cub::DeviceRadixSort::SortPairs as kernels/embedding.cu calls it
 * (int32 keys and values, a bit range, the temporary-storage size query, a stream) and as CUB
 * documents it: stable, keys ordered on [begin_bit, end_bit) of their radix form (signed and
 * floating-point keys included), too little temporary storage refused, overlapping ranges
 * refused, the sort queued on the stream, its temporary storage really used. */
#include <cub/cub.cuh>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>
#include "emu_api.h"
#include "emu_test.h"
#include "tests/lib_check.h"

template <class T> static T *dev(const std::vector<T> &h) {
  T *d;
  cudaMalloc((void **)&d, h.size() * sizeof(T) + 1);
  if (!h.empty()) cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <class T> static std::vector<T> host(const T *d, size_t n) {
  std::vector<T> h(n);
  if (n) cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

/* Sorts (keys, 0..n-1) and checks against std::stable_sort on `digit(key)`. */
template <class K, class D>
static bool sort_matches(const std::vector<K> &keys, int begin, int end, D digit, const char *what, bool descending = false) {
  int n = (int)keys.size();
  std::vector<int> vals(n);
  std::iota(vals.begin(), vals.end(), 0);
  K *k1 = dev(keys), *k2 = dev(std::vector<K>(n));
  int *v1 = dev(vals), *v2 = dev(std::vector<int>(n));
  size_t bytes = 0;
  cudaError_t e = descending ? cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, k1, k2, v1, v2, n, begin, end)
                             : cub::DeviceRadixSort::SortPairs(nullptr, bytes, k1, k2, v1, v2, n, begin, end);
  void *temp;
  cudaMalloc(&temp, bytes);
  cudaStream_t st;
  cudaStreamCreate(&st);
  if (e == cudaSuccess)
    e = descending ? cub::DeviceRadixSort::SortPairsDescending(temp, bytes, k1, k2, v1, v2, n, begin, end, st)
                   : cub::DeviceRadixSort::SortPairs(temp, bytes, k1, k2, v1, v2, n, begin, end, st);
  cudaError_t s = cudaStreamSynchronize(st);
  std::vector<K> gk = host(k2, n);
  std::vector<int> gv = host(v2, n);
  std::vector<int> want(n);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int a, int b) {
    return descending ? digit(keys[a]) > digit(keys[b]) : digit(keys[a]) < digit(keys[b]);
  });
  bool ok = e == cudaSuccess && s == cudaSuccess;
  for (int i = 0; ok && i < n; i++) ok = gv[i] == want[i] && memcmp(&gk[i], &keys[want[i]], sizeof(K)) == 0;
  if (!ok) printf("  %s: %s / %s\n", what, cudaGetErrorName(e), cudaGetErrorName(s));
  cudaFree(k1); cudaFree(k2); cudaFree(v1); cudaFree(v2); cudaFree(temp);
  cudaStreamDestroy(st);
  return ok;
}

int main() {
  std::mt19937 rng(5);
  /* embedding.cu's call: keys in [0, V], many repeats, sorted on the low `bits` bits. */
  {
    int V = 37, n = 5000, bits = 1;
    while (bits < 32 && (1LL << bits) <= V) bits++;
    std::vector<int32_t> keys(n);
    for (auto &k : keys) k = (int32_t)(rng() % (V + 1));
    CHECK(sort_matches(keys, 0, bits, [](int32_t k) { return k; }, "embedding keys"),
          "stable SortPairs of %d int32 keys on bits [0, %d)", n, bits);
  }
  /* Only the bits asked for count: keys equal on [4, 12) keep their input order. */
  {
    std::vector<uint32_t> keys(3000);
    for (auto &k : keys) k = rng();
    CHECK(sort_matches(keys, 4, 12, [](uint32_t k) { return (k >> 4) & 0xff; }, "bits 4..12"), "SortPairs on bits [4, 12) is stable");
  }
  /* Signed and floating-point keys sort by value (the documented bit twiddles). */
  {
    std::vector<int32_t> keys(2000);
    for (auto &k : keys) k = (int32_t)rng() % 1000;
    CHECK(sort_matches(keys, 0, 32, [](int32_t k) { return k; }, "signed"), "negative int32 keys sort before positive ones");
    std::vector<float> fk(2000);
    for (auto &k : fk) k = std::uniform_real_distribution<float>(-10, 10)(rng);
    fk[0] = -0.0f; fk[1] = 0.0f; fk[2] = -INFINITY; fk[3] = INFINITY; fk[4] = 0.0f; fk[5] = -0.0f;
    CHECK(sort_matches(fk, 0, 32, [](float k) { return k == 0 ? 0.0f : k; }, "float"), "float keys by value, -0.0 with +0.0, stable");
    std::vector<int64_t> lk(1000);
    for (auto &k : lk) k = (int64_t)(((uint64_t)rng() << 32) | rng()) % 100;
    CHECK(sort_matches(lk, 0, 64, [](int64_t k) { return k; }, "int64 descending", true), "SortPairsDescending of int64 keys is stable");
  }
  /* The size query does no work; too little storage, bad bit ranges and overlaps are refused. */
  {
    int n = 100;
    std::vector<int32_t> keys(n, 3), vals(n, 1);
    int32_t *k1 = dev(keys), *k2 = dev(keys), *v1 = dev(vals), *v2 = dev(vals);
    emu::reset_counters();
    size_t bytes = 0;
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k1, k2, v1, v2, n, 0, 8) == cudaSuccess && bytes > 0 &&
              emu::get_counters().library_calls == 0,
          "size query: %zu bytes, nothing queued", bytes);
    void *temp;
    cudaMalloc(&temp, bytes);
    size_t small = bytes - 1;
    CHECK(cub::DeviceRadixSort::SortPairs(temp, small, k1, k2, v1, v2, n, 0, 8) == cudaErrorInvalidValue, "one byte too little: cudaErrorInvalidValue");
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k1, k1, v1, v2, n, 0, 8) == cudaErrorInvalidValue, "keys sorted in place: cudaErrorInvalidValue");
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k1, k2, v1, v2, n, 0, 33) == cudaErrorInvalidValue, "end_bit 33 of a 32-bit key: refused");
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k1, k2, v1, v2, n, 0, 8) == cudaSuccess && emu::get_counters().library_calls == 1,
          "the sort is queued on the stream");
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "and runs");
    /* Temporary storage that is not device memory when the queued sort runs (here: past the
     * end of its allocation) is a device fault, reported when the sort runs. */
    CHECK(cub::DeviceRadixSort::SortPairs((char *)temp + bytes + 4096 * 16, bytes, k1, k2, v1, v2, n, 0, 8) == cudaSuccess,
          "queued with temporary storage outside any allocation");
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaErrorIllegalAddress && strstr(emu::last_report(), "d_temp_storage"), "detected when it runs: %s / %s", cudaGetErrorName(e),
          emu::last_report());
    emu::test_reset();
    cudaFree(temp); cudaFree(k1); cudaFree(k2); cudaFree(v1); cudaFree(v2);
  }
  /* No items: nothing to do, success. */
  {
    size_t bytes = 0;
    int *p = nullptr;
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, p, p, p, p, 0) == cudaSuccess, "zero items: size query");
    void *t;
    cudaMalloc(&t, bytes ? bytes : 1);
    CHECK(cub::DeviceRadixSort::SortPairs(t, bytes, p, p, p, p, 0) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "zero items: sort");
    cudaFree(t);
  }
  return lib_summary("lib_cub");
}
