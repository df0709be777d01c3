#!/bin/sh
# bench/venv.sh [DIR]: PyTorch 2.x for make bench's modern peers, in the git-ignored virtual
# environment DIR (.venv-bench), installed once by tools/pyvenv.sh (which says how). On failure
# one line names what failed and the exit status is 1: make bench then goes on without the 2.x
# peers.
cd "$(dirname "$0")/.." || exit 2
sh tools/pyvenv.sh "${1:-.venv-bench}" "bench: PyTorch 2.x peers skipped"
