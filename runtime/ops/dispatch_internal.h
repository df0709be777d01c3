/* dispatch_internal.h: how a front reaches the kernels of its tensors' device (not in the FFI).
 * The tables themselves are core/backend_internal.h's. */
#pragma once
#include "core/backend_internal.h"

/* The table of `device` (-1: cpu, N: cuda:N); fails naming op when that device has none. */
int sh_backend_for(const sh_backend **out, int device, const char *op);
/* The kernel entry `field` of the table for `device`, called with the remaining arguments;
 * fails naming op when the backend lacks it. Used by every front after its checks; each call
 * is counted by slot (sh_kernel_calls), which the op-table tests read to prove that their rows
 * reach every slot of SH_KERNELS. */
#define SH_KERNEL(op, device, field, ...)                                                       \
  ({                                                                                           \
    const sh_backend *sh_be_;                                                                  \
    int sh_dev_ = (device);                                                                    \
    sh_kernel_count(sh_dev_, SH_SLOT_##field);                                                 \
    int sh_rc_ = sh_backend_for(&sh_be_, sh_dev_, (op));                                       \
    if (!sh_rc_) sh_rc_ = sh_be_->field ? sh_be_->field(__VA_ARGS__)                           \
                                        : sh_backend_missing(sh_be_, (op), #field);            \
    sh_rc_;                                                                                    \
  })

/* Calls through SH_KERNEL of a slot (SH_SLOT_*) since start-up, on devices of one kind
 * (SH_BACKEND_CPU, _CUDA, _META), or on any device where kind is -1. */
void sh_kernel_count(int device, int slot);
int64_t sh_kernel_calls(int kind, int slot);
