#!/bin/sh
# The cost of --deterministic (FSDP's deterministic mode, lua/shard/fsdp/determ.lua): the
# Shakespeare recipe's loop at world 1 and 2 (full_shard), the default mode and
# --deterministic alternating in each round (the order reversed in the next), DET_ITERS steps
# each. Per run: tokens/s (the metrics line's median over the loop's windows after the first),
# rank 0's CPU milliseconds per step (cpu_ms_per_iter: every thread's, so the machine's load
# does not stretch it as it stretches wall time) and the memory peak (the metrics line's
# peak_bytes, the largest over the ranks). Reports the medians over ROUNDS with [min-max], and
# deterministic / default for each (the CPU figure as default / deterministic: a throughput).
# Knobs: ROUNDS=3 DET_ITERS=150 WORLDS="1 2"; SHARD_DATA as the recipe takes it.
# make bench runs it after the AdamW step; sh bench/deterministic.sh runs it alone.
cd "$(dirname "$0")/.." || exit 2
ROUNDS=${ROUNDS:-3}
ITERS=${DET_ITERS:-150}
WORLDS=${WORLDS:-1 2}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"
data=$(mktemp)
out=$(mktemp -d)
trap 'rm -rf "$data" "$out"' EXIT

one() {   # one WORLD MODE ROUND: appends "world mode tokens_per_s peak_bytes cpu_ms_per_iter"
  flag=""; [ "$2" = deterministic ] && flag=--deterministic
  line=$($MPIRUN -np "$1" bin/shard run recipes/gpt_shakespeare_char.lua --strategy=full_shard $flag --demo \
           --max_iters="$ITERS" --log_interval=50 --eval_interval=100000 --eval_iters=1 --sample_tokens=0 \
           --out_dir="$out/w$1" 2>&1 | grep '^metrics ') || { echo "bench deterministic: world $1 $2 failed" >&2; exit 1; }
  tps=$(echo "$line" | sed -n 's/.*"tokens_per_s":\([0-9.e+]*\).*/\1/p')
  peak=$(echo "$line" | sed -n 's/.*"peak_bytes":\([0-9.e+]*\).*/\1/p')
  cpu=$(echo "$line" | sed -n 's/.*"cpu_ms_per_iter":\([0-9.e+]*\).*/\1/p')
  [ -n "$tps" ] && [ -n "$peak" ] && [ -n "$cpu" ] || { echo "bench deterministic: no figures in: $line" >&2; exit 1; }
  echo "$1 $2 $tps $peak $cpu" >> "$data"
}

echo "deterministic mode: the recipe's loop, full_shard, $ITERS steps, $ROUNDS round(s) ($(bin/shard cpu | sed -n 's/^model: //p'))"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  for w in $WORLDS; do
    if [ $((r % 2)) -eq 1 ]; then one "$w" default; one "$w" deterministic
    else one "$w" deterministic; one "$w" default; fi
  done
  r=$((r + 1))
done

awk '
  { k = $1 " " $2; n[k]++; tps[k, n[k]] = $3; pk[k, n[k]] = $4; cpu[k, n[k]] = $5; if (!($1 in seen)) { seen[$1] = 1; W[++nw] = $1 } }
  function sorted_med(a, k, c,   i, j, t, v) {
    for (i = 1; i <= c; i++) v[i] = a[k, i]
    for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    lo = v[1]; hi = v[c]
    return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
  }
  END {
    printf "  %-6s %-24s %-24s %-8s %-20s %-20s %-8s %-12s %-12s %s\n", "world", "default tokens/s", "deterministic tokens/s", "det/def", "default CPU ms/step", "determ. CPU ms/step", "def/det", "default MiB", "determ. MiB", "det/def"
    for (i = 1; i <= nw; i++) {
      w = W[i]; d = w " default"; e = w " deterministic"
      md = sorted_med(tps, d, n[d]); dl = lo; dh = hi
      me = sorted_med(tps, e, n[e]); el = lo; eh = hi
      cd = sorted_med(cpu, d, n[d]); cl = lo; ch = hi
      ce = sorted_med(cpu, e, n[e]); xl = lo; xh = hi
      pd = sorted_med(pk, d, n[d]) / 1048576; pe = sorted_med(pk, e, n[e]) / 1048576
      printf "  %-6s %-24s %-24s %-8s %-20s %-20s %-8s %-12s %-12s %.3f\n", w, sprintf("%.0f [%.0f-%.0f]", md, dl, dh), sprintf("%.0f [%.0f-%.0f]", me, el, eh),
        sprintf("%.3f", me / md), sprintf("%.1f [%.1f-%.1f]", cd, cl, ch), sprintf("%.1f [%.1f-%.1f]", ce, xl, xh), sprintf("%.3f", cd / ce),
        sprintf("%.1f", pd), sprintf("%.1f", pe), pe / pd
      printf "deterministic_ratio_%s %.3f\ndeterministic_cpu_ratio_%s %.3f\ndeterministic_peak_ratio_%s %.3f\n", w, me / md, w, cd / ce, w, pe / pd
    }
  }' "$data"
