/* meta_internal.h: the meta device's hooks into the allocator, the kernel tables and copies
 * (meta.h says what the device is; not in the FFI). */
#pragma once
#include <stddef.h>
#include "meta.h"
#include "backend_internal.h"

/* The kernel table of the meta device (backend.c hands it out for SH_DEVICE_META). */
const sh_backend *sh_meta_backend(void);
/* A fresh address for a block of nbytes that nothing may read: addresses from 2^63 up, which
 * are not canonical user addresses on x86-64 or aarch64, so a stray read faults. Called under
 * the allocator's lock. */
void *sh_meta_address(size_t nbytes);
/* A copy between the meta device and another one (tensor_copy.c): into meta it moves nothing;
 * out of meta the destination is filled with zeros. */
int sh_meta_copy_across(sh_tensor *dst, const sh_tensor *src);
