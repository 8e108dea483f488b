/* Which kernel set a context computes with: the fastest the CPU offers, or the one QUILL_ISA names;
 * a name that is no set, or a set this CPU lacks, fails quill_context_new with a message naming
 * the sets it offers (it used to fall back silently, so a test forcing a set could test another). */
#include "test.h"

#include "kernels/kernels.h"
#include "quill_model.h"

#include <stdlib.h>
#include <string.h>

/* Sets QUILL_ISA (or unsets it, for NULL) and makes a context for stories260K. */
static quill_status context_with(const char *shared, const char *isa, const char **kernels, quill_error *err) {
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_model *m;
    quill_status st = quill_model_load(path, &m, err);
    free(path);
    if (st != QUILL_OK) return st;
    if (isa) setenv("QUILL_ISA", isa, 1);
    else unsetenv("QUILL_ISA");
    quill_context_params p = {.n_ctx = 32, .n_threads = 1};
    quill_context *c = (quill_context *)1; /* must come back NULL on failure */
    st = quill_context_new(m, &p, &c, err);
    *kernels = st == QUILL_OK ? quill_context_kernels(c) : NULL;
    if (st != QUILL_OK && c != NULL) test_fail(__FILE__, __LINE__, "a failed quill_context_new left *out set");
    if (st == QUILL_OK) quill_context_free(c);
    quill_model_free(m);
    return st;
}

TEST(kernels_choice_by_quill_isa) {
    REQUIRE_SHARED(shared);
    const char *saved = getenv("QUILL_ISA");
    char *restore = saved ? strdup(saved) : NULL;
    const char *sets[] = {"amx", "vnni", "avx512", "avxvnni", "avx2", "i8mm", "dotprod", "scalar"};
    const char *lacking = NULL, *kernels;
    quill_error err = {0};
    bool ok = true;
    /* the default: the fastest set, which is the first of the list this CPU offers */
    ok = ok && context_with(shared, NULL, &kernels, &err) == QUILL_OK;
    if (ok && strcmp(kernels, quill_kernels_best()->isa) != 0)
        test_fail(__FILE__, __LINE__, "default context computes with %s, not the fastest set %s", kernels,
                  quill_kernels_best()->isa), ok = false;
    for (size_t i = 0; ok && i < sizeof sets / sizeof sets[0]; i++) {
        const quill_kernels *k = quill_kernels_for(sets[i]);
        if (!k) {
            lacking = lacking ? lacking : sets[i];
            continue;
        }
        quill_status st = context_with(shared, sets[i], &kernels, &err);
        if (st != QUILL_OK || strcmp(kernels, sets[i]) != 0)
            test_fail(__FILE__, __LINE__, "QUILL_ISA=%s: %s", sets[i], st != QUILL_OK ? err.message : kernels), ok = false;
    }
    /* unknown names, and a known set this CPU lacks, are errors that say what the CPU offers */
    const char *bogus[] = {"avx1024", "AVX2", " scalar", "scalar,avx2"};
    for (size_t i = 0; ok && i < sizeof bogus / sizeof bogus[0]; i++) {
        quill_status st = context_with(shared, bogus[i], &kernels, &err);
        if (st != QUILL_E_ARG || !strstr(err.message, "no such kernel set") || !strstr(err.message, "this CPU offers") ||
            !strstr(err.message, "scalar") || !strstr(err.message, "unset QUILL_ISA"))
            test_fail(__FILE__, __LINE__, "QUILL_ISA='%s': status %d, \"%s\"", bogus[i], st, st ? err.message : ""), ok = false;
    }
    if (ok && lacking) {
        quill_status st = context_with(shared, lacking, &kernels, &err);
        if (st != QUILL_E_ARG || !strstr(err.message, "this CPU lacks that kernel set") ||
            !strstr(err.message, quill_kernels_best()->isa))
            test_fail(__FILE__, __LINE__, "QUILL_ISA=%s (not offered): status %d, \"%s\"", lacking, st, st ? err.message : "");
    }
    /* an empty QUILL_ISA is no choice: the fastest */
    if (ok && (context_with(shared, "", &kernels, &err) != QUILL_OK || strcmp(kernels, quill_kernels_best()->isa) != 0))
        test_fail(__FILE__, __LINE__, "QUILL_ISA='' must choose the fastest set");
    if (restore) setenv("QUILL_ISA", restore, 1);
    else unsetenv("QUILL_ISA");
    free(restore);
    if (ok && !lacking) test_skip("this CPU offers every kernel set: the error for a lacking one went unchecked");
}

/* The error reads the same from the kernels alone, and names the sets in speed order. */
TEST(kernels_choice_error_lists_offered_sets) {
    const char *saved = getenv("QUILL_ISA");
    char *restore = saved ? strdup(saved) : NULL;
    setenv("QUILL_ISA", "nonsense", 1);
    const quill_kernels *k = (const quill_kernels *)1;
    quill_error err = {0};
    quill_status st = quill_kernels_choose(&k, &err);
    if (restore) setenv("QUILL_ISA", restore, 1);
    else unsetenv("QUILL_ISA");
    free(restore);
    CHECK_EQ_INT(st, QUILL_E_ARG);
    CHECK(k == NULL, "no kernels on failure");
    CHECK_STR_CONTAINS(err.message, "QUILL_ISA=nonsense");
    char offered[64] = "";
    const char *sets[] = {"amx", "vnni", "avx512", "avxvnni", "avx2", "i8mm", "dotprod", "scalar"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (quill_kernels_for(sets[i]))
            snprintf(offered + strlen(offered), sizeof offered - strlen(offered), "%s%s", *offered ? ", " : "", sets[i]);
    char want[96];
    snprintf(want, sizeof want, "this CPU offers %s (", offered);
    CHECK_STR_CONTAINS(err.message, want);
}
