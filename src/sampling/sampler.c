/* Token sampler: the llama.cpp "common sampler" chain, deterministic and allocation-free per call.
 *
 * The sampler is a list of stages, each with apply / accept / reset, run in order on every draw
 * until one chooses the token (each stage passes its input on unchanged when its parameter has
 * the "off" value):
 *   1. penalties over the last `repeat_last_n` accepted tokens (prompt and generated): every
 *      distinct token in the window is penalised once by `repeat_penalty`, a positive logit
 *      divided by it, a zero or negative one multiplied by it, then lowered by `frequency_penalty`
 *      times its count in the window plus `presence_penalty` (OpenAI's penalties, in the order and
 *      window llama.cpp applies them);
 *   2. the caller's restricting stages (quill_sampler_add_stage: a grammar), which set the logits
 *      of the tokens they exclude to -inf and accept only generated tokens;
 *   3. the frame: NaN -> -inf, maximum, argmax; greedy chooses here;
 *   4. top-k: the k best tokens;
 *   5. top-p: the shortest prefix of the candidates, sorted by descending logit, whose softmax
 *      probability (over the candidates top-k left) reaches `top_p`; at least one token is kept;
 *   6. min-p: drops tokens with p < min_p * p_max (tested as logit < max_logit + log(min_p), which
 *      is the same condition and needs no normalisation);
 *   7. dist: temperature (logits divided by `temperature`) and a draw from the softmax of what is
 *      left, with the sampler's own RNG; min-p's threshold and the temperature are applied in this
 *      one pass over the candidates.
 * When every restricting stage can judge a single token (`allows`), the chain first runs without
 * them and keeps the token if they all allow it, as the reference does with grammars; only a
 * refused token costs the restriction of the whole vocabulary and a second draw.
 *
 * Greedy: temperature 0 returns the argmax of the logits after the repetition penalty (with the
 * default repeat_penalty 1 that is the argmax of the raw logits); top-k, top-p and min-p never
 * remove the best token, so they are irrelevant there. top_k == 1 gives the same answer at any
 * temperature.
 *
 * Ordering is total and deterministic: a higher logit first, equal logits by ascending id. So ties
 * always resolve to the lowest id (greedy, the top-k boundary, the top-p prefix). NaN logits are
 * treated as -inf (written back into `logits`). If every logit is -inf the result is the lowest id
 * (0); if some logits are +inf the lowest such id is returned.
 *
 * Randomness: xoshiro256** seeded by expanding `seed` with splitmix64, so every 64-bit seed,
 * including 0 (the default), is an ordinary fixed seed: the same seed and parameters give the
 * same token sequence for the same logits, whatever the thread count, with no global state (across
 * machines too, up to differences between C libraries' expf/logf). A uniform
 * double in [0,1) is the top 53 bits of one output times 2^-53. Every call to
 * quill_sampler_sample() with temperature > 0 consumes exactly one 64-bit output (greedy calls
 * consume none), so the stream position depends only on the number of calls.
 *
 * Cost: one pass over the logits finds the maximum; top-k (k <= 256) then keeps a size-k heap,
 * close to one comparison per token. Top-p without top-k, and larger k, bin the tokens by logit
 * into 1024 buckets, find the bucket where the count or probability mass is reached, and sort only
 * the tokens of the buckets up to it. No full O(n log n) sort happens unless the logits are
 * (nearly) all equal. min-p, temperature and the draw are linear in the candidates left. All
 * scratch memory is allocated by quill_sampler_new(); sampling never allocates.
 *
 * Tokens given to quill_sampler_accept() outside [0, n_vocab) are ignored. quill_sampler_sample()
 * returns -1 only when called with a NULL sampler or NULL logits.
 *
 * The room src/sampling/: choosing the next token: the sampler's stages (this file), GBNF grammars
 * (grammar.c parses, grammar_match.c runs one over tokens) and JSON Schema to GBNF (json_schema.c).
 * It calls src/base/ and the tokenizer's public functions (a grammar's token masks read the
 * vocabulary's texts), never the model or the generation loop.
 */
#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Top-k up to this size uses a heap of k; larger k and top-p without top-k use buckets. */
#define HEAP_MAX_K 256
/* Bucket selection: logits are binned by their distance below the maximum, over at most
 * BUCKET_SPAN logits (further ones share the last bucket). */
#define N_BUCKETS 1024
#define BUCKET_SPAN 64.0f

typedef struct cand {
    float logit;
    int32_t id;
} cand;

/* What the stages pass along: the logits, then the candidates the selection stages keep, and the
 * token once one is chosen. */
typedef struct candidates {
    float *logits;         /* n_vocab, modified in place by the logit stages */
    const cand *list;      /* the candidates list[0..len), or the whole vocabulary in id order when NULL */
    size_t len;
    float lmax, lmin;      /* over the sanitized logits */
    int32_t best;          /* the argmax (lowest id among equals) */
    double u;              /* this draw's uniform number */
    float min_logit;       /* min-p's threshold (-inf: off) */
    int32_t selected;      /* >= 0 once a stage has chosen the token: the chain stops there */
} candidates;

/* A stage of the chain. `apply` transforms the candidates (and may choose the token); `accept`
 * sees every token the sampler is told about (`generated` false for prompt tokens); `reset`
 * returns to the state after construction (the RNG stream excepted: see quill_sampler_reset). */
typedef struct stage {
    const char *name;
    bool (*apply)(quill_sampler *s, struct stage *st, candidates *c);
    void (*accept)(quill_sampler *s, struct stage *st, int32_t token, bool generated);
    void (*reset)(quill_sampler *s, struct stage *st);
    quill_sampler_stage user;   /* a caller's restricting stage (a grammar): the callbacks it brings */
} stage;

enum { MAX_STAGES = 16 };

struct quill_sampler {
    quill_sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    stage stages[MAX_STAGES];
    int n_stages;
    int n_user;             /* caller's stages, which sit right after the penalties */
    /* repetition window: a ring of the last repeat_last_n accepted tokens */
    int32_t *recent;
    int n_recent, recent_head;
    int32_t *count;        /* n_vocab counts of tokens in the window, all zero between calls */
    cand *cand;            /* n_vocab + 1: heap / candidate list (+1: a slot for discarded writes) */
    float *weight;         /* n_vocab: softmax weights of the final draw */
    uint16_t *bucket;      /* n_vocab: each token's bucket */
    float *saved;          /* n_vocab: the logits before the chain, for a draw again after a
                            * restricting stage refused the first one (allocated with the first such stage) */
    /* bucket selection (top-p without top-k, large top-k) */
    uint32_t bucket_count[N_BUCKETS];
    double bucket_mass[N_BUCKETS];
    size_t bucket_pos[N_BUCKETS];
    quill_error stage_error;    /* why a restricting stage failed (quill_sampler_sample returned -1) */
};

quill_sampler_params quill_sampler_defaults(void) {
    return (quill_sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .seed = 0,
    };
}

/* ---------------------------------------------------------------- RNG */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* ---------------------------------------------------------------- ordering and heaps */

/* a comes before b: higher logit, then lower id. A strict total order once NaNs are gone. */
static inline bool cand_better(cand a, cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/* Heap whose root is the worst element (used to keep the k best). */
static void sift_down_worst(cand *h, size_t n, size_t i) {
    cand x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_better(h[c], h[c + 1])) c++;   /* the worse child */
        if (!cand_better(x, h[c])) break;                     /* x is worse: it stays above */
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/* Heap whose root is the best element. */
static void sift_down_best(cand *h, size_t n, size_t i) {
    cand x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_better(h[c + 1], h[c])) c++;   /* the better child */
        if (!cand_better(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/* Sorts a[0..n) best first. */
static void sort_desc(cand *a, size_t n) {
    if (n <= 16) {
        for (size_t i = 1; i < n; i++) {
            cand x = a[i];
            size_t j = i;
            for (; j > 0 && cand_better(x, a[j - 1]); j--) a[j] = a[j - 1];
            a[j] = x;
        }
        return;
    }
    for (size_t i = n / 2; i-- > 0;) sift_down_worst(a, n, i);
    /* heap sort: the worst goes to the end each time, leaving the array best first */
    for (size_t end = n; end-- > 1;) {
        cand t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift_down_worst(a, end, 0);
    }
}

/* ---------------------------------------------------------------- lifetime */

quill_status quill_sampler_params_check(const quill_sampler_params *params, quill_error *err) {
    if (!params) return quill_fail(err, QUILL_E_ARG, "sampler: no parameters given");
    quill_sampler_params p = *params;
    if (!(p.temperature >= 0.0f) || isinf(p.temperature))
        return quill_fail(err, QUILL_E_ARG,
                          "sampler: temperature must be finite and >= 0 (got %g; 0 means greedy)",
                          (double)p.temperature);
    if (p.top_k < 0)
        return quill_fail(err, QUILL_E_ARG, "sampler: top_k must be >= 0 (got %d; 0 disables it)", p.top_k);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        return quill_fail(err, QUILL_E_ARG, "sampler: top_p must be in (0, 1] (got %g; 1 disables it)",
                          (double)p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        return quill_fail(err, QUILL_E_ARG, "sampler: min_p must be in [0, 1] (got %g; 0 disables it)",
                          (double)p.min_p);
    if (!(p.repeat_penalty > 0.0f) || isinf(p.repeat_penalty))
        return quill_fail(err, QUILL_E_ARG,
                          "sampler: repeat_penalty must be finite and > 0 (got %g; 1 disables it)",
                          (double)p.repeat_penalty);
    if (!isfinite(p.presence_penalty) || !isfinite(p.frequency_penalty))
        return quill_fail(err, QUILL_E_ARG,
                          "sampler: presence_penalty and frequency_penalty must be finite (got %g, %g; 0 "
                          "disables them)",
                          (double)p.presence_penalty, (double)p.frequency_penalty);
    if (p.repeat_last_n < 0)
        return quill_fail(err, QUILL_E_ARG,
                          "sampler: repeat_last_n must be >= 0 (got %d; 0 disables the penalty)",
                          p.repeat_last_n);
    return QUILL_OK;
}

/* Option names as the CLI and the OpenAI API spell them; dashes count as underscores. */
static bool name_is(const char *name, const char *want) {
    while (*name == '-') name++;
    for (; *name && *want; name++, want++)
        if (*name != *want && !(*name == '-' && *want == '_')) return false;
    return !*name && !*want;
}

static bool parse_whole(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_real(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

uint64_t quill_random_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed) return seed;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    return splitmix64(&x);
}

quill_status quill_sampler_params_set(quill_sampler_params *p, const char *name, const char *value,
                                      quill_error *err) {
    if (!p || !name) return quill_fail(err, QUILL_E_ARG, "sampler option: no parameters or name given");
    quill_sampler_params q = *p;
    long long l;
    double d;
    if (name_is(name, "seed")) {
        if (value && !strcmp(value, "-1")) {
            q.seed = quill_random_seed();
        } else {
            char *end;
            errno = 0;
            unsigned long long u = value && *value && *value != '-' ? strtoull(value, &end, 10) : 0;
            if (!value || !*value || *value == '-' || *value == '+' || errno || *end)
                return quill_fail(err, QUILL_E_ARG,
                                  "%s: '%s' is not a whole number in 0..18446744073709551615 (-1 = random)",
                                  name, value ? value : "");
            q.seed = u;
        }
    } else if (name_is(name, "top_k") || name_is(name, "repeat_last_n")) {
        bool k = name_is(name, "top_k");
        long long hi = k ? (1ll << 30) : (1ll << 24);
        if (!parse_whole(value, 0, hi, &l))
            return quill_fail(err, QUILL_E_ARG, "%s: '%s' is not a whole number in 0..%lld (0 = off)",
                              name, value ? value : "", hi);
        if (k) q.top_k = (int)l;
        else q.repeat_last_n = (int)l;
    } else if (name_is(name, "temperature") || name_is(name, "temp")) {
        if (!parse_real(value, &d) || d < 0 || d > 1e6)
            return quill_fail(err, QUILL_E_ARG, "%s: '%s' is not a number in 0..1e6 (0 = greedy)", name, value ? value : "");
        q.temperature = (float)d;
    } else if (name_is(name, "top_p")) {
        if (!parse_real(value, &d) || !(d > 0 && d <= 1))
            return quill_fail(err, QUILL_E_ARG, "%s: '%s' is not a number in (0, 1] (1 = off)", name, value ? value : "");
        q.top_p = (float)d;
    } else if (name_is(name, "min_p")) {
        if (!parse_real(value, &d) || !(d >= 0 && d <= 1))
            return quill_fail(err, QUILL_E_ARG, "%s: '%s' is not a number in [0, 1] (0 = off)", name, value ? value : "");
        q.min_p = (float)d;
    } else if (name_is(name, "repeat_penalty")) {
        if (!parse_real(value, &d) || !(d > 0 && d <= 1e6))
            return quill_fail(err, QUILL_E_ARG, "%s: '%s' is not a number in (0, 1e6] (1 = off)", name, value ? value : "");
        q.repeat_penalty = (float)d;
    } else {
        return quill_fail(err, QUILL_E_ARG,
                          "unknown sampling option '%s' (temperature, top_k, top_p, min_p, repeat_penalty, "
                          "repeat_last_n, seed)", name);
    }
    *p = q;
    return QUILL_OK;
}

static bool penalties_apply(quill_sampler *s, stage *st, candidates *c);
static void penalties_accept(quill_sampler *s, stage *st, int32_t token, bool generated);
static void penalties_reset(quill_sampler *s, stage *st);
static bool frame_apply(quill_sampler *s, stage *st, candidates *c);
static bool top_k_apply(quill_sampler *s, stage *st, candidates *c);
static bool top_p_apply(quill_sampler *s, stage *st, candidates *c);
static bool min_p_apply(quill_sampler *s, stage *st, candidates *c);
static bool dist_apply(quill_sampler *s, stage *st, candidates *c);

quill_status quill_sampler_new(const quill_sampler_params *params, int32_t n_vocab, quill_sampler **out,
                               quill_error *err) {
    if (!out) return quill_fail(err, QUILL_E_ARG, "quill_sampler_new: `out` must not be NULL");
    *out = NULL;
    quill_sampler_params p = params ? *params : quill_sampler_defaults();

    if (n_vocab <= 0)
        return quill_fail(err, QUILL_E_ARG, "sampler: n_vocab must be > 0 (got %d)", (int)n_vocab);
    quill_status st = quill_sampler_params_check(&p, err);
    if (st) return st;

    quill_sampler *s = calloc(1, sizeof *s);
    if (!s) return quill_fail(err, QUILL_E_NOMEM, "sampler: out of memory");
    s->p = p;
    s->n_vocab = n_vocab;
    size_t n = (size_t)n_vocab;
    bool penalty = (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) &&
                   p.repeat_last_n > 0;
    s->cand = malloc((n + 1) * sizeof *s->cand);
    s->weight = malloc(n * sizeof *s->weight);
    s->bucket = malloc(n * sizeof *s->bucket);
    bool ok = s->cand && s->weight && s->bucket;
    if (penalty) {
        s->recent = malloc((size_t)p.repeat_last_n * sizeof *s->recent);
        s->count = calloc(n, sizeof *s->count);
        ok = ok && s->recent && s->count;
    }
    if (!ok) {
        quill_sampler_free(s);
        return quill_fail(err, QUILL_E_NOMEM, "sampler: out of memory allocating scratch for %d tokens",
                          (int)n_vocab);
    }
    /* The chain. Every stage is present and passes its candidates on unchanged when its parameter
     * has the "off" value; a caller's restricting stages go in after the penalties. */
    s->stages[s->n_stages++] = (stage){"penalties", penalties_apply, penalties_accept, penalties_reset, {0}};
    s->stages[s->n_stages++] = (stage){"logits", frame_apply, NULL, NULL, {0}};
    s->stages[s->n_stages++] = (stage){"top_k", top_k_apply, NULL, NULL, {0}};
    s->stages[s->n_stages++] = (stage){"top_p", top_p_apply, NULL, NULL, {0}};
    s->stages[s->n_stages++] = (stage){"min_p", min_p_apply, NULL, NULL, {0}};
    s->stages[s->n_stages++] = (stage){"dist", dist_apply, NULL, NULL, {0}};

    uint64_t x = p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return QUILL_OK;
}

void quill_sampler_free(quill_sampler *s) {
    if (!s) return;
    for (int i = 0; i < s->n_stages; i++)
        if (s->stages[i].user.free) s->stages[i].user.free(s->stages[i].user.state);
    free(s->recent);
    free(s->count);
    free(s->cand);
    free(s->weight);
    free(s->bucket);
    free(s->saved);
    free(s);
}

static bool user_apply(quill_sampler *s, stage *st, candidates *c) {
    return st->user.apply(st->user.state, c->logits, s->n_vocab, &s->stage_error);
}

static void user_accept(quill_sampler *s, stage *st, int32_t token, bool generated) {
    (void)s;
    if (generated && st->user.accept) st->user.accept(st->user.state, token);
}

static void user_reset(quill_sampler *s, stage *st) {
    (void)s;
    if (st->user.reset) st->user.reset(st->user.state);
}

quill_status quill_sampler_add_stage(quill_sampler *s, const quill_sampler_stage *user, quill_error *err) {
    if (!user) return quill_fail(err, QUILL_E_ARG, "sampler: no stage given");
    quill_status st = QUILL_OK;
    if (!s || !user->apply)
        st = quill_fail(err, QUILL_E_ARG, "sampler: a stage needs a sampler and an apply function");
    else if (s->n_stages == MAX_STAGES)
        st = quill_fail(err, QUILL_E_ARG, "sampler: too many stages (at most %d)", MAX_STAGES);
    else if (!s->saved && !(s->saved = malloc((size_t)s->n_vocab * sizeof *s->saved)))
        st = quill_fail(err, QUILL_E_NOMEM, "sampler: out of memory for a stage over %d tokens", (int)s->n_vocab);
    if (st) {
        if (user->free) user->free(user->state);
        return st;
    }
    const int at = 1 + s->n_user;   /* after the penalties and the stages added before */
    memmove(s->stages + at + 1, s->stages + at, (size_t)(s->n_stages - at) * sizeof *s->stages);
    s->stages[at] = (stage){user->name ? user->name : "stage", user_apply, user_accept, user_reset, *user};
    s->n_stages++;
    s->n_user++;
    return QUILL_OK;
}

static void accept_token(quill_sampler *s, int32_t token, bool generated) {
    if (!s) return;
    for (int i = 0; i < s->n_stages; i++)
        if (s->stages[i].accept) s->stages[i].accept(s, &s->stages[i], token, generated);
}

void quill_sampler_accept(quill_sampler *s, int32_t token) { accept_token(s, token, true); }
void quill_sampler_accept_prompt(quill_sampler *s, int32_t token) { accept_token(s, token, false); }

void quill_sampler_reset(quill_sampler *s) {
    if (!s) return;
    for (int i = 0; i < s->n_stages; i++)
        if (s->stages[i].reset) s->stages[i].reset(s, &s->stages[i]);
}

const char *quill_sampler_error(const quill_sampler *s) {
    return s && s->stage_error.message[0] ? s->stage_error.message : NULL;
}

/* ---------------------------------------------------------------- penalties */

static void penalties_accept(quill_sampler *s, stage *st, int32_t token, bool generated) {
    (void)st, (void)generated;
    if (!s->recent || token < 0 || token >= s->n_vocab) return;
    int cap = s->p.repeat_last_n;
    s->recent[s->recent_head] = token;
    s->recent_head = s->recent_head + 1 == cap ? 0 : s->recent_head + 1;
    if (s->n_recent < cap) s->n_recent++;
}

static void penalties_reset(quill_sampler *s, stage *st) {
    (void)st;
    s->n_recent = s->recent_head = 0;
}

/* ---------------------------------------------------------------- sampling */

static void apply_penalties(quill_sampler *s, float *logits) {
    const float pen = s->p.repeat_penalty, freq = s->p.frequency_penalty, presence = s->p.presence_penalty;
    for (int i = 0; i < s->n_recent; i++) s->count[s->recent[i]]++;
    for (int i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[i];
        if (!s->count[t]) continue;   /* already penalised */
        float l = logits[t];
        if (pen != 1.0f) l = l > 0.0f ? l / pen : l * pen;
        logits[t] = l - ((float)s->count[t] * freq + presence);
        s->count[t] = 0;
    }
}

static bool penalties_apply(quill_sampler *s, stage *st, candidates *c) {
    (void)st;
    if (s->n_recent > 0) apply_penalties(s, c->logits);
    return true;
}

/* Keeps the k best of all tokens in s->cand[0..k), sorted best first when `sorted` (otherwise in
 * heap order). O(n log k) at worst, close to one comparison per token in practice. */
static void select_top_k_heap(quill_sampler *s, const float *logits, size_t k, bool sorted) {
    cand *h = s->cand;
    const size_t n = (size_t)s->n_vocab;
    for (size_t i = 0; i < k; i++) h[i] = (cand){logits[i], (int32_t)i};
    for (size_t i = k / 2; i-- > 0;) sift_down_worst(h, k, i);
    /* Later ids lose ties against everything already in the heap, so a token enters only when its
     * logit is strictly above the worst one kept. */
    float worst = h[0].logit;
    size_t i = k;
    /* blocks of eight: most blocks have nothing above the worst kept and are skipped whole */
    for (; i + 8 <= n; i += 8) {
        const float *b = logits + i;
        float m01 = b[1] > b[0] ? b[1] : b[0], m23 = b[3] > b[2] ? b[3] : b[2];
        float m45 = b[5] > b[4] ? b[5] : b[4], m67 = b[7] > b[6] ? b[7] : b[6];
        float m03 = m23 > m01 ? m23 : m01, m47 = m67 > m45 ? m67 : m45;
        if (!((m47 > m03 ? m47 : m03) > worst)) continue;
        for (size_t j = i; j < i + 8; j++) {
            if (!(logits[j] > worst)) continue;
            h[0] = (cand){logits[j], (int32_t)j};
            sift_down_worst(h, k, 0);
            worst = h[0].logit;
        }
    }
    for (; i < n; i++) {
        if (!(logits[i] > worst)) continue;
        h[0] = (cand){logits[i], (int32_t)i};
        sift_down_worst(h, k, 0);
        worst = h[0].logit;
    }
    if (!sorted) return;
    for (size_t end = k; end-- > 1;) {
        cand t = h[0];
        h[0] = h[end];
        h[end] = t;
        sift_down_worst(h, end, 0);
    }
}

/* Moves the best elements of a[0..n) to its front, best first, and returns how many: `limit` of
 * them, or (when target > 0) as many as it takes for `cum` plus their weights expf(logit - lmax) to
 * reach `target` (all n if rounding never gets there). O(n + r log n) for r elements. */
static size_t take_best(cand *a, size_t n, size_t limit, double cum, double target, float lmax) {
    if (n == 0) return 0;
    /* Already in order (e.g. equal logits, which the bucket pass leaves in id order): just count. */
    size_t sorted_len = 1;
    while (sorted_len < n && cand_better(a[sorted_len - 1], a[sorted_len])) sorted_len++;
    if (sorted_len == n) {
        size_t r = 0;
        while (r < n && r < limit) {
            r++;
            if (target > 0.0) {
                cum += expf(a[r - 1].logit - lmax);
                if (cum >= target) break;
            }
        }
        return r;
    }
    /* a heap with the best on top; popped elements collect at the end, the best last */
    for (size_t i = n / 2; i-- > 0;) sift_down_best(a, n, i);
    size_t heap_n = n, r = 0;
    while (heap_n > 0 && r < limit) {
        cand x = a[0];
        a[0] = a[--heap_n];
        sift_down_best(a, heap_n, 0);
        a[heap_n] = x;
        r++;
        if (target > 0.0) {
            cum += expf(x.logit - lmax);
            if (cum >= target) break;
        }
    }
    /* a[n-r..n) holds them worst first: reverse, then move to the front */
    for (size_t i = n - r, j = n - 1; i < j; i++, j--) {
        cand t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
    memmove(a, a + (n - r), r * sizeof *a);
    return r;
}

/* Bucket of a token whose logit is `d` below the maximum: monotone in d, so buckets are ordered
 * like the tokens. */
static inline size_t bucket_of(float d, float span, float scale) {
    if (!(d < span)) return N_BUCKETS - 1;
    size_t b = (size_t)(d * scale);
    return b < N_BUCKETS - 2 ? b : N_BUCKETS - 2;
}

/* Selection by buckets: bins the tokens by logit, finds the boundary bucket, and orders only what
 * must be ordered. Fills s->cand and returns the number of candidates:
 *   by_mass false: the k best tokens, sorted best first when `sorted`, otherwise in no particular
 *                  (but deterministic) order;
 *   by_mass true:  the top-p nucleus over the whole vocabulary, in no particular order. */
static size_t select_by_buckets(quill_sampler *s, const float *logits, float lmax, float lmin, size_t k,
                                bool by_mass, bool sorted) {
    const size_t n = (size_t)s->n_vocab;
    float span = lmax - lmin;
    if (!(span <= BUCKET_SPAN)) span = BUCKET_SPAN;
    if (!(span >= 1e-6f)) span = 1.0f;   /* (nearly) all equal: one bucket takes them */
    const float scale = (float)(N_BUCKETS - 1) / span;

    memset(s->bucket_count, 0, sizeof s->bucket_count);
    memset(s->bucket_mass, 0, sizeof s->bucket_mass);
    memset(s->bucket_pos, 0, sizeof s->bucket_pos);
    uint16_t *tb = s->bucket;
    if (by_mass) {
        for (size_t i = 0; i < n; i++) {
            size_t b = bucket_of(lmax - logits[i], span, scale);
            tb[i] = (uint16_t)b;
            s->bucket_count[b]++;
            s->bucket_mass[b] += expf(logits[i] - lmax);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t b = bucket_of(lmax - logits[i], span, scale);
            tb[i] = (uint16_t)b;
            s->bucket_count[b]++;
        }
    }

    double target = 0.0, cum = 0.0;
    if (by_mass) {
        double total = 0.0;
        for (size_t b = 0; b < N_BUCKETS; b++) total += s->bucket_mass[b];
        target = (double)s->p.top_p * total;
    }
    /* the boundary bucket `last`: the first where the count or the mass is reached */
    size_t last = 0, m = 0;
    for (;; last++) {
        s->bucket_pos[last] = m;
        if (last == N_BUCKETS - 1) break;
        if (by_mass ? cum + s->bucket_mass[last] >= target : m + s->bucket_count[last] >= k) break;
        m += s->bucket_count[last];
        cum += s->bucket_mass[last];
    }
    const size_t before = m;   /* tokens in the buckets above the boundary: all kept */

    /* counting sort by bucket (ids ascending within each); tokens past the boundary are written to
     * the spare slot s->cand[n] instead of being branched around (bucket_pos[b] stays 0 for them) */
    for (size_t i = 0; i < n; i++) {
        size_t b = tb[i], keep = b <= last;
        size_t slot = keep ? s->bucket_pos[b] : n;
        s->cand[slot] = (cand){logits[i], (int32_t)i};
        s->bucket_pos[b] += keep;
    }
    cand *edge = s->cand + before;
    const size_t n_edge = s->bucket_count[last];
    if (by_mass) return before + take_best(edge, n_edge, n_edge, cum, target > 0.0 ? target : 1.0, lmax);
    if (sorted) {
        for (size_t b = 0, start = 0; b < last; b++) {
            sort_desc(s->cand + start, s->bucket_count[b]);
            start += s->bucket_count[b];
        }
    }
    return before + take_best(edge, n_edge, k - before, 0.0, 0.0, lmax);   /* == k */
}

/* The frame of every draw: NaN becomes -inf, the maximum, minimum and argmax; greedy (temperature
 * 0) chooses here, and otherwise this draw's uniform number is taken, so that every draw at a
 * positive temperature consumes exactly one, whatever the later stages do. */
static bool frame_apply(quill_sampler *s, stage *st, candidates *c) {
    (void)st;
    float *logits = c->logits;
    const size_t n = (size_t)s->n_vocab;
    /* eight independent lanes, which compilers turn into vector max/min; the argmax is then the
     * first position of the maximum */
    enum { LANES = 8 };
    float mx[LANES], mn[LANES];
    for (int j = 0; j < LANES; j++) mx[j] = -INFINITY, mn[j] = INFINITY;
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (size_t j = 0; j < LANES; j++) {
            float l = logits[i + j];
            l = l == l ? l : -INFINITY;
            logits[i + j] = l;
            mx[j] = l > mx[j] ? l : mx[j];
            mn[j] = l < mn[j] ? l : mn[j];
        }
    }
    for (; i < n; i++) {
        float l = logits[i];
        l = l == l ? l : -INFINITY;
        logits[i] = l;
        mx[0] = l > mx[0] ? l : mx[0];
        mn[0] = l < mn[0] ? l : mn[0];
    }
    float lmax = mx[0], lmin = mn[0];
    for (int j = 1; j < LANES; j++) {
        lmax = mx[j] > lmax ? mx[j] : lmax;
        lmin = mn[j] < lmin ? mn[j] : lmin;
    }
    size_t best = 0;
    while (logits[best] != lmax) best++;   /* found: lmax is one of the (sanitized) logits */
    c->lmax = lmax;
    c->lmin = lmin;
    c->best = (int32_t)best;
    if (s->p.temperature == 0.0f) {
        c->selected = c->best;
        return true;
    }
    c->u = rng_uniform(s->rng);
    /* Only one token can be chosen: all -inf, a +inf, top-k 1, or a single-token vocabulary. */
    if (s->p.top_k == 1 || isinf(lmax) || n == 1) c->selected = c->best;
    return true;
}

/* top-k: the k best, sorted best first when top-p follows (it takes a prefix of them). */
static bool top_k_apply(quill_sampler *s, stage *st, candidates *c) {
    (void)st;
    const size_t n = (size_t)s->n_vocab;
    if (!(s->p.top_k > 0 && (size_t)s->p.top_k < n)) return true;
    const bool top_p = s->p.top_p < 1.0f;
    size_t len = (size_t)s->p.top_k;
    if (len <= HEAP_MAX_K) select_top_k_heap(s, c->logits, len, top_p);
    else select_by_buckets(s, c->logits, c->lmax, c->lmin, len, false, top_p);
    c->list = s->cand;
    c->len = len;
    return true;
}

/* top-p: the shortest prefix of the sorted candidates whose probability reaches top_p, or, when
 * top-k left the whole vocabulary, the nucleus found by buckets. */
static bool top_p_apply(quill_sampler *s, stage *st, candidates *c) {
    (void)st;
    if (!(s->p.top_p < 1.0f)) return true;
    if (!c->list) {
        c->len = select_by_buckets(s, c->logits, c->lmax, c->lmin, 0, true, false);
        c->list = s->cand;
        return true;
    }
    double z = 0.0;
    for (size_t j = 0; j < c->len; j++) z += expf(c->list[j].logit - c->lmax);
    const double target = (double)s->p.top_p * z;
    double cum = 0.0;
    for (size_t j = 0; j < c->len; j++) {
        cum += expf(c->list[j].logit - c->lmax);
        if (cum >= target) {
            c->len = j + 1;
            break;
        }
    }
    return true;
}

/* min-p: logit >= lmax + log(min_p), the same as p >= min_p * p_max; the best always passes. The
 * threshold is applied in the draw's pass over the candidates. */
static bool min_p_apply(quill_sampler *s, stage *st, candidates *c) {
    (void)st;
    c->min_logit = s->p.min_p > 0.0f ? c->lmax + logf(s->p.min_p) : -INFINITY;
    return true;
}

/* Temperature, the softmax weights and the draw, in one pass over the candidates. */
static bool dist_apply(quill_sampler *s, stage *st, candidates *c) {
    (void)st;
    const float temp = s->p.temperature, lmax = c->lmax, min_logit = c->min_logit;
    const cand *list = c->list;
    float *w = s->weight;
    double sum = 0.0;
    for (size_t j = 0; j < c->len; j++) {
        float l = list ? list[j].logit : c->logits[j];
        w[j] = l >= min_logit ? expf((l - lmax) / temp) : 0.0f;
        sum += w[j];
    }
    /* sum >= 1: the best token has weight expf(0) = 1 */
    const double r = c->u * sum;
    double cum = 0.0;
    size_t pick = 0;
    for (size_t j = 0; j < c->len; j++) {
        if (w[j] <= 0.0f) continue;
        cum += w[j];
        pick = j;
        if (cum > r) break;
    }
    /* if rounding leaves cum <= r at the end, the last token with a positive weight is taken */
    c->selected = list ? list[pick].id : (int32_t)pick;
    return true;
}

/* Runs the chain until a stage chooses; `with_user` false leaves the caller's stages out. */
static int32_t run_chain(quill_sampler *s, float *logits, bool with_user) {
    candidates c = {.logits = logits, .len = (size_t)s->n_vocab, .min_logit = -INFINITY, .selected = -1};
    for (int i = 0; i < s->n_stages && c.selected < 0; i++) {
        stage *st = &s->stages[i];
        if (!with_user && st->user.apply) continue;
        if (!st->apply(s, st, &c)) return -1;
    }
    return c.selected;
}

int32_t quill_sampler_sample(quill_sampler *s, float *logits) {
    if (!s || !logits) return -1;
    s->stage_error.message[0] = 0;
    /* With restricting stages that can judge one token, the reference's order: draw without them,
     * keep the token when they all allow it, otherwise restore the logits, restrict the whole
     * vocabulary and draw again. Most tokens of a model that follows its grammar pass the check,
     * which costs far less than restricting every token. */
    bool check_first = s->n_user > 0;
    for (int i = 0; i < s->n_stages && check_first; i++)
        if (s->stages[i].user.apply && !s->stages[i].user.allows) check_first = false;
    if (check_first) {
        memcpy(s->saved, logits, (size_t)s->n_vocab * sizeof *logits);
        int32_t t = run_chain(s, logits, false);
        bool allowed = t >= 0;
        for (int i = 0; i < s->n_stages && allowed; i++)
            if (s->stages[i].user.allows) allowed = s->stages[i].user.allows(s->stages[i].user.state, t);
        if (allowed) return t;
        memcpy(logits, s->saved, (size_t)s->n_vocab * sizeof *logits);
    }
    return run_chain(s, logits, true);
}
