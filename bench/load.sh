#!/bin/sh
# The long load test of quill serve (issue 39): tests/node/load.mjs for DURATION s (default 120) with
# CLIENTS (32) clients on 127.0.0.1, an ephemeral port: streamed and whole requests, abandoned and
# malformed ones, long and short prompts; fails on any error, any answer that differs from the same
# request alone, resident memory that grows after the warm-up, or slots that do not come back.
# The suite runs a 10-second version (tests/test_server_load.c). Not part of the suite.
#
#   bench/load.sh                 # stories260K from ../shared, 120 s, 32 clients, 8 slots
# Environment: QUILL (default build/quill), MODEL, DURATION, CLIENTS, SLOTS (8), THREADS (2),
# SEED (1), RSS_SLACK (MiB, 8).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
MODEL=${MODEL:-$root/../shared/models/stories260K.gguf}
[ -x "$QUILL" ] || { echo "load.sh: $QUILL is not built (run make)" >&2; exit 1; }
command -v node >/dev/null || { echo "load.sh: node is needed for the clients" >&2; exit 1; }
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uptime | sed 's/.*load average/load average/')"
status=0
node "$root/tests/node/load.mjs" --quill "$QUILL" --model "$MODEL" --seconds "${DURATION:-120}" \
    --clients "${CLIENTS:-32}" --slots "${SLOTS:-8}" --threads "${THREADS:-2}" --seed "${SEED:-1}" \
    --rss-slack "${RSS_SLACK:-8}" || status=$?
echo "$(date -u '+%H:%M UTC'), $(uptime | sed 's/.*load average/load average/')"
exit $status
