#!/bin/sh
# quill serve against the reference's llama-server (../shared/ref/bin) on a TinyLlama-1.1B-shaped
# q4_0 model (random weights, real tokenizer): aggregate generated tokens/s and time to first token
# with 1, 4, 8 and 16 concurrent streams, the two servers alternating at each level so that both
# see the machine in the same minutes. Same model, slots (16), context, threads, prompts (a
# different 128-token prompt per stream, so no prefix is shared) and 64 generated tokens per
# stream (ignore_eos). Not a test: it prints a table.
#
#   bench/serve.sh [DIR]     models go to DIR (default /tmp/quill-bench; reused when present)
# Environment: QUILL (default build/quill), THREADS (2), STREAMS ("1 4 8 16"), ROUNDS (2), GEN (64),
# PROMPT (128).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
LLAMA=${LLAMA:-$root/../shared/ref/bin/llama-server}
THREADS=${THREADS:-2}
STREAMS=${STREAMS:-"1 4 8 16"}
ROUNDS=${ROUNDS:-2}
GEN=${GEN:-64}
PROMPT=${PROMPT:-128}
DIR=${1:-/tmp/quill-bench}
VOCAB=$root/../shared/tokenizer/ggml-vocab-llama-spm.gguf
SLOTS=16
CTX=$((SLOTS * 256))

die() { echo "serve.sh: $*" >&2; exit 1; }
[ -x "$QUILL" ] || die "$QUILL is not built (run make)"
[ -x "$LLAMA" ] || die "$LLAMA is missing (the shared reference data)"
command -v python3 >/dev/null || die "python3 is needed for the load generator"
mkdir -p "$DIR"
f16=$DIR/tinyllama-f16.gguf
q4=$DIR/tinyllama-q4_0.gguf
if [ ! -f "$f16" ]; then
    "$QUILL" synth --like tinyllama-1.1b --vocab "$VOCAB" -o "$f16.part" > "$DIR/synth.log" 2>&1 || die "synth failed"
    mv "$f16.part" "$f16"
fi
if [ ! -f "$q4" ]; then
    "$QUILL" quantize "$f16" "$q4.part" q4_0 > "$DIR/quantize.log" 2>&1 || die "quantize failed"
    mv "$q4.part" "$q4"
fi

port=$((20000 + $$ % 20000))
pid=
stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=; }
trap stop EXIT INT TERM

start() {   # start NAME: one server on $port, waits for /health
    case $1 in
        quill) "$QUILL" serve -m "$q4" --port $port -np $SLOTS -c $CTX -t "$THREADS" > "$DIR/serve-quill.log" 2>&1 & ;;
        llama) "$LLAMA" -m "$q4" --host 127.0.0.1 --port $port -np $SLOTS -c $CTX -t "$THREADS" --log-disable \
                   > "$DIR/serve-llama.log" 2>&1 & ;;
    esac
    pid=$!
    i=0
    until curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1; do
        i=$((i + 1)); [ $i -lt 600 ] || die "$1 did not start (see $DIR/serve-$1.log)"; sleep 0.1
    done
}

# The load generator: N streams at once, each a different prompt of token ids; prints
# "tokens seconds ttft_median".
load() {
    python3 - "$port" "$1" "$GEN" "$PROMPT" "${2:-1000}" <<'PY'
import http.client, json, sys, threading, time, random, statistics
port, n, gen, plen, seed = (int(a) for a in sys.argv[1:6])
res = [None] * n
def one(i):
    rnd = random.Random(seed + i)
    prompt = [1] + [rnd.randrange(100, 31000) for _ in range(plen - 1)]
    body = json.dumps({"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time(); first = None; toks = 0; usage = None
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]": continue
        d = json.loads(line[6:])
        if d.get("usage"): usage = d["usage"]["completion_tokens"]
        for ch in d.get("choices") or []:
            if ch.get("text"):
                toks += 1
                if first is None: first = time.time() - t0
    res[i] = (usage if usage else toks, first or 0.0, time.time())
t0 = time.time()
th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in th: t.start()
for t in th: t.join()
end = max(r[2] for r in res)
print(sum(r[0] for r in res), end - t0, statistics.median(r[1] for r in res))
PY
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
echo "model $q4, $SLOTS slots, context $CTX, $THREADS threads, prompts $PROMPT tokens, $GEN generated per stream"
results=$DIR/serve-results.txt
: > "$results"
for round in $(seq "$ROUNDS"); do
    for n in $STREAMS; do
        for server in quill llama; do
            start $server
            load 1 99999 > /dev/null   # warm-up (first touch of the weights), a prompt no stream shares
            set -- $(load "$n")
            echo "$server $n $1 $2 $3" >> "$results"
            printf 'round %s  %-5s %2s streams: %5s tokens in %6.2f s = %6.1f t/s, TTFT median %.3f s\n' \
                "$round" "$server" "$n" "$1" "$2" "$(echo "$1 $2" | awk '{print $1 / $2}')" "$3" >&2
            stop
        done
    done
done
echo
echo "streams | quill t/s | llama-server t/s | ratio | quill TTFT s | llama-server TTFT s   (medians over $ROUNDS rounds)"
for n in $STREAMS; do
    awk -v n="$n" '
        function median(a, k,   i, j, t) { for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                          return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }
        $2 == n && $1 == "quill" { q[++nq] = $3 / $4; qt[nq] = $5 }
        $2 == n && $1 == "llama" { l[++nl] = $3 / $4; lt[nl] = $5 }
        END { mq = median(q, nq); ml = median(l, nl)
              printf "%7d | %9.1f | %16.1f | %5.2f | %12.3f | %19.3f\n", n, mq, ml, mq / ml, median(qt, nq), median(lt, nl) }' "$results"
done
