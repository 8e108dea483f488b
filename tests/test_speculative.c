/* Speculative decoding changes no bit of the output: quill_generate with a drafter (n-gram lookup
 * or a draft model) gives the tokens, text, finish and logits of every step that it gives
 * without one — greedy and seeded, with penalties, a grammar, stop strings, length limits and a
 * full context, on every kernel set the CPU has — and the context ends holding the same tokens. */
#include "test.h"

#include "kernels/kernels.h"
#include "quill_model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t tokens[1024];
    int n_tokens;
    char text[8192];
    size_t len;
    float *logits;              /* every step's logits, before the sampler */
    size_t n_logits, cap_logits;
    int stop_after;             /* the callback stops after this many tokens (0: never) */
    quill_generate_result res;
    quill_status st;
    int context_pos;
} run_out;

static bool on_token(int32_t token, const char *text, size_t len, void *user) {
    run_out *r = user;
    if (token >= 0 && r->n_tokens < 1024) r->tokens[r->n_tokens++] = token;
    if (len && r->len + len < sizeof r->text) { /* (text may be NULL when len is 0) */
        memcpy(r->text + r->len, text, len);
        r->len += len;
    }
    return !(r->stop_after && r->n_tokens >= r->stop_after);
}

static void on_logits(const float *logits, int32_t n_vocab, void *user) {
    run_out *r = user;
    if (r->n_logits + (size_t)n_vocab > r->cap_logits) {
        size_t cap = (r->n_logits + (size_t)n_vocab) * 2;
        float *g = realloc(r->logits, cap * sizeof *g);
        if (!g) return;
        r->logits = g;
        r->cap_logits = cap;
    }
    memcpy(r->logits + r->n_logits, logits, (size_t)n_vocab * sizeof *logits);
    r->n_logits += (size_t)n_vocab;
}

typedef struct {
    const char *name;
    float temperature;
    uint64_t seed;
    float repeat_penalty;
    int n_predict;
    int n_ctx;
    const char *stop[2];        /* one for stories260K, one for the random synth-k model */
    const char *grammar;        /* GBNF */
    int stop_after;
} spec_case;

/* One generation of `prompt` on a fresh context of `m`, with or without a drafter. */
static void generate_once(quill_model *m, const spec_case *k, int cap, const int32_t *prompt, size_t n_prompt,
                          quill_drafter *drafter, run_out *out) {
    memset(out, 0, sizeof *out);
    out->stop_after = k->stop_after;
    quill_error err;
    quill_context_params cp = {.n_ctx = k->n_ctx ? k->n_ctx : 512, .n_threads = 1};
    quill_context *c = NULL;
    quill_grammar *g = NULL;
    quill_grammar_vocab *gv = NULL;
    if ((out->st = quill_context_new(m, &cp, &c, &err))) return;
    quill_generate_params p = quill_generate_defaults();
    p.sampling.temperature = k->temperature;
    p.sampling.seed = k->seed;
    p.sampling.repeat_penalty = k->repeat_penalty ? k->repeat_penalty : 1.0f;
    p.n_predict = cap && k->n_predict > cap ? cap : k->n_predict;
    p.penalize_prompt = true;
    if (k->stop[0]) p.stop = k->stop, p.n_stop = 2;
    if (k->grammar) {
        const quill_tokenizer *tok = quill_model_tokenizer(m);
        if ((out->st = quill_grammar_parse(tok, k->grammar, strlen(k->grammar), NULL, &g, &err)) ||
            (out->st = quill_grammar_vocab_new(tok, &gv, &err)))
            goto done;
        p.grammar = g;
        p.grammar_vocab = gv;
    }
    p.drafter = drafter;
    p.step_logits = on_logits;
    p.step_logits_user = out;
    out->st = quill_generate(c, NULL, prompt, n_prompt, &p, on_token, out, &out->res, &err);
    out->context_pos = quill_context_pos(c);
done:
    quill_grammar_free(g);
    quill_grammar_vocab_free(gv);
    quill_context_free(c);
}

/* The two runs are the same bits; returns false after reporting the first difference. */
static bool same_run(const char *what, const spec_case *k, const run_out *a, const run_out *b) {
    const char *diff = a->st != b->st                           ? "status"
                       : a->n_tokens != b->n_tokens             ? "token count"
                       : memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof a->tokens[0]) ? "tokens"
                       : a->len != b->len || memcmp(a->text, b->text, a->len) ? "text"
                       : a->n_logits != b->n_logits             ? "number of steps"
                       : memcmp(a->logits, b->logits, a->n_logits * sizeof(float)) ? "logits"
                       : a->res.finish != b->res.finish         ? "finish"
                       : a->res.n_generated != b->res.n_generated ? "n_generated"
                       : a->res.stop_string != b->res.stop_string ? "stop_string"
                       : a->res.context_full != b->res.context_full ? "context_full"
                       : a->res.cancelled != b->res.cancelled   ? "cancelled"
                       : a->context_pos != b->context_pos       ? "tokens left in the context"
                                                                : NULL;
    if (diff)
        test_fail(__FILE__, __LINE__, "%s, case %s: the %s differ (plain: %d tokens, finish %d, pos %d; speculative: "
                  "%d tokens, finish %d, pos %d)", what, k->name, diff, a->n_tokens, a->res.finish, a->context_pos,
                  b->n_tokens, b->res.finish, b->context_pos);
    return !diff;
}

static const spec_case cases[] = {
    {.name = "greedy", .n_predict = 96},
    {.name = "seeded", .temperature = 0.8f, .seed = 7, .n_predict = 96},
    {.name = "seeded hot", .temperature = 1.5f, .seed = 3, .n_predict = 64},
    {.name = "penalty", .temperature = 0.7f, .seed = 11, .repeat_penalty = 1.15f, .n_predict = 64},
    {.name = "grammar", .temperature = 0.9f, .seed = 5, .n_predict = 80,
     .grammar = "root ::= (word \" \")+ \"Lily.\"\nword ::= [a-z]+ | \"Lily\" | \"the\" | \"park\""},
    {.name = "stop string", .n_predict = 200, .stop = {"ball", " r r"}},
    {.name = "seeded stop string", .temperature = 0.8f, .seed = 9, .n_predict = 200, .stop = {"ily", "fri"}},
    {.name = "n_predict 1", .n_predict = 1},
    {.name = "n_predict 2", .temperature = 0.8f, .seed = 1, .n_predict = 2},
    {.name = "n_predict 17", .n_predict = 17},
    {.name = "full context", .n_predict = -1, .n_ctx = 80},
    {.name = "full context seeded", .temperature = 0.8f, .seed = 4, .n_predict = -1, .n_ctx = 70},
    {.name = "cancelled", .temperature = 0.8f, .seed = 2, .n_predict = 100, .stop_after = 23},
};

static const char story_prompt[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
    "saw a big, red ball. Once upon a time, there was a little girl named Lily. She loved to play";

static bool tokenize(quill_model *m, const char *text, int32_t **ids, size_t *n) {
    quill_error err;
    return quill_tokenize(quill_model_tokenizer(m), text, strlen(text), true, false, ids, n, &err) == QUILL_OK;
}

/* Every case, with `drafter` (made afresh per case by make_drafter) against plain decoding. */
typedef quill_status (*drafter_maker)(quill_model *target, void *user, quill_drafter **out, quill_error *err);

/* `cap` (0: none) bounds the cases' lengths, for the slower runs. */
/* Runs the first n_cases of cases[] (all when 0) with and without the drafter. */
static int check_cases(const char *what, quill_model *m, int cap, size_t n_cases, drafter_maker make, void *user,
                       int *accepted) {
    int32_t *prompt;
    size_t n_prompt;
    if (!tokenize(m, story_prompt, &prompt, &n_prompt)) {
        test_fail(__FILE__, __LINE__, "%s: cannot tokenize the prompt", what);
        return 0;
    }
    int ok = 1;
    if (!n_cases || n_cases > sizeof cases / sizeof cases[0]) n_cases = sizeof cases / sizeof cases[0];
    for (size_t i = 0; ok && i < n_cases; i++) {
        quill_drafter *d = NULL;
        quill_error err;
        if (make(m, user, &d, &err)) {
            test_fail(__FILE__, __LINE__, "%s: cannot make the drafter: %s", what, err.message);
            ok = 0;
            break;
        }
        run_out *plain = malloc(sizeof *plain), *spec = malloc(sizeof *spec);
        generate_once(m, &cases[i], cap, prompt, n_prompt, NULL, plain);
        generate_once(m, &cases[i], cap, prompt, n_prompt, d, spec);
        if (plain->st) test_fail(__FILE__, __LINE__, "%s, case %s: plain generation failed", what, cases[i].name), ok = 0;
        if (ok && plain->n_tokens == 0 && cases[i].n_predict)
            test_fail(__FILE__, __LINE__, "%s, case %s: generated nothing", what, cases[i].name), ok = 0;
        if (ok) ok = same_run(what, &cases[i], plain, spec);
        if (ok && (spec->res.n_accepted > spec->res.n_drafted || plain->res.n_drafted != 0))
            test_fail(__FILE__, __LINE__, "%s, case %s: %d of %d drafted tokens accepted", what, cases[i].name,
                      spec->res.n_accepted, spec->res.n_drafted), ok = 0;
        *accepted += spec->res.n_accepted;
        free(plain->logits);
        free(spec->logits);
        free(plain);
        free(spec);
        quill_drafter_free(d);
    }
    free(prompt);
    return ok;
}

static quill_status make_lookup(quill_model *target, void *user, quill_drafter **out, quill_error *err) {
    (void)target;
    quill_draft_params p = quill_draft_defaults();
    if (user) p.n_max = *(int *)user;
    return quill_drafter_new_lookup(&p, out, err);
}

typedef struct {
    quill_model *draft;
    int n_max;
} model_user;

static quill_status make_model(quill_model *target, void *user, quill_drafter **out, quill_error *err) {
    model_user *u = user;
    quill_draft_params p = quill_draft_defaults();
    p.n_max = u->n_max;
    p.n_ctx = 512;
    p.n_threads = 1;
    return quill_drafter_new_model(u->draft, target, &p, out, err);
}

/* Runs fn once per kernel set the CPU offers, with QUILL_ISA set. */
static void each_isa(void (*fn)(const char *shared, const char *isa), const char *shared) {
    const char *isas[] = {"scalar", "avx2", "avxvnni", "avx512", "vnni", "amx", "dotprod", "i8mm"};
    const char *saved = getenv("QUILL_ISA");
    char *restore = saved ? strdup(saved) : NULL;
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        if (!quill_kernels_for(isas[k]) || !test_sweeps_set(isas[k])) continue;
        setenv("QUILL_ISA", isas[k], 1);
        fn(shared, isas[k]);
    }
    if (restore) setenv("QUILL_ISA", restore, 1);
    else unsetenv("QUILL_ISA");
    free(restore);
}

static quill_model *load(const char *shared, const char *name) {
    char *path = path_join(shared, name);
    quill_model *m = NULL;
    quill_error err;
    if (quill_model_load(path, &m, &err)) test_fail(__FILE__, __LINE__, "%s: %s", path, err.message);
    free(path);
    return m;
}

static void lookup_on(const char *shared, const char *isa) {
    quill_model *m = load(shared, "models/stories260K.gguf");
    if (!m) return;
    int accepted = 0, n_max[] = {16, 3};
    char what[64];
    for (int i = 0; i < 2; i++) {
        snprintf(what, sizeof what, "lookup (draft-max %d) on %s", n_max[i], isa);
        if (!check_cases(what, m, 0, 0, make_lookup, &n_max[i], &accepted)) break;
    }
    /* the prompt repeats itself, and so does the model: lookup must have had its chances */
    if (accepted == 0) test_fail(__FILE__, __LINE__, "lookup on %s: no drafted token was ever accepted", isa);
    quill_model_free(m);
}

TEST(spec_lookup_identical_on_every_kernel_set) {
    REQUIRE_SHARED(shared);
    each_isa(lookup_on, shared);
}

static void draft_model_on(const char *shared, const char *isa) {
    quill_model *target = load(shared, "models/synth-k-q8_0.gguf");
    quill_model *low = load(shared, "models/synth-k-q4_0.gguf");
    quill_model *same = load(shared, "models/synth-k-q8_0.gguf");
    if (target && low && same) {
        char what[96];
        int accepted_low = 0, accepted_same = 0;
        /* The plain C kernels are ~25x slower: shorter runs there, and only the first cases (greedy
         * and seeded sampling). What a kernel set can break is batch invariance (a draft's batch
         * against token by token), which any case shows; the other cases test the generation's
         * logic, the same on every set. */
        const bool scalar = !strcmp(isa, "scalar");
        const int cap = scalar ? 10 : 40;
        const size_t n_cases = scalar ? 3 : 0;
        model_user u = {low, 8};
        snprintf(what, sizeof what, "q4_0 draft of a q8_0 target on %s", isa);
        if (check_cases(what, target, cap, n_cases, make_model, &u, &accepted_low)) {
            /* the same weights draft what the target draws when greedy: whole drafts accepted */
            model_user v = {same, 5};
            snprintf(what, sizeof what, "q8_0 draft of itself on %s", isa);
            if (check_cases(what, target, cap, n_cases, make_model, &v, &accepted_same) && accepted_same == 0)
                test_fail(__FILE__, __LINE__, "%s: the model drafting for itself had no token accepted", what);
        }
    }
    quill_model_free(target);
    quill_model_free(low);
    quill_model_free(same);
}

TEST(spec_draft_model_identical_on_every_kernel_set) {
    REQUIRE_SHARED(shared);
    each_isa(draft_model_on, shared);
}

/* A continuation on a context that holds earlier text (a chat's next turn): the drafter is told
 * the history, and a second generation on the same context and drafter still matches. */
TEST(spec_continuation_with_history_identical) {
    REQUIRE_SHARED(shared);
    quill_model *m = load(shared, "models/stories260K.gguf");
    if (!m) return;
    int32_t *prompt;
    size_t n_prompt;
    CHECK(tokenize(m, story_prompt, &prompt, &n_prompt));
    const size_t split = n_prompt / 2;
    run_out *out[2];
    for (int spec = 0; spec < 2; spec++) {
        out[spec] = calloc(1, sizeof *out[spec]);
        quill_context_params cp = {.n_ctx = 256, .n_threads = 1};
        quill_context *c;
        quill_drafter *d = NULL;
        quill_error err;
        CHECK(quill_context_new(m, &cp, &c, &err) == QUILL_OK);
        CHECK(!spec || quill_drafter_new_lookup(NULL, &d, &err) == QUILL_OK);
        quill_sampler_params sp = quill_sampler_defaults();
        sp.temperature = 0.6f;
        sp.seed = 21;
        quill_sampler *s;
        CHECK(quill_sampler_new(&sp, quill_tokenizer_n_vocab(quill_model_tokenizer(m)), &s, &err) == QUILL_OK);
        /* turn 1: the first half of the prompt, 30 tokens */
        quill_generate_params p = quill_generate_defaults();
        p.n_predict = 30;
        p.drafter = d;
        p.step_logits = on_logits;
        p.step_logits_user = out[spec];
        quill_generate_result r1, r2;
        CHECK(quill_generate(c, s, prompt, split, &p, on_token, out[spec], &r1, &err) == QUILL_OK, "%s", err.message);
        /* turn 2: the rest of the prompt after what the context holds */
        int held = quill_context_pos(c);
        int32_t *history = malloc((size_t)held * sizeof *history);
        memcpy(history, prompt, split * sizeof *prompt);
        memcpy(history + split, out[spec]->tokens, (size_t)(held - (int)split) * sizeof *history);
        p.history = history;
        p.n_history = (size_t)held;
        p.n_predict = 60;
        CHECK(quill_generate(c, s, prompt + split, n_prompt - split, &p, on_token, out[spec], &r2, &err) == QUILL_OK,
              "%s", err.message);
        out[spec]->res = r2;
        out[spec]->context_pos = quill_context_pos(c);
        if (spec) CHECK(r1.n_drafted + r2.n_drafted > 0, "lookup drafted nothing");
        free(history);
        quill_sampler_free(s);
        quill_drafter_free(d);
        quill_context_free(c);
    }
    spec_case k = {.name = "two turns"};
    same_run("continuation", &k, out[0], out[1]);
    for (int i = 0; i < 2; i++) free(out[i]->logits), free(out[i]);
    free(prompt);
    quill_model_free(m);
}

/* The lookup drafter proposes what followed the same n-grams, and indexes anew a sequence that
 * went back. */
TEST(spec_lookup_drafts_from_the_sequence) {
    quill_drafter *d;
    quill_error err;
    quill_draft_params p = quill_draft_defaults();
    p.n_max = 6;
    CHECK(quill_drafter_new_lookup(&p, &d, &err) == QUILL_OK);
    const int32_t seq[] = {10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11};
    int32_t draft[16];
    int n;
    CHECK(quill_drafter_draft(d, 0, seq, 12, 16, draft, &n, &err) == QUILL_OK);
    const int32_t want[] = {12, 13, 14, 10, 11, 12};
    CHECK_EQ_INT(n, 6); /* n_max bounds it */
    CHECK(!memcmp(draft, want, sizeof want));
    CHECK(quill_drafter_draft(d, 0, seq, 12, 2, draft, &n, &err) == QUILL_OK);
    CHECK_EQ_INT(n, 2);
    /* the sequence went back and took another way: the old counts are gone */
    const int32_t other[] = {10, 11, 12, 99, 98, 10, 11, 12, 99, 98, 10, 11};
    CHECK(quill_drafter_draft(d, 0, other, 12, 3, draft, &n, &err) == QUILL_OK);
    CHECK_EQ_INT(n, 3);
    CHECK(draft[0] == 12 && draft[1] == 99 && draft[2] == 98, "drafted %d %d %d", draft[0], draft[1], draft[2]);
    /* nothing seen twice: no draft (a single 1-gram occurrence is below the reference's threshold) */
    const int32_t fresh[] = {1, 2, 3, 4};
    CHECK(quill_drafter_draft(d, 0, fresh, 4, 5, draft, &n, &err) == QUILL_OK);
    CHECK_EQ_INT(n, 0);
    CHECK(quill_drafter_draft(d, 1, seq, 12, 5, draft, &n, &err) == QUILL_E_ARG);
    quill_drafter_free(d);
    /* the draft length follows what was taken: 1 of a 6-token draft, then at most 2; a draft taken
     * whole lets the next one grow by 2 */
    CHECK(quill_drafter_new_lookup(&p, &d, &err) == QUILL_OK);
    CHECK(quill_drafter_draft(d, 0, seq, 12, 16, draft, &n, &err) == QUILL_OK);
    CHECK_EQ_INT(n, 6);
    int32_t longer[32];
    memcpy(longer, seq, sizeof seq);
    longer[12] = 12, longer[13] = 10; /* the first drafted token taken, then another */
    CHECK(quill_drafter_draft(d, 0, longer, 14, 16, draft, &n, &err) == QUILL_OK);
    CHECK_EQ_INT(n, 2);
    memcpy(longer + 14, draft, 2 * sizeof *draft);
    longer[16] = 5; /* both taken */
    CHECK(quill_drafter_draft(d, 0, longer, 17, 16, draft, &n, &err) == QUILL_OK);
    CHECK(n <= 4, "drafted %d after a whole draft of 2", n);
    quill_drafter_free(d);
    /* n_min: a shorter draft is dropped */
    p.n_min = 4;
    CHECK(quill_drafter_new_lookup(&p, &d, &err) == QUILL_OK);
    CHECK(quill_drafter_draft(d, 0, seq, 12, 3, draft, &n, &err) == QUILL_OK);
    CHECK_EQ_INT(n, 0);
    quill_drafter_free(d);
    /* parameters out of range are refused by name */
    p = quill_draft_defaults();
    p.n_max = 0;
    CHECK(quill_drafter_new_lookup(&p, &d, &err) == QUILL_E_ARG && d == NULL);
    CHECK_STR_CONTAINS(err.message, "draft-max");
    p = quill_draft_defaults();
    p.n_min = 17;
    CHECK(quill_drafter_new_lookup(&p, &d, &err) == QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "draft-min");
}

/* A draft model with another vocabulary is refused, saying what differs. */
TEST(spec_draft_model_vocabulary_must_match) {
    REQUIRE_SHARED(shared);
    quill_model *target = load(shared, "models/synth-k-q8_0.gguf");
    quill_model *other = load(shared, "models/synth-32k-q8_0.gguf");
    quill_model *same_vocab = load(shared, "models/stories260K.gguf");
    if (target && other && same_vocab) {
        quill_error err;
        quill_drafter *d = (quill_drafter *)1;
        CHECK(quill_drafter_new_model(other, target, NULL, &d, &err) == QUILL_E_ARG && d == NULL);
        CHECK_STR_CONTAINS(err.message, "share the target's tokenizer");
        CHECK(quill_draft_vocab_check(target, other, &err) == QUILL_E_ARG);
        /* stories260K was trained on the vocabulary synth-k copies: a valid (if poor) draft */
        CHECK(quill_draft_vocab_check(target, same_vocab, &err) == QUILL_OK, "%s", err.message);
    }
    quill_model_free(target);
    quill_model_free(other);
    quill_model_free(same_vocab);
}

/* The CLI: --lookup and -md print what plain decoding prints, with the acceptance after the
 * timings; the flags are checked before a model loads; another vocabulary is refused. */
TEST(spec_cli_flags_and_refusals) {
    REQUIRE_SHARED(shared);
    char *stories = path_join(shared, "models/stories260K.gguf");
    char *q8 = path_join(shared, "models/synth-k-q8_0.gguf");
    char *q4 = path_join(shared, "models/synth-k-q4_0.gguf");
    char *v32k = path_join(shared, "models/synth-32k-q8_0.gguf");
    char cmd[2048], *plain = NULL, *spec = NULL, *err = NULL;
    const char *prompt = "Once upon a time, there was a little girl named Lily. She loved to play. Once upon a time";
    const char *runs[][3] = {{stories, "--lookup", "--temp 0"}, {stories, "--lookup --draft-max 3", "--temp 0.8 -s 5"},
                             {q8, "-md", "--temp 0.7 -s 3"}};
    bool ok = true;
    for (size_t i = 0; ok && i < sizeof runs / sizeof runs[0]; i++) {
        char draft[1200];
        if (!strcmp(runs[i][1], "-md")) snprintf(draft, sizeof draft, "-md %s", q4);
        else snprintf(draft, sizeof draft, "%s", runs[i][1]);
        snprintf(cmd, sizeof cmd, "%s run -m %s -p '%s' -n 60 %s -t 1 2>/dev/null", quill_bin(), runs[i][0], prompt,
                 runs[i][2]);
        free(plain);
        int rc1 = run_cmd(cmd, &plain, false);
        snprintf(cmd, sizeof cmd, "%s run -m %s -p '%s' -n 60 %s -t 1 %s 2>&1 >/dev/null", quill_bin(), runs[i][0],
                 prompt, runs[i][2], draft);
        free(err);
        run_cmd(cmd, &err, false);
        snprintf(cmd, sizeof cmd, "%s run -m %s -p '%s' -n 60 %s -t 1 %s 2>/dev/null", quill_bin(), runs[i][0], prompt,
                 runs[i][2], draft);
        free(spec);
        int rc2 = run_cmd(cmd, &spec, false);
        if (rc1 || rc2 || !plain || !spec || strcmp(plain, spec) || !strstr(err, "draft: ") || !strstr(err, "accepted ("))
            test_fail(__FILE__, __LINE__, "run %s: rc %d/%d, plain \"%s\", speculative \"%s\", stderr \"%s\"", draft, rc1,
                      rc2, plain ? plain : "", spec ? spec : "", err ? err : ""), ok = false;
    }
    /* chat (raw mode: stories260K has no template), two turns that reuse the cache */
    for (int lookup = 0; ok && lookup < 2; lookup++) {
        snprintf(cmd, sizeof cmd,
                 "printf 'Once upon a time, there was a girl named Lily.\\nShe loved to play. Once upon a time\\n' | "
                 "%s chat -m %s -n 40 --temp 0.6 -s 8 -t 1 %s 2>/dev/null", quill_bin(), stories, lookup ? "--lookup" : "");
        char **dst = lookup ? &spec : &plain;
        free(*dst);
        if (run_cmd(cmd, dst, false)) test_fail(__FILE__, __LINE__, "chat%s failed", lookup ? " --lookup" : ""), ok = false;
    }
    if (ok && (strlen(plain) < 40 || strcmp(plain, spec)))
        test_fail(__FILE__, __LINE__, "chat: plain \"%s\", with --lookup \"%s\"", plain, spec), ok = false;
    /* --json carries the counts */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p '%s' -n 30 --temp 0 --lookup --json 2>/dev/null", quill_bin(), stories,
             prompt);
    free(spec);
    if (ok && (run_cmd(cmd, &spec, false) || !strstr(spec, "\"draft\": {\"drafted\": ")))
        test_fail(__FILE__, __LINE__, "--json with --lookup: %s", spec ? spec : ""), ok = false;
    const struct {
        const char *args, *want;
    } bad[] = {
        {"--draft-max 4", "add -md DRAFT.gguf or --lookup"},
        {"--lookup --draft-max 0", "--draft-max: '0' is not a whole number in 1..256"},
        {"--lookup --draft-max 3 --draft-min 4", "--draft-min 4 is more than --draft-max 3"},
        {"--lookup -md x.gguf", "give one of -md/--model-draft and --lookup"},
        {"--lookup --draft-p-min 0.5", "--draft-p-min applies to a draft model"},
        {"-md /nonexistent/draft.gguf", "-md: "},
    };
    for (size_t i = 0; ok && i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s run -m %s -p hi -n 4 %s", quill_bin(), stories, bad[i].args);
        free(err);
        int rc = run_cmd(cmd, &err, true);
        if (rc != 1 || !strstr(err, bad[i].want))
            test_fail(__FILE__, __LINE__, "run %s: rc %d, \"%s\" (want \"%s\")", bad[i].args, rc, err, bad[i].want), ok = false;
    }
    /* a draft model with another vocabulary, in run and chat */
    for (int chat = 0; ok && chat < 2; chat++) {
        snprintf(cmd, sizeof cmd, "echo hi | %s %s -m %s -md %s -n 4 %s", quill_bin(), chat ? "chat" : "run", q8, v32k,
                 chat ? "" : "-p hi");
        free(err);
        int rc = run_cmd(cmd, &err, true);
        if (rc != 1 || !strstr(err, "the draft model has 32000 tokens and the target 512") ||
            !strstr(err, "share the target's tokenizer"))
            test_fail(__FILE__, __LINE__, "%s with a 32k-vocabulary draft: rc %d, \"%s\"", chat ? "chat" : "run", rc, err),
                ok = false;
    }
    free(plain);
    free(spec);
    free(err);
    free(stories);
    free(q8);
    free(q4);
    free(v32k);
}
