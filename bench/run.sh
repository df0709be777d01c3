#!/bin/sh
# make bench: every benchmark beside its peer, measured in the same invocation.
#   cpu_train   the Shakespeare model's training step (bench/cpu_train.lua), shard vs PyTorch
#               1.13 eager (bench/peers/nanogpt_cpu.py, /usr/bin/python3) at each thread count
#               of THREADS, rounds alternating the two systems (the one first in a round goes
#               second in the next); with them, each round, the machine's f32 peak: an
#               OpenBLAS sgemm of a PEAK_N square at the same threads (bench/peak_sgemm.c).
#               Reports medians over the rounds with their spread [min-max] for every figure;
#               the headline is the ratio of bests (shard at its best thread count over PyTorch
#               at its own), then the same-thread ratios, then the step's GFLOP/s against the
#               peak. A system that fails or prints no figure is an error (exit 1).
#   gpt2_124m   (only with a GPU) see bench/gpt2_124m.lua.
# Knobs (whole numbers):  ROUNDS=3  ITERS=50  THREADS="1 $(nproc)"  PEAK_N=2048
cd "$(dirname "$0")/.." || exit 2

die() { echo "bench: $*" >&2; exit 1; }
whole() {   # whole NAME VALUE: VALUE must be a whole number >= 1
  case "$2" in ''|*[!0-9]*) die "$1 must be a whole number >= 1, not '$2'";; esac
  [ "$2" -ge 1 ] 2>/dev/null || die "$1 must be a whole number >= 1, not '$2'"
}

ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-50}
PEAK_N=${PEAK_N:-2048}
THREADS=${THREADS:-"1 $(nproc)"}
whole ROUNDS "$ROUNDS"; whole ITERS "$ITERS"; whole PEAK_N "$PEAK_N"
threads=""
set -f   # THREADS is split on blanks, never globbed; every word is checked before use
for t in $THREADS; do
  whole THREADS "$t"
  case " $threads " in *" $t "*) ;; *) threads="$threads $t";; esac
done
[ -n "$threads" ] || die "THREADS names no thread count"
export OMP_WAIT_POLICY=passive   # the same for both; idle OpenMP threads must not spin

# The peer: PyTorch in /usr/bin/python3, installed (or named) by bench/deps.sh.
PY=/usr/bin/python3
sh bench/deps.sh || exit 1
[ -x bin/shard ] || die "bin/shard is missing: run make first"

# The peak: built here, beside the other build outputs.
PEAK=build/bench/peak_sgemm
if [ ! -x "$PEAK" ] || [ bench/peak_sgemm.c -nt "$PEAK" ]; then
  mkdir -p build/bench && "${CC:-cc}" -O2 bench/peak_sgemm.c -lopenblas -o "$PEAK" ||
    die "could not build $PEAK (needs libopenblas-dev: make deps)"
fi

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
data="$tmp/data"; : >"$data"

# measure NAME THREADS ROUND KEY COMMAND...: runs COMMAND with OMP_NUM_THREADS=THREADS, takes
# the value of its "KEY N" line, appends "NAME THREADS ROUND N" to the data; an error if the
# command fails or prints no such line (its output's tail is shown).
measure() {
  m_name=$1 m_t=$2 m_r=$3 m_key=$4; shift 4
  OMP_NUM_THREADS=$m_t "$@" >"$tmp/out" 2>&1
  rc=$?
  v=$(sed -n "s/^$m_key \\([0-9][0-9.eE+-]*\\)\$/\\1/p" "$tmp/out" | tail -n 1)
  if [ "$rc" -ne 0 ] || [ -z "$v" ] || ! awk -v x="$v" 'BEGIN { exit !(x + 0 > 0) }'; then
    echo "bench: $m_name failed at $m_t threads, round $m_r (exit $rc, ${v:-no} $m_key); its output ends:" >&2
    tail -n 20 "$tmp/out" >&2
    exit 1
  fi
  echo "$m_name $m_t $m_r $v" >>"$data"
  for extra in flops_per_token torch_version; do
    x=$(sed -n "s/^$extra //p" "$tmp/out" | tail -n 1)
    [ -n "$x" ] && echo "$x" >"$tmp/$extra"
  done
  return 0
}

shard() { measure shard "$1" "$2" tokens_per_s bin/shard run bench/cpu_train.lua --iters="$ITERS"; }
torch() { measure pytorch "$1" "$2" tokens_per_s "$PY" bench/peers/nanogpt_cpu.py --iters "$ITERS" --threads "$1"; }

echo "cpu_train: $ROUNDS round(s) of $ITERS steps, threads:$threads, peak sgemm ${PEAK_N}^2 (load now: $(cut -d' ' -f1-3 /proc/loadavg))"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  line="round $r:"
  for t in $threads; do
    measure peak "$t" "$r" gflops "$PEAK" "$PEAK_N" "$t" 5
    if [ $((r % 2)) -eq 1 ]; then shard "$t" "$r"; torch "$t" "$r"; else torch "$t" "$r"; shard "$t" "$r"; fi
    line="$line  ${t}t shard $(awk -v t="$t" -v r="$r" '$1 == "shard" && $2 == t && $3 == r {print $4}' "$data")"
    line="$line pytorch $(awk -v t="$t" -v r="$r" '$1 == "pytorch" && $2 == t && $3 == r {print $4}' "$data")"
    line="$line peak $(awk -v t="$t" -v r="$r" '$1 == "peak" && $2 == t && $3 == r {print $4}' "$data") GFLOP/s;"
  done
  echo "$line"
  r=$((r + 1))
done

fpt=$(cat "$tmp/flops_per_token" 2>/dev/null)
whole flops_per_token "$fpt"
tv=$(cat "$tmp/torch_version" 2>/dev/null)
awk -v fpt="$fpt" -v tv="${tv:-?}" -v threads="$threads" -v rounds="$ROUNDS" '
  { v[$1, $2, $3] = $4 }
  function med(name, t,   n, a, i, j, x) {
    n = 0; for (i = 1; i <= rounds; i++) a[++n] = v[name, t, i]
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function lo(name, t,   i, m) { m = v[name, t, 1]; for (i = 2; i <= rounds; i++) if (v[name, t, i] < m) m = v[name, t, i]; return m }
  function hi(name, t,   i, m) { m = v[name, t, 1]; for (i = 2; i <= rounds; i++) if (v[name, t, i] > m) m = v[name, t, i]; return m }
  # per-round ratios shard at ts / pytorch at tp: their min and max
  function rlo(ts, tp,   i, m, x) { m = 1e30; for (i = 1; i <= rounds; i++) { x = v["shard", ts, i] / v["pytorch", tp, i]; if (x < m) m = x }; return m }
  function rhi(ts, tp,   i, m, x) { m = 0; for (i = 1; i <= rounds; i++) { x = v["shard", ts, i] / v["pytorch", tp, i]; if (x > m) m = x }; return m }
  function tok(name, t) { return sprintf("%.0f [%.0f-%.0f]", med(name, t), lo(name, t), hi(name, t)) }
  function gf(name, t, s) { s = fpt / 1e9; return sprintf("%.1f [%.1f-%.1f]", med(name, t) * s, lo(name, t) * s, hi(name, t) * s) }
  END {
    nt = split(threads, T, " ")
    bs = T[1]; bp = T[1]
    for (i = 2; i <= nt; i++) { if (med("shard", T[i]) > med("shard", bs)) bs = T[i]; if (med("pytorch", T[i]) > med("pytorch", bp)) bp = T[i] }
    best = med("shard", bs) / med("pytorch", bp)
    printf "\ncpu_train, tokens/s: median [min-max] over %d rounds; ratios: of the medians [min-max of the per-round ratios]\n", rounds
    printf "  %-8s %-26s %-26s %s\n", "threads", "shard", "pytorch " tv, "shard/pytorch"
    for (i = 1; i <= nt; i++) {
      t = T[i]
      printf "  %-8s %-26s %-26s %.2fx [%.2f-%.2f]\n", t, tok("shard", t), tok("pytorch", t), med("shard", t) / med("pytorch", t), rlo(t, t), rhi(t, t)
    }
    printf "ratio of bests: shard at %d thread%s %.0f / pytorch at %d thread%s %.0f = %.2fx [%.2f-%.2f]\n",
      bs, bs == 1 ? "" : "s", med("shard", bs), bp, bp == 1 ? "" : "s", med("pytorch", bp), best, rlo(bs, bp), rhi(bs, bp)
    printf "\nGFLOP/s of the step (%.2f MFLOP/token of matmuls, bench/cpu_train.lua) against the peak: an OpenBLAS sgemm,\n", fpt / 1e6
    printf "same threads, same rounds; \"of peak\" takes the step median over the best sgemm seen (load only lowers a peak)\n"
    printf "  %-8s %-22s %-22s %-22s %s\n", "threads", "shard", "pytorch", "peak sgemm", "of peak: shard, pytorch"
    for (i = 1; i <= nt; i++) {
      t = T[i]; p = hi("peak", t)
      printf "  %-8s %-22s %-22s %-22s %.0f%%, %.0f%%\n", t, gf("shard", t), gf("pytorch", t),
        sprintf("%.1f [%.1f-%.1f]", med("peak", t), lo("peak", t), hi("peak", t)), 100 * med("shard", t) * fpt / 1e9 / p, 100 * med("pytorch", t) * fpt / 1e9 / p
    }
    # plain "name number" lines, for shard sweep and scripts
    printf "\nratio_best %.3f\n", best
    for (i = 1; i <= nt; i++) {
      t = T[i]
      printf "shard_tokens_per_s_%dt %.1f\npytorch_tokens_per_s_%dt %.1f\nratio_%dt %.3f\npeak_gflops_%dt %.1f\n",
        t, med("shard", t), t, med("pytorch", t), t, med("shard", t) / med("pytorch", t), t, hi("peak", t)
    }
  }' "$data" || exit 1

# GPT-2 124M on the GPU, shard then its PyTorch peer in the same invocation.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "gpt2_124m shard:"; bin/shard run bench/gpt2_124m.lua || die "gpt2_124m (shard) failed"
  echo "gpt2_124m pytorch:"; python3 bench/peers/gpt2_124m_torch.py || die "gpt2_124m (pytorch) failed"
fi
exit 0
