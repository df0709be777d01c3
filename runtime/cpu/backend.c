/* backend.c: the CPU kernel table, made from SH_KERNELS (core/backend_internal.h): slot X holds
 * sh_kcpu_X (backend_cpu_internal.h), as kernels/device.cu's CUDA table holds sh_kcuda_X. A
 * slot the CPU lacked would be `#define sh_kcpu_X NULL` here, with a comment saying why, and
 * named in .absent. */
#include <stddef.h>
#include "backend_cpu_internal.h"

#define SH_KERNEL_OF(slot) sh_kcpu_##slot
SH_KERNEL_TABLE(cpu_backend, "cpu", NULL);
#undef SH_KERNEL_OF

const sh_backend *sh_cpu_backend(void) { return &cpu_backend; }
