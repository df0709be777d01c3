#!/bin/sh
# tools/pyvenv.sh DIR WHO [PACKAGE...]: PyTorch 2.x and PACKAGEs (from PyPI) in the git-ignored
# virtual environment DIR, installed once; neither make test nor shard ever needs them. Used by
# make bench (bench/venv.sh: .venv-bench, torch alone) and make check-hf (tests/hf/venv.sh:
# .venv-hf, with transformers, safetensors, numpy). Silent and exit 0 when DIR/bin/python
# imports torch 2 or later and every PACKAGE. Otherwise creates DIR with /usr/bin/python3 -m
# venv if needed and pip-installs what is missing: torch as the CPU-only wheel from PyTorch's
# own index (TORCH_INDEX), else the registry's default build (larger: it brings CUDA libraries,
# unused here); the PACKAGEs from the registry. On failure prints one line "WHO: ..." naming
# what failed (pip's output kept in DIR/pip.log) and exits 1.
[ $# -ge 2 ] || { echo "usage: tools/pyvenv.sh DIR WHO [PACKAGE...]" >&2; exit 2; }
DIR=$1
WHO=$2
shift 2
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PY="$DIR/bin/python"

say() { echo "$WHO: $*" >&2; }
has_torch2() { "$PY" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' >/dev/null 2>&1; }
# Every PACKAGE imports (a package's import name is its PyPI name here).
has_rest() { [ $# -eq 0 ] || "$PY" -c "import $(echo "$@" | tr ' ' ',')" >/dev/null 2>&1; }

has_torch2 && has_rest "$@" && exit 0
if [ ! -x "$PY" ]; then
  /usr/bin/python3 -m venv "$DIR" >/dev/null 2>&1 || {
    rm -rf "$DIR"
    say "/usr/bin/python3 -m venv $DIR failed (Debian: apt-get install python3-venv)"
    exit 1
  }
fi
log="$DIR/pip.log"
say "installing PyTorch 2.x (CPU)${1:+ and $*} into $DIR, once (pip's output: $log)"
# Bounded waits: an unreachable index fails in about a minute, not in pip's default retries.
pip_install() { "$PY" -m pip install --timeout 30 --retries 2 "$@" >>"$log" 2>&1; }
: >"$log"
# why_failed: pip's last error, and whether it could not connect at all
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
if ! has_rest "$@"; then
  pip_install "$@" || { say "pip install $* failed ($(why_failed))"; exit 1; }
  has_rest "$@" || { say "$PY installed $* but cannot import them (see $log)"; exit 1; }
fi
exit 0
