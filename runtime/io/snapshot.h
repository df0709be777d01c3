/* snapshot.h: the files of in-memory training snapshots (shard.snapshot): one file per rank in
 * /dev/shm (host memory that outlives the process), mapped, holding two slots that the
 * snapshots fill in turn, so that a process killed while writing one leaves the other whole.
 *
 *   file:  [ page 0: sh_snap_file_head | slot 0 | slot 1 ]
 *   slot:  [ one page: sh_snap_head | payload: the chunks, back to back ]
 *
 * A write (sh_snap_write) clears the slot's head, copies the chunks into the payload and takes
 * their CRC32C (checksum.h) block by block while each is in cache, then writes the head (with
 * the payload's CRC32C and its own) last: on a background thread when asked, so that training
 * goes on meanwhile; the caller keeps the chunks alive and unchanged until sh_snap_wait.
 * sh_snap_verify accepts a slot only when its head and its payload match their checksums, so
 * a slot cut short by a kill, a flipped byte or a truncated file is refused, naming the file.
 * A slot is also what the buddy copies move whole (shard.snapshot's replicas): its head
 * travels with it and is checked the same way where it lands.
 *
 * A write may first wait for its chunks to be ready (a `ready` function, called on the copy
 * thread: shard.snapshot passes the event of its device-to-host copies on the GPU, so the
 * chunks are its pinned staging and the host never waits for the device on the step's path).
 *
 * Test knob: SHARD_SNAPSHOT_COPY_DELAY_MS=N sleeps N ms in every write once its head is cleared,
 * before it waits for its chunks and copies them, so that a SIGKILL sent at a random moment
 * lands inside one (tests/spec/snapshot_spec.lua), and the next step's work is queued before a
 * device copy runs (tests/gpu/snapshot_restore.lua). */
#pragma once
#include <stdint.h>

typedef struct sh_snap sh_snap;

typedef struct sh_snap_head {
  char magic[8];            /* "shsnap1": a head written whole; anything else: no snapshot */
  int64_t step;             /* the training steps completed in the state it holds */
  int32_t world, rank;      /* the layout of the rank that took it */
  char strategy[32];        /* its FSDP strategy, for people */
  int64_t payload_bytes;    /* bytes of the payload */
  int64_t meta_bytes;       /* the payload's last meta_bytes: its JSON description */
  uint32_t payload_crc;     /* CRC32C of the payload */
  uint32_t head_crc;        /* CRC32C of this struct before this field */
} sh_snap_head;

/* Opens the snapshot file at path, mapped. slot_bytes > 0: for two slots whose payloads hold
 * at least slot_bytes: an existing file that does keeps its slots, else it is made anew
 * (both slots empty); 0: an existing file as it is (read only unless writable). */
int sh_snap_open(sh_snap **out, const char *path, int64_t slot_bytes, int writable);
/* Waits for a write in flight, unmaps and closes. */
void sh_snap_close(sh_snap *s);
/* Bytes a slot's payload can hold. */
int64_t sh_snap_capacity(const sh_snap *s);
/* The slot (its head page, then its payload): what a buddy copy moves, sh_snap_slot_bytes long. */
void *sh_snap_slot(sh_snap *s, int slot);
int64_t sh_snap_slot_bytes(const sh_snap *s);
/* What a write waits for before it reads its chunks: SH_OK once they hold what to write. */
typedef int (*sh_snap_ready_fn)(void *arg);
/* Fills slot with the n chunks and then head (its magic, crcs and payload_bytes are set
 * here), after ready(ready_arg) when ready is not NULL; on a thread when background != 0.
 * Fails at once if a write is in flight or the chunks do not fit; a failed ready leaves the
 * slot empty and fails the write (at sh_snap_wait when in the background). */
int sh_snap_write(sh_snap *s, int slot, const sh_snap_head *head, int n, const void *const *data,
                  const int64_t *nbytes, sh_snap_ready_fn ready, void *ready_arg, int background);
/* Waits for the write in flight (none: SH_OK); its status. */
int sh_snap_wait(sh_snap *s);
/* 1 while a background write runs (its status comes with sh_snap_wait). */
int sh_snap_busy(sh_snap *s);
/* CPU seconds the last finished write took, from clearing the head to writing it. */
double sh_snap_last_seconds(const sh_snap *s);
/* The newest step this rank finished, kept in the file's first page (one store per step):
 * how many steps a restart from a snapshot recomputes. */
void sh_snap_set_progress(sh_snap *s, int64_t step);
int64_t sh_snap_progress(const sh_snap *s);
/* Checks slot's head (magic, checksum, sizes) and its payload's checksum; copies the head to
 * *out when both hold, else fails naming the file, the slot and what is wrong. */
int sh_snap_verify(const sh_snap *s, int slot, sh_snap_head *out);
/* Removes the file at path (no error when it is absent). */
int sh_snap_remove(const char *path);
