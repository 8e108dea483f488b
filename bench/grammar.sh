#!/bin/sh
# The cost of constrained decoding: generation speed with and without a grammar, side by side in
# the same minutes (pairs: `quill run` plain, then the same with a JSON Schema, which goes first
# alternates from pair to pair), on TinyLlama-1.1B-shaped q4_0 models (random weights) with two real
# vocabularies: Llama's SentencePiece (32k tokens) and Qwen 3's byte-level BPE (151k), the size
# that makes the mask's walk over the vocabulary matter. The schema keeps the reply going (an array
# of at least 400 strings), so that both runs generate TG tokens; the grammar's tokens/s is that of
# the tokens the mask let through. The table gives each run's median and the median ratio.
#
# Environment (defaults in brackets): QUILL_BENCH_DIR [../quill-bench-models]  PAIRS [5]  TG [128]
#   THREADS [2]  QUILL [build/quill]  VOCABS [llama-spm qwen3]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
DIR=${QUILL_BENCH_DIR:-$root/../quill-bench-models}
SHARED=${QUILL_SHARED:-$root/../shared}
PAIRS=${PAIRS:-5}
TG=${TG:-128}
THREADS=${THREADS:-2}
VOCABS=${VOCABS:-llama-spm qwen3}
die() { echo "grammar.sh: $*" >&2; exit 1; }
[ -x "$QUILL" ] || die "$QUILL is missing: run make"
mkdir -p "$DIR"
SCHEMA='{"type":"object","properties":{"words":{"type":"array","items":{"type":"string","maxLength":12},"minItems":400}},"required":["words"]}'
PROMPT='Write the list as JSON:'

# shellcheck source=bench/make_model.sh
. "$here/make_model.sh"
model_for() { # vocab name -> q4_0 model path, made once
    make_quantized "$DIR/grammar-$1-q4_0.gguf" q4_0 "$SHARED/tokenizer/ggml-vocab-$1.gguf" --like tinyllama-1.1b
    echo "$DIR/grammar-$1-q4_0.gguf"
}

speed() { # model [extra options...] -> generation tokens/s
    m=$1
    shift
    "$QUILL" run -m "$m" -p "$PROMPT" -n "$TG" --temp 0 -t "$THREADS" "$@" 2>&1 >/dev/null |
        sed -n 's/.*generation: \([0-9]*\) tokens, [0-9.]* ms, \([0-9.]*\) tok\/s.*/\1 \2/p' | tail -n 1
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

for v in $VOCABS; do model_for "$v" > /dev/null; done
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
grep -m1 -o 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo > /dev/null && echo "cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512bw|amx_int8)$' | tr '\n' ' ')"
printf '\n%-10s %8s %12s %12s %8s %14s %6s\n' vocab tokens 'plain t/s' 'schema t/s' ratio 'ratio range' pairs
for v in $VOCABS; do
    m=$(model_for "$v")
    rm -f "$DIR/grammar-pairs.txt"
    i=0
    while [ "$i" -lt "$PAIRS" ]; do
        if [ $((i % 2)) -eq 0 ]; then
            p=$(speed "$m"); g=$(speed "$m" -j "$SCHEMA")
        else
            g=$(speed "$m" -j "$SCHEMA"); p=$(speed "$m")
        fi
        [ -n "$p" ] && [ -n "$g" ] || die "a run printed no generation speed"
        echo "$p $g" | awk '{print $2, $4, $4 / $2, $3}' >> "$DIR/grammar-pairs.txt"
        i=$((i + 1))
    done
    pm=$(cut -d' ' -f1 "$DIR/grammar-pairs.txt" | median)
    gm=$(cut -d' ' -f2 "$DIR/grammar-pairs.txt" | median)
    rm_=$(cut -d' ' -f3 "$DIR/grammar-pairs.txt" | median)
    lo=$(cut -d' ' -f3 "$DIR/grammar-pairs.txt" | sort -g | head -n 1)
    hi=$(cut -d' ' -f3 "$DIR/grammar-pairs.txt" | sort -g | tail -n 1)
    n=$(cut -d' ' -f4 "$DIR/grammar-pairs.txt" | median)
    printf '%-10s %8s %12.2f %12.2f %7.3fx %6.3f-%6.3f %6s\n' "$v" "$n" "$pm" "$gm" "$rm_" "$lo" "$hi" "$PAIRS"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ratio: schema t/s / plain t/s per pair (1.0 = a grammar costs nothing; the goal is >= 0.9)"
