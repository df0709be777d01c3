#!/bin/sh
# bench/venv.sh [DIR]: PyTorch 2.x for make bench's modern peers, in the git-ignored virtual
# environment DIR (.venv-bench), installed once and never needed by make test or by shard.
# Silent and exit 0 when DIR/bin/python imports torch 2 or later. Otherwise creates DIR with
# /usr/bin/python3 -m venv and pip-installs torch: the CPU-only wheel from PyTorch's own index
# (TORCH_INDEX), else the registry's default build (larger: it brings CUDA libraries, unused
# here). On failure prints one line naming what failed (pip's output kept in DIR/pip.log) and
# exits 1; make bench then goes on without the 2.x peers.
cd "$(dirname "$0")/.." || exit 2
DIR=${1:-.venv-bench}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PY="$DIR/bin/python"

say() { echo "bench: $*" >&2; }
has_torch2() { "$PY" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)' >/dev/null 2>&1; }

has_torch2 && exit 0
if [ ! -x "$PY" ]; then
  /usr/bin/python3 -m venv "$DIR" >/dev/null 2>&1 || {
    rm -rf "$DIR"
    say "PyTorch 2.x peers skipped: /usr/bin/python3 -m venv $DIR failed (Debian: apt-get install python3-venv)"
    exit 1
  }
fi
log="$DIR/pip.log"
say "installing PyTorch 2.x (CPU) into $DIR, once (pip's output: $log)"
# Bounded waits: an unreachable index fails in about a minute, not in pip's default retries.
pip_torch() { "$PY" -m pip install --timeout 30 --retries 2 "$@" torch >>"$log" 2>&1; }
: >"$log"
# why_failed: pip's last error, and whether it could not connect at all
why_failed() {
  grep -q -E 'NewConnectionError|Name or service not known|Connection refused|timed out' "$log" && printf 'no connection; '
  grep '^ERROR' "$log" | tail -n 1 | cut -c1-160
}
pip_torch --index-url "$TORCH_INDEX" || pip_torch || {
  say "PyTorch 2.x peers skipped: pip install torch failed from $TORCH_INDEX and from the default index ($(why_failed))"
  exit 1
}
has_torch2 || { say "PyTorch 2.x peers skipped: $PY installed torch but cannot import torch 2.x (see $log)"; exit 1; }
