#!/bin/sh
# bench/tokenizer.sh [ROUNDS] [TEXT]: encode throughput of shard's tokenizer beside tiktoken's, one
# thread each, the same text (tinyshakespeare) and vocabulary in the same run: GPT-2 itself
# (r50k_base: its own ranks behind its regex) and cl100k_base behind Llama 3's / cl100k's split
# and behind GPT-2's regex: the tokenizer.json files tests/tokenizer/check_full.sh writes (run
# first if missing), and tiktoken Encodings of the same ranks and regexes, in the venv .venv-hf.
# tiktoken has no word cache: its figure is one encode_ordinary per round; shard's "cold" is a
# freshly loaded tokenizer per round, "warm" the same one again.
cd "$(dirname "$0")/.." || exit 2
ROUNDS=${1:-5}
TEXT=${2:-../shared/data/tinyshakespeare.txt}
FULL=.cache/tokenizer/full
[ -f "$FULL/gpt2/tokenizer.json" ] || sh tests/tokenizer/check_full.sh >/dev/null || exit 1
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); text: $TEXT ($(wc -c <"$TEXT") bytes)"
for name in gpt2 cl100k gpt2re; do
  echo "== $name"
  RAYON_NUM_THREADS=1 .venv-hf/bin/python - "$name" "$TEXT" "$ROUNDS" <<'PY'
import sys, time
import tiktoken
from tiktoken.load import load_tiktoken_bpe
sys.path.insert(0, "tests/tokenizer")
from full_vocab import CL100K, GPT2, SPECIAL, SPECIAL_GPT2
name, path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
ranks = ".cache/tokenizer/" + ("gpt2.tiktoken" if name == "gpt2" else "cl100k_base.tiktoken")
enc = tiktoken.Encoding(name, pat_str=CL100K if name == "cl100k" else GPT2, mergeable_ranks=load_tiktoken_bpe(ranks),
                        special_tokens=SPECIAL_GPT2 if name == "gpt2" else SPECIAL)
text = open(path, encoding="utf-8").read()
mb = len(text.encode("utf-8")) / 1e6
times = []
for _ in range(rounds):
    t0 = time.perf_counter()
    n = len(enc.encode_ordinary(text))
    times.append(time.perf_counter() - t0)
times.sort()
print("tiktoken        %7.2f MB/s best, %6.2f-%6.2f over %d rounds, %d ids, %.2f M tokens/s best (tiktoken %s)"
      % (mb / times[0], mb / times[-1], mb / times[0], rounds, n, n / times[0] / 1e6, tiktoken.__version__))
PY
  bin/shard run bench/tokenizer.lua "$FULL/$name" "$TEXT" "$ROUNDS"
done
