/* quill serve: options, startup, signals and shutdown. The HTTP side starts first and answers
 * /health with 503 "loading" until the model is ready, so that a balancer can tell a replica that
 * is starting from one that is down. */
#include "server.h"
#include "base/error.h"

#include <errno.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] =
    "usage: quill serve -m MODEL [options]\n"
    "  --host ADDR           address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
    "  --port N              port (default 8080; 0 = any free port, printed at start)\n"
    "  -c, --ctx-size N      total context in tokens, shared by the slots (default: 4096 per slot, at most\n"
    "                        the model's training context)\n"
    "  -np, --parallel N     slots: requests decoded together (default 4)\n"
    "  -t, --threads N       threads (default: all cores)\n"
    "  -ctk, --cache-type-k TYPE  KV cache type for keys: f32 (default, exact), f16, bf16, q8_0, q4_0\n"
    "  -ctv, --cache-type-v TYPE  KV cache type for values (the same types)\n"
    "  -b, --batch-size N    tokens per forward pass: every generating slot's next token, then chunks\n"
    "                        of the prompts being read (default 64)\n"
    "  --api-key KEY         require 'Authorization: Bearer KEY' on /v1 routes and /tokenize, /detokenize\n"
    "  --api-key-file F      the same, with the key read from the first line of F\n"
    "  --alias NAME          the model's name in /v1/models and replies (default: the file's name)\n"
    "  --chat-template F     Jinja chat template file (default: the model's own, else --chat-format)\n"
    "  --chat-format NAME    built-in template for a model without one (default chatml)\n"
    "  --timeout S           seconds a connection may stay idle while a reply is made or between\n"
    "                        requests (default 600)\n"
    "  --read-timeout S      seconds a request's header and body may take to arrive (default 15)\n"
    "  --max-connections-per-client N  open connections from one address (default 32; behind a\n"
    "                        proxy every client is the proxy's address: raise it there)\n"
    "  --max-queue N         requests waiting for a slot before 503 (default 64)\n"
    "  --max-connections N   open connections (default 256)\n"
    "  --max-body BYTES      request body limit (default 4194304)\n"
    "  --max-tokens N        largest max_tokens a request may ask for (default: no limit but the context)\n"
    "  --cors ORIGIN         allow browser requests from ORIGIN (e.g. https://example.com, or *)\n"
    "  -md, --model-draft F  speculative decoding with this draft model (same vocabulary), per request\n"
    "                        while the step's batch has room; replies do not change\n"
    "  --lookup              speculative decoding by n-gram lookup in each request's text (no model)\n"
    "  --draft-max N         tokens drafted at most per request and step (default 16)\n"
    "  --draft-min N         shorter drafts are not used (default 0)\n"
    "  --backend NAME        cpu (default) or vulkan: the -ngl layers on a GPU\n"
    "                        (docs/gpu.md; quill devices); embeddings and the draft model stay on the CPU\n"
    "  -ngl, --n-gpu-layers N  with --backend vulkan: the last N layers there, N > layers: the output\n"
    "                        too (default all)\n"
    "  --device N            with --backend vulkan: the device (quill devices; default 0)\n";

static bool parse_int(const char *opt, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "quill serve: %s: '%s' is not a whole number in %ld..%ld\n", opt, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

static char *read_text_file(const char *path, size_t limit) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(limit + 1);
    size_t n = buf ? fread(buf, 1, limit, f) : 0;
    bool bad = !buf || ferror(f) || (n == limit && fgetc(f) != EOF);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EFBIG;
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

static int parse_options(int argc, char **argv, server_config *c) {
    *c = (server_config){.host = "127.0.0.1", .port = 8080, .n_slots = 4, .n_batch = 64, .timeout_s = 600,
                         .read_timeout_s = 15, .max_per_client = 32, .max_queue = 64, .max_connections = 256, .max_depth = 64, .max_body = 4u << 20,
                         .chat_format = "chatml", .draft_max = 16, .n_gpu_layers = -1};
    const char *key_file = NULL, *draft_option = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return -1;
        }
        if (!strcmp(a, "--lookup")) {
            c->lookup = true;
            continue;
        }
        if (!strcmp(a, "--draft-max") || !strcmp(a, "--draft-min")) draft_option = a;
        if (i + 1 >= argc) {
            fprintf(stderr, "quill serve: unknown option or missing value '%s' (see quill serve --help)\n", a);
            return 1;
        }
        const char *v = argv[++i];
        long x;
#define INT(name1, name2, lo, hi, field)                                              \
    if (!strcmp(a, name1) || (*name2 && !strcmp(a, name2))) {                          \
        if (!parse_int(a, v, lo, hi, &x)) return 1;                                   \
        c->field = x;                                                                 \
        continue;                                                                     \
    }
        INT("--port", "", 0, 65535, port)
        INT("-c", "--ctx-size", 1, 1 << 24, n_ctx)
        INT("-np", "--parallel", 1, 256, n_slots)
        INT("-t", "--threads", 1, 1024, n_threads)
        INT("-b", "--batch-size", 1, 4096, n_batch)
        INT("--timeout", "", 1, 86400, timeout_s)
        INT("--read-timeout", "", 1, 86400, read_timeout_s)
        INT("--max-connections-per-client", "", 1, 65536, max_per_client)
        INT("--max-queue", "", 1, 1 << 20, max_queue)
        INT("--max-connections", "", 1, 65536, max_connections)
        INT("--max-body", "", 1024, 1L << 30, max_body)
        INT("--max-tokens", "", 1, 1 << 30, max_tokens)
        INT("--draft-max", "--spec-draft-n-max", 1, QUILL_DRAFT_MAX, draft_max)
        INT("--draft-min", "--spec-draft-n-min", 0, QUILL_DRAFT_MAX, draft_min)
        INT("-ngl", "--n-gpu-layers", -1, 1 << 20, n_gpu_layers)
        INT("--gpu-layers", "", -1, 1 << 20, n_gpu_layers)
        INT("--device", "", 0, 64, device)
#undef INT
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) c->model_path = v;
        else if (!strcmp(a, "--host")) c->host = v;
        else if (!strcmp(a, "--alias") || !strcmp(a, "-a")) c->alias = v;
        else if (!strcmp(a, "--api-key")) c->api_key = v;
        else if (!strcmp(a, "--api-key-file")) key_file = v;
        else if (!strcmp(a, "--chat-template")) c->chat_template_path = v;
        else if (!strcmp(a, "--chat-format")) c->chat_format = v;
        else if (!strcmp(a, "--cors")) c->cors_origin = v;
        else if (!strcmp(a, "-md") || !strcmp(a, "--model-draft")) c->model_draft = v;
        else if (!strcmp(a, "--backend")) {
            if (!strcmp(v, "cpu")) c->backend = QUILL_BACKEND_CPU;
            else if (!strcmp(v, "vulkan")) c->backend = QUILL_BACKEND_VULKAN;
            else {
                fprintf(stderr, "quill serve: --backend %s: the backends are cpu and vulkan\n", v);
                return 1;
            }
        }
        else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
            quill_error err;
            const bool keys = !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k");
            if (quill_cache_type_parse(v, keys ? &c->type_k : &c->type_v, &err)) {
                fprintf(stderr, "quill serve: %s: %s\n", a, err.message);
                return 1;
            }
        } else {
            fprintf(stderr, "quill serve: unknown option '%s' (see quill serve --help)\n", a);
            return 1;
        }
    }
    if (!c->model_path) {
        fprintf(stderr, "quill serve: no model given: use -m MODEL.gguf (see quill serve --help)\n");
        return 1;
    }
    if (c->n_gpu_layers > 0 && c->backend == QUILL_BACKEND_CPU)
        fprintf(stderr, "quill serve: note: -ngl %d ignored: quill runs on the CPU (--backend vulkan runs layers on a GPU)\n",
                c->n_gpu_layers);
    if (c->model_draft && c->lookup) {
        fprintf(stderr, "quill serve: give one of -md/--model-draft and --lookup (two ways of drafting)\n");
        return 1;
    }
    if (draft_option && !c->model_draft && !c->lookup) {
        fprintf(stderr, "quill serve: %s applies to speculative decoding: add -md DRAFT.gguf or --lookup\n", draft_option);
        return 1;
    }
    if (c->draft_min > c->draft_max) {
        fprintf(stderr, "quill serve: --draft-min %d is more than --draft-max %d\n", c->draft_min, c->draft_max);
        return 1;
    }
    if (key_file) {
        if (c->api_key) {
            fprintf(stderr, "quill serve: give --api-key or --api-key-file, not both\n");
            return 1;
        }
        char *k = read_text_file(key_file, 4096);
        if (!k) {
            fprintf(stderr, "quill serve: --api-key-file %s: %s\n", key_file, strerror(errno));
            return 1;
        }
        k[strcspn(k, "\r\n")] = 0;
        if (!*k) {
            fprintf(stderr, "quill serve: --api-key-file %s: the first line is empty\n", key_file);
            free(k);
            return 1;
        }
        c->api_key = k;   /* owned: freed by the caller through server.api_key */
        return 2;
    }
    return 0;
}

/* The model, its chat template and the engine. */
static quill_status load(server *s, quill_error *err) {
    const server_config *c = &s->cfg;
    quill_status st = quill_model_load(c->model_path, &s->model, err);
    if (st) return st;
    s->tok = quill_model_tokenizer(s->model);
    char *override = NULL;
    if (c->chat_template_path && !(override = read_text_file(c->chat_template_path, 1 << 20)))
        return quill_fail(err, QUILL_E_IO, "%s: cannot read the chat template: %s", c->chat_template_path,
                          strerror(errno));
    st = quill_chat_template_for(s->model, override, c->chat_format, &s->chat_template, err);
    free(override);
    if (st) return st;
    if ((st = quill_chat_check(s->chat_template, err))) return st;
    chat_caps_probe(s);
    const quill_hparams *hp = quill_model_hparams(s->model);
    int per_slot;
    if (c->n_ctx > 0) {
        per_slot = c->n_ctx / c->n_slots;
        if (per_slot < 1)
            return quill_fail(err, QUILL_E_ARG, "-c %d shared by %d slots leaves no context per slot", c->n_ctx,
                              c->n_slots);
    } else {
        per_slot = hp->n_ctx_train < 4096 ? (int)hp->n_ctx_train : 4096;
    }
    scheduler_params sp = {c->n_slots, per_slot, c->n_threads, c->n_batch, c->max_queue, c->type_k, c->type_v,
                           .lookup = c->lookup, .draft_max = c->draft_max, .draft_min = c->draft_min,
                           .backend = c->backend, .n_gpu_layers = c->n_gpu_layers, .device = c->device};
    if (c->model_draft) {
        if ((st = quill_model_load(c->model_draft, &s->draft_model, err))) return st;
        sp.draft_model = s->draft_model;
    }
    return scheduler_new(s->model, &sp, &s->sched, err);
}

int cmd_serve(int argc, char **argv) {
    server *s = calloc(1, sizeof *s);
    if (!s) return 1;
    int rc = parse_options(argc, argv, &s->cfg);
    if (rc == 2) {
        s->api_key = (char *)s->cfg.api_key;
        rc = 0;
    } else if (s->cfg.api_key) {
        s->api_key = strdup(s->cfg.api_key);
    }
    if (rc) {
        free(s);
        return rc < 0 ? 0 : rc;
    }
    pthread_mutex_init(&s->stats_mu, NULL);
    s->responses = response_store_new();
    pthread_mutex_init(&s->embed_mu, NULL);
    s->created = (long long)time(NULL);
    const char *base = strrchr(s->cfg.model_path, '/');
    s->model_id = strdup(s->cfg.alias ? s->cfg.alias : base ? base + 1 : s->cfg.model_path);

    /* SIGINT and SIGTERM are taken by sigwait below; every thread started from here on blocks them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    quill_error err;
    rc = 1;
    struct MHD_Daemon *d = http_start(s, &err);
    if (!d) {
        fprintf(stderr, "quill serve: %s\n", err.message);
        goto done;
    }
    fprintf(stderr, "quill serve: listening on http://%s:%d (loading %s)\n", s->cfg.host, http_port(d), s->cfg.model_path);
    double t0 = now_ms();
    if (load(s, &err)) {
        fprintf(stderr, "quill serve: %s\n", err.message);
        goto done;
    }
    atomic_store(&s->ready, true);
    fprintf(stderr, "quill serve: ready in %.0f ms: %d slots of %d tokens, %s kernels%s%s%s%s\n", now_ms() - t0,
            s->cfg.n_slots, scheduler_n_ctx(s->sched), scheduler_kernels(s->sched), scheduler_backend(s->sched),
            s->api_key ? ", API key required" : "",
            s->cfg.lookup ? ", speculative decoding by n-gram lookup" : s->cfg.model_draft ? ", draft model " : "",
            s->cfg.model_draft && !s->cfg.lookup ? s->cfg.model_draft : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "quill serve: %s: finishing\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    atomic_store(&s->stopping, true);
    /* the engine ends every job first, so that the connections waiting on one return; then the
     * HTTP side stops and joins its connection threads, which still use the scheduler's lock */
    if (d) MHD_quiesce_daemon(d);
    scheduler_stop(s->sched);
    if (d) MHD_stop_daemon(d);
    scheduler_free(s->sched);
    quill_context_free(s->embed_ctx);   /* after the HTTP side: no embedding runs any more */
    free(s->chat_template);
    quill_model_free(s->model);
    quill_model_free(s->draft_model);   /* after the scheduler, whose drafter used it */
    free(s->model_id);
    free(s->api_key);
    pthread_mutex_destroy(&s->stats_mu);
    response_store_free(s->responses);
    pthread_mutex_destroy(&s->embed_mu);
    free(s);
    return rc;
}
