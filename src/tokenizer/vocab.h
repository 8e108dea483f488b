/* The vocabulary shared by the tokenizers: token texts and types, the text -> id hash, special
 * tokens, and what each tokenizer (spm.c, bpe.c) needs from it. Internal to the library. */
#ifndef QUILL_TEXT_VOCAB_H
#define QUILL_TEXT_VOCAB_H

#include "base/error.h"

#include <stdint.h>
#include <stdlib.h>

/* Per-token flags the reference keeps as attributes outside the GGUF token types. */
enum { F_LSTRIP = 1, F_RSTRIP = 2, F_EOG = 4 };

/* No real vocabulary comes near this; the bound keeps piece lengths well inside int. */
#define MAX_TOKEN_BYTES (1u << 20)
/* Texts longer than this would overflow the int symbol indices the merge loops use. */
#define MAX_TEXT_BYTES ((size_t)1 << 29)

typedef enum { VOCAB_SPM, VOCAB_BPE } vocab_kind;

typedef struct bpe_model bpe_model;

struct quill_tokenizer {
    vocab_kind kind;
    int32_t n_vocab;
    char *text;              /* every token's text, NUL-terminated, one after another */
    size_t *text_off;
    size_t *text_len;
    char *piece;             /* what each token decodes to with render_special (the reference's cache) */
    size_t *piece_off;
    size_t *piece_len;
    size_t max_piece;
    float *score;
    uint8_t *type;           /* QUILL_TOKEN_*, after the reference's overrides */
    uint8_t *flags;
    int32_t *slots;          /* open-addressing hash: text -> id, -1 = empty */
    uint32_t slot_mask;
    int32_t byte_tok[256];   /* SPM byte fallback: <0xNN> (or the byte itself), -1 when absent */
    int32_t *special;        /* partition order: CONTROL / USER_DEFINED / UNKNOWN, longest first */
    int32_t n_special;
    /* Which special texts occur in a text, found in one pass: the special texts' distinct
     * lengths, the bytes they start with, and a hash of the distinct texts ("groups"). */
    int32_t *special_group;  /* group of each entry of `special` */
    int32_t *group_first;    /* the first entry of `special` with the group's text */
    int32_t n_groups;
    int32_t *group_slots;
    uint32_t group_mask;
    size_t *special_lens;
    int n_special_lens;
    uint8_t special_starts[32];
    int32_t bos, eos, unk, pad, eot, eom;
    bool add_bos, add_eos, add_space_prefix;
    bool word_split;         /* SPM: no piece has U+2581 inside except in a leading run (see spm.c) */
    bool spm_text;           /* BPE over SentencePiece-style text (the gemma4 model or pre-tokenizer): normal
                              * tokens decode as SPM's (bpe_load sets it) */
    bpe_model *bpe;          /* BPE: merges and pre-tokenizer */
};

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;

bool ivec_push(ivec *a, int32_t x);

uint32_t vocab_hash(const char *s, size_t n);
/* FNV-1a continued over more bytes, so a key made of pieces hashes like their concatenation. */
uint32_t vocab_hash_more(uint32_t h, const char *s, size_t n);
static inline const char *vocab_text(const quill_tokenizer *t, int32_t id) { return t->text + t->text_off[id]; }
/* The id whose text is exactly s[0..n), or -1. */
int32_t vocab_lookup(const quill_tokenizer *t, const char *s, size_t n);

/* Byte length of the UTF-8 sequence a lead byte starts, as the reference counts it (1 for
 * continuation bytes and invalid leads). */
static inline size_t utf8_lead_len(unsigned char c) {
    static const unsigned char len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

/* spm.c: one raw fragment of text through the SentencePiece merge loop. */
typedef struct spm_scratch spm_scratch;
spm_scratch *spm_scratch_new(void);
void spm_scratch_free(spm_scratch *s);
quill_status spm_fragment(const quill_tokenizer *t, spm_scratch *s, const char *text, size_t len,
                          bool space_prefix, ivec *out, quill_error *err);

/* bpe.c: merges, the pre-tokenizer named by tokenizer.ggml.pre, and one raw fragment through them.
 * bpe_load also sets the vocabulary defaults the pre-tokenizer implies (add_bos, bos). spm_style:
 * Gemma 4's tokenizer model (gemma4): SentencePiece-style text (U+2581 for spaces) merged as BPE. */
quill_status bpe_load(const quill_gguf *g, quill_tokenizer *t, bool spm_style, quill_error *err);
void bpe_free(bpe_model *b);
quill_status bpe_fragment(const quill_tokenizer *t, const char *text, size_t len, ivec *out, quill_error *err);
/* The bytes a byte-level token text stands for (GPT-2's byte-to-unicode mapping undone). Writes
 * at most bpe_decoded_size() bytes. */
size_t bpe_decoded_size(const char *s, size_t n);
size_t bpe_decode_text(const char *s, size_t n, char *dst);
/* The pre-tokenizer's name, for messages and quill_tokenizer_pre(). */
const char *bpe_pre_name(const bpe_model *b);

#endif
