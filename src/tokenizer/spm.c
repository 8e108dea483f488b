/* SentencePiece ("llama") merge loop, behaving like the reference's llm_tokenizer_spm: a raw
 * fragment (special tokens already split out by vocab.c) has its spaces escaped as U+2581, is cut
 * into UTF-8 characters, and the pair whose merged text is the highest-scoring token merges first;
 * what is left over becomes byte tokens. */
#include "tokenizer/merge_heap.h"
#include "tokenizer/vocab.h"

#include <string.h>

/* start and n: bytes of the escaped fragment */
typedef merge_symbol symbol;

static uint32_t score_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

struct spm_scratch {
    char *esc;
    size_t esc_cap;
    symbol *sym;
    size_t sym_cap;
    merge_heap heap;
};

spm_scratch *spm_scratch_new(void) { return calloc(1, sizeof(spm_scratch)); }

void spm_scratch_free(spm_scratch *s) {
    if (!s) return;
    free(s->esc);
    free(s->sym);
    free(s->heap.items);
    free(s);
}

static bool try_bigram(const quill_tokenizer *t, spm_scratch *s, int left, int right) {
    if (left < 0 || right < 0) return true;
    size_t size = s->sym[left].n + s->sym[right].n;
    int32_t id = vocab_lookup(t, s->esc + s->sym[left].start, size);
    if (id < 0) return true;
    /* the reference merges the higher score first, then the leftmost pair: the merge heap's lowest
     * key, with the score's bits made order-preserving and complemented */
    uint64_t key = (uint64_t)~score_bits(t->score[id]) << 32 | (uint32_t)left;
    /* size <= 2 * MAX_TOKEN_BYTES: both sides are vocabulary pieces or single characters */
    return merge_heap_push(&s->heap, (merge_pair){key, right, (uint32_t)size});
}

static quill_status merge_run(const quill_tokenizer *t, spm_scratch *s, int a, int b, ivec *out,
                              quill_error *err);

quill_status spm_fragment(const quill_tokenizer *t, spm_scratch *s, const char *text, size_t len,
                                 bool space_prefix, ivec *out, quill_error *err) {
    /* Escaped form: optional leading space, then every ' ' (and only ' ') becomes U+2581. */
    size_t need = 3 * (len + 1);
    if (need > s->esc_cap) {
        char *e = realloc(s->esc, need);
        if (!e) return quill_fail(err, QUILL_E_NOMEM, "out of memory while tokenizing %zu bytes", len);
        s->esc = e;
        s->esc_cap = need;
    }
    size_t n = 0;
    if (space_prefix) { memcpy(s->esc, "\xe2\x96\x81", 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(s->esc + n, "\xe2\x96\x81", 3); n += 3; }
        else s->esc[n++] = text[i];
    }
    if (n == 0) return QUILL_OK;

    if (n > s->sym_cap) {
        symbol *y = realloc(s->sym, n * sizeof *y);
        if (!y) return quill_fail(err, QUILL_E_NOMEM, "out of memory while tokenizing %zu bytes", len);
        s->sym = y;
        s->sym_cap = n;
    }
    int count = 0;
    for (size_t off = 0; off < n; count++) {
        size_t cl = utf8_lead_len((unsigned char)s->esc[off]);
        if (cl > n - off) cl = n - off;
        s->sym[count] = (symbol){count - 1, off + cl == n ? -1 : count + 1, off, cl};
        off += cl;
    }

    /* The reference merges the whole fragment in one queue. When no piece has U+2581 inside except
     * after another U+2581 (true of SentencePiece vocabularies), no piece can span the start of a
     * run of U+2581 symbols, so no pair across it is ever queued and the words on either side
     * merge independently, in the same relative order: merging word by word gives the same
     * tokens with a queue that stays in cache. A U+2581 counts as a run start only when it is a
     * symbol of its own and the three bytes before it are not U+2581. */
    int seg = 0;
    for (int i = 1; i <= count; i++) {
        if (i < count) {
            const symbol *y = &s->sym[i];
            if (!t->word_split || y->n != 3 || memcmp(s->esc + y->start, "\xe2\x96\x81", 3) != 0 ||
                (y->start >= 3 && memcmp(s->esc + y->start - 3, "\xe2\x96\x81", 3) == 0))
                continue;
        }
        quill_status st = merge_run(t, s, seg, i, out, err);
        if (st) return st;
        seg = i;
    }
    return QUILL_OK;
}

/* The SPM merge loop over symbols [a, b), then each final symbol as a token or as bytes. */
static quill_status merge_run(const quill_tokenizer *t, spm_scratch *s, int a, int b, ivec *out,
                              quill_error *err) {
    s->sym[a].prev = -1;
    s->sym[b - 1].next = -1;
    s->heap.n = 0;
    for (int i = a + 1; i < b; i++)
        if (!try_bigram(t, s, i - 1, i)) goto oom;
    for (int left; (left = merge_heap_merge_next(&s->heap, s->sym)) >= 0;)
        if (!try_bigram(t, s, s->sym[left].prev, left) || !try_bigram(t, s, left, s->sym[left].next)) goto oom;

    for (int i = a; i != -1; i = s->sym[i].next) {
        const char *p = s->esc + s->sym[i].start;
        size_t sn = s->sym[i].n;
        int32_t id = vocab_lookup(t, p, sn);
        if (id >= 0) {
            if (!ivec_push(out, id)) goto oom;
            continue;
        }
        for (size_t j = 0; j < sn; j++) {
            unsigned char c = (unsigned char)p[j];
            int32_t bt = t->byte_tok[c] >= 0 ? t->byte_tok[c] : t->unk;
            if (bt < 0)
                return quill_fail(err, QUILL_E_UNSUPPORTED,
                                  "cannot encode byte 0x%02X: the vocabulary has no <0x%02X> token and no unknown token",
                                  c, c);
            if (!ivec_push(out, bt)) goto oom;
        }
    }
    return QUILL_OK;
oom:
    return quill_fail(err, QUILL_E_NOMEM, "out of memory while tokenizing");
}
