#!/bin/sh
# make bench: every benchmark beside its peer, measured in the same invocation.
#   cpu_train   the Shakespeare model's training step (bench/cpu_train.lua), shard vs PyTorch
#               (bench/peers/nanogpt_cpu.py) at each thread count of THREADS, rounds alternating
#               the systems (the order of a round is reversed in the next); with them, each
#               round, the machine's f32 peak: an OpenBLAS sgemm of a PEAK_N square at the same
#               threads (bench/peak_sgemm.c). The PyTorch peers (PEERS picks some):
#                 system    Debian's PyTorch 1.13 in /usr/bin/python3, eager (bench/deps.sh)
#                 venv      PyTorch 2.x from pip in .venv-bench/ (git-ignored; bench/venv.sh
#                           installs it once), eager, attention by scaled_dot_product_attention
#                 compiled  the same under torch.compile (inductor's C++); if it cannot compile
#                           here the bench says so in one line and goes on without it
#               If the 2.x install fails the bench says what failed and compares with 1.13 only.
#               shard runs with its own wait setting (runtime/core/parallel.h: idle threads spin
#               up to 200 us while they have their cores to themselves, then sleep); PyTorch with
#               OMP_WAIT_POLICY=passive, and with PEER_SPIN=1 also at each count above 1 with
#               libgomp's default wait policy (spin, then sleep), the setting "N spin", so that
#               neither choice of wait policy can depress PyTorch's best.
#               Reports medians over the rounds with their spread [min-max] for every figure;
#               the headline is the ratio of bests (shard at its best setting over the best
#               peer at its own best), then the same-setting ratios, then the step's GFLOP/s
#               against the peak; the report's first line names each side's kernels and each
#               peer's version. A system that fails or prints no positive figure is an error
#               (exit 1).
#   adamw       the CPU AdamW step on GPT-2 124M's parameters, shard vs torch.optim.AdamW
#               (foreach off and on) beside the machine's memory bandwidth: bench/adamw.sh.
#   cpu_train_bf16  the same step in bf16: shard's --dtype=bf16 (FSDP mixed precision, f32
#               master weights; the linear layers' GEMMs on AVX-512 BF16 where the CPU has it)
#               vs PyTorch's torch.autocast("cpu", dtype=torch.bfloat16) (nanogpt_cpu.py --bf16, each peer),
#               same rounds, alternation and settings as cpu_train; the headline is again the
#               ratio of bests. BENCH=bf16 runs only this part, BENCH=f32 all but this part,
#               BENCH=train only cpu_train (with the recipe loop).
#   deterministic  the recipe's loop at world 1 and 2, the default mode beside --deterministic
#               (tokens/s and memory peak, their ratios): bench/deterministic.sh.
#   snapshot    in-memory snapshots' step cost beside a disk checkpoint's, and the recovery
#               after a killed rank (bench/snapshot.lua, bench/snapshot_restart.sh).
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
#                         RECIPE_ITERS=300; and SHARD_DATA=DIR (DIR/tinyshakespeare.txt),
#   PEERS="system venv compiled" (a subset: only those are run, and only their installs),
#   ISA=avx2|avx512|generic: every side on that kernel set, where without it each runs its best:
#     shard's SHARD_CPU_ISA, OpenBLAS's OPENBLAS_CORETYPE (the peak, shard's avx2/generic sets,
#     Debian's PyTorch), ATen's ATEN_CPU_CAPABILITY (inductor follows it), and the MKL and
#     oneDNN inside PyTorch (MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA),
#   BENCH_VENV=DIR (.venv-bench): where PyTorch 2.x lives,
#   BENCH_PLAN=1: print the settings, peers and ISA variables this would use, and exit (no run).
cd "$(dirname "$0")/.." || exit 2

die() { echo "bench: $*" >&2; exit 1; }
whole() {   # whole NAME VALUE: VALUE must be a whole number >= 1
  case "$2" in ''|*[!0-9]*) die "$1 must be a whole number >= 1, not '$2'";; esac
  [ "$2" -ge 1 ] 2>/dev/null || die "$1 must be a whole number >= 1, not '$2'"
}
# without LIST WORD...: LIST's words less the WORDs
without() {
  w_list=$1; shift
  for w_x in "$@"; do w_list=$(echo " $w_list " | sed "s/ $w_x / /g"); done
  echo $w_list
}
# isa_vars ISA: the variables that put every side on one kernel set (none for ''). OpenBLAS's
# core type also reaches shard (its avx2 and generic sets call OpenBLAS) and Debian's PyTorch
# (linked to it); PyTorch 2.x's wheel has MKL and oneDNN inside, each with its own cap.
isa_vars() {
  case "$1" in
    '') ;;
    avx512) echo SHARD_CPU_ISA=avx512 OPENBLAS_CORETYPE=SkylakeX ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 ONEDNN_MAX_CPU_ISA=AVX512_CORE DNNL_MAX_CPU_ISA=AVX512_CORE;;
    avx2) echo SHARD_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2;;
    generic) echo SHARD_CPU_ISA=generic OPENBLAS_CORETYPE=Prescott ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41 DNNL_MAX_CPU_ISA=SSE41;;
    *) die "ISA must be avx2, avx512 or generic (none: each side runs its best), not '$1'";;
  esac
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
PEERS=${PEERS:-"system venv compiled"}
ISA=${ISA:-}
whole ROUNDS "$ROUNDS"; whole ITERS "$ITERS"; whole PEAK_N "$PEAK_N"; whole RECIPE_ITERS "$RECIPE_ITERS"
threads=""
set -f   # THREADS and PEERS are split on blanks, never globbed; every word is checked before use
for t in $THREADS; do
  whole THREADS "$t"
  case " $threads " in *" $t "*) ;; *) threads="$threads $t";; esac
done
[ -n "$threads" ] || die "THREADS names no thread count"
peers=""
for p in $PEERS; do
  case "$p" in system|venv|compiled) ;; *) die "PEERS takes system, venv and compiled, not '$p'";; esac
  case " $peers " in *" $p "*) ;; *) peers="${peers:+$peers }$p";; esac
done
[ -n "$peers" ] || die "PEERS names no peer (system, venv, compiled)"
isa_env=$(isa_vars "$ISA") || exit 1
unset OMP_WAIT_POLICY GOMP_SPINCOUNT   # shard picks its own; PyTorch's settings are named below
for kv in $isa_env; do export "$kv"; done

psettings=""   # PyTorch's settings: a thread count, or a count and s (libgomp's default wait)
for t in $threads; do
  psettings="$psettings $t"
  [ "$PEER_SPIN" = 1 ] && [ "$t" -gt 1 ] && psettings="$psettings ${t}s"
done

if [ "${BENCH_PLAN:-0}" = 1 ]; then
  echo "bench plan: BENCH=$BENCH ROUNDS=$ROUNDS ITERS=$ITERS RECIPE_ITERS=$RECIPE_ITERS PEAK_N=$PEAK_N"
  echo "threads:$threads"
  echo "pytorch settings:$psettings"
  echo "peers: $peers"
  echo "isa: ${ISA:-best} ${isa_env:-(each side its best)}"
  exit 0
fi

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

# The peers: Debian's PyTorch in /usr/bin/python3 (bench/deps.sh installs it or names it; a
# missing one is an error), PyTorch 2.x in VENV (bench/venv.sh; a failed install drops those
# peers with one line, and the report says what is left).
VENV=${BENCH_VENV:-.venv-bench}
absent=""   # the peers not compared, and why, for the report
case " $peers " in *" system "*) sh bench/deps.sh || exit 1;; esac
[ "$BENCH" != all ] && [ "$BENCH" != f32 ] || sh bench/deps.sh || exit 1   # bench/adamw.sh's peer
case " $peers " in
  *" venv "*|*" compiled "*)
    if ! sh bench/venv.sh "$VENV"; then
      peers=$(without "$peers" venv compiled)
      absent="pytorch 2.x (its install failed, above)"
      [ -n "$peers" ] || die "no PyTorch peer left to compare with (PEERS=$PEERS)"
    fi;;
esac
peer_py() { if [ "$1" = system ]; then echo /usr/bin/python3; else echo "$VENV/bin/python"; fi; }
peer_flag() { [ "$1" != compiled ] || echo --compile; }
[ -x bin/shard ] || die "bin/shard is missing: run make first"
shard_isa=$(bin/shard cpu 2>&1) || die "$shard_isa"   # SHARD_CPU_ISA above this CPU's best: refused here
shard_isa=$(echo "$shard_isa" | sed -n 's/^in use: //p')

# The peak: built here, beside the other build outputs.
PEAK=build/bench/peak_sgemm
if [ ! -x "$PEAK" ] || [ bench/peak_sgemm.c -nt "$PEAK" ]; then
  mkdir -p build/bench && "${CC:-cc}" -O2 bench/peak_sgemm.c -lopenblas -o "$PEAK" ||
    die "could not build $PEAK (needs libopenblas-dev: make deps)"
fi
# OpenBLAS's kernels as the peak runs them (OPENBLAS_CORETYPE or its own pick of this CPU).
blas_core=$(/usr/bin/python3 -c 'import ctypes
f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
f.restype = ctypes.c_char_p
print(f().decode())' 2>/dev/null) || blas_core="?"

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
data="$tmp/data"; : >"$data"

# measure NAME SETTING ROUND KEY COMMAND...: runs COMMAND, takes the value of its "KEY N" line,
# appends "NAME SETTING ROUND N" to the data; an error if the command fails or prints no such
# line with a positive number (its output's tail is shown). Returns 3, recording nothing, when
# the peer says torch.compile failed (nanogpt_cpu.py's exit 3).
measure() {
  m_name=$1 m_set=$2 m_r=$3 m_key=$4; shift 4
  "$@" >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 3 ] && grep -q '^compile_failed ' "$tmp/out" && return 3
  v=$(sed -n "s/^$m_key \\([0-9][0-9.eE+-]*\\)\$/\\1/p" "$tmp/out" | tail -n 1)
  if [ "$rc" -ne 0 ] || [ -z "$v" ] || ! awk -v x="$v" 'BEGIN { exit !(x + 0 > 0) }'; then
    echo "bench: $m_name failed at setting $m_set, round $m_r (exit $rc, ${v:-no} $m_key); its output ends:" >&2
    tail -n 20 "$tmp/out" >&2
    exit 1
  fi
  echo "$m_name $m_set $m_r $v" >>"$data"
  for extra in flops_per_token torch_version torch_isa; do
    x=$(sed -n "s/^$extra //p" "$tmp/out" | tail -n 1)
    [ -n "$x" ] && echo "$x" >"$tmp/$m_name.$extra"
  done
  return 0
}

# THREADS ROUND
shard() { measure shard "$1" "$2" tokens_per_s env OMP_NUM_THREADS="$1" bin/shard run bench/cpu_train.lua --iters="$ITERS"; }
# torch PEER SETTING ROUND [--bf16]: one run of a peer still in the comparison; SETTING is a
# thread count (OMP_WAIT_POLICY=passive) or a count and s (libgomp's default wait policy). Its
# data name is the peer's (PEER_bf16 under --bf16).
torch() {
  case " $peers " in *" $1 "*) ;; *) return 0;; esac
  p_t=${2%s}; p_wait=OMP_WAIT_POLICY=passive
  [ "$p_t" = "$2" ] || p_wait=""
  measure "$1${4:+_bf16}" "$2" "$3" tokens_per_s env $p_wait OMP_NUM_THREADS="$p_t" "$(peer_py "$1")" \
    bench/peers/nanogpt_cpu.py --iters "$ITERS" --threads "$p_t" $(peer_flag "$1") $4 || drop_compiled "$1"
}
# drop_compiled PEER: torch.compile failed; one line, and the peer leaves this run (its figures too).
drop_compiled() {
  why=$(sed -n 's/^compile_failed //p' "$tmp/out" | tail -n 1)
  echo "bench: torch.compile failed here ($why); going on without the compiled peer"
  peers=$(without "$peers" "$1")
  absent="${absent:+$absent; }pytorch compiled (torch.compile failed: $why)"
  awk -v p="$1" '$1 != p && $1 != p "_bf16"' "$data" >"$tmp/kept" && mv "$tmp/kept" "$data"
  [ -n "$peers" ] || die "no PyTorch peer left to compare with (PEERS=$PEERS)"
}
# peers_at THREADS ROUND [--bf16]: every peer at the thread count, passive then spinning
# (PEER_SPIN, counts above 1); in even rounds the peers and the two settings in reverse.
peers_at() {
  a_spin=""
  [ "$PEER_SPIN" = 1 ] && [ "$1" -gt 1 ] && a_spin=${1}s
  if [ $(($2 % 2)) -eq 1 ]; then
    for a_p in $peers; do torch "$a_p" "$1" "$2" $3; [ -z "$a_spin" ] || torch "$a_p" "$a_spin" "$2" $3; done
  else
    a_rev=""; for a_p in $peers; do a_rev="$a_p $a_rev"; done
    for a_p in $a_rev; do [ -z "$a_spin" ] || torch "$a_p" "$a_spin" "$2" $3; torch "$a_p" "$1" "$2" $3; done
  fi
}
# peer_labels [SUFFIX]: "name=label;..." of the peers compared, for the reports
peer_labels() {
  for l_p in $peers; do
    l_kind=eager; [ "$l_p" = compiled ] && l_kind=compiled
    printf '%s=pytorch %s %s;' "$l_p$1" "$(cat "$tmp/$l_p$1.torch_version" 2>/dev/null || echo '?')" "$l_kind"
  done
}
# kernels_line [SUFFIX]: which kernel set each side ran, and each peer's version
kernels_line() {
  printf 'kernels%s: shard %s, sgemm peak OpenBLAS %s' "${ISA:+ (ISA=$ISA)}" "${shard_isa:-?}" "$blas_core"
  for k_p in $peers; do
    k_kind=eager; [ "$k_p" = compiled ] && k_kind=compiled
    printf ', pytorch %s %s %s' "$(cat "$tmp/$k_p$1.torch_version" 2>/dev/null)" "$k_kind" "$(cat "$tmp/$k_p$1.torch_isa" 2>/dev/null)"
  done
  echo
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

# The reports' shared awk: medians, spreads, labels, the best peer. Data lines are
# "NAME SETTING ROUND VALUE"; peers' names in `peers`, their labels in `labels`.
AWK_LIB='
  { v[$1, $2, $3] = $4 }
  function med(name, k,   n, a, i, j, x) {
    n = 0; for (i = 1; i <= rounds; i++) a[++n] = v[name, k, i]
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function lo(name, k,   i, m) { m = v[name, k, 1]; for (i = 2; i <= rounds; i++) if (v[name, k, i] < m) m = v[name, k, i]; return m }
  function hi(name, k,   i, m) { m = v[name, k, 1]; for (i = 2; i <= rounds; i++) if (v[name, k, i] > m) m = v[name, k, i]; return m }
  # the per-round ratios a at setting ka / b at setting kb: their min and max
  function rlo(a, ka, b, kb,   i, m, x) { m = 1e30; for (i = 1; i <= rounds; i++) { x = v[a, ka, i] / v[b, kb, i]; if (x < m) m = x }; return m }
  function rhi(a, ka, b, kb,   i, m, x) { m = 0; for (i = 1; i <= rounds; i++) { x = v[a, ka, i] / v[b, kb, i]; if (x > m) m = x }; return m }
  function tok(name, k) { return sprintf("%.0f [%.0f-%.0f]", med(name, k), lo(name, k), hi(name, k)) }
  function label(k) { return k ~ /s$/ ? (k + 0) " spin" : (k + 0 == 1 ? "1 thread" : k " threads") }
  function setup(   i, n, L, e) {
    nt = split(threads, T, " "); np = split(psettings, P, " "); nq = split(peers, Q, " ")
    n = split(labels, L, ";")
    for (i = 1; i <= n; i++) if ((e = index(L[i], "=")) > 0) lab[substr(L[i], 1, e - 1)] = substr(L[i], e + 1)
  }
  # best_of(name): the setting of T where name is fastest
  function best_of(name,   i, b) { b = T[1]; for (i = 2; i <= nt; i++) if (med(name, T[i]) > med(name, b)) b = T[i]; return b }
  # best_peer(): sets bq, bp: the peer and setting of the fastest PyTorch of all
  function best_peer(   q, i) {
    bq = Q[1]; bp = P[1]
    for (q = 1; q <= nq; q++) for (i = 1; i <= np; i++) if (med(Q[q], P[i]) > med(bq, bp)) { bq = Q[q]; bp = P[i] }
  }
  # best_at(k): the fastest peer at setting k
  function best_at(k,   q, b) { b = Q[1]; for (q = 2; q <= nq; q++) if (med(Q[q], k) > med(b, k)) b = Q[q]; return b }
  function only(   q) { if (absent == "") return ""; for (q = 1; q <= nq; q++) if (Q[q] !~ /^system/) return ""; return " (against " lab[Q[1]] " only)" }
  function absent_line() { if (absent != "") printf "  not compared: %s\n", absent }
'

# ---- cpu_train_bf16 -------------------------------------------------------------------------
# bf16_report: the kernels, medians [min-max] per setting and peer, the ratio of bests, the
# same-setting ratios.
bf16_report() {
  bpeers=""; for b_p in $peers; do bpeers="$bpeers ${b_p}_bf16"; done
  echo; kernels_line _bf16
  awk -v threads="$threads" -v psettings="$psettings" -v rounds="$ROUNDS" -v peers="$bpeers" \
      -v labels="$(peer_labels _bf16)" -v absent="$absent" "$AWK_LIB"'
    END {
      setup(); bs = best_of("shard_bf16"); best_peer()
      best = med("shard_bf16", bs) / med(bq, bp)
      printf "cpu_train_bf16, ratio of bests: shard --dtype=bf16 at %s %.0f tokens/s / %s autocast bf16 at %s %.0f tokens/s = %.2fx%s\n",
        label(bs), med("shard_bf16", bs), lab[bq], label(bp), med(bq, bp), best, only()
      absent_line()
      printf "  %-10s %-24s %-30s %-24s %s\n", "setting", "shard bf16", "peer (autocast bf16)", "peer tokens/s", "shard/peer"
      for (i = 1; i <= np; i++) {
        k = P[i]; t = k + 0
        for (q = 1; q <= nq; q++)
          printf "  %-10s %-24s %-30s %-24s %.2fx\n", q == 1 ? label(k) : "", q == 1 ? tok("shard_bf16", t) : "", lab[Q[q]],
            tok(Q[q], k), med("shard_bf16", t) / med(Q[q], k)
      }
      printf "\nratio_bf16_best %.3f\n", best
      for (i = 1; i <= nt; i++) printf "shard_bf16_tokens_per_s_%dt %.1f\n", T[i], med("shard_bf16", T[i])
      for (i = 1; i <= np; i++) {
        k = P[i]; n = (k + 0) "t" (k ~ /s$/ ? "_spin" : "")
        printf "pytorch_bf16_tokens_per_s_%s %.1f\n", n, med(best_at(k), k)
        for (q = 1; q <= nq; q++) { s = Q[q]; sub(/_bf16$/, "", s); printf "pytorch_%s_bf16_tokens_per_s_%s %.1f\n", s, n, med(Q[q], k) }
      }
    }' "$data"
}

# THREADS ROUND: shard and every peer in bf16, in cpu_train's order (reversed every other round).
shard_bf16() { measure shard_bf16 "$1" "$2" tokens_per_s env OMP_NUM_THREADS="$1" bin/shard run bench/cpu_train.lua --iters="$ITERS" --dtype=bf16; }
bench_bf16() {
  echo "cpu_train_bf16: $ROUNDS round(s) of $ITERS steps, threads:$threads, peers: $peers${ISA:+, ISA=$ISA} (load now: $(cut -d' ' -f1-3 /proc/loadavg))"
  r=1
  while [ "$r" -le "$ROUNDS" ]; do
    for t in $threads; do
      if [ $((r % 2)) -eq 1 ]; then
        shard_bf16 "$t" "$r"; peers_at "$t" "$r" --bf16
      else
        peers_at "$t" "$r" --bf16; shard_bf16 "$t" "$r"
      fi
    done
    r=$((r + 1))
  done
  bf16_report
}
if [ "$BENCH" = bf16 ]; then bench_bf16; exit $?; fi
# ---- end of cpu_train_bf16 (run after cpu_train and adamw below unless BENCH=f32) --------------

echo "cpu_train: $ROUNDS round(s) of $ITERS steps, threads:$threads, peak sgemm ${PEAK_N}^2, peers: $peers${ISA:+, ISA=$ISA ($isa_env)} (load now: $(cut -d' ' -f1-3 /proc/loadavg))"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  for t in $threads; do
    peak "$t" "$r"
    if [ $((r % 2)) -eq 1 ]; then
      shard "$t" "$r"; peers_at "$t" "$r"; recipe "$t" "$r"
    else
      recipe "$t" "$r"; peers_at "$t" "$r"; shard "$t" "$r"
    fi
  done
  awk -v r="$r" -v peers="$peers" -v labels="$(peer_labels)" '
    BEGIN { n = split(labels, L, ";"); for (i = 1; i <= n; i++) if ((e = index(L[i], "=")) > 0) lab[substr(L[i], 1, e - 1)] = substr(L[i], e + 1) }
    $3 == r { s = $2; sub(/s$/, " spin", s); x[$1] = x[$1] sprintf("  %s: %s", s, $4) }
    END {
      printf "round %d  tokens/s shard%s", r, x["shard"]
      nq = split(peers, Q, " "); for (q = 1; q <= nq; q++) printf " | %s%s", lab[Q[q]], x[Q[q]]
      printf " | recipe loop%s | peak GFLOP/s%s\n", x["recipe"], x["peak"]
    }' "$data"
  r=$((r + 1))
done

fpt=$(cat "$tmp/shard.flops_per_token" 2>/dev/null)
whole flops_per_token "$fpt"
echo; kernels_line
awk -v fpt="$fpt" -v riters="$RECIPE_ITERS" -v corpus="${demo:+--demo, }$(basename "${corpus%% *}")" -v threads="$threads" \
    -v psettings="$psettings" -v rounds="$ROUNDS" -v peers="$peers" -v labels="$(peer_labels)" -v absent="$absent" "$AWK_LIB"'
  function gf(name, k, s) { s = fpt / 1e9; return sprintf("%.1f [%.1f-%.1f]", med(name, k) * s, lo(name, k) * s, hi(name, k) * s) }
  END {
    setup(); bs = best_of("shard"); best_peer()
    best = med("shard", bs) / med(bq, bp)
    printf "cpu_train, ratio of bests: shard at %s %.0f tokens/s / the best peer, %s at %s %.0f tokens/s = %.2fx [%.2f-%.2f]%s\n",
      label(bs), med("shard", bs), lab[bq], label(bp), med(bq, bp), best, rlo("shard", bs, bq, bp), rhi("shard", bs, bq, bp), only()
    absent_line()
    br = best_of("recipe")
    rbest = med("recipe", br) / med(bq, bp)
    printf "recipe loop (recipes/gpt_shakespeare_char.lua on %s, %d steps), ratio of bests: shard at %s %s tokens/s / %s at %s = %.2fx [%.2f-%.2f]\n",
      corpus, riters, label(br), tok("recipe", br), lab[bq], label(bp), rbest, rlo("recipe", br, bq, bp), rhi("recipe", br, bq, bp)
    printf "tokens/s: median [min-max] over %d round(s); ratios: of the medians [min-max of the per-round ratios]\n", rounds
    printf "  %-10s %-24s %-30s %-24s %s\n", "setting", "shard", "peer", "peer tokens/s", "shard/peer"
    for (i = 1; i <= np; i++) {
      k = P[i]; t = k + 0
      for (q = 1; q <= nq; q++)
        printf "  %-10s %-24s %-30s %-24s %.2fx [%.2f-%.2f]\n", q == 1 ? label(k) : "", q == 1 ? tok("shard", t) : "", lab[Q[q]],
          tok(Q[q], k), med("shard", t) / med(Q[q], k), rlo("shard", t, Q[q], k), rhi("shard", t, Q[q], k)
    }
    if (psettings ~ /s/) printf "  (PyTorch: OMP_WAIT_POLICY=passive, N spin: libgomp'"'"'s default wait policy; shard: its own setting, a spin of up to 200 us while alone on its cores, then sleep)\n"
    printf "\nGFLOP/s of the step (%.2f MFLOP/token of matmuls, bench/cpu_train.lua) against the peak: an OpenBLAS sgemm\n", fpt / 1e6
    printf "at the same threads in the same rounds; \"of peak\": the step'"'"'s median over the best sgemm seen (load only lowers a peak)\n"
    printf "  %-10s %-20s %-22s %-8s %-30s %-20s %s\n", "setting", "shard", "peak sgemm", "of peak", "peer", "peer GFLOP/s", "of peak"
    for (i = 1; i <= np; i++) {
      k = P[i]; t = k + 0; p = hi("peak", t)
      for (q = 1; q <= nq; q++)
        printf "  %-10s %-20s %-22s %-8s %-30s %-20s %.0f%%\n", q == 1 ? label(k) : "", q == 1 ? gf("shard", t) : "",
          q == 1 ? sprintf("%.1f [%.1f-%.1f]", med("peak", t), lo("peak", t), hi("peak", t)) : "",
          q == 1 ? sprintf("%.0f%%", 100 * med("shard", t) * fpt / 1e9 / p) : "", lab[Q[q]], gf(Q[q], k), 100 * med(Q[q], k) * fpt / 1e9 / p
    }
    # plain "name number" lines (medians; the peak: the best seen), for shard sweep and scripts;
    # pytorch_tokens_per_s_N and ratio_N: the fastest peer at that setting
    printf "\nratio_best %.3f\nratio_recipe_best %.3f\nbest_peer %s\n", best, rbest, bq
    for (i = 1; i <= nt; i++) {
      t = T[i]
      printf "shard_tokens_per_s_%dt %.1f\nrecipe_tokens_per_s_%dt %.1f\npeak_gflops_%dt %.1f\n", t, med("shard", t), t, med("recipe", t), t, hi("peak", t)
    }
    for (i = 1; i <= np; i++) {
      k = P[i]; n = (k + 0) "t" (k ~ /s$/ ? "_spin" : ""); b = best_at(k)
      printf "pytorch_tokens_per_s_%s %.1f\nratio_%s %.3f\n", n, med(b, k), n, med("shard", k + 0) / med(b, k)
      for (q = 1; q <= nq; q++) printf "pytorch_%s_tokens_per_s_%s %.1f\n", Q[q], n, med(Q[q], k)
    }
  }' "$data" || exit 1

[ "$BENCH" = train ] && exit 0

# The CPU AdamW step beside PyTorch's and the machine's bandwidth, at the same thread counts
# (bench/adamw.sh; make bench-adamw runs it alone).
echo
THREADS="$threads" sh bench/adamw.sh build || exit 1

# The cost of --deterministic: the recipe's loop at world 1 and 2, default and deterministic
# alternating (bench/deterministic.sh).
echo
ROUNDS="$ROUNDS" sh bench/deterministic.sh || exit 1

if [ "$BENCH" = all ]; then echo; bench_bf16 || exit 1; fi   # cpu_train_bf16 (its section above)

# In-memory snapshots (issue 38): their step-time cost beside an asynchronous disk checkpoint at
# the same interval, on the recipe's model and a 10.7M-parameter GPT, every step (rounds and
# paired steps) and, for the recipe's model, at the interval they pick; then the recovery from
# a rank killed under shard launch --max_restarts at 2 and 4 ranks, from memory beside from a
# disk checkpoint (bench/snapshot.lua, bench/snapshot_restart.sh).
if [ "$BENCH" = all ] || [ "$BENCH" = f32 ]; then
  echo
  bin/shard run bench/snapshot.lua --every=1 || exit 1
  bin/shard run bench/snapshot.lua --every=0 --pairs=0 || exit 1
  bin/shard run bench/snapshot.lua --every=1 --n_layer=6 --n_head=6 --n_embd=384 --steps=8 --rounds=3 --pairs=12 || exit 1
  echo; sh bench/snapshot_restart.sh || exit 1
fi

# GPT-2 124M on the GPU, shard then its PyTorch peer in the same invocation.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "gpt2_124m shard:"; bin/shard run bench/gpt2_124m.lua || die "gpt2_124m (shard) failed"
  echo "gpt2_124m pytorch:"; python3 bench/peers/gpt2_124m_torch.py || die "gpt2_124m (pytorch) failed"
fi
exit 0
