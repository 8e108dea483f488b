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

/* What a family's F32 file must meet (family_check_f32). */
typedef struct {
    bool ref_rounds;     /* the reference's logits are not the measure (a GELU by table): float64's are */
    double float64_tol;  /* the float64 path against the reference's logits (0: 1e-5) */
    double trace_tol;    /* each traced tensor against the reference's (0: 1e-4; < 0: no trace check) */
    const char *trace_names[6]; /* tensors the trace must share with the reference's, by its names */
    size_t trace_min;    /* and at least this many in common (0: 12) */
} family_f32_rules;

/* The F32 file of family `name` (made by family_make): the fast path within 1e-5 of the reference's
 * logits (relative to the largest) or of float64's, the float64 path within float64_tol of the
 * reference's, greedy tokens as the reference's up to a near-tie, the trace by the reference's
 * names, and `quill verify`. Failures are recorded. */
void family_check_f32(const char *kind, const char *name, const family_f32_rules *rules);

/* A quantized file of family `name`: quill at least 2x closer to float64 truth on the same weights
 * than the reference implementation, by the rms error over all the prompt's logits or (median_position,
 * for routed layers) at the typical position: at a router's near-tie either engine's 8-bit
 * activations may pick another expert than float64 does, and that position's error is then the
 * other expert's output; with `greedy`, greedy tokens as the reference's up to a near-tie. */
void family_check_quantized(const char *kind, const char *name, int quant, bool median_position, bool greedy);
/* The median over the prompt's positions of each position's rms error relative to truth. */
double family_median_position_error(const float *a, const float *truth, int64_t n_vocab);

/* A bad file of one family: its small model less a metadata key or a tensor, or with a u32 key
 * added (with add_sections: rope.dimension_sections-like [a, 0, 0, 0]), and what its refusal says. */
typedef struct {
    const char *arch, *drop_key, *drop_tensor, *add_key;
    uint32_t add_value;
    const char *message;
    bool add_sections;
} family_refusal;
/* Writes the model `quill synth --arch ARCH <synth>` (f32, the shared vocabulary), checks that it
 * loads, and that its variant by `r` is refused naming r->message. Failures are recorded; `i` numbers
 * the case in them. */
void family_check_refusal(const char *shared, const char *kind, const family_refusal *r, size_t i, const char *synth);

/* A copy of `src` without metadata `drop_key` and tensor `drop_tensor` (NULL: none), plus u32
 * metadata `add_key` = add_value (or, with add_sections, rope.dimension_sections-like [a, 0, 0, 0]). */
bool family_variant(const char *src, const char *dst, const char *drop_key, const char *drop_tensor,
                    const char *add_key, uint32_t add_value, bool add_sections);

#endif
