/* determinism.h: the process-wide choice between a kernel's fastest form and one that gives
 * the same bits from run to run (as torch.use_deterministic_algorithms). Off by default.
 * Today it picks one kernel: the CUDA attention backward, whose fast form adds each key
 * tile's share of dq into an f32 accumulator with atomicAdd (the order of those additions,
 * hence the low bits of dq, varies with the GPU's block schedule); on, it runs two passes
 * that need no atomics. Every other kernel, and every CPU kernel, sums in a fixed order
 * either way. Read when an op launches: a CUDA graph keeps the form its capture saw. */
#pragma once

/* Sets the switch (on != 0) and returns the previous setting. */
int sh_set_deterministic(int on);
/* 1 when deterministic kernels are asked for, else 0. */
int sh_deterministic(void);
