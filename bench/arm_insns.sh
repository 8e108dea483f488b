#!/bin/sh
# The aarch64 sets' exact products counted in instructions, since no machine here runs aarch64:
# the cross build's bench/insn_probe under qemu-user with bench/qemu_insns.c, a plugin counting the
# guest's executed instructions. Per type, set and token count, one product's instructions from the
# file's rows and from the load-time layout (the count of REPS + 2 products less that of REPS, over
# 2), and their ratio. The dotprod set runs on qemu's neoverse-n1 (no i8mm), the i8mm set on max.
# A count is not a speed; it is what can be measured of these loops here (bench/README.md).
#
#   bench/arm_insns.sh                   q4_0 q8_0 q4_K q5_K q6_K, 2048 x 2048, 1 and 16 tokens
#   TYPES="q4_K" TOKENS="1" ROWS=256 COLS=4096 bench/arm_insns.sh
# Needs Debian's gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user (make deps installs them).
set -eu
cd "$(dirname "$0")/.."
TYPES=${TYPES:-q4_0 q8_0 q4_K q5_K q6_K}
TOKENS=${TOKENS:-1 16}
ROWS=${ROWS:-2048}
COLS=${COLS:-2048}
ARM_BUILD=${ARM_BUILD:-build-arm64-test}
CROSS_CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU:-qemu-aarch64}
make -s -j"$(nproc)" CC="$CROSS_CC" BUILD="$ARM_BUILD" "$ARM_BUILD/insn_probe"
plugin=$ARM_BUILD/qemu_insns.so
cc -shared -fPIC -O2 -Wall -Wextra -o "$plugin" bench/qemu_insns.c

count() { # cpu isa type tokens reps mode
    "$QEMU" -cpu "$1" -plugin "$plugin" -d plugin "$ARM_BUILD/insn_probe" "$2" "$3" "$ROWS" "$COLS" "$4" "$5" "$6" 2>&1 |
        sed -n 's/^insns //p'
}
per_product() { # cpu isa type tokens mode
    a=$(count "$1" "$2" "$3" "$4" 1 "$5")
    b=$(count "$1" "$2" "$3" "$4" 3 "$5")
    echo $(((b - a) / 2))
}

echo "instructions per product of $ROWS x $COLS (qemu-aarch64 $("$QEMU" --version | head -n 1 | sed 's/.*version //'))"
printf '%-8s %-6s %6s %16s %16s %8s %14s\n' set type tokens "file's rows" layout ratio "per MAC (lay.)"
for target in neoverse-n1:dotprod max:i8mm; do
    cpu=${target%%:*} isa=${target#*:}
    for type in $TYPES; do
        for nt in $TOKENS; do
            rows=$(per_product "$cpu" "$isa" "$type" "$nt" rows)
            packed=$(per_product "$cpu" "$isa" "$type" "$nt" packed)
            awk -v s="$isa" -v t="$type" -v n="$nt" -v r="$rows" -v p="$packed" -v m="$ROWS" -v c="$COLS" \
                'BEGIN { printf "%-8s %-6s %6d %16d %16d %7.2fx %14.3f\n", s, t, n, r, p, r / p, p / (m * c * n) }'
        done
    done
done
