#!/bin/sh
# Deterministic mode at world 5-8 (make check-long; minutes on 2 cores, oversubscribed):
# tests/fixtures/deterministic_run.lua, every case, 20 steps, at world 1 and at each of WORLDS
# (default "5 6 7 8": worlds that do not divide the fixture's 12 chunks give ranks shares that
# differ by one, trees whose pieces cross rank boundaries unevenly, and hybrid groups of 2 at
# the even ones) must print the same lines, character for character. tests/spec/
# deterministic_spec.lua checks worlds 1-4 in make test. Usage: sh tests/mpi/deterministic_worlds.sh [bin/shard]
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
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
