/* comm.h: process groups and collectives.
 * A communicator (sh_comm) is a group of ranks: the world, or a sub-group made by
 * sh_comm_split (hybrid sharding's 2-D mesh: shard groups and replicate groups). Each
 * collective is issued by every rank of the group in the same order. CPU tensors go through
 * Open MPI (or plain copies in a group of one), CUDA tensors through NCCL.
 *
 * Every collective has an async form returning a work handle. CUDA collectives run on the
 * device's communication streams, after the work the caller's current stream had queued
 * when they were issued; the blocking form of a CUDA collective returns once it is queued,
 * with the caller's current stream ordered after it (as NCCL users expect: no host wait),
 * and that of a CPU collective returns when it is complete. A wait gives up after the communicator's timeout (default
 * 600 s, or SHARD_COMM_TIMEOUT seconds from the environment) with SH_ERR_COMM and a message
 * naming the op, the group and the rank, instead of hanging. The op is still pending after a
 * timeout: waiting again resumes it, and freeing the handle abandons it (the group is then
 * unusable and the process should exit with the error).
 *
 * Reductions (SH_RED_*): bf16 and f16 are summed in f32 and rounded once at the end. With a
 * reduce dtype (not -1) every input value is first rounded to that dtype, and the result is
 * rounded to it, as if the collective ran in that dtype; -1 means the tensor's own dtype. AVG
 * is the sum divided by the group size. Tensors must be contiguous; in and out have the same
 * dtype and device. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include "core/tensor.h"

typedef struct sh_comm sh_comm;
typedef struct sh_comm_work sh_comm_work;

typedef enum sh_reduce_op { SH_RED_SUM = 0, SH_RED_AVG = 1, SH_RED_MAX = 2, SH_RED_MIN = 3 } sh_reduce_op;

/* Collective kinds, for the counters, the flight record and the trace events. This enum and
 * sh_comm_kind_name are the one list of them: lua/shard/comm.lua reads both (comm.kinds,
 * comm.kind_name), and every tool takes its names from there. */
typedef enum sh_coll_kind {
  SH_COLL_ALL_GATHER = 0, SH_COLL_REDUCE_SCATTER = 1, SH_COLL_ALL_REDUCE = 2,
  SH_COLL_BROADCAST = 3, SH_COLL_BARRIER = 4, SH_COLL_ALL_TO_ALL = 5, SH_COLL_N = 6
} sh_coll_kind;
/* The kind's name ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier",
 * "all_to_all");
 * NULL outside 0..SH_COLL_N-1. */
const char *sh_comm_kind_name(int kind);

/* How this process was started, read from the environment without initialising anything. */
typedef enum sh_launcher { SH_LAUNCH_NONE = 0, SH_LAUNCH_MPI = 1, SH_LAUNCH_TORCHRUN = 2, SH_LAUNCH_SLURM = 3 } sh_launcher;
typedef struct sh_comm_env {
  int32_t launcher;     /* sh_launcher */
  int32_t rank;         /* 0 when not launched */
  int32_t size;         /* 1 when not launched */
  int32_t local_rank;   /* rank within this node */
  int32_t local_size;   /* ranks on this node */
  int32_t node;         /* this node's index (SLURM_NODEID, GROUP_RANK, RANK / LOCAL_WORLD_SIZE);
                           -1 under mpirun, where MPI tells it at init */
  int32_t n_nodes;      /* nodes in the job; 0 when not known before init */
} sh_comm_env;
int sh_comm_read_env(sh_comm_env *out);

/* The world group. The first call bootstraps: under mpirun (OMPI_COMM_WORLD_* or PMIX_RANK)
 * or srun it initialises MPI; with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR, MASTER_PORT) and no MPI, CUDA tensors go through NCCL (TCP rendezvous) and CPU
 * collectives fail with a message saying to launch through `shard launch` or mpirun; with
 * nothing set it is a world of one. Later calls return the same group (counted references:
 * each is ended with sh_comm_destroy). */
int sh_comm_init_world(sh_comm **out);
/* A dry-run world instead (lua/shard/dryrun.lua): this process stands for `rank` of `size`
 * ranks, local_size per node (numbered node by node). Collectives complete at once, move no
 * data and are counted as real ones; meta tensors (meta.h) may only go through such a
 * world. It must come before the first sh_comm_init_world, which then returns it. */
int sh_comm_init_dry(sh_comm **out, int rank, int size, int local_size);
/* Collective over `comm`: ranks giving the same color form a group, ordered by (key, rank).
 * color < 0 gives *out = NULL on that rank. The new group is named "<parent> color C" until
 * sh_comm_set_name renames it. */
int sh_comm_split(sh_comm **out, sh_comm *comm, int color, int key);
void sh_comm_destroy(sh_comm *comm);
/* Destroys the world and ends MPI (unless work is still pending after a timeout, where
 * finalising could hang). Safe to call more than once. It runs by itself when the process
 * exits with status 0; an exit with an error skips it, because MPI_Finalize waits for every
 * rank, and mpirun then stops the other ranks at once. */
int sh_comm_finalize(void);

int sh_comm_rank(const sh_comm *comm);
int sh_comm_size(const sh_comm *comm);
int sh_comm_local_rank(const sh_comm *comm);   /* the process's rank within its node */
/* Nodes. Under MPI a node is what MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) groups (the
 * hosts mpirun or srun placed the ranks on, whatever the rank numbering); nodes are numbered
 * 0..n_nodes-1 in the order of their lowest world rank. Under torchrun-style variables the
 * node is GROUP_RANK (else RANK / LOCAL_WORLD_SIZE). These are the process's, on any group. */
int sh_comm_node(const sh_comm *comm);         /* this process's node index */
int sh_comm_n_nodes(const sh_comm *comm);      /* nodes in the job */
int sh_comm_local_size(const sh_comm *comm);   /* ranks on this process's node */
/* 1 when every node runs the same number of ranks (a node-by-local-rank mesh exists). */
int sh_comm_nodes_uniform(const sh_comm *comm);
const char *sh_comm_node_name(const sh_comm *comm);   /* the host name (MPI_Get_processor_name) */
/* Collective over comm: the group of comm's ranks on this process's node, ordered by rank in
 * comm, named "<comm> node N". */
int sh_comm_split_node(sh_comm **out, sh_comm *comm);
int sh_comm_set_name(sh_comm *comm, const char *name);  /* used in error messages */
/* counted 0: the group's collectives stay out of the process-wide counters (comm NULL in
 * sh_comm_count/_bytes below), for groups that only check the others (FSDP's schedule check);
 * its own counters still count. */
int sh_comm_set_counted(sh_comm *comm, int counted);
const char *sh_comm_name(const sh_comm *comm);
const char *sh_comm_backend_name(const sh_comm *comm);  /* CPU backend: "mpi", "local" or "none" */
/* The backend CUDA tensors' collectives take: "nccl" when linked, "local" for a group of one
 * without it, else "none". */
const char *sh_comm_device_backend_name(const sh_comm *comm);
int sh_comm_set_timeout(sh_comm *comm, double seconds);
double sh_comm_timeout(const sh_comm *comm);

/* Collectives. out of all_gather_into is size * numel(in) elements (any shape with that
 * numel), rank r's input landing at r * numel(in). in of reduce_scatter is size * numel(out);
 * rank r receives the reduced slice r. all_reduce and broadcast work in place. */
int sh_comm_all_gather_into(sh_comm *comm, sh_tensor *out, const sh_tensor *in);
int sh_comm_reduce_scatter(sh_comm *comm, sh_tensor *out, const sh_tensor *in, int op, int reduce_dtype);
int sh_comm_all_reduce(sh_comm *comm, sh_tensor *t, int op, int reduce_dtype);
int sh_comm_broadcast(sh_comm *comm, sh_tensor *t, int root);
int sh_comm_barrier(sh_comm *comm);
/* in and out have size * n elements each (any shapes), in distinct memory: block q of rank
 * r's input (elements [q n, (q + 1) n)) lands in block r of rank q's output. It moves bytes
 * and reduces nothing, so it is exact in any dtype (FSDP's deterministic reduction gathers
 * each shard's pieces with it and sums them in a fixed order). CUDA tensors: one ncclSend
 * and one ncclRecv per peer in a group, on the reductions' communicator and stream. */
int sh_comm_all_to_all_into(sh_comm *comm, sh_tensor *out, const sh_tensor *in);

/* Async forms. The handle keeps the tensors' storages alive until it is freed. */
int sh_comm_all_gather_into_async(sh_comm_work **work, sh_comm *comm, sh_tensor *out, const sh_tensor *in);
int sh_comm_reduce_scatter_async(sh_comm_work **work, sh_comm *comm, sh_tensor *out, const sh_tensor *in,
                                 int op, int reduce_dtype);
int sh_comm_all_reduce_async(sh_comm_work **work, sh_comm *comm, sh_tensor *t, int op, int reduce_dtype);
int sh_comm_broadcast_async(sh_comm_work **work, sh_comm *comm, sh_tensor *t, int root);
int sh_comm_barrier_async(sh_comm_work **work, sh_comm *comm);
int sh_comm_all_to_all_into_async(sh_comm_work **work, sh_comm *comm, sh_tensor *out, const sh_tensor *in);
int sh_comm_wait(sh_comm_work *work);               /* SH_OK once complete (again: SH_OK) */
int sh_comm_test(sh_comm_work *work, int *done);    /* never blocks */
void sh_comm_work_free(sh_comm_work *work);         /* waits first if still pending and not ordered */
/* Orders the calling thread's current stream after the collective: later work on that stream
 * sees its outputs. For CUDA tensors this is an event wait on the device and the host never
 * blocks; for CPU tensors it is sh_comm_wait. The handle may then be freed at once. */
int sh_comm_work_order(sh_comm_work *work);
/* Between sh_comm_work_then_begin and sh_comm_work_then_end, the work this thread queues on
 * the collective's device runs after it, on the collective's own stream, so finishing its
 * output (a cast, an accumulation, a further collective) never makes the caller's stream
 * wait; memory freed in between is reused in that stream's order. sh_comm_work_order after
 * then_end covers that work too. For CPU tensors begin waits and end does nothing. */
int sh_comm_work_then_begin(sh_comm_work *work);
int sh_comm_work_then_end(sh_comm_work *work);

/* The flight record. With SHARD_FLIGHT_DIR set (shard launch sets it), each rank keeps its
 * collectives' progress in DIR/rank<R>.flight, a shared mapping updated on every issue and
 * every wait with plain stores (no system call), so that after a hang or a timeout the
 * launcher can tell which rank never reached which collective (lua/shard/launch.lua reads the
 * files). Sequence numbers count the collectives issued on a group, from 1. */
typedef struct sh_flight_group {
  char name[64];
  int64_t issued;          /* collectives issued on the group so far */
  int64_t last_bytes;      /* the latest one's bytes */
  int32_t last_kind;       /* its sh_coll_kind */
  int32_t size;            /* ranks in the group */
} sh_flight_group;
typedef struct sh_flight_record {
  char magic[8];           /* "shflt03" once written */
  int32_t rank, size, pid, n_groups;
  sh_flight_group groups[16];
  char wait_group[64];     /* the group of the collective this rank waits in */
  int64_t wait_seq, wait_bytes;
  int32_t wait_kind, wait_state;   /* wait_state: 0 not waiting, 1 waiting, 2 timed out */
  double wait_since;       /* monotonic seconds when the wait began */
  double wait_for;         /* seconds waited, once timed out */
  char node_name[64];      /* the host this rank runs on */
  int32_t node, local_rank;   /* its node index and rank within the node */
  double active_at;        /* monotonic seconds of its latest issue or wait poll: a rank
                              stopped or busy outside collectives leaves it behind */
} sh_flight_record;
/* The rank whose wait times out first copies every rank's record it can read into
 * DIR/timeout.flight (record r at offset r * sizeof(sh_flight_record)) before it fails, so
 * the launcher sees them as they were before the job's teardown resumed or moved any rank. */

/* Collectives issued since the last reset, per kind, and the bytes each rank contributed.
 * comm NULL: every group of this process together. */
int64_t sh_comm_count(const sh_comm *comm, int kind);
int64_t sh_comm_bytes(const sh_comm *comm, int kind);
void sh_comm_reset_counts(sh_comm *comm);
/* Seconds this process has spent blocked in sh_comm_wait since it started: the communication
 * the host could not hide behind its own work (exposed communication). A rank slower than its
 * peers waits least, so step time minus this is the rank's own work (straggler detection).
 * On a CUDA device the waits are on the device and this stays near zero. */
double sh_comm_wait_seconds(void);

/* Collective events, for step traces (lua/shard/trace.lua). While recording, this process
 * keeps a ring of events: one per collective once the host sees it complete (issue time to
 * that moment; for a CPU op under MPI the op progresses only while some call polls it, so
 * the end is when a wait or test found it done; a CUDA op ordered on a stream ends when it
 * was handed to the device), and one
 * per sh_comm_wait that blocked (the host's exposed communication, the same time that
 * sh_comm_wait_seconds counts). A full ring drops the oldest events and counts them. */
typedef struct sh_comm_event {
  double t0, t1;           /* monotonic seconds (the clock of shard.timer) */
  int64_t bytes;           /* what this rank contributed, as the counters count it */
  int64_t seq;             /* the collective's number on its group */
  int32_t kind;            /* sh_coll_kind */
  int32_t wait;            /* 0: issue to completion; 1: the host blocked waiting for it */
  int32_t device;          /* -1 for CPU tensors (and barriers), else cuda:N */
  int32_t label;           /* the label current when it was issued (sh_comm_trace_label) */
  char group[64];
  /* A CUDA collective's timing events (sh_cuda_event *, cuda.h), which the reader owns and
   * destroys: [0] on the caller's stream and [1] on the collective's stream before it was
   * queued (it starts on the device once both are reached), [2] on its stream after it.
   * NULL for CPU collectives, waits, and a build without CUDA. */
  void *device_events[3];
  int32_t stream;          /* the collective's sh_stream_kind, for CUDA collectives */
} sh_comm_event;
/* Starts recording into a ring of `capacity` events (emptied); 0 stops and frees it. */
int sh_comm_trace_start(int capacity);
/* Moves up to max recorded events, oldest first, into out; returns how many. */
int sh_comm_trace_read(sh_comm_event *out, int max);
int64_t sh_comm_trace_dropped(void);    /* events lost to a full ring since the start */
/* Sets the label that collectives issued from now carry (e.g. the FSDP unit they serve);
 * returns the previous one. */
int sh_comm_trace_label(int label);
