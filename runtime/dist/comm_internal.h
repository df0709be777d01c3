/* comm_internal.h: the communicator and work structs and the backend interface behind
 * comm.h (not in the FFI). comm.c validates, counts and times; a backend only posts an op,
 * tests it for completion and finishes it. Included from kernels/comm_nccl.cu as well. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif
#include "core/tensor.h"
#include "core/rules_internal.h"
#include "comm.h"

typedef struct sh_comm_backend sh_comm_backend;

struct sh_comm {
  char name[96];
  int rank, size, local_rank;
  int node, n_nodes, local_size;  /* the process's node (comm.h); copied to every group */
  int nodes_uniform;              /* every node has local_size ranks */
  char node_name[64];
  double timeout;                 /* seconds */
  int refs;                       /* references held by sh_comm_init_world / split callers */
  int is_world;
  int splitting_node;             /* set while sh_comm_split_node splits this group (the dry
                                     backend answers that split from the layout) */
  const sh_comm_backend *cpu;     /* mpi, local or none */
  void *cpu_state;
  const sh_comm_backend *gpu;     /* nccl when compiled in; its state is made on first use */
  void *gpu_state;
  sh_comm *parent;                /* for the lazy NCCL sub-communicator */
  int color, key;
  int64_t count[SH_COLL_N], bytes[SH_COLL_N];
  int abandoned;                  /* work freed while pending: the group is unusable */
  int uncounted;                  /* sh_comm_set_counted(0): out of the process-wide counters */
  int64_t seq;                    /* collectives issued on the group (the flight record's numbers) */
  int flight_slot;                /* its entry in this rank's flight record, or -1 */
  sh_comm *next;                  /* the list of live groups */
};

struct sh_comm_work {
  sh_comm *comm;
  const sh_comm_backend *backend;
  int kind;                       /* sh_coll_kind */
  int64_t seq;                    /* its number on the group */
  int64_t bytes;
  int op, reduce_dtype, root;
  sh_tensor *in, *out;            /* aliases: they keep the storages alive until freed */
  void *state;                    /* the backend's (requests, staging buffers) */
  int done;                       /* complete, or handed to the device (ordered) */
  int ordered;                    /* a device stream was made to wait for it: no host wait */
  int status;                     /* the completed op's status */
  char what[200];                 /* "all_reduce of f32[10] cpu (sum)" for messages */
  char why[300];                  /* the backend's message when it failed */
  double issued;                  /* monotonic seconds at issue (trace events) */
  int label;                      /* sh_comm_trace_label at issue */
  int traced;                     /* its completion event is recorded */
  void *device_events[3];         /* CUDA timing events while tracing (sh_comm_event), until recorded */
  int stream;                     /* the sh_stream_kind they were recorded on */
};

struct sh_comm_backend {
  const char *name;
  /* Posts w (validated: contiguous tensors, matching sizes). May complete it at once by
   * setting w->done. Returns a status. */
  int (*start)(sh_comm_work *w);
  /* Never blocks. On completion finishes the op (unstaging), frees w->state, sets *done. */
  int (*test)(sh_comm_work *w, int *done);
  /* Frees w->state of an op that will never be finished (after a timeout). */
  void (*abandon)(sh_comm_work *w);
  /* Collective over parent: fills child's rank, size and this backend's state; sets
   * child->size to 0 when color < 0. NULL: the backend cannot split. */
  int (*split)(sh_comm *parent, int color, int key, sh_comm *child);
  void (*destroy)(sh_comm *c);    /* frees this backend's state of c */
  /* Device-ordered completion (NULL for the host backends, which wait instead). order makes
   * the calling thread's current stream wait for w on the device and finishes w on the host
   * side (its state freed, no host wait). then_begin makes w's own stream the thread's
   * current one; then_end restores the previous stream, moving w's completion past the work
   * issued in between. */
  int (*order)(sh_comm_work *w);
  int (*then_begin)(sh_comm_work *w);
  int (*then_end)(sh_comm_work *w);
};

extern const sh_comm_backend sh_comm_local_backend;
extern const sh_comm_backend sh_comm_dry_backend;     /* comm_dry.c: a dry run's world */
extern const sh_comm_backend sh_comm_mpi_backend;
/* Initialises MPI once (MPI_Init_thread), and gives the world's state, rank and size, and
 * its node fields (node, n_nodes, local_rank, local_size, nodes_uniform, node_name). */
int sh_comm_mpi_init_world(sh_comm *world);
void sh_comm_mpi_finalize(void);
int sh_comm_mpi_active(void);
/* Broadcast of raw bytes over c's MPI state (the NCCL unique id); blocking, with c's timeout. */
int sh_comm_mpi_bcast_bytes(sh_comm *c, void *buf, int nbytes, int root);

/* kernels/comm_nccl.cu, when linked (comm.c refers to it weakly). */
extern const sh_comm_backend sh_comm_nccl_backend;

/* Monotonic seconds. */
double sh_comm_now(void);

#ifdef __cplusplus
}
#endif
