/* quill: the command-line front end. Each subcommand lives in its own file. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "interactive chat through the model's template"},
    {"tokenize", cmd_tokenize, "show the token ids and pieces of a text"},
    {"template", cmd_template, "render the chat template for a conversation"},
    {"inspect", cmd_inspect, "describe a GGUF file: metadata, tensors, hyperparameters"},
    {"tensor", cmd_tensor, "write one tensor, dequantized, as raw float32"},
    {"compare", cmd_compare, "compare two trace files tensor by tensor"},
    {"quantize", cmd_quantize, "quantize a model (q4_k_m, q8_0, ...) as the reference quantizer does"},
    {"synth", cmd_synth, "write a random-weight Llama GGUF with a real tokenizer"},
    {"bench", cmd_bench, "measure prompt and generation speed against the memory bandwidth"},
};

/* The version the library reports when it has one, else this build's. */
#ifdef QUILL_VERSION
#define CLI_VERSION QUILL_VERSION
#else
#define CLI_VERSION "0.1.0"
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: quill COMMAND [options]   (quill help COMMAND or quill COMMAND --help for details)\n"
               "       quill --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int cli_fail(const char *fmt, ...) {
    va_list ap;
    fputs("quill: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

void cli_json_string(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
    }
    fputc('"', f);
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *grown = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2 + 1) : NULL;
            if (!grown) {
                free(buf);
                buf = NULL;
                errno = ENOMEM;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    bool failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_double(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("quill %s\n", CLI_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "help")) {
        if (argc < 3) {
            usage(stdout);
            return 0;
        }
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (!strcmp(argv[2], commands[i].name)) {
                char *help_argv[] = {argv[2], "--help", NULL};
                return commands[i].fn(2, help_argv);
            }
        usage(stderr);
        return cli_fail("help: unknown command '%s'", argv[2]);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    usage(stderr);
    return cli_fail("unknown command '%s'", argv[1]);
}
