/* A grammar applied from a trigger on (tool_choice "auto"): free until the trigger appears, then
 * every token follows the grammar from the trigger's first byte; a reply that already left the
 * grammar within the trigger's token stays free. */
#include "test.h"

#include "quill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    quill_model *model;
    const quill_tokenizer *tok;
    quill_grammar_vocab *v;
    quill_grammar *g;
    quill_sampler *s;
    int32_t n_vocab;
} lazy_case;

static bool lazy_setup(lazy_case *lc, const char *shared, const char *gbnf, const char *trigger) {
    memset(lc, 0, sizeof *lc);
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_error err;
    bool ok = quill_model_load(path, &lc->model, &err) == QUILL_OK;
    free(path);
    if (ok) {
        lc->tok = quill_model_tokenizer(lc->model);
        lc->n_vocab = quill_tokenizer_n_vocab(lc->tok);
        quill_sampler_params sp = quill_sampler_defaults();
        sp.temperature = 0;
        ok = quill_grammar_vocab_new(lc->tok, &lc->v, &err) == QUILL_OK &&
             quill_grammar_parse(lc->tok, gbnf, strlen(gbnf), NULL, &lc->g, &err) == QUILL_OK &&
             quill_sampler_new(&sp, lc->n_vocab, &lc->s, &err) == QUILL_OK &&
             quill_sampler_add_grammar_lazy(lc->s, lc->g, lc->v, &trigger, 1, &err) == QUILL_OK;
    }
    if (!ok) test_fail(__FILE__, __LINE__, "%s", err.message);
    return ok;
}

static void lazy_teardown(lazy_case *lc) {
    quill_sampler_free(lc->s);
    quill_grammar_free(lc->g);
    quill_grammar_vocab_free(lc->v);
    quill_model_free(lc->model);
}

/* Logits that favour `top` over pseudo-random others. */
static void logits_favouring(float *logits, int32_t n, int32_t top, uint64_t *rng) {
    for (int32_t i = 0; i < n; i++) logits[i] = (float)(test_rand(rng) % 1000) / 100.0f;
    if (top >= 0) logits[top] = 100.0f;
}

/* The first ordinary token whose text `want` accepts, or -1. */
static int32_t find_token(const quill_tokenizer *tok, bool (*want)(const char *piece)) {
    char piece[64];
    for (int32_t i = 0; i < quill_tokenizer_n_vocab(tok); i++) {
        if (quill_tokenizer_token_type(tok, i) != QUILL_TOKEN_NORMAL) continue;
        int k = quill_token_to_bytes(tok, i, false, piece, sizeof piece - 1);
        if (k <= 0 || k >= (int)sizeof piece - 1) continue;
        piece[k] = 0;
        if (want(piece)) return i;
    }
    return -1;
}

/* a token the grammars here never allow */
static bool outside(const char *piece) { return !strpbrk(piece, "Ouz"); }
static int32_t outside_token(const quill_tokenizer *tok) { return find_token(tok, outside); }

/* "O" followed by a letter other than 'z' */
static bool o_not_z(const char *piece) {
    const char *o = strchr(piece, 'O');
    return o && o[1] && o[1] != 'z';
}

/* Nothing restricts the next draw: with logits that favour a token outside the grammar, it wins. */
static bool draws_freely(lazy_case *lc, uint64_t seed) {
    float *logits = malloc((size_t)lc->n_vocab * sizeof *logits);
    int32_t outside = outside_token(lc->tok);
    logits_favouring(logits, lc->n_vocab, outside, &seed);
    bool free_draw = outside >= 0 && quill_sampler_sample(lc->s, logits) == outside;
    free(logits);
    return free_draw;
}

TEST(grammar_lazy_applies_from_the_trigger) {
    REQUIRE_SHARED(shared);
    lazy_case lc;
    if (!lazy_setup(&lc, shared, "root ::= \"Once upon a time\" [.!]\n", "Once")) return;
    float *logits = malloc((size_t)lc.n_vocab * sizeof *logits);
    uint64_t rng = 11;
    /* before the trigger nothing is restricted */
    int32_t outside = outside_token(lc.tok);
    CHECK(draws_freely(&lc, 11), "restricted before the trigger");
    quill_sampler_accept(lc.s, outside);
    /* the reply writes the trigger (in stories260K's small vocabulary, over several tokens) */
    int32_t *ids = NULL;
    size_t n = 0;
    quill_error err;
    CHECK(quill_tokenize(lc.tok, " Once", 5, false, false, &ids, &n, &err) == QUILL_OK, "%s", err.message);
    for (size_t i = 0; i < n; i++) quill_sampler_accept(lc.s, ids[i]);
    free(ids);
    /* from here every draw follows the grammar, whatever the logits favour */
    char text[256] = "";
    size_t len = 0;
    bool ended = false;
    for (int step = 0; step < 64 && !ended; step++) {
        logits_favouring(logits, lc.n_vocab, outside, &rng);
        int32_t t = quill_sampler_sample(lc.s, logits);
        CHECK(t >= 0, "draw %d failed: %s", step, quill_sampler_error(lc.s) ? quill_sampler_error(lc.s) : "");
        if (t < 0) break;
        quill_sampler_accept(lc.s, t);
        if (quill_tokenizer_is_eog(lc.tok, t)) {
            ended = true;
            break;
        }
        int k = quill_token_to_bytes(lc.tok, t, false, text + len, sizeof text - len - 1);
        if (k > 0 && (size_t)k < sizeof text - len - 1) len += (size_t)k;
        text[len] = 0;
    }
    CHECK(ended, "the grammar never let the reply end: '%s'", text);
    CHECK(!strcmp(text, " upon a time.") || !strcmp(text, " upon a time!"), "after the trigger: '%s'", text);
    /* reset: free again */
    quill_sampler_reset(lc.s);
    CHECK(draws_freely(&lc, 3), "restricted after a reset");
    free(logits);
    lazy_teardown(&lc);
}

TEST(grammar_lazy_leaves_a_reply_that_left_the_grammar_free) {
    REQUIRE_SHARED(shared);
    /* a token holding the trigger "O" followed by a letter other than 'z', which the grammar needs */
    lazy_case lc;
    if (!lazy_setup(&lc, shared, "root ::= \"Oz\"\n", "O")) return;
    int32_t off = find_token(lc.tok, o_not_z);
    CHECK(off >= 0, "no token with 'O' and a letter after it");
    quill_sampler_accept(lc.s, off);
    CHECK(draws_freely(&lc, 5), "restricted after leaving the grammar");
    lazy_teardown(&lc);
}

TEST(grammar_lazy_refuses_bad_triggers) {
    REQUIRE_SHARED(shared);
    lazy_case lc;
    if (!lazy_setup(&lc, shared, "root ::= \"a\"\n", "a")) return;
    quill_error err = {0};
    const char *empty = "";
    CHECK(quill_sampler_add_grammar_lazy(lc.s, lc.g, lc.v, &empty, 1, &err) == QUILL_E_ARG, "empty trigger accepted");
    CHECK_STR_CONTAINS(err.message, "trigger 0 is empty");
    CHECK(quill_sampler_add_grammar_lazy(lc.s, lc.g, lc.v, NULL, 0, &err) == QUILL_E_ARG, "no trigger accepted");
    CHECK_STR_CONTAINS(err.message, "at least one trigger");
    lazy_teardown(&lc);
}

static bool append_text(int32_t token, const char *text, size_t len, void *user) {
    (void)token;
    char *out = user;
    size_t have = strlen(out);
    if (have + len < 1024) {
        memcpy(out + have, text, len);
        out[have + len] = 0;
    }
    return true;
}

/* Through the generation loop: the reply is the free one up to the trigger, a word the model
 * writes by itself, and the grammar's text from there on. */
TEST(grammar_lazy_in_generation) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_model *model = NULL;
    quill_context *c = NULL;
    quill_grammar_vocab *v = NULL;
    quill_grammar *g = NULL;
    quill_error err;
    quill_context_params cp = {.n_ctx = 256, .n_threads = 1};
    CHECK(quill_model_load(path, &model, &err) == QUILL_OK && quill_context_new(model, &cp, &c, &err) == QUILL_OK,
          "%s", err.message);
    free(path);
    if (!c) return;
    const char *prompt = "Once upon a time, there was a";
    quill_generate_params p = quill_generate_defaults();
    p.sampling.temperature = 0;
    p.n_predict = 48;
    static char free_text[1024], constrained[1024];
    free_text[0] = constrained[0] = 0;
    CHECK(quill_generate_text(c, prompt, &p, append_text, free_text, NULL, &err) == QUILL_OK, "%s", err.message);
    /* the trigger: the free reply's third word */
    const char *w = free_text;
    for (int k = 0; k < 3 && w; k++) w = strchr(w + 1, ' ');
    CHECK(w && strlen(w) > 4, "free reply too short: '%s'", free_text);
    if (!w) goto done;
    char trigger[16];
    size_t tl = strcspn(w + 1, " .,!?");
    if (tl > 8) tl = 8;
    CHECK(tl >= 2, "third word too short in '%s'", free_text);
    memcpy(trigger, w + 1, tl);
    trigger[tl] = 0;
    char gbnf[128];
    snprintf(gbnf, sizeof gbnf, "root ::= \"%s\" \" said zzz\"\n", trigger);
    CHECK(quill_grammar_vocab_new(quill_model_tokenizer(model), &v, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_grammar_parse(quill_model_tokenizer(model), gbnf, strlen(gbnf), NULL, &g, &err) == QUILL_OK, "%s",
          err.message);
    const char *triggers[] = {trigger};
    p.grammar = g;
    p.grammar_vocab = v;
    p.grammar_triggers = triggers;
    p.n_grammar_triggers = 1;
    CHECK(quill_generate_text(c, prompt, &p, append_text, constrained, NULL, &err) == QUILL_OK, "%s", err.message);
    /* the same text up to the trigger's first occurrence, then the grammar's */
    const char *at = strstr(free_text, trigger);
    size_t before = at ? (size_t)(at - free_text) : 0;
    char want[1024];
    snprintf(want, sizeof want, "%.*s%s said zzz", (int)before, free_text, trigger);
    CHECK(!strcmp(constrained, want), "trigger '%s'\nfree:        '%s'\nconstrained: '%s'\nwanted:      '%s'", trigger,
          free_text, constrained, want);
done:
    quill_grammar_free(g);
    quill_grammar_vocab_free(v);
    quill_context_free(c);
    quill_model_free(model);
}
