/* /health, /metrics (Prometheus text), /tokenize and /detokenize (llama-server's shapes). */
#include "server.h"
#include "base/strbuf.h"

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

static void metric(strbuf *t, const char *name, const char *type, const char *help) {
    strbuf_printf(t, "# HELP quill_%s %s\n# TYPE quill_%s %s\n", name, help, name, type);
}

/* A metric of one value: its HELP and TYPE lines, then its sample. */
static void metric_count(strbuf *t, const char *name, const char *type, const char *help, unsigned long long v) {
    metric(t, name, type, help);
    strbuf_printf(t, "quill_%s %llu\n", name, v);
}

static void metric_real(strbuf *t, const char *name, const char *type, const char *help, int decimals, double v) {
    metric(t, name, type, help);
    strbuf_printf(t, "quill_%s %.*f\n", name, decimals, v);
}

int route_metrics(http_request *r) {
    server *s = r->srv;
    scheduler_stats st;
    scheduler_stats_get(s->sched, &st);
    strbuf t = {0};
    metric(&t, "requests_total", "counter", "HTTP requests answered, by status");
    pthread_mutex_lock(&s->stats_mu);
    for (int c = 1; c < 6; c++)
        for (int k = 0; k < 100; k++)
            if (s->by_status[c][k]) strbuf_printf(&t, "quill_requests_total{status=\"%d\"} %llu\n", c * 100 + k, s->by_status[c][k]);
    pthread_mutex_unlock(&s->stats_mu);
    metric_count(&t, "prompt_tokens_total", "counter", "prompt tokens of the requests started", st.prompt_tokens);
    metric_count(&t, "prompt_tokens_cached_total", "counter", "prompt tokens taken from a slot's cache, not evaluated",
                 st.cached_tokens);
    metric_count(&t, "generated_tokens_total", "counter", "tokens generated", st.generated_tokens);
    metric_count(&t, "draft_tokens_total", "counter", "tokens drafted by speculative decoding and checked", st.drafted_tokens);
    metric_count(&t, "draft_tokens_accepted_total", "counter", "drafted tokens the requests' generators drew",
                 st.accepted_tokens);
    metric_count(&t, "decode_steps_total", "counter", "forward passes of the engine", st.steps);
    metric_real(&t, "decode_seconds_total", "counter", "time spent in forward passes", 6, st.decode_seconds);
    metric_count(&t, "slots", "gauge", "slots (sequences decoded together)", (unsigned long long)st.n_slots);
    metric_count(&t, "slots_busy", "gauge", "slots serving a request", (unsigned long long)st.busy);
    metric_count(&t, "queue_depth", "gauge", "requests waiting for a slot", (unsigned long long)st.queued);
    metric_real(&t, "generation_tokens_per_second", "gauge",
                "tokens generated per second of the forward passes that generated (all slots together)", 3,
                st.generation_seconds > 0 ? (double)st.generated_tokens / st.generation_seconds : 0.0);
    char *text = strbuf_take(&t);
    if (!text) return MHD_NO;
    int ret = reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", text);
    free(text);
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
