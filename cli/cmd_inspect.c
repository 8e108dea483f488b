/* quill inspect / quill tensor: look inside a GGUF file. */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define ARRAY_PREVIEW 8
#define STRING_PREVIEW 160

static void print_scalar(FILE *f, const quill_gguf_value *v, bool json) {
    int64_t i;
    uint64_t u;
    double d;
    if (v->type == QUILL_GGUF_BOOL) fputs(v->data[0] ? "true" : "false", f);
    else if (v->type == QUILL_GGUF_STRING) {
        size_t n = v->count;
        if (!json && n > STRING_PREVIEW) {
            cli_json_string(f, (const char *)v->data, STRING_PREVIEW);
            fprintf(f, "... (%zu bytes)", n);
        } else {
            cli_json_string(f, (const char *)v->data, n);
        }
    } else if (v->type == QUILL_GGUF_FLOAT32 || v->type == QUILL_GGUF_FLOAT64) {
        quill_gguf_value_f64(v, &d);
        if (d != d || d == 1.0 / 0.0 || d == -1.0 / 0.0) fputs(json ? "null" : (d != d ? "nan" : "inf"), f);
        else fprintf(f, "%.9g", d);
    } else if (quill_gguf_value_i64(v, &i)) fprintf(f, "%" PRId64, i);
    else if (quill_gguf_value_u64(v, &u)) fprintf(f, "%" PRIu64, u);
}

static void print_value(FILE *f, const quill_gguf_value *v, bool json) {
    if (v->type != QUILL_GGUF_ARRAY) {
        print_scalar(f, v, json);
        return;
    }
    if (json) fprintf(f, "{\"type\": \"array\", \"elem_type\": \"%s\", \"count\": %" PRIu64 ", \"first\": [",
                      quill_gguf_type_name(v->elem_type), v->count);
    else fprintf(f, "[%s × %" PRIu64 "]", quill_gguf_type_name(v->elem_type), v->count);
    if (!json && v->count) fputs(" ", f);
    uint64_t cursor = 0;
    quill_gguf_value e;
    for (uint64_t i = 0; i < ARRAY_PREVIEW && quill_gguf_array_next(v, &cursor, &e); i++) {
        if (i) fputs(", ", f);
        print_value(f, &e, json);
    }
    if (json) fputs("]}", f);
    else if (v->count > ARRAY_PREVIEW) fputs(", ...", f);
}

static void dims_string(const quill_gguf_tensor *t, char *buf, size_t cap, bool json) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, json ? "[" : "");
    for (uint32_t d = 0; d < t->n_dims; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? (json ? ", " : " x ") : "", t->ne[d]);
    snprintf(buf + n, cap - n, json ? "]" : "");
}

static void print_hparams(FILE *f, const quill_hparams *hp, bool json) {
    char v[16][32];
    const char *names[] = {"n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab",
                           "n_ctx_train", "n_rot", "rope_base", "rope_freq_scale", "rms_eps", "tied_output"};
    int64_t ints[] = {hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim,
                      hp->n_ff, hp->n_vocab, hp->n_ctx_train, hp->n_rot};
    size_t n = sizeof names / sizeof names[0];
    for (size_t i = 0; i < 9; i++) snprintf(v[i], sizeof v[i], "%" PRId64, ints[i]);
    snprintf(v[9], sizeof v[9], "%.9g", hp->rope_base);
    snprintf(v[10], sizeof v[10], "%.9g", hp->rope_freq_scale);
    snprintf(v[11], sizeof v[11], "%.9g", hp->rms_eps);
    snprintf(v[12], sizeof v[12], "%s", hp->tied_output ? "true" : "false");
    for (size_t i = 0; i < n; i++) {
        if (json) fprintf(f, "%s\"%s\": %s", i ? ", " : "", names[i], v[i]);
        else fprintf(f, "  %-15s %s\n", names[i], v[i]);
    }
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: quill inspect MODEL.gguf [--json]\n");
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) return cli_fail("inspect: unknown option '%s'", argv[i]);
        else if (path) return cli_fail("inspect: more than one file given ('%s', '%s')", path, argv[i]);
        else path = argv[i];
    }
    if (!path) return cli_fail("inspect: no file given (usage: quill inspect MODEL.gguf [--json])");
    quill_gguf *g;
    quill_error err;
    if (quill_gguf_open(path, &g, &err) != QUILL_OK) return cli_fail("%s", err.message);

    uint64_t n_kv = quill_gguf_n_kv(g), n_t = quill_gguf_n_tensors(g);
    FILE *f = stdout;
    if (json) {
        fprintf(f, "{\"file\": {\"path\": ");
        cli_json_string(f, path, strlen(path));
        fprintf(f, ", \"version\": %u, \"alignment\": %" PRIu64 ", \"size\": %" PRIu64
                   ", \"data_offset\": %" PRIu64 "},\n \"metadata\": {",
                quill_gguf_version(g), quill_gguf_alignment(g), quill_gguf_file_size(g),
                quill_gguf_data_offset(g));
    } else {
        printf("file         %s\nversion      %u\nalignment    %" PRIu64 "\nsize         %" PRIu64
               " bytes\ndata offset  %" PRIu64 "\n\nmetadata (%" PRIu64 " keys)\n",
               path, quill_gguf_version(g), quill_gguf_alignment(g), quill_gguf_file_size(g),
               quill_gguf_data_offset(g), n_kv);
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        if (json) {
            fputs(i ? ",\n  " : "\n  ", f);
            cli_json_string(f, kv->key, strlen(kv->key));
            fputs(": ", f);
        } else {
            printf("  %-40s %-6s ", kv->key, quill_gguf_type_name(kv->value.type));
        }
        print_value(f, &kv->value, json);
        if (!json) fputc('\n', f);
    }

    /* Totals per type, accumulated while listing. */
    uint64_t count_by_type[QUILL_TYPE_COUNT] = {0}, bytes_by_type[QUILL_TYPE_COUNT] = {0};
    uint64_t total_bytes = 0, total_params = 0;
    if (json) fputs("},\n \"tensors\": [", f);
    else printf("\ntensors (%" PRIu64 ")\n  %-32s %-8s %-22s %12s %12s\n", n_t, "name", "type", "dims",
                "bytes", "offset");
    for (uint64_t i = 0; i < n_t; i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        char dims[128];
        dims_string(t, dims, sizeof dims, json);
        if (t->type < QUILL_TYPE_COUNT) {
            count_by_type[t->type]++;
            bytes_by_type[t->type] += t->nbytes;
        }
        total_bytes += t->nbytes;
        total_params += (uint64_t)t->n_elements;
        if (json) {
            fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
            cli_json_string(f, t->name, strlen(t->name));
            fprintf(f, ", \"type\": \"%s\", \"dims\": %s, \"bytes\": %" PRIu64 ", \"offset\": %" PRIu64 "}",
                    quill_type_name(t->type), dims, t->nbytes, t->file_offset);
        } else {
            printf("  %-32s %-8s %-22s %12" PRIu64 " %12" PRIu64 "\n", t->name, quill_type_name(t->type),
                   dims, t->nbytes, t->file_offset);
        }
    }
    if (json) fputs("],\n \"totals\": {", f);
    else printf("\ntotals\n");
    bool first = true;
    for (int ty = 0; ty < QUILL_TYPE_COUNT; ty++) {
        if (!count_by_type[ty]) continue;
        if (json) fprintf(f, "%s\"%s\": {\"tensors\": %" PRIu64 ", \"bytes\": %" PRIu64 "}", first ? "" : ", ",
                          quill_type_name((uint32_t)ty), count_by_type[ty], bytes_by_type[ty]);
        else printf("  %-8s %6" PRIu64 " tensors %14" PRIu64 " bytes\n", quill_type_name((uint32_t)ty),
                    count_by_type[ty], bytes_by_type[ty]);
        first = false;
    }
    if (json) fprintf(f, "%s\"all\": {\"tensors\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"elements\": %" PRIu64 "}}",
                      first ? "" : ", ", n_t, total_bytes, total_params);
    else printf("  %-8s %6" PRIu64 " tensors %14" PRIu64 " bytes %14" PRIu64 " parameters\n", "all", n_t,
                total_bytes, total_params);

    quill_hparams hp;
    quill_error herr;
    bool have_hp = quill_hparams_from_gguf(g, &hp, &herr) == QUILL_OK;
    if (json) {
        fputs(",\n \"hparams\": ", f);
        if (have_hp) {
            fputc('{', f);
            print_hparams(f, &hp, true);
            fputc('}', f);
        } else {
            fputs("null, \"hparams_error\": ", f);
            cli_json_string(f, herr.message, strlen(herr.message));
        }
        fputs("}\n", f);
    } else {
        printf("\n%s hyperparameters\n", have_hp ? hp.arch : "model");
        if (have_hp) print_hparams(f, &hp, false);
        else printf("  (none: %s)\n", herr.message);
    }
    quill_gguf_close(g);
    return 0;
}

int cmd_tensor(int argc, char **argv) {
    const char *path = NULL, *name = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o")) {
            if (++i >= argc) return cli_fail("tensor: -o needs a file name");
            out = argv[i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: quill tensor MODEL.gguf TENSOR_NAME -o OUT.f32\n"
                   "writes the tensor dequantized to little-endian float32, ne0 fastest\n");
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) return cli_fail("tensor: unknown option '%s'", argv[i]);
        else if (!path) path = argv[i];
        else if (!name) name = argv[i];
        else return cli_fail("tensor: unexpected argument '%s'", argv[i]);
    }
    if (!path || !name || !out) return cli_fail("tensor: usage: quill tensor MODEL.gguf TENSOR_NAME -o OUT.f32");
    quill_gguf *g;
    quill_error err;
    if (quill_gguf_open(path, &g, &err) != QUILL_OK) return cli_fail("%s", err.message);
    const quill_gguf_tensor *t = quill_gguf_find_tensor(g, name);
    if (!t) {
        int rc = cli_fail("%s: no tensor named '%s' (%" PRIu64 " tensors; list them with: quill inspect %s)",
                          path, name, quill_gguf_n_tensors(g), path);
        quill_gguf_close(g);
        return rc;
    }
    float *buf = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof *buf);
    if (!buf) {
        quill_gguf_close(g);
        return cli_fail("tensor: out of memory for %" PRId64 " floats", t->n_elements);
    }
    int rc = 0;
    if (quill_dequantize(t->type, t->data, buf, t->n_elements, &err) != QUILL_OK) {
        rc = cli_fail("%s: tensor '%s': %s", path, name, err.message);
    } else {
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(buf, sizeof *buf, (size_t)t->n_elements, f) != (size_t)t->n_elements) {
            rc = cli_fail("%s: cannot write: %s", out, strerror(errno));
            if (f) fclose(f);
        } else if (fclose(f) != 0) {
            rc = cli_fail("%s: cannot write: %s", out, strerror(errno));
        } else {
            char dims[128];
            dims_string(t, dims, sizeof dims, false);
            printf("%s: %s [%s] %" PRId64 " floats -> %s\n", name, quill_type_name(t->type), dims,
                   t->n_elements, out);
        }
    }
    free(buf);
    quill_gguf_close(g);
    return rc;
}
