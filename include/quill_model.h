/* libquill: tokenizer, model, inference context, sampling. Included by quill.h. */
#ifndef QUILL_MODEL_H
#define QUILL_MODEL_H

#include "quill.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- tokenizer */

/* Tokenizer read from tokenizer.ggml.* metadata: SentencePiece ("llama") or byte-level BPE ("gpt2",
 * with the pre-tokenizer tokenizer.ggml.pre names). */
typedef struct quill_tokenizer quill_tokenizer;

/* Token types stored in tokenizer.ggml.token_type. */
enum {
    QUILL_TOKEN_UNDEFINED = 0, QUILL_TOKEN_NORMAL = 1, QUILL_TOKEN_UNKNOWN = 2,
    QUILL_TOKEN_CONTROL = 3, QUILL_TOKEN_USER_DEFINED = 4, QUILL_TOKEN_UNUSED = 5,
    QUILL_TOKEN_BYTE = 6
};

QUILL_API quill_status quill_tokenizer_load(const quill_gguf *g, quill_tokenizer **out, quill_error *err);
QUILL_API void quill_tokenizer_free(quill_tokenizer *t);

QUILL_API int32_t quill_tokenizer_n_vocab(const quill_tokenizer *t);
QUILL_API int32_t quill_tokenizer_bos(const quill_tokenizer *t);   /* -1 when the model has none */
QUILL_API int32_t quill_tokenizer_eos(const quill_tokenizer *t);
QUILL_API bool quill_tokenizer_add_bos(const quill_tokenizer *t);
QUILL_API bool quill_tokenizer_add_eos(const quill_tokenizer *t);
/* End of generation: EOS, EOT and similar control tokens. */
QUILL_API bool quill_tokenizer_is_eog(const quill_tokenizer *t, int32_t id);
QUILL_API int quill_tokenizer_token_type(const quill_tokenizer *t, int32_t id);
/* The vocabulary entry as stored (e.g. "▁the", "<0x0A>", "</s>"); NULL for an invalid id. */
QUILL_API const char *quill_tokenizer_piece(const quill_tokenizer *t, int32_t id);

/* Text to ids. `add_special` adds BOS/EOS as the model's add_bos_token/add_eos_token ask;
 * `parse_special` turns control-token text such as "</s>" into its id. *tokens is malloc'd. */
QUILL_API quill_status quill_tokenize(const quill_tokenizer *t, const char *text, size_t len, bool add_special,
                                      bool parse_special, int32_t **tokens, size_t *n_tokens, quill_error *err);

/* The bytes a token stands for ("▁" becomes a space, <0xNN> a byte; control tokens give nothing
 * unless `render_special`). Returns the byte count, which may exceed `cap` (nothing is written
 * past it); -1 for an invalid id. */
QUILL_API int quill_token_to_bytes(const quill_tokenizer *t, int32_t id, bool render_special, char *buf, size_t cap);

/* Streaming detokenizer: bytes of a UTF-8 character split across tokens are held back until the
 * character is complete, and the space the tokenizer put in front of the first word is removed. */
typedef struct quill_detokenizer {
    const quill_tokenizer *tok;
    bool render_special;
    bool at_start;          /* private: next piece is the first of the text */
    unsigned char pending[8];
    int n_pending;
} quill_detokenizer;

/* `text_start`: the first token pushed begins the text, so the space the tokenizer put in front
 * of the first word is removed. A continuation of a prompt is not the start of the text: its
 * leading space is real and stays (pass false). */
QUILL_API void quill_detokenizer_init(quill_detokenizer *d, const quill_tokenizer *t, bool render_special, bool text_start);
/* Feeds one token; writes the bytes now complete to `out` (cap >= 256 is always enough) and
 * returns their count. Each byte of an invalid UTF-8 sequence comes out as U+FFFD, as the
 * reference renders text. */
QUILL_API size_t quill_detokenizer_push(quill_detokenizer *d, int32_t id, char *out, size_t cap);
/* Emits whatever is still held (each byte of an incomplete character becomes U+FFFD). */
QUILL_API size_t quill_detokenizer_flush(quill_detokenizer *d, char *out, size_t cap);

/* ---------------------------------------------------------------- model */

/* Hyperparameters, from the architecture's <arch>.* metadata with the reference's defaults where
 * absent. */
typedef struct quill_hparams {
    const char *arch;       /* general.architecture: "llama", "qwen2", ... (static storage) */
    int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    int64_t n_rot;          /* rope.dimension_count: how many dims of each head are rotated */
    double rope_base;       /* rope.freq_base */
    double rope_freq_scale; /* 1 / rope.scaling.factor for linear scaling (positions are multiplied
                             * by it: a model tuned for a longer context); 1 without scaling */
    double rms_eps;         /* attention.layer_norm_rms_epsilon */
    bool tied_output;       /* no output.weight: the logits reuse token_embd.weight */
} quill_hparams;

/* Reads and checks the hyperparameters of a model GGUF (refuses architectures quill does not run). */
QUILL_API quill_status quill_hparams_from_gguf(const quill_gguf *g, quill_hparams *hp, quill_error *err);

typedef struct quill_model quill_model;

/* Maps the file, checks every tensor's presence, type and shape, and loads the tokenizer. The
 * weights stay in the mapping in their stored type. */
QUILL_API quill_status quill_model_load(const char *path, quill_model **out, quill_error *err);
QUILL_API void quill_model_free(quill_model *m);
QUILL_API const quill_hparams *quill_model_hparams(const quill_model *m);
QUILL_API const quill_tokenizer *quill_model_tokenizer(const quill_model *m);
QUILL_API const quill_gguf *quill_model_gguf(const quill_model *m);

/* ---------------------------------------------------------------- inference context */

typedef struct quill_context quill_context;

/* Where a context's weight products run (docs/gpu.md). */
typedef enum { QUILL_BACKEND_CPU = 0, QUILL_BACKEND_VULKAN = 1 } quill_backend;

typedef struct quill_context_params {
    int n_ctx;          /* context length in tokens, of each sequence; 0 = the model's training
                         * context (at most 4096) */
    int n_threads;      /* 0 = all online CPUs */
    int n_seq;          /* sequences the KV cache holds at once (ids 0..n_seq-1); 0 = 1 */
    bool reference;     /* float64 reference path: plain loops over dequantized weights */
    /* The types the KV cache stores keys and values in, as the reference's -ctk / -ctv: F32 (0, the
     * default: exact), F16, BF16 (rounded to nearest even), Q8_0 or Q4_0 (blocks of 32 along the
     * head, rounded as the reference's CPU cache stores them; the head size must be a multiple
     * of 32). Attention reads the rounded values in f32; logits stay bitwise identical for any
     * batching and thread count with every type. */
    quill_type type_k, type_v;
    /* QUILL_BACKEND_VULKAN: the weight products of the last n_gpu_layers layers (more than the
     * model's layers: the output layer too; negative: all) run on Vulkan device `device`, their
     * weights uploaded once, bit for bit the CPU's for q8_0, q4_0, q4_K and q6_K; norms, RoPE,
     * attention and the KV cache stay on the CPU in this version. Refused by name: a build without
     * Vulkan, a layer kind other than dense attention + dense FFN, a weight type other than f32,
     * f16, q8_0, q4_0, q4_K, q6_K. */
    quill_backend backend;
    int n_gpu_layers, device;
} quill_context_params;

/* The KV cache type a name gives ("f32", "f16", "bf16", "q8_0", "q4_0": the reference's spellings);
 * QUILL_E_ARG with a message listing them for any other name. */
QUILL_API quill_status quill_cache_type_parse(const char *name, quill_type *out, quill_error *err);
/* "f32, f16, bf16, q8_0, q4_0": the cache types, for usage texts. */
QUILL_API const char *quill_cache_type_names(void);
/* Bytes of the KV cache of a context with these parameters (n_ctx, n_seq, type_k, type_v; 0 in
 * n_ctx or n_seq as quill_context_new reads them), without making it: for memory estimates. */
QUILL_API double quill_context_kv_bytes(const quill_model *m, const quill_context_params *p);

/* Called with every intermediate tensor of an evaluation, named as the reference names them
 * ("attn_norm-0", "Qcur-0", ...); dims are ggml-style, ne[0] contiguous. */
typedef void (*quill_trace_fn)(const char *name, const float *data, int n_dims, const int64_t *ne,
                               void *user);

QUILL_API quill_status quill_context_new(quill_model *m, const quill_context_params *p, quill_context **out,
                                         quill_error *err);
QUILL_API void quill_context_free(quill_context *c);
/* Tokens already in the KV cache (of sequence 0). */
QUILL_API int quill_context_pos(const quill_context *c);
QUILL_API int quill_context_n_ctx(const quill_context *c);
/* The kernel set it computes with: "amx", "vnni", "avx512", "avx2" or "scalar" (the best the CPU
 * offers, or the one QUILL_ISA names), or "reference" for the float64 path. */
QUILL_API const char *quill_context_kernels(const quill_context *c);
/* "cpu", or "vulkan" with the device's name in *device and the layers whose products run there in
 * *gpu_layers (the output layer counted as one more); either pointer may be NULL. */
QUILL_API const char *quill_context_backend(const quill_context *c, const char **device, int *gpu_layers);
/* How many of the placed layers run whole on the device (norms, RoPE, attention and the KV cache
 * there too); 0 on the CPU backend, and when a placed layer has an operation the device's layer
 * lacks, so that only their weight products run there (docs/gpu.md). */
QUILL_API int quill_context_gpu_whole_layers(const quill_context *c);
/* The layout of the weights it reads: NULL for the file's own, or the name of a copy its kernel set
 * made at load (the vnni set's "vnni16"; QUILL_REPACK=0 in the environment turns copying off), and
 * then, for diagnostics such as /proc/self/smaps, where that copy is mapped (*start, *bytes). */
QUILL_API const char *quill_context_weight_layout(const quill_context *c, const void **start, size_t *bytes);
/* A mixture-of-experts model's expert tensors are copied into that layout by a thread of their own
 * after the first context is made, so that it need not wait for them; until an expert's copy is
 * complete it is read from the file (the same results, bit for bit, more slowly). This waits
 * until every copy is complete (quill bench does before it measures). */
QUILL_API void quill_context_wait_layout(quill_context *c);
/* Forgets cached tokens of sequence 0 from position `pos` on (0 clears the conversation). */
QUILL_API void quill_context_truncate(quill_context *c, int pos);
QUILL_API void quill_context_set_trace(quill_context *c, quill_trace_fn fn, void *user);

/* ---------------------------------------------------------------- several sequences at once
 *
 * A batch holds tokens of one or more sequences, each token with its sequence id and position,
 * and is evaluated in one forward pass: the weights are read once for all of them. Each token
 * sees only the cached positions of its own sequence. Every token's arithmetic is independent of
 * the rest of the batch, so a sequence's logits are bitwise identical to evaluating it alone, in
 * any batch composition, any chunking and any thread count. */
typedef struct quill_batch {
    int n;                  /* tokens */
    const int32_t *token;   /* [n] ids */
    const int32_t *seq;     /* [n] sequence ids, 0..n_seq-1 */
    const int32_t *pos;     /* [n] positions: a sequence's tokens in the batch are consecutive
                             * positions, the first at most the sequence's length (a smaller one
                             * forgets the positions from there on first) */
    const bool *logits;     /* [n] which tokens want logits; NULL = only the batch's last token */
} quill_batch;

/* Evaluates a batch. `logits` (may be NULL) receives n_vocab floats for each token that asked
 * for them, in batch order. A batch that fails its checks changes nothing. */
QUILL_API quill_status quill_decode(quill_context *c, const quill_batch *b, float *logits, quill_error *err);
QUILL_API int quill_context_n_seq(const quill_context *c);
/* Positions cached for sequence `seq` (its next position); -1 for an invalid id. */
QUILL_API int quill_seq_len(const quill_context *c, int seq);
/* Forgets sequence `seq`'s positions from `pos` on (0 clears it). */
QUILL_API void quill_seq_truncate(quill_context *c, int seq, int pos);
/* Makes `dst` hold the first `n` positions of `src` (prompt reuse: a conversation that starts
 * like another one need not evaluate the shared part again); `dst` forgets what it held. */
QUILL_API quill_status quill_seq_copy_prefix(quill_context *c, int src, int dst, int n, quill_error *err);

/* Evaluates `n` tokens at the next positions of sequence 0, as one batch. `logits` receives n × n_vocab floats
 * (one row per token) when `all_logits`, else only the last token's n_vocab; it may be NULL. */
QUILL_API quill_status quill_eval(quill_context *c, const int32_t *tokens, int n, float *logits, bool all_logits,
                                  quill_error *err);

/* ---------------------------------------------------------------- embeddings */

/* How a text's hidden states become one vector: the reference's pooling_type values. */
typedef enum { QUILL_POOLING_MEAN = 1, QUILL_POOLING_CLS = 2, QUILL_POOLING_LAST = 3 } quill_pooling;

/* The file's <arch>.pooling_type, or QUILL_POOLING_LAST when it has none (a decoder's last token
 * has seen the whole text). */
QUILL_API quill_pooling quill_model_pooling(const quill_model *m);

/* Evaluates `tokens` as sequence 0 of a cleared context and writes the pooled final hidden states
 * (after the output norm; n_embd floats), L2-normalised when `normalize`. The context is cleared
 * again afterwards; its trace callback must not be in use. */
QUILL_API quill_status quill_embed(quill_context *c, const quill_model *m, const int32_t *tokens, int n,
                                   quill_pooling pooling, bool normalize, float *out, quill_error *err);

/* ---------------------------------------------------------------- traces */

/* Records what a quill_trace_fn receives; tensors seen again (the next micro-batch of the same
 * prompt) are appended along their last dimension, the token dimension. */
typedef struct quill_trace_recorder quill_trace_recorder;
QUILL_API quill_trace_recorder *quill_trace_recorder_new(void);
QUILL_API void quill_trace_recorder_free(quill_trace_recorder *r);
/* A quill_trace_fn: pass the recorder as `user`. */
QUILL_API void quill_trace_record(const char *name, const float *data, int n_dims, const int64_t *ne, void *recorder);
/* Writes every recorded tensor as F32 into a GGUF file, like the reference's trace files. */
QUILL_API quill_status quill_trace_recorder_write(const quill_trace_recorder *r, const char *path, quill_error *err);

/* Position of a trace tensor name in the forward pass ("inp_embd" first, "result_norm" last);
 * names it does not know sort after all others. */
QUILL_API int64_t quill_trace_rank(const char *name);

typedef struct quill_trace_diff {
    const char *name;
    int64_t n_elements;
    double max_abs;         /* max |a - b| */
    double max_ref;         /* max |b| */
    double rel;             /* max_abs / max_ref: error relative to the tensor's scale */
    double rms_rel;         /* rms(a - b) / rms(b) */
} quill_trace_diff;

/* Compares every tensor the two trace files share (b is the reference), in forward order. A file
 * is a trace GGUF (quill's --trace, the reference's older traces) or the records of the
 * reference's refdump (trace.bin).
 * *diffs is malloc'd; *first_bad is the index of the first tensor with rel > tol, or -1. */
QUILL_API quill_status quill_trace_compare(const char *path_a, const char *path_b, double tol, quill_trace_diff **diffs,
                                           size_t *n_diffs, int64_t *first_bad, quill_error *err);
/* The same for two recorders in memory (b is the reference), e.g. the fast and the float64 pass. */
QUILL_API quill_status quill_trace_compare_recorded(const quill_trace_recorder *a, const quill_trace_recorder *b, double tol,
                                                    quill_trace_diff **diffs, size_t *n_diffs, int64_t *first_bad,
                                                    quill_error *err);

/* ---------------------------------------------------------------- sampling */

typedef struct quill_sampler_params {
    float temperature;      /* 0 = greedy */
    int top_k;              /* 0 = off */
    float top_p;            /* 1 = off */
    float min_p;            /* 0 = off */
    float repeat_penalty;   /* 1 = off */
    float presence_penalty; /* subtracted once from every token in the window; 0 = off */
    float frequency_penalty;/* subtracted per occurrence in the window; 0 = off */
    int repeat_last_n;      /* window of recent tokens the penalties look at */
    uint64_t seed;
} quill_sampler_params;

QUILL_API quill_sampler_params quill_sampler_defaults(void);

/* QUILL_OK when every field is in range, else QUILL_E_ARG naming the field, its range and what
 * the "off" value is. quill_sampler_new() checks the same. */
QUILL_API quill_status quill_sampler_params_check(const quill_sampler_params *p, quill_error *err);

/* Sets one option by name from its text, so that every front end (CLI flags, server fields)
 * accepts the same names, ranges and messages: "temperature" (or "temp"), "top_k", "top_p",
 * "min_p", "repeat_penalty", "repeat_last_n", "seed" (leading dashes are skipped and dashes may stand
 * for underscores, so "--top-p" works; messages use the name as given). A seed
 * of -1 draws a random seed and stores it in p->seed, so it can be shown and reused. */
QUILL_API quill_status quill_sampler_params_set(quill_sampler_params *p, const char *name, const char *value,
                                                quill_error *err);
/* A seed from the system's entropy source (the clock when there is none). */
QUILL_API uint64_t quill_random_seed(void);

typedef struct quill_sampler quill_sampler;
QUILL_API quill_status quill_sampler_new(const quill_sampler_params *p, int32_t n_vocab, quill_sampler **out,
                                         quill_error *err);
QUILL_API void quill_sampler_free(quill_sampler *s);
/* Records a generated token: every stage sees it (the penalty window, a grammar's state). */
QUILL_API void quill_sampler_accept(quill_sampler *s, int32_t token);
/* Records a prompt token: only the penalty window sees it (a grammar constrains what is generated). */
QUILL_API void quill_sampler_accept_prompt(quill_sampler *s, int32_t token);
/* Every stage back to its state after construction (empty penalty window, a grammar at its start);
 * the random stream goes on, so that a new turn of a conversation does not repeat the draws. */
QUILL_API void quill_sampler_reset(quill_sampler *s);
/* Picks the next token from logits (which it may modify). -1 when a restricting stage failed
 * (quill_sampler_error says why: e.g. a grammar that no token can continue) or s/logits is NULL. */
QUILL_API int32_t quill_sampler_sample(quill_sampler *s, float *logits);
/* Why the last quill_sampler_sample() returned -1, or NULL. */
QUILL_API const char *quill_sampler_error(const quill_sampler *s);

/* A restricting stage of the sampler's chain (a grammar, a ban list): it runs after the penalties,
 * before the selection stages, on the whole vocabulary. */
typedef struct quill_sampler_stage {
    const char *name;
    /* Sets the logits of the tokens it excludes to -INFINITY. False on a failure, with *err set
     * (the draw then returns -1). */
    bool (*apply)(void *state, float *logits, int32_t n_vocab, quill_error *err);
    /* Optional: whether `token` survives apply. With it the sampler checks the token it drew
     * before restricting the whole vocabulary. */
    bool (*allows)(void *state, int32_t token);
    void (*accept)(void *state, int32_t token);     /* a generated token (optional) */
    void (*reset)(void *state);                     /* optional */
    void (*free)(void *state);                      /* called by quill_sampler_free (optional) */
    void *state;
} quill_sampler_stage;
/* Adds a restricting stage (after those added before); the sampler owns it from then on, also on
 * failure when `free` is given. */
QUILL_API quill_status quill_sampler_add_stage(quill_sampler *s, const quill_sampler_stage *stage, quill_error *err);

/* ---------------------------------------------------------------- grammars (constrained decoding) */

/* A grammar in the reference's GBNF format (the .gbnf files of llama.cpp's grammars directory work as they are):
 * `name ::= ...` rules, "literals", [classes], [^negated], ., ( ) groups, |, *, +, ?, {m}, {m,},
 * {m,n}, # comments, <[id]> / !<[id]> tokens by id and <|text|> tokens by text (these need
 * `tok`; it may be NULL otherwise). Parsed once; immutable, so one grammar may serve many
 * matchers at once. Errors name the line and column and what was expected; undefined rules,
 * left recursion and a missing root are refused. `root`: the rule to start from (NULL: "root"). */
typedef struct quill_grammar quill_grammar;
QUILL_API quill_status quill_grammar_parse(const quill_tokenizer *tok, const char *text, size_t len, const char *root,
                                           quill_grammar **out, quill_error *err);
QUILL_API void quill_grammar_free(quill_grammar *g);
QUILL_API size_t quill_grammar_n_rules(const quill_grammar *g);
/* Whether the whole of text[0..len) is a sentence of the grammar. */
QUILL_API bool quill_grammar_accepts(const quill_grammar *g, const char *text, size_t len);

/* The vocabulary's token texts indexed for matching (a trie): built once per model and shared
 * by every matcher (read-only). */
typedef struct quill_grammar_vocab quill_grammar_vocab;
QUILL_API quill_status quill_grammar_vocab_new(const quill_tokenizer *tok, quill_grammar_vocab **out, quill_error *err);
QUILL_API void quill_grammar_vocab_free(quill_grammar_vocab *v);

/* Where a text stands in a grammar. `v` may be NULL for text-only use (no tokens, no masks).
 * The grammar and vocabulary must outlive it. */
typedef struct quill_grammar_matcher quill_grammar_matcher;
QUILL_API quill_status quill_grammar_matcher_new(const quill_grammar *g, const quill_grammar_vocab *v,
                                                 quill_grammar_matcher **out, quill_error *err);
QUILL_API void quill_grammar_matcher_free(quill_grammar_matcher *m);
QUILL_API void quill_grammar_matcher_reset(quill_grammar_matcher *m);
/* Advance by text or by a token; false (state unchanged) when the grammar does not allow it. An
 * end-of-generation token is allowed when the text is complete. */
QUILL_API bool quill_grammar_matcher_accept_text(quill_grammar_matcher *m, const char *text, size_t len);
QUILL_API bool quill_grammar_matcher_accept_token(quill_grammar_matcher *m, int32_t token);
QUILL_API bool quill_grammar_matcher_allows(quill_grammar_matcher *m, int32_t token);
/* The text so far is a complete sentence (the grammar allows it to end here). */
QUILL_API bool quill_grammar_matcher_can_end(const quill_grammar_matcher *m);
/* Nothing can follow: no text, no end (or the matcher ran out of memory). */
QUILL_API bool quill_grammar_matcher_is_dead(const quill_grammar_matcher *m);
/* The tokens allowed next, as bits (token t: bits[t / 64] >> (t % 64) & 1; (n_vocab + 63) / 64
 * words): by walking the vocabulary's trie, cached per state. _plain feeds every token's text
 * on its own: the simple version the tests compare with. */
QUILL_API quill_status quill_grammar_matcher_mask(quill_grammar_matcher *m, uint64_t *bits, quill_error *err);
QUILL_API quill_status quill_grammar_matcher_mask_plain(quill_grammar_matcher *m, uint64_t *bits, quill_error *err);

/* Adds a grammar stage to a sampler: only tokens the grammar allows can be drawn, end of
 * generation only once the text is complete. `g` and `v` must outlive the sampler. The sampler
 * accepts generated tokens into it; quill_sampler_reset() starts it over. */
QUILL_API quill_status quill_sampler_add_grammar(quill_sampler *s, const quill_grammar *g, const quill_grammar_vocab *v,
                                                 quill_error *err);
/* The same, applied only from a trigger on (a "lazy" grammar, for replies that may be prose or a
 * tool call): tokens are drawn freely until the generated text (special tokens rendered) contains
 * one of `triggers`; the grammar, which must describe the text from the trigger's first byte on,
 * is then fed that text and constrains every later token. When the text after the trigger already
 * leaves the grammar, the reply stays unconstrained. The triggers are copied. */
QUILL_API quill_status quill_sampler_add_grammar_lazy(quill_sampler *s, const quill_grammar *g,
                                                      const quill_grammar_vocab *v, const char *const *triggers,
                                                      size_t n_triggers, quill_error *err);

/* A JSON Schema as a GBNF grammar (rule "root") whose sentences are the JSON texts the schema
 * accepts, in the reference's layout (json-schema-to-grammar): types (also lists of types),
 * properties, required, additionalProperties (absent: no other keys), enum, const, items,
 * prefixItems, minItems, maxItems, minLength, maxLength, anyOf, oneOf, $ref to #/$defs/... or
 * #/definitions/..., and the string formats date, time, date-time and uuid; titles,
 * descriptions and other annotations are ignored. Any other keyword is refused (QUILL_E_UNSUPPORTED)
 * with a message that names it and where it is; malformed JSON is QUILL_E_FORMAT. *gbnf is
 * malloc'd. */
QUILL_API quill_status quill_json_schema_to_grammar(const char *schema, size_t len, char **gbnf, quill_error *err);

/* ---------------------------------------------------------------- speculative decoding
 *
 * A drafter proposes the tokens likely to follow a sequence; the caller evaluates the last token
 * it drew and the draft in one batch (logits for every row) and steps its generator row by row,
 * going on while the token drawn is the next drafted one and keeping the first that differs
 * (quill_seq_truncate forgets the rest). The generator and its sampler (random stream, grammar)
 * see exactly the calls of decoding without a draft, and every row's logits are the bits that
 * token gets alone, so the output is bitwise the same, greedy or seeded: a draft only decides how
 * many tokens one pass confirms. quill_generate() does this when p->drafter is set. */
#define QUILL_DRAFT_MAX 256
typedef struct quill_drafter quill_drafter;

typedef struct quill_draft_params {
    int n_max;          /* tokens drafted at most per step (1..QUILL_DRAFT_MAX; default 16) */
    int n_min;          /* a shorter draft is not used (default 0) */
    int n_seq;          /* sequences drafted for, ids 0..n_seq-1 (0 = 1) */
    /* draft model only: */
    float p_min;        /* drafting stops at a token the draft model gives less probability (0 = off) */
    int n_ctx;          /* positions of each sequence in the draft model's context (0: its default) */
    int n_threads;      /* 0 = all online CPUs */
} quill_draft_params;

/* n_max 16, the rest 0. */
QUILL_API quill_draft_params quill_draft_defaults(void);
/* N-gram lookup, no model: drafts what followed the same n-grams (1 to 4 tokens) earlier in the
 * sequence (the prompt and the text so far), as the reference's lookup decoding does. */
QUILL_API quill_status quill_drafter_new_lookup(const quill_draft_params *p, quill_drafter **out, quill_error *err);
/* A draft model's greedy continuation, in its own context (p->n_ctx, p->n_threads, p->n_seq). The
 * draft model must share the target's vocabulary (quill_draft_vocab_check); it must outlive the
 * drafter. */
QUILL_API quill_status quill_drafter_new_model(quill_model *draft, const quill_model *target, const quill_draft_params *p,
                                               quill_drafter **out, quill_error *err);
/* QUILL_OK when `draft` can draft for `target`, the reference's test: the same tokenizer kind,
 * BOS and EOS, vocabulary sizes within 128, the same token texts from id 5 on; else QUILL_E_ARG
 * saying what differs. */
QUILL_API quill_status quill_draft_vocab_check(const quill_model *target, const quill_model *draft, quill_error *err);
QUILL_API void quill_drafter_free(quill_drafter *d);
QUILL_API int quill_drafter_n_max(const quill_drafter *d);
QUILL_API int quill_drafter_n_min(const quill_drafter *d);
/* Drafts at most `max` (and n_max) tokens to follow tokens[0..n_tokens): sequence `seq`'s tokens
 * so far, the last one drawn included. The drafter finds by itself what changed since its last
 * call (tokens accepted, a sequence that went back). *n_draft may be 0 (nothing to propose, or
 * fewer than n_min). */
QUILL_API quill_status quill_drafter_draft(quill_drafter *d, int seq, const int32_t *tokens, size_t n_tokens, int max,
                                           int32_t *draft, int *n_draft, quill_error *err);
/* Brings the drafter up to tokens[0..n_tokens) without drafting (a draft model evaluates them):
 * called with the prompt, it puts the draft model's prompt pass with the target's instead of in
 * the first draft. Optional. */
QUILL_API quill_status quill_drafter_prepare(quill_drafter *d, int seq, const int32_t *tokens, size_t n_tokens,
                                             quill_error *err);

/* ---------------------------------------------------------------- generation */

/* Why generation ended. */
typedef enum quill_finish {
    QUILL_FINISH_STOP,      /* an end-of-generation token, a stop string, or the callback said stop */
    QUILL_FINISH_LENGTH,    /* n_predict tokens, or the context is full */
} quill_finish;
/* "stop" or "length", as the OpenAI API names them. */
QUILL_API const char *quill_finish_name(quill_finish f);

typedef struct quill_generate_params {
    quill_sampler_params sampling;  /* used when quill_generate() is given no sampler */
    int n_predict;                  /* tokens to generate at most; < 0: until the context is full */
    /* Stop strings: generation ends when the text contains one; it is not part of the output.
     * Text that could still become a stop string is held back from the callback until it cannot. */
    const char *const *stop;
    size_t n_stop;
    /* The prompt's tokens enter the repetition-penalty window (as the reference does). */
    bool penalize_prompt;
    /* Optional: a grammar the generated text must follow, with the model's vocabulary index
     * (both must outlive the generation). Added as a stage to the sampler the generator makes;
     * with a sampler of the caller's, add it there (quill_sampler_add_grammar) instead. */
    const quill_grammar *grammar;
    const quill_grammar_vocab *grammar_vocab;
    /* With triggers, the grammar applies from the first trigger on (quill_sampler_add_grammar_lazy). */
    const char *const *grammar_triggers;
    size_t n_grammar_triggers;
    /* The generated text is the start of the text (no prompt before it): the tokenizer's leading
     * space is removed. False for a continuation. */
    bool text_start;
    /* Special tokens are written into the text (gpt-oss's <|channel|> ..., DeepSeek's and
     * Mistral's tool-call marks) for a front end that reads the reply's structure from them;
     * end-of-generation tokens never are. */
    bool render_special;
    /* Optional: receives n_prompt x n_vocab floats, the logits of every prompt position. */
    float *prompt_logits;
    /* Optional: traces the prompt's evaluation only (see quill_context_set_trace). */
    quill_trace_fn prompt_trace;
    void *prompt_trace_user;
    /* Optional: polled between micro-batches of the prompt and between tokens; true stops
     * (result->cancelled). Lets an interactive front end stop a long evaluation. */
    bool (*should_stop)(void *user);
    void *should_stop_user;
    /* Optional: speculative decoding with this drafter (its sequence 0); the output is the same
     * bits as without it. `history`: the tokens the context holds before the prompt (a chat's
     * earlier turns), so that the drafter sees the whole sequence; may be NULL. */
    quill_drafter *drafter;
    const int32_t *history;
    size_t n_history;
    /* Optional: sees the logits of every generation step before the sampler changes them (row of
     * n_vocab floats; the step's token is drawn from them). */
    void (*step_logits)(const float *logits, int32_t n_vocab, void *user);
    void *step_logits_user;
} quill_generate_params;

/* n_predict 128, quill_sampler_defaults(), everything else off. */
QUILL_API quill_generate_params quill_generate_defaults(void);

/* Stop strings in generated text, as quill_generate() applies them: the offset of the earliest
 * complete stop string in text[0..len), or -1; *release (when not NULL) gets how many leading
 * bytes are final: before the match, or before the earliest suffix that could still grow into a
 * stop string. For front ends that run their own loop (the server's scheduler). */
QUILL_API long quill_stop_scan(const char *text, size_t len, const char *const *stop, size_t n_stop, size_t *release);

/* Receives each generated token with the text it completes (possibly empty: a UTF-8 character
 * split across tokens, or text held back while it could become a stop string). A final call with
 * token -1 delivers what is left at the end. Returning false stops generation. */
typedef bool (*quill_generate_fn)(int32_t token, const char *text, size_t len, void *user);

typedef struct quill_generate_result {
    quill_finish finish;
    int n_prompt;           /* tokens evaluated for the prompt */
    int n_generated;        /* tokens sampled (end-of-generation tokens not counted) */
    bool context_full;      /* ended because the context had no room left (finish is LENGTH) */
    bool stop_string;       /* ended at a stop string */
    bool cancelled;         /* the callback returned false or should_stop said so */
    double prompt_ms, generation_ms;
    int n_drafted;          /* with a drafter: tokens drafted and checked by the target model */
    int n_accepted;         /* ... and those the generator drew as drafted */
} quill_generate_result;

/* ---------------------------------------------------------------- the generator: the loop one step at a time */

/* The generation loop's decisions for one sequence, driven one token at a time by a caller that
 * owns the evaluation (quill_generate() below; the server's scheduler, which evaluates many
 * sequences in one batch): drawing with the sampler, end of generation, stop strings, the length
 * limit, a full context, and text that is only released once it is final (whole UTF-8
 * characters, no beginning of a stop string).
 *
 * Order of one step, as the reference's server and CLI do it: draw; the sampler accepts the token
 * (also an end-of-generation token, so that a grammar sees the end); an end-of-generation token
 * ends it (not counted, not shown, finish "stop"); otherwise the token's text is added and
 * scanned for stop strings (finish "stop"), then the length limit and the context are checked
 * (finish "length"). The prompt enters the penalty window (never a grammar) when
 * p->penalize_prompt is set, as the reference always does; the CLI and the server set it. */
typedef struct quill_generator quill_generator;

typedef struct quill_generator_event {
    int32_t token;          /* the token drawn */
    bool eog;               /* it is an end-of-generation token: not shown and not to be evaluated */
    const char *text;       /* text that became final with this token (valid until the next call) */
    size_t len;
    bool done;              /* generation is over (quill_generator_result says why); otherwise
                             * `token` is evaluated next and its logits given to the next step */
    const char *tail;       /* when done: what was still held back and is now final */
    size_t tail_len;
} quill_generator_event;

/* A generator for one sequence. `sampler` is borrowed when given, else one is made from
 * p->sampling and owned; p->stop strings are copied. */
QUILL_API quill_status quill_generator_new(const quill_tokenizer *tok, quill_sampler *sampler,
                                           const quill_generate_params *p, quill_generator **out, quill_error *err);
QUILL_API void quill_generator_free(quill_generator *g);
QUILL_API quill_sampler *quill_generator_sampler(quill_generator *g);
/* Starts a generation that continues `prompt` (the tokens evaluated before the first step; they
 * enter the penalty window when p->penalize_prompt). Counts, held text and the detokenizer start
 * over; the sampler is not reset (see quill_sampler_reset). */
QUILL_API void quill_generator_begin(quill_generator *g, const int32_t *prompt, size_t n_prompt);
/* One step from the logits after the last evaluated token (the sampler may modify them). `room`:
 * the context can take the drawn token (false ends the generation after it, finish "length").
 * After `done`, call quill_generator_begin() before stepping again. */
QUILL_API quill_status quill_generator_step(quill_generator *g, float *logits, bool room, quill_generator_event *out,
                                            quill_error *err);
/* finish, n_generated, stop_string and context_full so far (timings and n_prompt are the caller's). */
QUILL_API const quill_generate_result *quill_generator_result(const quill_generator *g);

/* Evaluates `prompt` at the context's next positions (after what it already holds), then samples,
 * detokenizes and streams tokens to `fn` until a stop condition. `sampler` may be NULL: one is made
 * from p->sampling for this call. `fn` and `result` may be NULL. On an error the result still
 * tells what was done; the context holds every token that was evaluated. */
QUILL_API quill_status quill_generate(quill_context *c, quill_sampler *sampler, const int32_t *prompt, size_t n_prompt,
                                      const quill_generate_params *p, quill_generate_fn fn, void *user,
                                      quill_generate_result *result, quill_error *err);

/* Text in, streamed text out: tokenizes `prompt` as the model asks (BOS as add_bos_token says) and
 * continues it with quill_generate() on a fresh context position 0 (the context is cleared). */
QUILL_API quill_status quill_generate_text(quill_context *c, const char *prompt, const quill_generate_params *p,
                                           quill_generate_fn fn, void *user, quill_generate_result *result,
                                           quill_error *err);

/* ---------------------------------------------------------------- chat prompts (see quill_chat.h) */

struct quill_chat_message;
/* The template that applies to a model: `override_src` when given, else the model's own
 * tokenizer.chat_template, else the built-in template `format` (chatml, llama2, ...). *out is a
 * malloc'd copy. QUILL_E_NOT_FOUND when none applies. */
QUILL_API quill_status quill_chat_template_for(const quill_model *m, const char *override_src, const char *format,
                                               char **out, quill_error *err);
struct quill_chat_inputs;
/* The variables quill gives every template beside the conversation, one definition for the
 * server, quill chat, quill run --chat and quill template: bos_token and eos_token from `tok` (when
 * not NULL; else they are left as they are) and strftime_now(fmt), the local time now (gpt-oss's
 * template prints the date with it). */
QUILL_API void quill_chat_inputs_common(const quill_tokenizer *tok, struct quill_chat_inputs *in);
/* Renders a conversation (with quill_chat_inputs_common's variables) and tokenizes it with
 * special-token parsing on; BOS is added as the model asks unless the rendered text already starts
 * with it. *tokens (and *text when not NULL, the rendered prompt) are malloc'd. */
QUILL_API quill_status quill_chat_tokenize(const quill_model *m, const char *template_src,
                                           const struct quill_chat_message *msgs, size_t n_msgs,
                                           bool add_generation_prompt, int32_t **tokens, size_t *n_tokens,
                                           char **text, quill_error *err);

#ifdef __cplusplus
}
#endif

#endif
