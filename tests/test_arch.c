/* Every architecture against the reference implementation: small random-weight models written by
 * `quill synth --arch`, golden data made on the spot by the reference's refdump (and its quantizer
 * for a Q4_K_M variant), compared by logits, greedy tokens, traces and distance from float64
 * truth. */
#include "golden.h"
#include "gguf_build.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *name;
    const char *synth;     /* quill synth arguments besides --vocab, --type and -o */
    const char *vocab;     /* under ../shared */
    /* The reference computes GELU through a table of f16 values (input and output rounded to
     * f16): its gemma logits sit ~4e-4 from exact math, quill's ~4e-7 (its ffn_gate and ffn_up
     * traces agree to 3e-7, its ffn_out moves by 4e-4). Those are compared with float64 truth. */
    bool gelu_table;
} arch_case;

#define SHAPE "--embd 256 --heads 4 --kv-heads 2 --ff 512 --seed 7"
static const arch_case cases[] = {
    {"llama", "--arch llama --layers 2 " SHAPE, "models/stories260K.gguf", false},
    {"llama3", "--arch llama3 --layers 2 " SHAPE, "models/stories260K.gguf", false},
    {"mistral", "--arch mistral --layers 2 " SHAPE, "models/stories260K.gguf", false},
    {"qwen2", "--arch qwen2 --layers 2 " SHAPE, "models/stories260K.gguf", false},
    {"qwen3", "--arch qwen3 --layers 2 " SHAPE, "models/stories260K.gguf", false},
    /* a window of 5 positions, so that the 16-token prompt exercises it; soft-capping values
     * that bend these small scores and logits */
    {"gemma2", "--arch gemma2 --layers 2 --window 5 --softcap 0.5,0.5 " SHAPE, "models/stories260K.gguf", true},
    /* six layers: five with the window and base 10000, then a global one */
    {"gemma3", "--arch gemma3 --layers 6 --window 5 " SHAPE, "models/stories260K.gguf", true},
    /* the file's own pattern (layers 0 and 2 slide, 1 and 3 are global) and local RoPE base */
    {"gemma3-pattern", "--arch gemma3 --layers 4 --window 5 --swa-pattern 2 --rope-base-swa 300 " SHAPE,
     "models/stories260K.gguf", true},
    /* Gemma 2's sliding layers with their own base */
    {"gemma2-base", "--arch gemma2 --layers 2 --window 5 --rope-base-swa 50 " SHAPE, "models/stories260K.gguf", true},
    /* byte-level BPE vocabularies: Llama 3's 128256 tokens and Qwen 2.5's 151669 (small layers, so
     * that the embeddings stay ~35 MB) */
    {"llama3-bpe", "--arch llama3 --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128 --seed 7",
     "tokenizer/ggml-vocab-llama-bpe.gguf", false},
    {"qwen2-bpe", "--arch qwen2 --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128 --seed 7",
     "tokenizer/ggml-vocab-qwen2.gguf", false},
    /* mixture of experts: 8 experts, 2 chosen per token (Qwen3-MoE's router, Mixtral's) */
    {"qwen3moe", "--arch qwen3moe --layers 2 --experts 8 --experts-used 2 --expert-ff 128 " SHAPE,
     "models/stories260K.gguf", false},
    {"llama-moe", "--arch llama-moe --layers 2 --experts 8 --experts-used 2 --embd 256 --heads 4 --kv-heads 2 --ff 128 "
     "--seed 7", "models/stories260K.gguf", false},
    /* the top 2 of 8 not renormalised, and a shared expert 256 wide */
    {"qwen2moe", "--arch qwen2moe --layers 2 --experts 8 --experts-used 2 --expert-ff 64 --embd 256 --heads 4 "
     "--kv-heads 2 --ff 256 --seed 7", "models/stories260K.gguf", false},
    /* gpt-oss: biases, sinks, YaRN, a window of 5 on layers 0 and 2, top-2 router logits then a
     * softmax, the clamped SwiGLU */
    {"gpt-oss", "--arch gpt-oss --layers 3 --experts 8 --experts-used 2 --window 5 --embd 256 --heads 4 --kv-heads 2 "
     "--ff 128 --seed 7", "models/stories260K.gguf", false},
    /* the reference insists on Phi-3's own special tokens */
    {"phi3", "--arch phi3 --layers 2 --embd 128 --heads 4 --kv-heads 2 --ff 256 --seed 7",
     "tokenizer/ggml-vocab-phi-3.gguf", false},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static const int32_t prompt[] = {1, 20, 300, 45, 67, 89, 100, 200, 311, 400, 12, 13, 14, 15, 16, 17};
#define N_PROMPT ((int)(sizeof prompt / sizeof prompt[0]))
#define N_GEN 8

/* The files of one case, made once per run of the suite. */
typedef struct {
    char f32[512], q4[512];          /* models */
    char ref_f32[512], ref_q4[512];  /* refdump output prefixes */
} case_files;

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static bool make_case(const char *shared, const arch_case *ac, case_files *f) {
    const char *dir = tmp_dir();
    snprintf(f->f32, sizeof f->f32, "%s/arch-%s-f32.gguf", dir, ac->name);
    snprintf(f->q4, sizeof f->q4, "%s/arch-%s-q4_k_m.gguf", dir, ac->name);
    snprintf(f->ref_f32, sizeof f->ref_f32, "%s/arch-%s-f32.ref", dir, ac->name);
    snprintf(f->ref_q4, sizeof f->ref_q4, "%s/arch-%s-q4_k_m.ref", dir, ac->name);
    char done[600];
    snprintf(done, sizeof done, "%s.json", f->ref_q4);
    if (exists(done)) return true;
    char tokens[256] = "", cmd[4096], *out = NULL;
    for (int i = 0; i < N_PROMPT; i++)
        snprintf(tokens + strlen(tokens), sizeof tokens - strlen(tokens), "%s%d", i ? "," : "", prompt[i]);
    /* (passive OpenMP threads: spinning ones crawl when the machine has more work than cores) */
    snprintf(cmd, sizeof cmd,
             "(export OMP_WAIT_POLICY=PASSIVE; %s synth %s --vocab %s/%s --type f32 -o %s && "
             "%s/ref/bin/llama-quantize %s %s Q4_K_M && %s/ref/bin/refdump %s %s %d - - 1 --tokens %s && "
             "%s/ref/bin/refdump %s %s %d - - 0 --tokens %s)",
             quill_bin(), ac->synth, shared, ac->vocab, f->f32, shared, f->f32, f->q4, shared, f->f32, f->ref_f32, N_GEN,
             tokens, shared, f->q4, f->ref_q4, N_GEN, tokens);
    int rc = run_cmd(cmd, &out, true);
    if (rc != 0) test_fail(__FILE__, __LINE__, "%s: making the case failed (exit %d): %.2000s", ac->name, rc, out);
    free(out);
    return rc == 0;
}

/* The generated models and golden files (~250 MB) go once the file's last test has used them. */
static void remove_cases(void) {
    for (size_t i = 0; i < N_CASES; i++) {
        char path[700];
        const char *suffixes[] = {"-f32.gguf", "-q4_k_m.gguf", "-f32.ref.json", "-f32.ref.logits.f32",
                                  "-f32.ref.trace.bin", "-q4_k_m.ref.json", "-q4_k_m.ref.logits.f32", ".trace.gguf"};
        for (size_t k = 0; k < sizeof suffixes / sizeof suffixes[0]; k++) {
            snprintf(path, sizeof path, "%s/arch-%s%s", tmp_dir(), cases[i].name, suffixes[k]);
            remove(path);
        }
    }
}

typedef refdump_out ref_out;

static bool load_ref(const char *prefix, ref_out *r) { return refdump_load(prefix, N_PROMPT, r); }

/* All prompt logits of `model` on the fast path (reference = false) or the float64 one; NULL
 * after recording a failure. */
static float *eval_logits(const char *model, bool reference, int threads, int64_t *n_vocab) {
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (quill_model_load(model, &m, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    quill_context_params p = {.n_ctx = 64, .n_threads = threads, .reference = reference};
    if (quill_context_new(m, &p, &c, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        quill_model_free(m);
        return NULL;
    }
    *n_vocab = quill_model_hparams(m)->n_vocab;
    float *logits = malloc((size_t)N_PROMPT * (size_t)*n_vocab * sizeof *logits);
    if (!logits || quill_eval(c, prompt, N_PROMPT, logits, true, &err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", model, logits ? err.message : "out of memory");
        free(logits);
        logits = NULL;
    }
    quill_context_free(c);
    quill_model_free(m);
    return logits;
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* max |a - b| relative to the largest |b| */
static double rel_to_max(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) if (!(fabs((double)a[i] - b[i]) <= m)) m = fabs((double)a[i] - b[i]);
    return m / max_abs(b, n);
}

TEST(arch_f32_logits_match_the_reference) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_CASES; i++) {
        const arch_case *ac = &cases[i];
        case_files f;
        ref_out r;
        if (!make_case(shared, ac, &f) || !load_ref(f.ref_f32, &r)) return;
        int64_t nv;
        float *fast = eval_logits(f.f32, false, 2, &nv), *exact = eval_logits(f.f32, true, 2, &nv);
        const size_t n = (size_t)N_PROMPT * (size_t)nv;
        if (fast && exact && nv == r.n_vocab) {
            const double vs_ref = rel_to_max(fast, r.logits, n), vs_exact = rel_to_max(fast, exact, n);
            const double ref_vs_exact = rel_to_max(r.logits, exact, n);
            printf("    %-10s fast vs reference impl %.2g, fast vs float64 %.2g, reference impl vs float64 %.2g\n",
                   ac->name, vs_ref, vs_exact, ref_vs_exact);
            if (ac->gelu_table) {
                CHECK(vs_exact < 1e-5, "%s: fast path %.3g from float64", ac->name, vs_exact);
                CHECK(ref_vs_exact < 3e-3, "%s: the reference implementation is %.3g from float64", ac->name,
                      ref_vs_exact);
            } else {
                CHECK(vs_ref < 1e-4, "%s: logits %.3g from the reference implementation's", ac->name, vs_ref);
                /* the float64 path against the reference implementation's F32 arithmetic */
                CHECK(ref_vs_exact < 2e-6, "%s: float64 path %.3g from the reference implementation", ac->name,
                      ref_vs_exact);
            }
        } else {
            CHECK(nv == r.n_vocab, "%s: %lld tokens, the reference %lld", ac->name, (long long)nv, (long long)r.n_vocab);
        }
        free(fast);
        free(exact);
        free(r.logits);
    }
}

/* Greedy tokens after the prompt equal the reference's; they may part only at a step whose margin
 * (top-1 minus top-2 logit) is within 10x the two implementations' largest logit difference on
 * the prompt, where either token is right. */
TEST(arch_greedy_tokens_match_the_reference) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_CASES; i++) {
        const arch_case *ac = &cases[i];
        case_files f;
        ref_out r;
        if (!make_case(shared, ac, &f) || !load_ref(f.ref_f32, &r)) return;
        quill_model *m;
        quill_context *c;
        quill_error err;
        CHECK(quill_model_load(f.f32, &m, &err) == QUILL_OK, "%s", err.message);
        quill_context_params p = {.n_ctx = 64, .n_threads = 2};
        CHECK(quill_context_new(m, &p, &c, &err) == QUILL_OK, "%s", err.message);
        const int64_t nv = r.n_vocab;
        float *logits = malloc((size_t)N_PROMPT * (size_t)nv * sizeof *logits);
        CHECK(logits && quill_eval(c, prompt, N_PROMPT, logits, true, &err) == QUILL_OK, "%s", err.message);
        double diff = 0;
        for (size_t k = 0; k < (size_t)N_PROMPT * (size_t)nv; k++)
            if (fabs((double)logits[k] - r.logits[k]) > diff) diff = fabs((double)logits[k] - r.logits[k]);
        const float *last = logits + (size_t)(N_PROMPT - 1) * (size_t)nv;
        int steps = 0;
        bool diverged_at_tie = false, wrong = false;
        quill_status s = QUILL_OK;
        for (int k = 0; k < r.n_greedy && s == QUILL_OK; k++) {
            int32_t best = 0;
            for (int64_t v = 1; v < nv; v++)
                if (last[v] > last[best]) best = (int32_t)v;
            if (best != r.greedy[k]) {
                diverged_at_tie = r.margin[k] < 10 * diff;
                wrong = !diverged_at_tie;
                break;
            }
            steps++;
            s = quill_eval(c, &best, 1, logits, false, &err);
            last = logits;
        }
        printf("    %-10s %d of %d greedy tokens equal%s\n", ac->name, steps, r.n_greedy,
               diverged_at_tie ? ", then a near-tie" : "");
        free(logits);
        free(r.logits);
        quill_context_free(c);
        quill_model_free(m);
        CHECK(s == QUILL_OK, "%s: %s", ac->name, err.message);
        CHECK(!wrong, "%s: greedy token %d differs from the reference's (margin %.3g)", ac->name, steps,
              r.margin[steps]);
        CHECK(steps >= 1, "%s: no greedy token to compare", ac->name);
    }
}

/* On the Q4_K_M variant, quill's logits are at least 2x closer to float64 truth (its --reference
 * path on the same weights: the dequantizers are bit-exact) than the reference implementation's,
 * and the same bits on one thread and on two. */
TEST(arch_quantized_closer_to_truth_and_thread_invariant) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_CASES; i++) {
        const arch_case *ac = &cases[i];
        case_files f;
        ref_out r;
        if (!make_case(shared, ac, &f) || !load_ref(f.ref_q4, &r)) return;
        int64_t nv;
        float *fast = eval_logits(f.q4, false, 2, &nv), *one = eval_logits(f.q4, false, 1, &nv);
        float *exact = eval_logits(f.q4, true, 2, &nv);
        const size_t n = (size_t)N_PROMPT * (size_t)nv;
        if (fast && one && exact && nv == r.n_vocab) {
            const double ours = rms_rel_error(fast, exact, n), theirs = rms_rel_error(r.logits, exact, n);
            printf("    %-10s q4_k_m rms error vs float64: quill %.3g, reference impl %.3g (%.1fx)\n", ac->name, ours,
                   theirs, theirs / ours);
            CHECK(2 * ours <= theirs, "%s: quill %.3g is not 2x closer to truth than the reference's %.3g", ac->name,
                  ours, theirs);
            CHECK(!memcmp(fast, one, n * sizeof *fast), "%s: -t 1 and -t 2 differ", ac->name);
        } else {
            CHECK(nv == r.n_vocab, "%s: vocabulary size differs", ac->name);
        }
        free(fast);
        free(one);
        free(exact);
        free(r.logits);
    }
}

/* The fast path's trace against refdump's trace.bin, read directly by quill_trace_compare. */
TEST(arch_traces_match_the_reference) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_CASES; i++) {
        const arch_case *ac = &cases[i];
        case_files f;
        if (!make_case(shared, ac, &f)) return;
        char trace[600], ref[600], cmd[2048], tokens[256] = "", *out = NULL;
        for (int k = 0; k < N_PROMPT; k++)
            snprintf(tokens + strlen(tokens), sizeof tokens - strlen(tokens), "%s%d", k ? "," : "", prompt[k]);
        snprintf(trace, sizeof trace, "%s/arch-%s.trace.gguf", tmp_dir(), ac->name);
        snprintf(ref, sizeof ref, "%s.trace.bin", f.ref_f32);
        snprintf(cmd, sizeof cmd, "%s run -m %s --tokens %s -n 0 -t 2 --trace %s", quill_bin(), f.f32, tokens, trace);
        int rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "%s: exit %d: %s", ac->name, rc, out);
        free(out);
        quill_trace_diff *d;
        size_t nd;
        int64_t bad;
        quill_error err;
        const double tol = ac->gelu_table ? 1e-2 : 1e-4;
        CHECK(quill_trace_compare(trace, ref, tol, &d, &nd, &bad, &err) == QUILL_OK, "%s", err.message);
        double worst = 0;
        for (size_t k = 0; k < nd; k++) if (d[k].rel > worst) worst = d[k].rel;
        printf("    %-10s %zu tensors compared, worst rel %.3g\n", ac->name, nd, worst);
        const char *first = bad >= 0 ? d[bad].name : "";
        const double first_rel = bad >= 0 ? d[bad].rel : 0;
        bool has_qcur = false;
        for (size_t k = 0; k < nd; k++) has_qcur |= !strcmp(d[k].name, "Qcur-0");
        free(d);
        CHECK(nd >= 2 * 7 + 1 && has_qcur, "%s: only %zu tensors in common", ac->name, nd);
        CHECK(bad < 0, "%s: %s beyond tolerance (rel %.3g)", ac->name, first, first_rel);
    }
}

/* Families quill does not implement (among them Mamba-1, Jamba, RWKV-7 and Gemma 4's drafter) are
 * refused by name. */
TEST(arch_refusals_name_the_architecture) {
    const char *names[] = {"jamba", "mamba", "rwkv7", "gemma3n", "gemma4-assistant"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/refused-%s.gguf", tmp_dir(), names[i]);
        quill_gguf_writer *w = quill_gguf_writer_new();
        quill_error err;
        quill_gguf_writer_add_str(w, "general.architecture", names[i], strlen(names[i]));
        CHECK(quill_gguf_writer_write(w, path, &err) == QUILL_OK, "%s", err.message);
        quill_gguf_writer_free(w);
        quill_model *m;
        CHECK_EQ_INT(quill_model_load(path, &m, &err), QUILL_E_UNSUPPORTED);
        CHECK_STR_CONTAINS(err.message, names[i]);
        CHECK_STR_CONTAINS(err.message, "qwen3");
    }
}

/* A refdump trace that ends inside a record is an error naming the byte, not a crash. */
TEST(arch_trace_bin_truncated_is_an_error) {
    char good[512], cut[512];
    snprintf(good, sizeof good, "%s/t.trace.bin", tmp_dir());
    snprintf(cut, sizeof cut, "%s/cut.trace.bin", tmp_dir());
    FILE *fp = fopen(good, "wb"), *fc = fopen(cut, "wb");
    CHECK(fp && fc, "cannot write the trace files");
    const uint32_t len = 7;
    const int64_t ne[4] = {3, 1, 1, 1};
    const float v[3] = {1, 2, 3};
    fwrite(&len, 4, 1, fp), fwrite("l_out-0", 1, 7, fp), fwrite(ne, 8, 4, fp), fwrite(v, 4, 3, fp);
    fwrite(&len, 4, 1, fc), fwrite("l_out-0", 1, 7, fc), fwrite(ne, 8, 4, fc), fwrite(v, 4, 2, fc);
    fclose(fp);
    fclose(fc);
    quill_trace_diff *d;
    size_t nd;
    int64_t bad;
    quill_error err;
    CHECK(quill_trace_compare(good, good, 0, &d, &nd, &bad, &err) == QUILL_OK, "%s", err.message);
    CHECK(nd == 1 && bad < 0 && d[0].max_abs == 0, "a trace differs from itself");
    free(d);
    CHECK_EQ_INT(quill_trace_compare(good, cut, 0, &d, &nd, &bad, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "truncated trace record at byte 0");
}

/* Copies the F32 model at src to dst with the tensors named in `names` multiplied by `factor`. */
static bool copy_scaling(const char *src, const char *dst, const char *const *names, size_t n_names, float factor) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err)) return false;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = w != NULL;
    for (uint64_t i = 0; ok && i < quill_gguf_n_kv(g); i++)
        ok = quill_gguf_writer_add_value(w, quill_gguf_kv_at(g, i)->key, &quill_gguf_kv_at(g, i)->value) == QUILL_OK;
    float *scaled[4] = {0};
    size_t n_scaled = 0;
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        const void *data = t->data;
        for (size_t k = 0; k < n_names && n_scaled < 4; k++)
            if (!strcmp(t->name, names[k]) && t->type == QUILL_TYPE_F32) {
                float *v = malloc((size_t)t->n_elements * sizeof *v);
                if (!(ok = v != NULL)) break;
                memcpy(v, t->data, (size_t)t->n_elements * sizeof *v);
                for (int64_t e = 0; e < t->n_elements; e++) v[e] *= factor;
                data = scaled[n_scaled++] = v;
            }
        ok = ok && quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data) == QUILL_OK;
    }
    ok = ok && n_scaled == n_names && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    for (size_t k = 0; k < n_scaled; k++) free(scaled[k]);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

/* quill verify passes a sound model and names the layer of a fault (the file's last test: it
 * removes the generated models). A file's weights are the same
 * for both passes, so the fault is one the f32 arithmetic cannot carry and float64 can: layer 1's
 * attn_q and attn_k scaled by 1e20, whose scores (~1e40) overflow f32 in the fast path only. */
TEST(arch_verify_names_an_injected_fault) {
    REQUIRE_SHARED(shared);
    case_files f;
    if (!make_case(shared, &cases[0], &f)) return;
    char faulty[512], cmd[2048], *out = NULL;
    snprintf(faulty, sizeof faulty, "%s/verify-faulty.gguf", tmp_dir());
    const char *names[] = {"blk.1.attn_q.weight", "blk.1.attn_k.weight"};
    CHECK(copy_scaling(f.f32, faulty, names, 2, 1e20f), "cannot write %s", faulty);
    snprintf(cmd, sizeof cmd, "%s verify -m %s --tokens 1,20,300,45,67 -t 2", quill_bin(), f.f32);
    int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "sound model: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "ok: 26 tensors within 0.01");
    free(out);
    snprintf(cmd, sizeof cmd, "%s verify -m %s --tokens 1,20,300,45,67 -t 2", quill_bin(), faulty);
    rc = run_cmd(cmd, &out, true);
    remove(faulty);
    CHECK(rc == 1, "faulty model: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "FAIL: kqv_out-1 (layer 1) is the first tensor beyond 0.01");
    free(out);
    remove_cases();
}
