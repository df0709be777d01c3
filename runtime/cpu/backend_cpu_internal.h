/* backend_cpu_internal.h: the CPU kernel table (cpu/backend.c) and its kernels (not in the FFI).
 *
 * The kernel of slot X (core/backend_internal.h: SH_KERNELS) is sh_kcpu_X, a non-static
 * function in runtime/cpu/<family>.c; its prototype below is made from the slot's entry, so a
 * kernel whose parameters differ from its slot's does not compile. cpu/backend.c's table is
 * made from the same list. */
#pragma once
#include "core/backend_internal.h"

/* The CPU table. */
const sh_backend *sh_cpu_backend(void);

#define SH_KERNEL_OF(slot) sh_kcpu_##slot
SH_KERNEL_PROTOTYPES
#undef SH_KERNEL_OF
