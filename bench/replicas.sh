#!/bin/sh
# The nginx deployment measured (deploy/README.md): aggregate generation with 1 replica x 2 threads
# against 2 replicas x 1 thread behind nginx (deploy/nginx/quill.conf, ports rewritten), and the
# time to first token of a conversation's second turn with and without affinity (X-Session-Id).
# Not a test: it prints its figures.
#
#   bench/replicas.sh [DIR]   DIR holds tinyllama-q4_0.gguf (bench/serve.sh makes it); default /tmp/quill-bench
# Environment: QUILL (build/quill), STREAMS (8), GEN (32), PROMPT (128), CONVS (8).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
QUILL=${QUILL:-$root/build/quill}
DIR=${1:-/tmp/quill-bench}
STREAMS=${STREAMS:-8}
GEN=${GEN:-32}
PROMPT=${PROMPT:-128}
CONVS=${CONVS:-8}
model=$DIR/tinyllama-q4_0.gguf
[ -f "$model" ] || { echo "replicas.sh: $model is missing (run bench/serve.sh first)" >&2; exit 1; }
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "replicas.sh: nginx is missing" >&2; exit 1; }
tmp=$(mktemp -d)
base=$((21000 + $$ % 20000))
pa=$((base + 1)) pb=$((base + 2)) pn=$((base + 3))
pids=
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

wait_health() { i=0; until curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 600 ] || exit 1; sleep 0.1; done; }
replica() {   # replica PORT THREADS SLOTS
    "$QUILL" serve -m "$model" --port "$1" -t "$2" -np "$3" -c $(($3 * 1024)) > "$tmp/replica-$1.log" 2>&1 &
    pids="$pids $!"
    wait_health "$1"
}
nginx_up() {
    sed -e "s/127.0.0.1:8081/127.0.0.1:$pa/; s/127.0.0.1:8082/127.0.0.1:$pb/; s/listen 127.0.0.1:8080/listen 127.0.0.1:$pn/" \
        "$root/deploy/nginx/quill.conf" > "$tmp/quill.conf"
    cat > "$tmp/nginx.conf" <<NGX
$( [ "$(id -u)" = 0 ] && echo "user root;" )
pid $tmp/nginx.pid;
error_log $tmp/error.log;
events { worker_connections 512; }
http { access_log off; client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy; fastcgi_temp_path $tmp/f;
       uwsgi_temp_path $tmp/u; scgi_temp_path $tmp/s; include $tmp/quill.conf; }
NGX
    /usr/sbin/nginx -e "$tmp/error.log" -p "$tmp" -c "$tmp/nginx.conf" -g "daemon off;" &
    pids="$pids $!"
    sleep 0.5
}

load() {   # load PORT: STREAMS streams at once -> "tokens seconds"
    python3 - "$1" "$STREAMS" "$GEN" "$PROMPT" <<'PY'
import http.client, json, sys, threading, time, random
port, n, gen, plen = (int(a) for a in sys.argv[1:5])
res = [0] * n
def one(i):
    rnd = random.Random(1000 + i)
    prompt = [1] + [rnd.randrange(100, 31000) for _ in range(plen - 1)]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": gen, "temperature": 0,
              "ignore_eos": True}), {"Content-Type": "application/json"})
    res[i] = json.loads(c.getresponse().read())["usage"]["completion_tokens"]
t0 = time.time()
th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in th: t.start()
for t in th: t.join()
print(sum(res), time.time() - t0)
PY
}

followups() {   # followups PORT AFFINITY(0/1): median TTFT of turn 2 over CONVS conversations
    python3 - "$1" "$2" "$CONVS" <<'PY'
import http.client, json, sys, time, statistics
port, affinity, convs = (int(a) for a in sys.argv[1:4])
def chat(msgs, session, stream):
    h = {"Content-Type": "application/json"}
    if affinity: h["X-Session-Id"] = session
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 8, "temperature": 0,
              "stream": stream}), h)
    r = c.getresponse()
    if not stream: return json.loads(r.read())["choices"][0]["message"]["content"], 0
    for line in r:
        if line.startswith(b"data: ") and b'"content":"' in line and b'"content":""' not in line:
            return None, time.time() - t0
    return None, time.time() - t0
ttft = []
for k in range(convs):
    system = "You are storyteller %d of run %d. " % (k, affinity) + "Tell long and happy stories about animals. " * 30
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Tell me a story"}]
    reply, _ = chat(msgs, "conv-%d" % k, False)
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    ttft.append(chat(msgs, "conv-%d" % k, True)[1])
print("%.3f" % statistics.median(ttft))
PY
}

echo "model $model, $STREAMS streams x ($PROMPT prompt + $GEN generated tokens)"
replica $pa 2 $STREAMS
set -- $(load $pa)
echo "1 replica x 2 threads:        $1 tokens in $2 s = $(echo "$1 $2" | awk '{printf "%.1f", $1/$2}') t/s"
kill $pids; wait 2>/dev/null || true; pids=
replica $pa 1 $((STREAMS / 2)); replica $pb 1 $((STREAMS / 2)); nginx_up
set -- $(load $pn)
echo "2 replicas x 1 thread, nginx: $1 tokens in $2 s = $(echo "$1 $2" | awk '{printf "%.1f", $1/$2}') t/s"
echo "follow-up turn TTFT (median of $CONVS, ~300-token system prompt): with affinity $(followups $pn 1) s, without $(followups $pn 0) s"
