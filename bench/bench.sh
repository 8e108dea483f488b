#!/bin/sh
# quill on a TinyLlama-1.1B-shaped model (random weights, real tokenizer): synthesizes the f16
# model, quantizes it to q4_0, q8_0 and q4_k_m, runs `quill bench` on each (2 threads, pp512 /
# tg128, 3 runs) and prints its speeds and tg's share of the measured memory bandwidth. For ratios
# against the reference implementation, measured side by side, use bench/vs_ref.sh.
#
#   bench/bench.sh [DIR]        models and results go to DIR (default /tmp/quill-bench); files that
#                               already exist there are reused, so a second run only re-measures.
# Environment: QUILL (the binary; default build/quill), THREADS (2), PP (512), TG (128), REPS (3).
# Needs only sh, sed and awk: it reads the JSON that quill bench prints one key per line.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
THREADS=${THREADS:-2}
PP=${PP:-512}
TG=${TG:-128}
REPS=${REPS:-3}
DIR=${1:-/tmp/quill-bench}
VOCAB=$root/../shared/tokenizer/ggml-vocab-llama-spm.gguf

die() { echo "bench.sh: $*" >&2; exit 1; }
[ -x "$QUILL" ] || die "$QUILL is not built (run make, or set QUILL=path/to/quill)"
mkdir -p "$DIR" || die "cannot create $DIR"

f16=$DIR/tinyllama-f16.gguf
# shellcheck source=bench/synth_f16.sh
. "$here/synth_f16.sh"
make_f16 "$f16"

# The value of a top-level key, and of a key inside the one-line "pp"/"tg" objects.
field() { sed -n "s/^  \"$2\": \([^,]*\),*\$/\1/p" "$1"; }
sub() { sed -n "s/^  \"$2\": {.*\"$3\": \([^,]*\),.*/\1/p" "$1"; }

for t in q4_0 q8_0 q4_k_m; do
    q=$DIR/tinyllama-$t.gguf
    if [ ! -f "$q" ]; then
        echo "quantizing $q" >&2
        "$QUILL" quantize "$f16" "$q.part" "$t" > "$DIR/quantize-$t.log" 2>&1 ||
            { tail -n 20 "$DIR/quantize-$t.log" >&2; die "quill quantize $t failed"; }
        mv "$q.part" "$q"
    fi
    echo "benchmarking $t (-t $THREADS -p $PP -n $TG -r $REPS)" >&2
    "$QUILL" bench -m "$q" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" --json > "$DIR/bench-$t.json" ||
        die "quill bench failed on $q"
done

echo
echo "quill, TinyLlama-1.1B shape, $THREADS threads (for ratios against the reference: bench/vs_ref.sh)"
echo "target: tg >= 90 % of the measured memory bandwidth"
echo
{
    for t in q4_0 q8_0 q4_k_m; do
        j=$DIR/bench-$t.json
        echo "$t $(sub "$j" pp mean) $(sub "$j" pp sd) $(sub "$j" tg mean) $(sub "$j" tg sd)" \
             "$(field "$j" bandwidth_gbs) $(field "$j" bytes_per_token) $(field "$j" tg_roofline_share)" \
             "$(field "$j" tg_paired_share)"
    done
} | awk -v pp="$PP" -v tg="$TG" '
BEGIN {
    printf "%-7s %18s   %16s   %8s %9s %9s %9s %7s\n", "type", "pp" pp " t/s", "tg" tg " t/s", "bw GB/s", "MB/token",
           "tg share", "paired", "target"
}
{
    # $2 pp mean, $3 pp sd, $4 tg mean, $5 tg sd, $6 bandwidth, $7 bytes/token, $8 share, $9 paired
    # share (each run against the bandwidth read around it: the target is judged on this one)
    printf "%-7s %9.1f +- %5.1f   %7.2f +- %5.2f   %8.2f %9.1f %7.1f %% %7.1f %% %7s\n", $1, $2, $3, $4, $5, $6,
           $7 / 1e6, $8 * 100, $9 * 100, ($9 >= 0.9 ? "met" : "missed")
}'
echo
echo "raw results: $DIR/bench-*.json; logs of synth and quantize: $DIR/*.log"
