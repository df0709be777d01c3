/* ckpt_io.h: the durable file operations of a checkpoint save (shard.checkpoint), run in
 * order either here or on a background thread, so a save can go on while training does.
 *
 * A job is a list of steps built up front, then run once:
 *   write        path.tmp gets the chunks in order, is fsynced, renamed to path, and path's
 *                directory is fsynced: a reader sees the whole file or none of it
 *   wait_file    polls until path exists (another rank's finished file), or fails after
 *                timeout_s: the rank that commits waits for the others without a collective,
 *                so the commit can run on the background thread too
 *   rename       rename(from, to), then fsync to's directory
 *   prune        removes step-N directories of root beyond the newest `keep` (never `protect`)
 *                and leftover .tmp-step-* directories (keep <= 0: nothing)
 * Chunks are not copied: the caller keeps them alive until sh_ckpt_job_wait returns (the Lua
 * side holds the host tensors and strings). The first failing step ends the job; its message
 * (file name and errno text) is what sh_ckpt_job_wait reports through sh_last_error.
 *
 * Test knob: SHARD_CKPT_STEP_DELAY_MS=N sleeps N ms before every step, so a SIGKILL sent at a
 * random moment lands between any two steps of a save (tests/ckpt_kill.sh). */
#pragma once
#include <stdint.h>

typedef struct sh_ckpt_job sh_ckpt_job;

int sh_ckpt_job_create(sh_ckpt_job **out);
int sh_ckpt_job_write(sh_ckpt_job *job, const char *path, int n, const void *const *data, const int64_t *nbytes);
int sh_ckpt_job_wait_file(sh_ckpt_job *job, const char *path, double timeout_s);
/* Renames a directory from -> to, then fsyncs its entries and its entry in the parent. */
int sh_ckpt_job_rename(sh_ckpt_job *job, const char *from, const char *to);
int sh_ckpt_job_prune(sh_ckpt_job *job, const char *root, int keep, const char *protect);
/* Runs the steps: on a new thread when background != 0 (returns at once), else here. */
int sh_ckpt_job_run(sh_ckpt_job *job, int background);
/* Waits for the run to end; its status, with the failing step's message. */
int sh_ckpt_job_wait(sh_ckpt_job *job);
/* 1 once the run has ended (or never started), else 0. */
int sh_ckpt_job_done(sh_ckpt_job *job);
/* Waits for a run in flight, then frees the job. */
void sh_ckpt_job_destroy(sh_ckpt_job *job);

/* mkdir -p. */
int sh_ckpt_mkdirs(const char *path);
/* rm -r (no error when path is absent). */
int sh_ckpt_remove_tree(const char *path);
/* 1 when path exists, else 0. */
int sh_ckpt_exists(const char *path);
