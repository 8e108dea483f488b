#!/bin/sh
# The error each KV cache type adds, against the f32 cache of the same model and engine: quill
# perplexity writes an f32-cache base over TEXT, then compares each type with it (KLD, Δp, same
# top token). One line per model and type:
#
#   MODELS="../shared/models/stories260K.gguf" TYPES="f16 bf16" bench/kv_fidelity.sh
#
# Environment (defaults in brackets): MODELS [stories260K and synth-k-f32 from ../shared/models],
# TYPES [f16 bf16 q8_0 q4_0; a type whose blocks do not divide a model's head size is skipped],
# TEXT [README.md: the longest public-domain text at hand], CTX [512], CHUNKS [-1: all],
# THREADS [2], QUILL [build/quill].
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
MODELS=${MODELS:-$root/../shared/models/stories260K.gguf $root/../shared/models/synth-k-f32.gguf}
TYPES=${TYPES:-f16 bf16 q8_0 q4_0}
TEXT=${TEXT:-$root/README.md}
CTX=${CTX:-512}
CHUNKS=${CHUNKS:--1}
THREADS=${THREADS:-2}

die() { echo "kv_fidelity.sh: $*" >&2; exit 1; }
[ -x "$QUILL" ] || die "$QUILL is not built (run make, or set QUILL)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# a number of quill perplexity's JSON: "ppl", or "OBJECT KEY" inside one of its objects
json() {
    case $1 in
        *" "*) sed -n "s/.*\"${1% *}\": {[^}]*\"${1#* }\": *\([-0-9.eE+]*\).*/\1/p" "$2" ;;
        *) sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" "$2" ;;
    esac | head -n 1
}

echo "| model | cache K/V | PPL | PPL with f32 cache | mean KLD | max KLD | RMS Δp | same top |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for m in $MODELS; do
    name=$(basename "$m" .gguf)
    "$QUILL" perplexity -m "$m" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS" --kl-divergence-base "$out/base" \
        --json > "$out/f32.json" 2> "$out/err" || { cat "$out/err" >&2; die "the f32 base of $name failed"; }
    ppl32=$(json ppl "$out/f32.json")
    for t in $TYPES; do
        if ! "$QUILL" perplexity -m "$m" -t "$THREADS" -ctk "$t" -ctv "$t" --kl-divergence-base "$out/base" \
            --kl-divergence --json > "$out/t.json" 2> "$out/err"; then
            grep -q "do not divide" "$out/err" && continue
            cat "$out/err" >&2
            die "$name with a $t cache failed"
        fi
        echo "$name $t $(json ppl "$out/t.json") $ppl32 $(json "kld mean" "$out/t.json") $(json "kld max" "$out/t.json")" \
            "$(json "delta_p rms" "$out/t.json") $(json "same_top_p value" "$out/t.json")" |
            awk '{ printf "| %s | %s | %.4f | %.4f | %.3g | %.3g | %.4f %% | %.3f %% |\n", $1, $2, $3, $4, $5, $6, 100 * $7, 100 * $8 }'
    done
done
