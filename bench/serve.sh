#!/bin/sh
# quill serve against the reference's llama-server (../shared/ref/bin) on a TinyLlama-1.1B-shaped
# q4_0 model (random weights, real tokenizer): aggregate generated tokens/s and time to first token
# with 1, 4, 8 and 16 concurrent streams, the two servers alternating at each level so that both
# see the machine in the same minutes. Same model, slots (16), context, threads, prompts (a
# different 128-token prompt per stream, so no prefix is shared) and 64 generated tokens per
# stream (ignore_eos). Then, per level, the time to first token of a new short request while the
# other streams read long prompts (LONG tokens) and generate. Not a test: it prints tables.
#
#   bench/serve.sh [DIR]     models go to DIR (default /tmp/quill-bench; reused when present)
# Environment: QUILL (default build/quill), THREADS (2), STREAMS ("1 4 8 16"), ROUNDS (2), GEN (64),
# PROMPT (128), LONG (1024), PROBES (10), PROBE_STREAMS ("4 8 16"; empty: no TTFT runs), SERVERS
# ("quill llama"; "quill" alone for quill's own scaling).
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
LONG=${LONG:-1024}
PROBES=${PROBES:-10}
PROBE_STREAMS=${PROBE_STREAMS-"4 8 16"}
SERVERS=${SERVERS:-"quill llama"}
DIR=${1:-/tmp/quill-bench}
VOCAB=$root/../shared/tokenizer/ggml-vocab-llama-spm.gguf
SLOTS=16
CTX=$((SLOTS * 2048))   # a slot holds a long prompt of the TTFT runs and its generation

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

# The load generator. `load N`: N streams at once, each a different prompt of PROMPT token ids and
# GEN tokens; prints "tokens seconds ttft_median ttft_p95 decode_tps": decode_tps is the streams'
# tokens after their first, over the time from the last stream's first token to the last one's end
# (generation alone, with every stream generating). `probe N`: N - 1 streams read LONG-token
# prompts and then generate (each restarts with a new prompt when it ends), and a new request of a
# 16-token prompt arrives every 0.5 s (PROBES of them, one at a time): prints the median and p95 of
# their time to first token.
load() {
    python3 - "$port" "$1" "$GEN" "$PROMPT" "${2:-1000}" "${3:-load}" "$LONG" "$PROBES" <<'PY'
import http.client, json, sys, threading, time, random, statistics
port, n, gen, plen, seed = (int(a) for a in sys.argv[1:6])
mode, long_len, probes = sys.argv[6], int(sys.argv[7]), int(sys.argv[8])
def stream(prompt, max_tokens, stop=None):
    """(tokens, time to first token, time of the first token, end time); stops early when stop() says so"""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
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
                if first is None: first = time.time()
        if stop and stop(): break
    c.close()
    return (usage if usage else toks), (first or time.time()) - t0, first or time.time(), time.time()
def prompt_of(rnd, length):
    return [1] + [rnd.randrange(100, 31000) for _ in range(length - 1)]
def p95(a):
    a = sorted(a); return a[min(len(a) - 1, int(round(0.95 * (len(a) - 1))))]
if mode == "load":
    res = [None] * n
    def one(i): res[i] = stream(prompt_of(random.Random(seed + i), plen), gen)
    t0 = time.time()
    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in th: t.start()
    for t in th: t.join()
    end = max(r[3] for r in res); last_first = max(r[2] for r in res)
    decode = sum(r[0] - 1 for r in res) / (end - last_first) if end > last_first else 0.0
    ttft = [r[1] for r in res]
    print(sum(r[0] for r in res), end - t0, statistics.median(ttft), p95(ttft), decode)
else:
    done = [False]
    def background(i):
        k = 0
        while not done[0]:
            stream(prompt_of(random.Random(seed + 7919 * i + k), long_len), gen, lambda: done[0]); k += 1
    th = [threading.Thread(target=background, args=(i,)) for i in range(n - 1)]
    for t in th: t.start()
    time.sleep(1.0)
    ttft = []
    for k in range(probes):
        ttft.append(stream(prompt_of(random.Random(seed + 100000 + k), 16), 2)[1])
        time.sleep(0.5)
    done[0] = True
    for t in th: t.join()
    print(0, 0, statistics.median(ttft), p95(ttft), 0)
PY
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
echo "model $q4, $SLOTS slots, context $CTX, $THREADS threads, prompts $PROMPT tokens, $GEN generated per stream"
results=$DIR/serve-results.txt
: > "$results"
echo "$(date -u '+%H:%M UTC') $(uptime | sed 's/.*load average/load average/')"
for round in $(seq "$ROUNDS"); do
    for n in $STREAMS; do
        for server in $SERVERS; do
            start $server
            load 1 99999 > /dev/null   # warm-up (first touch of the weights), a prompt no stream shares
            set -- $(load "$n" 1000 load)
            echo "load $server $n $1 $2 $3 $4 $5" >> "$results"
            printf 'round %s  %-5s %2s streams: %5s tokens in %6.2f s = %6.1f t/s (generating: %6.1f t/s), TTFT median %.3f s, p95 %.3f s\n' \
                "$round" "$server" "$n" "$1" "$2" "$(echo "$1 $2" | awk '{print $1 / $2}')" "$5" "$3" "$4" >&2
            case " $PROBE_STREAMS " in *" $n "*)
                set -- $(load "$n" 2000 probe)
                echo "probe $server $n $3 $4" >> "$results"
                printf 'round %s  %-5s %2s streams: a new request beside %s long prompts: TTFT median %.3f s, p95 %.3f s\n' \
                    "$round" "$server" "$n" $((n - 1)) "$3" "$4" >&2 ;;
            esac
            stop
        done
    done
done
echo "$(date -u '+%H:%M UTC') $(uptime | sed 's/.*load average/load average/')"
med='function median(a, k,   i, j, t) { for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }'
echo
echo "Aggregate tokens/s (all streams' tokens over the wall time, prompts included; generating: with every stream generating),"
echo "TTFT of the streams started together; medians over $ROUNDS rounds. x1: each server's aggregate over its own one stream."
echo
echo "| streams | quill t/s | llama-server t/s | ratio | quill generating t/s | llama-server generating t/s | ratio | quill x1 | llama-server x1 | quill TTFT median / p95 s | llama-server TTFT median / p95 s |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in $STREAMS; do
    awk -v n="$n" "$med"'
        $1 == "load" && $3 == 1 && $2 == "quill" { q1[++nq1] = $4 / $5 }
        $1 == "load" && $3 == 1 && $2 == "llama" { l1[++nl1] = $4 / $5 }
        $1 == "load" && $3 == n && $2 == "quill" { q[++nq] = $4 / $5; qt[nq] = $6; qp[nq] = $7; qd[nq] = $8 }
        $1 == "load" && $3 == n && $2 == "llama" { l[++nl] = $4 / $5; lt[nl] = $6; lp[nl] = $7; ld[nl] = $8 }
        END { mq = median(q, nq); ml = median(l, nl); dq = median(qd, nq); dl = median(ld, nl)
              x1q = nq1 ? sprintf("%.2fx", mq / median(q1, nq1)) : "-"; x1l = nl1 && ml > 0 ? sprintf("%.2fx", ml / median(l1, nl1)) : "-"
              printf "| %d | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx | %s | %s | %.3f / %.3f | %.3f / %.3f |\n", n, mq, ml, (ml > 0 ? mq / ml : 0),
                     dq, dl, (dl > 0 ? dq / dl : 0), x1q, x1l, median(qt, nq), median(qp, nq), median(lt, nl), median(lp, nl) }' "$results"
done
if [ -n "$PROBE_STREAMS" ]; then
    echo
    echo "Time to first token of a new request (16-token prompt) while the other streams read $LONG-token prompts"
    echo "and generate; $PROBES requests per run, median and p95 of each run, then the medians over $ROUNDS rounds."
    echo
    echo "| streams | quill TTFT median / p95 s | llama-server TTFT median / p95 s |"
    echo "| ---: | ---: | ---: |"
    for n in $PROBE_STREAMS; do
        awk -v n="$n" "$med"'
            $1 == "probe" && $3 == n && $2 == "quill" { q[++nq] = $4; qp[nq] = $5 }
            $1 == "probe" && $3 == n && $2 == "llama" { l[++nl] = $4; lp[nl] = $5 }
            END { if (nq) printf "| %d | %.3f / %.3f | %.3f / %.3f |\n", n, median(q, nq), median(qp, nq), median(l, nl), median(lp, nl) }' "$results"
    done
fi
