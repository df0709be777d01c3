#!/bin/sh
# run_gpu.sh: the CUDA test suite (make test-gpu). Usage: sh tests/run_gpu.sh bin/shard [build]
# Runs every build/tests/gpu/test_* binary twice (with cuBLASLt's fused epilogues, then with
# SHARD_NO_LT_EPILOGUE=1 so the fallback path is checked too) and every tests/gpu/*.lua
# script through bin/shard (mpi_*.lua under mpirun -np 1, so CUDA collectives use NCCL;
# torchrun_*.lua under a torchrun-style environment); each prints a line ending in
# "N passed, N failed". Ends with the
# totals on one line and exits non-zero when anything failed or a program crashed.
# A program that runs past SHARD_GPU_TEST_TIMEOUT seconds (default 300) is stopped and counted
# as failed: a hang on real hardware must not take the device time of the runs after it.
host=${1:-bin/shard}
build=${2:-build}
passed=0
failed=0
limit=${SHARD_GPU_TEST_TIMEOUT:-300}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

tally() {   # $1: exit status of the program whose output is in $log
  cat "$log"
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  if [ -n "$line" ]; then
    p=$(echo "$line" | sed -E 's/.*[^0-9]([0-9]+) passed.*/\1/; s/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    passed=$((passed + p))
    failed=$((failed + f))
  fi
  [ "$1" -eq 124 ] && echo "not ok: stopped after ${limit} s (SHARD_GPU_TEST_TIMEOUT)"
  if [ "$1" -ne 0 ] && { [ -z "$line" ] || [ "${f:-0}" -eq 0 ]; }; then
    echo "not ok: exited with status $1"
    failed=$((failed + 1))
  fi
}

for t in "$build"/tests/gpu/test_*; do
  [ -x "$t" ] || continue
  echo "== $t"
  timeout "$limit" "$t" >"$log" 2>&1; tally $?
  echo "== $t (SHARD_NO_LT_EPILOGUE=1)"
  SHARD_NO_LT_EPILOGUE=1 timeout "$limit" "$t" >"$log" 2>&1; tally $?
done

for s in tests/gpu/*.lua; do
  [ -f "$s" ] || continue
  [ "$(basename "$s")" = support.lua ] && continue   # the scripts' shared helpers
  echo "== $s"
  case $(basename "$s") in
    mpi_*) timeout "$limit" mpirun --allow-run-as-root -np 1 "$host" run "$s" >"$log" 2>&1; tally $? ;;
    torchrun_*)   # a torchrun-style environment with MASTER_PORT held, as torchrun's store holds it
      port=$(( 20000 + $$ % 20000 ))
      MASTER_PORT=$port SHARD_HOLD_PORT=1 "$host" run "$s" >/dev/null 2>&1 &
      holder=$!
      sleep 1
      RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout "$limit" "$host" run "$s" >"$log" 2>&1; tally $?
      kill "$holder" 2>/dev/null ;;
    *) timeout "$limit" "$host" run "$s" >"$log" 2>&1; tally $? ;;
  esac
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
