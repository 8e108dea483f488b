/* quill chat: an interactive conversation through the model's own chat template.
 *
 * The KV cache always holds the tokens of the conversation so far. Each turn renders the whole
 * conversation again (templates are not incremental), tokenizes it, keeps the cached prefix that
 * still matches and evaluates only the tokens after it — normally just the new user turn. */
#include "cli.h"

#include <editline/readline.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

typedef struct {
    quill_chat_message *msgs;
    size_t n, cap;
} conversation;

static bool conv_add(conversation *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        quill_chat_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return false;
        c->msgs = m;
        c->cap = cap;
    }
    char *r = strdup(role), *t = strndup(content, len);
    if (!r || !t) { free(r); free(t); return false; }
    c->msgs[c->n++] = (quill_chat_message){r, t};
    return true;
}

static void conv_pop(conversation *c) {
    if (!c->n) return;
    c->n--;
    free((char *)c->msgs[c->n].role);
    free((char *)c->msgs[c->n].content);
}

static void conv_clear(conversation *c) {
    while (c->n) conv_pop(c);
}

typedef struct {
    int32_t *ids;
    size_t n, cap;
} token_list;

static bool tokens_set(token_list *t, const int32_t *ids, size_t n) {
    if (n > t->cap) {
        int32_t *g = realloc(t->ids, n * sizeof *g);
        if (!g) return false;
        t->ids = g;
        t->cap = n;
    }
    memcpy(t->ids, ids, n * sizeof *ids);
    t->n = n;
    return true;
}

static bool tokens_push(token_list *t, int32_t id) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        int32_t *g = realloc(t->ids, cap * sizeof *g);
        if (!g) return false;
        t->ids = g;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return true;
}

static char *read_line(bool tty) {
    if (tty) {
        char *line = readline("> ");
        if (line && *line) add_history(line);
        return line;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n > 0 && line[n - 1] == '\n') line[n - 1] = 0;
    return line;
}

static const char chat_usage[] =
    "usage: quill chat -m MODEL [--system TEXT] [-c N] [-t N] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
    "                  [--min-p P] [--repeat-penalty R] [--seed S] [--chat-template FILE] [--chat-format NAME]\n"
    "commands: /reset  /system TEXT  /raw  /tokens  /quit   (Ctrl-C stops a reply)\n";

int cmd_chat(int argc, char **argv) {
    const char *model_path = NULL, *system = NULL, *template_path = NULL, *format = NULL;
    long n_ctx = 0, n_threads = 0, n_predict = 512;
    quill_sampler_params sp = quill_sampler_defaults();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(chat_usage, stdout); return 0; }
        if (!v) return cli_fail("chat: option '%s' needs a value or is unknown\n%s", a, chat_usage);
        i++;
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--chat-template")) template_path = v;
        else if (!strcmp(a, "--chat-format")) format = v;
        else if (!strcmp(a, "-c") && cli_parse_long(v, 1, 1 << 24, &l)) n_ctx = l;
        else if (!strcmp(a, "-t") && cli_parse_long(v, 1, 1024, &l)) n_threads = l;
        else if (!strcmp(a, "-n") && cli_parse_long(v, 1, 1 << 24, &l)) n_predict = l;
        else if (!strcmp(a, "--top-k") && cli_parse_long(v, 0, 1 << 30, &l)) sp.top_k = (int)l;
        else if (!strcmp(a, "--temp") && cli_parse_double(v, 0, 1e6, &d)) sp.temperature = (float)d;
        else if (!strcmp(a, "--top-p") && cli_parse_double(v, 0, 1, &d)) sp.top_p = (float)d;
        else if (!strcmp(a, "--min-p") && cli_parse_double(v, 0, 1, &d)) sp.min_p = (float)d;
        else if (!strcmp(a, "--repeat-penalty") && cli_parse_double(v, 1e-6, 1e6, &d)) sp.repeat_penalty = (float)d;
        else if (!strcmp(a, "--seed") && cli_parse_long(v, 0, __LONG_MAX__, &l)) sp.seed = (uint64_t)l;
        else return cli_fail("chat: bad option or value '%s %s'\n%s", a, v, chat_usage);
    }
    if (!model_path) return cli_fail("chat: no model given (-m MODEL)\n%s", chat_usage);

    quill_error err;
    quill_model *m;
    if (quill_model_load(model_path, &m, &err)) return cli_fail("%s", err.message);
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    int64_t n_vocab = quill_model_hparams(m)->n_vocab;
    char *override = NULL, *tmpl = NULL;
    quill_context *ctx = NULL;
    quill_sampler *smp = NULL;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    conversation conv = {0};
    token_list cached = {0}, last_prompt = {0};
    char *reply = NULL;
    size_t reply_len = 0, reply_cap = 0;
    int rc = 1;
    bool raw = false;
    if (!logits) { cli_fail("out of memory"); goto done; }
    if (template_path && !(override = cli_read_file(template_path, NULL))) {
        cli_fail("%s: cannot read the chat template: %s", template_path, strerror(errno));
        goto done;
    }
    if (quill_chat_template_for(m, override, format, &tmpl, &err)) {
        /* Without any template the session still works in /raw mode. */
        fprintf(stderr, "quill: %s\nquill: starting in /raw mode (plain text, no template)\n", err.message);
        raw = true;
    }
    quill_context_params cp = {.n_ctx = (int)n_ctx, .n_threads = (int)n_threads};
    if (quill_context_new(m, &cp, &ctx, &err) || quill_sampler_new(&sp, (int32_t)n_vocab, &smp, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    if (system && !conv_add(&conv, "system", system, strlen(system))) { cli_fail("out of memory"); goto done; }
    bool tty = isatty(STDIN_FILENO);
    if (tty)
        fprintf(stderr, "quill chat: %s, context %d tokens. /reset /system TEXT /raw /tokens /quit; Ctrl-C stops a reply.\n",
                model_path, quill_context_n_ctx(ctx));
    int turn = 0;
    for (;;) {
        char *line = read_line(tty);
        if (!line) break;
        if (line[0] == '/') {
            bool quit = false;
            if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) quit = true;
            else if (!strcmp(line, "/reset")) {
                conv_clear(&conv);
                if (system) conv_add(&conv, "system", system, strlen(system));
                cached.n = 0;
                quill_context_truncate(ctx, 0);
                fprintf(stderr, "[conversation cleared]\n");
            } else if (!strncmp(line, "/system", 7) && (line[7] == ' ' || !line[7])) {
                const char *text = line[7] ? line + 8 : "";
                /* the system message opens the conversation: replace it, or insert it first */
                if (conv.n && !strcmp(conv.msgs[0].role, "system")) {
                    free((char *)conv.msgs[0].content);
                    conv.msgs[0].content = strdup(text);
                } else if (conv_add(&conv, "system", text, strlen(text))) {
                    quill_chat_message sys = conv.msgs[conv.n - 1];
                    memmove(conv.msgs + 1, conv.msgs, (conv.n - 1) * sizeof *conv.msgs);
                    conv.msgs[0] = sys;
                }
                fprintf(stderr, "[system message set; it applies from the next turn]\n");
            } else if (!strcmp(line, "/raw")) {
                if (!tmpl) fprintf(stderr, "[no chat template: staying in raw mode]\n");
                else raw = !raw;
                fprintf(stderr, "[%s mode]\n", raw ? "raw (plain text, no template)" : "chat template");
            } else if (!strcmp(line, "/tokens")) {
                for (size_t i = 0; i < last_prompt.n; i++) {
                    const char *p = quill_tokenizer_piece(tok, last_prompt.ids[i]);
                    printf("%6d  ", last_prompt.ids[i]);
                    cli_json_string(stdout, p, strlen(p));
                    putchar('\n');
                }
                fflush(stdout);
            } else {
                fprintf(stderr, "[unknown command %s: /reset /system TEXT /raw /tokens /quit]\n", line);
            }
            free(line);
            if (quit) break;
            continue;
        }

        /* The full token sequence the conversation should have after this user turn. */
        int32_t *full = NULL;
        size_t n_full = 0;
        quill_status s;
        if (raw) {
            int32_t *ids;
            size_t n;
            s = quill_tokenize(tok, line, strlen(line), cached.n == 0, false, &ids, &n, &err);
            if (!s) {
                full = malloc((cached.n + n + 1) * sizeof *full);
                if (full) {
                    if (cached.n) memcpy(full, cached.ids, cached.n * sizeof *full);
                    if (n) memcpy(full + cached.n, ids, n * sizeof *full);
                    n_full = cached.n + n;
                }
                free(ids);
            }
        } else {
            if (!conv_add(&conv, "user", line, strlen(line))) { free(line); cli_fail("out of memory"); goto done; }
            s = quill_chat_tokenize(m, tmpl, conv.msgs, conv.n, true, &full, &n_full, NULL, &err);
            if (s) conv_pop(&conv);
        }
        free(line);
        if (s || !full) {
            fprintf(stderr, "quill: %s\n", s ? err.message : "out of memory");
            free(full);
            continue;
        }
        if ((long)n_full >= quill_context_n_ctx(ctx)) {
            fprintf(stderr, "quill: the conversation needs %zu tokens but the context holds %d; type /reset to start "
                            "over (or restart with a larger -c)\n", n_full, quill_context_n_ctx(ctx));
            if (!raw) conv_pop(&conv);
            free(full);
            continue;
        }
        size_t keep = 0;
        while (keep < cached.n && keep < n_full && cached.ids[keep] == full[keep]) keep++;
        if (keep == n_full) keep--; /* evaluate at least one token to get logits */
        quill_context_truncate(ctx, (int)keep);
        turn++;
        fprintf(stderr, "[turn %d: evaluating %zu new tokens, %zu reused from the cache]\n", turn, n_full - keep, keep);
        tokens_set(&last_prompt, full, n_full);
        s = quill_eval(ctx, full + keep, (int)(n_full - keep), logits, false, &err);
        if (s || !tokens_set(&cached, full, n_full)) {
            fprintf(stderr, "quill: %s\n", s ? err.message : "out of memory");
            cached.n = 0;
            quill_context_truncate(ctx, 0);
            if (!raw) conv_pop(&conv);
            free(full);
            continue;
        }
        free(full);

        /* The reply, streamed until end of generation, -n, Ctrl-C or a full context. */
        struct sigaction sa = {0}, old;
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old);
        interrupted = 0;
        quill_detokenizer dt;
        quill_detokenizer_init(&dt, tok, false, false);
        reply_len = 0;
        char piece[512];
        const char *stop = NULL;
        for (long k = 0; k < n_predict; k++) {
            int32_t next = quill_sampler_sample(smp, logits);
            if (quill_tokenizer_is_eog(tok, next)) break;
            quill_sampler_accept(smp, next);
            size_t len = quill_detokenizer_push(&dt, next, piece, sizeof piece);
            fwrite(piece, 1, len, stdout);
            fflush(stdout);
            if (reply_len + len + 1 > reply_cap) {
                reply_cap = (reply_len + len + 1) * 2;
                char *g = realloc(reply, reply_cap);
                if (!g) { stop = "out of memory"; break; }
                reply = g;
            }
            memcpy(reply + reply_len, piece, len);
            reply_len += len;
            if (interrupted) { stop = "stopped"; break; }
            if (quill_context_pos(ctx) >= quill_context_n_ctx(ctx)) {
                stop = "the context is full: type /reset to start a new conversation";
                break;
            }
            if (quill_eval(ctx, &next, 1, logits, false, &err)) { stop = err.message; break; }
            tokens_push(&cached, next);
        }
        size_t len = quill_detokenizer_flush(&dt, piece, sizeof piece);
        fwrite(piece, 1, len, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        sigaction(SIGINT, &old, NULL);
        if (stop) fprintf(stderr, "[%s]\n", stop);
        if (!raw && !conv_add(&conv, "assistant", reply ? reply : "", reply_len)) { cli_fail("out of memory"); goto done; }
        fprintf(stderr, "[%zu tokens in context]\n", cached.n);
    }
    rc = 0;
done:
    conv_clear(&conv);
    free(conv.msgs);
    free(cached.ids);
    free(last_prompt.ids);
    free(reply);
    free(override);
    free(tmpl);
    free(logits);
    quill_sampler_free(smp);
    quill_context_free(ctx);
    quill_model_free(m);
    return rc;
}
