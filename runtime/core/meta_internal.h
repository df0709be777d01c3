/* meta_internal.h: the meta device's ids, counters and addresses (meta.h says what the device
 * is; not in the FFI; its kernels and copies are ops/meta_backend_internal.h's). */
#pragma once
#include <stddef.h>
#include "meta.h"
#include "alloc_internal.h"

/* Either side of the meta device: no bytes behind its storages, the meta kernels. */
static inline int sh_is_meta(int device) { return device == SH_DEVICE_META || device == SH_DEVICE_META_HOST; }

/* A fresh address for a block of nbytes that nothing may read: addresses from 2^63 up, which
 * are not canonical user addresses on x86-64 or aarch64, so a stray read faults. Called under
 * the allocator's lock. */
void *sh_meta_address(size_t nbytes);
/* Adds n to counter kind (meta.h), from any thread. */
void sh_meta_add(int kind, int64_t n);
