#!/bin/sh
# Recovery after a lost rank: shard launch --max_restarts=1 on 2 ranks (full_shard), rank 1
# killed with SIGKILL after step KILL_AT; the launcher's restart line gives the step restored,
# the steps lost and the seconds from the failure to the next completed step. Each model twice:
# from in-memory snapshots (every step, the default under --max_restarts) and, the peer way,
# from a disk checkpoint every SAVE_EVERY steps (--snapshot_interval=0 --save_interval).
#   sh bench/snapshot_restart.sh [BIN]      (make bench runs it; KILL_AT=25 SAVE_EVERY=20 ITERS=40)
cd "$(dirname "$0")/.." || exit 2
BIN=${1:-bin/shard}
KILL_AT=${KILL_AT:-25}
SAVE_EVERY=${SAVE_EVERY:-20}
ITERS=${ITERS:-40}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run NAME MODEL_ARGS RESTORE_ARGS: one killed and restarted job; prints its restart line.
run() {
  mark="snapbench$$-$1"
  log="$tmp/$1.log"
  SNAPBENCH_MARK=$mark "$BIN" launch --nproc 2 --max_restarts 1 recipes/gpt_shakespeare_char.lua --strategy=full_shard \
    --max_iters="$ITERS" --log_interval=1 --eval_interval=100000 --eval_iters=1 --sample_tokens=0 \
    --out_dir="$tmp/$1" $2 $3 >"$log" 2>&1 &
  launcher=$!
  until grep -q "^iter $KILL_AT | loss" "$log" 2>/dev/null; do
    kill -0 $launcher 2>/dev/null || { echo "$1: the job ended before step $KILL_AT"; cat "$log"; return 1; }
    sleep 0.02
  done
  for f in $(grep -lzxF "SNAPBENCH_MARK=$mark" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    if [ "$(cat /proc/$p/comm 2>/dev/null)" = shard ] && grep -qzx OMPI_COMM_WORLD_RANK=1 "$f"; then kill -9 "$p"; break; fi
  done
  wait $launcher || { echo "$1: the restarted job failed"; cat "$log"; return 1; }
  line=$(grep "^shard launch: restart 1 of 1:" "$log") || { echo "$1: no restart line"; cat "$log"; return 1; }
  echo "$1: ${line#shard launch: restart 1 of 1: }"
  echo "$line" | sed -n "s/.*completed \([0-9.]*\) s after the failure.*/recovery_seconds_$1 \1/p"
  # steps done when the rank was killed (at least KILL_AT + 1) less the step restored
  echo "$line" | sed -n "s/.*restored step \([0-9]*\) from.*/\1/p" | awk -v k="$KILL_AT" -v n="$1" '{ print "steps_lost_at_least_" n, k + 1 - $1 }'
}

echo "recovery on 2 ranks (full_shard), rank 1 killed after step $KILL_AT; disk peer: a checkpoint every $SAVE_EVERY steps"
for model in "recipe:" "gpt10m:--n_layer=6 --n_head=6 --n_embd=384"; do
  name=${model%%:*}
  args=${model#*:}
  run "${name}_memory" "$args" "" || exit 1
  run "${name}_disk" "$args" "--snapshot_interval=0 --save_interval=$SAVE_EVERY" || exit 1
done
