#!/bin/sh
# tests/cuda_emu/run.sh EMU_BUILD SHARD_EMU_BIN: runs the CUDA emulator's self-tests
# (EMU_BUILD/self/*), the CUDA test programs built against it (EMU_BUILD/tests/gpu/test_*)
# and the CUDA Lua scripts (tests/gpu/*.lua; mpi_* and torchrun_* as several ranks over the
# NCCL stand-in) through SHARD_EMU_BIN,
# each printing "C name: N passed, N failed" (or "... N passed, N failed" last); a program that
# crashes or prints no summary counts as one failure. Ends with "N passed, N failed" and a
# non-zero status when anything failed. The device runs adversarially: deferred work drained
# newest-first, blocks shuffled (SHARD_EMU_BLOCK_ORDER), unless the environment says otherwise.
# The longer runs (other drain orders, the op table on a small device) are in long.sh.
EMU=${1:-build-emu}
SHARD=${2:-bin/shard-emu}
cd "$(dirname "$0")/../.." || exit 2
. tests/cuda_emu/runner.sh

run_one "cuda_emu/test_rewrite.lua" ${LUAJIT:-luajit} tests/cuda_emu/tests/test_rewrite.lua
for t in "$EMU"/self/*; do
  [ -x "$t" ] || continue
  run_one "cuda_emu/$(basename "$t")" "$t"
done
# the knobs for a small device (below)
SHARD_EMU_SMS=1 SHARD_EMU_MAX_GRID_Y=3 run_one "cuda_emu/test_emu_core (SHARD_EMU_SMS=1 SHARD_EMU_MAX_GRID_Y=3)" \
  "$EMU/self/test_emu_core"
# Each CUDA test program three ways: as it is; without cuBLASLt's fused epilogues (as
# tests/run_gpu.sh, so the fallback runs too: for the op table only its linear rows use them);
# and with the threads of a block in reverse order between barriers (a missing barrier whose
# reader has the lower index shows in the first run, one whose reader has the higher index
# here); the op table's reverse-order run is in long.sh (make test-long).
for t in "$EMU"/tests/gpu/test_*; do
  [ -x "$t" ] || continue
  prog=$(basename "$t")
  run_one "gpu/$prog (emulated)" "$t"
  if [ "$prog" = test_attention_bits ]; then
    continue   # it sets its block orders itself; the op table's runs cover its kernels' barriers
  elif [ "$prog" = test_op_table ]; then
    SHARD_NO_LT_EPILOGUE=1 run_one "gpu/$prog linear (emulated, SHARD_NO_LT_EPILOGUE=1)" "$t" linear
  else
    SHARD_NO_LT_EPILOGUE=1 run_one "gpu/$prog (emulated, SHARD_NO_LT_EPILOGUE=1)" "$t"
    SHARD_EMU_THREAD_ORDER=reverse run_one "gpu/$prog (emulated, SHARD_EMU_THREAD_ORDER=reverse)" "$t"
  fi
done
# cuBLASLt refusing every fused epilogue when the matmul runs, after its heuristic offered one:
# the linear ops must fall back to the plain product and their own epilogue kernels.
SHARD_EMU_LT_REFUSE_EPILOGUE=1 run_one "gpu/test_op_table linear (emulated, SHARD_EMU_LT_REFUSE_EPILOGUE=1)" \
  "$EMU/tests/gpu/test_op_table" linear
# The CUDA Lua scripts (tests/gpu/*.lua) through the emulated host; the multi-rank ones below.
for s in tests/gpu/*.lua; do
  [ -f "$s" ] || continue
  case $(basename "$s") in mpi_*|torchrun_*|support.lua) continue ;; esac
  run_one "gpu/$(basename "$s") (emulated)" "$SHARD" run "$s"
done
# Ranks as separate processes over the NCCL stand-in, started the three ways real
# runs start: mpirun, `shard launch` and a torchrun-style environment (MASTER_PORT held by
# another process, as torchrun's store holds it).
for n in 2 3 4; do
  rm -f "$scratch"/*
  run_one "gpu/mpi_fsdp_strategies.lua (emulated, mpirun -np $n)" \
    $MPIRUN -np $n -x SHARD_TEST_DIR="$scratch" "$SHARD" run tests/gpu/mpi_fsdp_strategies.lua
done
rm -f "$scratch"/*
run_one "gpu/cuda_graph_step.lua (emulated, mpirun -np 2)" $MPIRUN -np 2 "$SHARD" run tests/gpu/cuda_graph_step.lua
run_one "gpu/trace_streams.lua (emulated, mpirun -np 2)" \
  $MPIRUN -np 2 -x SHARD_TEST_DIR="$scratch" "$SHARD" run tests/gpu/trace_streams.lua
# With every cudaStreamWaitEvent dropped the same test must fail: the harness sees a missing wait.
rm -f "$scratch"/*
SHARD_EMU_DROP_EVENT_WAITS=1 SHARD_FSDP_CASES=full_shard/f32/nockpt timeout -k 10 "$TIMEOUT" \
  $MPIRUN -np 2 -x SHARD_EMU_DROP_EVENT_WAITS -x SHARD_FSDP_CASES -x SHARD_TEST_DIR="$scratch" \
  "$SHARD" run tests/gpu/mpi_fsdp_strategies.lua >"$out" 2>&1
if [ $? -ne 0 ] && grep -q '^not ok' "$out"; then
  passed=$((passed + 1)); echo "ok   gpu/mpi_fsdp_strategies.lua fails with SHARD_EMU_DROP_EVENT_WAITS=1, as it must"
else
  failed=$((failed + 1)); echo "FAIL gpu/mpi_fsdp_strategies.lua passed with every event wait dropped"
  tail -n 20 "$out" | sed 's/^/    /'
fi
# CPU offload at world 2 (offload_fsdp.lua and offload_dryrun.lua ran at world 1 in the loop above).
run_one "gpu/offload_fsdp.lua (emulated, mpirun -np 2)" $MPIRUN -np 2 "$SHARD" run tests/gpu/offload_fsdp.lua
run_one "gpu/offload_dryrun.lua (emulated, mpirun -np 2)" $MPIRUN -np 2 "$SHARD" run tests/gpu/offload_dryrun.lua
# With every cudaStreamWaitEvent dropped the offloaded FlatParameter must read stale shards.
SHARD_EMU_DROP_EVENT_WAITS=1 timeout -k 10 "$TIMEOUT" "$SHARD" run tests/gpu/offload_flatparam.lua >"$out" 2>&1
if [ $? -ne 0 ] && grep -q '^not ok' "$out"; then
  passed=$((passed + 1)); echo "ok   gpu/offload_flatparam.lua fails with SHARD_EMU_DROP_EVENT_WAITS=1, as it must"
else
  failed=$((failed + 1)); echo "FAIL gpu/offload_flatparam.lua passed with every event wait dropped"
  tail -n 20 "$out" | sed 's/^/    /'
fi
run_one "gpu/torchrun_fsdp.lua (emulated, shard launch --nproc 2)" "$SHARD" launch --nproc 2 tests/gpu/torchrun_fsdp.lua
port=$(( 20000 + $$ % 20000 ))
MASTER_PORT=$port SHARD_HOLD_PORT=1 "$SHARD" run tests/gpu/torchrun_fsdp.lua >"$scratch/hold" 2>&1 &
holder=$!
for _ in 1 2 3 4 5 6 7 8 9 10; do grep -q holding "$scratch/hold" 2>/dev/null && break; sleep 0.2; done
ranks=""
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout -k 10 "$TIMEOUT" "$SHARD" run tests/gpu/torchrun_fsdp.lua >"$scratch/rank$r" 2>&1 &
  ranks="$ranks $!"
done
wait $ranks
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
for r in 0 1; do
  cp "$scratch/rank$r" "$out"
  if grep -q holding "$scratch/hold" && grep -qE ' [0-9]+ passed, 0 failed$' "$out"; then
    passed=$((passed + $(grep -E ' passed, 0 failed$' "$out" | sed -E 's/.* ([0-9]+) passed.*/\1/')))
    echo "ok   gpu/torchrun_fsdp.lua rank $r (emulated, torchrun-style env, MASTER_PORT $port held)"
  else
    failed=$((failed + 1)); echo "FAIL gpu/torchrun_fsdp.lua rank $r (torchrun-style env, MASTER_PORT $port held)"
    tail -n 20 "$out" | sed 's/^/    /'
  fi
done
# SHARD_EMU_ALL=1 (make test-cuda-emu): make test-long's part too.
[ "${SHARD_EMU_ALL:-}" != 1 ] || . tests/cuda_emu/long.sh
finish
