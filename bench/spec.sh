#!/bin/sh
# Speculative decoding against plain decoding, side by side: each pair is `quill run` without and
# with a drafter on the same model, prompt and settings, back to back (which goes first alternates
# from pair to pair, so that the machine's changing load hits both alike). Each run is greedy and
# checks the other's text: speculation must not change a byte (the script stops if it does). The
# table gives, per case, the median generation speed of each side, the median ratio and its
# range over the pairs, and the share of drafted tokens accepted; `uptime` before and after.
#
#   bench/spec.sh               TinyLlama-1.1B-shaped q8_0 (random weights, real tokenizer) with a
#                               q2_K and a q4_0 draft of the same weights, and with --lookup on a
#                               prompt that repeats; stories260K with --lookup on story openings
#   CASES="stories" bench/spec.sh    only some cases (tinyllama-q2_k tinyllama-q4_0
#                               tinyllama-lookup stories, tinyllama-f16-q8_0 (an f16 target with a
#                               q8_0 draft: copies that agree on most greedy tokens even with random
#                               weights), and the reference's llama-server without and with its own
#                               speculative decoding: ref-tinyllama-q2_k ref-tinyllama-q4_0
#                               ref-tinyllama-f16-q8_0 ref-stories, its draft-simple and ngram-cache
#                               types, a server started per run, speed from its reply's timings)
#
# Environment (defaults in brackets): QUILL_BENCH_DIR [../quill-bench-models: tinyllama-f16 made
# with `quill synth --like tinyllama-1.1b`, the quantized files from it with the reference's
# llama-quantize, each only when absent]  PAIRS [3]  N [128: tokens generated]  THREADS [2]
# DRAFT_MAX [16]  QUILL [build/quill]  REF [../shared/ref/bin]  CASES [all of them]
# Needs sh, awk, sed, sort and cmp.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
REF=${REF:-$root/../shared/ref/bin}
. "$root/bench/ref_dir.sh"
REF=$(ref_usable "$REF")   # a copy whose library links are text files (bench/ref_dir.sh)
DIR=${QUILL_BENCH_DIR:-$root/../quill-bench-models}
SHARED=${QUILL_SHARED:-$root/../shared}
VOCAB=$SHARED/tokenizer/ggml-vocab-llama-spm.gguf
PAIRS=${PAIRS:-3}
N=${N:-128}
THREADS=${THREADS:-2}
DRAFT_MAX=${DRAFT_MAX:-16}
CASES=${CASES:-tinyllama-q2_k tinyllama-q4_0 tinyllama-lookup tinyllama-f16-q8_0 stories ref-tinyllama-q2_k ref-tinyllama-q4_0 ref-tinyllama-f16-q8_0 ref-stories}
PORT=${PORT:-18431}

die() { echo "spec.sh: $*" >&2; exit 1; }
for v in PAIRS N THREADS DRAFT_MAX; do
    eval "x=\$$v"
    case $x in '' | *[!0-9]*) die "$v must be a whole number, not '$x'" ;; esac
done
[ -x "$QUILL" ] || die "$QUILL is not built (run make, or set QUILL)"
mkdir -p "$DIR" || die "cannot create $DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

needs_tinyllama=false
for c in $CASES; do
    case $c in
        tinyllama-q2_k | tinyllama-q4_0 | tinyllama-lookup | tinyllama-f16-q8_0) needs_tinyllama=true ;;
        ref-tinyllama-q2_k | ref-tinyllama-q4_0 | ref-tinyllama-f16-q8_0) needs_tinyllama=true ;;
        stories | ref-stories) ;;
        *) die "CASES lists tinyllama-q2_k, tinyllama-q4_0, tinyllama-lookup, tinyllama-f16-q8_0, stories or their ref- versions, not '$c'" ;;
    esac
done
if $needs_tinyllama; then
    f16=$DIR/tinyllama-f16.gguf
    SYNTH="--like tinyllama-1.1b"
    # shellcheck source=bench/synth_f16.sh
    . "$here/synth_f16.sh"
    for t in q8_0 q2_k q4_0; do
        q=$DIR/tinyllama-$t.gguf
        [ -f "$q" ] && continue
        make_f16 "$f16"
        [ -x "$REF/llama-quantize" ] || die "$REF/llama-quantize is missing (the shared reference data, or set REF)"
        echo "quantizing $q with the reference's llama-quantize" >&2
        "$REF/llama-quantize" "$f16" "$q.part" "$(echo "$t" | tr a-z A-Z)" 2 > "$DIR/quantize-$t.log" 2>&1 ||
            { tail -n 20 "$DIR/quantize-$t.log" >&2; die "llama-quantize $t failed"; }
        mv "$q.part" "$q"
    done
fi

# Prompts: a story (bench/text/fidelity.txt's first paragraph), and the same repeated for lookup.
head -n 1 "$here/text/fidelity.txt" > "$tmp/story.txt"
{ cat "$tmp/story.txt"; echo; cat "$tmp/story.txt"; echo; head -c 120 "$tmp/story.txt"; } > "$tmp/repeat.txt"
printf 'Once upon a time, there was a little girl named Lily.' > "$tmp/s1.txt"
printf 'One day, a little boy named Tim went to the park with his mom.' > "$tmp/s2.txt"
printf 'Once upon a time, there was a big dog. The dog was very happy.' > "$tmp/s3.txt"

# One run: "t/s drafted accepted" on stdout, the generated text in $tmp/text-$2.
run() { # model tag prompt-file [drafter options...]
    model=$1 tag=$2 prompt=$3
    shift 3
    "$QUILL" run -m "$model" -f "$prompt" -n "$N" --temp 0 -t "$THREADS" --json "$@" 2>/dev/null > "$tmp/out.json" ||
        die "quill run -m $model $* failed"
    sed -e 's/.*"text": "//' -e 's/", "seed".*//' "$tmp/out.json" > "$tmp/text-$tag"
    awk '{
        tps = $0; sub(/.*"generation_tokens_per_s": */, "", tps); sub(/[,}].*/, "", tps)
        d = 0; a = 0
        if (index($0, "\"draft\"")) {
            d = $0; sub(/.*"drafted": */, "", d); sub(/,.*/, "", d)
            a = $0; sub(/.*"accepted": */, "", a); sub(/}.*/, "", a)
        }
        print tps, d, a
    }' "$tmp/out.json"
}

# The same through the reference's llama-server: "t/s drafted accepted" and the text.
ref_run() { # model tag prompt-file [server options...]
    model=$1 tag=$2 prompt=$3
    shift 3
    LD_LIBRARY_PATH=$REF "$REF/llama-server" -m "$model" --host 127.0.0.1 --port "$PORT" -t "$THREADS" -c 2048 -np 1 \
        --log-disable "$@" > "$tmp/server.log" 2>&1 &
    pid=$!
    k=0
    until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; do
        k=$((k + 1))
        [ "$k" -lt 600 ] && kill -0 "$pid" 2>/dev/null || { kill "$pid" 2>/dev/null; die "llama-server did not start ($*)"; }
        sleep 0.2
    done
    awk -v n="$N" 'BEGIN { printf "{\"n_predict\": %d, \"temperature\": 0, \"cache_prompt\": false, \"prompt\": \"", n }
        { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); printf "%s%s", (NR > 1 ? "\\n" : ""), $0 } END { print "\"}" }' "$prompt" > "$tmp/req.json"
    curl -sf --max-time 900 "http://127.0.0.1:$PORT/completion" -H 'Content-Type: application/json' -d @"$tmp/req.json" > "$tmp/out.json" ||
        { kill "$pid"; die "llama-server's /completion failed ($*)"; }
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    sed -e 's/.*"content":"//' -e 's/","[a-z_]*":.*//' "$tmp/out.json" > "$tmp/text-$tag"
    awk '{
        tps = $0; sub(/.*"predicted_per_second": */, "", tps); sub(/[,}].*/, "", tps)
        d = 0; a = 0
        if (index($0, "\"draft_n\"")) {
            d = $0; sub(/.*"draft_n": */, "", d); sub(/[,}].*/, "", d)
            a = $0; sub(/.*"draft_n_accepted": */, "", a); sub(/[,}].*/, "", a)
        }
        print tps, d, a
    }' "$tmp/out.json"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# PAIRS pairs of one case: prints its table line. Arguments: label model prompt-files drafter-options
pairs() {
    label=$1 model=$2 prompts=$3
    shift 3
    runner=run
    case $label in reference*) runner=ref_run ;; esac
    : > "$tmp/plain" ; : > "$tmp/spec" ; : > "$tmp/ratio" ; : > "$tmp/counts"
    differ=0
    i=1
    while [ "$i" -le "$PAIRS" ]; do
        for p in $prompts; do
            if [ $((i % 2)) -eq 1 ]; then
                a=$($runner "$model" plain "$p"); b=$($runner "$model" spec "$p" "$@")
            else
                b=$($runner "$model" spec "$p" "$@"); a=$($runner "$model" plain "$p")
            fi
            if ! cmp -s "$tmp/text-plain" "$tmp/text-spec"; then
                # quill's must be the same bits; the reference's speculation promises no such thing
                [ $runner = ref_run ] || die "$label: the text with speculation differs from without ($p)"
                differ=$((differ + 1))
            fi
            pa=${a%% *} pb=${b%% *}
            echo "$pa" >> "$tmp/plain"
            echo "$pb" >> "$tmp/spec"
            awk -v a="$pa" -v b="$pb" 'BEGIN { printf "%.4f\n", b / a }' >> "$tmp/ratio"
            echo "${b#* }" >> "$tmp/counts"
        done
        i=$((i + 1))
    done
    mp=$(median < "$tmp/plain") ms=$(median < "$tmp/spec") mr=$(median < "$tmp/ratio")
    lo=$(sort -g "$tmp/ratio" | head -n 1) hi=$(sort -g "$tmp/ratio" | tail -n 1)
    acc=$(awk '{ d += $1; a += $2 } END { if (d) printf "%.1f %% (%d of %d)", 100 * a / d, a, d; else print "-" }' "$tmp/counts")
    n_runs=$(wc -l < "$tmp/ratio" | tr -d ' ')
    note=
    [ "$differ" -eq 0 ] || note=" (text changed by speculation in $differ)"
    printf '| %s | %.2f | %.2f | %.2fx | %.2f-%.2f | %s | %s%s |\n' "$label" "$mp" "$ms" "$mr" "$lo" "$hi" "$acc" "$n_runs" "$note"
}

echo "$("$QUILL" --version 2>/dev/null | head -n 1); $N tokens greedy, $THREADS threads, draft-max $DRAFT_MAX, $PAIRS pairs"
grep -m 1 -o 'avx512[a-z_]*\|avx2' /proc/cpuinfo > /dev/null 2>&1 &&
    echo "CPU: $(grep -m 1 'model name' /proc/cpuinfo | sed 's/.*: //'); flags: $(grep -m 1 '^flags' /proc/cpuinfo |
        tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile|fma)$' | tr '\n' ' ')"
echo "before: $(uptime)"
echo
echo "| case | plain t/s | speculative t/s | ratio (median) | ratio range | accepted | runs |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for c in $CASES; do
    case $c in
        tinyllama-q2_k) pairs "TinyLlama q8_0, -md q2_K" "$DIR/tinyllama-q8_0.gguf" "$tmp/story.txt" \
            -md "$DIR/tinyllama-q2_k.gguf" --draft-max "$DRAFT_MAX" ;;
        tinyllama-q4_0) pairs "TinyLlama q8_0, -md q4_0" "$DIR/tinyllama-q8_0.gguf" "$tmp/story.txt" \
            -md "$DIR/tinyllama-q4_0.gguf" --draft-max "$DRAFT_MAX" ;;
        tinyllama-lookup) pairs "TinyLlama q8_0, --lookup (repeating prompt)" "$DIR/tinyllama-q8_0.gguf" \
            "$tmp/repeat.txt" --lookup --draft-max "$DRAFT_MAX" ;;
        stories) pairs "stories260K, --lookup (3 story openings)" "$SHARED/models/stories260K.gguf" \
            "$tmp/s1.txt $tmp/s2.txt $tmp/s3.txt" --lookup --draft-max "$DRAFT_MAX" ;;
        ref-tinyllama-q2_k) pairs "reference: TinyLlama q8_0, draft-simple q2_K" "$DIR/tinyllama-q8_0.gguf" \
            "$tmp/story.txt" -md "$DIR/tinyllama-q2_k.gguf" --spec-type draft-simple --spec-draft-n-max "$DRAFT_MAX" ;;
        ref-tinyllama-q4_0) pairs "reference: TinyLlama q8_0, draft-simple q4_0" "$DIR/tinyllama-q8_0.gguf" \
            "$tmp/story.txt" -md "$DIR/tinyllama-q4_0.gguf" --spec-type draft-simple --spec-draft-n-max "$DRAFT_MAX" ;;
        tinyllama-f16-q8_0) make_f16 "$f16"
            pairs "TinyLlama f16, -md q8_0" "$f16" "$tmp/story.txt" -md "$DIR/tinyllama-q8_0.gguf" --draft-max "$DRAFT_MAX" ;;
        ref-tinyllama-f16-q8_0) make_f16 "$f16"
            pairs "reference: TinyLlama f16, draft-simple q8_0" "$f16" "$tmp/story.txt" -md "$DIR/tinyllama-q8_0.gguf" \
            --spec-type draft-simple --spec-draft-n-max "$DRAFT_MAX" ;;
        ref-stories) pairs "reference: stories260K, ngram-cache (3 story openings)" "$SHARED/models/stories260K.gguf" \
            "$tmp/s1.txt $tmp/s2.txt $tmp/s3.txt" --spec-type ngram-cache --spec-draft-n-max "$DRAFT_MAX" ;;
    esac
done
echo
echo "after: $(uptime)"
