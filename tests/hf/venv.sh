#!/bin/sh
# tests/hf/venv.sh [DIR]: transformers, safetensors, numpy and PyTorch 2.x for make check-hf, in
# the git-ignored virtual environment DIR (.venv-hf, which tests/tokenizer/check_full.sh shares),
# installed once by tools/pyvenv.sh (which says how). On failure one line names what failed and
# the exit status is 1.
cd "$(dirname "$0")/../.." || exit 2
sh tools/pyvenv.sh "${1:-.venv-hf}" check-hf transformers safetensors numpy
