#!/bin/sh
# Compares two quill binaries on one model by alternating them: round i runs A, then B, one
# repetition each, and prints B's speed over A's for that round; at the end the median, the range
# and how many rounds B won. These machines change speed by up to 2x from minute to minute, so two
# separate `quill bench -r N` runs compare phases of the machine as much as binaries; neighbouring
# runs in alternation share a phase.
#
#   bench/ab.sh A B MODEL [ROUNDS]     ROUNDS defaults to 10
# Environment: TEST (pp or tg; default pp), N (tokens: 512 for pp, 64 for tg), THREADS (2),
# DEPTH (tokens already in the context, quill bench -d; default 0).
# Needs only sh and awk; reads the one-key-per-line JSON of `quill bench --json`.
set -eu

die() { echo "ab.sh: $*" >&2; exit 1; }
[ $# -ge 3 ] || die "usage: bench/ab.sh A B MODEL [ROUNDS]"
A=$1 B=$2 MODEL=$3 ROUNDS=${4:-10}
TEST=${TEST:-pp}
THREADS=${THREADS:-2}
DEPTH=${DEPTH:-0}
case $TEST in
    pp) N=${N:-512}; args="-p $N -n 0" ;;
    tg) N=${N:-64}; args="-p 0 -n $N" ;;
    *) die "TEST must be pp or tg, not '$TEST'" ;;
esac
case $DEPTH in '' | *[!0-9]*) die "DEPTH must be a whole number, not '$DEPTH'" ;; esac
args="$args -d $DEPTH"
for bin in "$A" "$B"; do [ -x "$bin" ] || die "$bin is not an executable"; done
[ -f "$MODEL" ] || die "$MODEL does not exist"
case $ROUNDS in '' | *[!0-9]*) die "ROUNDS must be a whole number, not '$ROUNDS'" ;; esac

# t/s of one run: the mean of the "pp" or "tg" line of the JSON. A small bandwidth buffer keeps
# the run short; the bandwidth is not what is compared here.
speed() {
    # shellcheck disable=SC2086 # $args is a list of options
    "$1" bench -m "$MODEL" $args -r 1 -t "$THREADS" --bw-mib 64 --json 2>/dev/null |
        awk -v key="\"$TEST\"" 'index($0, key ":") { sub(/.*"mean": */, ""); sub(/,.*/, ""); print; exit }'
}

echo "round   A t/s    B t/s   B/A   ($TEST$N @ d$DEPTH, $THREADS threads, $(basename "$MODEL"))"
i=1
results=""
while [ "$i" -le "$ROUNDS" ]; do
    a=$(speed "$A")
    b=$(speed "$B")
    [ -n "$a" ] && [ -n "$b" ] || die "a run failed in round $i (try: $A bench -m $MODEL $args)"
    line=$(awk -v i="$i" -v a="$a" -v b="$b" 'BEGIN { printf "%5d %8.2f %8.2f %5.3f", i, a, b, b / a }')
    echo "$line"
    results="$results$line
"
    i=$((i + 1))
done
printf '%s' "$results" | awk '
    { r[NR] = $4; if ($4 > 1) won++ }
    END {
        for (i = 1; i <= NR; i++)          # insertion sort: NR is small
            for (j = i; j > 1 && r[j - 1] > r[j]; j--) { t = r[j]; r[j] = r[j - 1]; r[j - 1] = t }
        med = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
        printf "B/A: median %.3f, range %.3f-%.3f, B faster in %d of %d rounds\n", med, r[1], r[NR], won, NR
    }'
