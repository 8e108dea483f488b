#!/bin/sh
# The whole suite: the gcc build, then the same tests built with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer, then every fuzz target on 60000 inputs from a fixed seed, then the aarch64 compile,
# then the aarch64 build's kernel tests and logits under qemu. Ends with the combined "N passed, N failed" line.
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

QUILL_BIN=./build/quill ./build/quill_test | tee build/test.log
echo "== sanitizers (clang, ASan + UBSan) =="
if make -s -j"$JOBS" SAN=1 CC=clang BUILD=build-san build-san/quill_test build-san/quill; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        QUILL_BIN=./build-san/quill ./build-san/quill_test | tee build-san/test.log
else
    echo "0 passed, 1 failed" > build-san/test.log
fi

# Every fuzz target must build and run (its seeds, then mutations from a fixed seed): fuzz/smoke.sh.
echo "== fuzz targets (clang libFuzzer, ${FUZZ_RUNS:-60000} inputs each, fixed seed) =="
mkdir -p build-fuzz
if make -s -j"$JOBS" fuzz > build-fuzz/build.log 2>&1; then
    ./fuzz/smoke.sh | tee build-fuzz/smoke.log
else
    tail -n 30 build-fuzz/build.log
    echo "make fuzz failed: see build-fuzz/build.log"
    echo "0 passed, 1 failed" | tee build-fuzz/smoke.log
fi

# The scalar path must build on other 64-bit targets: compile the library for aarch64.
echo "== non-x86 build (make cross: aarch64, compile only) =="
rm -f build/cross.log
if command -v aarch64-linux-gnu-gcc > /dev/null 2>&1; then
    if make -s -j"$JOBS" cross; then
        echo "1 passed, 0 failed" | tee build/cross.log
    else
        echo "0 passed, 1 failed" | tee build/cross.log
    fi
else
    echo "skipped: aarch64-linux-gnu-gcc is not installed (Debian: gcc-aarch64-linux-gnu)"
fi

# The aarch64 kernel sets run: make cross-test (tests/cross_test.sh) under qemu-user, where installed.
echo "== aarch64 under qemu (make cross-test) =="
rm -f build/cross-test.log
if command -v qemu-aarch64 > /dev/null 2>&1 && command -v aarch64-linux-gnu-gcc > /dev/null 2>&1; then
    make -s cross-test 2>&1 | tee build/cross-test.log
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
