// A bounded load test of quill serve, with node's own http module (no packages):
//
//   node tests/node/load.mjs --quill build/quill --model MODEL [--seconds 120] [--clients 32]
//        [--slots 8] [--threads 2] [--seed 1] [--min-completed 0] [--min-streamed 0]
//        [--min-abandoned 0] [--json]
//
// It starts the server on 127.0.0.1 with an ephemeral port, answers each request of a fixed set
// alone (the baselines: completions and chats, short and long prompts, greedy and seeded
// sampling), then runs CLIENTS clients for SECONDS, each picking requests of the set at random:
// streamed or not, some abandoned (the client closes the connection after a random delay or
// after the first streamed event), a few malformed. With --min-* the clients go on after SECONDS
// until that many requests of each kind are done (at most 6x SECONDS in all), so that a slow
// machine or build (the sanitizers) still carries the mix. It checks:
//   - no error: every request carried through has status 200, every malformed one 400 with an
//     error object, and the server exits 0 on SIGTERM at the end;
//   - same answers: each completed answer (streamed ones joined) has the baseline's text and
//     finish reason (quill's answers do not depend on what else runs, nor on which slot or cached
//     prefix serves them);
//   - no leak: the server's resident memory (VmRSS) after the warm-up (the first third) grows by
//     at most --rss-slack MiB (default 8) from the median of the second third to the last;
//   - the slots come back: /health shows every slot idle after the clients stop.
// Prints a summary (or JSON with --json) and exits 1 on any failure. bench/load.sh runs the
// long version, tests/test_server_load.c a short one inside the suite.
import http from 'node:http';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';

const opt = { quill: 'build/quill', model: null, seconds: 120, clients: 32, slots: 8, threads: 2, seed: 1,
              'rss-slack': 8, 'min-completed': 0, 'min-streamed': 0, 'min-abandoned': 0, json: false };
for (let i = 2; i < process.argv.length; i++) {
    const k = process.argv[i].replace(/^--/, '');
    if (!(k in opt)) fail_usage(`unknown option ${process.argv[i]}`);
    if (k === 'json') { opt.json = true; continue; }
    const v = process.argv[++i];
    if (v === undefined) fail_usage(`${process.argv[i - 1]} needs a value`);
    opt[k] = typeof opt[k] === 'number' ? Number(v) : v;
}
if (!opt.model) fail_usage('--model is required');
function fail_usage(msg) {
    console.error(`load.mjs: ${msg}\nusage: node tests/node/load.mjs --quill BIN --model MODEL [--seconds N] ` +
                  '[--clients N] [--slots N] [--threads N] [--seed N] [--rss-slack MiB] [--min-completed N] ' +
                  '[--min-streamed N] [--min-abandoned N] [--json]');
    process.exit(2);
}

// A small deterministic generator, so that a run can be repeated.
let state = (opt.seed * 2654435761) >>> 0 || 1;
function rnd() {
    state ^= state << 13; state >>>= 0; state ^= state >>> 17; state ^= state << 5; state >>>= 0;
    return state / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];

// ------------------------------------------------------------------ the server
const server = spawn(opt.quill, ['serve', '-m', opt.model, '--port', '0', '-np', String(opt.slots),
                                 '-c', String(opt.slots * 2048), '-t', String(opt.threads),
                                 '--max-connections-per-client', '256', '--max-queue', '256'],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '', exited = null;
server.stderr.on('data', (d) => { log += d; if (log.length > 1 << 20) log = log.slice(-(1 << 19)); });
server.on('exit', (code, signal) => { exited = { code, signal }; });
const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`the server did not get ready in 60 s:\n${log}`)), 60000);
    const poll = setInterval(() => {
        const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
        if (exited) { clearTimeout(t); clearInterval(poll); reject(new Error(`the server exited: ${log}`)); }
        if (m && /ready in/.test(log)) { clearTimeout(t); clearInterval(poll); resolve(Number(m[1])); }
    }, 50);
}).catch((e) => { console.error(`load.mjs: ${e.message}`); server.kill('SIGKILL'); process.exit(1); });

function rss_mib() {
    try {
        const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${server.pid}/status`, 'utf8'));
        return m ? Number(m[1]) / 1024 : null;
    } catch { return null; }
}

// ------------------------------------------------------------------ requests
const story = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park ' +
              'with her friends. One day, she saw a big red ball under a tree and ran to get it. ';
const shorts = ['Once upon a time', 'The cat sat', 'Tom had a big dog.', 'One day, a bird', 'Lily wanted to'];
const specs = [];
for (let i = 0; i < 16; i++) {
    const long = i % 3 === 0;
    const text = long ? story.repeat(4 + (i % 4)) + shorts[i % shorts.length] : shorts[i % shorts.length] + ` (${i})`;
    const seeded = i % 5 === 4;  // sampling with a seed: as reproducible as greedy
    const sampling = seeded ? { temperature: 0.9, top_k: 40, seed: 1000 + i } : { temperature: 0 };
    const max_tokens = 8 + ((i * 7) % 41);
    if (i % 2 === 0) specs.push({ path: '/v1/completions', body: { prompt: text, max_tokens, ...sampling } });
    else specs.push({ path: '/v1/chat/completions',
                      body: { messages: [{ role: 'user', content: text }], max_tokens, ...sampling } });
}

// One request. abandon_ms >= 0: the client closes the connection after that long (streamed: or
// after the first event when abandon_ms is 0). Resolves {status, text, finish, error}.
function request(spec, stream, abandon_ms = -1, raw = null) {
    return new Promise((resolve) => {
        const body = raw ?? JSON.stringify({ ...spec.body, stream });
        const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: raw ? '/v1/chat/completions' : spec.path,
                                   headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
                                   agent: false });
        let done = false;
        const finish = (r) => { if (!done) { done = true; resolve(r); } };
        const abandon = () => { req.destroy(); finish({ abandoned: true }); };
        if (abandon_ms > 0) setTimeout(abandon, abandon_ms);
        req.on('error', (e) => finish({ error: e.message }));
        req.on('response', (res) => {
            let buf = '';
            res.setEncoding('utf8');
            res.on('data', (d) => {
                buf += d;
                if (stream && abandon_ms === 0 && buf.includes('data: ')) abandon();
            });
            res.on('error', (e) => finish({ error: e.message }));
            res.on('end', () => {
                if (res.statusCode !== 200 || !stream) {
                    let o = null;
                    try { o = JSON.parse(buf); } catch { return finish({ status: res.statusCode, error: `not JSON: ${buf.slice(0, 200)}` }); }
                    if (res.statusCode !== 200) return finish({ status: res.statusCode, body: o });
                    const c = o.choices?.[0];
                    return finish({ status: 200, text: c?.text ?? c?.message?.content, finish: c?.finish_reason });
                }
                let text = '', fin = null, ended = false;
                for (const line of buf.split('\n')) {
                    if (!line.startsWith('data: ')) continue;
                    if (line === 'data: [DONE]') { ended = true; continue; }
                    let o;
                    try { o = JSON.parse(line.slice(6)); } catch { return finish({ status: 200, error: `bad event: ${line.slice(0, 200)}` }); }
                    if (o.error) return finish({ status: 200, error: `error event: ${JSON.stringify(o.error)}` });
                    const c = o.choices?.[0];
                    if (!c) continue;
                    text += c.text ?? c.delta?.content ?? '';
                    if (c.finish_reason) fin = c.finish_reason;
                }
                if (!ended) return finish({ status: 200, error: 'the stream ended without [DONE]' });
                finish({ status: 200, text, finish: fin });
            });
        });
        req.end(body);
    });
}

const failures = [];
const fail = (what) => { if (failures.length < 20) failures.push(what); };

// The baselines: each request alone, on the idle server.
const baseline = [];
for (const s of specs) {
    const r = await request(s, false);
    if (r.status !== 200 || typeof r.text !== 'string') {
        console.error(`load.mjs: the baseline of ${s.path} failed: ${JSON.stringify(r)}\n${log.slice(-2000)}`);
        server.kill('SIGKILL');
        process.exit(1);
    }
    baseline.push(r);
}

// ------------------------------------------------------------------ the load
const counts = { completed: 0, streamed: 0, abandoned: 0, malformed: 0, mismatched: 0, errors: 0 };
const rss = [];
const t_start = Date.now(), t_end = t_start + opt.seconds * 1000, t_cap = t_start + 6 * opt.seconds * 1000;
const enough = () => counts.completed >= opt['min-completed'] && counts.streamed >= opt['min-streamed'] &&
                     counts.abandoned >= opt['min-abandoned'];
const going = () => Date.now() < t_end || (!enough() && Date.now() < t_cap);
const sampler = setInterval(() => { const m = rss_mib(); if (m !== null) rss.push([Date.now() - t_start, m]); }, 250);

async function client(id) {
    while (going()) {
        const u = rnd();
        if (u < 0.03) {  // malformed: an error the client can act on, nothing more
            const r = await request(null, false, -1, pick(['{"messages": [', '{"messages": "x"}', '[1, 2', '{"max_tokens": -5}']));
            counts.malformed++;
            if (r.status !== 400 || typeof r.body?.error?.message !== 'string')
                counts.errors++, fail(`client ${id}: a malformed request got ${JSON.stringify(r).slice(0, 300)}`);
            continue;
        }
        const i = Math.floor(rnd() * specs.length), stream = rnd() < 0.5;
        // abandoned: after the first event, or a random delay (a reply faster than that is checked)
        const abandon_ms = u < 0.18 ? (stream && rnd() < 0.5 ? 0 : Math.floor(1 + rnd() * 400)) : -1;
        const r = await request(specs[i], stream, abandon_ms);
        if (r.abandoned) { counts.abandoned++; continue; }
        if (r.status !== 200 || r.error) {
            counts.errors++;
            fail(`client ${id}: ${specs[i].path} ${stream ? 'streamed' : ''}: ${JSON.stringify(r).slice(0, 300)}`);
            continue;
        }
        counts.completed++;
        if (stream) counts.streamed++;
        const b = baseline[i];
        if (r.text !== b.text || r.finish !== b.finish) {
            counts.mismatched++;
            fail(`client ${id}: request ${i} (${specs[i].path}, ${stream ? 'streamed' : 'whole'}): ` +
                 `${JSON.stringify(r.text)} (${r.finish}), alone ${JSON.stringify(b.text)} (${b.finish})`);
        }
    }
}
await Promise.all(Array.from({ length: opt.clients }, (_, i) => client(i)));
clearInterval(sampler);
const seconds = (Date.now() - t_start) / 1000;

// The slots come back once the abandoned requests are noticed.
let health = null;
for (let k = 0; k < 100; k++) {
    health = await new Promise((resolve) => {
        http.get({ host: '127.0.0.1', port, path: '/health', agent: false }, (res) => {
            let b = ''; res.on('data', (d) => { b += d; });
            res.on('end', () => { try { resolve(JSON.parse(b)); } catch { resolve(null); } });
        }).on('error', () => resolve(null));
    });
    if (health?.slots_idle === opt.slots) break;
    await new Promise((r) => setTimeout(r, 100));
}
if (health?.slots_idle !== opt.slots) fail(`the slots did not come back: /health ${JSON.stringify(health)}`);

// Resident memory: the median of the second third against the median of the last third.
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.floor(s.length / 2)] : NaN; };
const third = seconds * 1000 / 3;
const mid = median(rss.filter(([t]) => t >= third && t < 2 * third).map(([, m]) => m));
const last = median(rss.filter(([t]) => t >= 2 * third).map(([, m]) => m));
const first = rss.length ? rss[0][1] : NaN, peak = Math.max(...rss.map(([, m]) => m));
if (!(last - mid <= opt['rss-slack'])) fail(`resident memory grew after the warm-up: ${mid.toFixed(1)} MiB -> ${last.toFixed(1)} MiB`);

server.kill('SIGTERM');
const exit = await new Promise((resolve) => {
    if (exited) return resolve(exited);
    const t = setTimeout(() => { server.kill('SIGKILL'); resolve({ code: null, signal: 'SIGKILL (no exit in 20 s)' }); }, 20000);
    server.on('exit', (code, signal) => { clearTimeout(t); resolve({ code, signal }); });
});
if (exit.code !== 0) fail(`the server's exit: ${JSON.stringify(exit)}\n${log.slice(-2000)}`);
if (counts.completed === 0) fail('no request completed');
if (counts.errors) fail(`${counts.errors} request(s) failed`);

const summary = { seconds: +seconds.toFixed(1), clients: opt.clients, slots: opt.slots, ...counts,
                  rss_mib: { start: +first.toFixed(1), after_warmup: +mid.toFixed(1), end: +last.toFixed(1), peak: +peak.toFixed(1) },
                  failures };
if (opt.json) console.log(JSON.stringify(summary));
else {
    console.log(`${opt.clients} clients, ${seconds.toFixed(1)} s, ${opt.slots} slots: ${counts.completed} completed ` +
                `(${counts.streamed} streamed), ${counts.abandoned} abandoned, ${counts.malformed} malformed, ` +
                `${counts.mismatched} different from alone, ${counts.errors} errors`);
    console.log(`resident memory: ${first.toFixed(1)} MiB at start, ${mid.toFixed(1)} after the warm-up, ` +
                `${last.toFixed(1)} at the end (peak ${peak.toFixed(1)})`);
    for (const f of failures) console.log(`FAIL ${f}`);
}
process.exit(failures.length ? 1 : 0);
