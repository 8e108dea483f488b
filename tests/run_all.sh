#!/bin/sh
# The whole suite: the gcc build's tests, the same tests built with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer, every fuzz target on 60000 inputs from a fixed seed, the aarch64
# compile, and the aarch64 build's kernel tests and logits under qemu (two lanes, below). Ends with
# the combined "N passed, N failed" line.
set -u
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)

# The client tests need tests/node's locked packages: installed here, so that the README's
# `make test` runs them on a fresh checkout too (.ci/run installs them before), and again when the
# lock file changed since the last install (npm writes node_modules/.package-lock.json).
if { [ ! -d tests/node/node_modules ] || [ tests/node/package-lock.json -nt tests/node/node_modules/.package-lock.json ]; } &&
    command -v npm >/dev/null 2>&1; then
    (cd tests/node && npm ci --no-audit --no-fund --silent) || echo "npm ci in tests/node failed"
fi

# Two cores, and the checks' CPU time (about 24 minutes on the 2-core machines here) is far more
# than one core gives in the suite's 10: so the lanes run side by side, each test run mostly one
# busy thread (a model, a server and its clients taking turns), the gcc lane at normal priority
# (its tests' timing stays theirs), the sanitizer lane beside it at a lower one, and the fuzz
# targets and the aarch64 checks, which time nothing, in what the two leave:
#   the gcc build, then its tests     | the sanitizer build, then its tests (nice 5)
#   then the fuzz targets built and run, the aarch64 library built and run under qemu (nice 15)
# The sanitizer lane's report is printed after the gcc lane's.
mkdir -p build-san build-fuzz
rm -f build/cross.log build/cross-test.log build-fuzz/smoke.log build-san/test.log build-san/skip
(
    if nice -n 5 make -s -j"$JOBS" SAN=1 CC=clang BUILD=build-san build-san/quill_test build-san/quill > build-san/build.log 2>&1; then
        if [ ! -f build-san/skip ]; then
            ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
                QUILL_BIN=./build-san/quill nice -n 5 ./build-san/quill_test > build-san/test.log 2>&1
        fi
    else
        { tail -n 30 build-san/build.log; echo "the sanitizer build failed: see build-san/build.log"; echo "0 passed, 1 failed"; } \
            > build-san/test.log
    fi
) &
san=$!
if ! make -s -j"$JOBS" all; then
    touch build-san/skip
    wait "$san"
    echo "the gcc build failed"
    echo "0 passed, 1 failed"
    exit 1
fi
QUILL_BIN=./build/quill ./build/quill_test | tee build/test.log
(
    # Every fuzz target must build and run (its seeds, then mutations from a fixed seed): fuzz/smoke.sh.
    if nice -n 15 make -s -j"$JOBS" fuzz > build-fuzz/build.log 2>&1; then
        nice -n 15 ./fuzz/smoke.sh > build-fuzz/smoke.log 2>&1
    else
        { tail -n 30 build-fuzz/build.log; echo "make fuzz failed: see build-fuzz/build.log"; echo "0 passed, 1 failed"; } > build-fuzz/smoke.log
    fi
) &
fuzz=$!
(
    # The scalar path must build on other 64-bit targets: the library for aarch64, into the folder
    # the qemu run (make cross-test: tests/cross_test.sh) builds in, so that it compiles once; then
    # the aarch64 kernel sets run under qemu-user, where installed.
    if command -v aarch64-linux-gnu-gcc > /dev/null 2>&1; then
        if nice -n 15 make -s -j"$JOBS" CC=aarch64-linux-gnu-gcc BUILD=build-arm64-test build-arm64-test/libquill.a > build/cross-build.log 2>&1; then
            echo "1 passed, 0 failed" > build/cross.log
        else
            cat build/cross-build.log > build/cross.log
            echo "0 passed, 1 failed" >> build/cross.log
        fi
        if command -v qemu-aarch64 > /dev/null 2>&1; then
            nice -n 15 make -s cross-test CROSS_BUILD=build-arm64-test > build/cross-test.log 2>&1
        fi
    fi
) &
cross=$!
wait "$san"
echo "== sanitizers (clang, ASan + UBSan) =="
cat build-san/test.log
wait "$fuzz" "$cross"

echo "== fuzz targets (clang libFuzzer, ${FUZZ_RUNS:-60000} inputs each, fixed seed) =="
cat build-fuzz/smoke.log
echo "== non-x86 build (aarch64 library, compile only) =="
if [ -f build/cross.log ]; then
    cat build/cross.log
else
    echo "skipped: aarch64-linux-gnu-gcc is not installed (Debian: gcc-aarch64-linux-gnu)"
fi
echo "== aarch64 under qemu (make cross-test) =="
if [ -f build/cross-test.log ]; then
    cat build/cross-test.log
else
    echo "skipped: qemu-aarch64 or aarch64-linux-gnu-gcc is not installed (Debian: qemu-user, gcc-aarch64-linux-gnu)"
fi

passed=0
failed=0
for log in build/test.log build-san/test.log build-fuzz/smoke.log $( [ -f build/cross.log ] && echo build/cross.log ) \
    $( [ -f build/cross-test.log ] && echo build/cross-test.log ); do
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$log: the test runner did not finish (crash?)"
        failed=$((failed + 1))
        continue
    fi
    passed=$((passed + $(echo "$line" | cut -d' ' -f1)))
    failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
done
echo "== total (gcc build + sanitizer build + fuzz targets + cross build + aarch64 under qemu) =="
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
