#!/bin/sh
# Fidelity, not speed: how far each engine's arithmetic moves a model's predictions. For every
# model file, on bench/text/fidelity.txt (written for this repository, public domain) in chunks of
# CTX tokens, quill perplexity and the reference's llama-perplexity give:
#   - PPL: perplexity (quill, reference);
#   - KLD vs f16: mean KL divergence against the f16 file of the same weights, each engine against
#     the base its own run of the f16 file wrote (what a user of either tool measures for a quant);
#   - KLD vs exact: mean KL divergence against quill's float64 evaluation of the same file's weights
#     (quill perplexity --exact), one base for both engines: what the arithmetic alone adds.
# Models: stories260K (F32, trained) and its f16 and bf16 made with quill quantize (its n_ff of 172
# fits no block type), the synth-k-* family (random weights, every type) and synth-32k-* (32000-token
# vocabulary; no f16 file, so no f16 column) from ../shared/models.
# The base format stores log-probabilities to 16/65535 nats: KLDs below ~1e-6 are at its resolution
# (they can come out negative).
#
#   bench/fidelity.sh [DIR]     bases and logs go to DIR (default /tmp/quill-fidelity); prints a
#                               markdown table. Environment: QUILL (default build/quill), CTX (128),
#                               MODELS (a space-separated subset of the names below).
# The reference runs on one thread (its OpenMP threads spin, which on a shared machine costs it
# twenty times the time); the numbers do not depend on threads.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
SHARED=${QUILL_SHARED:-$root/../shared}
REF=$SHARED/ref/bin/llama-perplexity
TEXT=$here/text/fidelity.txt
CTX=${CTX:-128}
DIR=${1:-/tmp/quill-fidelity}
SYNTH_TYPES="f32 bf16 q8_0 q6_k q5_k_m q5_0 q4_k_m q4_k_s q4_0 iq4_nl iq4_xs q3_k_m q2_k"
STORIES_TYPES="f16 bf16"
MODELS=${MODELS:-"$(for t in f32 $STORIES_TYPES; do printf 'stories260K-%s ' "$t"; done)$(for t in $SYNTH_TYPES; do printf 'synth-k-%s ' "$t"; done)synth-32k-q8_0 synth-32k-q4_k_m"}

die() { echo "fidelity.sh: $*" >&2; exit 1; }
[ -x "$QUILL" ] || die "$QUILL is not built (run make, or set QUILL=path/to/quill)"
[ -x "$REF" ] || die "$REF not found (the reference data: ../shared or QUILL_SHARED)"
mkdir -p "$DIR" || die "cannot create $DIR"

# The reference's logger sometimes loses its last lines at exit: a run whose log lacks the line
# that ends its report is repeated (up to three times).
ref_run() { # LOG LAST_LINE ARGS...
    ref_log=$1 ref_last=$2
    shift 2
    for _ in 1 2 3; do
        rm -f "$ref_log"
        "$REF" "$@" -t 1 --log-file "$ref_log" > /dev/null 2>&1 || true
        grep -q "$ref_last" "$ref_log" 2> /dev/null && return 0
    done
    die "llama-perplexity $* did not finish (see $ref_log)"
}

# The file of a model name: stories260K-f32 is the shared file, its other types are made here.
model_file() {
    case $1 in
        stories260K-f32) echo "$SHARED/models/stories260K.gguf" ;;
        stories260K-*)
            f=$DIR/$1.gguf
            [ -f "$f" ] || "$QUILL" quantize "$SHARED/models/stories260K.gguf" "$f" "${1#stories260K-}" > /dev/null 2>&1 ||
                die "quill quantize to ${1#stories260K-} failed"
            echo "$f" ;;
        *) echo "$SHARED/models/$1.gguf" ;;
    esac
}

# The f16 file of a model's family, or nothing.
f16_of() {
    case $1 in
        stories260K-*) model_file stories260K-f16 ;;
        synth-k-*) echo "$SHARED/models/synth-k-f16.gguf" ;;
    esac
}

# Each engine's base from the f16 file (written once per family).
f16_bases() { # F16_FILE → sets qbase, rbase
    stem=$DIR/$(basename "$1" .gguf)
    qbase=$stem.quill.base rbase=$stem.ref.base
    [ -f "$qbase" ] || "$QUILL" perplexity -m "$1" -f "$TEXT" -c "$CTX" --kl-divergence-base "$qbase" > /dev/null 2>&1 ||
        die "quill perplexity on $1 failed"
    [ -f "$rbase" ] || ref_run "$stem.ref.log" "Final estimate" -m "$1" -f "$TEXT" -c "$CTX" -b "$CTX" --kl-divergence-base "$rbase"
}

json_kld() { sed -n 's/.*"kld": {"mean": \([^,]*\),.*/\1/p' "$1"; }
json_ppl() { sed -n 's/.*"ppl": \([^,]*\),.*/\1/p' "$1"; }
log_value() { sed -n "s/^$2 *: *\([-0-9.]*\).*/\1/p" "$1" | head -n 1; }
# quill's numbers (full precision in its JSON) in 3 digits; the reference's KLD as it printed it.
fmt() { [ -n "$1" ] && awk -v v="$1" 'BEGIN { printf (v != 0 && (v < 1e-3 && v > -1e-3) ? "%.2e" : "%.4f"), v }' || printf -- '—'; }
fmt_ref() { [ -n "$1" ] && awk -v v="$1" -v raw="$1" 'BEGIN { if (v < 1e-3 && v > -1e-3) printf "%s", raw; else printf "%.4f", v }' || printf -- '—'; }

echo "| model | PPL quill | PPL reference | KLD vs f16: quill | reference | KLD vs exact: quill | reference | reference / quill |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for name in $MODELS; do
    file=$(model_file "$name")
    [ -f "$file" ] || die "$file not found"
    log=$DIR/$name
    # the exact base: quill's float64 evaluation of this file
    exact=$log.exact.base
    "$QUILL" perplexity -m "$file" -f "$TEXT" -c "$CTX" --exact --kl-divergence-base "$exact" > /dev/null 2> "$log.exact.err" ||
        die "quill perplexity --exact on $file failed (see $log.exact.err)"
    "$QUILL" perplexity -m "$file" --kl-divergence-base "$exact" --kl-divergence --json > "$log.quill-exact.json" 2> /dev/null ||
        die "quill perplexity --kl-divergence on $file failed"
    ref_run "$log.ref-exact.log" "Same top p:" -m "$file" -c "$CTX" -b "$CTX" --kl-divergence-base "$exact" --kl-divergence
    rm -f "$exact"
    q_ppl=$(json_ppl "$log.quill-exact.json") q_exact=$(json_kld "$log.quill-exact.json")
    r_ppl=$(log_value "$log.ref-exact.log" "Mean PPL(Q)") r_exact=$(log_value "$log.ref-exact.log" "Mean    KLD")
    q_f16='' r_f16=''
    f16=$(f16_of "$name")
    if [ -n "$f16" ]; then
        f16_bases "$f16"
        "$QUILL" perplexity -m "$file" --kl-divergence-base "$qbase" --kl-divergence --json > "$log.quill-f16.json" 2> /dev/null ||
            die "quill perplexity --kl-divergence on $file failed"
        ref_run "$log.ref-f16.log" "Same top p:" -m "$file" -c "$CTX" -b "$CTX" --kl-divergence-base "$rbase" --kl-divergence
        q_f16=$(json_kld "$log.quill-f16.json") r_f16=$(log_value "$log.ref-f16.log" "Mean    KLD")
    fi
    # (no ratio where the reference's KLD has fewer than two printed digits)
    ratio=$(awk -v r="$r_exact" -v q="$q_exact" 'BEGIN { if (q > 0 && r >= 1e-5) printf "%.0f", r / q; else printf "—" }')
    echo "| $name | $(fmt "$q_ppl") | $(fmt "$r_ppl") | $(fmt "$q_f16") | $(fmt_ref "$r_f16") | $(fmt "$q_exact") | $(fmt_ref "$r_exact") | $ratio |"
done
echo
echo "Text: bench/text/fidelity.txt, chunks of $CTX tokens (the second half of each scored). The reference prints"
echo "KLD with 6 decimals (shown as printed). Bases and logs: $DIR."
