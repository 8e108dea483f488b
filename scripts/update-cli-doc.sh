#!/bin/sh
# Refreshes the `--help` blocks of docs/cli.md from a built quill: each fenced block that starts
# with "$ quill COMMAND --help" (or "$ quill --help") gets that command's output as the binary
# prints it now. The prose around the blocks is left alone: a new flag still wants its sentence.
# tests/test_docs.c fails while a flag of some `quill COMMAND --help` is missing from its section.
#
#   scripts/update-cli-doc.sh [QUILL]      QUILL defaults to build/quill
set -eu
quill=${1:-build/quill}
doc=docs/cli.md
[ -x "$quill" ] || { echo "update-cli-doc: $quill is not an executable (build it, or pass its path)" >&2; exit 1; }
[ -f "$doc" ] || { echo "update-cli-doc: run from the repository root ($doc not found)" >&2; exit 1; }
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
awk -v quill="$quill" '
    function emit(args,    cmd, line) {
        cmd = quill " " args " 2>&1"
        while ((cmd | getline line) > 0) print line
        close(cmd)
    }
    skipping && /^```/ { skipping = 0 }
    skipping { next }
    /^\$ quill (--help|[a-z]+ --help)$/ && prev ~ /^```text$/ {
        print
        args = $0
        sub(/^\$ quill /, "", args)
        emit(args)
        skipping = 1
        prev = $0
        next
    }
    { print; prev = $0 }
' "$doc" > "$tmp"
cat "$tmp" > "$doc"
echo "update-cli-doc: $doc refreshed from $quill"
