#!/bin/sh
# Recovery after a lost rank: shard launch --max_restarts=1 (full_shard), rank 1 killed with
# SIGKILL after step KILL_AT. Prints the launcher's restart line (the step restored, the steps
# lost, the seconds from the failure it saw to the next completed step and where they went)
# and, measured here, the seconds from the kill itself to that step's line. The recipe's model
# at 2 and 4 ranks from in-memory snapshots (the default under --max_restarts), and at 2 ranks
# from a disk checkpoint every SAVE_EVERY steps (--snapshot_interval=0 --save_interval), the
# peer way; the same two for a 10.7M-parameter GPT at 2 ranks.
#   sh bench/snapshot_restart.sh [BIN]      (make bench runs it; KILL_AT=25 SAVE_EVERY=20 ITERS=40)
cd "$(dirname "$0")/.." || exit 2
BIN=${1:-bin/shard}
KILL_AT=${KILL_AT:-25}
SAVE_EVERY=${SAVE_EVERY:-20}
ITERS=${ITERS:-40}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
now() { perl -MTime::HiRes=time -e 'printf("%.3f\n", time)'; }

# run NAME NPROC MODEL_ARGS RESTORE_ARGS: one killed and restarted job; prints its restart line
# and the seconds from the kill to the restarted job's first completed step.
run() {
  mark="snapbench$$-$1"
  log="$tmp/$1.log"
  # each line of the job's output stamped with the time it arrived
  SNAPBENCH_MARK=$mark "$BIN" launch --nproc "$2" --max_restarts 1 recipes/gpt_shakespeare_char.lua --strategy=full_shard \
    --data=/usr/share/common-licenses/GPL-3 --max_iters="$ITERS" --log_interval=1 --eval_interval=100000 --eval_iters=1 \
    --sample_tokens=0 --out_dir="$tmp/$1" $3 $4 2>&1 | perl -MTime::HiRes=time -ne '$|=1; printf("%.3f %s", time, $_)' >"$log" &
  launcher=$!
  until grep -q " iter $KILL_AT | loss" "$log" 2>/dev/null; do
    kill -0 $launcher 2>/dev/null || { echo "$1: the job ended before step $KILL_AT"; cat "$log"; return 1; }
    sleep 0.02
  done
  for f in $(grep -lzxF "SNAPBENCH_MARK=$mark" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    if [ "$(cat /proc/$p/comm 2>/dev/null)" = shard ] && grep -qzx OMPI_COMM_WORLD_RANK=1 "$f"; then
      killed_at=$(now); kill -9 "$p"; break
    fi
  done
  wait $launcher
  grep -q "^[0-9.]* iter $ITERS | train_loss" "$log" || { echo "$1: the restarted job failed"; cat "$log"; return 1; }
  line=$(grep "shard launch: restart 1 of 1:" "$log" | cut -d' ' -f2-) || { echo "$1: no restart line"; cat "$log"; return 1; }
  done_at=$(grep " restart: step [0-9]* completed$" "$log" | cut -d' ' -f1)
  echo "$1: ${line#shard launch: restart 1 of 1: }"
  echo "$line" | sed -n "s/.*completed \([0-9.]*\) s after the failure.*/recovery_seconds_$1 \1/p"
  echo "$killed_at $done_at" | awk -v n="$1" '{ printf("recovery_seconds_from_kill_%s %.2f\n", n, $2 - $1) }'
  # steps done when the rank was killed (at least KILL_AT + 1) less the step restored
  echo "$line" | sed -n "s/.*restored step \([0-9]*\) from.*/\1/p" | awk -v k="$KILL_AT" -v n="$1" '{ print "steps_lost_at_least_" n, k + 1 - $1 }'
}

echo "recovery (full_shard), rank 1 killed after step $KILL_AT; disk peer: a checkpoint every $SAVE_EVERY steps"
GPT10M="--n_layer=6 --n_head=6 --n_embd=384"
run recipe_memory_w2 2 "" "" || exit 1
run recipe_memory_w4 4 "" "" || exit 1
run recipe_disk_w2 2 "" "--snapshot_interval=0 --save_interval=$SAVE_EVERY" || exit 1
run gpt10m_memory_w2 2 "$GPT10M" "" || exit 1
run gpt10m_disk_w2 2 "$GPT10M" "--snapshot_interval=0 --save_interval=$SAVE_EVERY" || exit 1
