/* test_op_table.c (make test-gpu; needs a GPU): every row of the op table
 * (tests/ops/op_table.h) on cuda:0 against the same row on the CPU.
 * Each case builds the same inputs on both devices (the table's seeded generator), runs the
 * public op on cuda:0 twice (the first pass's results are NaN-poisoned and freed in between,
 * so an element a kernel leaves unwritten shows as NaN) and once on the CPU, and compares
 * every output: same shape and dtype, normwise relative error within the row's tolerance,
 * no NaN. The CPU side is itself checked against f64 and double references by
 * tests/c/test_op_table.c (make test). run_gpu.sh runs this twice, the second time with
 * SHARD_NO_LT_EPILOGUE=1 so the unfused fallbacks of the cuBLASLt epilogues are checked too.
 * The emulator (tests/cuda_emu/run.sh) also runs it on a small emulated device (one SM, grid.y
 * of 3) and the linear rows with its cuBLASLt refusing fused epilogues at run time.
 *   build/tests/gpu/test_op_table             every row
 *   build/tests/gpu/test_op_table attention   the rows whose op name contains "attention"
 * The bf16 attention backward rows run twice: as they are (the one-pass backward, dq summed by
 * atomics) and with sh_set_deterministic(1) (its two-kernel form).
 * Unfiltered, it also checks the CUDA kernel table (core/backend_internal.h): every slot of
 * SH_KERNELS filled or named in its absent list, and every slot reached on cuda by some row.
 * SHARD_TEST_SEED=N changes the inputs; SHARD_TEST_VERBOSE=1 prints every error. */
#include "../ops/op_table.h"
#include "core/cuda.h"
#include "core/determinism.h"
#include "ops/dispatch_internal.h"
#include "gpu_test.h"

static const int DEV = 0;

/* after the op on the device: it must not have failed asynchronously */
static void synchronized(const char *label) {
  int sync = sh_cuda_synchronize(DEV);
  CHECK(sync == 0, "%s: the device failed after the op: %s", label, sh_last_error());
}

/* The CUDA table fills every slot or names it in its absent list. */
static void check_table_filled(void) {
  const sh_backend *cuda = NULL;
  CHECK(sh_backend_for(&cuda, DEV, "test") == SH_OK && cuda, "cuda backend table: %s", sh_last_error());
  if (!cuda) return;
  const char *gap = sh_backend_unfilled(cuda);
  CHECK(!gap, "the %s backend leaves kernel slot %s empty without naming it in its absent list", cuda->name, gap);
}

/* After the whole table ran: every slot the CUDA table fills was reached on cuda by some row. */
static void check_slots_covered(void) {
  const sh_backend *cuda = sh_backend_of(DEV);
  for (int s = 0; s < SH_SLOT_COUNT; s++)
    CHECK(!cuda || !sh_backend_has(cuda, s) || sh_kernel_calls(SH_BACKEND_CUDA, s) > 0,
          "no row of tests/ops/op_table.h reaches kernel slot %s on cuda (add a row for its op)",
          sh_backend_slot_name(s));
}

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  int rc = cuda_test_start("test_op_table (cuda)", DEV);
  if (rc >= 0) return rc;
  uint64_t base = ot_base_seed();
  printf("test_op_table (cuda:%d): seed %llu (SHARD_TEST_SEED=%llu replays), lt epilogues %s\n", DEV,
         (unsigned long long)base, (unsigned long long)base, getenv("SHARD_NO_LT_EPILOGUE") ? "off" : "on");
  double t0 = ot_now();
  if (!filter) check_table_filled();
  char on_dev[32];
  snprintf(on_dev, sizeof on_dev, " on cuda:%d", DEV);
  const ot_pass cuda = { DEV, 0, -1, 0, 1, 0, on_dev, " on the cpu", synchronized, 0 };
  int rows, cases;
  ot_run_pass(&cuda, filter, base, &rows, &cases);
  /* the attention backward rows again with deterministic kernels asked for: in bf16, where
   * the tensor-core backward runs its two passes (dK/dV, then dQ) instead of the one that sums
   * dq with atomics (the other dtypes' kernels are the same either way) */
  char det_dev[48];
  snprintf(det_dev, sizeof det_dev, " on cuda:%d [deterministic]", DEV);
  const ot_pass det = { DEV, 0, -1, 0, 1, 0, det_dev, " on the cpu", synchronized, OT_BF16 };
  static const char *const det_rows[] = {"attention_backward", "attention_gqa_backward"};
  sh_set_deterministic(1);
  for (int i = 0; i < 2; i++)
    if (!filter || strstr(det_rows[i], filter) || strstr(filter, det_rows[i])) {
      int drows, dcases;
      ot_run_pass(&det, filter && strstr(filter, det_rows[i]) ? filter : det_rows[i], base, &drows, &dcases);
      cases += dcases;
    }
  sh_set_deterministic(0);
  CHECK_OK(sh_cuda_synchronize(DEV));
  printf("test_op_table: %d rows, %d cases on cuda:%d against the cpu in %.2f s\n", rows, cases, DEV, ot_now() - t0);
  if (filter && rows == 0) CHECK(0, "no row's op contains \"%s\"", filter);
  if (!filter) check_slots_covered();
  return check_summary("test_op_table (cuda)");
}
