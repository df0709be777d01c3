/* backend_cpu_internal.h: the CPU kernel table (cpu/backend.c), assembled from each family's
 * registration (not in the FFI). */
#pragma once
#include "core/backend_internal.h"

/* The CPU table, filled from every family on first use. */
const sh_backend *sh_cpu_backend(void);

/* Each family's registration, one runtime/cpu/<family>.c each. */
void sh_elementwise_register_cpu(sh_backend *b);   /* copy_, fill_, elementwise */
void sh_reduce_register_cpu(sh_backend *b);
void sh_matmul_register_cpu(sh_backend *b);        /* matmul, gemm_ */
void sh_random_register_cpu(sh_backend *b);        /* arange, random fills, dropout */
void sh_linear_register_cpu(sh_backend *b);        /* linear and its GELU fusions */
void sh_norm_register_cpu(sh_backend *b);
void sh_activation_register_cpu(sh_backend *b);    /* activations, softmax */
void sh_attention_register_cpu(sh_backend *b);     /* attention, rope */
void sh_embedding_register_cpu(sh_backend *b);
void sh_loss_register_cpu(sh_backend *b);
void sh_optim_register_cpu(sh_backend *b);
