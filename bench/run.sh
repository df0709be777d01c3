#!/bin/sh
# make bench: every benchmark beside its peer, measured in the same invocation.
#   cpu_train   the Shakespeare model's training step (bench/cpu_train.lua), shard vs PyTorch
#               1.13 eager (bench/peers/nanogpt_cpu.py, /usr/bin/python3) at each thread count
#               of THREADS, rounds alternating the systems (the order of a round is reversed in
#               the next); with them, each round, the machine's f32 peak: an OpenBLAS sgemm of a
#               PEAK_N square at the same threads (bench/peak_sgemm.c).
#               shard runs with its own wait setting (runtime/parallel.h: idle threads spin
#               up to 200 us while they have their cores to themselves, then sleep); PyTorch with
#               OMP_WAIT_POLICY=passive, and with PEER_SPIN=1 also at each count above 1 with
#               libgomp's default wait policy (spin, then sleep), the setting "N spin", so that
#               neither choice of wait policy can depress PyTorch's best.
#               Reports medians over the rounds with their spread [min-max] for every figure;
#               the headline is the ratio of bests (shard at its best setting over PyTorch at
#               its own), then the same-setting ratios, then the step's GFLOP/s against the
#               peak. A system that fails or prints no positive figure is an error (exit 1).
#   adamw       the CPU AdamW step on GPT-2 124M's parameters, shard vs torch.optim.AdamW
#               (foreach off and on) beside the machine's memory bandwidth: bench/adamw.sh.
#   cpu_train_bf16  the same step in bf16: shard's --dtype=bf16 (FSDP mixed precision, f32
#               master weights; the linear layers' GEMMs on AVX-512 BF16 where the CPU has it)
#               vs PyTorch's torch.autocast("cpu", dtype=torch.bfloat16) (nanogpt_cpu.py --bf16),
#               same rounds, alternation and settings as cpu_train; the headline is again the
#               ratio of bests. BENCH=bf16 runs only this part, BENCH=f32 all but this part,
#               BENCH=train only cpu_train (with the recipe loop).
#   gpt2_124m   (only with a GPU) see bench/gpt2_124m.lua.
#               With them, each round, the recipe's own loop (recipes/gpt_shakespeare_char.lua
#               through lua/shard/train.lua, RECIPE_ITERS steps, its data and logging): its
#               tokens/s is the median of the loop's 50-step windows after the first step (its
#               metrics line), and its
#               ratio of bests is taken against the same PyTorch best as cpu_train's.
#               Its corpus is tinyshakespeare.txt where the recipe looks for it (SHARD_DATA, else
#               ../shared/data), else make run's demo text (--demo), so the bench runs in any
#               clone; the report names the one used.
# Knobs (whole numbers):  ROUNDS=3  ITERS=50  THREADS="1 $(nproc)"  PEAK_N=2048  PEER_SPIN=1
#                         RECIPE_ITERS=300; and SHARD_DATA=DIR (DIR/tinyshakespeare.txt)
cd "$(dirname "$0")/.." || exit 2

die() { echo "bench: $*" >&2; exit 1; }
whole() {   # whole NAME VALUE: VALUE must be a whole number >= 1
  case "$2" in ''|*[!0-9]*) die "$1 must be a whole number >= 1, not '$2'";; esac
  [ "$2" -ge 1 ] 2>/dev/null || die "$1 must be a whole number >= 1, not '$2'"
}

ROUNDS=${ROUNDS:-3}
BENCH=${BENCH:-all}
case "$BENCH" in all|f32|bf16|train) ;; *) die "BENCH must be all, f32, bf16 or train, not '$BENCH'";; esac
ITERS=${ITERS:-50}
PEAK_N=${PEAK_N:-2048}
PEER_SPIN=${PEER_SPIN:-1}
RECIPE_ITERS=${RECIPE_ITERS:-300}
case "$PEER_SPIN" in 0|1) ;; *) die "PEER_SPIN must be 0 or 1, not '$PEER_SPIN'";; esac
THREADS=${THREADS:-"1 $(nproc)"}
whole ROUNDS "$ROUNDS"; whole ITERS "$ITERS"; whole PEAK_N "$PEAK_N"; whole RECIPE_ITERS "$RECIPE_ITERS"
threads=""
set -f   # THREADS is split on blanks, never globbed; every word is checked before use
for t in $THREADS; do
  whole THREADS "$t"
  case " $threads " in *" $t "*) ;; *) threads="$threads $t";; esac
done
[ -n "$threads" ] || die "THREADS names no thread count"
unset OMP_WAIT_POLICY GOMP_SPINCOUNT   # shard picks its own; PyTorch's settings are named below

# The recipe loop's corpus, found before anything is installed: the paths of
# lua/shard/train.lua (SHAKESPEARE and --demo's DEMO_TEXT).
shakespeare=${SHARD_DATA:-../shared/data}/tinyshakespeare.txt
demo_text=/usr/share/common-licenses/GPL-3
if [ "$BENCH" = bf16 ]; then
  demo=""; corpus=""
elif [ -r "$shakespeare" ]; then
  demo=""; corpus=$shakespeare
elif [ -r "$demo_text" ]; then
  demo=--demo; corpus="$demo_text (make run's demo text: $shakespeare is missing)"
else
  die "no corpus for the recipe loop: neither $shakespeare (SHARD_DATA=DIR names its folder) nor $demo_text exists"
fi
[ -z "$corpus" ] || echo "bench: the recipe loop trains on $corpus"

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

# measure NAME SETTING ROUND KEY COMMAND...: runs COMMAND, takes the value of its "KEY N" line,
# appends "NAME SETTING ROUND N" to the data; an error if the command fails or prints no such
# line with a positive number (its output's tail is shown).
measure() {
  m_name=$1 m_set=$2 m_r=$3 m_key=$4; shift 4
  "$@" >"$tmp/out" 2>&1
  rc=$?
  v=$(sed -n "s/^$m_key \\([0-9][0-9.eE+-]*\\)\$/\\1/p" "$tmp/out" | tail -n 1)
  if [ "$rc" -ne 0 ] || [ -z "$v" ] || ! awk -v x="$v" 'BEGIN { exit !(x + 0 > 0) }'; then
    echo "bench: $m_name failed at setting $m_set, round $m_r (exit $rc, ${v:-no} $m_key); its output ends:" >&2
    tail -n 20 "$tmp/out" >&2
    exit 1
  fi
  echo "$m_name $m_set $m_r $v" >>"$data"
  for extra in flops_per_token torch_version; do
    x=$(sed -n "s/^$extra //p" "$tmp/out" | tail -n 1)
    [ -n "$x" ] && echo "$x" >"$tmp/$extra"
  done
  return 0
}

# THREADS ROUND
shard() { measure shard "$1" "$2" tokens_per_s env OMP_NUM_THREADS="$1" bin/shard run bench/cpu_train.lua --iters="$ITERS"; }
torch() { measure pytorch "$1" "$2" tokens_per_s env OMP_WAIT_POLICY=passive OMP_NUM_THREADS="$1" "$PY" bench/peers/nanogpt_cpu.py --iters "$ITERS" --threads "$1"; }
torch_spin() {
  measure pytorch "${1}s" "$2" tokens_per_s env OMP_NUM_THREADS="$1" "$PY" bench/peers/nanogpt_cpu.py --iters "$ITERS" --threads "$1"
}
# THREADS: the recipe's loop, its metrics line's tokens/s as a "tokens_per_s N" line.
recipe_loop() {
  env OMP_NUM_THREADS="$1" bin/shard run recipes/gpt_shakespeare_char.lua $demo --max_iters="$RECIPE_ITERS" \
    --eval_interval="$RECIPE_ITERS" --eval_iters=1 --sample_tokens=0 --out_dir="$tmp/recipe" >"$tmp/recipe.out" 2>&1
  rc=$?
  cat "$tmp/recipe.out"
  sed -n 's/^metrics .*"tokens_per_s":\([0-9.eE+-]*\).*/tokens_per_s \1/p' "$tmp/recipe.out"
  return $rc
}
recipe() { measure recipe "$1" "$2" tokens_per_s recipe_loop "$1"; }
peak() { measure peak "$1" "$2" gflops "$PEAK" "$PEAK_N" "$1" 5; }

psettings=""   # PyTorch's settings: a thread count, or a count and s (libgomp's default wait)
for t in $threads; do
  psettings="$psettings $t"
  [ "$PEER_SPIN" = 1 ] && [ "$t" -gt 1 ] && psettings="$psettings ${t}s"
done

# ---- cpu_train_bf16 -------------------------------------------------------------------------
# bf16_report: medians [min-max] per setting, the ratio of bests, the same-setting ratios.
bf16_report() {
  awk -v threads="$threads" -v psettings="$psettings" -v rounds="$ROUNDS" '
    { v[$1, $2, $3] = $4 }
    function med(name, k,   n, a, i, j, x) {
      n = 0; for (i = 1; i <= rounds; i++) a[++n] = v[name, k, i]
      for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function span(name, k,   i, lo, hi) {
      lo = hi = v[name, k, 1]
      for (i = 2; i <= rounds; i++) { if (v[name, k, i] < lo) lo = v[name, k, i]; if (v[name, k, i] > hi) hi = v[name, k, i] }
      return sprintf("%.0f [%.0f-%.0f]", med(name, k), lo, hi)
    }
    function label(k) { return k ~ /s$/ ? (k + 0) " spin" : (k + 0 == 1 ? "1 thread" : k " threads") }
    END {
      nt = split(threads, T, " "); np = split(psettings, P, " "); bs = T[1]; bp = P[1]
      for (i = 2; i <= nt; i++) if (med("shard_bf16", T[i]) > med("shard_bf16", bs)) bs = T[i]
      for (i = 2; i <= np; i++) if (med("pytorch_bf16", P[i]) > med("pytorch_bf16", bp)) bp = P[i]
      best = med("shard_bf16", bs) / med("pytorch_bf16", bp)
      printf "\ncpu_train_bf16, ratio of bests: shard --dtype=bf16 at %s %.0f tokens/s / pytorch autocast bf16 at %s %.0f tokens/s = %.2fx\n",
        label(bs), med("shard_bf16", bs), label(bp), med("pytorch_bf16", bp), best
      printf "  %-10s %-24s %-24s %s\n", "setting", "shard bf16", "pytorch autocast bf16", "shard/pytorch"
      for (i = 1; i <= np; i++) {
        k = P[i]; t = k + 0
        printf "  %-10s %-24s %-24s %.2fx\n", label(k), span("shard_bf16", t), span("pytorch_bf16", k), med("shard_bf16", t) / med("pytorch_bf16", k)
      }
      printf "\nratio_bf16_best %.3f\n", best
      for (i = 1; i <= nt; i++) printf "shard_bf16_tokens_per_s_%dt %.1f\n", T[i], med("shard_bf16", T[i])
      for (i = 1; i <= np; i++) { k = P[i]; printf "pytorch_bf16_tokens_per_s_%st%s %.1f\n", k + 0, k ~ /s$/ ? "_spin" : "", med("pytorch_bf16", k) }
    }' "$data"
}

# THREADS ROUND: both systems in bf16, in cpu_train's order (reversed every other round).
shard_bf16() { measure shard_bf16 "$1" "$2" tokens_per_s env OMP_NUM_THREADS="$1" bin/shard run bench/cpu_train.lua --iters="$ITERS" --dtype=bf16; }
torch_bf16() { measure pytorch_bf16 "$1" "$2" tokens_per_s env OMP_WAIT_POLICY=passive OMP_NUM_THREADS="$1" "$PY" bench/peers/nanogpt_cpu.py --iters "$ITERS" --threads "$1" --bf16; }
torch_bf16_spin() {
  measure pytorch_bf16 "${1}s" "$2" tokens_per_s env OMP_NUM_THREADS="$1" "$PY" bench/peers/nanogpt_cpu.py --iters "$ITERS" --threads "$1" --bf16
}
bench_bf16() {
  echo "cpu_train_bf16: $ROUNDS round(s) of $ITERS steps, threads:$threads (load now: $(cut -d' ' -f1-3 /proc/loadavg))"
  r=1
  while [ "$r" -le "$ROUNDS" ]; do
    for t in $threads; do
      spin=""
      [ "$PEER_SPIN" = 1 ] && [ "$t" -gt 1 ] && spin=1
      if [ $((r % 2)) -eq 1 ]; then
        shard_bf16 "$t" "$r"; torch_bf16 "$t" "$r"; [ -n "$spin" ] && torch_bf16_spin "$t" "$r"
      else
        [ -n "$spin" ] && torch_bf16_spin "$t" "$r"; torch_bf16 "$t" "$r"; shard_bf16 "$t" "$r"
      fi
    done
    r=$((r + 1))
  done
  bf16_report
}
if [ "$BENCH" = bf16 ]; then bench_bf16; exit $?; fi
# ---- end of cpu_train_bf16 (run after cpu_train and adamw below unless BENCH=f32) --------------

echo "cpu_train: $ROUNDS round(s) of $ITERS steps, threads:$threads, peak sgemm ${PEAK_N}^2 (load now: $(cut -d' ' -f1-3 /proc/loadavg))"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  for t in $threads; do
    peak "$t" "$r"
    spin=""
    [ "$PEER_SPIN" = 1 ] && [ "$t" -gt 1 ] && spin=1
    if [ $((r % 2)) -eq 1 ]; then
      shard "$t" "$r"; torch "$t" "$r"; [ -n "$spin" ] && torch_spin "$t" "$r"; recipe "$t" "$r"
    else
      recipe "$t" "$r"; [ -n "$spin" ] && torch_spin "$t" "$r"; torch "$t" "$r"; shard "$t" "$r"
    fi
  done
  awk -v r="$r" '$3 == r { s = $2; sub(/s$/, " spin", s); x[$1] = x[$1] sprintf("  %s: %s", s, $4) }
    END { printf "round %d  tokens/s shard%s | pytorch%s | recipe loop%s | peak GFLOP/s%s\n", r, x["shard"], x["pytorch"], x["recipe"], x["peak"] }' "$data"
  r=$((r + 1))
done

fpt=$(cat "$tmp/flops_per_token" 2>/dev/null)
whole flops_per_token "$fpt"
tv=$(cat "$tmp/torch_version" 2>/dev/null)
awk -v fpt="$fpt" -v tv="${tv:-?}" -v riters="$RECIPE_ITERS" -v corpus="${demo:+--demo, }$(basename "${corpus%% *}")" -v threads="$threads" -v psettings="$psettings" -v rounds="$ROUNDS" '
  { v[$1, $2, $3] = $4 }
  function med(name, k,   n, a, i, j, x) {
    n = 0; for (i = 1; i <= rounds; i++) a[++n] = v[name, k, i]
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function lo(name, k,   i, m) { m = v[name, k, 1]; for (i = 2; i <= rounds; i++) if (v[name, k, i] < m) m = v[name, k, i]; return m }
  function hi(name, k,   i, m) { m = v[name, k, 1]; for (i = 2; i <= rounds; i++) if (v[name, k, i] > m) m = v[name, k, i]; return m }
  # the per-round ratios name (shard unless given) at setting ks / pytorch at setting kp: their min and max
  function rlo(ks, kp, name,   i, m, x) { m = 1e30; for (i = 1; i <= rounds; i++) { x = v[name ? name : "shard", ks, i] / v["pytorch", kp, i]; if (x < m) m = x }; return m }
  function rhi(ks, kp, name,   i, m, x) { m = 0; for (i = 1; i <= rounds; i++) { x = v[name ? name : "shard", ks, i] / v["pytorch", kp, i]; if (x > m) m = x }; return m }
  function tok(name, k) { return sprintf("%.0f [%.0f-%.0f]", med(name, k), lo(name, k), hi(name, k)) }
  function gf(name, k, s) { s = fpt / 1e9; return sprintf("%.1f [%.1f-%.1f]", med(name, k) * s, lo(name, k) * s, hi(name, k) * s) }
  function label(k) { return k ~ /s$/ ? (k + 0) " spin" : (k + 0 == 1 ? "1 thread" : k " threads") }
  END {
    nt = split(threads, T, " "); np = split(psettings, P, " ")
    bs = T[1]; bp = P[1]
    for (i = 2; i <= nt; i++) if (med("shard", T[i]) > med("shard", bs)) bs = T[i]
    for (i = 2; i <= np; i++) if (med("pytorch", P[i]) > med("pytorch", bp)) bp = P[i]
    best = med("shard", bs) / med("pytorch", bp)
    printf "\ncpu_train, ratio of bests: shard at %s %.0f tokens/s / pytorch at %s %.0f tokens/s = %.2fx [%.2f-%.2f]\n",
      label(bs), med("shard", bs), label(bp), med("pytorch", bp), best, rlo(bs, bp), rhi(bs, bp)
    br = T[1]
    for (i = 2; i <= nt; i++) if (med("recipe", T[i]) > med("recipe", br)) br = T[i]
    rbest = med("recipe", br) / med("pytorch", bp)
    printf "recipe loop (recipes/gpt_shakespeare_char.lua on %s, %d steps), ratio of bests: shard at %s %s tokens/s / pytorch at %s = %.2fx [%.2f-%.2f]\n",
      corpus, riters, label(br), tok("recipe", br), label(bp), rbest, rlo(br, bp, "recipe"), rhi(br, bp, "recipe")
    printf "tokens/s: median [min-max] over %d round(s); ratios: of the medians [min-max of the per-round ratios]\n", rounds
    printf "  %-10s %-24s %-24s %s\n", "setting", "shard", "pytorch " tv, "shard/pytorch"
    for (i = 1; i <= np; i++) {
      k = P[i]; t = k + 0
      printf "  %-10s %-24s %-24s %.2fx [%.2f-%.2f]\n", label(k), tok("shard", t), tok("pytorch", k), med("shard", t) / med("pytorch", k), rlo(t, k), rhi(t, k)
    }
    if (psettings ~ /s/) printf "  (PyTorch: OMP_WAIT_POLICY=passive, N spin: libgomp'"'"'s default wait policy; shard: its own setting, a spin of up to 200 us while alone on its cores, then sleep)\n"
    printf "\nGFLOP/s of the step (%.2f MFLOP/token of matmuls, bench/cpu_train.lua) against the peak: an OpenBLAS sgemm\n", fpt / 1e6
    printf "at the same threads in the same rounds; \"of peak\": the step'"'"'s median over the best sgemm seen (load only lowers a peak)\n"
    printf "  %-10s %-20s %-20s %-22s %s\n", "setting", "shard", "pytorch", "peak sgemm", "of peak: shard, pytorch"
    for (i = 1; i <= np; i++) {
      k = P[i]; t = k + 0; p = hi("peak", t)
      printf "  %-10s %-20s %-20s %-22s %.0f%%, %.0f%%\n", label(k), gf("shard", t), gf("pytorch", k),
        sprintf("%.1f [%.1f-%.1f]", med("peak", t), lo("peak", t), hi("peak", t)), 100 * med("shard", t) * fpt / 1e9 / p, 100 * med("pytorch", k) * fpt / 1e9 / p
    }
    # plain "name number" lines (medians; the peak: the best seen), for shard sweep and scripts
    printf "\nratio_best %.3f\nratio_recipe_best %.3f\n", best, rbest
    for (i = 1; i <= nt; i++) {
      t = T[i]
      printf "shard_tokens_per_s_%dt %.1f\nrecipe_tokens_per_s_%dt %.1f\npeak_gflops_%dt %.1f\n", t, med("shard", t), t, med("recipe", t), t, hi("peak", t)
    }
    for (i = 1; i <= np; i++) {
      k = P[i]; n = (k + 0) "t" (k ~ /s$/ ? "_spin" : "")
      printf "pytorch_tokens_per_s_%s %.1f\nratio_%s %.3f\n", n, med("pytorch", k), n, med("shard", k + 0) / med("pytorch", k)
    }
  }' "$data" || exit 1

[ "$BENCH" = train ] && exit 0

# The CPU AdamW step beside PyTorch's and the machine's bandwidth, at the same thread counts
# (bench/adamw.sh; make bench-adamw runs it alone).
echo
THREADS="$threads" sh bench/adamw.sh build || exit 1

if [ "$BENCH" = all ]; then echo; bench_bf16 || exit 1; fi   # cpu_train_bf16 (its section above)

# GPT-2 124M on the GPU, shard then its PyTorch peer in the same invocation.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "gpt2_124m shard:"; bin/shard run bench/gpt2_124m.lua || die "gpt2_124m (shard) failed"
  echo "gpt2_124m pytorch:"; python3 bench/peers/gpt2_124m_torch.py || die "gpt2_124m (pytorch) failed"
fi
exit 0
