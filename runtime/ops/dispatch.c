/* dispatch.c: the kernel table of a device (ops/dispatch_internal.h). The first op hands the
 * CPU table (cpu/backend.c) and the meta device's (meta_backend.c) down to core/backend.c,
 * where kernels/device.cu hands the CUDA one at sh_cuda_init. */
#include <pthread.h>
#include "dispatch_internal.h"
#include "core/status_internal.h"
#include "cpu/backend_cpu_internal.h"
#include "meta_backend_internal.h"

static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static void register_host_tables(void) {
  sh_backend_register(SH_BACKEND_CPU, sh_cpu_backend());
  sh_backend_register(SH_BACKEND_META, sh_meta_backend());
}

int sh_backend_for(const sh_backend **out, int device, const char *op) {
  pthread_once(&host_once, register_host_tables);
  *out = sh_backend_of(device);
  if (!*out)
    return sh_fail(SH_ERR_DEVICE, "%s: cuda:%d has no kernels (shard was built without CUDA, or sh_cuda_init was not called)", op, device);
  return SH_OK;
}

static int64_t calls[SH_BACKEND_KINDS][SH_SLOT_COUNT];

void sh_kernel_count(int device, int slot) {
  __atomic_fetch_add(&calls[sh_backend_kind(device)][slot], 1, __ATOMIC_RELAXED);
}

int64_t sh_kernel_calls(int kind, int slot) {
  if (slot < 0 || slot >= SH_SLOT_COUNT || kind >= SH_BACKEND_KINDS) return 0;
  if (kind >= 0) return __atomic_load_n(&calls[kind][slot], __ATOMIC_RELAXED);
  int64_t n = 0;
  for (int k = 0; k < SH_BACKEND_KINDS; k++) n += __atomic_load_n(&calls[k][slot], __ATOMIC_RELAXED);
  return n;
}
