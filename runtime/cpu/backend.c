/* backend.c: the CPU kernel table (cpu/backend_cpu_internal.h), assembled once from every
 * family's registration, as kernels/device.cu assembles the CUDA one. */
#include <pthread.h>
#include "backend_cpu_internal.h"

static sh_backend cpu_backend = { .name = "cpu" };
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_register(void) {
  sh_elementwise_register_cpu(&cpu_backend);
  sh_reduce_register_cpu(&cpu_backend);
  sh_matmul_register_cpu(&cpu_backend);
  sh_random_register_cpu(&cpu_backend);
  sh_linear_register_cpu(&cpu_backend);
  sh_norm_register_cpu(&cpu_backend);
  sh_activation_register_cpu(&cpu_backend);
  sh_attention_register_cpu(&cpu_backend);
  sh_embedding_register_cpu(&cpu_backend);
  sh_loss_register_cpu(&cpu_backend);
  sh_optim_register_cpu(&cpu_backend);
}

const sh_backend *sh_cpu_backend(void) {
  pthread_once(&cpu_once, cpu_register);
  return &cpu_backend;
}
