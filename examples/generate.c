/* Generates text with libquill: continues a prompt and streams the text to stdout as it comes.
 *   cc generate.c $(pkg-config --cflags --libs quill) -o generate
 *   ./generate MODEL.gguf "Once upon a time" [N_TOKENS [TEMPERATURE]] */
#include <quill.h>

#include <stdio.h>
#include <stdlib.h>

static bool print_text(int32_t token, const char *text, size_t len, void *user) {
    (void)token, (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true; /* false would stop generation */
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N_TOKENS [TEMPERATURE]]\n", argv[0]);
        return 2;
    }
    quill_error err;
    quill_model *model = NULL;
    quill_context *ctx = NULL;
    quill_context_params cp = {.n_ctx = 512}; /* n_threads 0: all online CPUs */
    quill_generate_params gp = quill_generate_defaults();
    gp.n_predict = argc > 3 ? atoi(argv[3]) : 64;
    gp.sampling.temperature = argc > 4 ? (float)atof(argv[4]) : 0; /* 0: greedy, reproducible */
    quill_generate_result result;

    quill_status status = quill_model_load(argv[1], &model, &err);
    if (!status) status = quill_context_new(model, &cp, &ctx, &err);
    if (!status) {
        fputs(argv[2], stdout);
        status = quill_generate_text(ctx, argv[2], &gp, print_text, NULL, &result, &err);
        printf("\n");
    }
    if (status) fprintf(stderr, "generate: %s\n", err.message);
    else fprintf(stderr, "[%d tokens, %s, libquill %s]\n", result.n_generated, quill_finish_name(result.finish),
                 quill_version());
    quill_context_free(ctx);
    quill_model_free(model);
    return status ? 1 : 0;
}
