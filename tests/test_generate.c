/* The generation loop in the library (quill_generate) and the shared sampling-option parser. */
#include "golden.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char text[4096];
    size_t len;
    int32_t tokens[512];
    int n_tokens, calls, stop_after;
    bool saw_final;
} collected;

static bool collect(int32_t token, const char *text, size_t len, void *user) {
    collected *c = user;
    c->calls++;
    if (token >= 0 && c->n_tokens < 512) c->tokens[c->n_tokens++] = token;
    if (token < 0) c->saw_final = true;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    return !(c->stop_after && c->n_tokens >= c->stop_after);
}

static bool open_stories(const char *shared, int n_ctx, quill_model **m, quill_context **c) {
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_error err;
    bool ok = quill_model_load(path, m, &err) == QUILL_OK;
    free(path);
    if (!ok) return false;
    quill_context_params p = {.n_ctx = n_ctx, .n_threads = 1};
    if (quill_context_new(*m, &p, c, &err) != QUILL_OK) {
        quill_model_free(*m);
        return false;
    }
    return true;
}

static const char once_continuation[] = ", there was a little girl named Lily. She loved to play outside in the park.";

/* Greedy generation through the library gives the reference's greedy tokens. */
TEST(generate_greedy_matches_golden) {
    REQUIRE_SHARED(shared);
    golden_case gc;
    CHECK(golden_load(shared, "s260-once", &gc), "cannot load s260-once");
    quill_model *m;
    quill_context *c;
    CHECK(open_stories(shared, 0, &m, &c));
    quill_generate_params p = quill_generate_defaults();
    p.sampling.temperature = 0;
    p.n_predict = (int)gc.n_greedy;
    collected out = {0};
    quill_generate_result res;
    quill_error err;
    quill_status st = quill_generate(c, NULL, gc.prompt_tokens, gc.n_prompt, &p, collect, &out, &res, &err);
    size_t n_greedy = gc.n_greedy;
    int32_t first = gc.greedy_tokens[0], last = gc.greedy_tokens[n_greedy - 1];
    bool same = out.n_tokens == (int)n_greedy && !memcmp(out.tokens, gc.greedy_tokens, n_greedy * sizeof(int32_t));
    golden_free(&gc);
    quill_context_free(c);
    quill_model_free(m);
    CHECK(st == QUILL_OK, "%s", err.message);
    CHECK(same, "%d tokens, first %d (want %d), last %d (want %d)", out.n_tokens, out.tokens[0], first,
          out.n_tokens ? out.tokens[out.n_tokens - 1] : -1, last);
    CHECK_EQ_INT(res.finish, QUILL_FINISH_LENGTH);
    CHECK_EQ_INT(res.n_generated, (int)n_greedy);
    CHECK_EQ_INT(res.n_prompt, 5);
    CHECK(!strncmp(out.text, once_continuation, 20), "text %s", out.text);
}

/* Stop strings end generation, are not in the output, and text that might begin one is held back
 * from the stream until it cannot: no callback ever receives a piece of "Lily.". */
TEST(generate_stop_strings_are_held_back_and_cut) {
    REQUIRE_SHARED(shared);
    quill_model *m;
    quill_context *c;
    CHECK(open_stories(shared, 0, &m, &c));
    quill_generate_params p = quill_generate_defaults();
    p.sampling.temperature = 0;
    p.n_predict = 40;
    const char *stops[] = {"Lily.", "zzz never"};
    p.stop = stops;
    p.n_stop = 2;
    collected out = {0};
    quill_generate_result res;
    quill_error err;
    quill_status st = quill_generate_text(c, "Once upon a time", &p, collect, &out, &res, &err);
    CHECK(st == QUILL_OK, "%s", err.message);
    CHECK(!strcmp(out.text, ", there was a little girl named "), "text \"%s\"", out.text);
    CHECK(res.stop_string && res.finish == QUILL_FINISH_STOP && !res.cancelled);
    /* "Lily" alone (a prefix of the stop string followed by other text) is released */
    const char *stops2[] = {"Lily's mom"};
    p.stop = stops2;
    p.n_stop = 1;
    p.n_predict = 64;
    memset(&out, 0, sizeof out);
    st = quill_generate_text(c, "Once upon a time", &p, collect, &out, &res, &err);
    CHECK(st == QUILL_OK, "%s", err.message);
    CHECK(!strncmp(out.text, once_continuation, strlen(once_continuation)), "text \"%s\"", out.text);
    CHECK(strstr(out.text, "Lily's mom") == NULL && res.stop_string, "text \"%s\"", out.text);
    quill_context_free(c);
    quill_model_free(m);
}

/* The callback stops generation by returning false; n_predict and a full context end it with
 * "length". */
TEST(generate_callback_stop_length_and_full_context) {
    REQUIRE_SHARED(shared);
    quill_model *m;
    quill_context *c;
    CHECK(open_stories(shared, 8, &m, &c));
    quill_generate_params p = quill_generate_defaults();
    p.sampling.temperature = 0;
    p.n_predict = 3;
    collected out = {.stop_after = 2};
    quill_generate_result res;
    quill_error err;
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &out, &res, &err) == QUILL_OK, "%s", err.message);
    CHECK(res.cancelled && res.n_generated == 2 && out.n_tokens == 2 && !out.saw_final);
    memset(&out, 0, sizeof out);
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &out, &res, &err) == QUILL_OK, "%s", err.message);
    CHECK(!res.cancelled && res.n_generated == 3 && res.finish == QUILL_FINISH_LENGTH && !res.context_full);
    /* 5 prompt tokens in 8 positions: 4 more tokens can be sampled (the last is never evaluated) */
    p.n_predict = -1;
    memset(&out, 0, sizeof out);
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &out, &res, &err) == QUILL_OK, "%s", err.message);
    CHECK(res.context_full && res.finish == QUILL_FINISH_LENGTH, "finish %s", quill_finish_name(res.finish));
    CHECK_EQ_INT(res.n_generated, 4);
    CHECK_EQ_INT(quill_context_pos(c), 8);
    /* a prompt that does not fit is refused before anything is evaluated */
    int32_t many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    quill_context_truncate(c, 0);
    CHECK_EQ_INT(quill_generate(c, NULL, many, 9, &p, collect, &out, &res, &err), QUILL_E_CONTEXT);
    CHECK_STR_CONTAINS(err.message, "the prompt has 9 tokens");
    CHECK_EQ_INT(quill_generate(c, NULL, many, 0, &p, collect, &out, &res, &err), QUILL_E_ARG);
    quill_context_free(c);
    quill_model_free(m);
}

static bool always_stop(void *user) {
    (void)user;
    return true;
}

/* should_stop() is polled during the prompt's evaluation: nothing is generated. */
TEST(generate_should_stop_interrupts_prompt) {
    REQUIRE_SHARED(shared);
    quill_model *m;
    quill_context *c;
    CHECK(open_stories(shared, 0, &m, &c));
    quill_generate_params p = quill_generate_defaults();
    p.should_stop = always_stop;
    collected out = {0};
    quill_generate_result res;
    quill_error err;
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &out, &res, &err) == QUILL_OK, "%s", err.message);
    CHECK(res.cancelled && res.n_prompt == 0 && res.n_generated == 0 && out.calls == 0);
    quill_context_free(c);
    quill_model_free(m);
}

/* One parser of sampling options for every front end: names, ranges and messages. */
TEST(sampler_params_set_by_name) {
    quill_sampler_params p = quill_sampler_defaults();
    quill_error err;
    CHECK(quill_sampler_params_set(&p, "--top-p", "0.5", &err) == QUILL_OK && p.top_p == 0.5f);
    CHECK_EQ_INT(quill_sampler_params_set(&p, "--top-p", "0", &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "--top-p: '0' is not a number in (0, 1]");
    CHECK(p.top_p == 0.5f, "a refused value must not change the parameters");
    CHECK(quill_sampler_params_set(&p, "temperature", "0", &err) == QUILL_OK && p.temperature == 0);
    CHECK(quill_sampler_params_set(&p, "temp", "1.5", &err) == QUILL_OK && p.temperature == 1.5f);
    CHECK_EQ_INT(quill_sampler_params_set(&p, "temp", "-1", &err), QUILL_E_ARG);
    CHECK_EQ_INT(quill_sampler_params_set(&p, "top_k", "1x", &err), QUILL_E_ARG);
    CHECK_EQ_INT(quill_sampler_params_set(&p, "min_p", "nan", &err), QUILL_E_ARG);
    CHECK_EQ_INT(quill_sampler_params_set(&p, "repeat_penalty", "0", &err), QUILL_E_ARG);
    CHECK(quill_sampler_params_set(&p, "repeat-last-n", "32", &err) == QUILL_OK && p.repeat_last_n == 32);
    CHECK(quill_sampler_params_set(&p, "seed", "18446744073709551615", &err) == QUILL_OK && p.seed == UINT64_MAX);
    CHECK_EQ_INT(quill_sampler_params_set(&p, "seed", "-2", &err), QUILL_E_ARG);
    CHECK_EQ_INT(quill_sampler_params_set(&p, "seed", "", &err), QUILL_E_ARG);
    CHECK(quill_sampler_params_set(&p, "seed", "-1", &err) == QUILL_OK);
    uint64_t a = p.seed;
    CHECK(quill_sampler_params_set(&p, "seed", "-1", &err) == QUILL_OK);
    CHECK(a != p.seed, "two random seeds were equal");
    CHECK_EQ_INT(quill_sampler_params_set(&p, "bogus", "1", &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "unknown sampling option 'bogus'");
    CHECK(quill_sampler_params_check(&p, &err) == QUILL_OK, "%s", err.message);
    p.top_p = 0;
    CHECK_EQ_INT(quill_sampler_params_check(&p, &err), QUILL_E_ARG);
}
