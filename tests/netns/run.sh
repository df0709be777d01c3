#!/bin/sh
# tests/netns/run.sh [SHARD_BIN]: shard across hosts, proven on separate network stacks. Two
# network namespaces joined by a veth pair stand for two hosts, each with its own address and
# host name; Open MPI reaches the other "host" through tests/netns/agent.sh (its remote-shell
# agent: it enters the namespace where mpirun would ssh), and `shard launch --hosts` pins the
# TCP transport to the veth network with --net. `shard launch` itself runs on host 0. Checks:
#   parity      tests/mpi/fsdp_parity.lua, every strategy, 2 nodes x 2 ranks: passes, and rank
#               0 prints what it prints on one host (shard launch --nproc 4);
#   hybrid      tests/mpi/multinode_hybrid.lua with --map-by slot and node: hybrid_group =
#               "node" shards inside each node, only its all-reduce crosses (per group counts
#               and bytes), losses and parameters as one process;
#   link bytes  the bytes on the veth link during hybrid training stay below what one
#               full_shard would move across it (only the all-reduce crosses);
#   node lost   every process in host 1's namespace killed: the job ends within the timeout
#               with a message naming the node and its ranks;
#   link cut    `ip link set down` on host 0's veth: a timeout error naming the nodes on either
#               side, not a hang;
#   host lost, restarted  the recipe under --max_restarts 1 --min_nodes 1 with snapshot
#               replicas, every process of host 1 killed and its snapshot files removed (its
#               memory gone): the job ends well on host 0 alone, restored from ranks 0 and 1's
#               own snapshots and their copies of ranks 2 and 3's, and its losses from the
#               restored step S on (train.jsonl's, 14 digits) are within 1e-6 of a resume at
#               world 2 on one host from a disk checkpoint of step S that an uninterrupted run
#               at world 4 wrote (the job's reductions crossed TCP, the reference's did not).
# Needs root (ip netns). Where namespaces cannot be made that is a failure with the reason. The
# namespaces are removed on exit, also on failure. The last line is "N passed, N failed".
BIN=${1:-bin/shard}
cd "$(dirname "$0")/../.." || exit 2
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   netns $1"; }
bad() { failed=$((failed + 1)); echo "FAIL netns $1"; [ -z "${2:-}" ] || sed 's/^/    /' "$2"; }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

P=$$
NS0=shard-h0-$P NS1=shard-h1-$P      # namespaces, unique per run
H0=shn0-$P H1=shn1-$P                 # their host names (mpirun's node names)
V0=shv0-$P V1=shv1-$P                 # the veth pair's ends
NET=10.77.0.0/24
TMP=$(mktemp -d)
cleanup() {
  for ns in $NS0 $NS1; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null
  done
  sleep 0.2
  for ns in $NS0 $NS1; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$V0" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

setup() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root to create network namespaces (running as uid $(id -u))"; return 1; }
  command -v ip >/dev/null || { echo "no ip command (iproute2)"; return 1; }
  command -v unshare >/dev/null || { echo "no unshare command (util-linux)"; return 1; }
  ip netns add "$NS0" && ip netns add "$NS1" &&
  ip link add "$V0" type veth peer name "$V1" &&
  ip link set "$V0" netns "$NS0" && ip link set "$V1" netns "$NS1" &&
  ip -n "$NS0" addr add 10.77.0.1/24 dev "$V0" && ip -n "$NS1" addr add 10.77.0.2/24 dev "$V1" &&
  ip -n "$NS0" link set lo up && ip -n "$NS1" link set lo up &&
  ip -n "$NS0" link set "$V0" up && ip -n "$NS1" link set "$V1" up
}
if ! setup >"$TMP/setup" 2>&1; then
  bad "setup: cannot create the network namespaces; the multi-host tests did not run" "$TMP/setup"
  finish
fi
printf '%s %s\n%s %s\n' "$H0" "$NS0" "$H1" "$NS1" >"$TMP/map"
export SHARD_NETNS_MAP="$TMP/map" OMPI_MCA_plm_rsh_agent="$PWD/tests/netns/agent.sh"

# on_host0 COMMAND...: runs COMMAND on host 0 (its namespace and host name).
on_host0() { ip netns exec "$NS0" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$H0" "$@"; }
launch() { on_host0 "$BIN" launch --hosts "$H0:2,$H1:2" --net "$NET" "$@"; }
link_bytes() {   # bytes through host 0's veth, both ways
  echo $(( $(ip netns exec "$NS0" cat /sys/class/net/$V0/statistics/tx_bytes) + $(ip netns exec "$NS0" cat /sys/class/net/$V0/statistics/rx_bytes) ))
}
secs() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(secs)" 'BEGIN { printf "%.1f", b - a }'; }

# parity: across hosts as on one
t0=$(secs)
if launch tests/mpi/fsdp_parity.lua >"$TMP/multi" 2>"$TMP/multi.err"; then
  "$BIN" launch --nproc 4 tests/mpi/fsdp_parity.lua >"$TMP/one" 2>&1
  # the results (bytes held per rank, parameter differences); memory peaks vary by a few KiB
  # from run to run, on one host too
  for f in one multi; do grep -v 'peak' "$TMP/$f" >"$TMP/$f.cmp"; done
  if cmp -s "$TMP/one.cmp" "$TMP/multi.cmp"; then ok "parity: fsdp_parity.lua on 2 hosts x 2 ranks, same output as one host ($(elapsed $t0) s)"
  else diff "$TMP/one.cmp" "$TMP/multi.cmp" >"$TMP/diff"; bad "parity: output differs from one host (< one host, > two)" "$TMP/diff"; fi
else
  cat "$TMP/multi" >>"$TMP/multi.err"; bad "parity: fsdp_parity.lua failed on 2 hosts x 2 ranks" "$TMP/multi.err"
fi

# hybrid with node-local groups, both rank numberings
for map in slot node; do
  case $map in slot) want="layout: node 0 ranks 0,1|layout: node 1 ranks 2,3" ;;
               node) want="layout: node 0 ranks 0,2|layout: node 1 ranks 1,3" ;; esac
  t0=$(secs)
  if launch --map-by $map tests/mpi/multinode_hybrid.lua >"$TMP/hyb" 2>&1; then
    got=$(grep '^layout:' "$TMP/hyb" | paste -sd'|')
    if [ "$got" = "$want" ]; then ok "hybrid_group=node, --map-by $map: shard groups inside a node, all-reduce across ($(elapsed $t0) s)"
    else echo "layout '$got', expected '$want'" >>"$TMP/hyb"; bad "hybrid --map-by $map: wrong node layout" "$TMP/hyb"; fi
  else bad "hybrid_group=node, --map-by $map" "$TMP/hyb"; fi
done

# link bytes: hybrid training moves less across the link than full_shard's gathers would alone
b0=$(link_bytes)
launch tests/netns/link_bytes.lua --strategy=hybrid_shard >"$TMP/lb" 2>&1; rc1=$?
b1=$(link_bytes)
launch tests/netns/link_bytes.lua --strategy=full_shard >>"$TMP/lb" 2>&1; rc2=$?
b2=$(link_bytes)
hyb=$((b1 - b0)) full=$((b2 - b1))
echo "link bytes: hybrid_shard(node) $hyb, full_shard $full" >>"$TMP/lb"
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $((hyb * 2)) -lt $full ]; then
  ok "link bytes: hybrid_shard(node) $hyb across the link, full_shard $full"
else bad "link bytes" "$TMP/lb"; fi

# start_busy TIMEOUT: the busy job in the background, once rank 0 says ready; sets lpid.
start_busy() {
  : >"$TMP/busy.out"; : >"$TMP/busy.err"
  launch --timeout "$1" tests/netns/busy.lua >"$TMP/busy.out" 2>"$TMP/busy.err" &
  lpid=$!
  i=0
  while ! grep -q '^ready' "$TMP/busy.out" && [ $i -lt 300 ] && kill -0 $lpid 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
  grep -q '^ready' "$TMP/busy.out"
}
# wait_busy LIMIT: waits for the job to end, at most LIMIT seconds; sets brc (124: still running).
wait_busy() {
  i=0
  while kill -0 $lpid 2>/dev/null && [ $i -lt $(($1 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
  if kill -0 $lpid 2>/dev/null; then brc=124; else wait $lpid; brc=$?; fi
}

# node lost: every process of host 1 killed
if start_busy 5; then
  t0=$(secs)
  kill -9 $(ip netns pids "$NS1") 2>/dev/null
  wait_busy 30
  took=$(elapsed $t0)
  cat "$TMP/busy.out" >>"$TMP/busy.err"
  if [ $brc -ne 0 ] && [ $brc -ne 124 ] && grep -q "node $H1 (ranks 2,3)" "$TMP/busy.err"; then
    ok "node lost: ended in $took s naming $(grep -o "node $H1 (ranks 2,3)" "$TMP/busy.err" | head -1)"
  else echo "exit $brc after $took s" >>"$TMP/busy.err"; bad "node lost: no end within 30 s naming node $H1 and ranks 2,3" "$TMP/busy.err"; fi
else bad "node lost: the busy job did not start" "$TMP/busy.err"; fi
pids=$(ip netns pids "$NS0"); [ -z "$pids" ] || kill -9 $pids 2>/dev/null
pids=$(ip netns pids "$NS1"); [ -z "$pids" ] || kill -9 $pids 2>/dev/null

# link cut: host 0's end of the link down under a running job
if start_busy 4; then
  t0=$(secs)
  ip -n "$NS0" link set "$V0" down
  wait_busy 40
  took=$(elapsed $t0)
  ip -n "$NS0" link set "$V0" up
  cat "$TMP/busy.out" >>"$TMP/busy.err"
  if [ $brc -ne 0 ] && [ $brc -ne 124 ] && grep -q "timed out" "$TMP/busy.err" &&
     grep "shard launch:" "$TMP/busy.err" | grep -q "$H0" && grep "shard launch:" "$TMP/busy.err" | grep -q "$H1"; then
    ok "link cut: timed out in $took s naming both sides: $(grep 'check the network\|never reached' "$TMP/busy.err" | head -1 | cut -c1-160)"
  else echo "exit $brc after $took s" >>"$TMP/busy.err"; bad "link cut: no timeout error naming the nodes within 40 s" "$TMP/busy.err"; fi
else bad "link cut: the busy job did not start" "$TMP/busy.err"; fi

# losses FILE: "ITER loss" per training step and "ITERv loss" for the validation loss, from a
# run's train.jsonl.
losses() {
  awk '{ if (!match($0, /"iter":[0-9]+/)) next; it = substr($0, RSTART + 7, RLENGTH - 7)
         if (match($0, /"loss":[-0-9.eE+]+/)) print it, substr($0, RSTART + 7, RLENGTH - 7)
         if (match($0, /"val_loss":[-0-9.eE+]+/)) print it "v", substr($0, RSTART + 11, RLENGTH - 11) }' "$1"
}
# same_as_resume S: the restored job's losses against a resume at world 2 from a disk checkpoint
# of step S of the same job run whole at world 4, both on one host.
same_as_resume() {
  if [ -z "$1" ]; then bad "host lost: no restored step in the restart line" "$TMP/lost.err"; return; fi
  if "$BIN" launch --nproc 4 $RECIPE --max_iters="$1" --save_interval="$1" --out_dir="$TMP/ref" >"$TMP/ref.out" 2>&1 &&
     "$BIN" launch --nproc 2 $RECIPE --max_iters=12 --resume --out_dir="$TMP/ref" >>"$TMP/ref.out" 2>&1; then
    losses "$TMP/ref/train.jsonl" >"$TMP/ref.losses"
    losses "$TMP/lost/train.jsonl" >"$TMP/lost.losses"
    verdict=$(awk -v want=$((12 - $1 + 1)) 'NR == FNR { ref[$1] = $2; next }
      ($1 in ref) { n++; d = $2 - ref[$1]; if (d < 0) d = -d; r = d / (ref[$1] < 0 ? -ref[$1] : ref[$1]); if (r > worst) worst = r }
      END { good = n >= want && worst <= 1e-6; printf "%d %d %.2g", n, good, worst + 0 }' "$TMP/ref.losses" "$TMP/lost.losses")
    set -- "$1" $verdict
    if [ "$3" = 1 ]; then ok "host lost: $2 losses from step $1 on within $4 (relative) of a resume at world 2 from step $1's disk checkpoint"
    else { echo "compared $2 losses, largest relative difference $4; the job's, then the resume's:"; cat "$TMP/lost.losses" "$TMP/ref.losses"; } >>"$TMP/ref.out"
      bad "host lost: the losses after the restore are not within 1e-6 of a resume at world 2 from step $1" "$TMP/ref.out"; fi
  else bad "host lost: the reference run (world 4 to step $1, resumed at world 2) failed" "$TMP/ref.out"; fi
}

# host lost, restarted: the job goes on on host 0 from the surviving snapshots and copies
pids=$(ip netns pids "$NS0"); [ -z "$pids" ] || kill -9 $pids 2>/dev/null
mkdir -p "$TMP/shm"
RECIPE="recipes/gpt_shakespeare_char.lua --strategy=full_shard --data=/usr/share/common-licenses/GPL-3 --n_layer=2 --n_embd=64
  --n_head=2 --block_size=32 --batch_size=8 --eval_interval=1000 --eval_iters=1 --sample_tokens=0 --log_interval=1"
SHARD_SNAPSHOT_DIR="$TMP/shm" launch --max_restarts 1 --min_nodes 1 $RECIPE --max_iters=12 --snapshot_interval=1 --snapshot_replicas=1 \
  --out_dir="$TMP/lost" >"$TMP/lost.out" 2>"$TMP/lost.err" &
lpid=$!
i=0
# step 5 reached (within seconds here; up to 3 minutes allowed: a loaded machine once took over 60 s)
while ! grep -qs '^iter 5 | loss' "$TMP/lost.out" && [ $i -lt 1800 ] && kill -0 $lpid 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
if grep -q '^iter 5 | loss' "$TMP/lost.out"; then
  kill -9 $(ip netns pids "$NS1") 2>/dev/null
  rm -f "$TMP"/shm/shard-*-w4-r2.snap "$TMP"/shm/shard-*-w4-r3.snap
  wait_busy 120
  cat "$TMP/lost.out" >>"$TMP/lost.err"
  if [ $brc -eq 0 ] && grep -q "going on without node $H1: 1 host, 2 ranks" "$TMP/lost.err" &&
     grep -q "restored step [0-9]* from memory (world 4: 2 own, 2 buddy copies)" "$TMP/lost.err" &&
     grep -q "^iter 12 | train_loss" "$TMP/lost.err"; then
    ok "host lost, restarted: $(grep 'shard launch: restart 1 of 1' "$TMP/lost.err" | cut -c1-200)"
    same_as_resume "$(sed -n 's/.*restored step \([0-9]*\) from memory.*/\1/p' "$TMP/lost.err" | head -n 1)"
  else echo "exit $brc" >>"$TMP/lost.err"; bad "host lost, restarted: the job did not end well on host 0 from the snapshots" "$TMP/lost.err"; fi
else bad "host lost, restarted: the job did not reach step 5" "$TMP/lost.err"; fi

finish
