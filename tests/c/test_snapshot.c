/* test_snapshot.c: the snapshot files of runtime/io/snapshot.h. Two slots filled in turn
 * (foreground and on the copy thread) read back byte for byte with CRC32C values computed here
 * (sh_crc32c over the chunks as written); a flipped payload byte, a flipped head byte, a head
 * cleared as by a write cut short, and a file truncated into slot 1 are each refused, naming
 * the file and slot, while the other slot stays whole; a reopen for a payload that fits keeps
 * both slots, one that does not makes the file anew; bad arguments are refused. A write's
 * ready function runs before its chunks are read (it fills them: the slot holds what it put
 * there), in the foreground and on the thread; a failing one leaves the slot empty and fails
 * the write with its message. */
#include "check.h"
#include "core/status_internal.h"
#include "io/checksum.h"
#include "io/snapshot.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { A = 10000, B = 3333 };

static char path[64];

static void fill(unsigned char *p, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) { seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17; p[i] = (unsigned char)seed; }
}

/* Writes the chunks a and b as step `step` into slot, after ready(arg) when ready is set. */
static int put_ready(sh_snap *s, int slot, int64_t step, const unsigned char *a, const unsigned char *b,
                     sh_snap_ready_fn ready, void *arg, int background) {
  sh_snap_head h;
  memset(&h, 0, sizeof h);
  h.step = step;
  h.world = 4;
  h.rank = 2;
  h.meta_bytes = B;
  strcpy(h.strategy, "full_shard");
  const void *data[2] = {a, b};
  const int64_t nbytes[2] = {A, B};
  int rc = sh_snap_write(s, slot, &h, 2, data, nbytes, ready, arg, background);
  return rc ? rc : sh_snap_wait(s);
}

static int put(sh_snap *s, int slot, int64_t step, const unsigned char *a, const unsigned char *b, int background) {
  return put_ready(s, slot, step, a, b, NULL, NULL, background);
}

/* Slot's head says step, and its payload is a then b. */
static void check_slot(sh_snap *s, int slot, int64_t step, const unsigned char *a, const unsigned char *b) {
  sh_snap_head h;
  CHECK_OK(sh_snap_verify(s, slot, &h));
  CHECK(h.step == step && h.world == 4 && h.rank == 2 && h.payload_bytes == A + B && h.meta_bytes == B &&
        strcmp(h.strategy, "full_shard") == 0, "slot %d head: step %lld world %d rank %d bytes %lld", slot,
        (long long)h.step, h.world, h.rank, (long long)h.payload_bytes);
  CHECK(h.payload_crc == sh_crc32c(sh_crc32c(0, a, A), b, B), "slot %d: payload CRC %08x", slot, h.payload_crc);
  const unsigned char *payload = (const unsigned char *)sh_snap_slot(s, slot) + 4096;
  CHECK(memcmp(payload, a, A) == 0 && memcmp(payload + A, b, B) == 0, "slot %d: payload differs from what was written", slot);
}

static void test_slots(void) {
  unsigned char a[A], b[B], c[A], d[B];
  fill(a, A, 1); fill(b, B, 2); fill(c, A, 3); fill(d, B, 4);
  sh_snap *s;
  CHECK_OK(sh_snap_open(&s, path, A + B, 0));
  CHECK(sh_snap_capacity(s) >= A + B && sh_snap_slot_bytes(s) % 4096 == 0, "capacity %lld", (long long)sh_snap_capacity(s));
  sh_snap_head h;
  CHECK_FAILS(sh_snap_verify(s, 0, &h), SH_ERR_IO, "slot 0: empty");
  CHECK_OK(put(s, 0, 7, a, b, 0));
  CHECK_OK(put(s, 1, 8, c, d, 1));
  check_slot(s, 0, 7, a, b);
  check_slot(s, 1, 8, c, d);
  sh_snap_set_progress(s, 9);
  CHECK(sh_snap_progress(s) == 9, "progress %lld", (long long)sh_snap_progress(s));
  CHECK(sh_snap_last_seconds(s) > 0 && sh_snap_last_seconds(s) < 10, "the last write took %g s", sh_snap_last_seconds(s));
  sh_snap_close(s);

  /* reopened read only, and for a payload that fits: both slots kept */
  CHECK_OK(sh_snap_open(&s, path, 0, 0));
  check_slot(s, 1, 8, c, d);
  CHECK(sh_snap_progress(s) == 9, "progress after reopen %lld", (long long)sh_snap_progress(s));
  CHECK_FAILS(put(s, 0, 9, a, b, 0), SH_ERR_ARG, "read only");
  sh_snap_close(s);
  CHECK_OK(sh_snap_open(&s, path, 100, 0));
  check_slot(s, 0, 7, a, b);
  check_slot(s, 1, 8, c, d);
  sh_snap_close(s);
}

/* Each planted fault is refused, naming the file and slot; the other slot still verifies. */
static void test_faults(void) {
  unsigned char a[A], b[B], c[A], d[B];
  fill(a, A, 1); fill(b, B, 2); fill(c, A, 3); fill(d, B, 4);
  sh_snap *s;
  sh_snap_head h;
  CHECK_OK(sh_snap_open(&s, path, A + B, 0));
  unsigned char *slot0 = sh_snap_slot(s, 0), *slot1 = sh_snap_slot(s, 1);
  slot0[4096 + 1234] ^= 0x10;   /* a payload byte */
  CHECK_FAILS(sh_snap_verify(s, 0, &h), SH_ERR_IO, "slot 0 (step 7): its payload fails its checksum");
  check_slot(s, 1, 8, c, d);
  slot0[4096 + 1234] ^= 0x10;
  slot0[12] ^= 0x01;            /* the head's step */
  CHECK_FAILS(sh_snap_verify(s, 0, &h), SH_ERR_IO, "slot 0: its head fails its checksum");
  slot0[12] ^= 0x01;
  check_slot(s, 0, 7, a, b);
  memset(slot1, 0, sizeof(sh_snap_head));   /* what a write cut short leaves */
  CHECK_FAILS(sh_snap_verify(s, 1, &h), SH_ERR_IO, "slot 1: empty");
  check_slot(s, 0, 7, a, b);
  /* a payload longer than the slot is refused before a byte is read past it */
  CHECK_OK(put(s, 1, 8, c, d, 0));
  sh_snap_head *head1 = (sh_snap_head *)slot1;
  int64_t keep = head1->payload_bytes;
  head1->payload_bytes = sh_snap_capacity(s) + 1;
  CHECK_FAILS(sh_snap_verify(s, 1, &h), SH_ERR_IO, "slot 1: its head");
  head1->payload_bytes = keep;
  int64_t cut = 4096 + sh_snap_slot_bytes(s) + 100;   /* into slot 1 */
  sh_snap_close(s);
  CHECK(truncate(path, cut) == 0, "truncate");
  CHECK_OK(sh_snap_open(&s, path, 0, 0));
  CHECK_FAILS(sh_snap_verify(s, 1, &h), SH_ERR_IO, "slot 1: the file is cut short");
  check_slot(s, 0, 7, a, b);
  sh_snap_close(s);
  CHECK(truncate(path, 100) == 0, "truncate");
  CHECK_FAILS(sh_snap_open(&s, path, 0, 0), SH_ERR_IO, "shorter than its first page");
  /* made anew when too small: both slots empty */
  CHECK_OK(sh_snap_open(&s, path, A + B, 0));
  CHECK_FAILS(sh_snap_verify(s, 0, &h), SH_ERR_IO, "empty");
  CHECK_FAILS(sh_snap_verify(s, 1, &h), SH_ERR_IO, "empty");
  sh_snap_close(s);
}

/* A device copy standing in: fills its chunk (seeded by the int it is given). */
static unsigned char staged[A];
static int stage(void *arg) { fill(staged, A, (uint64_t)*(int *)arg); return SH_OK; }
static int refuse(void *arg) { (void)arg; return sh_fail(SH_ERR_DEVICE, "the device copy failed (planted)"); }

static void test_ready(void) {
  unsigned char want[A], b[B];
  fill(b, B, 2);
  sh_snap *s;
  sh_snap_head h;
  CHECK_OK(sh_snap_remove(path));
  CHECK_OK(sh_snap_open(&s, path, A + B, 0));
  for (int background = 0; background <= 1; background++) {
    int seed = 5 + background;
    memset(staged, 0, sizeof staged);
    CHECK_OK(put_ready(s, background, 10 + background, staged, b, stage, &seed, background));
    fill(want, A, (uint64_t)seed);
    check_slot(s, background, 10 + background, want, b);
  }
  CHECK_FAILS(put_ready(s, 0, 12, staged, b, refuse, NULL, 1), SH_ERR_DEVICE, "slot 0: waiting for its chunks failed: the device copy failed (planted)");
  CHECK_FAILS(sh_snap_verify(s, 0, &h), SH_ERR_IO, "slot 0: empty");
  check_slot(s, 1, 11, want, b);
  CHECK_FAILS(put_ready(s, 0, 12, staged, b, refuse, NULL, 0), SH_ERR_DEVICE, "the device copy failed (planted)");
  CHECK_OK(put(s, 0, 13, staged, b, 1));   /* the failure is not kept */
  sh_snap_close(s);
}

static void test_errors(void) {
  unsigned char a[A], b[B];
  fill(a, A, 1); fill(b, B, 2);
  sh_snap *s;
  CHECK_FAILS(sh_snap_open(&s, "/nonexistent-dir/x.snap", 10, 0), SH_ERR_IO, "cannot open /nonexistent-dir/x.snap");
  CHECK_FAILS(sh_snap_open(&s, path, -1, 0), SH_ERR_ARG, "slot_bytes -1");
  CHECK_OK(sh_snap_remove(path));
  CHECK_OK(sh_snap_open(&s, path, 4096, 0));
  CHECK_FAILS(put(s, 0, 1, a, b, 0), SH_ERR_ARG, "do not fit a slot");
  CHECK_FAILS(put(s, 2, 1, a, b, 0), SH_ERR_ARG, "slot 2 is not 0 or 1");
  sh_snap_close(s);
  CHECK_OK(sh_snap_remove(path));
  CHECK_OK(sh_snap_remove(path));   /* absent: no error */
  CHECK(access(path, F_OK) != 0, "the file is gone");
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  snprintf(path, sizeof path, "/tmp/test_snapshot_%d.snap", (int)getpid());
  unlink(path);
  RUN(test_slots);
  RUN(test_faults);
  RUN(test_ready);
  RUN(test_errors);
  unlink(path);
  return check_summary("test_snapshot");
}
