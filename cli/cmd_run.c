/* quill run: prompt in, streamed text out. quill tokenize: text to ids and pieces. */
#include "cli.h"
#include "options.h"
#include "reply_view.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct {
    bool json;
    reply_view view;        /* --chat: reasoning apart from the answer, as quill chat shows it */
    int32_t *gen;
    size_t n_gen, cap_gen;
    char *text;
    size_t text_len, text_cap;
    bool oom;
} run_output;

/* Streams the continuation to stdout, or gathers it for --json. */
static bool on_token(int32_t token, const char *text, size_t len, void *user) {
    run_output *r = user;
    if (token >= 0) {
        if (r->n_gen == r->cap_gen) {
            size_t cap = r->cap_gen ? r->cap_gen * 2 : 64;
            int32_t *g = realloc(r->gen, cap * sizeof *g);
            if (!g) return !(r->oom = true);
            r->gen = g;
            r->cap_gen = cap;
        }
        r->gen[r->n_gen++] = token;
    }
    if (!r->json && !r->view.split) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        return true;
    }
    if (!cli_text_append(&r->text, &r->text_len, &r->text_cap, text, len)) return !(r->oom = true);
    if (!r->json) reply_view_show(&r->view, r->text, r->text_len, false);
    return true;
}

/* Builds the prompt's token ids from the options; with --chat, *view learns the template's syntax
 * and where the prompt leaves the reply. */
static int prompt_tokens(const cli_opts *o, const quill_model *m, int32_t **ids, size_t *n, reply_view *view) {
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    quill_error err;
    if (o->tokens) return cli_parse_token_list(o->tokens, ids, n);
    if (o->chat) {
        char *override = NULL, *tmpl = NULL;
        if (o->template_path && !(override = cli_read_file(o->template_path, NULL)))
            return cli_fail("%s: cannot read the chat template: %s", o->template_path, strerror(errno));
        quill_status s = quill_chat_template_for(m, override, o->format, &tmpl, &err);
        free(override);
        if (s) return cli_fail("%s", err.message);
        quill_chat_message msgs[2];
        size_t n_msgs = 0;
        if (o->system) msgs[n_msgs++] = (quill_chat_message){"system", o->system};
        msgs[n_msgs++] = (quill_chat_message){"user", o->prompt};
        char *rendered = NULL;
        s = quill_chat_tokenize(m, tmpl, msgs, n_msgs, true, ids, n, &rendered, &err);
        view->syntax = chat_syntax_detect(tmpl);
        reply_view_begin(view, rendered, false);
        free(rendered);
        free(tmpl);
        if (s) return cli_fail("%s", err.message);
        return 0;
    }
    if (quill_tokenize(tok, o->prompt, strlen(o->prompt), !o->no_bos, o->special, ids, n, &err))
        return cli_fail("%s", err.message);
    return 0;
}

/* The prompt as llama-cli shows it before the continuation: the text itself, or the text the ids
 * stand for. */
static void echo_prompt(const cli_opts *o, const quill_tokenizer *tok, const int32_t *ids, size_t n) {
    if (o->prompt) {
        fputs(o->prompt, stdout);
    } else {
        quill_detokenizer dt;
        quill_detokenizer_init(&dt, tok, false, true);
        char piece[512];
        for (size_t i = 0; i < n; i++) fwrite(piece, 1, quill_detokenizer_push(&dt, ids[i], piece, sizeof piece), stdout);
        fwrite(piece, 1, quill_detokenizer_flush(&dt, piece, sizeof piece), stdout);
    }
    fflush(stdout);
}

int cmd_run(int argc, char **argv) {
    cli_opts o;
    int rc = cli_opts_parse(argc, argv, CLI_RUN, &o, stderr);
    if (rc) return rc < 0 ? 0 : rc;
    quill_error err;
    quill_model *m;
    double t_load = now_ms();
    if (quill_model_load(o.model, &m, &err)) {
        cli_opts_free(&o);
        return cli_fail("%s", err.message);
    }
    t_load = now_ms() - t_load;
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    const int32_t n_vocab = quill_tokenizer_n_vocab(tok);

    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    quill_context *c = NULL;
    float *logits = NULL;
    quill_trace_recorder *tf = NULL;
    quill_grammar *grammar = NULL;
    quill_grammar_vocab *grammar_vocab = NULL;
    quill_model *draft_model = NULL;
    quill_drafter *drafter = NULL;
    run_output out = {.json = o.json};
    rc = 1;
    out.view.hide = o.hide_reasoning;
    out.view.dim = isatty(STDOUT_FILENO);
    if (prompt_tokens(&o, m, &prompt, &n_prompt, &out.view)) goto done;
    if (o.json) out.view.split = false;   /* --json gives the text as generated */
    if (n_prompt == 0) {
        cli_fail("the prompt is empty after tokenization (nothing to evaluate)");
        goto done;
    }
    quill_context_params cp = {.n_ctx = (int)o.n_ctx, .n_threads = (int)o.n_threads, .reference = o.reference,
                               .type_k = o.type_k, .type_v = o.type_v,
                               .backend = o.backend, .n_gpu_layers = (int)o.n_gpu_layers, .device = (int)o.device};
    if (quill_context_new(m, &cp, &c, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    if ((long)n_prompt > quill_context_n_ctx(c)) {
        cli_fail("the prompt has %zu tokens but the context holds %d; use a larger context (-c %zu) or a "
                 "shorter prompt",
                 n_prompt, quill_context_n_ctx(c), n_prompt);
        goto done;
    }
    if (cli_drafter_new(&o, m, c, &draft_model, &drafter)) goto done;
    if (o.verbose)
        fprintf(stderr, "quill: seed %llu, %d threads, kernels %s, context %d tokens, prompt %zu tokens\n",
                (unsigned long long)o.sp.seed, o.n_threads ? (int)o.n_threads : -1, quill_context_kernels(c),
                quill_context_n_ctx(c), n_prompt);
    quill_generate_params gp = quill_generate_defaults();
    gp.sampling = o.sp;
    gp.n_predict = (int)o.n_predict;
    gp.stop = o.stop;
    gp.n_stop = o.n_stop;
    gp.penalize_prompt = true;
    gp.drafter = drafter;
    /* The continuation follows the prompt: its leading space is real and stays. */
    gp.text_start = false;
    /* harmony's channel marks are special tokens: the reply's parse needs them in the text */
    gp.render_special = reply_view_needs_special(&out.view);
    if (o.logits_path) {
        if (!(logits = malloc(n_prompt * (size_t)n_vocab * sizeof *logits))) {
            cli_fail("out of memory for %zu x %d logits", n_prompt, (int)n_vocab);
            goto done;
        }
        gp.prompt_logits = logits;
    }
    if (o.grammar) {
        if (quill_grammar_parse(tok, o.grammar, strlen(o.grammar), NULL, &grammar, &err) ||
            quill_grammar_vocab_new(tok, &grammar_vocab, &err)) {
            cli_fail("%s: %s", o.grammar_from, err.message);
            goto done;
        }
        gp.grammar = grammar;
        gp.grammar_vocab = grammar_vocab;
    }
    if (o.trace_path) {
        if (!(tf = quill_trace_recorder_new())) { cli_fail("out of memory"); goto done; }
        gp.prompt_trace = quill_trace_record;
        gp.prompt_trace_user = tf;
    }
    if (!o.json && !o.no_display_prompt && !o.chat) echo_prompt(&o, tok, prompt, n_prompt);
    quill_generate_result res;
    quill_status st = quill_generate(c, NULL, prompt, n_prompt, &gp, on_token, &out, &res, &err);
    if (!o.json) reply_view_show(&out.view, out.text, out.text_len, true);
    if (!o.json && (res.n_generated || (!o.no_display_prompt && !o.chat))) fputc('\n', stdout);
    fflush(stdout);
    if (st) {
        cli_fail("%s", err.message);
        goto done;
    }
    if (out.oom) {
        cli_fail("out of memory for the generated text");
        goto done;
    }
    if (tf && quill_trace_recorder_write(tf, o.trace_path, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    if (o.logits_path) {
        FILE *f = fopen(o.logits_path, "wb");
        size_t count = n_prompt * (size_t)n_vocab;
        bool written = f && fwrite(logits, sizeof *logits, count, f) == count;
        if (f && fclose(f) != 0) written = false;
        if (!written) {
            cli_fail("%s: cannot write the logits: %s", o.logits_path, strerror(errno));
            goto done;
        }
    }
    double t_prompt = res.prompt_ms, t_gen = res.generation_ms;
    size_t n_gen = (size_t)res.n_generated;
    if (o.json) {
        printf("{\"prompt_tokens\": [");
        for (size_t i = 0; i < n_prompt; i++) printf("%s%d", i ? ", " : "", prompt[i]);
        printf("], \"generated_tokens\": [");
        for (size_t i = 0; i < out.n_gen; i++) printf("%s%d", i ? ", " : "", out.gen[i]);
        printf("], \"text\": ");
        cli_json_string(stdout, out.text ? out.text : "", out.text_len);
        printf(", \"seed\": %llu, \"finish_reason\": \"%s\"", (unsigned long long)o.sp.seed, quill_finish_name(res.finish));
        printf(", \"timings\": {\"load_ms\": %.3f, \"prompt_ms\": %.3f, \"prompt_tokens_per_s\": %.3f, "
               "\"generation_ms\": %.3f, \"generation_tokens_per_s\": %.3f}",
               t_load, t_prompt, n_prompt / (t_prompt / 1e3), t_gen, n_gen ? n_gen / (t_gen / 1e3) : 0.0);
        printf(", \"context_full\": %s", res.context_full ? "true" : "false");
        const char *gpu_name;
        int gpu_layers;
        printf(", \"backend\": \"%s\"", quill_context_backend(c, &gpu_name, &gpu_layers));
        if (gpu_name) {
            printf(", \"device\": ");
            cli_json_string(stdout, gpu_name, strlen(gpu_name));
            printf(", \"gpu_layers\": %d, \"gpu_whole_layers\": %d", gpu_layers, quill_context_gpu_whole_layers(c));
        }
        if (drafter) printf(", \"draft\": {\"drafted\": %d, \"accepted\": %d}", res.n_drafted, res.n_accepted);
        printf("}\n");
    } else if (res.context_full) {
        fprintf(stderr, "quill: stopped: the context of %d tokens is full (use -c to enlarge it)\n",
                quill_context_n_ctx(c));
    }
    char draft[96];
    cli_draft_summary(draft, sizeof draft, &res, drafter != NULL);
    fprintf(stderr, "prompt: %zu tokens, %.1f ms, %.2f tok/s | generation: %zu tokens, %.1f ms, %.2f tok/s%s\n",
            n_prompt, t_prompt, n_prompt / (t_prompt / 1e3), n_gen, t_gen, n_gen ? n_gen / (t_gen / 1e3) : 0.0, draft);
    rc = 0;
done:
    quill_drafter_free(drafter);
    quill_model_free(draft_model);
    quill_trace_recorder_free(tf);
    quill_grammar_free(grammar);
    quill_grammar_vocab_free(grammar_vocab);
    free(out.text);
    free(out.gen);
    free(logits);
    quill_context_free(c);
    free(prompt);
    quill_model_free(m);
    cli_opts_free(&o);
    return rc;
}

/* Works on vocabulary-only GGUF files too: only the tokenizer is loaded. */
int cmd_tokenize(int argc, char **argv) {
    cli_opts o;
    int prc = cli_opts_parse(argc, argv, CLI_TOKENIZE, &o, stderr);
    if (prc) return prc < 0 ? 0 : prc;
    const char *model = o.model, *text = o.prompt;
    bool no_bos = o.no_bos, special = o.special, json = o.json;
    quill_gguf *g;
    quill_tokenizer *tok;
    quill_error err;
    if (quill_gguf_open(model, &g, &err)) {
        cli_opts_free(&o);
        return cli_fail("%s", err.message);
    }
    if (quill_tokenizer_load(g, &tok, &err)) {
        quill_gguf_close(g);
        cli_opts_free(&o);
        return cli_fail("%s", err.message);
    }
    int32_t *ids;
    size_t n;
    int rc = 0;
    if (quill_tokenize(tok, text, strlen(text), !no_bos, special, &ids, &n, &err)) {
        rc = cli_fail("%s", err.message);
    } else {
        if (json) {
            printf("{\"tokens\": [");
            for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
            printf("], \"pieces\": [");
            for (size_t i = 0; i < n; i++) {
                const char *p = quill_tokenizer_piece(tok, ids[i]);
                if (i) printf(", ");
                cli_json_string(stdout, p, strlen(p));
            }
            printf("]}\n");
        } else {
            for (size_t i = 0; i < n; i++) {
                const char *p = quill_tokenizer_piece(tok, ids[i]);
                printf("%6d  ", ids[i]);
                cli_json_string(stdout, p, strlen(p));
                putchar('\n');
            }
        }
        free(ids);
    }
    quill_tokenizer_free(tok);
    quill_gguf_close(g);
    cli_opts_free(&o);
    return rc;
}
