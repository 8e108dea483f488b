/* What the family tests (test_families.c, test_families_mla.c) share: a small random-weight model
 * of one architecture written by `quill synth`, quantized by the reference's quantizer, with the
 * reference's golden data made on the spot by refdump, and quill's logits and greedy steps over the
 * same prompt. Files live in tmp_dir() as KIND-NAME-QUANT.*, KIND naming the test file's set. */
#ifndef QUILL_TEST_FAMILY_HARNESS_H
#define QUILL_TEST_FAMILY_HARNESS_H

#include "golden.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FAMILY_N_PROMPT 16
#define FAMILY_N_GEN 8
extern const int32_t family_prompt[FAMILY_N_PROMPT];
/* the variants made of each family: 0 f32 (with a trace), 1 q8_0, 2 q4_k_m (when asked for) */
extern const char *const family_quants[3];

/* the prompt as refdump's --tokens argument */
void family_tokens_arg(char *buf, size_t cap);
void family_model_path(const char *kind, const char *name, int quant, char *buf, size_t cap);
void family_ref_prefix(const char *kind, const char *name, int quant, char *buf, size_t cap);
/* Writes the models and refdump's outputs of one family; false (a test failure recorded) when a
 * step fails. `synth` is quill synth's arguments besides --vocab, --type and -o. */
bool family_make(const char *shared, const char *kind, const char *name, const char *synth, bool q4);
void family_remove(const char *kind, const char *name);
bool family_load_ref(const char *prefix, refdump_out *r);
/* The prompt's logits on the fast path or the float64 one, then (fast path, agreed != NULL) up to
 * FAMILY_N_GEN greedy steps that follow the reference's tokens while they agree: how many agreed,
 * and whether the first disagreement is at a near-tie (margin within 10x `tie`). NULL on failure. */
float *family_run_model(const char *model, bool reference, const refdump_out *r, double tie, int *agreed,
                        bool *at_tie);
/* Sequence 0's logits over the prompt (how: 0 in one batch on 2 threads, 1 token by token on 1, 2 in batches
 * of 3 shared with a second sequence); NULL after a failure (recorded). */
float *family_logits_by(const char *model, int how);
/* max |a - b| relative to the largest |b| */
double family_rel_to_max(const float *a, const float *b, size_t n);
double family_max_abs_diff(const float *a, const float *b, size_t n);

/* A copy of `src` without metadata `drop_key` and tensor `drop_tensor` (NULL: none), plus u32
 * metadata `add_key` = add_value (or, with add_sections, rope.dimension_sections-like [a, 0, 0, 0]). */
bool family_variant(const char *src, const char *dst, const char *drop_key, const char *drop_tensor,
                    const char *add_key, uint32_t add_value, bool add_sections);

#endif
