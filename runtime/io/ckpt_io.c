/* ckpt_io.c: see ckpt_io.h. POSIX file calls only; one pthread per background job. */
#define _GNU_SOURCE
#include "ckpt_io.h"
#include "core/status_internal.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { STEP_WRITE, STEP_WAIT_FILE, STEP_RENAME, STEP_PRUNE };

typedef struct step {
  int kind;
  char *path, *path2;      /* write/wait/prune: path; rename: from, to; prune: protect */
  int n;                   /* write: chunks; prune: keep */
  const void **data;
  int64_t *nbytes;
  double timeout_s;
} step;

struct sh_ckpt_job {
  step *steps;
  int n_steps, cap;
  pthread_t thread;
  int running;             /* a background thread was started and not joined */
  int ran;
  int status;
  char message[1024];
};

static char *dup_str(const char *s) {
  char *d = malloc(strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

static step *add_step(sh_ckpt_job *job) {
  if (job->n_steps == job->cap) {
    int cap = job->cap ? job->cap * 2 : 8;
    step *s = realloc(job->steps, (size_t)cap * sizeof *s);
    if (!s) return NULL;
    job->steps = s;
    job->cap = cap;
  }
  step *s = &job->steps[job->n_steps++];
  memset(s, 0, sizeof *s);
  return s;
}

int sh_ckpt_job_create(sh_ckpt_job **out) {
  if (!out) return sh_fail(SH_ERR_ARG, "ckpt job: out is NULL");
  *out = calloc(1, sizeof **out);
  return *out ? SH_OK : sh_fail(SH_ERR_OOM, "ckpt job: out of memory");
}

static int check_open(sh_ckpt_job *job, const char *what) {
  if (!job) return sh_fail(SH_ERR_ARG, "ckpt job %s: job is NULL", what);
  if (job->ran) return sh_fail(SH_ERR_ARG, "ckpt job %s: the job has already run", what);
  return SH_OK;
}

int sh_ckpt_job_write(sh_ckpt_job *job, const char *path, int n, const void *const *data, const int64_t *nbytes) {
  SH_TRY(check_open(job, "write"));
  if (!path || n < 0 || (n > 0 && (!data || !nbytes))) return sh_fail(SH_ERR_ARG, "ckpt job write: bad arguments");
  step *s = add_step(job);
  if (!s) return sh_fail(SH_ERR_OOM, "ckpt job write %s: out of memory", path);
  s->kind = STEP_WRITE;
  s->path = dup_str(path);
  s->n = n;
  s->data = malloc((size_t)(n > 0 ? n : 1) * sizeof *s->data);
  s->nbytes = malloc((size_t)(n > 0 ? n : 1) * sizeof *s->nbytes);
  if (!s->path || !s->data || !s->nbytes) return sh_fail(SH_ERR_OOM, "ckpt job write %s: out of memory", path);
  for (int i = 0; i < n; i++) {
    if (nbytes[i] < 0 || (nbytes[i] > 0 && !data[i])) return sh_fail(SH_ERR_ARG, "ckpt job write %s: chunk %d is bad", path, i);
    s->data[i] = data[i];
    s->nbytes[i] = nbytes[i];
  }
  return SH_OK;
}

int sh_ckpt_job_wait_file(sh_ckpt_job *job, const char *path, double timeout_s) {
  SH_TRY(check_open(job, "wait_file"));
  if (!path) return sh_fail(SH_ERR_ARG, "ckpt job wait_file: path is NULL");
  step *s = add_step(job);
  if (!s || !(s->path = dup_str(path))) return sh_fail(SH_ERR_OOM, "ckpt job: out of memory");
  s->kind = STEP_WAIT_FILE;
  s->timeout_s = timeout_s;
  return SH_OK;
}

int sh_ckpt_job_rename(sh_ckpt_job *job, const char *from, const char *to) {
  SH_TRY(check_open(job, "rename"));
  if (!from || !to) return sh_fail(SH_ERR_ARG, "ckpt job rename: path is NULL");
  step *s = add_step(job);
  if (!s || !(s->path = dup_str(from)) || !(s->path2 = dup_str(to))) return sh_fail(SH_ERR_OOM, "ckpt job: out of memory");
  s->kind = STEP_RENAME;
  return SH_OK;
}

int sh_ckpt_job_prune(sh_ckpt_job *job, const char *root, int keep, const char *protect) {
  SH_TRY(check_open(job, "prune"));
  if (!root) return sh_fail(SH_ERR_ARG, "ckpt job prune: root is NULL");
  step *s = add_step(job);
  if (!s || !(s->path = dup_str(root)) || !(s->path2 = dup_str(protect ? protect : ""))) return sh_fail(SH_ERR_OOM, "ckpt job: out of memory");
  s->kind = STEP_PRUNE;
  s->n = keep;
  return SH_OK;
}

/* ---- the steps ---- */

static int io_fail(sh_ckpt_job *job, const char *what, const char *path) {
  snprintf(job->message, sizeof job->message, "checkpoint: %s %s: %s", what, path, strerror(errno));
  return SH_ERR_IO;
}

static void dir_of(const char *path, char *out, size_t cap) {
  snprintf(out, cap, "%s", path);
  char *slash = strrchr(out, '/');
  if (!slash) snprintf(out, cap, ".");
  else if (slash == out) out[1] = 0;
  else *slash = 0;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

static int do_write(sh_ckpt_job *job, const step *s) {
  char tmp[PATH_MAX + 16], dir[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", s->path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_fail(job, "cannot create", tmp);
  for (int i = 0; i < s->n; i++) {
    const char *p = s->data[i];
    int64_t left = s->nbytes[i];
    while (left > 0) {
      ssize_t w = write(fd, p, left > (1 << 30) ? (1 << 30) : (size_t)left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) { int e = errno; close(fd); unlink(tmp); errno = e ? e : EIO; return io_fail(job, "cannot write", tmp); }
      p += w;
      left -= w;
    }
  }
  if (fsync(fd) != 0) { int e = errno; close(fd); unlink(tmp); errno = e; return io_fail(job, "cannot fsync", tmp); }
  if (close(fd) != 0) { unlink(tmp); return io_fail(job, "cannot close", tmp); }
  if (rename(tmp, s->path) != 0) { int e = errno; unlink(tmp); errno = e; return io_fail(job, "cannot rename to", s->path); }
  dir_of(s->path, dir, sizeof dir);
  /* Once this file is in place, rank 0 may publish (rename) a checkpoint's directory before
   * this fsync opens it: gone, it is rank 0's to fsync (do_rename), this entry included. */
  if (fsync_dir(dir) != 0 && errno != ENOENT) return io_fail(job, "cannot fsync directory", dir);
  return SH_OK;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int do_wait_file(sh_ckpt_job *job, const step *s) {
  double start = now_s();
  struct timespec nap = { 0, 1000000 };
  while (access(s->path, F_OK) != 0) {
    if (now_s() - start > s->timeout_s) {
      snprintf(job->message, sizeof job->message,
               "checkpoint: %s did not appear within %.0f s (did another rank fail to save?)", s->path, s->timeout_s);
      return SH_ERR_IO;
    }
    nanosleep(&nap, NULL);
  }
  return SH_OK;
}

static int do_rename(sh_ckpt_job *job, const step *s) {
  char dir[PATH_MAX];
  if (rename(s->path, s->path2) != 0) {
    char what[PATH_MAX + 32];
    snprintf(what, sizeof what, "cannot rename %s to", s->path);
    return io_fail(job, what, s->path2);
  }
  /* the published directory's entries (every rank's file) and its own entry in the parent */
  if (fsync_dir(s->path2) != 0) return io_fail(job, "cannot fsync directory", s->path2);
  dir_of(s->path2, dir, sizeof dir);
  if (fsync_dir(dir) != 0) return io_fail(job, "cannot fsync directory", dir);
  return SH_OK;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(path);
}

int sh_ckpt_remove_tree(const char *path) {
  if (!path) return sh_fail(SH_ERR_ARG, "checkpoint remove: path is NULL");
  if (access(path, F_OK) != 0) return SH_OK;
  if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    return sh_fail(SH_ERR_IO, "checkpoint: cannot remove %s: %s", path, strerror(errno));
  return SH_OK;
}

static int cmp_long_desc(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

static int do_prune(sh_ckpt_job *job, const step *s) {
  if (s->n <= 0) return SH_OK;
  DIR *d = opendir(s->path);
  if (!d) return io_fail(job, "cannot list", s->path);
  long *steps = NULL;
  int n = 0, cap = 0;
  struct dirent *e;
  char path[PATH_MAX];
  while ((e = readdir(d))) {
    char *end;
    if (strncmp(e->d_name, "step-", 5) == 0) {
      long v = strtol(e->d_name + 5, &end, 10);
      if (*end || end == e->d_name + 5) continue;
      if (n == cap) { cap = cap ? cap * 2 : 16; long *p = realloc(steps, cap * sizeof *p); if (!p) break; steps = p; }
      steps[n++] = v;
    } else if (strncmp(e->d_name, ".tmp-step-", 10) == 0) {
      snprintf(path, sizeof path, "%s/%s", s->path, e->d_name);
      if (sh_ckpt_remove_tree(path) != SH_OK) { snprintf(job->message, sizeof job->message, "%s", sh_last_error()); closedir(d); free(steps); return SH_ERR_IO; }
    }
  }
  closedir(d);
  qsort(steps, n, sizeof *steps, cmp_long_desc);
  for (int i = s->n; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "step-%ld", steps[i]);
    if (strcmp(name, s->path2) == 0) continue;
    snprintf(path, sizeof path, "%s/%s", s->path, name);
    if (sh_ckpt_remove_tree(path) != SH_OK) { snprintf(job->message, sizeof job->message, "%s", sh_last_error()); free(steps); return SH_ERR_IO; }
  }
  free(steps);
  return SH_OK;
}

static void *run_steps(void *arg) {
  sh_ckpt_job *job = arg;
  const char *delay = getenv("SHARD_CKPT_STEP_DELAY_MS");
  long delay_ms = delay ? strtol(delay, NULL, 10) : 0;
  job->status = SH_OK;
  for (int i = 0; i < job->n_steps && job->status == SH_OK; i++) {
    const step *s = &job->steps[i];
    if (delay_ms > 0) { struct timespec t = { delay_ms / 1000, (delay_ms % 1000) * 1000000L }; nanosleep(&t, NULL); }
    switch (s->kind) {
      case STEP_WRITE: job->status = do_write(job, s); break;
      case STEP_WAIT_FILE: job->status = do_wait_file(job, s); break;
      case STEP_RENAME: job->status = do_rename(job, s); break;
      case STEP_PRUNE: job->status = do_prune(job, s); break;
    }
  }
  return NULL;
}

int sh_ckpt_job_run(sh_ckpt_job *job, int background) {
  SH_TRY(check_open(job, "run"));
  job->ran = 1;
  if (!background) {
    run_steps(job);
    return job->status ? sh_fail(job->status, "%s", job->message) : SH_OK;
  }
  int rc = pthread_create(&job->thread, NULL, run_steps, job);
  if (rc != 0) { job->status = SH_ERR_IO; return sh_fail(SH_ERR_IO, "checkpoint: cannot start the writer thread: %s", strerror(rc)); }
  job->running = 1;
  return SH_OK;
}

int sh_ckpt_job_wait(sh_ckpt_job *job) {
  if (!job) return sh_fail(SH_ERR_ARG, "ckpt job wait: job is NULL");
  if (job->running) { pthread_join(job->thread, NULL); job->running = 0; }
  return job->status ? sh_fail(job->status, "%s", job->message) : SH_OK;
}

int sh_ckpt_job_done(sh_ckpt_job *job) {
  if (!job || !job->running) return 1;
  /* the thread sets nothing we can poll without a race but its exit: try a join */
  if (pthread_tryjoin_np(job->thread, NULL) == 0) { job->running = 0; return 1; }
  return 0;
}

void sh_ckpt_job_destroy(sh_ckpt_job *job) {
  if (!job) return;
  if (job->running) pthread_join(job->thread, NULL);
  for (int i = 0; i < job->n_steps; i++) {
    free(job->steps[i].path);
    free(job->steps[i].path2);
    free(job->steps[i].data);
    free(job->steps[i].nbytes);
  }
  free(job->steps);
  free(job);
}

/* ---- reading and directories ---- */

int sh_ckpt_mkdirs(const char *path) {
  if (!path || !*path) return sh_fail(SH_ERR_ARG, "checkpoint mkdir: empty path");
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; ; p++) {
    if (*p == '/' || *p == 0) {
      char c = *p;
      *p = 0;
      if (mkdir(buf, 0755) != 0 && errno != EEXIST) return sh_fail(SH_ERR_IO, "checkpoint: cannot create directory %s: %s", buf, strerror(errno));
      *p = c;
      if (!c) break;
    }
  }
  return SH_OK;
}

int sh_ckpt_exists(const char *path) { return path && access(path, F_OK) == 0; }
