/* checksum.h: CRC32C (Castagnoli: polynomial 0x1EDC6F41, reflected, initial value and final
 * xor 0xFFFFFFFF; the checksum of iSCSI, ext4 and SSE4.2's crc32 instruction), which shard's
 * checkpoints keep for every tensor they write (shard.checkpoint's index.json, shard.save's
 * safetensors __metadata__) and verify on load.
 * Two builds, one result: the crc32 instruction over three interleaved streams (the avx2 kernel
 * sets and above: every such CPU has SSE4.2) and a portable slicing-by-8 table loop (the generic
 * set, the x86-64 baseline, and other CPUs); the kernel set in use (cpu.h) picks. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "safetensors.h"

/* The CRC32C of n bytes, continuing from crc: sh_crc32c(0, ...) starts one, and
 * sh_crc32c(sh_crc32c(0, a, na), b, nb) is the CRC32C of a followed by b. */
uint32_t sh_crc32c(uint32_t crc, const void *data, size_t n);

/* SHA-256 (FIPS 180-4), streamed: init, update with any pieces, final writes the 32-byte
 * digest. FSDP's deterministic mode prints one of the gathered parameters (params_sha256) so
 * that two runs can be compared by one line. */
typedef struct sh_sha256 { uint32_t h[8]; uint64_t bytes; uint8_t buf[64]; } sh_sha256;
void sh_sha256_init(sh_sha256 *s);
void sh_sha256_update(sh_sha256 *s, const void *data, size_t n);
void sh_sha256_final(sh_sha256 *s, uint8_t digest[32]);

/* Copies elements [first, first + count) of tensor i of f into dst (count * elem_size bytes),
 * as sh_st_read_bytes does (same errors), and sets *crc to the CRC32C of all of the tensor's
 * bytes in the file: the bytes outside the range pass through a small buffer and are
 * dropped, so that a slice is checked against its whole tensor's checksum. Each chunk read is
 * checksummed while it is in cache. (struct: Lua reads this header before safetensors.h.) */
int sh_crc32c_st_read(const struct sh_st_file *f, int i, int64_t first, int64_t count, void *dst, uint32_t *crc);
