#!/bin/sh
# Runs every built fuzz target (build-fuzz/fuzz_*, from `make fuzz`) for FUZZ_RUNS inputs each
# (at most FUZZ_SECONDS), so that no target rots unnoticed: it must link, start, and survive its
# seeds and some mutation. The mutation seed is fixed, so a run here is the run CI makes: a random
# one once found a leak on a fresh machine that passed here, and CI must not depend on luck (long
# random runs are `make fuzz`'s job, fuzz/README.md). Ends with "N passed, N failed" (one per target), which tests/run_all.sh adds up.
# Seeds of fuzz_NAME: fuzz/seeds/NAME/ when it exists (fuzz_gguf: the .seed files of fuzz/seeds and
# the malformed corpus). New inputs go to a scratch corpus in build-fuzz/smoke/, never to the seeds.
set -u
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-120}
RUNS_EACH=${FUZZ_RUNS:-60000}
passed=0
failed=0
found=0
for target in build-fuzz/fuzz_*; do
    case $target in *.d) continue ;; esac
    [ -x "$target" ] || continue
    found=1
    name=${target#build-fuzz/fuzz_}
    scratch=build-fuzz/smoke/$name
    rm -rf "$scratch" && mkdir -p "$scratch"
    case $name in
        gguf) seeds="fuzz/seeds tests/malformed" ;;
        *) seeds=$([ -d "fuzz/seeds/$name" ] && echo "fuzz/seeds/$name") ;;
    esac
    # -close_fd_mask=3 keeps the targets' own output (the option parser's messages) out of the log;
    # libFuzzer and the sanitizers still report on the saved stderr. `timeout` bounds a hung start.
    # shellcheck disable=SC2086
    if timeout $((SECONDS_EACH + 120)) "$target" -seed=1 -runs="$RUNS_EACH" -max_total_time="$SECONDS_EACH" -timeout=30 \
        -rss_limit_mb=2048 -max_len=4096 -close_fd_mask=3 -print_final_stats=1 \
        -artifact_prefix="$scratch/" "$scratch" $seeds > "$scratch.log" 2>&1; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch.log")
        echo "ok   fuzz_$name (${execs:-?} inputs, seed 1)"
        passed=$((passed + 1))
    else
        echo "FAIL fuzz_$name: see $scratch.log (crash inputs: $scratch/crash-*)"
        tail -n 25 "$scratch.log"
        failed=$((failed + 1))
    fi
done
if [ "$found" -eq 0 ]; then
    echo "FAIL no fuzz target in build-fuzz/ (run make fuzz)"
    failed=1
fi
echo "$passed passed, $failed failed"
