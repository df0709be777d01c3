/* test_checksum.c: CRC32C (runtime/io/checksum.h) against published vectors (the check value of
 * "123456789" from the CRC catalogue, RFC 3720 appendix B.4's five iSCSI vectors), in every
 * kernel set this CPU runs (the crc32-instruction build and the portable one); then, only in
 * addition to the vectors, the two builds against each other on lengths and alignments around
 * the interleaved loop's block sizes, chaining, and sh_crc32c_st_read on partial ranges. */
#include "check_cpu.h"
#include "io/checksum.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "core/tensor.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_vectors(void) {
  unsigned char zeros[32] = {0}, ones[32], up[32], down[32];
  for (int i = 0; i < 32; i++) { ones[i] = 0xff; up[i] = (unsigned char)i; down[i] = (unsigned char)(31 - i); }
  static const unsigned char pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                        0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
  for (int s = 0; s < check_sets(); s++) {
    const char *set = check_use_set(s);
    CHECK(sh_crc32c(0, "123456789", 9) == 0xE3069283u, "[%s] check value %08x", set, sh_crc32c(0, "123456789", 9));
    CHECK(sh_crc32c(0, zeros, 32) == 0x8A9136AAu, "[%s] 32 zeros: %08x", set, sh_crc32c(0, zeros, 32));
    CHECK(sh_crc32c(0, ones, 32) == 0x62A8AB43u, "[%s] 32 0xff: %08x", set, sh_crc32c(0, ones, 32));
    CHECK(sh_crc32c(0, up, 32) == 0x46DD794Eu, "[%s] 0..31: %08x", set, sh_crc32c(0, up, 32));
    CHECK(sh_crc32c(0, down, 32) == 0x113FDB5Cu, "[%s] 31..0: %08x", set, sh_crc32c(0, down, 32));
    CHECK(sh_crc32c(0, pdu, 48) == 0xD9963A56u, "[%s] iSCSI read PDU: %08x", set, sh_crc32c(0, pdu, 48));
    CHECK(sh_crc32c(0, "", 0) == 0, "[%s] empty: %08x", set, sh_crc32c(0, "", 0));
  }
  check_use_set(0);
}

/* The two builds agree on every length up to past two interleaved rounds (3 x 4096 bytes
 * each), at every alignment mod 8, and a CRC continued over two parts equals one over both. */
static void test_builds_agree(void) {
  enum { N = 2 * 3 * 4096 + 40 };
  unsigned char *buf = malloc(N + 8);
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < N + 8; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; buf[i] = (unsigned char)x; }
  static const int lens[] = {0, 1, 7, 8, 9, 63, 4095, 4096, 12287, 12288, 12289, 12296, 24575, 24576, 24583, N};
  int sets = check_sets(), bad = 0;
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int off = 0; off < 8; off++) {
      uint32_t got[2] = {0, 0};
      for (int s = 0; s < sets; s++) {
        check_use_set(s);
        got[s] = sh_crc32c(0, buf + off, (size_t)lens[li]);
        size_t half = (size_t)lens[li] / 3;
        uint32_t chained = sh_crc32c(sh_crc32c(0, buf + off, half), buf + off + half, (size_t)lens[li] - half);
        if (chained != got[s]) bad++;
      }
      if (sets == 2 && got[0] != got[1]) bad++;
    }
  check_use_set(0);
  CHECK(bad == 0, "%d length/alignment cases differ between builds or when chained", bad);
  free(buf);
}

/* A read of part of a tensor still checksums all of it; a byte changed outside the range
 * changes the checksum, the bytes read are the file's. */
static void test_st_read(void) {
  char dir[] = "/tmp/shard_test_checksum_XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char path[256];
  snprintf(path, sizeof path, "%s/a.safetensors", dir);
  enum { N = 300000 };   /* 1.2 MB of f32: several chunks of 256 KiB on either side of a range */
  int64_t shape[1] = {N};
  sh_tensor *t = NULL, *part = NULL;
  CHECK_OK(sh_tensor_empty(&t, 1, shape, SH_F32, -1));
  float *v = sh_tensor_data(t);
  for (int i = 0; i < N; i++) v[i] = (float)i * 0.5f;
  const char *names[1] = {"w"};
  sh_tensor *ts[1] = {t};
  CHECK_OK(sh_st_save(path, 1, names, ts, 0, NULL, NULL));
  uint32_t whole = sh_crc32c(0, v, sizeof(float) * N);
  int64_t ranges[][2] = {{0, N}, {0, 10}, {N - 10, 10}, {123456, 100000}, {5, 0}};
  for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
    int64_t first = ranges[r][0], count = ranges[r][1], pshape[1] = {count};
    CHECK_OK(sh_tensor_empty(&part, 1, pshape, SH_F32, -1));
    sh_st_file *f = NULL;
    uint32_t crc = 0;
    CHECK_OK(sh_st_open(&f, path));
    CHECK_OK(sh_crc32c_st_read(f, 0, first, count, sh_tensor_data(part), &crc));
    CHECK(crc == whole, "range [%lld, +%lld): crc %08x, whole tensor %08x", (long long)first, (long long)count, crc, whole);
    CHECK(count == 0 || memcmp(sh_tensor_data(part), v + first, sizeof(float) * count) == 0, "range %zu: bytes differ", r);
    sh_st_close(f);
    sh_tensor_destroy(part);
  }
  /* flip a byte in the tensor's last element: a read of its first 10 elements sees it */
  FILE *fp = fopen(path, "r+b");
  fseek(fp, -1, SEEK_END);
  int c = fgetc(fp);
  fseek(fp, -1, SEEK_END);
  fputc(c ^ 0x10, fp);
  fclose(fp);
  sh_st_file *f = NULL;
  uint32_t crc = 0;
  int64_t pshape[1] = {10};
  CHECK_OK(sh_tensor_empty(&part, 1, pshape, SH_F32, -1));
  CHECK_OK(sh_st_open(&f, path));
  CHECK_OK(sh_crc32c_st_read(f, 0, 0, 10, sh_tensor_data(part), &crc));
  CHECK(crc != whole, "a flipped byte outside the range read left the checksum %08x", crc);
  /* a range past the tensor, or another tensor number, is refused as sh_st_read_bytes does */
  CHECK_FAILS(sh_crc32c_st_read(f, 0, N - 5, 10, sh_tensor_data(part), &crc), SH_ERR_ARG, "a.safetensors: tensor 'w'");
  CHECK_FAILS(sh_crc32c_st_read(f, 1, 0, 10, sh_tensor_data(part), &crc), SH_ERR_ARG, "no tensor number 1");
  sh_st_close(f);
  sh_tensor_destroy(part);
  sh_tensor_destroy(t);
  unlink(path);
  rmdir(dir);
}

/* SHA-256: FIPS 180-4's examples (one block, two blocks, a million 'a's fed in uneven pieces)
 * and every split of a 200-byte message fed in two updates. */
static void sha_hex(const void *data, size_t n, char out[65]) {
  sh_sha256 s;
  uint8_t d[32];
  sh_sha256_init(&s);
  sh_sha256_update(&s, data, n);
  sh_sha256_final(&s, d);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void test_sha256(void) {
  char hex[65];
  sha_hex("", 0, hex);
  CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0, "sha256('') = %s", hex);
  sha_hex("abc", 3, hex);
  CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0, "sha256(abc) = %s", hex);
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  sha_hex(two, strlen(two), hex);
  CHECK(strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") == 0, "sha256(two blocks) = %s", hex);
  static char a[1000000];
  memset(a, 'a', sizeof a);
  sh_sha256 s;
  uint8_t d[32];
  sh_sha256_init(&s);
  for (size_t off = 0, step = 1; off < sizeof a; off += step, step = step * 7 % 1013 + 1)
    sh_sha256_update(&s, a + off, off + step > sizeof a ? sizeof a - off : step);
  sh_sha256_final(&s, d);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
  CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0, "sha256(a x 1e6) = %s", hex);
  char msg[200], whole[65];
  for (int i = 0; i < 200; i++) msg[i] = (char)(i * 37 + 11);
  sha_hex(msg, sizeof msg, whole);
  int bad = 0;
  for (size_t cut = 0; cut <= sizeof msg; cut++) {
    sh_sha256_init(&s);
    sh_sha256_update(&s, msg, cut);
    sh_sha256_update(&s, msg + cut, sizeof msg - cut);
    sh_sha256_final(&s, d);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    bad += strcmp(hex, whole) != 0;
  }
  CHECK(bad == 0, "sha256 of a message fed in two pieces differs at %d cuts", bad);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_vectors);
  RUN(test_builds_agree);
  RUN(test_st_read);
  RUN(test_sha256);
  return check_summary("test_checksum");
}
