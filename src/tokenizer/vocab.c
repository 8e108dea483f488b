/* The vocabulary behind both tokenizers, behaving like the reference (llama.cpp's llama_vocab):
 * loading tokens, types and special-token ids from tokenizer.ggml.* metadata, the roles it finds
 * by text, tokenizer_st_partition for special tokens, and token_to_piece / detokenize for the way
 * back. The raw text between special tokens goes to spm.c ("llama") or bpe.c ("gpt2"). Where the
 * reference relies on unspecified behaviour (hash-map iteration order, an unstable sort) this file
 * picks the deterministic choice that agrees with it on every real vocabulary; where the reference
 * would crash or throw on hostile data, loading fails with an error instead.
 *
 * The room src/tokenizer/: text to token ids and back (vocab.c, spm.c, bpe.c, merge_heap.h, vocab_table.c). It
 * calls only src/base/ and PCRE2; sampling, generation, chat and the front ends call into it,
 * never the reverse.
 */
#include "tokenizer/vocab.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static bool is_type(const quill_tokenizer *t, int32_t id, int type) { return t->type[id] == type; }

/* Error messages quote file contents; keep them printable and short. */
static void printable(char *dst, size_t cap, const char *src, size_t n) {
    size_t i = 0, j = 0;
    for (; i < n && j + 4 < cap; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[j++] = (c >= 0x20 && c != 0x7f) ? (char)c : '?';
    }
    if (i < n) { memcpy(dst + j, "...", 3); j += 3; }
    dst[j] = 0;
}

static const char *gname(const quill_gguf *g) {
    const char *p = quill_gguf_path(g);
    return p ? p : "(gguf)";
}

/* ---------------------------------------------------------------- loading */

/* A special-token id from metadata. Like the reference, an out-of-range id (stories260K stores
 * padding_token_id = 0xFFFFFFFF) keeps the default; a value that is not an integer is an error. */
static quill_status read_id(const quill_gguf *g, const char *key, int32_t n_vocab, int32_t *id,
                            quill_error *err) {
    const quill_gguf_value *v = quill_gguf_find(g, key);
    if (!v) return QUILL_OK;
    int64_t i;
    uint64_t u;
    bool in_range;
    if (quill_gguf_value_i64(v, &i)) in_range = i >= 0 && i < n_vocab;
    else if (quill_gguf_value_u64(v, &u)) in_range = false;
    else
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata key '%s' has type %s, expected an integer token id",
                          gname(g), key, quill_gguf_type_name(v->type));
    if (in_range) *id = (int32_t)i;
    else
        quill_log(QUILL_LOG_WARN, "%s: %s is outside the vocabulary of %d tokens; using %d instead",
                  gname(g), key, n_vocab, *id);
    return QUILL_OK;
}

static quill_status read_flag(const quill_gguf *g, const char *key, bool *flag, quill_error *err) {
    quill_status s = quill_gguf_get_bool(g, key, flag, err);
    return s == QUILL_E_NOT_FOUND ? QUILL_OK : s;
}

/* The reference finds these roles by text when the metadata does not name them, and turns the
 * token into a control token (so it is only parsed with parse_special and not rendered). */
typedef struct {
    const char *keys[2];
    const char *texts[12];
    bool eog;           /* the role's token ends generation */
} role_spec;

#define FULLWIDTH_BAR "\xef\xbd\x9c"
#define LOWER_BLOCK "\xe2\x96\x81"
static const role_spec roles[] = {
    {{"tokenizer.ggml.eot_token_id"},
     {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
      "[EOT]", "<" FULLWIDTH_BAR "end" LOWER_BLOCK "of" LOWER_BLOCK "sentence" FULLWIDTH_BAR ">", "<end_of_utterance>"},
     true},
    {{"tokenizer.ggml.eom_token_id"}, {"<|eom_id|>"}, true},
    {{"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
     {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<" FULLWIDTH_BAR "fim" LOWER_BLOCK "begin" FULLWIDTH_BAR ">",
      "<PRE>", LOWER_BLOCK "<PRE>", "<|code_prefix|>", "<|prefix|>"}, false},
    {{"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
     {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<" FULLWIDTH_BAR "fim" LOWER_BLOCK "hole" FULLWIDTH_BAR ">",
      "<SUF>", LOWER_BLOCK "<SUF>", "<|code_suffix|>", "<|suffix|>"}, false},
    {{"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
     {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<" FULLWIDTH_BAR "fim" LOWER_BLOCK "end" FULLWIDTH_BAR ">",
      "<MID>", LOWER_BLOCK "<MID>", "<|code_middle|>", "<|middle|>"}, false},
    {{"tokenizer.ggml.fim_pad_token_id"}, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}, true},
    {{"tokenizer.ggml.fim_rep_token_id"}, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}, true},
    {{"tokenizer.ggml.fim_sep_token_id"}, {"<|file_sep|>"}, true},
};
enum { ROLE_EOT, ROLE_EOM, N_ROLES = sizeof roles / sizeof roles[0] };

/* Tokens that end generation whatever their role (the reference's list, matched by text). */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" FULLWIDTH_BAR "end" LOWER_BLOCK "of" LOWER_BLOCK "sentence" FULLWIDTH_BAR ">", "[e~[",
};

/* gpt-oss's channel markers, which the reference always renders and splits out (user-defined). */
static const char *const rendered_texts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};

static bool text_in(const char *s, size_t n, const char *const *list, size_t count) {
    for (size_t i = 0; i < count && list[i]; i++)
        if (strlen(list[i]) == n && memcmp(list[i], s, n) == 0) return true;
    return false;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xNN>" -> NN, else -1. */
static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void piece_of(const quill_tokenizer *t, int32_t id, char *dst, size_t *n) {
    const char *s = vocab_text(t, id);
    size_t len = t->text_len[id];
    size_t j = 0;
    switch (t->type[id]) {
    case QUILL_TOKEN_CONTROL: case QUILL_TOKEN_UNKNOWN: case QUILL_TOKEN_USER_DEFINED:
        memcpy(dst, s, len);
        j = len;
        break;
    case QUILL_TOKEN_NORMAL:
        if (t->kind == VOCAB_BPE && !t->spm_text) {
            j = bpe_decode_text(s, len, dst);
            break;
        }
        for (size_t i = 0; i < len;) {
            const char *m = memchr(s + i, '\xe2', len - i);
            size_t run = m ? (size_t)(m - (s + i)) : len - i;
            memcpy(dst + j, s + i, run);
            i += run;
            j += run;
            if (i == len) break;
            if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) { dst[j++] = ' '; i += 3; }
            else dst[j++] = s[i++];
        }
        break;
    case QUILL_TOKEN_BYTE:
        dst[j++] = (char)parse_byte_token(s, len);
        break;
    default:   /* UNDEFINED and UNUSED decode to nothing, as in the reference */
        break;
    }
    *n = j;
}

typedef struct {
    size_t len;
    int32_t id;
} by_len;

static int cmp_by_len(const void *a, const void *b) {
    const by_len *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static bool contains_ci(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        size_t k = 0;
        while (k < m) {
            char c = hay[i + k];
            if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
            if (c != needle[k]) break;
            k++;
        }
        if (k == m) return true;
    }
    return false;
}

void quill_tokenizer_free(quill_tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->score);
    free(t->type);
    free(t->flags);
    free(t->slots);
    free(t->special);
    free(t->special_group);
    free(t->group_first);
    free(t->group_slots);
    free(t->special_lens);
    bpe_free(t->bpe);
    free(t);
}

static quill_status load_vocab(const quill_gguf *g, quill_tokenizer *t, quill_error *err) {
    const char *path = gname(g);
    quill_gguf_value toks, scores, types;
    quill_status s = quill_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err);
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT, "%s: no vocabulary: metadata key 'tokenizer.ggml.tokens' is missing",
                          path);
    if (s) return s;
    if (toks.elem_type != QUILL_GGUF_STRING)
        return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.tokens is an array of %s, expected strings",
                          path, quill_gguf_type_name(toks.elem_type));
    if (toks.count == 0 || toks.count > INT32_MAX)
        return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries; expected 1 to %d",
                          path, (unsigned long long)toks.count, INT32_MAX);
    const int32_t n = (int32_t)toks.count;
    t->n_vocab = n;

    bool have_scores = false, have_types = false;
    s = quill_gguf_get_arr(g, "tokenizer.ggml.scores", &scores, err);
    if (s == QUILL_OK) {
        if (scores.elem_type != QUILL_GGUF_FLOAT32)
            return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.scores is an array of %s, expected f32",
                              path, quill_gguf_type_name(scores.elem_type));
        if (scores.count != toks.count)
            return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.scores has %llu entries but there are %d tokens",
                              path, (unsigned long long)scores.count, n);
        have_scores = true;
    } else if (s != QUILL_E_NOT_FOUND) {
        return s;
    }
    s = quill_gguf_get_arr(g, "tokenizer.ggml.token_type", &types, err);
    if (s == QUILL_OK) {
        switch (types.elem_type) {
        case QUILL_GGUF_UINT8: case QUILL_GGUF_INT8: case QUILL_GGUF_UINT16: case QUILL_GGUF_INT16:
        case QUILL_GGUF_UINT32: case QUILL_GGUF_INT32: case QUILL_GGUF_UINT64: case QUILL_GGUF_INT64:
            break;
        default:
            return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.token_type is an array of %s, expected i32",
                              path, quill_gguf_type_name(types.elem_type));
        }
        if (types.count != toks.count)
            return quill_fail(err, QUILL_E_FORMAT,
                              "%s: tokenizer.ggml.token_type has %llu entries but there are %d tokens", path,
                              (unsigned long long)types.count, n);
        have_types = true;
    } else if (s != QUILL_E_NOT_FOUND) {
        return s;
    }

    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->score = malloc((size_t)n * sizeof *t->score);
    t->type = malloc((size_t)n);
    t->flags = calloc((size_t)n, 1);
    const char **src = malloc((size_t)n * sizeof *src);
    if (!t->text_off || !t->text_len || !t->score || !t->type || !t->flags || !src) {
        free(src);
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for a vocabulary of %d tokens", path, n);
    }

    /* Pass 1: where each text is and how long it will be stored. The reference reads tokens as C
     * strings, so text after an embedded NUL is lost, and an empty token becomes "[EMPTY_<id>]". */
    uint64_t cur = 0;
    quill_gguf_value e;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!quill_gguf_array_next(&toks, &cur, &e)) {
            free(src);
            return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.tokens ends after %d of %d entries",
                              path, i, n);
        }
        const char *p = (const char *)e.data;
        size_t len = e.count;
        const char *nul = memchr(p, 0, len);
        if (nul) len = (size_t)(nul - p);
        if (len > MAX_TOKEN_BYTES) {
            free(src);
            return quill_fail(err, QUILL_E_FORMAT, "%s: token %d is %zu bytes long; no vocabulary has tokens over %u bytes",
                              path, i, len, MAX_TOKEN_BYTES);
        }
        src[i] = len ? p : NULL;
        t->text_len[i] = len ? len : (size_t)snprintf(NULL, 0, "[EMPTY_%d]", i);
        t->text_off[i] = total;
        total += t->text_len[i] + 1;
    }
    t->text = malloc(total);
    if (!t->text) {
        free(src);
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for %zu bytes of token text", path, total);
    }
    for (int32_t i = 0; i < n; i++) {
        char *d = t->text + t->text_off[i];
        if (src[i]) {
            memcpy(d, src[i], t->text_len[i]);
            d[t->text_len[i]] = 0;
        } else {
            quill_log(QUILL_LOG_WARN, "%s: token %d is empty; naming it [EMPTY_%d]", path, i, i);
            snprintf(d, t->text_len[i] + 1, "[EMPTY_%d]", i);
        }
    }
    free(src);

    /* The reader validated both arrays' extent; f32 elements are contiguous little-endian. */
    for (int32_t i = 0; i < n; i++) {
        t->score[i] = 0.0f;
        if (have_scores) {
            float d;
            memcpy(&d, scores.data + (size_t)i * 4, 4);
            if (isnan(d))
                return quill_fail(err, QUILL_E_FORMAT,
                                  "%s: tokenizer.ggml.scores[%d] is NaN; merge order would be undefined", path, i);
            /* +0 and -0 compare equal, so they must share one key in the merge queue. */
            t->score[i] = d == 0 ? 0.0f : d;
        }
    }
    cur = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t ty = QUILL_TOKEN_NORMAL;
        if (have_types && types.elem_type == QUILL_GGUF_INT32) {
            int32_t v;
            memcpy(&v, types.data + (size_t)i * 4, 4);
            ty = v;
        } else if (have_types && (!quill_gguf_array_next(&types, &cur, &e) || !quill_gguf_value_i64(&e, &ty))) {
            return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.token_type is unreadable at entry %d", path, i);
        }
        /* Unknown type numbers are UNDEFINED, as in the reference. */
        t->type[i] = (ty >= QUILL_TOKEN_UNDEFINED && ty <= QUILL_TOKEN_BYTE) ? (uint8_t)ty : QUILL_TOKEN_UNDEFINED;
        if (t->type[i] == QUILL_TOKEN_BYTE && parse_byte_token(vocab_text(t, i), t->text_len[i]) < 0) {
            char shown[64];
            printable(shown, sizeof shown, vocab_text(t, i), t->text_len[i]);
            return quill_fail(err, QUILL_E_FORMAT, "%s: token %d has type BYTE but its text '%s' is not of the form <0xNN>",
                              path, i, shown);
        }
    }
    return QUILL_OK;
}

static quill_status build_hash(quill_tokenizer *t, const char *path, quill_error *err) {
    uint32_t cap = 16;
    while (cap < (uint32_t)t->n_vocab * 2u && cap < (1u << 31)) cap <<= 1;
    t->slots = malloc((size_t)cap * sizeof *t->slots);
    if (!t->slots) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for the token hash", path);
    memset(t->slots, 0xff, (size_t)cap * sizeof *t->slots);
    t->slot_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = vocab_text(t, id);
        size_t n = t->text_len[id];
        uint32_t i = vocab_hash(s, n) & t->slot_mask;
        for (;; i = (i + 1) & t->slot_mask) {
            int32_t o = t->slots[i];
            if (o < 0) break;
            /* A text listed twice maps to its last id, as the reference's map assignment does. */
            if (t->text_len[o] == n && memcmp(vocab_text(t, o), s, n) == 0) break;
        }
        t->slots[i] = id;
    }
    return QUILL_OK;
}

/* An upper bound of piece_of's output: SPM pieces never grow, byte-level ones may (an unmapped
 * character becomes a marker naming its bytes, as in the reference). */
static size_t piece_bound(const quill_tokenizer *t, int32_t id) {
    if (t->kind == VOCAB_BPE && !t->spm_text && t->type[id] == QUILL_TOKEN_NORMAL)
        return bpe_decoded_size(vocab_text(t, id), t->text_len[id]);
    return t->text_len[id];
}

static quill_status build_pieces(quill_tokenizer *t, const char *path, quill_error *err) {
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) total += piece_bound(t, i);
    t->piece = malloc(total + 1);
    t->piece_off = malloc((size_t)t->n_vocab * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)t->n_vocab * sizeof *t->piece_len);
    if (!t->piece || !t->piece_off || !t->piece_len)
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for token pieces", path);
    size_t off = 0;
    t->max_piece = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n;
        piece_of(t, i, t->piece + off, &n);
        t->piece_off[i] = off;
        t->piece_len[i] = n;
        if (n > t->max_piece) t->max_piece = n;
        off += n;
    }
    return QUILL_OK;
}

static int32_t group_find(const quill_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = vocab_hash(s, n) & t->group_mask;; i = (i + 1) & t->group_mask) {
        int32_t g = t->group_slots[i];
        if (g < 0) return -1;
        int32_t id = t->special[t->group_first[g]];
        if (t->text_len[id] == n && memcmp(vocab_text(t, id), s, n) == 0) return g;
    }
}

/* Partitioning tries each special token in turn over the whole text; with thousands of them
 * (Gemma's vocabulary has thousands of user-defined tokens) that is what costs. This index lets one
 * pass over the text find which of them occur at all. */
static bool index_specials(quill_tokenizer *t) {
    int32_t n = t->n_special;
    t->special_group = malloc(((size_t)n + 1) * sizeof *t->special_group);
    t->group_first = malloc(((size_t)n + 1) * sizeof *t->group_first);
    t->special_lens = malloc(((size_t)n + 1) * sizeof *t->special_lens);
    uint32_t cap = 16;
    while (cap < (uint32_t)n * 2u) cap <<= 1;
    t->group_slots = malloc((size_t)cap * sizeof *t->group_slots);
    if (!t->special_group || !t->group_first || !t->special_lens || !t->group_slots) return false;
    memset(t->group_slots, 0xff, (size_t)cap * sizeof *t->group_slots);
    t->group_mask = cap - 1;
    for (int32_t k = 0; k < n; k++) {
        int32_t id = t->special[k];
        const char *s = vocab_text(t, id);
        size_t len = t->text_len[id];
        int32_t g = group_find(t, s, len);
        if (g < 0) {
            g = t->n_groups++;
            t->group_first[g] = k;
            uint32_t i = vocab_hash(s, len) & t->group_mask;
            while (t->group_slots[i] >= 0) i = (i + 1) & t->group_mask;
            t->group_slots[i] = g;
        }
        t->special_group[k] = g;
        t->special_starts[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
        bool seen = false;
        for (int l = 0; l < t->n_special_lens && !seen; l++) seen = t->special_lens[l] == len;
        if (!seen) t->special_lens[t->n_special_lens++] = len;
    }
    return true;
}

/* The reference adds the control attribute to tokens it recognizes by text. */
static void make_control(quill_tokenizer *t, int32_t id, const char *path) {
    if (is_type(t, id, QUILL_TOKEN_CONTROL)) return;
    quill_log(QUILL_LOG_WARN, "%s: token %d '%s' looks like a control token; treating it as one", path, id,
              vocab_text(t, id));
    t->type[id] = QUILL_TOKEN_CONTROL;
}

quill_status quill_tokenizer_load(const quill_gguf *g, quill_tokenizer **out, quill_error *err) {
    if (!g || !out) return quill_fail(err, QUILL_E_ARG, "quill_tokenizer_load: NULL argument");
    *out = NULL;
    const char *path = gname(g);
    const char *model;
    size_t model_len;
    quill_status s = quill_gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len, err);
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: metadata key 'tokenizer.ggml.model' is missing; the file has no tokenizer", path);
    if (s) return s;
    vocab_kind kind;
    const bool spm_text = model_len == 6 && memcmp(model, "gemma4", 6) == 0;
    if (model_len == 5 && memcmp(model, "llama", 5) == 0) {
        kind = VOCAB_SPM;
    } else if ((model_len == 4 && memcmp(model, "gpt2", 4) == 0) || spm_text) {
        kind = VOCAB_BPE;
    } else {
        char shown[80];
        printable(shown, sizeof shown, model, model_len);
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: tokenizer model '%s' is not supported; quill implements the SentencePiece "
                          "'llama', the byte-level BPE 'gpt2' and Gemma 4's 'gemma4' tokenizers", path, shown);
    }

    quill_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", path);
    t->kind = kind;
    s = load_vocab(g, t, err);
    if (!s) s = build_hash(t, path, err);
    if (s) {
        quill_tokenizer_free(t);
        return s;
    }
    const int32_t n = t->n_vocab;

    for (int b = 0; b < 256; b++) {
        char buf[7];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        int32_t id = vocab_lookup(t, buf, 6);
        if (id < 0) {
            /* The reference falls back to the byte itself as a one-character token. */
            char c = (char)b;
            id = vocab_lookup(t, &c, 1);
        }
        t->byte_tok[b] = id;
    }

    /* Defaults of the reference for each kind of vocabulary (ids it does not have are disabled),
     * then what the pre-tokenizer implies, then whatever the metadata says. */
    if (kind == VOCAB_SPM) {
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else {
        t->bos = 11;
        t->eos = 11;
        t->unk = -1;
        t->add_bos = false;
        t->add_space_prefix = false;
    }
    if (spm_text) t->bos = t->eos = -1; /* (the reference's gemma4 defaults: only the metadata's ids) */
    if (t->bos >= n) t->bos = -1;
    if (t->eos >= n) t->eos = -1;
    t->pad = -1;
    t->add_eos = false;
    if (kind == VOCAB_BPE) {
        s = bpe_load(g, t, spm_text, err);
        if (s) {
            quill_tokenizer_free(t);
            return s;
        }
    }
    int32_t sep = -1, mask = -1, role_id[N_ROLES];
    for (int r = 0; r < N_ROLES; r++) role_id[r] = -1;
    struct { const char *key; int32_t *id; } ids[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos},      {"tokenizer.ggml.eos_token_id", &t->eos},
        {"tokenizer.ggml.unknown_token_id", &t->unk},  {"tokenizer.ggml.seperator_token_id", &sep},
        {"tokenizer.ggml.padding_token_id", &t->pad},  {"tokenizer.ggml.mask_token_id", &mask},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0] && !s; i++) s = read_id(g, ids[i].key, n, ids[i].id, err);
    for (int r = 0; r < N_ROLES && !s; r++)
        for (int k = 0; k < 2 && roles[r].keys[k] && !s; k++) s = read_id(g, roles[r].keys[k], n, &role_id[r], err);
    if (!s) s = read_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
    if (!s) s = read_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err);
    if (!s) s = read_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
    if (t->spm_text) t->add_bos = true; /* (the reference's override for gemma4) */
    if (s) {
        quill_tokenizer_free(t);
        return s;
    }

    /* Roles found by text. Only the id a text maps to counts (the reference walks its text->id
     * map); among several candidates for one role the lowest id wins. */
    int32_t eog_end = -1, eog_s = -1;
    bool eog_return = false, eog_call = false, eog_flush = false, eog_tool_response = false;
    for (int32_t id = 0; id < n; id++) {
        const char *txt = vocab_text(t, id);
        size_t len = t->text_len[id];
        /* every listed text starts with one of these */
        if (len < 3 || !strchr("<[_\xe2", txt[0]) || vocab_lookup(t, txt, len) != id) continue;
        for (int r = 0; r < N_ROLES; r++) {
            if (role_id[r] >= 0 || !text_in(txt, len, roles[r].texts, 12)) continue;
            role_id[r] = id;
            make_control(t, id, path);
        }
        if (text_in(txt, len, eog_texts, sizeof eog_texts / sizeof eog_texts[0])) {
            t->flags[id] |= F_EOG;
            make_control(t, id, path);
            if (strcmp(txt, "<|end|>") == 0) eog_end = id;
            else if (strcmp(txt, "</s>") == 0) eog_s = id;
            else if (strcmp(txt, "<|return|>") == 0) eog_return = true;
            else if (strcmp(txt, "<|call|>") == 0 || strcmp(txt, "<|calls|>") == 0) eog_call = true;
            else if (strcmp(txt, "<|flush|>") == 0) eog_flush = true;
            else if (strcmp(txt, "<|tool_response>") == 0) eog_tool_response = true;
        }
        if (text_in(txt, len, rendered_texts, sizeof rendered_texts / sizeof rendered_texts[0]))
            t->type[id] = QUILL_TOKEN_USER_DEFINED;
    }
    t->eot = role_id[ROLE_EOT];
    t->eom = role_id[ROLE_EOM];
    for (int r = 0; r < N_ROLES; r++)
        if (roles[r].eog && role_id[r] >= 0) t->flags[role_id[r]] |= F_EOG;
    if (t->eos >= 0) t->flags[t->eos] |= F_EOG;
    /* The reference's exceptions: in o200k-harmony / solar-open vocabularies <|end|> ends a message,
     * not the generation; with Gemma 4's <|tool_response>, </s> is ordinary text. */
    if (eog_end >= 0 && ((eog_return && eog_call) || (eog_call && eog_flush))) {
        t->flags[eog_end] &= (uint8_t)~F_EOG;
        t->type[eog_end] = QUILL_TOKEN_USER_DEFINED;
    }
    if (eog_s >= 0 && eog_tool_response) {
        t->flags[eog_s] &= (uint8_t)~F_EOG;
        t->type[eog_s] = QUILL_TOKEN_NORMAL;
    }

    by_len *order = malloc((size_t)n * sizeof *order);
    t->special = malloc((size_t)n * sizeof *t->special);
    if (!order || !t->special) {
        free(order);
        quill_tokenizer_free(t);
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", path);
    }
    for (int32_t id = 0; id < n; id++)
        if (is_type(t, id, QUILL_TOKEN_CONTROL) || is_type(t, id, QUILL_TOKEN_USER_DEFINED) ||
            is_type(t, id, QUILL_TOKEN_UNKNOWN))
            order[t->n_special++] = (by_len){t->text_len[id], id};
    /* The reference's std::sort by length alone is unstable; ties only matter for two different
     * texts of equal length overlapping in the input, and ascending id is the natural order. */
    qsort(order, (size_t)t->n_special, sizeof *order, cmp_by_len);
    for (int32_t i = 0; i < t->n_special; i++) t->special[i] = order[i].id;
    free(order);
    if (!index_specials(t)) {
        quill_tokenizer_free(t);
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", path);
    }

    /* Phi-3 (an SPM vocabulary) eats the whitespace after its special tokens; the reference
     * keys this on the model name, since GGUF has no per-token strip attributes. */
    const char *name;
    size_t name_len;
    if (quill_gguf_get_str(g, "general.name", &name, &name_len, NULL) == QUILL_OK) {
        bool phi3 = contains_ci(name, name_len, "phi-3") || contains_ci(name, name_len, "phi3");
        if (phi3) {
            for (int32_t i = 0; i < t->n_special; i++) t->flags[t->special[i]] |= F_RSTRIP;
            int32_t id = vocab_lookup(t, "</s>", 4);
            if (id >= 0) t->flags[id] |= F_RSTRIP;
            static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (int k = 0; k < 3; k++)
                if ((id = vocab_lookup(t, keep[k], strlen(keep[k]))) >= 0) t->flags[id] &= (uint8_t)~F_RSTRIP;
        }
    }

    t->word_split = kind == VOCAB_SPM;
    for (int32_t id = 0; id < n && t->word_split; id++) {
        const char *p = vocab_text(t, id);
        size_t len = t->text_len[id];
        for (size_t k = 1; k < len; k++) {
            const char *q = memchr(p + k, '\xe2', len - k);
            if (!q) break;
            k = (size_t)(q - p);
            if (k + 3 <= len && memcmp(q, "\xe2\x96\x81", 3) == 0 && (k < 3 || memcmp(q - 3, "\xe2\x96\x81", 3) != 0)) {
                t->word_split = false;
                break;
            }
        }
    }

    s = build_pieces(t, path, err);
    if (s) {
        quill_tokenizer_free(t);
        return s;
    }
    *out = t;
    return QUILL_OK;
}

/* ---------------------------------------------------------------- accessors */

static bool valid_id(const quill_tokenizer *t, int32_t id) { return t && id >= 0 && id < t->n_vocab; }

int32_t quill_tokenizer_n_vocab(const quill_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t quill_tokenizer_bos(const quill_tokenizer *t) { return t ? t->bos : -1; }
int32_t quill_tokenizer_eos(const quill_tokenizer *t) { return t ? t->eos : -1; }
bool quill_tokenizer_add_bos(const quill_tokenizer *t) { return t && t->add_bos; }
bool quill_tokenizer_add_eos(const quill_tokenizer *t) { return t && t->add_eos; }
bool quill_tokenizer_is_eog(const quill_tokenizer *t, int32_t id) { return valid_id(t, id) && (t->flags[id] & F_EOG); }
int quill_tokenizer_token_type(const quill_tokenizer *t, int32_t id) { return valid_id(t, id) ? t->type[id] : -1; }
const char *quill_tokenizer_piece(const quill_tokenizer *t, int32_t id) {
    return valid_id(t, id) ? vocab_text(t, id) : NULL;
}

/* ---------------------------------------------------------------- encoding */

/* A stretch of the input: raw text still to be tokenized, or a special token already found. */
typedef struct {
    size_t off, len;
    int32_t tok;        /* -1 for raw text */
} frag;

typedef struct {
    frag *v;
    size_t n, cap;
} fvec;

static bool fvec_push(fvec *a, size_t off, size_t len, int32_t tok) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        frag *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (frag){off, len, tok};
    return true;
}

static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0 || m > n) return NULL;
    const char *end = hay + (n - m);
    for (const char *p = hay; p <= end;) {
        p = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, m) == 0) return p;
        p++;
    }
    return NULL;
}

static bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* The reference's tokenizer_st_partition: each special token in turn (longest first) splits every
 * raw fragment at each of its occurrences, so a longer token wins over a shorter one inside it. */
static bool partition(const quill_tokenizer *t, const char *text, size_t len, bool parse_special, fvec *frags) {
    fvec next = {0};
    if (len && !fvec_push(frags, 0, len, -1)) return false;
    if (!len || !t->n_special) return true;
    uint8_t *hit = calloc((size_t)t->n_groups, 1);
    if (!hit) return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (!(t->special_starts[c >> 3] & (1u << (c & 7)))) continue;
        for (int l = 0; l < t->n_special_lens; l++) {
            size_t sl = t->special_lens[l];
            int32_t g = sl <= len - i ? group_find(t, text + i, sl) : -1;
            if (g >= 0) hit[g] = 1;
        }
    }
    for (int32_t k = 0; k < t->n_special && frags->n; k++) {
        int32_t id = t->special[k];
        /* User-defined tokens are split out even without parse_special, like HF tokenizers do. */
        if (!parse_special && !is_type(t, id, QUILL_TOKEN_USER_DEFINED)) continue;
        if (!hit[t->special_group[k]]) continue;
        const char *st = vocab_text(t, id);
        size_t sl = t->text_len[id];
        bool any = false;
        for (size_t f = 0; f < frags->n && !any; f++)
            any = frags->v[f].tok < 0 && find_bytes(text + frags->v[f].off, frags->v[f].len, st, sl);
        if (!any) continue;
        next.n = 0;
        for (size_t f = 0; f < frags->n; f++) {
            frag fr = frags->v[f];
            if (fr.tok >= 0) {
                if (!fvec_push(&next, fr.off, fr.len, fr.tok)) goto oom;
                continue;
            }
            size_t off = fr.off, rem = fr.len;
            while (rem) {
                const char *m = find_bytes(text + off, rem, st, sl);
                if (!m) {
                    if (!fvec_push(&next, off, rem, -1)) goto oom;
                    break;
                }
                size_t at = (size_t)(m - text);
                size_t left = at - off;
                if (t->flags[id] & F_LSTRIP)
                    while (left && is_c_space(text[off + left - 1])) left--;
                if (left && !fvec_push(&next, off, left, -1)) goto oom;
                if (!fvec_push(&next, at, sl, id)) goto oom;
                size_t end = off + rem;
                off = at + sl;
                rem = end - off;
                if (t->flags[id] & F_RSTRIP)
                    while (rem && is_c_space(text[off])) { off++; rem--; }
            }
        }
        fvec tmp = *frags;
        *frags = next;
        next = tmp;
    }
    free(next.v);
    free(hit);
    return true;
oom:
    free(next.v);
    free(hit);
    return false;
}
quill_status quill_tokenize(const quill_tokenizer *t, const char *text, size_t len, bool add_special,
                            bool parse_special, int32_t **tokens, size_t *n_tokens, quill_error *err) {
    if (!t || !tokens || !n_tokens || (!text && len))
        return quill_fail(err, QUILL_E_ARG, "quill_tokenize: NULL argument");
    *tokens = NULL;
    *n_tokens = 0;
    if (len > MAX_TEXT_BYTES)
        return quill_fail(err, QUILL_E_ARG, "quill_tokenize: text of %zu bytes is too long (at most %zu)", len,
                          MAX_TEXT_BYTES);
    if (add_special && t->add_bos && t->bos < 0)
        return quill_fail(err, QUILL_E_FORMAT, "the model asks for a BOS token (add_bos_token) but has none");
    if (add_special && t->add_eos && t->eos < 0)
        return quill_fail(err, QUILL_E_FORMAT, "the model asks for an EOS token (add_eos_token) but has none");

    quill_status s = QUILL_OK;
    ivec out = {0};
    fvec frags = {0};
    spm_scratch *scratch = NULL;
    if (!partition(t, text, len, parse_special, &frags)) goto oom;
    if (t->kind == VOCAB_SPM && !(scratch = spm_scratch_new())) goto oom;

    bool prev_special = true;   /* the text's start counts as following a special token */
    if (add_special && t->add_bos && !ivec_push(&out, t->bos)) goto oom;
    for (size_t f = 0; f < frags.n && !s; f++) {
        const frag *fr = &frags.v[f];
        if (fr->tok >= 0) {
            if (!ivec_push(&out, fr->tok)) goto oom;
            prev_special = true;
        } else if (t->kind == VOCAB_SPM) {
            s = spm_fragment(t, scratch, text + fr->off, fr->len, t->add_space_prefix && prev_special, &out, err);
            prev_special = false;
        } else {
            s = bpe_fragment(t, text + fr->off, fr->len, &out, err);
        }
    }
    if (!s && add_special && t->add_eos && !ivec_push(&out, t->eos)) goto oom;
    if (!s && !out.v && !(out.v = malloc(sizeof *out.v))) goto oom;   /* *tokens is never NULL on success */
    free(frags.v);
    spm_scratch_free(scratch);
    if (s) {
        free(out.v);
        return s;
    }
    *tokens = out.v;
    *n_tokens = out.n;
    return QUILL_OK;
oom:
    free(out.v);
    free(frags.v);
    spm_scratch_free(scratch);
    return quill_fail(err, QUILL_E_NOMEM, "out of memory while tokenizing %zu bytes", len);
}

/* ---------------------------------------------------------------- decoding */

static bool hidden(const quill_tokenizer *t, int32_t id, bool render_special) {
    return !render_special && (is_type(t, id, QUILL_TOKEN_CONTROL) || is_type(t, id, QUILL_TOKEN_UNKNOWN));
}

int quill_token_to_bytes(const quill_tokenizer *t, int32_t id, bool render_special, char *buf, size_t cap) {
    if (!valid_id(t, id)) return -1;
    if (hidden(t, id, render_special)) return 0;
    size_t n = t->piece_len[id];
    if (buf) memcpy(buf, t->piece + t->piece_off[id], n < cap ? n : cap);
    return (int)n;
}

void quill_detokenizer_init(quill_detokenizer *d, const quill_tokenizer *t, bool render_special, bool text_start) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->render_special = render_special;
    d->at_start = text_start && t && t->add_space_prefix;
}

typedef struct {
    char *out;
    size_t cap, n;
    bool full;
} sink;

/* Whole characters only: once one does not fit, the rest of this call's output is dropped rather
 * than emitted out of order. Only a hostile vocabulary (pieces of hundreds of bytes) gets here
 * with cap >= 256. */
static void put(sink *k, const void *p, size_t n) {
    if (k->full || n > k->cap - k->n) {
        k->full = true;
        return;
    }
    memcpy(k->out + k->n, p, n);
    k->n += n;
}

static const char replacement[3] = {'\xef', '\xbf', '\xbd'};

static int utf8_need(unsigned char lead) {
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

/* One byte through a strict UTF-8 validator. The reference renders every byte of an invalid or
 * cut-off sequence as its own U+FFFD (its golden texts show "E1 BB <space>" as two), rather than
 * one per maximal subpart as Python does; strictness (no overlongs, surrogates or values past
 * U+10FFFF) keeps the output valid UTF-8 where the reference's lax decoder would not. */
static void feed(quill_detokenizer *d, sink *k, unsigned char b) {
    for (;;) {
        if (d->n_pending == 0) {
            if (b < 0x80) put(k, &b, 1);
            else if (utf8_need(b)) d->pending[d->n_pending++] = b;
            else put(k, replacement, 3);
            return;
        }
        unsigned char lead = d->pending[0], lo = 0x80, hi = 0xBF;
        if (d->n_pending == 1) {
            if (lead == 0xE0) lo = 0xA0;         /* overlong */
            else if (lead == 0xED) hi = 0x9F;    /* surrogates */
            else if (lead == 0xF0) lo = 0x90;    /* overlong */
            else if (lead == 0xF4) hi = 0x8F;    /* beyond U+10FFFF */
        }
        if (b >= lo && b <= hi) {
            d->pending[d->n_pending++] = b;
            if (d->n_pending == utf8_need(lead)) {
                put(k, d->pending, (size_t)d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        for (int i = 0; i < d->n_pending; i++) put(k, replacement, 3);
        d->n_pending = 0;   /* and look at b again as the start of something new */
    }
}

size_t quill_detokenizer_push(quill_detokenizer *d, int32_t id, char *out, size_t cap) {
    if (!d || !valid_id(d->tok, id)) return 0;
    const quill_tokenizer *t = d->tok;
    bool strip = d->at_start;
    /* Like the reference's detokenize: only the very first token may lose a space, even when it
     * renders as nothing. */
    d->at_start = false;
    if (hidden(t, id, d->render_special)) return 0;
    const unsigned char *p = (const unsigned char *)t->piece + t->piece_off[id];
    size_t n = t->piece_len[id];
    if (strip && n && p[0] == ' ') { p++; n--; }
    sink k = {out, out ? cap : 0, 0, false};
    for (size_t i = 0; i < n; i++) feed(d, &k, p[i]);
    return k.n;
}

size_t quill_detokenizer_flush(quill_detokenizer *d, char *out, size_t cap) {
    if (!d) return 0;
    sink k = {out, out ? cap : 0, 0, false};
    for (int i = 0; i < d->n_pending; i++) put(&k, replacement, 3);
    d->n_pending = 0;
    return k.n;
}

