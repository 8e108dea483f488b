/* quill template: render a chat template for a conversation, byte for byte what the model gets.
 * Rendering is the library's; this file reads the inputs (template, messages, BOS/EOS text) and
 * writes the result to stdout with nothing added, so the output can be diffed or piped. */
#include "cli.h"

#include "quill_chat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fputs("usage: quill template (-m MODEL | --chat-template FILE|NAME) --messages FILE.json|-\n"
          "                      [--tools FILE.json] [--add-generation-prompt] [--bos TEXT] [--eos TEXT]\n"
          "\n"
          "Prints the rendered prompt exactly (no trailing newline is added).\n"
          "  -m, --model FILE         take tokenizer.chat_template and the BOS/EOS text from a GGUF\n"
          "  --chat-template FILE     a Jinja template file (overrides the model's); a built-in name\n"
          "                           (chatml, llama2, llama3, zephyr, mistral, gemma) also works\n"
          "  --messages FILE          JSON list of OpenAI-style messages ('-' reads stdin): role, content\n"
          "                           (text, null, or a list of {\"type\": \"text\", \"text\": ...} parts),\n"
          "                           tool_calls, tool_call_id, name; or {\"messages\": [...], \"tools\": [...]}\n"
          "  --tools FILE             JSON list of tool definitions, passed to the template as `tools`\n"
          "  --add-generation-prompt  end with the header of the assistant's turn\n"
          "  --bos TEXT, --eos TEXT   the bos_token / eos_token variables (default: the model's, or \"\")\n",
          f);
}

/* A file's text, or stdin's for "-". */
static char *read_input(const char *path, const char *what) {
    char *text = NULL;
    if (!strcmp(path, "-")) {
        size_t cap = 4096, n = 0, got;
        text = malloc(cap + 1);
        while (text && (got = fread(text + n, 1, cap - n, stdin)) > 0) {
            n += got;
            if (n == cap) {
                char *g = cap < ((size_t)1 << 30) ? realloc(text, cap * 2 + 1) : NULL;
                if (!g) { free(text); text = NULL; break; }
                text = g;
                cap *= 2;
            }
        }
        if (text) text[n] = 0;
        if (!text) cli_fail("template: cannot read %s from stdin", what);
        return text;
    }
    if (!(text = cli_read_file(path, NULL))) cli_fail("template: cannot read %s file %s: %s", what, path, strerror(errno));
    return text;
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
    const char *model = NULL, *tmpl_arg = NULL, *msgs_path = NULL, *tools_path = NULL, *bos_arg = NULL, *eos_arg = NULL;
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
                           : !strcmp(a, "--tools")                  ? &tools_path
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
    if (tools_path && !strcmp(tools_path, "-") && !strcmp(msgs_path, "-"))
        return cli_fail("template: --messages and --tools cannot both read stdin");

    int rc = 0;
    char *tmpl = NULL, *bos = NULL, *eos = NULL, *out = NULL, *msgs_text = NULL, *tools_text = NULL;
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
    if (!model && (!bos_arg || !eos_arg))
        fprintf(stderr, "quill: template: no -m MODEL to take them from: %s%s%s%s empty (give --bos/--eos to set them)\n",
                bos_arg ? "" : "bos_token", !bos_arg && !eos_arg ? " and " : "", eos_arg ? "" : "eos_token",
                !bos_arg && !eos_arg ? " are" : " is");
    if (!(msgs_text = read_input(msgs_path, "messages"))) { rc = 1; goto done; }
    if (tools_path && !(tools_text = read_input(tools_path, "tools"))) { rc = 1; goto done; }

    quill_error err;
    /* what the server gives a template (strftime_now ...), the tokens from the file or the options */
    quill_chat_inputs in = {.messages_json = msgs_text, .tools_json = tools_text,
                            .bos_token = bos_arg ? bos_arg : bos ? bos : "", .eos_token = eos_arg ? eos_arg : eos ? eos : "",
                            .add_generation_prompt = add_gen};
    quill_chat_inputs_common(NULL, &in);
    quill_status st = quill_chat_render_inputs(tmpl, &in, &out, &err);
    if (st != QUILL_OK) {
        rc = cli_fail("template: %s", err.message);
        goto done;
    }
    size_t len = strlen(out);
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) rc = cli_fail("template: cannot write the output");

done:
    free(out);
    free(msgs_text);
    free(tools_text);
    free(tmpl);
    free(bos);
    free(eos);
    return rc;
}
