#!/bin/sh
# tests/run.sh BUILD_DIR SHARD_BIN [FILTER]: every test of shard, one summary.
#   BUILD_DIR/tests/test_*       C unit tests (each prints "C name: N passed, N failed")
#   BUILD_DIR/tests/test_mpi_*   the same under mpirun at world sizes 1..4
#   tests/spec/*_spec.lua        busted specs, one process per file, run through SHARD_BIN
#                                (repl_pty_spec drives the REPL through BUILD/tests/pty/ptyexpect)
#   tests/mpi/*.lua              multi-process scripts under mpirun -np 1..4 (pass = exit 0; support.lua
#                                is what they share)
#   tests/netns/run.sh           multi-host runs across network namespaces (root)
#   tests/cuda_emu/run.sh        the CUDA path on the emulated device, when SHARD_EMU_BUILD is set
#   tools/check_layers.lua       runtime/'s layers from its includes and its objects' symbols
#   tools/gpu_report.lua         the kernels' registers, shared memory and spills (BUILD/kernels/*.ptxas)
# CPU kernel sets (runtime/cpu/cpu.h): everything runs under the set in use (SHARD_CPU_ISA, or the
# best this CPU runs); then the C tests (the op table among them) and the recipe-loss specs
# (RECIPE_SPECS) run again under one lower set this CPU runs (avx2 where lower, else the next;
# make test-long: the others), with OpenBLAS's kernels of such a CPU (OPENBLAS_CORETYPE), so that one AVX-512
# machine proves the AVX2 and baseline x86-64 paths too. Their lines carry the set:
# "ok   test_nn [avx2] (...)".
# SHARD_TEST_LONG=1 (make test-long) runs only what is too long for make test: the further
# lower sets, tests/mpi/*.sh and tests/cuda_emu/long.sh (see below).
# A passing runner prints one line; a failing one prints its output. A runner that crashes
# or times out counts as one failure. The last line is exactly "N passed, N failed", and the
# exit status is non-zero if anything failed.
# FILTER (make test T=...) is NAME or NAME:CASE: only runners whose file name contains NAME
# run; CASE goes to each of them (C tests run only the functions whose name contains it,
# busted only the tests whose name matches it, as --filter). Examples: T=ops, T=test_nn:linear,
# T=fsdp_parity, T=tensor_spec:view.
BUILD=${1:-build}
SHARD=${2:-bin/shard}
FILTER=${3:-}
NAME=${FILTER%%:*}
CASE=""
case $FILTER in *:*) CASE=${FILTER#*:} ;; esac
TIMEOUT=${SHARD_TEST_TIMEOUT:-600}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"

cd "$(dirname "$0")/.." || exit 2
export SHARD_BIN="$SHARD"   # specs that drive the CLI run the same binary
export SHARD_BUILD="$BUILD" # and find the test tools built there (tests/pty/ptyexpect)
# A clean clone (CI) has no ../shared/data: here too no test may find the corpus by default;
# a test that trains names its --data (data_spec and readme_spec use the corpus where given).
export SHARD_DATA=/nonexistent/shard-tests-have-no-default-corpus
passed=0
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# Seconds of CPU the shell's finished children have used (cutime + cstime), wall seconds.
cpu_now() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($16 + $17) / hz }' /proc/$$/stat; }
wall_now() { date +%s.%N; }

# Runs "$@" under a timeout with its output in $out; sets rc. SHARD_TEST_TIMES=FILE appends
# "cpu_s wall_s command" per run there: where make test's time goes, on a loaded machine too.
run_captured() {
  [ -z "${SHARD_TEST_TIMES:-}" ] || { t_cpu=$(cpu_now); t_wall=$(wall_now); }
  timeout -k 10 "$TIMEOUT" "$@" >"$out" 2>&1
  rc=$?
  [ -z "${SHARD_TEST_TIMES:-}" ] || awk -v c0="$t_cpu" -v c1="$(cpu_now)" -v w0="$t_wall" -v w1="$(wall_now)" \
    -v what="${SHARD_CPU_ISA:+[$SHARD_CPU_ISA] }$*" 'BEGIN { printf "%7.1f %7.1f %s\n", c1 - c0, w1 - w0, what }' >>"$SHARD_TEST_TIMES"
}

# The status of the last run, as a word for the report.
why() {
  case $rc in
    124|137) echo "timed out after ${TIMEOUT}s" ;;
    *) echo "exit $rc" ;;
  esac
}

report_fail() {   # name, reason
  echo "FAIL $1 ($2)"
  sed 's/^/    /' "$out"
}

# Adds the "C name: N passed, N failed" lines of $out to the totals; returns 1 if none.
count_c() {
  sums=$(sed -n 's/^C .*: \([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed$/\1 \2/p' "$out" |
         awk '{p += $1; f += $2} END {if (NR) print p, f}')
  [ -n "$sums" ] || return 1
  set -- $sums
  c_pass=$1 c_fail=$2
  passed=$((passed + c_pass))
  failed=$((failed + c_fail))
}

c_test() {   # name, command...
  name=$1; shift
  run_captured "$@"
  if ! count_c; then
    failed=$((failed + 1))
    report_fail "$name" "$(why), no summary line"
  elif [ "$rc" -ne 0 ] || [ "$c_fail" -ne 0 ]; then
    [ "$c_fail" -ne 0 ] || failed=$((failed + 1))   # crashed after its summary
    report_fail "$name" "$c_fail failed, $(why)"
  else
    echo "ok   $name ($c_pass passed)"
  fi
}

# True when runner $1 is selected by the filter's NAME.
selected() {
  case $1 in *"$NAME"*) return 0 ;; *) return 1 ;; esac
}

# The single-process C tests; $1 tags their names (a kernel set's run).
c_tests() {
  for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] && selected "$t" || continue
    case $(basename "$t") in test_mpi_*) continue ;; esac
    c_test "$(basename "$t")$1" "$t" $CASE
  done
}

# One busted spec file; $2 tags its name.
# busted's TAP output: "ok N - name", "not ok N - name" (then "# ..." details), and
# "ok N - # SKIP ..." for pending tests, which count as neither.
spec_test() {
  spec=$1
  run_captured "$SHARD" run tests/busted.lua -o TAP ${CASE:+--filter="$CASE"} "$spec"
  ok=$(grep -c '^ok ' "$out")
  skip=$(grep -c '^ok [0-9]* - # SKIP' "$out")
  bad=$(grep -c '^not ok ' "$out")
  ok=$((ok - skip))
  passed=$((passed + ok))
  failed=$((failed + bad))
  # No plan line ("1..N") means busted never finished the file (an os.exit, a crash).
  if [ -n "$CASE" ] && [ "$rc" -eq 0 ] && [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
    echo "--   $spec$2 (no test matches $CASE)"
  elif [ "$bad" -eq 0 ] && { [ "$rc" -ne 0 ] || [ "$ok" -eq 0 ] || ! grep -q '^1\.\.[0-9]' "$out"; }; then
    failed=$((failed + 1))
    report_fail "$spec$2" "$(why), $ok passed, no test failed: the runner itself broke"
  elif [ "$bad" -ne 0 ]; then
    report_fail "$spec$2" "$bad failed, $ok passed"
  else
    extra=""; [ "$skip" -eq 0 ] || extra=", $skip pending"
    echo "ok   $spec$2 ($ok passed$extra)"
  fi
}

# The specs whose recipes' losses depend on every CPU kernel (run again under each set).
RECIPE_SPECS="recipe_spec recipe_bf16_spec gpt_parity_spec llama_parity_spec llama_recipe_spec"

# OpenBLAS's kernels for a CPU whose best is kernel set $1 (its dynamic-arch core names);
# empty: OpenBLAS's own choice.
openblas_core() {
  case $1 in avx512) echo SkylakeX ;; avx2) echo Haswell ;; generic) echo Prescott ;; esac
}

# The set the suite runs under, and the lower ones this CPU runs (`shard cpu`).
cpu_info=$("$SHARD" cpu) || { echo "FAIL $SHARD cpu: $cpu_info"; echo "0 passed, 1 failed"; exit 1; }
isa=$(echo "$cpu_info" | sed -n 's/^in use: //p')
lower_sets=$(echo "$cpu_info" | sed -n 's/^runs: //p' | tr ' ' '\n' | sed "0,/^$isa\$/d" | tr '\n' ' ' | sed 's/ $//')
if [ -n "${SHARD_CPU_ISA:-}" ] && [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -n "$(openblas_core "$isa")" ]; then
  export OPENBLAS_CORETYPE=$(openblas_core "$isa")
fi
# make test reruns under one lower set: avx2 where it is lower than the set in use (the set of
# the AVX2-only servers), else the next lower one; make test-long under the others.
case " $lower_sets " in
  *" avx2 "*) first_lower=avx2 ;;
  *) first_lower=${lower_sets%% *} ;;
esac
other_lower=$(echo "$lower_sets" | tr ' ' '\n' | grep -vx "$first_lower" | tr '\n' ' ' | sed 's/ $//')

# A runner that prints its own lines and ends with "N passed, N failed": its lines, its totals
# added; a missing summary or a failing status with none counted is one failure. Its own
# timeouts bound it when LIMIT is 0.
suite_test() {   # limit (seconds, 0: none), script, args...
  limit=$1; shift
  t_save=$TIMEOUT; TIMEOUT=$limit
  run_captured sh "$@"
  TIMEOUT=$t_save
  sed '$d' "$out"
  set -- "$1" $(tail -n 1 "$out" | sed -n 's/^\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed$/\1 \2/p')
  if [ $# -eq 3 ]; then
    passed=$((passed + $2)); failed=$((failed + $3))
    [ "$rc" -eq 0 ] || [ "$3" -ne 0 ] || failed=$((failed + 1))
  else
    failed=$((failed + 1)); echo "FAIL $1 ($(why), no summary line)"
  fi
}

# The C tests and the recipe specs again under kernel set $1 (for the rest of the run).
lower_set() {
  export SHARD_CPU_ISA="$1" OPENBLAS_CORETYPE="$(openblas_core "$1")"
  c_tests " [$1]"
  for name in $RECIPE_SPECS; do
    spec=tests/spec/$name.lua
    [ -f "$spec" ] && selected "$spec" || continue
    spec_test "$spec" " [$1]"
  done
}

finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

# SHARD_TEST_LONG=1 (make test-long, which CI runs after make test): the runs too long for
# make test's 10 minutes: the other lower kernel sets, the multi-process scripts of minutes
# (tests/mpi/*.sh), and the emulated device's other drain orders (tests/cuda_emu/long.sh).
if [ "${SHARD_TEST_LONG:-}" = 1 ]; then
  echo "# CPU $(echo "$cpu_info" | sed -n 's/^model: //p'): make test-long${other_lower:+; C tests and recipe specs under $other_lower}"
  for script in tests/mpi/*.sh; do
    [ -f "$script" ] && selected "$script" || continue
    suite_test 0 "$script" "$SHARD"
  done
  if [ -n "${SHARD_EMU_BUILD:-}" ] && case cuda_emu in *"$NAME"*) true ;; *) false ;; esac; then
    suite_test 0 tests/cuda_emu/long.sh "$SHARD_EMU_BUILD" "$SHARD_EMU_BIN"
  fi
  for set in $other_lower; do lower_set "$set"; done
  finish
  exit
fi

echo "# CPU $(echo "$cpu_info" | sed -n 's/^model: //p'): every test under kernel set $isa${OPENBLAS_CORETYPE:+ (OpenBLAS $OPENBLAS_CORETYPE)}${first_lower:+; C tests and recipe specs under $first_lower (make test-long: ${other_lower:-none})}"

c_tests ""

# runtime/'s layers (make check-layers): no include or call from a lower layer to a higher one,
# no circle of calls among more than two runtime/ files.
if selected check_layers; then
  c_test check_layers ${LUAJIT:-luajit} tools/check_layers.lua "$BUILD"
fi

# The kernels' resources from the nvcc build's ptxas reports (make gpu-report): one check per
# kernel, failing on a spill in the attention, matmul or optimizer kernels.
if ls "$BUILD"/kernels/*.ptxas >/dev/null 2>&1 && selected gpu_report; then
  c_test gpu_report ${LUAJIT:-luajit} tools/gpu_report.lua "$BUILD"/kernels/*.ptxas
fi

for t in "$BUILD"/tests/test_mpi_*; do
  [ -x "$t" ] && selected "$t" || continue
  for n in 1 2 3 4; do
    c_test "$(basename "$t") -np $n" $MPIRUN -np "$n" "$t" $CASE
  done
done

for spec in tests/spec/*_spec.lua; do
  [ -f "$spec" ] && selected "$spec" || continue
  spec_test "$spec" ""
done

for script in tests/mpi/*.lua; do
  [ "$script" != tests/mpi/support.lua ] || continue   # what the scripts share, not a test
  [ -f "$script" ] && selected "$script" || continue
  for n in 1 2 3 4; do
    run_captured $MPIRUN -np "$n" "$SHARD" run "$script"
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1))
      echo "ok   $script -np $n"
    else
      failed=$((failed + 1))
      report_fail "$script -np $n" "$(why)"
    fi
  done
done

# Across hosts on network namespaces (tests/netns/run.sh, about 25 s, needs root: without it
# that is its one failure): its lines, its totals added.
if case netns in *"$NAME"*) true ;; *) false ;; esac; then
  suite_test "$TIMEOUT" tests/netns/run.sh "$SHARD"
fi

# The CUDA path on the emulated device (tests/cuda_emu), when the caller built it
# (make test passes SHARD_EMU_BUILD and SHARD_EMU_BIN): its runner's lines, its totals added.
if [ -n "${SHARD_EMU_BUILD:-}" ] && case cuda_emu in *"$NAME"*) true ;; *) false ;; esac; then
  suite_test 0 tests/cuda_emu/run.sh "$SHARD_EMU_BUILD" "$SHARD_EMU_BIN"
fi

# The first lower kernel set (make test-long runs the others), last: it changes the
# environment for what follows.
for set in $first_lower; do lower_set "$set"; done
finish
