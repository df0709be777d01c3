/* snapshot.c: see snapshot.h. A shared mapping of a /dev/shm file; one pthread per write. */
#define _GNU_SOURCE
#include "snapshot.h"
#include "checksum.h"
#include "core/status_internal.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define MAGIC "shsnap1"
#define FILE_MAGIC "shsnapf"
#define BLOCK (256 << 10)   /* copied, then checksummed while in cache */

typedef struct file_head {
  char magic[8];
  int64_t slot_bytes;       /* each slot, its head page included */
  volatile int64_t progress;
} file_head;

struct sh_snap {
  char path[512];
  int fd, writable;
  uint8_t *map;
  int64_t map_bytes, slot_bytes;
  /* the write in flight */
  pthread_t thread;
  int running;
  int slot, n;
  double seconds;           /* the last write's CPU time, start to head */
  sh_snap_ready_fn ready;   /* waited for before the chunks are read (a device copy's event) */
  void *ready_arg;
  int status;               /* the write's: SH_OK, or ready's failure (message in error) */
  int done;                 /* set by the write as it ends */
  char error[512];
  const void **data;
  int64_t *nbytes;
  sh_snap_head head;
};

static file_head *fhead(const sh_snap *s) { return (file_head *)s->map; }

static uint8_t *slot_at(const sh_snap *s, int slot) { return s->map + PAGE + (int64_t)slot * s->slot_bytes; }

/* Whether the file holds all of slot (a truncated one may not: reading past its end would fault). */
static int slot_in_file(const sh_snap *s, int slot) { return PAGE + (int64_t)(slot + 1) * s->slot_bytes <= s->map_bytes; }

static uint32_t head_crc(const sh_snap_head *h) { return sh_crc32c(0, h, offsetof(sh_snap_head, head_crc)); }

static int64_t round_page(int64_t n) { return (n + PAGE - 1) / PAGE * PAGE; }

static int map_file(sh_snap *s, int64_t bytes) {
  s->map = mmap(NULL, (size_t)bytes, PROT_READ | (s->writable ? PROT_WRITE : 0), MAP_SHARED, s->fd, 0);
  if (s->map == MAP_FAILED) { s->map = NULL; return sh_fail(SH_ERR_IO, "snapshot: cannot map %s: %s", s->path, strerror(errno)); }
  s->map_bytes = bytes;
  return SH_OK;
}

/* A new or resized file: its first page says how big a slot is; both slots cleared. */
static int make_file(sh_snap *s, int64_t slot_bytes) {
  int64_t bytes = PAGE + 2 * slot_bytes;
  if (ftruncate(s->fd, 0) != 0 || ftruncate(s->fd, bytes) != 0) {
    return sh_fail(SH_ERR_IO, "snapshot: cannot size %s to %lld bytes: %s", s->path, (long long)bytes, strerror(errno));
  }
  SH_TRY(map_file(s, bytes));
  file_head *f = fhead(s);
  f->slot_bytes = slot_bytes;
  f->progress = -1;
  memcpy(f->magic, FILE_MAGIC, sizeof f->magic);
  s->slot_bytes = slot_bytes;
  return SH_OK;
}

/* An existing file's layout, checked against its size. */
static int read_layout(sh_snap *s, int64_t size) {
  if (size < PAGE) return sh_fail(SH_ERR_IO, "snapshot: %s is %lld bytes, shorter than its first page", s->path, (long long)size);
  SH_TRY(map_file(s, size));
  const file_head *f = fhead(s);
  if (memcmp(f->magic, FILE_MAGIC, sizeof f->magic) != 0) return sh_fail(SH_ERR_IO, "snapshot: %s is not a shard snapshot file", s->path);
  if (f->slot_bytes < PAGE || f->slot_bytes % PAGE != 0) {
    return sh_fail(SH_ERR_IO, "snapshot: %s says its slots are %lld bytes, not whole pages", s->path, (long long)f->slot_bytes);
  }
  s->slot_bytes = f->slot_bytes;
  return SH_OK;
}

int sh_snap_open(sh_snap **out, const char *path, int64_t slot_bytes, int writable) {
  if (!out || !path) return sh_fail(SH_ERR_ARG, "snapshot open: out or path is NULL");
  *out = NULL;
  if (slot_bytes < 0) return sh_fail(SH_ERR_ARG, "snapshot open %s: slot_bytes %lld < 0", path, (long long)slot_bytes);
  sh_snap *s = calloc(1, sizeof *s);
  if (!s) return sh_fail(SH_ERR_OOM, "snapshot open %s: out of memory", path);
  snprintf(s->path, sizeof s->path, "%s", path);
  s->writable = slot_bytes > 0 || writable;
  s->fd = open(path, s->writable ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0600);
  if (s->fd < 0) {
    int rc = sh_fail(SH_ERR_IO, "snapshot: cannot open %s: %s", path, strerror(errno));
    free(s);
    return rc;
  }
  struct stat st;
  int rc = fstat(s->fd, &st) != 0 ? sh_fail(SH_ERR_IO, "snapshot: cannot stat %s: %s", path, strerror(errno)) : SH_OK;
  if (rc == SH_OK && slot_bytes > 0) {
    int64_t want = PAGE + round_page(slot_bytes);
    rc = st.st_size >= PAGE ? read_layout(s, st.st_size) : SH_ERR_IO;
    /* a file already big enough keeps its layout and both slots (a restarted job's newest) */
    if (rc != SH_OK || s->slot_bytes < want || st.st_size < PAGE + 2 * s->slot_bytes) {
      if (s->map) munmap(s->map, (size_t)s->map_bytes);
      s->map = NULL;
      sh_clear_error();
      rc = make_file(s, want);
    }
  } else if (rc == SH_OK) {
    rc = read_layout(s, st.st_size);
  }
  if (rc != SH_OK) {
    if (s->map) munmap(s->map, (size_t)s->map_bytes);
    close(s->fd);
    free(s);
    return rc;
  }
  *out = s;
  return SH_OK;
}

void sh_snap_close(sh_snap *s) {
  if (!s) return;
  sh_snap_wait(s);
  free(s->data);
  free(s->nbytes);
  if (s->map) munmap(s->map, (size_t)s->map_bytes);
  close(s->fd);
  free(s);
}

int64_t sh_snap_capacity(const sh_snap *s) { return s ? s->slot_bytes - PAGE : 0; }
void *sh_snap_slot(sh_snap *s, int slot) { return s && (slot == 0 || slot == 1) && slot_in_file(s, slot) ? slot_at(s, slot) : NULL; }
int64_t sh_snap_slot_bytes(const sh_snap *s) { return s ? s->slot_bytes : 0; }

/* The copy thread's own CPU time: what a copy takes from training on a busy machine, where
 * its wall time would count the time it waited for a core. */
static double cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void pause_ms(long ms) {
  struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
  nanosleep(&t, NULL);
}

/* The chunks into the slot's payload, checksummed block by block while in cache; the head last. */
static void copy_chunks(sh_snap *s, sh_snap_head *h) {
  uint8_t *dst = (uint8_t *)h + PAGE;
  uint32_t crc = 0;
  int64_t done = 0;
  for (int i = 0; i < s->n; i++) {
    const uint8_t *src = s->data[i];
    for (int64_t off = 0; off < s->nbytes[i]; off += BLOCK) {
      int64_t len = s->nbytes[i] - off < BLOCK ? s->nbytes[i] - off : BLOCK;
      memcpy(dst + done, src + off, (size_t)len);
      crc = sh_crc32c(crc, dst + done, (size_t)len);
      done += len;
    }
  }
  s->head.payload_crc = crc;
  memcpy(s->head.magic, MAGIC, sizeof s->head.magic);
  s->head.head_crc = head_crc(&s->head);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  memcpy(h, &s->head, sizeof *h);
}

/* The write: clear the head, wait for the chunks to be ready, copy and checksum them, then
 * the head. A failed wait leaves the slot empty and its message for sh_snap_wait. */
static void *run_write(void *arg) {
  sh_snap *s = arg;
  double t0 = cpu_s();
  const char *delay = getenv("SHARD_SNAPSHOT_COPY_DELAY_MS");
  sh_snap_head *h = (sh_snap_head *)slot_at(s, s->slot);
  memset(h, 0, sizeof *h);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (delay) pause_ms(strtol(delay, NULL, 10));
  if (s->ready && (s->status = s->ready(s->ready_arg)) != SH_OK) {
    snprintf(s->error, sizeof s->error, "%s", sh_last_error());
  } else {
    copy_chunks(s, h);
  }
  s->seconds = cpu_s() - t0;
  __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* The finished write's status, its message now this thread's (the write may have run on the
 * copy thread). */
static int finish_write(sh_snap *s) {
  int rc = s->status;
  s->status = SH_OK;
  return rc == SH_OK ? SH_OK : sh_fail(rc, "snapshot write %s slot %d: waiting for its chunks failed: %s", s->path, s->slot, s->error);
}

int sh_snap_write(sh_snap *s, int slot, const sh_snap_head *head, int n, const void *const *data,
                  const int64_t *nbytes, sh_snap_ready_fn ready, void *ready_arg, int background) {
  if (!s || !head || n < 0 || (n > 0 && (!data || !nbytes))) return sh_fail(SH_ERR_ARG, "snapshot write: bad arguments");
  if (slot != 0 && slot != 1) return sh_fail(SH_ERR_ARG, "snapshot write %s: slot %d is not 0 or 1", s->path, slot);
  if (!s->writable) return sh_fail(SH_ERR_ARG, "snapshot write %s: opened read only", s->path);
  if (s->running) return sh_fail(SH_ERR_ARG, "snapshot write %s: a write is still in flight (sh_snap_wait first)", s->path);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (nbytes[i] < 0 || (nbytes[i] > 0 && !data[i])) return sh_fail(SH_ERR_ARG, "snapshot write %s: chunk %d is bad", s->path, i);
    total += nbytes[i];
  }
  if (total > sh_snap_capacity(s)) {
    return sh_fail(SH_ERR_ARG, "snapshot write %s: %lld bytes do not fit a slot of %lld", s->path, (long long)total, (long long)sh_snap_capacity(s));
  }
  if (head->meta_bytes < 0 || head->meta_bytes > total) return sh_fail(SH_ERR_ARG, "snapshot write %s: meta_bytes %lld of %lld", s->path, (long long)head->meta_bytes, (long long)total);
  const void **d = realloc(s->data, (size_t)(n + 1) * sizeof *d);
  if (d) s->data = d;
  int64_t *b = d ? realloc(s->nbytes, (size_t)(n + 1) * sizeof *b) : NULL;
  if (!b) return sh_fail(SH_ERR_OOM, "snapshot write %s: out of memory", s->path);
  s->nbytes = b;
  for (int i = 0; i < n; i++) { s->data[i] = data[i]; s->nbytes[i] = nbytes[i]; }
  s->n = n;
  s->slot = slot;
  s->head = *head;
  s->head.payload_bytes = total;
  s->ready = ready;
  s->ready_arg = ready_arg;
  s->status = SH_OK;
  s->done = 0;
  if (!background) { run_write(s); return finish_write(s); }
  int rc = pthread_create(&s->thread, NULL, run_write, s);
  if (rc != 0) return sh_fail(SH_ERR_IO, "snapshot write %s: cannot start the copy thread: %s", s->path, strerror(rc));
  s->running = 1;
  return SH_OK;
}

int sh_snap_wait(sh_snap *s) {
  if (!s) return sh_fail(SH_ERR_ARG, "snapshot wait: NULL");
  if (!s->running) return SH_OK;
  pthread_join(s->thread, NULL);
  s->running = 0;
  return finish_write(s);
}

double sh_snap_last_seconds(const sh_snap *s) { return s ? s->seconds : 0; }

int sh_snap_busy(sh_snap *s) {
  if (!s || !s->running) return 0;
  return __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) ? 0 : 1;
}

void sh_snap_set_progress(sh_snap *s, int64_t step) { if (s && s->writable) fhead(s)->progress = step; }
int64_t sh_snap_progress(const sh_snap *s) { return s ? fhead(s)->progress : -1; }

int sh_snap_verify(const sh_snap *s, int slot, sh_snap_head *out) {
  if (!s || !out || (slot != 0 && slot != 1)) return sh_fail(SH_ERR_ARG, "snapshot verify: bad arguments");
  if (!slot_in_file(s, slot)) {
    return sh_fail(SH_ERR_IO, "snapshot %s slot %d: the file is cut short (%lld bytes)", s->path, slot, (long long)s->map_bytes);
  }
  const uint8_t *at = slot_at(s, slot);
  sh_snap_head h;
  memcpy(&h, at, sizeof h);
  if (memcmp(h.magic, MAGIC, sizeof h.magic) != 0) return sh_fail(SH_ERR_IO, "snapshot %s slot %d: empty (never written, or a write was cut short)", s->path, slot);
  if (h.head_crc != head_crc(&h)) return sh_fail(SH_ERR_IO, "snapshot %s slot %d: its head fails its checksum", s->path, slot);
  if (h.payload_bytes < 0 || h.payload_bytes > sh_snap_capacity(s) || h.meta_bytes < 0 || h.meta_bytes > h.payload_bytes) {
    return sh_fail(SH_ERR_IO, "snapshot %s slot %d: its head says %lld payload bytes, the slot holds %lld", s->path, slot,
                   (long long)h.payload_bytes, (long long)sh_snap_capacity(s));
  }
  uint32_t crc = sh_crc32c(0, at + PAGE, (size_t)h.payload_bytes);
  if (crc != h.payload_crc) {
    return sh_fail(SH_ERR_IO, "snapshot %s slot %d (step %lld): its payload fails its checksum (CRC32C %08x, the head says %08x)",
                   s->path, slot, (long long)h.step, crc, h.payload_crc);
  }
  *out = h;
  return SH_OK;
}

int sh_snap_remove(const char *path) {
  if (!path) return sh_fail(SH_ERR_ARG, "snapshot remove: path is NULL");
  if (unlink(path) != 0 && errno != ENOENT) return sh_fail(SH_ERR_IO, "snapshot: cannot remove %s: %s", path, strerror(errno));
  return SH_OK;
}
