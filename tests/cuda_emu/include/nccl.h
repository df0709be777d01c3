/* nccl.h: the CUDA emulator's NCCL (tests/cuda_emu/nccl.cpp): the subset of the NCCL API that
 * kernels/comm_nccl.cu uses, with NCCL's names, types and values, written from NVIDIA's NCCL
 * documentation (API reference: types, communicator functions, collectives, group calls).
 * Test infrastructure only: never linked into lib/libshard.so or bin/shard.
 *
 * Ranks are processes on one machine; data moves through POSIX shared memory. Collectives are
 * queued on the CUDA stream (emu::enqueue_after) and run when the emulator drains it, each
 * after the previous collective this process issued. See tests/cuda_emu/README.md, "NCCL". */
#ifndef NCCL_H_
#define NCCL_H_

#include <stddef.h>
#include <stdint.h>
#include <limits.h>
#include <cuda_runtime.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 21
#define NCCL_PATCH 5
#define NCCL_SUFFIX ""
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SPLIT_NOCOLOR -1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Communicator configuration (ncclCommInitRankConfig, ncclCommSplit). The emulator reads
 * none of it but `blocking` (0 is accepted and behaves as blocking: calls never return
 * ncclInProgress). */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
typedef struct ncclConfig_v21700 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER { \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, \
    NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT }

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);

/* Point to point: in the emulator every member of the communicator takes part in each group
 * of sends and receives (tests/cuda_emu/README.md, "NCCL"). */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* The emulator's own additions (not NCCL's): the issue-order record and counters. */
int shard_emu_nccl_trace_dump(const char *path);   /* this process's collectives, one line each; 0 on success */
long shard_emu_nccl_comm_inits(void);              /* ncclCommInitRank* and ncclCommSplit calls so far */
long shard_emu_nccl_collectives(void);             /* collectives issued so far */
const char *shard_emu_nccl_last_report(void);      /* the last diagnostic printed ("" when none) */

#ifdef __cplusplus
}
#endif

#endif
