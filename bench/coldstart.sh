#!/bin/sh
# Cold start: from the command to the first generated token, quill against the reference, side by
# side (pairs, which program goes first alternating), with the page cache cold (the kernel's caches
# dropped before each run: needs root) and warm (the file read once before the pairs). Each run is
# `quill run` / the reference's `llama-cli -st` on the same file, the same prompt text (the ChatML
# turn llama-cli renders for a file without a template) and one generated token; /usr/bin/time
# gives its wall time and peak resident memory. The model: Llama-2-7B-shaped q4_0 (random weights,
# the Llama SPM vocabulary, 3.6 GiB), made once (13 GB of f16 on the way).
#
# Environment (defaults in brackets): QUILL_BENCH_DIR [../quill-bench-models]  MODEL [the 7B q4_0]
#   PAIRS [3]  THREADS [2]  MODES [cold warm]  QUILL [build/quill]  REF [../shared/ref/bin]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
REF=${REF:-$root/../shared/ref/bin}
. "$root/bench/ref_dir.sh"
REF=$(ref_usable "$REF")   # a copy whose library links are text files (bench/ref_dir.sh)
DIR=${QUILL_BENCH_DIR:-$root/../quill-bench-models}
SHARED=${QUILL_SHARED:-$root/../shared}
PAIRS=${PAIRS:-3}
THREADS=${THREADS:-2}
MODES=${MODES:-cold warm}
die() { echo "coldstart.sh: $*" >&2; exit 1; }
[ -x "$QUILL" ] || die "$QUILL is missing: run make"
[ -x "$REF/llama-cli" ] || die "$REF/llama-cli is missing (the shared reference programs)"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (apt-get install time)"
mkdir -p "$DIR"
# shellcheck source=bench/make_model.sh
. "$here/make_model.sh"
MODEL=${MODEL:-$DIR/llama7b-q4_0.gguf}
make_quantized "$MODEL" q4_0 "$SHARED/tokenizer/ggml-vocab-llama-spm.gguf" --embd 4096 --layers 32 --heads 32 \
    --kv-heads 32 --ff 11008
PROMPT='<|im_start|>user
Hello<|im_end|>
<|im_start|>assistant
'

drop_caches() {
    sync
    echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || die "cannot drop the page cache (needs root): run with MODES=warm"
}

# one run: "wall_seconds peak_mib"
run_quill() {
    /usr/bin/time -f 'TIME %e %M' "$QUILL" run -m "$MODEL" -p "$PROMPT" -n 1 -t "$THREADS" > /dev/null 2> "$DIR/cold-q.err" ||
        { cat "$DIR/cold-q.err" >&2; die "quill run failed"; }
    awk '/^TIME/ {print $2, $3 / 1024}' "$DIR/cold-q.err"
}
run_ref() {
    /usr/bin/time -f 'TIME %e %M' "$REF/llama-cli" -m "$MODEL" -p "Hello" -n 1 -st -t "$THREADS" \
        < /dev/null > "$DIR/cold-r.out" 2> "$DIR/cold-r.err" || { tail -n 20 "$DIR/cold-r.err" >&2; die "llama-cli failed"; }
    awk '/^TIME/ {print $2, $3 / 1024}' "$DIR/cold-r.err"
}
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "model: $MODEL ($(du -m "$MODEL" | cut -f1) MiB), $THREADS threads"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512bw|amx_int8)$' | tr '\n' ' ')"
printf '\n%-5s %10s %10s %8s %14s %11s %11s %6s\n' cache 'quill s' 'ref s' ratio 'ratio range' 'quill MiB' 'ref MiB' pairs
for mode in $MODES; do
    pairs=$DIR/cold-$mode-pairs.txt
    rm -f "$pairs"
    [ "$mode" = warm ] && cat "$MODEL" > /dev/null
    i=0
    while [ "$i" -lt "$PAIRS" ]; do
        if [ $((i % 2)) -eq 0 ]; then
            [ "$mode" = cold ] && drop_caches
            q=$(run_quill)
            [ "$mode" = cold ] && drop_caches
            r=$(run_ref)
        else
            [ "$mode" = cold ] && drop_caches
            r=$(run_ref)
            [ "$mode" = cold ] && drop_caches
            q=$(run_quill)
        fi
        echo "$q $r" | awk '{print $1, $3, $1 / $3, $2, $4}' >> "$pairs"
        i=$((i + 1))
    done
    col() { cut -d' ' -f"$1" "$pairs" | median; }
    lo=$(cut -d' ' -f3 "$pairs" | sort -g | head -n 1)
    hi=$(cut -d' ' -f3 "$pairs" | sort -g | tail -n 1)
    printf '%-5s %10.2f %10.2f %7.3fx %6.3f-%6.3f %11.0f %11.0f %6s\n' "$mode" "$(col 1)" "$(col 2)" "$(col 3)" "$lo" "$hi" \
        "$(col 4)" "$(col 5)" "$PAIRS"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ratio: quill's seconds / the reference's (below 1: quill's first token comes sooner)"
