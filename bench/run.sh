#!/bin/sh
# make bench: every benchmark beside its peer, measured in the same invocation.
#   cpu_train   the Shakespeare model's training step, shard vs PyTorch 1.13 eager on the
#               CPU, same threads, alternating ROUNDS times; medians and the ratio.
#   gpt2_124m   (only with a GPU) see bench/gpt2_124m.lua.
cd "$(dirname "$0")/.." || exit 2
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-50}
THREADS=${THREADS:-$(nproc)}
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=passive   # the same for both; idle OpenMP threads must not spin

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

ours=""; peer=""
for r in $(seq "$ROUNDS"); do
  o=$(bin/shard run bench/cpu_train.lua --iters="$ITERS" | sed -n 's/^tokens_per_s //p')
  p=$(/usr/bin/python3 bench/peers/nanogpt_cpu.py --iters "$ITERS" --threads "$THREADS" | sed -n 's/^tokens_per_s //p')
  echo "round $r: shard $o tokens/s, pytorch $p tokens/s"
  ours="$ours $o"; peer="$peer $p"
done
mo=$(echo $ours | tr ' ' '\n' | median)
mp=$(echo $peer | tr ' ' '\n' | median)
echo "cpu_train ($THREADS threads, median of $ROUNDS): shard $mo tokens/s, pytorch 1.13 $mp tokens/s, ratio $(echo "$mo $mp" | awk '{printf "%.2f", $1 / $2}')x"

# GPT-2 124M on the GPU, shard then its PyTorch peer in the same invocation.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "gpt2_124m shard:"; bin/shard run bench/gpt2_124m.lua
  echo "gpt2_124m pytorch:"; python3 bench/peers/gpt2_124m_torch.py
fi
