/* cub/cub.cuh (CUDA emulator): cub::DeviceRadixSort from CUB's documentation (NVIDIA CCCL),
 * for g++ on a machine without the CUDA toolkit. Test infrastructure only (tests/cuda_emu);
 * the sort itself is in tests/cuda_emu/cub.cpp.
 *
 * As CUB documents it:
 *  - called with d_temp_storage == nullptr, a sort only writes the temporary storage it needs
 *    into temp_storage_bytes and returns cudaSuccess ("no work is done");
 *  - otherwise the sort is queued on `stream` and runs in stream order, like CUB's kernels;
 *    too little temporary storage gives cudaErrorInvalidValue;
 *  - keys are ordered on bits [begin_bit, end_bit) of their radix form: unsigned integers as
 *    they are, signed integers with the sign bit flipped, floating point with the sign bit
 *    flipped for positives and every bit flipped for negatives ("the bitwise transformations
 *    occur before the bit-range truncation"); -0.0 sorts as +0.0;
 *  - the sort is stable (equal keys keep their input order), which CUB's radix sort is;
 *  - the input and output ranges "shall not overlap": an overlap is refused with
 *    cudaErrorInvalidValue (undefined behaviour in CUB; the emulator says so instead).
 * The temporary storage is really used (the sort's digits and permutation live there), so a
 * buffer freed or reused before the queued sort runs is caught like any other device buffer. */
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <cuda_runtime.h>

namespace cub {

namespace emu_detail {
enum key_kind { KEY_UNSIGNED = 0, KEY_SIGNED = 1, KEY_FLOAT = 2 };
cudaError_t radix_sort(void *d_temp_storage, size_t &temp_storage_bytes, const void *keys_in, void *keys_out, size_t key_bytes,
                       int key_kind, const void *values_in, void *values_out, size_t value_bytes, long long num_items, int begin_bit,
                       int end_bit, bool descending, cudaStream_t stream, const char *what);
template <typename K> constexpr int kind_of() {
  static_assert(std::is_arithmetic<K>::value && !std::is_same<K, bool>::value, "cub::DeviceRadixSort (emulated): arithmetic keys only");
  return std::is_floating_point<K>::value ? KEY_FLOAT : std::is_signed<K>::value ? KEY_SIGNED : KEY_UNSIGNED;
}
}  // namespace emu_detail

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in, KeyT *d_keys_out,
                               const ValueT *d_values_in, ValueT *d_values_out, NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    return emu_detail::radix_sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, sizeof(KeyT), emu_detail::kind_of<KeyT>(),
                                  d_values_in, d_values_out, sizeof(ValueT), (long long)num_items, begin_bit, end_bit, false, stream,
                                  "cub::DeviceRadixSort::SortPairs");
  }
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairsDescending(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in, KeyT *d_keys_out,
                                         const ValueT *d_values_in, ValueT *d_values_out, NumItemsT num_items, int begin_bit = 0,
                                         int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    return emu_detail::radix_sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, sizeof(KeyT), emu_detail::kind_of<KeyT>(),
                                  d_values_in, d_values_out, sizeof(ValueT), (long long)num_items, begin_bit, end_bit, true, stream,
                                  "cub::DeviceRadixSort::SortPairsDescending");
  }
  template <typename KeyT, typename NumItemsT>
  static cudaError_t SortKeys(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in, KeyT *d_keys_out,
                              NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    return emu_detail::radix_sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, sizeof(KeyT), emu_detail::kind_of<KeyT>(),
                                  nullptr, nullptr, 0, (long long)num_items, begin_bit, end_bit, false, stream,
                                  "cub::DeviceRadixSort::SortKeys");
  }
  template <typename KeyT, typename NumItemsT>
  static cudaError_t SortKeysDescending(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in, KeyT *d_keys_out,
                                        NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    return emu_detail::radix_sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, sizeof(KeyT), emu_detail::kind_of<KeyT>(),
                                  nullptr, nullptr, 0, (long long)num_items, begin_bit, end_bit, true, stream,
                                  "cub::DeviceRadixSort::SortKeysDescending");
  }
};

}  // namespace cub
