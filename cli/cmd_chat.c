/* quill chat: an interactive conversation through the model's own chat template.
 *
 * The KV cache always holds the tokens of the conversation so far. Each turn renders the whole
 * conversation again (templates are not incremental), tokenizes it, keeps the cached prefix that
 * still matches and evaluates only the tokens after it — normally just the new user turn. When the
 * conversation no longer fits, the oldest turns are dropped (the system message stays).
 *
 * On a terminal the line editor is libedit, reading through our own character function so that
 * Ctrl-C is seen the same way on every libedit version: it clears the line, and a second Ctrl-C
 * in a row exits. During evaluation and generation Ctrl-C stops the reply and the chat goes on. */
#define _GNU_SOURCE /* ppoll */
#include "cli.h"
#include "options.h"
#include "reply_view.h"
#include "chat/tool_calls.h"

#include <errno.h>
#include <histedit.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static bool stop_requested(void *user) {
    (void)user;
    return interrupted != 0;
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

static void conv_remove(conversation *c, size_t i) {
    free((char *)c->msgs[i].role);
    free((char *)c->msgs[i].content);
    memmove(c->msgs + i, c->msgs + i + 1, (c->n - i - 1) * sizeof *c->msgs);
    c->n--;
}

static void conv_pop(conversation *c) {
    if (c->n) conv_remove(c, c->n - 1);
}

static void conv_clear(conversation *c) {
    while (c->n) conv_pop(c);
}

static bool has_system(const conversation *c) { return c->n && !strcmp(c->msgs[0].role, "system"); }

/* Drops the oldest exchange after the system message: a user turn and what answers it. */
static bool conv_drop_oldest(conversation *c) {
    size_t first = has_system(c) ? 1 : 0;
    if (c->n - first <= 1) return false; /* only the newest user message is left */
    conv_remove(c, first);
    while (c->n - first > 1 && strcmp(c->msgs[first].role, "user")) conv_remove(c, first);
    return true;
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
    if (n) memcpy(t->ids, ids, n * sizeof *ids);
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

/* ---------------------------------------------------------------- reading input */

typedef struct {
    EditLine *el;
    History *hist;
    bool tty;
    bool continuation;      /* inside a """ message: the prompt changes */
    bool ctrl_c;            /* the last read ended with Ctrl-C */
    mbstate_t mb;
} line_reader;

static line_reader *active_reader;

static char *prompt_fn(EditLine *el) {
    (void)el;
    return active_reader && active_reader->continuation ? "... " : ">>> ";
}

/* libedit's character source: a read that Ctrl-C interrupts ends the line (el_gets returns
 * NULL) instead of being retried, whatever the libedit version does with signals. */
static int read_wchar(EditLine *el, wchar_t *out) {
    (void)el;
    line_reader *r = active_reader;
    for (;;) {
        /* Wait with SIGINT blocked except inside ppoll: a Ctrl-C that lands between checking the
         * flag and starting to wait cannot be lost. */
        sigset_t block, old;
        sigemptyset(&block);
        sigaddset(&block, SIGINT);
        sigprocmask(SIG_BLOCK, &block, &old);
        struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
        int ready = interrupted ? -1 : ppoll(&pfd, 1, NULL, &old);
        int poll_errno = errno;
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (interrupted) {
            r->ctrl_c = true;
            return -1;
        }
        if (ready < 0 && poll_errno == EINTR) continue;
        unsigned char b;
        ssize_t n = read(STDIN_FILENO, &b, 1);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EINTR && !interrupted) continue;
            if (errno == EINTR) r->ctrl_c = true;
            return -1;
        }
        wchar_t wc;
        size_t k = mbrtowc(&wc, (const char *)&b, 1, &r->mb);
        if (k == (size_t)-2) continue;              /* more bytes of this character */
        if (k == (size_t)-1) {                      /* not UTF-8: take the byte as it is */
            memset(&r->mb, 0, sizeof r->mb);
            wc = b;
        }
        *out = wc;
        return 1;
    }
}

/* Bracketed paste: the terminal wraps pasted text in ESC[200~ ... ESC[201~. The whole block,
 * newlines included, goes into the line, so a pasted paragraph is one message. */
static unsigned char paste_fn(EditLine *el, int ch) {
    (void)ch;
    static const wchar_t end_mark[] = L"\033[201~";
    size_t cap = 256, n = 0, mark = wcslen(end_mark);
    wchar_t *buf = malloc(cap * sizeof *buf);
    if (!buf) return CC_ERROR;
    wchar_t c;
    while (el_wgetc(el, &c) == 1) {
        if (n + 2 >= cap) {
            wchar_t *g = realloc(buf, (cap *= 2) * sizeof *g);
            if (!g) break;
            buf = g;
        }
        buf[n++] = c == L'\r' ? L'\n' : c;
        if (n >= mark && !wmemcmp(buf + n - mark, end_mark, mark)) {
            n -= mark;
            break;
        }
    }
    buf[n] = 0;
    el_winsertstr(el, buf);
    free(buf);
    return CC_REFRESH;
}

static void reader_open(line_reader *r) {
    memset(r, 0, sizeof *r);
    r->tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    if (!r->tty) return;
    setlocale(LC_CTYPE, "");
    active_reader = r;
    r->el = el_init("quill", stdin, stdout, stderr);
    r->hist = history_init();
    if (!r->el || !r->hist) {
        if (r->el) el_end(r->el);
        if (r->hist) history_end(r->hist);
        r->el = NULL;
        r->hist = NULL;
        r->tty = false;
        return;
    }
    HistEvent ev;
    history(r->hist, &ev, H_SETSIZE, 1000);
    el_set(r->el, EL_EDITOR, "emacs");
    el_set(r->el, EL_PROMPT, prompt_fn);
    el_set(r->el, EL_HIST, history, r->hist);
    el_set(r->el, EL_SIGNAL, 0);
    /* Between lines (while a reply streams) the terminal stays non-canonical: keys typed ahead,
     * Ctrl-D included, wait as bytes for the next prompt instead of being taken as a line end
     * that is lost when the editor switches modes. */
    el_set(r->el, EL_SETTY, "-x", "-icanon", NULL);
    el_wset(r->el, EL_GETCFN, read_wchar);
    /* Wide strings: the narrow el_set copies the name and help of EL_ADDFN and never frees them. */
    el_wset(r->el, EL_ADDFN, L"quill-paste", L"insert a bracketed paste as one block", paste_fn);
    el_wset(r->el, EL_BIND, L"\033[200~", L"quill-paste", NULL);
    el_source(r->el, NULL);
    fputs("\033[?2004h", stdout); /* ask the terminal for bracketed paste */
    fflush(stdout);
}

static void reader_close(line_reader *r) {
    if (r->el) {
        fputs("\033[?2004l", stdout);
        fflush(stdout);
        el_end(r->el);
        history_end(r->hist);
    }
    active_reader = NULL;
}

/* One line without its newline, malloc'd; NULL at the end of input or on Ctrl-C (r->ctrl_c). */
static char *read_line(line_reader *r) {
    r->ctrl_c = false;
    interrupted = 0;
    if (r->tty) {
        int count = 0;
        const char *line = el_gets(r->el, &count);
        if (!line || count <= 0) {
            if (interrupted) r->ctrl_c = true;
            interrupted = 0;
            return NULL;
        }
        char *copy = strdup(line);
        if (copy) {
            size_t n = strlen(copy);
            if (n && copy[n - 1] == '\n') copy[--n] = 0;
            HistEvent ev;
            if (n) history(r->hist, &ev, H_ENTER, copy);
        }
        return copy;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        if (interrupted) r->ctrl_c = true;
        free(line);
        return NULL;
    }
    if (n > 0 && line[n - 1] == '\n') line[--n] = 0;
    if (n > 0 && line[n - 1] == '\r') line[--n] = 0;
    return line;
}

/* A message that starts with """ goes on until a line that ends with """ (as in ollama). */
static char *read_multiline(line_reader *r, char *first) {
    size_t len = strlen(first + 3);
    char *text = malloc(len + 2);
    if (!text) { free(first); return NULL; }
    memcpy(text, first + 3, len + 1);
    free(first);
    r->continuation = true;
    for (;;) {
        if (len >= 3 && !strcmp(text + len - 3, "\"\"\"")) {
            text[len - 3] = 0;
            break;
        }
        char *more = read_line(r);
        if (!more) {
            r->continuation = false;
            free(text);
            return NULL;
        }
        size_t m = strlen(more);
        char *g = realloc(text, len + m + 2);
        if (!g) { free(more); free(text); r->continuation = false; return NULL; }
        text = g;
        if (len) text[len++] = '\n';
        memcpy(text + len, more, m + 1);
        len += m;
        free(more);
    }
    r->continuation = false;
    return text;
}

/* ---------------------------------------------------------------- the reply */

typedef struct {
    char *text;
    size_t len, cap;
    token_list *cached;
    bool oom;
    reply_view view;        /* reasoning shown apart from the answer */
} reply;

static bool on_token(int32_t token, const char *text, size_t len, void *user) {
    reply *r = user;
    if (!r->view.split) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (!cli_text_append(&r->text, &r->len, &r->cap, text, len)) return !(r->oom = true);
    if (r->view.split) reply_view_show(&r->view, r->text, r->len, false);
    if (token >= 0 && !tokens_push(r->cached, token)) return !(r->oom = true);
    return true;
}

static const char chat_commands[] =
    "  /help          this list\n"
    "  /reset         start over (the system message stays)\n"
    "  /system TEXT   set the system message (from the next turn)\n"
    "  /raw           toggle raw mode: plain text continuation, no template\n"
    "  /tokens        list the tokens of the last prompt\n"
    "  /bye           leave (also /quit, /exit, Ctrl-D, Ctrl-C twice)\n"
    "  \"\"\"            open a multi-line message, closed by a line ending in \"\"\"\n";

/* Renders a conversation that a template must accept: fails at start rather than every turn. */
static int check_template(const quill_model *m, const char *tmpl, const char *system) {
    quill_error err;
    quill_chat_message probe[2];
    size_t n = 0;
    if (system) probe[n++] = (quill_chat_message){"system", system};
    probe[n++] = (quill_chat_message){"user", "Hello"};
    int32_t *ids = NULL;
    size_t n_ids;
    if (quill_chat_check(tmpl, &err) || quill_chat_tokenize(m, tmpl, probe, n, true, &ids, &n_ids, NULL, &err))
        return cli_fail("the chat template cannot be used: %s", err.message);
    free(ids);
    return 0;
}

int cmd_chat(int argc, char **argv) {
    cli_opts o;
    int rc = cli_opts_parse(argc, argv, CLI_CHAT, &o, stderr);
    if (rc) return rc < 0 ? 0 : rc;
    quill_error err;
    quill_model *m;
    if (quill_model_load(o.model, &m, &err)) {
        cli_opts_free(&o);
        return cli_fail("%s", err.message);
    }
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    char *override = NULL, *tmpl = NULL, *system = NULL, *rendered = NULL;
    quill_context *ctx = NULL;
    quill_sampler *smp = NULL;
    quill_grammar *grammar = NULL;
    quill_grammar_vocab *grammar_vocab = NULL;
    quill_model *draft_model = NULL;
    quill_drafter *drafter = NULL;
    conversation conv = {0};
    token_list cached = {0}, last_prompt = {0};
    reply rep = {.cached = &cached};
    line_reader reader;
    bool reader_opened = false;
    struct sigaction sa = {0}, old_sa;
    bool handler_set = false;
    rc = 1;
    bool raw = false;
    if (o.template_path && !(override = cli_read_file(o.template_path, NULL))) {
        cli_fail("%s: cannot read the chat template: %s", o.template_path, strerror(errno));
        goto done;
    }
    quill_status ts = quill_chat_template_for(m, override, o.format, &tmpl, &err);
    if (ts == QUILL_E_NOT_FOUND && !o.system) {
        /* Without any template the session still works in raw mode. */
        fprintf(stderr, "quill: %s\nquill: starting in raw mode (plain text continuation, no template)\n", err.message);
        raw = true;
    } else if (ts) {
        cli_fail("%s", err.message);
        goto done;
    } else if (check_template(m, tmpl, o.system)) {
        goto done;
    }
    if (tmpl) rep.view.syntax = chat_syntax_detect(tmpl);
    rep.view.hide = o.hide_reasoning;
    rep.view.dim = isatty(STDOUT_FILENO);
    quill_context_params cp = {.n_ctx = (int)o.n_ctx, .n_threads = (int)o.n_threads,
                               .type_k = o.type_k, .type_v = o.type_v,
                               .backend = o.backend, .n_gpu_layers = (int)o.n_gpu_layers, .device = (int)o.device};
    if (quill_context_new(m, &cp, &ctx, &err) || quill_sampler_new(&o.sp, quill_tokenizer_n_vocab(tok), &smp, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    if (cli_drafter_new(&o, m, ctx, &draft_model, &drafter)) goto done;
    /* every reply follows the grammar: the sampler's stage starts over with each turn */
    if (o.grammar && (quill_grammar_parse(tok, o.grammar, strlen(o.grammar), NULL, &grammar, &err) ||
                      quill_grammar_vocab_new(tok, &grammar_vocab, &err) ||
                      quill_sampler_add_grammar(smp, grammar, grammar_vocab, &err))) {
        cli_fail("%s: %s", o.grammar_from, err.message);
        goto done;
    }
    if (o.system && !(system = strdup(o.system))) { cli_fail("out of memory"); goto done; }
    if (system && !conv_add(&conv, "system", system, strlen(system))) { cli_fail("out of memory"); goto done; }
    const int n_ctx = quill_context_n_ctx(ctx);
    /* Room kept free for the reply when old turns have to go. */
    const size_t reserve = (size_t)(o.n_predict > 0 && o.n_predict < n_ctx / 2 ? o.n_predict : n_ctx / 4);

    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa); /* no SA_RESTART: Ctrl-C interrupts a read */
    handler_set = true;
    reader_open(&reader);
    reader_opened = true;
    if (reader.tty)
        fprintf(stderr, "quill chat: %s, context %d tokens. /help for commands; Ctrl-C stops a reply, Ctrl-D exits.\n",
                o.model, n_ctx);
    if (o.verbose)
        fprintf(stderr, "quill: seed %llu, kernels %s\n", (unsigned long long)o.sp.seed, quill_context_kernels(ctx));
    int turn = 0;
    bool said_dropping = false, last_was_ctrl_c = false;
    for (;;) {
        char *line = read_line(&reader);
        if (!line) {
            if (reader.ctrl_c && !last_was_ctrl_c) {
                last_was_ctrl_c = true;
                fprintf(stderr, "\n[Ctrl-C again or Ctrl-D to leave]\n");
                continue;
            }
            fputc('\n', stdout);
            break;
        }
        last_was_ctrl_c = false;
        if (!strncmp(line, "\"\"\"", 3)) {
            line = read_multiline(&reader, line);
            if (!line) {
                if (reader.ctrl_c) { fputc('\n', stderr); continue; }
                fputc('\n', stdout);
                break;
            }
        }
        if (!*line) { /* an empty line sends nothing */
            free(line);
            continue;
        }
        if (line[0] == '/') {
            bool quit = false;
            if (!strcmp(line, "/bye") || !strcmp(line, "/quit") || !strcmp(line, "/exit")) quit = true;
            else if (!strcmp(line, "/help") || !strcmp(line, "/?")) fputs(chat_commands, stderr);
            else if (!strcmp(line, "/reset")) {
                conv_clear(&conv);
                if (system) conv_add(&conv, "system", system, strlen(system));
                cached.n = 0;
                turn = 0;
                quill_context_truncate(ctx, 0);
                fprintf(stderr, "[conversation cleared%s]\n", system ? "; the system message stays" : "");
            } else if (!strncmp(line, "/system", 7) && (line[7] == ' ' || !line[7])) {
                const char *text = line[7] ? line + 8 : "";
                char *copy = strdup(text);
                if (!copy) { free(line); cli_fail("out of memory"); goto done; }
                free(system);
                system = copy;
                /* the system message opens the conversation: replace it, or insert it first */
                if (has_system(&conv)) {
                    free((char *)conv.msgs[0].content);
                    conv.msgs[0].content = strdup(text);
                } else if (conv_add(&conv, "system", text, strlen(text))) {
                    quill_chat_message sys = conv.msgs[conv.n - 1];
                    memmove(conv.msgs + 1, conv.msgs, (conv.n - 1) * sizeof *conv.msgs);
                    conv.msgs[0] = sys;
                }
                if (raw) fprintf(stderr, "[/system has no effect in raw mode (no template); it applies if you leave raw mode]\n");
                else fprintf(stderr, "[system message set; it applies from the next turn]\n");
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
                fprintf(stderr, "[unknown command %s; /help lists them]\n", line);
            }
            free(line);
            if (quit) break;
            continue;
        }

        /* The full token sequence the conversation should have after this user turn. */
        int32_t *full = NULL;
        size_t n_full = 0;
        quill_status s = QUILL_OK;
        if (raw) {
            int32_t *ids = NULL;
            size_t n = 0;
            s = quill_tokenize(tok, line, strlen(line), cached.n == 0, false, &ids, &n, &err);
            if (!s && cached.n + n >= (size_t)n_ctx && cached.n) {
                fprintf(stderr, "[the context is full: starting the text over]\n");
                cached.n = 0;
                quill_context_truncate(ctx, 0);
                free(ids);
                ids = NULL;
                s = quill_tokenize(tok, line, strlen(line), true, false, &ids, &n, &err);
            }
            if (!s) {
                full = malloc((cached.n + n + 1) * sizeof *full);
                if (full) {
                    if (cached.n) memcpy(full, cached.ids, cached.n * sizeof *full);
                    if (n) memcpy(full + cached.n, ids, n * sizeof *full);
                    n_full = cached.n + n;
                }
            }
            free(ids);
        } else {
            if (!conv_add(&conv, "user", line, strlen(line))) { free(line); cli_fail("out of memory"); goto done; }
            for (;;) {
                free(rendered);
                rendered = NULL;
                s = quill_chat_tokenize(m, tmpl, conv.msgs, conv.n, true, &full, &n_full, &rendered, &err);
                if (s || n_full + reserve <= (size_t)n_ctx) break;
                if (!conv_drop_oldest(&conv)) break;
                free(full);
                full = NULL;
                if (!said_dropping) {
                    fprintf(stderr, "[the context is full: dropping the oldest turns%s]\n",
                            has_system(&conv) ? " (the system message stays)" : "");
                    said_dropping = true;
                }
            }
            if (s) conv_pop(&conv);
        }
        free(line);
        if (s || !full) {
            fprintf(stderr, "quill: %s\n", s ? err.message : "out of memory");
            free(full);
            continue;
        }
        if (n_full == 0) { /* nothing to evaluate (an empty text without BOS) */
            free(full);
            continue;
        }
        if (n_full >= (size_t)n_ctx) {
            fprintf(stderr, "quill: this message needs %zu tokens but the context holds %d; send a shorter one "
                            "(or restart with a larger -c)\n", n_full, n_ctx);
            if (!raw) conv_pop(&conv);
            free(full);
            continue;
        }
        size_t keep = 0;
        while (keep < cached.n && keep < n_full && cached.ids[keep] == full[keep]) keep++;
        if (keep == n_full) keep--; /* evaluate at least one token to get logits */
        quill_context_truncate(ctx, (int)keep);
        turn++;
        if (o.verbose)
            fprintf(stderr, "[turn %d: evaluating %zu new tokens, %zu reused from the cache]\n", turn, n_full - keep, keep);
        if (!tokens_set(&last_prompt, full, n_full) || !tokens_set(&cached, full, n_full)) {
            free(full);
            cli_fail("out of memory");
            goto done;
        }

        /* The reply, streamed until end of generation, -n, a stop string, Ctrl-C or a full context. */
        interrupted = 0;
        rep.len = 0;
        if (rep.text) rep.text[0] = 0;
        reply_view_begin(&rep.view, rendered, raw);
        quill_generate_params gp = quill_generate_defaults();
        gp.n_predict = (int)o.n_predict;
        gp.stop = o.stop;
        gp.n_stop = o.n_stop;
        gp.text_start = false;
        /* harmony's channel marks are special tokens: the reply's parse needs them in the text */
        gp.render_special = reply_view_needs_special(&rep.view);
        gp.should_stop = stop_requested;
        /* the drafter sees the whole conversation, the reused part too */
        gp.drafter = drafter;
        gp.history = full;
        gp.n_history = keep;
        /* As the reference's chat does: each reply starts from a fresh sampler (a grammar at its
         * start, an empty penalty window) whose window then holds the whole conversation; the
         * generator adds the part it evaluates, the reused part is added here. */
        gp.penalize_prompt = true;
        quill_sampler_reset(smp);
        for (size_t i = 0; i < keep; i++) quill_sampler_accept_prompt(smp, full[i]);
        quill_generate_result res;
        s = quill_generate(ctx, smp, full + keep, n_full - keep, &gp, on_token, &rep, &res, &err);
        free(full);
        reply_view_show(&rep.view, rep.text, rep.len, true);
        fputc('\n', stdout);
        fflush(stdout);
        if (s || (res.cancelled && res.n_generated == 0 && res.n_prompt < (int)(n_full - keep))) {
            /* The turn never happened: forget it. */
            if (s) fprintf(stderr, "quill: %s\n", err.message);
            else fprintf(stderr, "[stopped]\n");
            cached.n = keep;
            quill_context_truncate(ctx, (int)keep);
            if (!raw) conv_pop(&conv);
            turn--;
            interrupted = 0;
            continue;
        }
        /* The cache holds what was evaluated: the prompt and every generated token but the last. */
        if (cached.n > (size_t)quill_context_pos(ctx)) cached.n = (size_t)quill_context_pos(ctx);
        if (res.cancelled) fprintf(stderr, "[stopped]\n");
        else if (res.context_full) fprintf(stderr, "[the context is full; the oldest turns go next time]\n");
        if (rep.oom) { cli_fail("out of memory"); goto done; }
        if (!raw && !conv_add(&conv, "assistant", rep.text ? rep.text : "", rep.len)) { cli_fail("out of memory"); goto done; }
        if (o.verbose) {
            fprintf(stderr, "[%zu tokens in context]\n", cached.n);
            char draft[96];
            cli_draft_summary(draft, sizeof draft, &res, drafter != NULL);
            if (drafter)
                fprintf(stderr, "[generation: %d tokens, %.2f tok/s%s]\n", res.n_generated,
                        res.generation_ms > 0 ? res.n_generated / (res.generation_ms / 1e3) : 0.0, draft);
        }
        interrupted = 0;
    }
    rc = 0;
done:
    if (reader_opened) reader_close(&reader);
    if (handler_set) sigaction(SIGINT, &old_sa, NULL);
    conv_clear(&conv);
    free(conv.msgs);
    free(cached.ids);
    free(last_prompt.ids);
    free(rep.text);
    free(rendered);
    free(override);
    free(tmpl);
    free(system);
    quill_sampler_free(smp);
    quill_grammar_free(grammar);
    quill_grammar_vocab_free(grammar_vocab);
    quill_drafter_free(drafter);
    quill_model_free(draft_model);
    quill_context_free(ctx);
    quill_model_free(m);
    cli_opts_free(&o);
    return rc;
}
