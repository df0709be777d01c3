/* determinism.c: the deterministic-kernels switch (determinism.h). */
#include "determinism.h"
#include <stdatomic.h>

static atomic_int deterministic;

int sh_set_deterministic(int on) { return atomic_exchange(&deterministic, on != 0); }

int sh_deterministic(void) { return atomic_load(&deterministic); }
