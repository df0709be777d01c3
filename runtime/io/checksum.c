/* checksum.c: CRC32C (checksum.h). Both builds work on the raw CRC register (the value
 * between the initial and the final inversion), which is linear over GF(2): the register
 * after A followed by B is shift(reg after A, |B|) ^ (the register of B started from 0), where
 * shift multiplies by x^(8|B|) modulo the polynomial. The hardware build uses that to run
 * three independent crc32 chains (the instruction's latency is 3 cycles, its throughput 1). */
#include "checksum.h"
#include "cpu/cpu_internal.h"
#include "core/status_internal.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define POLY 0x82F63B78u   /* 0x1EDC6F41 bit-reversed */
#define BLOCK 4096         /* bytes per chain in the hardware build's interleaved loop */

static uint32_t table[8][256];   /* slicing-by-8: table[k][b] is b's register after k more zero bytes */
static uint32_t shift_1, shift_2;  /* x^(8 BLOCK) and x^(16 BLOCK) mod the polynomial */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* a * b modulo the polynomial, both in the reflected representation (x^0 is bit 31). */
static uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (uint32_t m = 1u << 31; m; m >>= 1) {
    if (a & m) p ^= b;
    b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
  }
  return p;
}

/* x^n modulo the polynomial, by squaring. */
static uint32_t xpow(uint64_t n) {
  uint32_t r = 1u << 31, sq = 1u << 30;
  for (; n; n >>= 1) {
    if (n & 1) r = multmodp(sq, r);
    sq = multmodp(sq, sq);
  }
  return r;
}

static void init(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    table[0][b] = c;
  }
  for (int k = 1; k < 8; k++)
    for (int b = 0; b < 256; b++) table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xff];
  shift_1 = xpow(8ull * BLOCK);
  shift_2 = xpow(16ull * BLOCK);
}

/* 8 bytes as a little-endian word on any CPU (one load on x86-64). */
static inline uint64_t load_le64(const unsigned char *p) {
  return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 |
         (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

static uint32_t crc_portable(uint32_t crc, const unsigned char *p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w = load_le64(p) ^ crc;
    crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^ table[4][(w >> 24) & 0xff] ^
          table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
  }
  for (; n; p++, n--) crc = table[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c0 = crc;
  for (; n >= 3 * BLOCK; p += 3 * BLOCK, n -= 3 * BLOCK) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t k = 0; k < BLOCK; k += 8) {
      c0 = _mm_crc32_u64(c0, load_le64(p + k));
      c1 = _mm_crc32_u64(c1, load_le64(p + BLOCK + k));
      c2 = _mm_crc32_u64(c2, load_le64(p + 2 * BLOCK + k));
    }
    c0 = multmodp(shift_2, (uint32_t)c0) ^ multmodp(shift_1, (uint32_t)c1) ^ (uint32_t)c2;
  }
  for (; n >= 8; p += 8, n -= 8) c0 = _mm_crc32_u64(c0, load_le64(p));
  uint32_t c = (uint32_t)c0;
  for (; n; p++, n--) c = _mm_crc32_u8(c, *p);
  return c;
}
#define HAVE_HW 1
#endif

uint32_t sh_crc32c(uint32_t crc, const void *data, size_t n) {
  pthread_once(&once, init);
  const unsigned char *p = data;
#ifdef HAVE_HW
  if (sh_cpu_isa_fast() >= SH_CPU_AVX2) return ~crc_hw(~crc, p, n);
#endif
  return ~crc_portable(~crc, p, n);
}

/* ---------------------------------------------------------------- files */

#define CHUNK (256 << 10)   /* bytes per pread: checksummed while they are still in L2 */

/* Reads elements [from, to) of tensor i into dst (or, when dst is NULL, through a buffer that
 * is dropped) a chunk at a time, folding each chunk into *crc. */
static int crc_elements(const sh_st_file *f, int i, int64_t from, int64_t to, unsigned char *dst, uint32_t *crc) {
  if (from >= to) return SH_OK;
  int64_t esize = sh_st_at(f, i)->elem_size, per = CHUNK / esize;
  unsigned char *buf = dst ? NULL : malloc((size_t)(per * esize));
  if (!dst && !buf) return sh_fail(SH_ERR_OOM, "checksum: cannot allocate a %d-byte read buffer", CHUNK);
  int rc = SH_OK;
  for (int64_t e = from; e < to && rc == SH_OK; e += per) {
    int64_t n = to - e < per ? to - e : per;
    unsigned char *into = dst ? dst + (e - from) * esize : buf;
    rc = sh_st_read_bytes(f, i, e, n, into);
    if (rc == SH_OK) *crc = sh_crc32c(*crc, into, (size_t)(n * esize));
  }
  free(buf);
  return rc;
}

int sh_crc32c_st_read(const struct sh_st_file *f, int i, int64_t first, int64_t count, void *dst, uint32_t *crc) {
  const sh_st_tensor *t = f && i >= 0 && i < sh_st_count(f) ? sh_st_at(f, i) : NULL;
  if (!t || first < 0 || count < 0 || first > t->numel || count > t->numel - first || (count > 0 && !dst))
    return sh_st_read_bytes(f, i, first, count, dst);   /* its message for a bad file, tensor or range */
  uint32_t c = 0;
  SH_TRY(crc_elements(f, i, 0, first, NULL, &c));
  SH_TRY(crc_elements(f, i, first, first + count, dst, &c));
  SH_TRY(crc_elements(f, i, first + count, t->numel, NULL, &c));
  *crc = c;
  return SH_OK;
}

/* ---- SHA-256 (FIPS 180-4, section 6.2) ------------------------------------------------- */

static const uint32_t SHA_K[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + SHA_K[i] + w[i];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void sh_sha256_init(sh_sha256 *s) {
  static const uint32_t H0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
  memcpy(s->h, H0, sizeof H0);
  s->bytes = 0;
}

void sh_sha256_update(sh_sha256 *s, const void *data, size_t n) {
  const uint8_t *p = data;
  size_t have = s->bytes % 64;
  s->bytes += n;
  if (have) {
    size_t take = n < 64 - have ? n : 64 - have;
    memcpy(s->buf + have, p, take);
    p += take; n -= take;
    if (have + take < 64) return;
    sha_block(s->h, s->buf);
  }
  for (; n >= 64; p += 64, n -= 64) sha_block(s->h, p);
  memcpy(s->buf, p, n);
}

void sh_sha256_final(sh_sha256 *s, uint8_t digest[32]) {
  uint64_t bits = s->bytes * 8;
  size_t have = s->bytes % 64;
  s->buf[have++] = 0x80;
  if (have > 56) { memset(s->buf + have, 0, 64 - have); sha_block(s->h, s->buf); have = 0; }
  memset(s->buf + have, 0, 56 - have);
  for (int i = 0; i < 8; i++) s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
  sha_block(s->h, s->buf);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) digest[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}
