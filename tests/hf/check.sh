#!/bin/sh
# tests/hf/check.sh (make check-hf): shard's Hugging Face import and export and its checkpoint
# files against the real clients, transformers and the safetensors reference library, in the
# git-ignored virtual environment .venv-hf (tests/hf/venv.sh installs them on first use, from
# PyPI; shard itself never needs Python). Not part of make test: it needs the network once.
#   1. tests/hf/make_models.py: tiny random GPT-2 and Llama models (Llama's tied and untied
#      heads, GQA and MQA, rope_theta, LayerNorm epsilon, single-file and sharded index.json)
#      saved by save_pretrained, with transformers' float64 logits on fixed ids
#   2. tests/hf/check.lua import: each loads through nn.GPT/nn.Llama.from_pretrained, in one
#      process and under FSDP full_shard at world 2, with logits within 1e-5 of transformers';
#      a GPT-2 with an untied head (shard's GPT ties it) is refused, naming lm_head
#   3. tests/hf/check.lua export: a GPT trained by shard (one process; FSDP world 2) written by
#      shard.export_hf, and at world 2 by shard.checkpoint.save and shard.save
#   4. tests/hf/check_shard_files.py: transformers' AutoModelForCausalLM loads the exports and
#      gives shard's logits; safe_open reads the checkpoint's rank files, whose pieces make
#      shard.save's full state dict again
# One line per check ("ok   ..." / "FAIL ..."), then "N passed, M failed" and the wall time;
# exit status non-zero on any failure. CHECK_HF_OUT keeps the files there (default: a
# temporary directory, removed).
cd "$(dirname "$0")/../.." || exit 2
start=$(date +%s)
sh tests/hf/venv.sh || { echo "0 passed, 1 failed (tests/hf/venv.sh: no transformers to check against)"; exit 1; }
[ -x bin/shard ] || make -s all || exit 1
PY=.venv-hf/bin/python
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
if [ -n "${CHECK_HF_OUT:-}" ]; then
  OUT=$CHECK_HF_OUT
  rm -rf "$OUT" && mkdir -p "$OUT" || exit 2
else
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/shard-check-hf.XXXXXX") || exit 2
  trap 'rm -rf "$OUT"' EXIT
fi
lines="$OUT/lines"
: >"$lines"
# step NAME COMMAND...: runs a step, its ok/FAIL/note lines to the report; a step that exits
# non-zero without a FAIL line of its own counts as one failure, its output shown.
step() {
  name=$1; shift
  "$@" >"$OUT/step.out" 2>"$OUT/step.err"
  rc=$?
  grep -E '^(ok   |FAIL |note )' "$OUT/step.out" | tee -a "$lines"
  if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$OUT/step.out"; then
    echo "FAIL $name (exit $rc)" | tee -a "$lines"
    sed 's/^/    /' "$OUT/step.out" "$OUT/step.err" | tail -n 30
  fi
}
step "make_models.py" "$PY" tests/hf/make_models.py "$OUT"
if [ -f "$OUT/models.json" ]; then
  step "import, one process" bin/shard run tests/hf/check.lua import "$OUT"
  step "import, FSDP world 2" bin/shard launch --nproc 2 tests/hf/check.lua import "$OUT"
fi
step "export, one process" bin/shard run tests/hf/check.lua export "$OUT"
step "export, FSDP world 2" bin/shard launch --nproc 2 tests/hf/check.lua export "$OUT"
step "check_shard_files.py" "$PY" tests/hf/check_shard_files.py "$OUT"
passed=$(grep -c '^ok   ' "$lines")
failed=$(grep -c '^FAIL ' "$lines")
echo "$passed passed, $failed failed ($(( $(date +%s) - start ))s)"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
