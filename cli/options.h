/* One option parser for the commands that load a model and generate or tokenize (run, chat,
 * tokenize): the same names, ranges and messages everywhere, every value checked before a model is
 * loaded. Names follow llama-cli's habits (-m/--model, -p/--prompt, -f/--file, -n/--n-predict,
 * -c/--ctx-size, -t/--threads, -r/--reverse-prompt, --seed -1 for random, ...). */
#ifndef QUILL_CLI_OPTIONS_H
#define QUILL_CLI_OPTIONS_H

#include "quill.h"

#include <stdbool.h>
#include <stdio.h>

enum { CLI_RUN = 1, CLI_CHAT = 2, CLI_TOKENIZE = 4 };

#define CLI_MAX_STOP 16

typedef struct cli_opts {
    unsigned command;       /* CLI_RUN, CLI_CHAT or CLI_TOKENIZE */
    const char *model, *prompt_arg, *prompt_file, *tokens, *logits_path, *trace_path;
    const char *system, *template_path, *format;
    char *prompt;           /* the prompt text from -p, -p - (stdin) or -f FILE: malloc'd */
    long n_predict, n_ctx, n_threads;
    quill_type type_k, type_v;  /* the KV cache's types (-ctk, -ctv; default f32) */
    quill_sampler_params sp;
    bool seed_given;
    const char *stop[CLI_MAX_STOP];
    size_t n_stop;
    bool no_bos, special, reference, json, chat, verbose, no_display_prompt;
    bool hide_reasoning;        /* chat: the reply's reasoning is not shown */
    /* Constrained decoding: the GBNF text from --grammar, --grammar-file or (converted) --json-schema
     * / --json-schema-file, malloc'd; grammar_from names the option it came from, for messages. */
    char *grammar;
    const char *grammar_from;
    /* Speculative decoding: a draft model or n-gram lookup, and the draft sizes. */
    const char *model_draft;
    bool lookup;
    long draft_max, draft_min;
    double draft_p_min;
    /* --backend, -ngl (-1: all), --device */
    quill_backend backend;
    long n_gpu_layers, device;
} cli_opts;

/* Parses argv (argv[0] is the command name). Returns 0 on success, -1 when --help was printed
 * (the caller exits 0), or 1 after printing the error. On success the caller frees with
 * cli_opts_free(). Warnings (more threads than CPUs, -ngl) go to `diag`. */
int cli_opts_parse(int argc, char **argv, unsigned command, cli_opts *o, FILE *diag);
void cli_opts_free(cli_opts *o);
/* The usage text of a command, generated from the option table. */
void cli_opts_usage(unsigned command, FILE *f);

/* The drafter the options ask for (-md FILE or --lookup) for a target model and its context, or
 * NULL without speculation; *draft_model receives the loaded draft model (freed by the caller after
 * the drafter). Returns 0, or 1 after printing why not (an incompatible vocabulary, say). */
int cli_drafter_new(const cli_opts *o, const quill_model *target, const quill_context *c, quill_model **draft_model,
                    quill_drafter **out);
/* " | draft: N drafted, M accepted (P %)" for the timings line; empty without a drafter. */
void cli_draft_summary(char *buf, size_t cap, const quill_generate_result *r, bool speculative);

/* Parses "1,2,3" into a malloc'd id list. Returns 0, or 1 after printing why the list is bad
 * (*ids is then NULL). */
int cli_parse_token_list(const char *s, int32_t **ids, size_t *n);

#endif
