/* quill: the command-line front end. Each subcommand lives in its own file. */
#include "cli.h"

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
    {"synth", cmd_synth, "write a random-weight model (llama, qwen2, gemma2, ...) with a real tokenizer"},
    {"perplexity", cmd_perplexity, "perplexity and KL divergence over a text, as llama-perplexity measures them"},
    {"verify", cmd_verify, "check a model's fast path against the float64 path, layer by layer"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server: many requests decoded together"},
    {"bench", cmd_bench, "measure prompt and generation speed against the memory bandwidth"},
    {"devices", cmd_devices, "list the GPUs of the Vulkan backend; --selftest checks its products"},
};

/* The version the library reports when it has one, else this build's. */
#ifdef QUILL_VERSION
#define CLI_VERSION QUILL_VERSION
#else
#define CLI_VERSION "0.1.0"
#endif

/* The library speaks only through its log sink (it never prints): without one its warnings (a
 * model file's oddities, a fallback taken, a copy of the weights it could not make) would be lost.
 * Warnings and errors go to stderr; QUILL_LOG=info or debug shows more. */
static void log_to_stderr(quill_log_level level, const char *message, void *user) {
    static const char *const names[] = {"debug", "info", "warning", "error"};
    if ((int)level < *(const int *)user || (int)level < 0 || (int)level > QUILL_LOG_ERROR) return;
    fprintf(stderr, "quill: %s: %s\n", names[level], message);
}

static int log_threshold(void) {
    const char *v = getenv("QUILL_LOG");
    if (v && !strcmp(v, "debug")) return QUILL_LOG_DEBUG;
    if (v && !strcmp(v, "info")) return QUILL_LOG_INFO;
    if (v && !strcmp(v, "error")) return QUILL_LOG_ERROR;
    return QUILL_LOG_WARN;
}

static void usage(FILE *f) {
    fprintf(f, "usage: quill COMMAND [options]   (quill help COMMAND or quill COMMAND --help for details)\n"
               "       quill --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    static int threshold;
    threshold = log_threshold();
    quill_set_log(log_to_stderr, &threshold);
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
