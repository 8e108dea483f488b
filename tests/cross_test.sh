#!/bin/sh
# make cross-test: the aarch64 build (Debian's cross compiler) run under qemu-user, once per CPU
# model: `-cpu max` (dotprod and i8mm: the i8mm set), neoverse-n1 (dotprod without i8mm: the
# dotprod set) and cortex-a72 (neither: the scalar set). For each it runs the kernel tests of its
# set (bit for bit against the scalar model of the exact products, f32 kernels against their
# contracts) and two models, stories260K (f32) and synth-k-q4_k_m (q4_K, q5_K and q6_K), checking
# their prompt logits and greedy continuation against the x86-64 build's: the aarch64 sets compute
# the products the avx2 set does (the same exact integer products, the f32 dot in its order), and
# the scalar set the scalar set's, so every logit must have the same bits. Prints which set ran
# and ends with "N passed, N failed" (tests/run_all.sh adds it to the suite's total).
#
# HOST_BUILD: the x86-64 build to compare with (its quill is built if missing); ARM_BUILD: where
# the aarch64 build goes; CROSS_CC, QEMU: the tools; QUILL_SHARED: the reference data (models).
set -u
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
HOST_BUILD=${HOST_BUILD:-build}
ARM_BUILD=${ARM_BUILD:-build-arm64-test}
CROSS_CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU:-qemu-aarch64}
SHARED=${QUILL_SHARED:-../shared}
OUT=$ARM_BUILD/cross-test

passed=0
failed=0
pass() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}

for tool in "$CROSS_CC" "$QEMU"; do
    if ! command -v "$tool" > /dev/null 2>&1; then
        fail "$tool is not installed (Debian: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user)"
        finish
    fi
done

# The aarch64 quill links the arm64 builds of PCRE2, cJSON, libmicrohttpd and libedit (Debian
# multiarch: scripts/debian-packages.txt lists them, scripts/install-deps.sh adds arm64); the kernel
# tests (quill_kernel_test: the suite's runner and kernel test files) only PCRE2.
echo "== building for aarch64 ($CROSS_CC) into $ARM_BUILD =="
if ! make -s -j"$JOBS" CC="$CROSS_CC" BUILD="$ARM_BUILD" "$ARM_BUILD/quill_kernel_test" "$ARM_BUILD/quill"; then
    fail "the aarch64 build"
    finish
fi
if [ ! -x "$HOST_BUILD/quill" ] && ! make -s -j"$JOBS" BUILD="$HOST_BUILD" "$HOST_BUILD/quill"; then
    fail "the x86-64 build ($HOST_BUILD/quill)"
    finish
fi
rm -rf "$OUT" && mkdir -p "$OUT"

# Only the set files may hold the byte products the sets are chosen for: every other object runs
# on any aarch64 CPU, where one sdot or smmla dies with SIGILL (the x86 counterpart:
# tests/test_isa_objects.c). Objects left by a renamed or deleted source are linked into nothing.
OBJDUMP=${OBJDUMP:-aarch64-linux-gnu-objdump}
objects_check() {
    bad="" portable=0
    for o in $(find "$ARM_BUILD/src" "$ARM_BUILD/cli" "$ARM_BUILD/server" "$ARM_BUILD/tests" -name '*.o' 2> /dev/null | sort); do
        src=${o#"$ARM_BUILD"/}
        [ -f "${src%.o}.c" ] || continue
        listing=$("$OBJDUMP" -d --no-show-raw-insn "$o") || { bad="$bad $o (objdump failed)"; continue; }
        sdot=$(printf '%s\n' "$listing" | grep -cE '[[:space:]](sdot|udot|usdot|sudot)[[:space:]]')
        smmla=$(printf '%s\n' "$listing" | grep -cE '[[:space:]](smmla|ummla|usmmla)[[:space:]]')
        case "$o" in
            */kernels/arm/kernels_dotprod.o) [ "$sdot" -gt 0 ] && [ "$smmla" -eq 0 ] || bad="$bad $o (sdot $sdot, smmla $smmla)" ;;
            */kernels/arm/kernels_i8mm.o) [ "$smmla" -gt 0 ] || bad="$bad $o (no smmla: built without its flags?)" ;;
            *)
                portable=$((portable + 1))
                [ $((sdot + smmla)) -eq 0 ] || bad="$bad $o ($sdot sdot, $smmla smmla)"
                ;;
        esac
    done
    if [ -z "$bad" ] && [ "$portable" -ge 20 ]; then
        pass "byte products only in the set files ($portable portable objects read)"
    else
        fail "byte products outside their set files, or too few objects ($portable):$bad"
    fi
}
if command -v "$OBJDUMP" > /dev/null 2>&1; then
    objects_check
else
    fail "$OBJDUMP is not installed (Debian: binutils-aarch64-linux-gnu)"
fi

# The kernel tests of one set: the f32 kernels', the exact products' (all but the batch and thread
# invariance, which the bits of the per-(row, token) model already imply and which costs minutes
# under emulation), the choice of sets.
kernel_tests() {
    cpu=$1 set=$2
    filters="tests/test_kernels.c tests/test_kernels_arm.c kernels_choice kernels_exact_type_facts"
    if [ "$set" != scalar ]; then
        filters="$filters kernels_${set}_bit_identical kernels_${set}_nonfinite kernels_${set}_joined kernels_${set}_exact_products kernels_${set}_packed_products"
    fi
    log=$OUT/tests-$cpu.log
    # shellcheck disable=SC2086
    QUILL_BIN=$ARM_BUILD/quill "$QEMU" -cpu "$cpu" "$ARM_BUILD/quill_kernel_test" $filters > "$log" 2>&1
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [ -n "$summary" ] && [ "${summary#* passed, }" = "0 failed" ] && [ "${summary%% passed*}" -gt 0 ]; then
        pass "kernel tests on $cpu ($set set): $summary"
    else
        grep -E '^(FAIL|    )' "$log" | head -n 20
        fail "kernel tests on $cpu ($set set): ${summary:-the runner did not finish} (see $log)"
    fi
}

# One model's prompt logits and greedy continuation, on the x86-64 build with the set given
# ($3: the reference) and under qemu on one CPU model ($1) whose default set must be $2.
PROMPT="Once upon a time, in a small village"
model_logits() {
    cpu=$1 set=$2 ref_set=$3 model=$4
    name=$(basename "$model" .gguf)
    ref=$OUT/$name-x86-$ref_set
    if [ ! -f "$ref.logits" ]; then
        if ! QUILL_ISA=$ref_set "$HOST_BUILD/quill" run -m "$model" -p "$PROMPT" -n 8 --temp 0 -t 2 \
            --logits "$ref.logits" > "$ref.txt" 2> "$ref.err"; then
            fail "$name: the x86-64 run with QUILL_ISA=$ref_set (see $ref.err)"
            return
        fi
    fi
    arm=$OUT/$name-$cpu
    if ! "$QEMU" -cpu "$cpu" "$ARM_BUILD/quill" run -m "$model" -p "$PROMPT" -n 8 --temp 0 -t 2 -v \
        --logits "$arm.logits" > "$arm.txt" 2> "$arm.err"; then
        fail "$name on $cpu: quill run failed (see $arm.err)"
        return
    fi
    ran=$(sed -n 's/.*kernels \([a-z0-9]*\),.*/\1/p' "$arm.err" | head -n 1)
    if [ "$ran" != "$set" ]; then
        fail "$name on $cpu: ran the ${ran:-?} set, expected $set"
    elif ! cmp -s "$ref.logits" "$arm.logits"; then
        fail "$name on $cpu ($ran set): the logits differ from the x86-64 $ref_set set's ($(cmp "$ref.logits" "$arm.logits" | head -n 1))"
    elif ! cmp -s "$ref.txt" "$arm.txt"; then
        fail "$name on $cpu ($ran set): the greedy continuation differs from the x86-64 $ref_set set's"
    else
        pass "$name on $cpu: the $ran set's logits ($(wc -c < "$arm.logits") bytes) and continuation are the x86-64 $ref_set set's, bit for bit"
    fi
}

models=""
for m in stories260K.gguf synth-k-q4_k_m.gguf; do
    if [ -f "$SHARED/models/$m" ]; then
        models="$models $SHARED/models/$m"
    elif [ "${QUILL_REQUIRE_SHARED:-0}" = 1 ]; then
        fail "$SHARED/models/$m is missing (QUILL_REQUIRE_SHARED=1)"
    else
        echo "skipped: $SHARED/models/$m is missing (QUILL_SHARED)"
    fi
done

# the x86-64 set to compare the aarch64 sets with: avx2, where this CPU offers it
fast_ref=avx2
if [ -n "$models" ] && ! QUILL_ISA=avx2 "$HOST_BUILD/quill" run -m "$SHARED/models/stories260K.gguf" -p x -n 1 -t 1 > /dev/null 2>&1; then
    echo "note: this x86-64 CPU lacks the avx2 set: the aarch64 sets' logits are not compared"
    fast_ref=""
fi

for target in max:i8mm neoverse-n1:dotprod cortex-a72:scalar; do
    cpu=${target%%:*} set=${target#*:}
    echo "== qemu-aarch64 -cpu $cpu: the $set set =="
    kernel_tests "$cpu" "$set"
    ref_set=$fast_ref
    [ "$set" = scalar ] && ref_set=scalar
    [ -n "$ref_set" ] || continue
    for model in $models; do model_logits "$cpu" "$set" "$ref_set" "$model"; done
done
finish
