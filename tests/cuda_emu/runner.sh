# tests/cuda_emu/runner.sh: what tests/cuda_emu/run.sh (make test's part) and
# tests/cuda_emu/long.sh (make test-long's part) share: the device's adversarial defaults, the
# counters, run_one and the summary. Sourced with EMU and SHARD set.
TIMEOUT=${SHARD_EMU_TEST_TIMEOUT:-300}
: "${SHARD_EMU_BLOCK_ORDER:=shuffle:1}"
export SHARD_EMU_BLOCK_ORDER
# Every block the caching allocator hands out is refilled with NaN (device.cu's debug option),
# so an output a kernel leaves unwritten shows on reused memory too, not only on fresh cudaMalloc.
: "${SHARD_CUDA_POISON:=1}"
export SHARD_CUDA_POISON
passed=0
failed=0
out=$(mktemp)
scratch=$(mktemp -d)
trap 'rm -f "$out"; rm -rf "$scratch"' EXIT
start=$(date +%s)
EMU_RUNNER=1

run_one() {   # name, command...
  name=$1; shift
  t0=$(date +%s)
  timeout -k 10 "$TIMEOUT" "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s)
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
  if [ -z "$line" ]; then
    failed=$((failed + 1))
    echo "FAIL $name (exit $rc, no summary line)"
    sed 's/^/    /' "$out" | tail -n 40
    return
  fi
  p=$(echo "$line" | sed -E 's/.*[^0-9]([0-9]+) passed, ([0-9]+) failed$/\1/')
  f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then
    [ "$f" -ne 0 ] || failed=$((failed + 1))
    echo "FAIL $name ($f failed, exit $rc, $((t1 - t0))s)"
    grep -E '^(not ok|FAIL|cuda_emu:)' "$out" | sed 's/^/    /' | head -n 60
  else
    echo "ok   $name: $p passed ($((t1 - t0))s)"
  fi
}

# Ranks as separate processes over the NCCL stand-in (nccl.cpp).
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"

finish() {
  echo "cuda_emu: $(( $(date +%s) - start ))s"
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
