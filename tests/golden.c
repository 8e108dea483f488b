#include "golden.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

char **golden_case_names(const char *shared, size_t *n) {
    char *dir = path_join(shared, "golden");
    DIR *d = opendir(dir);
    free(dir);
    *n = 0;
    char **names = calloc(256, sizeof *names);
    if (!d || !names) {
        if (d) closedir(d);
        test_fail(__FILE__, __LINE__, "cannot list %s/golden", shared);
        return names;
    }
    struct dirent *e;
    while ((e = readdir(d)) && *n < 255) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".json")) names[(*n)++] = strndup(e->d_name, len - 5);
    }
    closedir(d);
    qsort(names, *n, sizeof *names, cmp_str);
    /* a loop over no cases would pass without testing anything */
    if (*n < 20) test_fail(__FILE__, __LINE__, "expected the golden cases in %s/golden, found %zu", shared, *n);
    return names;
}

void golden_free_names(char **names) {
    for (size_t i = 0; names && names[i]; i++) free(names[i]);
    free(names);
}

static float *read_floats(const char *shared, const char *file, size_t expect) {
    char *rel = path_join("golden", file);
    char *path = path_join(shared, rel);
    size_t size = 0;
    float *data = read_file(path, &size);
    if (data && size != expect * sizeof(float)) {
        test_fail(__FILE__, __LINE__, "%s has %zu bytes, expected %zu", path, size, expect * sizeof(float));
        free(data);
        data = NULL;
    } else if (!data) {
        test_fail(__FILE__, __LINE__, "cannot read %s", path);
    }
    free(rel);
    free(path);
    return data;
}

static int32_t *int_array(const cJSON *arr, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *out = malloc((*n + 1) * sizeof *out);
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) out[i++] = (int32_t)it->valuedouble;
    return out;
}

bool golden_load(const char *shared, const char *name, golden_case *gc) {
    memset(gc, 0, sizeof *gc);
    char file[256];
    snprintf(file, sizeof file, "golden/%s.json", name);
    char *path = path_join(shared, file);
    char *text = read_file(path, NULL);
    free(path);
    if (!text) {
        test_fail(__FILE__, __LINE__, "cannot read %s/%s", shared, file);
        return false;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) {
        test_fail(__FILE__, __LINE__, "%s: invalid JSON", file);
        return false;
    }
    gc->name = strdup(name);
    char model_rel[300];
    snprintf(model_rel, sizeof model_rel, "models/%s", cJSON_GetObjectItem(j, "model")->valuestring);
    gc->model_path = path_join(shared, model_rel);
    gc->prompt = strdup(cJSON_GetObjectItem(j, "prompt")->valuestring);
    gc->add_bos = cJSON_IsTrue(cJSON_GetObjectItem(j, "add_bos"));
    gc->parse_special = cJSON_IsTrue(cJSON_GetObjectItem(j, "parse_special"));
    gc->n_vocab = (int64_t)cJSON_GetObjectItem(j, "n_vocab")->valuedouble;
    gc->prompt_tokens = int_array(cJSON_GetObjectItem(j, "prompt_tokens"), &gc->n_prompt);
    gc->greedy_tokens = int_array(cJSON_GetObjectItem(j, "greedy_tokens"), &gc->n_greedy);
    const cJSON *margins = cJSON_GetObjectItem(j, "greedy_margin");
    gc->greedy_margin = calloc(gc->n_greedy + 1, sizeof(double));
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, margins) if (i < gc->n_greedy) gc->greedy_margin[i++] = it->valuedouble;
    size_t count = gc->n_prompt * (size_t)gc->n_vocab;
    gc->logits = read_floats(shared, cJSON_GetObjectItem(j, "logits")->valuestring, count);
    snprintf(file, sizeof file, "%s.exact.f32", name);
    gc->exact = read_floats(shared, file, count);
    snprintf(file, sizeof file, "golden/%s.trace.gguf", name);
    char *trace = path_join(shared, file);
    FILE *f = fopen(trace, "rb");
    if (f) {
        fclose(f);
        gc->trace_path = trace;
    } else {
        free(trace);
    }
    cJSON_Delete(j);
    return gc->logits && gc->exact;
}

void golden_free(golden_case *gc) {
    free(gc->name);
    free(gc->model_path);
    free(gc->prompt);
    free(gc->prompt_tokens);
    free(gc->greedy_tokens);
    free(gc->greedy_margin);
    free(gc->logits);
    free(gc->exact);
    free(gc->trace_path);
}

double rms_rel_error(const float *a, const float *b, size_t n) {
    double se = 0, sb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        se += d * d;
        sb += (double)b[i] * b[i];
    }
    return sb > 0 ? sqrt(se / sb) : sqrt(se);
}

double max_rel_error(const float *a, const float *b, size_t n) {
    double me = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= me)) me = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? me / mb : me;
}

bool refdump_load(const char *prefix, int n_prompt, refdump_out *r) {
    char path[600];
    size_t size;
    snprintf(path, sizeof path, "%s.json", prefix);
    char *text = read_file(path, &size);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    memset(r, 0, sizeof *r);
    const cJSON *nv = j ? cJSON_GetObjectItem(j, "n_vocab") : NULL;
    if (!nv) {
        cJSON_Delete(j);
        test_fail(__FILE__, __LINE__, "%s is missing or malformed", path);
        return false;
    }
    r->n_vocab = (int64_t)nv->valuedouble;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "greedy_tokens")) {
        if (r->n_greedy < REFDUMP_MAX_GEN) r->greedy[r->n_greedy++] = (int32_t)it->valuedouble;
    }
    int k = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "greedy_margin")) {
        if (k < REFDUMP_MAX_GEN) r->margin[k++] = it->valuedouble;
    }
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s.logits.f32", prefix);
    r->logits = read_file(path, &size);
    if (!r->logits || size != (size_t)n_prompt * (size_t)r->n_vocab * sizeof(float)) {
        test_fail(__FILE__, __LINE__, "%s has %zu bytes", path, r->logits ? size : 0);
        free(r->logits);
        r->logits = NULL;
        return false;
    }
    return true;
}

bool copy_metadata(quill_gguf_writer *w, const quill_gguf *g, const char *skip_key) {
    for (uint64_t i = 0; i < quill_gguf_n_kv(g); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        if (skip_key && !strcmp(kv->key, skip_key)) continue;
        if (quill_gguf_writer_add_value(w, kv->key, &kv->value) != QUILL_OK) return false;
    }
    return true;
}

quill_gguf_writer *writer_from_model(const char *shared, const char *name, quill_gguf **g) {
    char *path = path_join(shared, name);
    quill_error err = {0};
    quill_status st = quill_gguf_open(path, g, &err);
    free(path);
    if (st != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    quill_gguf_writer *w = quill_gguf_writer_new();
    if (!w || !copy_metadata(w, *g, NULL)) {
        test_fail(__FILE__, __LINE__, "%s: copying the metadata", name);
        quill_gguf_writer_free(w);
        quill_gguf_close(*g);
        return NULL;
    }
    return w;
}
