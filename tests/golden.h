/* Reading the reference cases of ../shared/golden for tests. */
#ifndef QUILL_TEST_GOLDEN_H
#define QUILL_TEST_GOLDEN_H

#include "quill.h"

#include <stddef.h>

typedef struct {
    char *name;            /* "s260-once" */
    char *model_path;      /* ../shared/models/... */
    char *prompt;
    bool add_bos, parse_special;
    int32_t *prompt_tokens;
    size_t n_prompt;
    int32_t *greedy_tokens;
    double *greedy_margin;
    size_t n_greedy;
    int64_t n_vocab;
    float *logits;         /* [n_prompt][n_vocab] from the reference implementation */
    float *exact;          /* [n_prompt][n_vocab] float64 truth rounded to f32 */
    char *trace_path;      /* NULL when the case has no trace */
} golden_case;

/* Names of all cases (sorted), NULL-terminated; free with golden_free_names. Fewer than 20 (the
 * cases the reference data holds) records a test failure: a loop over them must not pass empty. */
char **golden_case_names(const char *shared, size_t *n);
void golden_free_names(char **names);
/* Loads one case; false (and a test failure recorded) when a file is missing or malformed. */
bool golden_load(const char *shared, const char *name, golden_case *gc);
void golden_free(golden_case *gc);

/* rms(a - b) / rms(b) over n floats. */
double rms_rel_error(const float *a, const float *b, size_t n);
/* max |a - b| / max |b|. */
double max_rel_error(const float *a, const float *b, size_t n);

/* refdump's OUTPREFIX.json and OUTPREFIX.logits.f32 for a prompt of n_prompt tokens: its logits
 * [n_prompt][n_vocab] and the first REFDUMP_MAX_GEN greedy tokens with their margins. A missing or
 * malformed file records a test failure and returns false; free logits. */
#define REFDUMP_MAX_GEN 16
typedef struct {
    float *logits;
    int64_t n_vocab;
    int32_t greedy[REFDUMP_MAX_GEN];
    double margin[REFDUMP_MAX_GEN];
    int n_greedy;
} refdump_out;
bool refdump_load(const char *prefix, int n_prompt, refdump_out *r);

/* Variants of a model file: adds every metadata key of g to w but `skip_key` (NULL: all);
 * false when the writer refuses one. */
bool copy_metadata(quill_gguf_writer *w, const quill_gguf *g, const char *skip_key);
/* `shared`/models/NAME opened into *g, and a new writer holding all its metadata; NULL (a test
 * failure recorded, nothing left open) when the file cannot be read. */
quill_gguf_writer *writer_from_model(const char *shared, const char *name, quill_gguf **g);

#endif
