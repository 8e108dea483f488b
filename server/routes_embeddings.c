/* /v1/embeddings: pooled, L2-normalised final hidden states (quill_embed) of each input — a
 * string, a list of strings, a list of token ids or a list of such lists — as floats or base64
 * (little-endian float32, as OpenAI's clients decode it). Pooling is the file's pooling_type
 * unless the request names one (llama-server's `pooling`: mean, cls or last). Embeddings are
 * computed one input after another on a context of their own, beside the generation slots. */
#include "server.h"

#include "quill_model.h"

#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_INPUTS = 2048 };

/* The context embeddings run on, made at the first request; under s->embed_mu. */
static quill_context *embed_context(server *s, quill_error *err) {
    if (s->embed_ctx) return s->embed_ctx;
    quill_context_params p = {.n_ctx = scheduler_n_ctx(s->sched), .n_threads = s->cfg.n_threads, .n_seq = 1};
    if (quill_context_new(s->model, &p, &s->embed_ctx, err) != QUILL_OK) s->embed_ctx = NULL;
    return s->embed_ctx;
}

static char *base64(const unsigned char *p, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *o++ = tab[v >> 18 & 63];
        *o++ = tab[v >> 12 & 63];
        *o++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *o = 0;
    return out;
}

/* One input as token ids (malloc'd). */
static bool input_tokens(server *s, const cJSON *in, size_t index, int32_t **ids, size_t *n, api_error *e) {
    *ids = NULL;
    *n = 0;
    if (cJSON_IsString(in)) {
        quill_error err;
        if (quill_tokenize(s->tok, in->valuestring, strlen(in->valuestring), true, false, ids, n, &err) != QUILL_OK)
            return api_fail(e, 400, "input", "input[%zu]: %s", index, err.message);
    } else if (cJSON_IsArray(in)) {
        size_t count = (size_t)cJSON_GetArraySize(in), k = 0;
        *ids = malloc((count ? count : 1) * sizeof **ids);
        if (!*ids) return api_fail(e, 500, NULL, "out of memory");
        int32_t n_vocab = quill_tokenizer_n_vocab(s->tok);
        const cJSON *t;
        cJSON_ArrayForEach(t, in) {
            if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int32_t)t->valuedouble || t->valuedouble < 0 ||
                t->valuedouble >= n_vocab) {
                free(*ids);
                *ids = NULL;
                return api_fail(e, 400, "input", "input[%zu][%zu] is not a token id of this model (0..%d)", index, k, n_vocab - 1);
            }
            (*ids)[k++] = (int32_t)t->valuedouble;
        }
        *n = k;
    } else {
        return api_fail(e, 400, "input", "input[%zu] must be a string or a list of token ids", index);
    }
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return api_fail(e, 400, "input", "input[%zu] is empty", index);
    }
    if ((int)*n > scheduler_n_ctx(s->sched)) {
        free(*ids);
        *ids = NULL;
        return api_fail(e, 400, "input", "input[%zu] has %zu tokens; the context holds %d", index, *n, scheduler_n_ctx(s->sched));
    }
    return true;
}

int route_embeddings(http_request *r) {
    server *s = r->srv;
    api_error e;
    cJSON *in = cJSON_ParseWithLength(r->body, r->body_len);
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        api_fail(&e, 400, NULL, "the body is not a JSON object");
        return reply_error(r, &e);
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(in, "input");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(in, "encoding_format");
    const cJSON *pool = cJSON_GetObjectItemCaseSensitive(in, "pooling");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(in, "dimensions");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(in, "model");
    bool ok = true, b64 = false;
    quill_pooling pooling = quill_model_pooling(s->model);
    int64_t d = quill_model_hparams(s->model)->n_embd;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "base64")) b64 = true;
        else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "float"))
            ok = api_fail(&e, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    }
    if (ok && pool && !cJSON_IsNull(pool)) {
        static const char *const names[] = {"mean", "cls", "last"};
        int k = 0;
        while (k < 3 && !(cJSON_IsString(pool) && !strcmp(pool->valuestring, names[k]))) k++;
        if (k == 3) ok = api_fail(&e, 400, "pooling", "'pooling' must be \"mean\", \"cls\" or \"last\"");
        else pooling = (quill_pooling)(QUILL_POOLING_MEAN + k);
    }
    if (ok && dims && !cJSON_IsNull(dims) && !(cJSON_IsNumber(dims) && dims->valuedouble == (double)d))
        ok = api_fail(&e, 400, "dimensions", "this model's embeddings have %lld dimensions; other sizes are not supported",
                      (long long)d);
    /* one input or a list: a list of numbers is one input of token ids */
    size_t n_inputs = 0;
    bool single = cJSON_IsString(input) ||
                  (cJSON_IsArray(input) && cJSON_GetArraySize(input) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(input, 0)));
    if (ok && !input) ok = api_fail(&e, 400, "input", "'input' is required");
    else if (ok && !single && !cJSON_IsArray(input))
        ok = api_fail(&e, 400, "input", "'input' must be a string, a list of strings or a list of token ids");
    if (ok) {
        n_inputs = single ? 1 : (size_t)cJSON_GetArraySize(input);
        if (n_inputs == 0 || n_inputs > MAX_INPUTS)
            ok = api_fail(&e, 400, "input", "'input' holds %zu inputs; 1 to %d are accepted", n_inputs, MAX_INPUTS);
    }
    cJSON *root = NULL;
    float *vec = ok ? malloc((size_t)d * sizeof *vec) : NULL;
    if (ok && !vec) ok = api_fail(&e, 500, NULL, "out of memory");
    if (ok) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(root, "data");
        size_t total = 0;
        pthread_mutex_lock(&s->embed_mu);
        quill_error err;
        quill_context *c = embed_context(s, &err);
        if (!c) ok = api_fail(&e, 500, NULL, "cannot make the embedding context: %s", err.message);
        for (size_t i = 0; ok && i < n_inputs; i++) {
            int32_t *ids;
            size_t n;
            if (!input_tokens(s, single ? input : cJSON_GetArrayItem(input, (int)i), i, &ids, &n, &e)) {
                ok = false;
                break;
            }
            quill_status st = quill_embed(c, s->model, ids, (int)n, pooling, true, vec, &err);
            free(ids);
            if (st) {
                ok = api_fail(&e, st == QUILL_E_NOMEM ? 500 : 400, "input", "input[%zu]: %s", i, err.message);
                break;
            }
            total += n;
            cJSON *item = cJSON_CreateObject();
            cJSON_AddStringToObject(item, "object", "embedding");
            cJSON_AddNumberToObject(item, "index", (double)i);
            if (b64) {
                char *text = base64((const unsigned char *)vec, (size_t)d * sizeof *vec);
                cJSON_AddStringToObject(item, "embedding", text ? text : "");
                free(text);
            } else {
                cJSON *arr = cJSON_AddArrayToObject(item, "embedding");
                for (int64_t k = 0; k < d; k++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(vec[k]));
            }
            cJSON_AddItemToArray(data, item);
        }
        pthread_mutex_unlock(&s->embed_mu);
        cJSON_AddStringToObject(root, "model", cJSON_IsString(model) ? model->valuestring : s->model_id);
        cJSON *u = cJSON_AddObjectToObject(root, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)total);
        cJSON_AddNumberToObject(u, "total_tokens", (double)total);
    }
    free(vec);
    cJSON_Delete(in);
    if (!ok) {
        cJSON_Delete(root);
        return reply_error(r, &e);
    }
    return reply_json(r, 200, root);
}
