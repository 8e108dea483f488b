/* quill template: render a chat template for a conversation, byte for byte what the model gets.
 * Rendering is the library's; this file reads the inputs (template, messages, BOS/EOS text) and
 * writes the result to stdout with nothing added, so the output can be diffed or piped. */
#include "cli.h"

#include "quill_chat.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fputs("usage: quill template (-m MODEL | --chat-template FILE|NAME) --messages FILE.json\n"
          "                      [--add-generation-prompt] [--bos TEXT] [--eos TEXT]\n"
          "\n"
          "Prints the rendered prompt exactly (no trailing newline is added).\n"
          "  -m, --model FILE         take tokenizer.chat_template and the BOS/EOS text from a GGUF\n"
          "  --chat-template FILE     a Jinja template file (overrides the model's); a built-in name\n"
          "                           (chatml, llama2, llama3, zephyr, mistral, gemma) also works\n"
          "  --messages FILE          JSON: [{\"role\": ..., \"content\": ...}, ...] or {\"messages\": [...]}\n"
          "  --add-generation-prompt  end with the header of the assistant's turn\n"
          "  --bos TEXT, --eos TEXT   the bos_token / eos_token variables (default: the model's, or \"\")\n",
          f);
}

/* Parses the messages file into msgs (pointing into *root, which the caller deletes). Returns
 * an exit code: 0 on success. */
static int load_messages(const char *path, cJSON **root, quill_chat_message **msgs, size_t *n) {
    *root = NULL;
    *msgs = NULL;
    *n = 0;
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) return cli_fail("template: cannot read messages file %s", path);
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    size_t where = end && end >= text ? (size_t)(end - text) : 0;
    free(text);
    if (!*root) return cli_fail("template: %s is not valid JSON (near byte %zu)", path, where);
    const cJSON *arr = *root;
    if (cJSON_IsObject(arr)) arr = cJSON_GetObjectItemCaseSensitive(arr, "messages");
    if (!cJSON_IsArray(arr))
        return cli_fail("template: %s must hold an array of messages or an object with \"messages\"", path);
    int count = cJSON_GetArraySize(arr);
    *msgs = calloc(count > 0 ? (size_t)count : 1, sizeof **msgs);
    if (!*msgs) return cli_fail("template: out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, arr) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return cli_fail("template: %s: message %zu needs a string \"role\"", path, *n);
        if (!cJSON_IsString(content))
            return cli_fail("template: %s: message %zu needs a string \"content\"", path, *n);
        (*msgs)[*n].role = role->valuestring;
        (*msgs)[*n].content = content->valuestring;
        (*n)++;
    }
    return 0;
}

/* Text of the token whose id is stored under `id_key`, straight from the metadata; used when the
 * tokenizer cannot be loaded (rendering needs only the text, not a working vocabulary). */
static char *token_text_from_metadata(const quill_gguf *g, const char *id_key) {
    uint64_t id;
    quill_gguf_value toks;
    if (quill_gguf_get_u64(g, id_key, &id, NULL) != QUILL_OK ||
        quill_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL) != QUILL_OK || toks.elem_type != QUILL_GGUF_STRING ||
        id >= toks.count)
        return NULL;
    uint64_t cursor = 0;
    quill_gguf_value e;
    for (uint64_t i = 0; quill_gguf_array_next(&toks, &cursor, &e); i++)
        if (i == id) {
            char *s = malloc(e.count + 1);
            if (s) {
                memcpy(s, e.data, e.count);
                s[e.count] = 0;
            }
            return s;
        }
    return NULL;
}

static char *dup_or_empty(const char *s) {
    char *d = malloc(strlen(s ? s : "") + 1);
    if (d) strcpy(d, s ? s : "");
    return d;
}

/* The model's template (NULL when it has none) and its BOS/EOS text ("" when absent). */
static int read_model(const char *path, char **tmpl, char **bos, char **eos) {
    quill_gguf *g;
    quill_error err;
    if (quill_gguf_open(path, &g, &err) != QUILL_OK) return cli_fail("template: %s", err.message);
    const char *s;
    size_t n;
    quill_status st = quill_gguf_get_str(g, "tokenizer.chat_template", &s, &n, &err);
    if (st == QUILL_OK) {
        *tmpl = malloc(n + 1);
        if (*tmpl) {
            memcpy(*tmpl, s, n);
            (*tmpl)[n] = 0;
        }
    } else if (st != QUILL_E_NOT_FOUND) {
        quill_gguf_close(g);
        return cli_fail("template: %s", err.message);
    }
    quill_tokenizer *tok;
    if (quill_tokenizer_load(g, &tok, &err) == QUILL_OK) {
        int32_t b = quill_tokenizer_bos(tok), e = quill_tokenizer_eos(tok);
        *bos = dup_or_empty(b >= 0 ? quill_tokenizer_piece(tok, b) : "");
        *eos = dup_or_empty(e >= 0 ? quill_tokenizer_piece(tok, e) : "");
        quill_tokenizer_free(tok);
    } else {
        *bos = token_text_from_metadata(g, "tokenizer.ggml.bos_token_id");
        *eos = token_text_from_metadata(g, "tokenizer.ggml.eos_token_id");
        if (!*bos) *bos = dup_or_empty("");
        if (!*eos) *eos = dup_or_empty("");
    }
    quill_gguf_close(g);
    if ((st == QUILL_OK && !*tmpl) || !*bos || !*eos) return cli_fail("template: out of memory");
    return 0;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tmpl_arg = NULL, *msgs_path = NULL, *bos_arg = NULL, *eos_arg = NULL;
    bool add_gen = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--add-generation-prompt")) {
            add_gen = true;
            continue;
        }
        const char **dst = !strcmp(a, "-m") || !strcmp(a, "--model") ? &model
                           : !strcmp(a, "--chat-template")          ? &tmpl_arg
                           : !strcmp(a, "--messages")               ? &msgs_path
                           : !strcmp(a, "--bos")                    ? &bos_arg
                           : !strcmp(a, "--eos")                    ? &eos_arg
                                                                    : NULL;
        if (!dst) {
            usage(stderr);
            return cli_fail("template: unknown option '%s'", a);
        }
        if (i + 1 >= argc) return cli_fail("template: %s needs a value", a);
        *dst = argv[++i];
    }
    if (!model && !tmpl_arg) {
        usage(stderr);
        return cli_fail("template: give -m MODEL or --chat-template FILE");
    }
    if (!msgs_path) {
        usage(stderr);
        return cli_fail("template: --messages FILE is required");
    }

    int rc = 0;
    char *tmpl = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    quill_chat_message *msgs = NULL;
    size_t n_msgs = 0;
    cJSON *root = NULL;
    if (model && (rc = read_model(model, &tmpl, &bos, &eos)) != 0) goto done;
    if (tmpl_arg) {
        free(tmpl);
        tmpl = cli_read_file(tmpl_arg, NULL);
        if (!tmpl) {
            /* a built-in name, unless a file of that name exists (then the error is real) */
            const char *b = quill_chat_builtin_template(tmpl_arg);
            FILE *probe = fopen(tmpl_arg, "rb");
            if (probe) fclose(probe);
            if (!b || probe) {
                rc = cli_fail("template: cannot read template file %s", tmpl_arg);
                goto done;
            }
            tmpl = dup_or_empty(b);
        }
    }
    if (!tmpl) {
        rc = cli_fail("template: %s has no tokenizer.chat_template; pass --chat-template FILE or a built-in name", model);
        goto done;
    }
    if ((rc = load_messages(msgs_path, &root, &msgs, &n_msgs)) != 0) goto done;

    quill_error err;
    quill_status st = quill_chat_render(tmpl, msgs, n_msgs, bos_arg ? bos_arg : bos ? bos : "",
                                        eos_arg ? eos_arg : eos ? eos : "", add_gen, &out, &err);
    if (st != QUILL_OK) {
        rc = cli_fail("template: %s", err.message);
        goto done;
    }
    size_t len = strlen(out);
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) rc = cli_fail("template: cannot write the output");

done:
    free(out);
    free(msgs);
    cJSON_Delete(root);
    free(tmpl);
    free(bos);
    free(eos);
    return rc;
}
