#!/bin/bash
# bench/gpu.sh: the checks of a lent GPU in one call (issue 34), each writing its whole log:
#   test    make test-gpu (builds bin/shard and tests/gpu for sm_90a with the node's nvcc)
#   attn    causal attention alone at GPT-2's shapes, shard against PyTorch's SDPA
#   train   GPT-2 124M's bf16 FSDP step at the largest batch of BATCHES that fits, then
#           PyTorch 2.x at that batch, eager (SDPA) and torch.compile'd; ROUNDS=N repeats
#           shard and compiled PyTorch, alternating, N - 1 more times
#   prof    Nsight Compute's view of the three flash attention kernels (asked for by name)
# On the device machine: . .device/env.sh && bash bench/gpu.sh [parts]   (default: all three)
# summary.txt and logs.tgz (every log and the GPT-2 step's shard.trace) go to $OUT (gpu-out/
# when unset; the device tool brings back 8 files at most); the summary is printed last.
set -u
top=${OUT:-gpu-out}
out="$top/logs"
mkdir -p "$out"
parts=${*:-test attn train}   # prof only when named
batches=${BATCHES:-64 32 16}
sum="$top/summary.txt"
: >"$sum"

# Runs "$@" with its output in $out/$1.log, under a limit of $2 seconds; records rc and time.
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "$name: rc $rc, $(( $(date +%s) - t0 )) s" >>"$sum"
  grep -hE '^(loss|tokens_per_s|ms_per_iter|matmul_tflops|mfu|peak_bytes|cuda_mallocs_timed|attention_[a-z_]+) ' \
    "$out/$name.log" | sed 's/^/    /' >>"$sum"
  return $rc
}

# Debian's PMIx (.device's Open MPI) warns on every mpirun that the node has no compression
# plug-in for it; nothing shard does needs one.
export PMIX_MCA_pcompress_base_silence_warning=1
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
head -12 "$out/nvidia-smi.txt" | grep -E 'NVIDIA|Driver' | sed 's/^/# /' >>"$sum"
{ echo "# $(nvcc --version | tail -1)"; echo "# torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1)"
  echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit ${SHARD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"; } >>"$sum"

for part in $parts; do
  case $part in
    test)
      SHARD_GPU_TEST_TIMEOUT=120 step test-gpu 420 make -j"$(nproc)" test-gpu
      grep -E '^[0-9]+ passed, [0-9]+ failed$|not ok' "$out/test-gpu.log" | tail -20 | sed 's/^/    /' >>"$sum" ;;
    attn)
      [ -x bin/shard ] || make -j"$(nproc)" all >"$out/build.log" 2>&1
      step attn-shard 120 bin/shard run bench/attention_gpu.lua
      step attn-torch 120 python3 bench/peers/attention_torch.py ;;
    train)
      [ -x bin/shard ] || make -j"$(nproc)" all >"$out/build.log" 2>&1
      fit=""
      for b in $batches; do
        if step "train-shard-b$b" 180 bin/shard run bench/gpt2_124m.lua --batch_size="$b" --trace="$out/trace-b$b.json"
        then fit=$b; break; fi
      done
      b=${fit:-8}
      step "train-torch-eager-b$b" 180 python3 bench/peers/gpt2_124m_torch.py --batch_size "$b" --no_compile
      step "train-torch-compile-b$b" 300 python3 bench/peers/gpt2_124m_torch.py --batch_size "$b"
      # more rounds, alternating, for the spread (ROUNDS, default 1)
      for r in $(seq 2 "${ROUNDS:-1}"); do
        step "train-shard-b$b-r$r" 180 bin/shard run bench/gpt2_124m.lua --batch_size="$b"
        step "train-torch-compile-b$b-r$r" 300 python3 bench/peers/gpt2_124m_torch.py --batch_size "$b"
      done ;;
    prof)   # Nsight Compute on one call of each flash kernel, both backward forms (clocks left as they are)
      [ -x bin/shard ] || make -j"$(nproc)" all >"$out/build.log" 2>&1
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      step prof-attn 180 "${ncu:-ncu}" --clock-control none --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        -k 'regex:attn_(fwd|bwd|bwd_kv|bwd_q|dq_store)_kernel' -c 7 bin/shard run bench/attention_gpu.lua --iters=1 --warmup=0
      grep -E '^  attn_|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued' \
        "$out/prof-attn.log" | sed 's/^/    /' >>"$sum" ;;
    *) echo "bench/gpu.sh: unknown part '$part' (test, attn, train, prof)" >&2; exit 2 ;;
  esac
done
tar czf "$top/logs.tgz" -C "$top" logs && rm -r "$out"
cat "$sum"
