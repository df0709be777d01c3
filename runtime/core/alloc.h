/* alloc.h: the caching allocator and its memory statistics.
 * Blocks are rounded up to size classes (four per power of two, 64-byte aligned) and kept
 * on per-class free lists when released, so a training step reuses the same blocks and the
 * peak is the same from run to run. Every block carries a tag so the stats can say where
 * memory goes. Device -1 is the CPU; device N >= 0 is cuda:N. */
#pragma once
#include <stdint.h>
#include <stddef.h>

typedef enum sh_mem_tag {
  SH_TAG_OTHER = 0, SH_TAG_PARAM = 1, SH_TAG_GRAD = 2, SH_TAG_OPTIM = 3,
  SH_TAG_ACTIVATION = 4, SH_TAG_COMM = 5, SH_N_TAGS = 6
} sh_mem_tag;

typedef struct sh_mem_stats {
  int64_t allocated;            /* bytes asked for by live blocks (rounded up to 64) */
  int64_t peak;                 /* highest `allocated` since the last reset_peak */
  int64_t reserved;             /* allocated + cached free blocks */
  int64_t by_tag[6];            /* allocated, split by sh_mem_tag */
  int64_t peak_by_tag[6];       /* by_tag at the moment `peak` was reached */
  int64_t n_alloc;              /* blocks handed out */
  int64_t n_system_alloc;       /* blocks that had to come from the system (cache misses) */
  int64_t limit;                /* 0 = no limit; else allocations past it fail with SH_ERR_OOM */
} sh_mem_stats;

int sh_mem_stats_get(int device, sh_mem_stats *out);
int sh_mem_reset_peak(int device);
int sh_mem_empty_cache(int device);        /* return cached free blocks to the system */
int sh_mem_set_limit(int device, int64_t bytes);
int sh_mem_set_tag(int tag);               /* the tag new storages get; returns the old one */
const char *sh_mem_tag_name(int tag);

/* Allocation events, for memory timelines (shard.memory.timeline). While recording, every
 * block handed out or given back adds { time, +/- bytes (as `allocated` counts them), tag,
 * device } to a ring; a full ring drops the oldest events and counts them. */
typedef struct sh_mem_event {
  double t;                /* monotonic seconds (the clock of shard.timer) */
  int64_t bytes;           /* > 0 allocated, < 0 freed */
  int32_t tag;             /* sh_mem_tag */
  int32_t device;          /* -1 the CPU, else cuda:N */
} sh_mem_event;
/* Starts recording into a ring of `capacity` events (emptied); 0 stops and frees it. */
int sh_mem_trace_start(int capacity);
/* Moves up to max recorded events, oldest first, into out; returns how many. */
int sh_mem_trace_read(sh_mem_event *out, int max);
int64_t sh_mem_trace_dropped(void);     /* events lost to a full ring since the start */
