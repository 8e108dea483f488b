/* /health, /metrics (Prometheus text), /tokenize and /detokenize (llama-server's shapes). */
#include "server.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int route_health(http_request *r) {
    cJSON *o = cJSON_CreateObject();
    if (!atomic_load(&r->srv->ready)) {
        /* balancers keep traffic away until the model is ready */
        cJSON_AddStringToObject(o, "status", "loading");
        return reply_json(r, 503, o);
    }
    scheduler_stats st;
    scheduler_stats_get(r->srv->sched, &st);
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddNumberToObject(o, "slots_idle", st.n_slots - st.busy);
    cJSON_AddNumberToObject(o, "slots_processing", st.busy);
    return reply_json(r, 200, o);
}

typedef struct {
    char *buf;
    size_t len, cap;
    bool failed;
} text_buf;

static void emit(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(text_buf *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *grown = realloc(t->buf, cap);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->buf = grown;
        t->cap = cap;
    }
}

static void metric(text_buf *t, const char *name, const char *type, const char *help) {
    emit(t, "# HELP quill_%s %s\n# TYPE quill_%s %s\n", name, help, name, type);
}

int route_metrics(http_request *r) {
    server *s = r->srv;
    scheduler_stats st;
    scheduler_stats_get(s->sched, &st);
    text_buf t = {malloc(4096), 0, 4096, false};
    if (!t.buf) return MHD_NO;
    t.buf[0] = 0;
    metric(&t, "requests_total", "counter", "HTTP requests answered, by status");
    pthread_mutex_lock(&s->stats_mu);
    for (int c = 1; c < 6; c++)
        for (int k = 0; k < 100; k++)
            if (s->by_status[c][k]) emit(&t, "quill_requests_total{status=\"%d\"} %llu\n", c * 100 + k, s->by_status[c][k]);
    pthread_mutex_unlock(&s->stats_mu);
    metric(&t, "prompt_tokens_total", "counter", "prompt tokens of the requests started");
    emit(&t, "quill_prompt_tokens_total %llu\n", st.prompt_tokens);
    metric(&t, "prompt_tokens_cached_total", "counter", "prompt tokens taken from a slot's cache, not evaluated");
    emit(&t, "quill_prompt_tokens_cached_total %llu\n", st.cached_tokens);
    metric(&t, "generated_tokens_total", "counter", "tokens generated");
    emit(&t, "quill_generated_tokens_total %llu\n", st.generated_tokens);
    metric(&t, "draft_tokens_total", "counter", "tokens drafted by speculative decoding and checked");
    emit(&t, "quill_draft_tokens_total %llu\n", st.drafted_tokens);
    metric(&t, "draft_tokens_accepted_total", "counter", "drafted tokens the requests' generators drew");
    emit(&t, "quill_draft_tokens_accepted_total %llu\n", st.accepted_tokens);
    metric(&t, "decode_steps_total", "counter", "forward passes of the engine");
    emit(&t, "quill_decode_steps_total %llu\n", st.steps);
    metric(&t, "decode_seconds_total", "counter", "time spent in forward passes");
    emit(&t, "quill_decode_seconds_total %.6f\n", st.decode_seconds);
    metric(&t, "slots", "gauge", "slots (sequences decoded together)");
    emit(&t, "quill_slots %d\n", st.n_slots);
    metric(&t, "slots_busy", "gauge", "slots serving a request");
    emit(&t, "quill_slots_busy %d\n", st.busy);
    metric(&t, "queue_depth", "gauge", "requests waiting for a slot");
    emit(&t, "quill_queue_depth %d\n", st.queued);
    metric(&t, "generation_tokens_per_second", "gauge",
           "tokens generated per second of the forward passes that generated (all slots together)");
    emit(&t, "quill_generation_tokens_per_second %.3f\n",
         st.generation_seconds > 0 ? (double)st.generated_tokens / st.generation_seconds : 0.0);
    if (t.failed) {
        free(t.buf);
        return MHD_NO;
    }
    int ret = reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", t.buf);
    free(t.buf);
    return ret;
}

/* The body as a JSON object, or a 400 already sent (NULL). */
static cJSON *parse_object(http_request *r, int *ret) {
    api_error e;
    if (!json_body_check(r->body, r->body_len, r->srv->cfg.max_depth, &e)) {
        *ret = reply_error(r, &e);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(r->body, r->body_len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        api_fail(&e, 400, NULL, "the request body must be a JSON object");
        *ret = reply_error(r, &e);
        return NULL;
    }
    return root;
}

static bool opt_bool(cJSON *root, const char *name, bool *out, api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) return api_fail(e, 400, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(v);
    return true;
}

int route_tokenize(http_request *r) {
    int ret = MHD_NO;
    cJSON *root = parse_object(r, &ret);
    if (!root) return ret;
    api_error e;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    bool add_special = false, parse_special = true, with_pieces = false;
    if (!cJSON_IsString(content)) api_fail(&e, 400, "content", "'content' must be a string");
    else if (opt_bool(root, "add_special", &add_special, &e) && opt_bool(root, "parse_special", &parse_special, &e) &&
             opt_bool(root, "with_pieces", &with_pieces, &e)) {
        const quill_tokenizer *tok = r->srv->tok;
        int32_t *ids;
        size_t n;
        quill_error err;
        if (quill_tokenize(tok, content->valuestring, strlen(content->valuestring), add_special, parse_special, &ids, &n,
                           &err)) {
            api_fail(&e, 400, "content", "%s", err.message);
        } else {
            cJSON *out = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(out, "tokens");
            for (size_t i = 0; i < n; i++) {
                if (!with_pieces) {
                    cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
                    continue;
                }
                char piece[256];
                int len = quill_token_to_bytes(tok, ids[i], true, piece, sizeof piece);
                if (len < 0) len = 0;
                if ((size_t)len > sizeof piece) len = sizeof piece;
                cJSON *p = cJSON_CreateObject();
                cJSON_AddNumberToObject(p, "id", ids[i]);
                /* llama-server's shape: the text, or its bytes when it is not whole UTF-8 */
                if (utf8_valid_prefix(piece, (size_t)len) == (size_t)len) {
                    piece[len < (int)sizeof piece ? len : (int)sizeof piece - 1] = 0;
                    cJSON_AddStringToObject(p, "piece", piece);
                } else {
                    cJSON *bytes = cJSON_AddArrayToObject(p, "piece");
                    for (int k = 0; k < len; k++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)piece[k]));
                }
                cJSON_AddItemToArray(arr, p);
            }
            free(ids);
            cJSON_Delete(root);
            return reply_json(r, 200, out);
        }
    }
    cJSON_Delete(root);
    return reply_error(r, &e);
}

int route_detokenize(http_request *r) {
    int ret = MHD_NO;
    cJSON *root = parse_object(r, &ret);
    if (!root) return ret;
    api_error e;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    const quill_tokenizer *tok = r->srv->tok;
    const int32_t n_vocab = quill_tokenizer_n_vocab(tok);
    if (!cJSON_IsArray(tokens)) {
        api_fail(&e, 400, "tokens", "'tokens' must be an array of token ids");
        cJSON_Delete(root);
        return reply_error(r, &e);
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, tokens) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble >= n_vocab ||
            t->valuedouble != (double)(int32_t)t->valuedouble) {
            api_fail(&e, 400, "tokens", "'tokens' must hold token ids in 0..%d", n_vocab - 1);
            cJSON_Delete(root);
            return reply_error(r, &e);
        }
    }
    quill_detokenizer dt;
    quill_detokenizer_init(&dt, tok, true, true);
    size_t cap = 256 * ((size_t)cJSON_GetArraySize(tokens) + 1), len = 0;
    char *text = malloc(cap + 1);
    if (!text) {
        cJSON_Delete(root);
        return MHD_NO;
    }
    cJSON_ArrayForEach(t, tokens) len += quill_detokenizer_push(&dt, (int32_t)t->valuedouble, text + len, cap - len);
    len += quill_detokenizer_flush(&dt, text + len, cap - len);
    text[len] = 0;
    cJSON_Delete(root);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "content", text);
    free(text);
    return reply_json(r, 200, out);
}
