#!/bin/sh
# Installs the Debian packages listed in scripts/debian-packages.txt. Works on a fresh machine: as
# root without sudo, as a user through sudo, and before any `apt-get update` (it runs one first).
# --dry-run prints the commands instead of running them.
set -eu
cd "$(dirname "$0")/.."

dry_run=0
case "${1:-}" in
    "") ;;
    --dry-run) dry_run=1 ;;
    *) echo "install-deps: unknown option '$1' (the only one is --dry-run)" >&2; exit 2 ;;
esac

packages=""
while read -r package guard command rest; do
    case "$package" in "" | "#"*) continue ;; esac
    if [ "$guard" = "unless" ] && [ -n "$command" ]; then
        command -v "$command" >/dev/null 2>&1 && continue
    elif [ -n "$guard" ] && [ "${guard#\#}" = "$guard" ]; then
        echo "install-deps: scripts/debian-packages.txt: '$guard' after '$package' (a line is PACKAGE [unless COMMAND])" >&2
        exit 1
    fi
    packages="$packages $package"
done < scripts/debian-packages.txt
if [ -z "$packages" ]; then
    echo "install-deps: scripts/debian-packages.txt lists no packages" >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1; then
    as_root="sudo"
else
    echo "install-deps: installing packages needs root, and sudo is not installed: run this script as root" >&2
    exit 1
fi

run() {
    if [ "$dry_run" -eq 1 ]; then echo "$*"; else "$@"; fi
}
# A package named PACKAGE:ARCH is another architecture's build (Debian multiarch: the aarch64
# libraries of make cross-test): dpkg must know that architecture before apt-get update reads its lists.
for package in $packages; do
    case "$package" in
        *:*)
            arch=${package##*:}
            if [ "$arch" != "$(dpkg --print-architecture)" ] && ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
                # shellcheck disable=SC2086
                run $as_root dpkg --add-architecture "$arch"
            fi
            ;;
    esac
done
# sudo resets the environment, so the variable that keeps apt from asking questions goes through env.
# $as_root and $packages are unquoted on purpose: empty must vanish, and the list must split into words.
# shellcheck disable=SC2086
run $as_root env DEBIAN_FRONTEND=noninteractive apt-get update
# shellcheck disable=SC2086
run $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages
