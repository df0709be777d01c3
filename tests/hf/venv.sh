#!/bin/sh
# tests/hf/venv.sh [DIR]: transformers, safetensors and PyTorch 2.x for make check-hf, in the
# git-ignored virtual environment DIR (.venv-hf, which tests/tokenizer/check_full.sh shares),
# installed once; neither make test nor shard ever needs them. Silent and exit 0 when
# DIR/bin/python imports all three. Otherwise creates DIR with /usr/bin/python3 -m venv if
# needed and pip-installs what is missing: torch as the CPU-only wheel from PyTorch's own index
# (TORCH_INDEX), else the registry's default build (larger: it brings CUDA libraries, unused
# here); transformers, safetensors and numpy from the registry. On failure prints one line
# naming what failed (pip's output kept in DIR/pip.log) and exits 1.
cd "$(dirname "$0")/../.." || exit 2
DIR=${1:-.venv-hf}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PY="$DIR/bin/python"

say() { echo "check-hf: $*" >&2; }
has_torch2() { "$PY" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' >/dev/null 2>&1; }
has_rest() { "$PY" -c 'import transformers, safetensors, numpy' >/dev/null 2>&1; }

has_torch2 && has_rest && exit 0
if [ ! -x "$PY" ]; then
  /usr/bin/python3 -m venv "$DIR" >/dev/null 2>&1 || {
    rm -rf "$DIR"
    say "/usr/bin/python3 -m venv $DIR failed (Debian: apt-get install python3-venv)"
    exit 1
  }
fi
log="$DIR/pip.log"
say "installing transformers, safetensors and PyTorch 2.x (CPU) into $DIR, once (pip's output: $log)"
# Bounded waits: an unreachable index fails in about a minute, not in pip's default retries.
pip_install() { "$PY" -m pip install --timeout 30 --retries 2 "$@" >>"$log" 2>&1; }
: >"$log"
why_failed() {
  grep -q -E 'NewConnectionError|Name or service not known|Connection refused|timed out' "$log" && printf 'no connection; '
  grep '^ERROR' "$log" | tail -n 1 | cut -c1-160
}
if ! has_torch2; then
  pip_install --index-url "$TORCH_INDEX" torch || pip_install torch || {
    say "pip install torch failed from $TORCH_INDEX and from the default index ($(why_failed))"
    exit 1
  }
  has_torch2 || { say "$PY installed torch but cannot import torch 2.x (see $log)"; exit 1; }
fi
if ! has_rest; then
  pip_install transformers safetensors numpy || { say "pip install transformers safetensors numpy failed ($(why_failed))"; exit 1; }
  has_rest || { say "$PY installed transformers but cannot import it (see $log)"; exit 1; }
fi
exit 0
