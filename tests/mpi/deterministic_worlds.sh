#!/bin/sh
# Deterministic mode at world 5-8 (make check-long; minutes on 2 cores, oversubscribed):
# tests/fixtures/deterministic_run.lua, every case, 20 steps, at world 1 and at each of WORLDS
# (default "5 6 7 8": worlds that do not divide the fixture's 12 chunks give ranks shares that
# differ by one, trees whose pieces cross rank boundaries unevenly, and hybrid groups of 2 at
# the even ones) must print the same lines, character for character; and the recipe's loop
# (a small GPT, 840 = lcm(5..8) windows a step, 5 steps) its losses and params_sha256.
# tests/spec/deterministic_spec.lua checks worlds 1-4 in make test.
# Usage: sh tests/mpi/deterministic_worlds.sh [bin/shard]
cd "$(dirname "$0")/../.." || exit 2
BIN=${1:-bin/shard}
WORLDS=${WORLDS:-5 6 7 8}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

run() {   # world -> $tmp/wN (the fixture's case lines), status
  OMP_NUM_THREADS=1 SHARD_COMM_TIMEOUT=${SHARD_COMM_TIMEOUT:-120} timeout 900 \
    $MPIRUN -np "$1" -x OMP_NUM_THREADS -x SHARD_COMM_TIMEOUT "$BIN" run tests/fixtures/deterministic_run.lua \
    >"$tmp/out$1" 2>&1
  rc=$?
  grep '^case ' "$tmp/out$1" >"$tmp/w$1"
  return $rc
}

recipe() {   # world -> $tmp/rN (the losses and the digest), status
  OMP_NUM_THREADS=1 SHARD_COMM_TIMEOUT=${SHARD_COMM_TIMEOUT:-120} timeout 900 \
    $MPIRUN -np "$1" -x OMP_NUM_THREADS -x SHARD_COMM_TIMEOUT "$BIN" run recipes/gpt_shakespeare_char.lua \
    --data=/usr/share/common-licenses/GPL-3 --deterministic --strategy=full_shard --n_layer=1 --n_embd=32 \
    --block_size=16 --batch_size=840 --max_iters=5 --log_interval=1 --eval_interval=1000 --eval_iters=1 \
    --sample_tokens=0 --out_dir="$tmp/out_r$1" >"$tmp/rout$1" 2>&1
  rc=$?
  grep -oE 'iter [0-9]+ \| loss [0-9.]+|"params_sha256":"[0-9a-f]+"' "$tmp/rout$1" >"$tmp/r$1"
  return $rc
}

if ! run 1 || [ "$(wc -l <"$tmp/w1")" -lt 9 ]; then
  echo "FAIL world 1: the reference run failed"; tail -n 20 "$tmp/out1"; echo "0 passed, 1 failed"; exit 1
fi
for n in $WORLDS; do
  t0=$(date +%s)
  if run "$n" && cmp -s "$tmp/w1" "$tmp/w$n"; then
    passed=$((passed + 1)); echo "ok   world $n: $(wc -l <"$tmp/w$n") cases equal to world 1 ($(( $(date +%s) - t0 )) s)"
  else
    failed=$((failed + 1)); echo "FAIL world $n differs from world 1 (or failed):"
    diff "$tmp/w1" "$tmp/w$n" | head -n 10 | cut -c1-200; tail -n 5 "$tmp/out$n"
  fi
done
if ! recipe 1 || [ "$(grep -c params_sha256 "$tmp/r1")" -ne 1 ]; then
  failed=$((failed + 1)); echo "FAIL the recipe at world 1 (the reference) failed"; tail -n 10 "$tmp/rout1"
else
  for n in $WORLDS; do
    if recipe "$n" && cmp -s "$tmp/r1" "$tmp/r$n"; then
      passed=$((passed + 1)); echo "ok   the recipe at world $n: losses and params_sha256 equal to world 1"
    else
      failed=$((failed + 1)); echo "FAIL the recipe at world $n differs from world 1 (or failed):"
      diff "$tmp/r1" "$tmp/r$n" | head -n 10; tail -n 5 "$tmp/rout$n"
    fi
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
