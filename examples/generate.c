/* Generates text with libquill: continues a prompt and streams the text to stdout as it comes.
 * The program evaluates tokens itself and lets the library's generator decide, one step at a time,
 * what comes next and when to stop (quill_generate_text() does the same in one call).
 *   cc generate.c $(pkg-config --cflags --libs quill) -o generate
 *   ./generate MODEL.gguf "Once upon a time" [N_TOKENS [TEMPERATURE]] */
#include <quill.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N_TOKENS [TEMPERATURE]]\n", argv[0]);
        return 2;
    }
    quill_error err;
    quill_model *model = NULL;
    quill_context *ctx = NULL;
    quill_generator *gen = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    float *logits = NULL;
    quill_context_params cp = {.n_ctx = 512}; /* n_threads 0: all online CPUs */
    quill_generate_params gp = quill_generate_defaults();
    gp.n_predict = argc > 3 ? atoi(argv[3]) : 64;
    gp.sampling.temperature = argc > 4 ? (float)atof(argv[4]) : 0; /* 0: greedy, reproducible */

    quill_status status = quill_model_load(argv[1], &model, &err);
    const quill_tokenizer *tok = model ? quill_model_tokenizer(model) : NULL;
    if (!status) status = quill_context_new(model, &cp, &ctx, &err);
    if (!status) status = quill_tokenize(tok, argv[2], strlen(argv[2]), true, false, &prompt, &n_prompt, &err);
    if (!status) status = quill_generator_new(tok, NULL, &gp, &gen, &err);
    if (!status && !(logits = malloc((size_t)quill_tokenizer_n_vocab(tok) * sizeof *logits))) status = QUILL_E_NOMEM;
    if (!status) status = quill_eval(ctx, prompt, (int)n_prompt, logits, false, &err);
    if (!status) {
        fputs(argv[2], stdout);
        quill_generator_begin(gen, prompt, n_prompt);
        quill_generator_event ev = {0};
        while (!status && !ev.done) {
            bool room = quill_context_pos(ctx) < quill_context_n_ctx(ctx);
            status = quill_generator_step(gen, logits, room, &ev, &err);
            if (status) break;
            fwrite(ev.text, 1, ev.len, stdout);
            fwrite(ev.tail, 1, ev.tail_len, stdout);
            fflush(stdout);
            if (!ev.done) status = quill_eval(ctx, &ev.token, 1, logits, false, &err);
        }
        printf("\n");
    }
    if (status) fprintf(stderr, "generate: %s\n", status == QUILL_E_NOMEM && !logits ? "out of memory" : err.message);
    else fprintf(stderr, "[%d tokens, %s, libquill %s]\n", quill_generator_result(gen)->n_generated,
                 quill_finish_name(quill_generator_result(gen)->finish), quill_version());
    free(logits);
    free(prompt);
    quill_generator_free(gen);
    quill_context_free(ctx);
    quill_model_free(model);
    return status ? 1 : 0;
}
