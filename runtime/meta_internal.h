/* meta_internal.h: the meta device's hooks into the allocator, the kernel tables and copies
 * (meta.h says what the device is; not in the FFI). */
#pragma once
#include <stddef.h>
#include "meta.h"
#include "backend_internal.h"
#include "alloc_internal.h"

/* Either side of the meta device: no bytes behind its storages, the meta kernels. */
static inline int sh_is_meta(int device) { return device == SH_DEVICE_META || device == SH_DEVICE_META_HOST; }

/* The kernel table of the meta device and its host side (backend.c hands it out for both). */
const sh_backend *sh_meta_backend(void);
/* A fresh address for a block of nbytes that nothing may read: addresses from 2^63 up, which
 * are not canonical user addresses on x86-64 or aarch64, so a stray read faults. Called under
 * the allocator's lock. */
void *sh_meta_address(size_t nbytes);
/* A copy between the meta device and another one (tensor_copy.c): into meta it moves nothing;
 * out of meta the destination is filled with zeros; between the meta device and its host side
 * it counts SH_META_COPY_BYTES. */
int sh_meta_copy_across(sh_tensor *dst, const sh_tensor *src);
/* CPU offload of a meta FlatParameter (flatparam.c): the offload part of a memory backend
 * (copy stream, asynchronous copies, marks), every call a no-op that keeps flatparam.c's
 * ordering code running, copy_async a copy to or from the host side. The host side itself is
 * SH_DEVICE_META_HOST; the other members are NULL. */
const sh_mem_backend *sh_meta_offload_backend(void);
