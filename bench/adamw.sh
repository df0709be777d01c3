#!/bin/sh
# bench/adamw.sh [BUILD]: shard's CPU AdamW step beside PyTorch 1.13's torch.optim.AdamW and
# the machine's memory bandwidth, measured in the same invocation (make bench-adamw; make
# bench runs it after cpu_train). All three step over GPT-2 124M's 148 parameter tensors
# (124,475,904 f32 elements):
#   shard    BUILD/bench/adamw_bench (bench/adamw_bench.c): sh_adamw_step_multi_, f32 grads (the
#            headline, PyTorch's setting) and bf16 grads with a bf16 shadow (mixed precision)
#   pytorch  bench/adamw_torch.py in /usr/bin/python3 (PyTorch 1.13), or in ADAMW_PY (e.g.
#            .venv-bench/bin/python, the PyTorch 2.x that make bench installs): foreach off and on; at thread counts
#            above 1 with libgomp's default wait policy and again with OMP_WAIT_POLICY=passive
#            (shard's own default; on a busy machine it is PyTorch's faster one), so that
#            neither choice can depress PyTorch's best
#   membw    BUILD/bench/adamw_membw (bench/adamw_membw.c): STREAM-like kernels over 256 MB
#            arrays, AdamW's own access pattern among them; its best is the machine's bandwidth
# each at every thread count of THREADS, in ROUNDS rounds that alternate the order of the
# systems (membw, shard, pytorch; then the reverse). Every figure is a process's best step of
# ITERS (after one untimed step); over the rounds the report gives the best, the median and the
# worst. The headline is the ratio of bests: PyTorch's best time at its best setting
# over shard's at its own; then shard's bandwidth (bytes one pass must move: param, grad, m, v
# read, param, m, v written, over the time) against the best bandwidth the machine showed at
# the same threads, and the step's distance to that bound (targets: >= 3x PyTorch, within 1.5x
# of the bound). shard's threads wait their own way (runtime/core/parallel.h); OpenMP (PyTorch, the
# bandwidth probe) with libgomp's default wait policy unless said otherwise.
# A system that fails or prints no positive figure is an error (exit 1).
# Knobs (whole numbers): ADAMW_ROUNDS=2  ADAMW_ITERS=3  THREADS="1 $(nproc)"; ADAMW_PY=PYTHON
cd "$(dirname "$0")/.." || exit 2
BUILD=${1:-build}

die() { echo "bench adamw: $*" >&2; exit 1; }
whole() {   # whole NAME VALUE: VALUE must be a whole number >= 1
  case "$2" in ''|*[!0-9]*) die "$1 must be a whole number >= 1, not '$2'";; esac
  [ "$2" -ge 1 ] 2>/dev/null || die "$1 must be a whole number >= 1, not '$2'"
}

ROUNDS=${ADAMW_ROUNDS:-2}
ITERS=${ADAMW_ITERS:-3}
whole ADAMW_ROUNDS "$ROUNDS"; whole ADAMW_ITERS "$ITERS"
THREADS=${THREADS:-"1 $(nproc)"}
set -f   # THREADS is split on blanks, never globbed
threads=""
for t in $THREADS; do
  whole THREADS "$t"
  case " $threads " in *" $t "*) ;; *) threads="$threads $t";; esac
done
[ -n "$threads" ] || die "THREADS names no thread count"
tlist=$(echo $threads | tr ' ' ',')
plist=$(for t in $threads; do [ "$t" -gt 1 ] && echo "$t"; done | tr '\n' ',' | sed 's/,$//')   # counts above 1
unset OMP_WAIT_POLICY OMP_NUM_THREADS

PY=${ADAMW_PY:-/usr/bin/python3}
if [ -z "${ADAMW_PY:-}" ]; then sh bench/deps.sh || exit 1; fi
"$PY" -c 'import torch' >/dev/null 2>&1 || die "no PyTorch in $PY (ADAMW_PY)"
for b in adamw_bench adamw_membw; do
  [ -x "$BUILD/bench/$b" ] || die "$BUILD/bench/$b is missing: run make bench-adamw"
done

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
data="$tmp/data"; : >"$data"

# measure NAME ROUND COMMAND...: runs COMMAND and appends "NAME KEY ROUND VALUE" to the data
# for each of its "KEY VALUE" lines with a number; an error if the command fails or one of its
# step_ms_* or gb_per_s_* figures is missing or not positive (its output's tail is shown).
measure() {
  m_name=$1 m_r=$2; shift 2
  "$@" >"$tmp/out" 2>&1
  rc=$?
  awk -v n="$m_name" -v r="$m_r" 'NF == 2 && $2 ~ /^[0-9][0-9.eE+-]*$/ { print n, $1, r, $2 }' "$tmp/out" >"$tmp/new"
  bad=$(awk '$2 ~ /^(step_ms|gb_per_s)_/ && !($4 + 0 > 0)' "$tmp/new")
  if [ "$rc" -ne 0 ] || [ -n "$bad" ] || ! grep -q -e ' step_ms_' -e ' gb_per_s_' "$tmp/new"; then
    echo "bench adamw: $m_name failed in round $m_r (exit $rc); its output ends:" >&2
    tail -n 20 "$tmp/out" >&2
    exit 1
  fi
  cat "$tmp/new" >>"$data"
  sed -n 's/^torch_version //p' "$tmp/out" >>"$tmp/torch_version"
  return 0
}

membw() { measure membw "$1" "$BUILD/bench/adamw_membw" 67108864 5 $threads; }
shard() { measure shard "$1" "$BUILD/bench/adamw_bench" "$ITERS" "$tlist"; }
torch() {
  measure pytorch "$1" "$PY" bench/adamw_torch.py --iters "$ITERS" --threads "$tlist"
  [ -z "$plist" ] || measure pytorch "$1" env OMP_WAIT_POLICY=passive "$PY" bench/adamw_torch.py --iters "$ITERS" --threads "$plist" --tag _passive
}

echo "adamw: GPT-2 124M's parameters (148 tensors, 124,475,904 f32), $ROUNDS round(s), best of $ITERS steps, threads:$threads (load now: $(cut -d' ' -f1-3 /proc/loadavg))"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  if [ $((r % 2)) -eq 1 ]; then membw "$r"; shard "$r"; torch "$r"
  else torch "$r"; shard "$r"; membw "$r"; fi
  awk -v r="$r" '$3 == r && $2 ~ /^(step_ms_.*_(f32|foreach[01]|fused|passive)|gb_per_s_[0-9]+t)$/ {
      k = $2; sub(/^(step_ms|gb_per_s)_/, "", k); x[$1] = x[$1] sprintf("  %s: %s", k, $4) }
    END { printf "round %d  ms/step shard%s | pytorch%s | GB/s membw%s\n", r, x["shard"], x["pytorch"], x["membw"] }' "$data"
  r=$((r + 1))
done

tv=$(head -n 1 "$tmp/torch_version")
awk -v threads="$threads" -v plist="$plist" -v rounds="$ROUNDS" -v tv="${tv:-?}" '
  { v[$1, $2, $3] = $4 }
  function lo(n, k,   i, m) { m = v[n, k, 1]; for (i = 2; i <= rounds; i++) if (v[n, k, i] < m) m = v[n, k, i]; return m }
  function hi(n, k,   i, m) { m = v[n, k, 1]; for (i = 2; i <= rounds; i++) if (v[n, k, i] > m) m = v[n, k, i]; return m }
  function med(n, k,   c, a, i, j, x) {
    for (i = 1; i <= rounds; i++) a[i] = v[n, k, i]
    for (i = 2; i <= rounds; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return rounds % 2 ? a[(rounds + 1) / 2] : (a[rounds / 2] + a[rounds / 2 + 1]) / 2
  }
  function label(k,   t) {
    t = k + 0
    return t (t == 1 ? " thread" : " threads") (k ~ /foreach1/ ? ", foreach on" : k ~ /foreach0/ ? ", foreach off" : k ~ /fused/ ? ", fused" : "") (k ~ /passive/ ? ", passive wait" : "")
  }
  function ms(n, k) { return (n, k, 1) in v ? sprintf("%.0f (%.0f, %.0f)", lo(n, k), med(n, k), hi(n, k)) : "-" }
  function add(n, k) { if ((n, "step_ms_" k, 1) in v) P[++np] = k }   # a PyTorch setting it ran
  # round i: the best time of a system over its settings S[1..ns]
  function round_best(n, S, ns, i,   j, m) { m = 1e30; for (j = 1; j <= ns; j++) if (v[n, "step_ms_" S[j], i] < m) m = v[n, "step_ms_" S[j], i]; return m }
  END {
    nt = split(threads, T, " ")
    ns = 0; np = 0
    for (i = 1; i <= nt; i++) { S[++ns] = T[i] "t_f32"; add("pytorch", T[i] "t_foreach0"); add("pytorch", T[i] "t_foreach1"); add("pytorch", T[i] "t_fused") }
    npl = split(plist, PL, ",")
    for (i = 1; i <= npl; i++) { add("pytorch", PL[i] "t_foreach0_passive"); add("pytorch", PL[i] "t_foreach1_passive"); add("pytorch", PL[i] "t_fused_passive") }
    bs = S[1]; for (i = 2; i <= ns; i++) if (lo("shard", "step_ms_" S[i]) < lo("shard", "step_ms_" bs)) bs = S[i]
    bp = P[1]; for (i = 2; i <= np; i++) if (lo("pytorch", "step_ms_" P[i]) < lo("pytorch", "step_ms_" bp)) bp = P[i]
    sb = lo("shard", "step_ms_" bs); pb = lo("pytorch", "step_ms_" bp); ratio = pb / sb
    rl = 1e30; rh = 0
    for (i = 1; i <= rounds; i++) { x = round_best("pytorch", P, np, i) / round_best("shard", S, ns, i); if (x < rl) rl = x; if (x > rh) rh = x }
    printf "\nadamw, ratio of bests: pytorch at %s %.0f ms / shard at %s %.0f ms = %.2fx [per round %.2f-%.2f] (target >= 3x: %s)\n",
      label(bp), pb, label(bs), sb, ratio, rl, rh, (ratio >= 3 ? "met" : "NOT met")
    np_ = v["shard", "params", 1]
    printf "throughput: shard %.2f G params/s, pytorch %.3f G params/s (%d parameters a step)\n", np_ / sb / 1e6, np_ / pb / 1e6, np_
    printf "ms per step: best (median, worst) over %d round(s), each a process'"'"'s best of its steps\n", rounds
    printf "  %-10s %-22s %-22s %-22s %-22s %s\n", "threads", "shard f32", "shard bf16+shadow", "pytorch foreach off", "foreach on", "fused"
    for (i = 1; i <= nt; i++) {
      t = T[i]
      printf "  %-10s %-22s %-22s %-22s %-22s %s\n", t, ms("shard", "step_ms_" t "t_f32"), ms("shard", "step_ms_" t "t_bf16"),
        ms("pytorch", "step_ms_" t "t_foreach0"), ms("pytorch", "step_ms_" t "t_foreach1"), ms("pytorch", "step_ms_" t "t_fused")
    }
    for (i = 1; i <= npl; i++) {
      t = PL[i]
      printf "  %-10s %-22s %-22s %-22s %-22s %s\n", t " passive", "-", "-", ms("pytorch", "step_ms_" t "t_foreach0_passive"),
        ms("pytorch", "step_ms_" t "t_foreach1_passive"), ms("pytorch", "step_ms_" t "t_fused_passive")
    }
    printf "  (pytorch %s)\n", tv
    bytes = v["shard", "bytes_per_step_f32", 1]
    printf "\nbandwidth: shard moves %.2f GB a step (param, grad, m, v read; param, m, v written; f32); the machine'"'"'s: the best\n", bytes / 1e9
    printf "GB/s of adamw_membw'"'"'s kernels at the same threads over the rounds; bound: the step at that bandwidth\n"
    printf "  %-8s %-16s %-22s %-12s %s\n", "threads", "shard GB/s", "machine GB/s (median)", "bound ms", "shard best / bound"
    for (i = 1; i <= nt; i++) {
      t = T[i]; bw = hi("membw", "gb_per_s_" t "t"); s = lo("shard", "step_ms_" t "t_f32"); bound = bytes / bw / 1e6
      printf "  %-8s %-16.1f %-22s %-12.0f %.2fx\n", t, bytes / s / 1e6, sprintf("%.1f (%.1f)", bw, med("membw", "gb_per_s_" t "t")), bound, s / bound
      if ((t "t_f32") == bs) at_best = s / bound
    }
    printf "at shard'"'"'s best setting (%s): %.2fx the bandwidth bound (target within 1.5x: %s)\n", label(bs), at_best, (at_best <= 1.5 ? "met" : "NOT met")
    # plain "name number" lines, for scripts
    printf "\nadamw_ratio_best %.3f\nadamw_bound_ratio_best %.3f\nadamw_shard_best_ms %.1f\nadamw_pytorch_best_ms %.1f\n", ratio, at_best, sb, pb
    for (i = 1; i <= nt; i++) {
      t = T[i]
      printf "adamw_shard_ms_%dt %.1f\nadamw_shard_bf16_ms_%dt %.1f\nadamw_pytorch_ms_%dt %.1f\nadamw_pytorch_foreach_ms_%dt %.1f\nadamw_membw_gb_per_s_%dt %.1f\n",
        t, lo("shard", "step_ms_" t "t_f32"), t, lo("shard", "step_ms_" t "t_bf16"), t, lo("pytorch", "step_ms_" t "t_foreach0"),
        t, lo("pytorch", "step_ms_" t "t_foreach1"), t, hi("membw", "gb_per_s_" t "t")
    }
  }' "$data" || exit 1
exit 0
