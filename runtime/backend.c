/* backend.c: the per-device kernel tables (backend_internal.h). The CPU table is assembled
 * once from every op family's registration; the CUDA table arrives from kernels/device.cu;
 * the meta device's (dry runs) is meta.c's. */
#include <pthread.h>
#include "backend_internal.h"
#include "status_internal.h"
#include "meta_internal.h"

static sh_backend cpu_backend = { .name = "cpu" };
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static const sh_backend *cuda_backend;

static void cpu_register(void) {
  sh_copy_register_cpu(&cpu_backend);
  sh_elementwise_register_cpu(&cpu_backend);
  sh_reduce_register_cpu(&cpu_backend);
  sh_matmul_register_cpu(&cpu_backend);
  sh_create_register_cpu(&cpu_backend);
  sh_linear_register_cpu(&cpu_backend);
  sh_norm_register_cpu(&cpu_backend);
  sh_activation_register_cpu(&cpu_backend);
  sh_attention_register_cpu(&cpu_backend);
  sh_embedding_register_cpu(&cpu_backend);
  sh_loss_register_cpu(&cpu_backend);
  sh_optim_register_cpu(&cpu_backend);
}

void sh_backend_register_cuda(const sh_backend *b) { cuda_backend = b; }

int sh_backend_for(const sh_backend **out, int device, const char *op) {
  if (sh_is_meta(device)) { *out = sh_meta_backend(); return SH_OK; }
  if (device < 0) {
    pthread_once(&cpu_once, cpu_register);
    *out = &cpu_backend;
    return SH_OK;
  }
  *out = cuda_backend;
  if (!cuda_backend)
    return sh_fail(SH_ERR_DEVICE, "%s: cuda:%d has no kernels (shard was built without CUDA, or sh_cuda_init was not called)", op, device);
  return SH_OK;
}

int sh_backend_missing(const sh_backend *b, const char *op, const char *kernel) {
  return sh_fail(SH_ERR_DEVICE, "%s: the %s backend has no %s kernel", op, b->name, kernel);
}
