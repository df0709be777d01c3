#!/bin/sh
# bench/deps.sh: make bench's "system" peer needs PyTorch in /usr/bin/python3 (Debian 12's
# python3-torch, PyTorch 1.13; the 2.x peers come from bench/venv.sh). Silent when it imports.
# Otherwise installs python3-torch with apt-get as root (or through sudo when that needs no
# password), or says exactly what to install and fails: a missing peer is an error, never a ratio.
PY=/usr/bin/python3
"$PY" -c 'import torch' >/dev/null 2>&1 && exit 0

say() { echo "bench: $*" >&2; }
if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo="sudo"
else
  say "PyTorch is missing from $PY (the peer of bench/cpu_train.lua)."
  say "install it with:  sudo apt-get install --no-install-recommends python3-torch"
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "PyTorch is missing from $PY and this machine has no apt-get:"
  say "install PyTorch 1.13 for $PY (Debian 12's package is python3-torch)."
  exit 1
fi
say "PyTorch is missing from $PY: installing python3-torch"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be stale or absent on a fresh machine: refresh only if needed.
ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || $sudo apt-get update
$sudo apt-get install -y --no-install-recommends python3-torch ||
  { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends python3-torch; } || {
  say "installing python3-torch failed; install it with:  sudo apt-get install --no-install-recommends python3-torch"
  exit 1
}
"$PY" -c 'import torch' || { say "python3-torch is installed but $PY still cannot import torch"; exit 1; }
