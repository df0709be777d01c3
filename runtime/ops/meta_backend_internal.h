/* meta_backend_internal.h: the meta device's kernel table and copies (ops/meta_backend.c; not
 * in the FFI). */
#pragma once
#include "core/meta_internal.h"
#include "core/backend_internal.h"

/* The kernel table of the meta device and its host side (backend.c hands it out for both):
 * slot X (core/backend_internal.h: SH_KERNELS) holds sh_kmeta_X, declared here from the
 * slot's entry. */
const sh_backend *sh_meta_backend(void);
#define SH_KERNEL_OF(slot) sh_kmeta_##slot
SH_KERNEL_PROTOTYPES
#undef SH_KERNEL_OF
/* A copy between the meta device and another one (tensor_copy.c): into meta it moves nothing;
 * out of meta the destination is filled with zeros; between the meta device and its host side
 * it counts SH_META_COPY_BYTES. */
int sh_meta_copy_across(sh_tensor *dst, const sh_tensor *src);
/* CPU offload of a meta FlatParameter (flatparam.c): the offload part of a memory backend
 * (copy stream, asynchronous copies, marks), every call a no-op that keeps flatparam.c's
 * ordering code running, copy_async a copy to or from the host side. The host side itself is
 * SH_DEVICE_META_HOST; the other members are NULL. */
const sh_mem_backend *sh_meta_offload_backend(void);
