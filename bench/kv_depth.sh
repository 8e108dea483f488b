#!/bin/sh
# quill against the reference at depth, per KV cache type: pairs of runs back to back (which goes
# first alternates), each `quill bench -d DEPTH -p PP -n TG -r 1 -ctk T -ctv T` and
# `llama-bench -d DEPTH -p PP -n TG -r 1 -ctk T -ctv T -fa on` on the same model (the reference
# needs flash attention for a quantized V cache; it is its default on the CPU anyway). llama-bench
# has no f32 cache: quill's f32 runs against its default, f16. Prints
# each pair, then per type and test the median speeds and the median ratio quill / reference with
# its spread; `uptime` before and after.
#
#   TYPES="f32 f16 q8_0" PAIRS=3 DEPTH=4096 bench/kv_depth.sh
#
# Environment (defaults in brackets): MODEL [../quill-bench-models/tinyllama-q4_0.gguf: made by
# `TYPES=q4_0 TESTS=tg PAIRS=1 bench/vs_ref.sh`], TYPES [f32 f16 q8_0], PAIRS [3], DEPTH [4096],
# PP [512], TG [32], THREADS [2], QUILL [build/quill], REF [../shared/ref/bin].
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
REF=${REF:-$root/../shared/ref/bin}
. "$root/bench/ref_dir.sh"
REF=$(ref_usable "$REF")   # a copy whose library links are text files (bench/ref_dir.sh)
MODEL=${MODEL:-$root/../quill-bench-models/tinyllama-q4_0.gguf}
TYPES=${TYPES:-f32 f16 q8_0}
PAIRS=${PAIRS:-3}
DEPTH=${DEPTH:-4096}
PP=${PP:-512}
TG=${TG:-32}
THREADS=${THREADS:-2}

die() { echo "kv_depth.sh: $*" >&2; exit 1; }
[ -x "$QUILL" ] || die "$QUILL is not built (run make, or set QUILL)"
[ -x "$REF/llama-bench" ] || die "$REF/llama-bench is missing (the shared reference data, or set REF)"
[ -f "$MODEL" ] || die "$MODEL is missing (TYPES=q4_0 TESTS=tg PAIRS=1 bench/vs_ref.sh makes it)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# "pp tg" speeds of one run of each program
quill_run() { # type
    "$QUILL" bench -m "$MODEL" -t "$THREADS" -d "$DEPTH" -p "$PP" -n "$TG" -r 1 --bw-mib 64 -ctk "$1" -ctv "$1" \
        --json > "$out/q.json" 2> "$out/q.err" || { cat "$out/q.err" >&2; die "quill bench failed ($1)"; }
    pp=$(awk 'index($0, "\"pp\":") { sub(/.*"mean": */, ""); sub(/,.*/, ""); print; exit }' "$out/q.json")
    tg=$(awk 'index($0, "\"tg\":") { sub(/.*"mean": */, ""); sub(/,.*/, ""); print; exit }' "$out/q.json")
    echo "$pp $tg"
}
ref_run() { # type
    rt=$1
    [ "$rt" = f32 ] && rt=f16
    "$REF/llama-bench" -m "$MODEL" -t "$THREADS" -d "$DEPTH" -p "$PP" -n "$TG" -r 1 -ctk "$rt" -ctv "$rt" -fa on \
        -o jsonl > "$out/r.json" 2> "$out/r.err" || { cat "$out/r.err" >&2; die "llama-bench failed ($1)"; }
    pp=$(grep "\"n_prompt\": $PP," "$out/r.json" | sed -n 's/.*"avg_ts": *\([0-9.eE+-]*\).*/\1/p' | head -n 1)
    tg=$(grep "\"n_gen\": $TG," "$out/r.json" | grep '"n_prompt": 0,' | sed -n 's/.*"avg_ts": *\([0-9.eE+-]*\).*/\1/p' | head -n 1)
    echo "$pp $tg"
}

echo "uptime before: $(uptime)"
raw=$out/pairs
: > "$raw"
for t in $TYPES; do
    i=1
    while [ "$i" -le "$PAIRS" ]; do
        if [ $((i % 2)) -eq 1 ]; then q=$(quill_run "$t"); r=$(ref_run "$t"); else r=$(ref_run "$t"); q=$(quill_run "$t"); fi
        echo "$t $i $q $r" >> "$raw"
        echo "  $t pair $i: pp$PP quill $(echo "$q" | cut -d' ' -f1) reference $(echo "$r" | cut -d' ' -f1);" \
            "tg$TG quill $(echo "$q" | cut -d' ' -f2) reference $(echo "$r" | cut -d' ' -f2) t/s"
        i=$((i + 1))
    done
done
echo "uptime after: $(uptime)"
echo
echo "| cache (reference's) | test @ d$DEPTH | quill t/s | reference t/s | quill / reference (spread) |"
echo "| --- | --- | ---: | ---: | ---: |"
for t in $TYPES; do
    for col in pp tg; do
        awk -v t="$t" -v col="$col" -v pp="$PP" -v tg="$TG" '
            function median(a, n,   i, j, x) {
                for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
                return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
            }
            $1 == t { k = col == "pp" ? 3 : 4; n++; q[n] = $k; r[n] = $(k + 2); x[n] = $k / $(k + 2)
                      lo = n == 1 || x[n] < lo ? x[n] : lo; hi = n == 1 || x[n] > hi ? x[n] : hi }
            END { printf "| %s%s | %s%d | %.2f | %.2f | %.2fx (%.2f-%.2f) |\n", t, t == "f32" ? " (f16)" : "", col,
                         col == "pp" ? pp : tg,
                         median(q, n), median(r, n), median(x, n), lo, hi }' "$raw"
    done
done
