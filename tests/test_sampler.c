/* Sampler: greedy and tie-breaking, determinism, the distribution it draws from, what top-k,
 * top-p, min-p and the repetition penalty keep or change, and parameter validation. Every
 * statistical check uses a fixed seed, so it gives the same counts on every run. */
#include "test.h"

#include "quill.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* A small deterministic generator for test logits (independent of the sampler's RNG). */
static uint64_t lcg_state;
static double lcg_uniform(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int n, uint64_t seed, double scale) {
    lcg_state = seed;
    for (int i = 0; i < n; i++)
        l[i] = (float)(scale * (lcg_uniform() + lcg_uniform() + lcg_uniform() - 1.5));
}

static quill_sampler_params plain_params(float temp) {
    quill_sampler_params p = quill_sampler_defaults();
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    return p;
}

/* Samples `draws` times from copies of `logits` and counts each id (counts has n entries). */
static bool count_draws(quill_sampler *s, const float *logits, int n, int draws, int *counts) {
    float *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return false;
    memset(counts, 0, (size_t)n * sizeof *counts);
    bool ok = true;
    for (int d = 0; d < draws; d++) {
        memcpy(tmp, logits, (size_t)n * sizeof *tmp);
        int32_t t = quill_sampler_sample(s, tmp);
        if (t < 0 || t >= n) { ok = false; break; }
        counts[t]++;
    }
    free(tmp);
    return ok;
}

/* |count - n p| within 6 binomial standard deviations (plus 1 for tiny p): with a fixed seed this
 * is deterministic, and a correct sampler sits well inside it. */
static bool within_binomial(int count, int draws, double p) {
    double mean = draws * p, sd = sqrt(draws * p * (1.0 - p));
    return fabs(count - mean) <= 6.0 * sd + 1.0;
}

TEST(sampler_defaults) {
    quill_sampler_params p = quill_sampler_defaults();
    CHECK(p.temperature == 0.8f, "temperature %g", (double)p.temperature);
    CHECK_EQ_INT(p.top_k, 40);
    CHECK(p.top_p == 0.95f, "top_p %g", (double)p.top_p);
    CHECK(p.min_p == 0.05f, "min_p %g", (double)p.min_p);
    CHECK(p.repeat_penalty == 1.0f, "repeat_penalty %g", (double)p.repeat_penalty);
    CHECK_EQ_INT(p.repeat_last_n, 64);
    CHECK_EQ_INT(p.seed, 0);
    quill_sampler *s = NULL;
    quill_error err = {0};
    CHECK_EQ_INT(quill_sampler_new(&p, 32000, &s, &err), QUILL_OK);
    CHECK(s != NULL);
    quill_sampler_free(s);
    CHECK_EQ_INT(quill_sampler_new(NULL, 10, &s, &err), QUILL_OK);   /* NULL = the defaults */
    quill_sampler_free(s);
    quill_sampler_free(NULL);
}

TEST(sampler_greedy_argmax_and_ties) {
    quill_sampler_params p = quill_sampler_defaults();
    p.temperature = 0.0f;
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, 6, &s, NULL), QUILL_OK);
    float a[6] = {0.5f, -1.0f, 3.0f, 2.9f, 3.0f, -7.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, a), 2);              /* ties go to the lowest id */
    float b[6] = {-5.0f, -4.0f, -3.0f, -2.0f, -1.5f, -1.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, b), 5);
    float c[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, c), 0);
    float d[6] = {NAN, 0.0f, NAN, 0.25f, -INFINITY, 0.25f};  /* NaN never wins */
    CHECK_EQ_INT(quill_sampler_sample(s, d), 3);
    float e[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK_EQ_INT(quill_sampler_sample(s, e), 0);
    quill_sampler_free(s);

    /* a larger random vocabulary against a plain scan */
    enum { N = 32000 };
    float *l = malloc(N * sizeof *l);
    CHECK(l != NULL);
    CHECK_EQ_INT(quill_sampler_new(&p, N, &s, NULL), QUILL_OK);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        random_logits(l, N, seed, 4.0);
        l[(seed * 7919) % N] = 100.0f;
        l[(seed * 104729) % N] = 100.0f;
        int32_t want = (int32_t)((seed * 7919) % N < (seed * 104729) % N ? (seed * 7919) % N
                                                                         : (seed * 104729) % N);
        int32_t got = quill_sampler_sample(s, l);
        if (got != want) { free(l); quill_sampler_free(s); }
        CHECK(got == want, "seed %d: got %d, want %d", (int)seed, (int)got, (int)want);
    }
    free(l);
    quill_sampler_free(s);
}

TEST(sampler_top_k1_is_greedy) {
    enum { N = 5000 };
    float *l = malloc(N * sizeof *l), *g = malloc(N * sizeof *g);
    CHECK(l && g);
    const float temps[] = {0.1f, 0.8f, 1.0f, 5.0f, 100.0f};
    bool ok = true;
    for (size_t ti = 0; ti < sizeof temps / sizeof temps[0] && ok; ti++) {
        quill_sampler_params p = quill_sampler_defaults();
        p.temperature = temps[ti];
        p.top_k = 1;
        p.top_p = 0.5f;
        p.seed = 1234 + ti;
        quill_sampler_params pg = p;
        pg.temperature = 0.0f;
        quill_sampler *s = NULL, *sg = NULL;
        CHECK_EQ_INT(quill_sampler_new(&p, N, &s, NULL), QUILL_OK);
        CHECK_EQ_INT(quill_sampler_new(&pg, N, &sg, NULL), QUILL_OK);
        for (int it = 0; it < 50 && ok; it++) {
            random_logits(l, N, 99 + (uint64_t)it, 0.5);
            if (it % 2) l[17] = l[4000] = 10.0f;   /* a tie at the top */
            memcpy(g, l, N * sizeof *g);
            int32_t a = quill_sampler_sample(s, l), b = quill_sampler_sample(sg, g);
            ok = a == b && (it % 2 == 0 || a == 17);
            if (!ok) test_fail(__FILE__, __LINE__, "temp %g iter %d: top_k=1 gave %d, greedy %d",
                               (double)temps[ti], it, (int)a, (int)b);
        }
        quill_sampler_free(s);
        quill_sampler_free(sg);
    }
    free(l);
    free(g);
}

/* Draws `n` tokens with a fresh sampler of the given seed, feeding each back through accept(). */
static bool draw_sequence(uint64_t seed, int32_t *out, int n) {
    enum { V = 1000 };
    quill_sampler_params p = quill_sampler_defaults();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 0.98f;
    p.min_p = 0.01f;
    p.repeat_penalty = 1.1f;
    p.seed = seed;
    quill_sampler *s = NULL;
    if (quill_sampler_new(&p, V, &s, NULL) != QUILL_OK) return false;
    float l[V];
    for (int i = 0; i < n; i++) {
        random_logits(l, V, 7 + (uint64_t)i, 1.0);
        out[i] = quill_sampler_sample(s, l);
        quill_sampler_accept(s, out[i]);
    }
    quill_sampler_free(s);
    return true;
}

TEST(sampler_seed_determinism) {
    enum { N = 300 };
    int32_t a[N], b[N], c[N], z[N];
    CHECK(draw_sequence(42, a, N) && draw_sequence(42, b, N) && draw_sequence(43, c, N) &&
          draw_sequence(0, z, N));
    CHECK(memcmp(a, b, sizeof a) == 0, "the same seed gave different sequences");
    int diff = 0, diff0 = 0;
    for (int i = 0; i < N; i++) {
        diff += a[i] != c[i];
        diff0 += a[i] != z[i];
    }
    CHECK(diff > N / 2, "seeds 42 and 43 agree on %d of %d tokens", N - diff, N);
    CHECK(diff0 > N / 2, "seeds 42 and 0 agree on %d of %d tokens", N - diff0, N);
    CHECK(draw_sequence(0, a, N));
    CHECK(memcmp(a, z, sizeof a) == 0, "seed 0 is not deterministic");
}

TEST(sampler_distribution_two_tokens) {
    enum { D = 20000 };
    quill_sampler_params p = plain_params(1.0f);
    p.seed = 20240601;
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, 2, &s, NULL), QUILL_OK);
    float l[2] = {0.0f, logf(3.0f)};   /* p = 1/4, 3/4 */
    int counts[2];
    CHECK(count_draws(s, l, 2, D, counts));
    quill_sampler_free(s);
    CHECK(within_binomial(counts[0], D, 0.25), "token 0 drawn %d of %d times, expected ~%d",
          counts[0], D, D / 4);

    /* temperature 2 halves the logits: p0 = 1 / (1 + sqrt 3) */
    p = plain_params(2.0f);
    p.seed = 7;
    CHECK_EQ_INT(quill_sampler_new(&p, 2, &s, NULL), QUILL_OK);
    CHECK(count_draws(s, l, 2, D, counts));
    quill_sampler_free(s);
    double p0 = 1.0 / (1.0 + sqrt(3.0));
    CHECK(within_binomial(counts[0], D, p0), "temp 2: token 0 drawn %d of %d times, expected ~%.0f",
          counts[0], D, D * p0);

    /* temperature 0.5 doubles them: p0 = 1 / (1 + 9) */
    p = plain_params(0.5f);
    p.seed = 8;
    CHECK_EQ_INT(quill_sampler_new(&p, 2, &s, NULL), QUILL_OK);
    CHECK(count_draws(s, l, 2, D, counts));
    quill_sampler_free(s);
    CHECK(within_binomial(counts[0], D, 0.1), "temp 0.5: token 0 drawn %d of %d times, expected ~%d",
          counts[0], D, D / 10);
}

TEST(sampler_distribution_many_tokens) {
    enum { V = 8, D = 40000 };
    const double probs[V] = {0.30, 0.20, 0.15, 0.12, 0.10, 0.08, 0.04, 0.01};
    float l[V];
    for (int i = 0; i < V; i++) l[(i * 3) % V] = (float)log(probs[i]);   /* ids shuffled */
    quill_sampler_params p = plain_params(1.0f);
    p.seed = 99;
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, V, &s, NULL), QUILL_OK);
    int counts[V];
    CHECK(count_draws(s, l, V, D, counts));
    quill_sampler_free(s);
    for (int i = 0; i < V; i++) {
        int id = (i * 3) % V;
        CHECK(within_binomial(counts[id], D, probs[i]), "token %d: %d draws, expected ~%.0f", id, counts[id],
              D * probs[i]);
    }
}

/* Vocabulary of 1000 where only four tokens (at scattered ids) have real probability. */
enum { SPARSE_V = 1000, SPARSE_D = 6000 };
static const int sparse_ids[4] = {731, 12, 500, 999};
static void sparse_logits(float *l, const double *probs) {
    for (int i = 0; i < SPARSE_V; i++) l[i] = -INFINITY;
    for (int i = 0; i < 4; i++) l[sparse_ids[i]] = (float)log(probs[i]);
}

TEST(sampler_top_p_excludes) {
    const double probs[4] = {0.4, 0.3, 0.2, 0.1};
    float l[SPARSE_V];
    sparse_logits(l, probs);
    int counts[SPARSE_V];
    quill_sampler *s = NULL;

    /* top_p 0.75 without top-k: cumulative 0.4, 0.7, 0.9 -> keeps three tokens */
    quill_sampler_params p = plain_params(1.0f);
    p.top_p = 0.75f;
    p.seed = 1;
    CHECK_EQ_INT(quill_sampler_new(&p, SPARSE_V, &s, NULL), QUILL_OK);
    CHECK(count_draws(s, l, SPARSE_V, SPARSE_D, counts));
    quill_sampler_free(s);
    CHECK(counts[sparse_ids[3]] == 0, "token %d drawn %d times past top-p", sparse_ids[3],
          counts[sparse_ids[3]]);
    for (int i = 0; i < 3; i++)
        CHECK(within_binomial(counts[sparse_ids[i]], SPARSE_D, probs[i] / 0.9), "token %d: %d draws",
              sparse_ids[i], counts[sparse_ids[i]]);

    /* with top_k 3 first, top-p sees 4/9, 3/9, 2/9: cumulative 0.44, 0.78 -> keeps two */
    p.top_k = 3;
    p.seed = 2;
    CHECK_EQ_INT(quill_sampler_new(&p, SPARSE_V, &s, NULL), QUILL_OK);
    CHECK(count_draws(s, l, SPARSE_V, SPARSE_D, counts));
    quill_sampler_free(s);
    CHECK(counts[sparse_ids[2]] == 0 && counts[sparse_ids[3]] == 0, "tokens past top-k/top-p drawn");
    CHECK(within_binomial(counts[sparse_ids[0]], SPARSE_D, 4.0 / 7.0), "token %d: %d draws", sparse_ids[0],
          counts[sparse_ids[0]]);

    /* a tiny top_p keeps the single best token */
    p = plain_params(3.0f);
    p.top_p = 0.01f;
    CHECK_EQ_INT(quill_sampler_new(&p, SPARSE_V, &s, NULL), QUILL_OK);
    CHECK(count_draws(s, l, SPARSE_V, 1000, counts));
    quill_sampler_free(s);
    CHECK_EQ_INT(counts[sparse_ids[0]], 1000);

    /* top-p off: every token shows up */
    p = plain_params(1.0f);
    CHECK_EQ_INT(quill_sampler_new(&p, SPARSE_V, &s, NULL), QUILL_OK);
    CHECK(count_draws(s, l, SPARSE_V, SPARSE_D, counts));
    quill_sampler_free(s);
    for (int i = 0; i < 4; i++)
        CHECK(within_binomial(counts[sparse_ids[i]], SPARSE_D, probs[i]), "token %d: %d draws",
              sparse_ids[i], counts[sparse_ids[i]]);
}

TEST(sampler_min_p_excludes) {
    const double probs[4] = {0.5, 0.3, 0.15, 0.05};
    float l[SPARSE_V];
    sparse_logits(l, probs);
    int counts[SPARSE_V];
    quill_sampler *s = NULL;
    for (int topk = 0; topk <= 10; topk += 10) {   /* unsorted and sorted code paths */
        quill_sampler_params p = plain_params(1.0f);
        p.top_k = topk;
        p.min_p = 0.2f;   /* threshold p >= 0.1: drops the 0.05 token only */
        p.seed = 5;
        CHECK_EQ_INT(quill_sampler_new(&p, SPARSE_V, &s, NULL), QUILL_OK);
        CHECK(count_draws(s, l, SPARSE_V, SPARSE_D, counts));
        quill_sampler_free(s);
        CHECK(counts[sparse_ids[3]] == 0, "top_k %d: token below min-p drawn %d times", topk,
              counts[sparse_ids[3]]);
        CHECK(within_binomial(counts[sparse_ids[2]], SPARSE_D, 0.15 / 0.95), "top_k %d: token %d: %d draws",
              topk, sparse_ids[2], counts[sparse_ids[2]]);

        p.min_p = 0.7f;   /* threshold 0.35: only the best */
        CHECK_EQ_INT(quill_sampler_new(&p, SPARSE_V, &s, NULL), QUILL_OK);
        CHECK(count_draws(s, l, SPARSE_V, 1000, counts));
        quill_sampler_free(s);
        CHECK_EQ_INT(counts[sparse_ids[0]], 1000);
    }
}

TEST(sampler_top_k_ties_by_id) {
    enum { V = 100 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = 1.0f;
    int counts[V];
    quill_sampler_params p = plain_params(1.0f);
    p.top_k = 3;
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, V, &s, NULL), QUILL_OK);
    CHECK(count_draws(s, l, V, 3000, counts));
    quill_sampler_free(s);
    for (int i = 0; i < 3; i++) CHECK(within_binomial(counts[i], 3000, 1.0 / 3), "token %d: %d", i, counts[i]);
    CHECK_EQ_INT(counts[0] + counts[1] + counts[2], 3000);

    /* ties at the boundary next to better tokens: a few 2.0s among 1.0s; the top-k are the 2.0s
     * and then the lowest ids of the 1.0s. Both selection methods (heap; buckets for k > 256). */
    enum { W = 2000 };
    static float m[W];
    static int cw[W];
    const struct { int k, n_twos, twos[5]; } cases[] = {
        {7, 1, {20}},                        /* 1.0s right after the 2.0 must not displace id 5 */
        {7, 5, {20, 33, 47, 390, 1999}},
        {300, 5, {20, 33, 47, 390, 1999}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int k = cases[ci].k, nt = cases[ci].n_twos;
        for (int i = 0; i < W; i++) m[i] = 1.0f;
        for (int j = 0; j < nt; j++) m[cases[ci].twos[j]] = 2.0f;
        p = plain_params(1000.0f);   /* nearly uniform over whatever is kept */
        p.top_k = k;
        p.seed = 11;
        CHECK_EQ_INT(quill_sampler_new(&p, W, &s, NULL), QUILL_OK);
        CHECK(count_draws(s, m, W, 12 * k + 100, cw));
        quill_sampler_free(s);
        int ones_left = k - nt;   /* the 1.0s kept: the lowest ids */
        for (int i = 0; i < W; i++) {
            bool want = m[i] == 2.0f || ones_left-- > 0;
            CHECK(want ? cw[i] > 0 : cw[i] == 0, "case %d: token %d drawn %d times", (int)ci, i, cw[i]);
        }
    }
}

TEST(sampler_nan_logits_large_vocab) {
    enum { V = 3000 };
    static float l[V];
    static int counts[V];
    for (int i = 0; i < V; i++) l[i] = i % 2 ? NAN : -10.0f;
    l[1000] = 0.0f;
    l[2000] = logf(3.0f);   /* the two live tokens: p = 1/4, 3/4 (the -10s add ~1e-3 in all) */
    const struct { int k; float p; } cfg[] = {{0, 1.0f}, {0, 0.99f}, {5, 1.0f}, {400, 1.0f}, {400, 0.99f}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        quill_sampler_params p = plain_params(1.0f);
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].p;
        p.seed = 100 + c;
        quill_sampler *s = NULL;
        CHECK_EQ_INT(quill_sampler_new(&p, V, &s, NULL), QUILL_OK);
        CHECK(count_draws(s, l, V, 3000, counts));
        quill_sampler_free(s);
        int nan_drawn = 0;
        for (int i = 1; i < V; i += 2) nan_drawn += counts[i];
        CHECK(nan_drawn == 0, "config %d: NaN tokens drawn %d times", (int)c, nan_drawn);
        CHECK(within_binomial(counts[1000], 3000, 0.25), "config %d: token 1000 drawn %d times", (int)c,
              counts[1000]);
    }
    /* greedy over a large vocabulary with NaNs */
    quill_sampler_params p = plain_params(0.0f);
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, V, &s, NULL), QUILL_OK);
    float *t = malloc(V * sizeof *t);
    CHECK(t != NULL);
    memcpy(t, l, sizeof l);
    int32_t g = quill_sampler_sample(s, t);
    free(t);
    quill_sampler_free(s);
    CHECK_EQ_INT(g, 2000);
}

/* The kept set from a plain full sort, for comparison with the sampler's partial selection. */
static const float *cmp_logits;
static int cmp_desc(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (cmp_logits[x] != cmp_logits[y]) return cmp_logits[x] > cmp_logits[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int reference_kept(const float *l, int n, int top_k, double top_p, double min_p, int *order) {
    for (int i = 0; i < n; i++) order[i] = i;
    cmp_logits = l;
    qsort(order, (size_t)n, sizeof *order, cmp_desc);
    int len = top_k > 0 && top_k < n ? top_k : n;
    double lmax = l[order[0]];
    if (top_p < 1.0) {
        double z = 0, cum = 0;
        for (int i = 0; i < len; i++) z += exp(l[order[i]] - lmax);
        for (int i = 0; i < len; i++) {
            cum += exp(l[order[i]] - lmax) / z;
            if (cum >= top_p) { len = i + 1; break; }
        }
    }
    if (min_p > 0) {
        int keep = 1;
        while (keep < len && exp(l[order[keep]] - lmax) >= min_p) keep++;
        len = keep;
    }
    return len;
}

TEST(sampler_large_vocab_matches_reference_set) {
    enum { V = 16000, D = 120 };
    float *l = malloc(V * sizeof *l), *tmp = malloc(V * sizeof *tmp);
    int *order = malloc(V * sizeof *order);
    unsigned char *kept = malloc(V);
    CHECK(l && tmp && order && kept);
    /* shape 0: smooth logits; 1: rounded to steps of 0.25 (many ties at every boundary);
     * 2: smooth with every third token masked to -inf; 3: all equal */
    const struct { int k; float p, minp; int shape; } cfg[] = {
        {40, 0.95f, 0.05f, 0}, {0, 0.9f, 0.0f, 0}, {0, 1.0f, 0.1f, 0}, {100, 1.0f, 0.0f, 0},
        {0, 0.5f, 0.02f, 0}, {V, 0.8f, 0.0f, 0}, {1000, 0.9f, 0.0f, 0}, {10000, 1.0f, 0.05f, 0},
        {300, 0.95f, 0.0f, 0}, {256, 0.97f, 0.0f, 0}, {257, 0.97f, 0.0f, 0}, {40, 0.95f, 0.05f, 1},
        {0, 0.9f, 0.0f, 1}, {5000, 0.6f, 0.0f, 1}, {0, 0.95f, 0.0f, 2}, {2000, 1.0f, 0.0f, 2},
        {12000, 1.0f, 0.0f, 2}, {0, 0.3f, 0.0f, 3}, {50, 0.5f, 0.0f, 3}, {1000, 1.0f, 0.0f, 3},
        /* small results from the bucket paths, so that every boundary is checked exactly */
        {0, 0.05f, 0.0f, 0}, {0, 0.1f, 0.0f, 1}, {300, 0.05f, 0.0f, 0}, {2000, 1.0f, 0.5f, 0},
        {0, 0.002f, 0.0f, 3}, {0, 0.2f, 0.0f, 2}, {400, 0.1f, 0.0f, 1},
    };
    bool ok = true;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0] && ok; c++) {
        random_logits(l, V, 1000 + c, 6.0);
        for (int i = 0; i < V; i++) {
            if (cfg[c].shape == 1) l[i] = roundf(l[i] * 4.0f) / 4.0f;
            if (cfg[c].shape == 2 && i % 3 == 0) l[i] = -INFINITY;
            if (cfg[c].shape == 3) l[i] = 0.5f;
        }
        int len = reference_kept(l, V, cfg[c].k, cfg[c].p, cfg[c].minp, order);
        memset(kept, 0, V);
        for (int i = 0; i < len; i++) kept[order[i]] = 1;
        /* a high temperature spreads the draws evenly over the kept set, boundary tokens included
         * (the filters work on the untempered logits) */
        quill_sampler_params p = plain_params(1000.0f);
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].p;
        p.min_p = cfg[c].minp;
        p.seed = c;
        quill_sampler *s = NULL;
        ok = quill_sampler_new(&p, V, &s, NULL) == QUILL_OK;
        int distinct = 0;
        /* sets up to 64 tokens get enough draws to see every member (12 per token: a miss has odds
         * of about len * e^-12, and the seed is fixed) */
        const bool whole = len <= 64;
        int draws = whole ? 12 * len + 20 : D;
        for (int d = 0; d < draws && ok; d++) {
            memcpy(tmp, l, V * sizeof *tmp);
            int32_t t = quill_sampler_sample(s, tmp);
            ok = t >= 0 && t < V && kept[t];
            if (!ok) test_fail(__FILE__, __LINE__, "config %d: drew %d outside the reference set of %d",
                               (int)c, (int)t, len);
            else if (kept[t] == 1) { kept[t] = 2; distinct++; }
        }
        quill_sampler_free(s);
        /* small sets are drawn whole: the sampler keeps no fewer tokens than the reference */
        double expect = len * (1.0 - exp(-(double)draws / len));   /* distinct under uniform draws */
        if (ok && (whole ? distinct != len : distinct < expect / 2)) {
            test_fail(__FILE__, __LINE__, "config %d: %d distinct tokens drawn, %d kept", (int)c, distinct, len);
            ok = false;
        }
    }
    free(l);
    free(tmp);
    free(order);
    free(kept);
}

TEST(sampler_repeat_penalty) {
    quill_sampler_params p = quill_sampler_defaults();
    p.temperature = 0.0f;
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 2;
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, 4, &s, NULL), QUILL_OK);

    float a[4] = {2.0f, 1.8f, -1.0f, 0.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, a), 0);       /* nothing accepted yet */
    quill_sampler_accept(s, 0);
    float b[4] = {2.0f, 1.8f, -1.0f, 0.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, b), 1);       /* 2.0 / 1.5 = 1.33 < 1.8 */
    CHECK(fabsf(b[0] - 2.0f / 1.5f) < 1e-6f, "penalised logit %g", (double)b[0]);

    /* penalised once however often it occurs: 2.0 / 1.5 > 1.2, but 2.0 / 1.5^2 < 1.2 */
    quill_sampler_accept(s, 0);
    float c[4] = {2.0f, 1.2f, -1.0f, 0.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, c), 0);

    /* negative logits are multiplied: -1.0 * 1.5 = -1.5 < -1.2 */
    quill_sampler_accept(s, 2);
    quill_sampler_accept(s, 2);   /* window now {2, 2}: token 0 has left it */
    float d[4] = {-2.0f, -3.0f, -1.0f, -1.2f};
    CHECK_EQ_INT(quill_sampler_sample(s, d), 3);
    float e[4] = {2.0f, 1.8f, -1.0f, 0.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, e), 0);       /* token 0 no longer penalised */

    quill_sampler_accept(s, -1);      /* out-of-range ids are ignored */
    quill_sampler_accept(s, 4);
    quill_sampler_accept(s, 1 << 30);
    float f[4] = {-2.0f, -3.0f, -1.0f, -1.2f};
    CHECK_EQ_INT(quill_sampler_sample(s, f), 3);
    quill_sampler_free(s);

    /* repeat_last_n 0 or penalty 1 switch it off */
    p.repeat_last_n = 0;
    CHECK_EQ_INT(quill_sampler_new(&p, 4, &s, NULL), QUILL_OK);
    quill_sampler_accept(s, 0);
    float g[4] = {2.0f, 1.8f, -1.0f, 0.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, g), 0);
    quill_sampler_free(s);
    p.repeat_last_n = 64;
    p.repeat_penalty = 1.0f;
    CHECK_EQ_INT(quill_sampler_new(&p, 4, &s, NULL), QUILL_OK);
    quill_sampler_accept(s, 0);
    float h[4] = {2.0f, 1.8f, -1.0f, 0.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, h), 0);
    quill_sampler_free(s);

    /* the penalty shifts the sampled distribution too: token 0's probability drops */
    enum { D = 20000 };
    p = plain_params(1.0f);
    p.repeat_penalty = 2.0f;
    p.seed = 3;
    CHECK_EQ_INT(quill_sampler_new(&p, 2, &s, NULL), QUILL_OK);
    quill_sampler_accept(s, 0);
    float two[2] = {2.0f, 1.0f};   /* penalised: {1, 1} -> 50/50 */
    int counts[2];
    CHECK(count_draws(s, two, 2, D, counts));
    quill_sampler_free(s);
    CHECK(within_binomial(counts[0], D, 0.5), "token 0 drawn %d of %d", counts[0], D);
}

/* OpenAI's penalties: frequency per occurrence in the window, presence once, after the
 * repetition penalty (as llama.cpp's penalties sampler). */
TEST(sampler_presence_frequency_penalty) {
    quill_sampler_params p = quill_sampler_defaults();
    p.temperature = 0.0f;
    p.repeat_last_n = 3;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, 4, &s, NULL), QUILL_OK);
    quill_sampler_accept(s, 0);
    quill_sampler_accept(s, 0);
    quill_sampler_accept(s, 1);
    float a[4] = {3.0f, 2.0f, 1.0f, 0.0f};
    quill_sampler_sample(s, a);
    CHECK(a[0] == 3.0f - (2 * 0.5f + 0.25f), "token 0: %g", (double)a[0]);
    CHECK(a[1] == 2.0f - (1 * 0.5f + 0.25f), "token 1: %g", (double)a[1]);
    CHECK(a[2] == 1.0f && a[3] == 0.0f, "tokens outside the window are untouched: %g %g", (double)a[2],
          (double)a[3]);
    /* a negative penalty encourages repetition; the window forgets: 0 leaves it after three more */
    quill_sampler_accept(s, 2);
    quill_sampler_accept(s, 2);
    quill_sampler_accept(s, 2);
    float b[4] = {3.0f, 2.0f, 2.9f, 0.0f};
    CHECK_EQ_INT(quill_sampler_sample(s, b), 0);   /* 2.9 - 1.75 */
    quill_sampler_free(s);
    p.presence_penalty = INFINITY;
    CHECK(quill_sampler_new(&p, 4, &s, NULL) == QUILL_E_ARG);
}

TEST(sampler_infinite_logits) {
    quill_sampler_params p = plain_params(1.0f);
    quill_sampler *s = NULL;
    CHECK_EQ_INT(quill_sampler_new(&p, 5, &s, NULL), QUILL_OK);
    float a[5] = {0.0f, INFINITY, 1.0f, INFINITY, NAN};
    CHECK_EQ_INT(quill_sampler_sample(s, a), 1);
    float b[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, NAN};
    CHECK_EQ_INT(quill_sampler_sample(s, b), 0);
    for (int i = 0; i < 200; i++) {
        float c[5] = {-INFINITY, NAN, 3.0f, -INFINITY, -INFINITY};   /* one finite token */
        CHECK_EQ_INT(quill_sampler_sample(s, c), 2);
        float d[5] = {-INFINITY, NAN, 3.0f, -INFINITY, 2.5f};
        int32_t t = quill_sampler_sample(s, d);
        CHECK(t == 2 || t == 4, "drew %d", (int)t);
    }
    quill_sampler_free(s);
    /* extreme finite logits and temperatures stay finite */
    p = plain_params(1e-30f);
    CHECK_EQ_INT(quill_sampler_new(&p, 3, &s, NULL), QUILL_OK);
    float e[3] = {-3e38f, 3e38f, 2.9e38f};
    CHECK_EQ_INT(quill_sampler_sample(s, e), 1);
    quill_sampler_free(s);
    p = plain_params(1e30f);
    p.top_p = 0.9f;
    CHECK_EQ_INT(quill_sampler_new(&p, 3, &s, NULL), QUILL_OK);
    float f[3] = {-3e38f, 3e38f, 2.9e38f};
    int32_t t = quill_sampler_sample(s, f);
    CHECK(t >= 0 && t < 3, "drew %d", (int)t);
    quill_sampler_free(s);
}

TEST(sampler_param_validation) {
    struct { const char *name; quill_sampler_params p; int32_t n_vocab; } bad[16];
    int nb = 0;
    quill_sampler_params d = quill_sampler_defaults();
#define BAD(field, value, nv)                        \
    do {                                             \
        bad[nb].name = #field;                       \
        bad[nb].p = d;                               \
        bad[nb].p.field = (value);                   \
        bad[nb].n_vocab = (nv);                      \
        nb++;                                        \
    } while (0)
    BAD(temperature, -0.1f, 10);
    BAD(temperature, NAN, 10);
    BAD(temperature, INFINITY, 10);
    BAD(top_k, -1, 10);
    BAD(top_p, 0.0f, 10);
    BAD(top_p, 1.01f, 10);
    BAD(top_p, NAN, 10);
    BAD(min_p, -0.01f, 10);
    BAD(min_p, 1.5f, 10);
    BAD(repeat_penalty, 0.0f, 10);
    BAD(repeat_penalty, -1.0f, 10);
    BAD(repeat_penalty, INFINITY, 10);
    BAD(repeat_last_n, -1, 10);
#undef BAD
    for (int i = 0; i < nb; i++) {
        static char junk;
        quill_sampler *s = (quill_sampler *)(void *)&junk;   /* must be reset to NULL */
        quill_error err = {0};
        CHECK_EQ_INT(quill_sampler_new(&bad[i].p, bad[i].n_vocab, &s, &err), QUILL_E_ARG);
        CHECK_EQ_INT(err.status, QUILL_E_ARG);
        CHECK(s == NULL, "case %d: out not cleared", i);
        CHECK_STR_CONTAINS(err.message, bad[i].name);
    }
    quill_sampler *s = NULL;
    quill_error err = {0};
    CHECK_EQ_INT(quill_sampler_new(&d, 0, &s, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "n_vocab");
    CHECK_EQ_INT(quill_sampler_new(&d, -5, &s, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "n_vocab must be > 0");
    quill_sampler_params p = d;
    p.top_p = 1.5f;
    CHECK_EQ_INT(quill_sampler_new(&p, 10, &s, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "top_p must be in (0, 1]");
    CHECK_EQ_INT(quill_sampler_new(&d, 10, NULL, &err), QUILL_E_ARG);
    CHECK_EQ_INT(quill_sampler_new(&d, 10, &s, NULL) == QUILL_OK, 1);   /* err may be NULL */
    quill_sampler_free(s);

    /* the edges of each range are valid */
    p = d;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.repeat_penalty = 1e-3f;
    p.repeat_last_n = 0;
    CHECK_EQ_INT(quill_sampler_new(&p, 1, &s, &err), QUILL_OK);
    float one[1] = {0.5f};
    CHECK_EQ_INT(quill_sampler_sample(s, one), 0);
    quill_sampler_free(s);
    p.min_p = 0.0f;
    p.top_k = 1000000;   /* larger than the vocabulary: all of it */
    p.temperature = 1.0f;
    CHECK_EQ_INT(quill_sampler_new(&p, 3, &s, &err), QUILL_OK);
    float three[3] = {0.0f, 0.0f, 0.0f};
    int32_t t = quill_sampler_sample(s, three);
    CHECK(t >= 0 && t < 3, "drew %d", (int)t);
    quill_sampler_free(s);
}
