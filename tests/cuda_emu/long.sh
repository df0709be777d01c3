#!/bin/sh
# tests/cuda_emu/long.sh EMU_BUILD SHARD_EMU_BIN: the emulated device's longer runs (make
# test-long; make test-cuda-emu runs them after run.sh's): the op table with a block's threads in
# reverse order on a small device, and the stream-heavy programs under other drain orders.
# Ends with "N passed, N failed" like run.sh; run.sh sources it (SHARD_EMU_ALL=1) for its part.
if [ -z "${EMU_RUNNER:-}" ]; then
  EMU=${1:-build-emu}
  SHARD=${2:-bin/shard-emu}
  cd "$(dirname "$0")/../.." || exit 2
  . tests/cuda_emu/runner.sh
  standalone=1
fi

# The op table with the threads of a block in reverse order between barriers, on a small
# device: one SM, so a grid-stride launch (32 blocks per SM) covers fewer elements than the
# larger rows and the kernels must loop, and grid.y capped at 3, so the launches that put rows
# or heads on grid.y split them.
SHARD_EMU_THREAD_ORDER=reverse SHARD_EMU_SMS=1 SHARD_EMU_MAX_GRID_Y=3 \
  run_one "gpu/test_op_table (emulated, SHARD_EMU_THREAD_ORDER=reverse SHARD_EMU_SMS=1 SHARD_EMU_MAX_GRID_Y=3)" \
  "$EMU/tests/gpu/test_op_table"
# The stream-heavy programs again with host waits draining the streams in other orders
# (SHARD_EMU_DRAIN_SEED, README "Streams"), so a race shows whichever stream was issued last:
# seeds 1..6 give every wait every order of up to 3 streams; the default two keep the suite's
# time (both orders of two streams).
for seed in ${SHARD_EMU_DRAIN_SEEDS:-1 2}; do
  for prog in test_cuda_device test_optim_multi; do
    [ -x "$EMU/tests/gpu/$prog" ] || continue
    SHARD_EMU_DRAIN_SEED=$seed run_one "gpu/$prog (emulated, SHARD_EMU_DRAIN_SEED=$seed)" "$EMU/tests/gpu/$prog"
  done
  for s in gpt_step offload_fsdp offload_flatparam trace_streams snapshot_restore; do
    SHARD_EMU_DRAIN_SEED=$seed run_one "gpu/$s.lua (emulated, SHARD_EMU_DRAIN_SEED=$seed)" "$SHARD" run tests/gpu/$s.lua
  done
  rm -f "$scratch"/*
  run_one "gpu/mpi_fsdp_strategies.lua (emulated, mpirun -np 2, SHARD_EMU_DRAIN_SEED=$seed)" \
    $MPIRUN -np 2 -x SHARD_EMU_DRAIN_SEED=$seed -x SHARD_TEST_DIR="$scratch" "$SHARD" run tests/gpu/mpi_fsdp_strategies.lua
  rm -f "$scratch"/*
  run_one "gpu/trace_streams.lua (emulated, mpirun -np 2, SHARD_EMU_DRAIN_SEED=$seed)" \
    $MPIRUN -np 2 -x SHARD_EMU_DRAIN_SEED=$seed -x SHARD_TEST_DIR="$scratch" "$SHARD" run tests/gpu/trace_streams.lua
done
# The captured step at world 2 (the graph's lanes: the compute and collective streams) under the
# first seed only: 11 s of CPU a run; its world-1 cases have no order to show.
seed=$(echo ${SHARD_EMU_DRAIN_SEEDS:-1 2} | cut -d' ' -f1)
run_one "gpu/cuda_graph_step.lua (emulated, mpirun -np 2, SHARD_EMU_DRAIN_SEED=$seed)" \
  $MPIRUN -np 2 -x SHARD_EMU_DRAIN_SEED=$seed "$SHARD" run tests/gpu/cuda_graph_step.lua
[ -z "${standalone:-}" ] || finish
