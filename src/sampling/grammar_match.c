/* Running a grammar over tokens: the matcher's state, which tokens may come next, and the
 * sampler stage built on them.
 *
 * A state is a sorted set of hash-consed stacks (see grammar.c) plus the bytes of a UTF-8
 * character begun by the last token and not yet complete. Which tokens may come next is found
 * by walking a trie of the vocabulary's texts (built once per vocabulary and shared): a branch is
 * abandoned at the first byte no stack accepts, so the cost follows the tokens that fit, not the
 * vocabulary's size, and tokens sharing a prefix share its work. The masks of the last states
 * are cached by state: in the middle of a JSON string, or between the items of a list, the
 * state comes back token after token and its mask is a lookup. The plain version (each token's
 * text fed on its own, quill_grammar_matcher_mask_plain) gives the same mask; the tests compare
 * the two.
 *
 * End of generation is allowed exactly when an empty stack is in the set (the text is complete)
 * and no character is half-written, as in the reference (a token element naming an
 * end-of-generation token never matches); tokens without text (control tokens) only through a
 * token element of the grammar. */
#include "sampling/grammar_internal.h"
#include "base/strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    TRIE_MAX_LEN = 128,          /* longer token texts are checked one by one */
    MAX_NODES = 1 << 23,         /* stacks a matcher may create: a runaway grammar stops here */
    MAX_SET = 1 << 20,           /* stacks alive at once while advancing */
    N_CACHE = 16,
    EXPAND_DEPTH = 4096,
    MAX_MEMO = 1 << 24,          /* stacks kept in expansion memos */
    MEMO_SET = 16,               /* sets of more stacks advance without the memos */
};

#define NO_MEMO UINT32_MAX

/* ---------------------------------------------------------------- the vocabulary's texts */

typedef struct tnode {
    uint32_t skip;               /* the index after this node's subtree (preorder) */
    uint32_t tok_first, tok_n;   /* tokens whose text ends here: order[tok_first ..] */
    uint8_t byte;
} tnode;

struct quill_grammar_vocab {
    int32_t n_vocab;
    uint32_t *off, *len;
    unsigned char *bytes;
    uint8_t *eog;
    int32_t *eog_ids;
    size_t n_eog;
    tnode *trie;
    size_t n_trie;
    int32_t *order;              /* tokens in the trie, sorted by text */
    int32_t *long_ids;           /* texts longer than TRIE_MAX_LEN */
    size_t n_long;
    const quill_tokenizer *tok;
};

static const struct quill_grammar_vocab *sort_vocab;   /* qsort has no context argument */

static int by_text(const void *a, const void *b) {
    const struct quill_grammar_vocab *v = sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void quill_grammar_vocab_free(quill_grammar_vocab *v) {
    if (!v) return;
    free(v->off), free(v->len), free(v->bytes), free(v->eog), free(v->eog_ids);
    free(v->trie), free(v->order), free(v->long_ids);
    free(v);
}

quill_status quill_grammar_vocab_new(const quill_tokenizer *tok, quill_grammar_vocab **out, quill_error *err) {
    if (!out) return quill_fail(err, QUILL_E_ARG, "grammar vocabulary: `out` must not be NULL");
    *out = NULL;
    if (!tok) return quill_fail(err, QUILL_E_ARG, "grammar vocabulary: no tokenizer given");
    const int32_t n = quill_tokenizer_n_vocab(tok);
    quill_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return quill_fail(err, QUILL_E_NOMEM, "grammar vocabulary: out of memory");
    v->n_vocab = n;
    v->tok = tok;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        int l = quill_token_to_bytes(tok, i, false, NULL, 0);
        total += l > 0 ? (size_t)l : 0;
    }
    v->off = malloc((size_t)n * sizeof *v->off);
    v->len = malloc((size_t)n * sizeof *v->len);
    v->bytes = malloc(total + 1);
    v->eog = calloc((size_t)n, 1);
    v->eog_ids = malloc((size_t)n * sizeof *v->eog_ids);
    v->order = malloc((size_t)n * sizeof *v->order);
    v->long_ids = malloc((size_t)n * sizeof *v->long_ids);
    v->trie = malloc((total + 1) * sizeof *v->trie);
    if (!v->off || !v->len || !v->bytes || !v->eog || !v->eog_ids || !v->order || !v->long_ids || !v->trie) {
        quill_grammar_vocab_free(v);
        return quill_fail(err, QUILL_E_NOMEM, "grammar vocabulary: out of memory for %d tokens", (int)n);
    }
    size_t at = 0, n_order = 0;
    for (int32_t i = 0; i < n; i++) {
        int l = quill_token_to_bytes(tok, i, false, (char *)v->bytes + at, total - at);
        if (l < 0) l = 0;
        v->off[i] = (uint32_t)at;
        v->len[i] = (uint32_t)l;
        at += (size_t)l;
        if (quill_tokenizer_is_eog(tok, i)) {
            v->eog[i] = 1;
            v->eog_ids[v->n_eog++] = i;
        } else if (l > TRIE_MAX_LEN) {
            v->long_ids[v->n_long++] = i;
        } else if (l > 0) {
            v->order[n_order++] = i;
        }
    }
    sort_vocab = v;
    qsort(v->order, n_order, sizeof *v->order, by_text);
    sort_vocab = NULL;
    /* the trie in preorder, from the sorted texts: a text's nodes follow its longest common
     * prefix with the previous one */
    uint32_t path[TRIE_MAX_LEN + 1];
    size_t depth = 0;
    v->trie[0] = (tnode){0, 0, 0, 0};
    v->n_trie = 1;
    path[0] = 0;
    for (size_t k = 0; k < n_order; k++) {
        int32_t t = v->order[k];
        const unsigned char *s = v->bytes + v->off[t];
        size_t l = v->len[t], common = 0;
        if (k > 0) {
            int32_t p = v->order[k - 1];
            const unsigned char *ps = v->bytes + v->off[p];
            size_t pl = v->len[p];
            while (common < l && common < pl && common < depth && s[common] == ps[common]) common++;
        }
        for (size_t d = depth; d > common; d--) v->trie[path[d]].skip = (uint32_t)v->n_trie;
        depth = common;
        for (size_t d = common; d < l; d++) {
            v->trie[v->n_trie] = (tnode){0, 0, 0, s[d]};
            path[d + 1] = (uint32_t)v->n_trie++;
        }
        depth = l;
        tnode *end = &v->trie[path[l]];
        if (end->tok_n == 0) end->tok_first = (uint32_t)k;
        end->tok_n++;
    }
    for (size_t d = depth; d > 0; d--) v->trie[path[d]].skip = (uint32_t)v->n_trie;
    v->trie[0].skip = (uint32_t)v->n_trie;
    *out = v;
    return QUILL_OK;
}

/* ---------------------------------------------------------------- the matcher */

typedef struct snode {
    uint32_t pos, next;          /* where to continue; the rest of the stack (0: nothing) */
} snode;

typedef struct cache_entry {
    uint32_t *key;
    size_t n_key, cap_key;
    uint32_t pv;
    int remain, len;
    uint64_t *bits;
    uint64_t used;               /* 0: empty */
} cache_entry;

struct quill_grammar_matcher {
    const quill_grammar *g;
    const quill_grammar_vocab *v;
    snode *nodes;                /* nodes[0] is unused: index 0 is the empty stack */
    size_t n_nodes, cap_nodes;
    uint32_t *seen;              /* per node: the stamp of the last expansion that opened it */
    uint32_t stamp;
    /* Per node, memos of pure functions of it (nodes never change): the stack after its top
     * terminal (NO_MEMO: not known yet), and its expansion as exp_out[exp_first ..][.. exp_n]. */
    uint32_t *succ, *exp_first, *exp_n;
    uint32_t *exp_out;
    size_t n_exp_out, cap_exp_out;
    uint32_t *table;             /* hash of (pos, next) -> node; 0: free slot */
    size_t table_cap;
    uint32_t *cur;               /* the state: sorted stacks */
    size_t n_cur, cap_cur;
    uint32_t pv;                 /* a character begun: its bits so far, bytes still to come, its length */
    int remain, len;
    uint32_t *scratch;           /* sets while advancing, as ranges of indices */
    size_t n_scratch, cap_scratch;
    bool broken;
    quill_error why;
    cache_entry cache[N_CACHE];
    uint64_t tick;
    size_t words;                /* 64-bit words of a mask */
};

static bool grow_u32(uint32_t **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    uint32_t *q = realloc(*p, c * sizeof *q);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void breakdown(quill_grammar_matcher *m, const char *msg) {
    if (m->broken) return;
    m->broken = true;
    quill_fail(&m->why, QUILL_E_NOMEM, "grammar: %s", msg);
}

static inline uint32_t hash2(uint32_t a, uint32_t b) {
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

/* The node (pos, next), made once. 0 when out of room. */
static uint32_t intern(quill_grammar_matcher *m, uint32_t pos, uint32_t next) {
    if (m->n_nodes * 2 >= m->table_cap) {
        if (m->n_nodes >= MAX_NODES) {
            breakdown(m, "the grammar's parse state grew past its limit (an ambiguous or runaway grammar)");
            return 0;
        }
        size_t cap = m->table_cap ? m->table_cap * 2 : 4096;
        uint32_t *t = calloc(cap, sizeof *t);
        if (!t) {
            breakdown(m, "out of memory for the parse state");
            return 0;
        }
        for (size_t i = 1; i < m->n_nodes; i++) {
            size_t h = hash2(m->nodes[i].pos, m->nodes[i].next) & (cap - 1);
            while (t[h]) h = (h + 1) & (cap - 1);
            t[h] = (uint32_t)i;
        }
        free(m->table);
        m->table = t;
        m->table_cap = cap;
    }
    size_t h = hash2(pos, next) & (m->table_cap - 1);
    for (; m->table[h]; h = (h + 1) & (m->table_cap - 1)) {
        const snode *n = &m->nodes[m->table[h]];
        if (n->pos == pos && n->next == next) return m->table[h];
    }
    if (m->n_nodes == m->cap_nodes) {
        size_t cap = m->cap_nodes * 2;
        snode *q = realloc(m->nodes, cap * sizeof *q);
        if (q) m->nodes = q;
        uint32_t *seen = q ? realloc(m->seen, cap * sizeof *seen) : NULL;
        if (!q || !seen) {
            breakdown(m, "out of memory for the parse state");
            return 0;
        }
        memset(seen + m->cap_nodes, 0, (cap - m->cap_nodes) * sizeof *seen);
        m->seen = seen;
        uint32_t *memo[3] = {m->succ, m->exp_first, m->exp_n};
        for (int k = 0; k < 3; k++) {
            uint32_t *grown = realloc(memo[k], cap * sizeof *grown);
            if (!grown) {
                breakdown(m, "out of memory for the parse state");
                return 0;
            }
            memset(grown + m->cap_nodes, 0xFF, (cap - m->cap_nodes) * sizeof *grown);
            memo[k] = grown;
            if (k == 0) m->succ = grown;
            else if (k == 1) m->exp_first = grown;
            else m->exp_n = grown;
        }
        m->cap_nodes = cap;
    }
    m->nodes[m->n_nodes] = (snode){pos, next};
    m->table[h] = (uint32_t)m->n_nodes;
    return (uint32_t)m->n_nodes++;
}

static bool push_scratch(quill_grammar_matcher *m, uint32_t x) {
    if (m->n_scratch >= MAX_SET) {
        breakdown(m, "the grammar is too ambiguous (too many parses at once)");
        return false;
    }
    if (!grow_u32(&m->scratch, &m->cap_scratch, m->n_scratch + 1)) {
        breakdown(m, "out of memory for the parse state");
        return false;
    }
    m->scratch[m->n_scratch++] = x;
    return true;
}

/* The stack that continues at pos (after an element) with `next` below. */
static uint32_t after(quill_grammar_matcher *m, uint32_t pos, uint32_t next) {
    return m->g->elems[pos].kind == G_END ? next : intern(m, pos, next);
}

/* A new expansion: nodes opened before count as unopened again. */
static void new_stamp(quill_grammar_matcher *m) {
    if (++m->stamp == 0) {
        memset(m->seen, 0, m->cap_nodes * sizeof *m->seen);
        m->stamp = 1;
    }
}

/* Appends to scratch the stacks `stack` stands for once every rule on its top is opened: their
 * tops are terminals, or they are empty (0). A node already opened in this expansion (a stamp)
 * adds nothing new: nodes are hash-consed, so the same node gives the same stacks. Without this,
 * nullable repetitions ((x?){0,300}) would open exponentially many paths to the same stacks. */
static void expand(quill_grammar_matcher *m, uint32_t stack, int depth) {
    if (m->broken) return;
    if (depth > EXPAND_DEPTH) {
        breakdown(m, "rules nest too deep");
        return;
    }
    if (stack == 0) {
        push_scratch(m, 0);
        return;
    }
    if (m->seen[stack] == m->stamp) return;
    m->seen[stack] = m->stamp;
    const snode n = m->nodes[stack];
    const gelem e = m->g->elems[n.pos];
    if (e.kind == G_RULE) {
        const grule *r = &m->g->rules[e.value];
        uint32_t base = after(m, n.pos + 1, n.next);
        if (m->broken) return;
        for (uint32_t a = 0; a < r->n_alts && !m->broken; a++) {
            uint32_t start = m->g->alts[r->first_alt + a];
            if (m->g->elems[start].kind == G_END) expand(m, base, depth + 1);
            else {
                uint32_t s = intern(m, start, base);
                if (s) expand(m, s, depth + 1);
            }
        }
    } else if (e.kind == G_END) {
        expand(m, n.next, depth + 1);
    } else {
        push_scratch(m, stack);
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts scratch[start..) and drops duplicates. */
static void normalize(quill_grammar_matcher *m, size_t start) {
    uint32_t *s = m->scratch + start;
    size_t n = m->n_scratch - start;
    if (n < 2) return;
    if (n <= 16) {
        for (size_t i = 1; i < n; i++) {
            uint32_t x = s[i];
            size_t j = i;
            for (; j > 0 && s[j - 1] > x; j--) s[j] = s[j - 1];
            s[j] = x;
        }
    } else {
        qsort(s, n, sizeof *s, cmp_u32);
    }
    size_t k = 1;
    for (size_t i = 1; i < n; i++)
        if (s[i] != s[k - 1]) s[k++] = s[i];
    m->n_scratch = start + k;
}

static bool class_has(const quill_grammar *g, uint32_t cls, uint32_t cp) {
    const gclass *c = &g->classes[cls];
    const cp_range *r = g->ranges + c->first;
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return !c->negated;
    }
    return c->negated;
}

/* Whether the class holds a code point in [lo, hi]. */
static bool class_meets(const quill_grammar *g, uint32_t cls, uint32_t lo, uint32_t hi) {
    const gclass *c = &g->classes[cls];
    const cp_range *r = g->ranges + c->first;
    for (uint32_t i = 0; i < c->n; i++) {
        bool overlap = r[i].lo <= hi && lo <= r[i].hi;
        if (!c->negated && overlap) return true;
        if (c->negated && r[i].lo <= lo && hi <= r[i].hi) return false;   /* merged: one range covers it */
    }
    return c->negated;
}

/* Appends expand(stack) to scratch through the node's memo (computed on first use). */
static void expand_memo(quill_grammar_matcher *m, uint32_t stack) {
    if (stack == 0) {
        push_scratch(m, 0);
        return;
    }
    if (m->exp_first[stack] == NO_MEMO) {
        size_t mark = m->n_scratch;
        new_stamp(m);
        expand(m, stack, 0);
        normalize(m, mark);
        size_t n = m->n_scratch - mark;
        if (m->broken || m->n_exp_out + n > MAX_MEMO || !grow_u32(&m->exp_out, &m->cap_exp_out, m->n_exp_out + n))
            return;   /* the stacks are in scratch; only the memo is skipped */
        memcpy(m->exp_out + m->n_exp_out, m->scratch + mark, n * sizeof *m->exp_out);
        m->exp_first[stack] = (uint32_t)m->n_exp_out;
        m->exp_n[stack] = (uint32_t)n;
        m->n_exp_out += n;
        return;
    }
    const uint32_t first = m->exp_first[stack], n = m->exp_n[stack];
    if (m->n_scratch + n > MAX_SET) {
        breakdown(m, "the grammar is too ambiguous (too many parses at once)");
        return;
    }
    if (!grow_u32(&m->scratch, &m->cap_scratch, m->n_scratch + n)) {
        breakdown(m, "out of memory for the parse state");
        return;
    }
    memcpy(m->scratch + m->n_scratch, m->exp_out + first, n * sizeof *m->scratch);
    m->n_scratch += n;
}

/* The stacks of [s, e) advanced by code point cp, appended to scratch; returns where they start.
 * What follows a stack's top terminal, and that stack's expansion, are looked up in the nodes'
 * memos: inside a JSON string the same few stacks take every character of every token. */
static size_t advance_cp(quill_grammar_matcher *m, size_t s, size_t e, uint32_t cp) {
    size_t start = m->n_scratch;
    if (e - s > MEMO_SET) {
        /* many stacks at once (an ambiguous grammar): one expansion that opens each node once
         * for all of them costs less than their memos, which would repeat what they share */
        new_stamp(m);
        for (size_t i = s; i < e && !m->broken; i++) {
            uint32_t st = m->scratch[i];
            if (!st) continue;
            const snode n = m->nodes[st];
            const gelem el = m->g->elems[n.pos];
            if (el.kind == G_CHARS && class_has(m->g, el.value, cp)) {
                uint32_t next = after(m, n.pos + 1, n.next);
                if (!m->broken) expand(m, next, 0);
            }
        }
        normalize(m, start);
        return start;
    }
    for (size_t i = s; i < e && !m->broken; i++) {
        uint32_t st = m->scratch[i];
        if (!st) continue;
        const snode n = m->nodes[st];
        const gelem el = m->g->elems[n.pos];
        if (el.kind != G_CHARS || !class_has(m->g, el.value, cp)) continue;
        uint32_t next = m->succ[st];
        if (next == NO_MEMO) {
            next = after(m, n.pos + 1, n.next);
            if (m->broken) break;
            m->succ[st] = next;
        }
        expand_memo(m, next);
    }
    normalize(m, start);
    return start;
}

/* The smallest code point a character of n bytes may hold: anything below is an overlong form,
 * which the detokenizer shows as U+FFFD and no grammar character matches. */
static const uint32_t utf8_floor[5] = {0, 0, 0x80, 0x800, 0x10000};

/* Some stack of [s, e) can take a valid character of `len` bytes that begins with the pending bits. */
static bool partial_fits(quill_grammar_matcher *m, size_t s, size_t e, uint32_t pv, int remain, int len) {
    uint32_t lo = pv << (6 * remain), hi = lo | ((1u << (6 * remain)) - 1);
    if (lo < utf8_floor[len]) lo = utf8_floor[len];
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;   /* overlong, too large, or a surrogate */
    for (size_t i = s; i < e; i++) {
        uint32_t st = m->scratch[i];
        if (!st) continue;
        const gelem el = m->g->elems[m->nodes[st].pos];
        if (el.kind == G_CHARS && class_meets(m->g, el.value, lo, hi)) return true;
    }
    return false;
}

typedef struct pstate {
    size_t s, e;                 /* the stacks: scratch[s..e) */
    uint32_t pv;                 /* a character begun: its bits so far, bytes still to come, its length */
    int remain, len;
} pstate;

/* One byte: the next state, or false when no stack can take it. */
static bool feed(quill_grammar_matcher *m, pstate in, unsigned char b, pstate *out) {
    uint32_t cp;
    if (in.remain == 0) {
        if (b < 0x80) {
            cp = b;
        } else {
            int need = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
            if (!need) return false;
            *out = (pstate){in.s, in.e, b & (0x7Fu >> need), need - 1, need};
            return partial_fits(m, in.s, in.e, out->pv, out->remain, out->len);
        }
    } else {
        if ((b & 0xC0) != 0x80) return false;
        uint32_t v = (in.pv << 6) | (b & 0x3F);
        if (in.remain > 1) {
            *out = (pstate){in.s, in.e, v, in.remain - 1, in.len};
            return partial_fits(m, in.s, in.e, out->pv, out->remain, out->len);
        }
        /* partial_fits kept out overlong forms, surrogates and values past U+10FFFF */
        cp = v;
    }
    size_t start = advance_cp(m, in.s, in.e, cp);
    *out = (pstate){start, m->n_scratch, 0, 0, 0};
    return !m->broken && out->e > out->s;
}

static pstate current(quill_grammar_matcher *m) {
    m->n_scratch = 0;
    if (!grow_u32(&m->scratch, &m->cap_scratch, m->n_cur + 1)) {
        breakdown(m, "out of memory for the parse state");
        return (pstate){0, 0, 0, 0, 0};
    }
    memcpy(m->scratch, m->cur, m->n_cur * sizeof *m->cur);
    m->n_scratch = m->n_cur;
    return (pstate){0, m->n_cur, m->pv, m->remain, m->len};
}

static bool commit(quill_grammar_matcher *m, pstate p) {
    if (!grow_u32(&m->cur, &m->cap_cur, p.e - p.s + 1)) {
        breakdown(m, "out of memory for the parse state");
        return false;
    }
    memmove(m->cur, m->scratch + p.s, (p.e - p.s) * sizeof *m->cur);
    m->n_cur = p.e - p.s;
    m->pv = p.pv;
    m->remain = p.remain;
    m->len = p.len;
    return true;
}

/* The state after `text` from p, or false. */
static bool feed_text(quill_grammar_matcher *m, pstate p, const unsigned char *text, size_t len, pstate *out) {
    for (size_t i = 0; i < len; i++)
        if (!feed(m, p, text[i], &p)) return false;
    *out = p;
    return true;
}

/* Stacks whose top is a token element that `token` satisfies, advanced past it. */
static size_t advance_token_elems(quill_grammar_matcher *m, pstate p, int32_t token) {
    size_t start = m->n_scratch;
    new_stamp(m);
    if (p.remain) return start;
    for (size_t i = p.s; i < p.e && !m->broken; i++) {
        uint32_t st = m->scratch[i];
        if (!st) continue;
        const snode n = m->nodes[st];
        const gelem el = m->g->elems[n.pos];
        if ((el.kind == G_TOKEN && el.value == (uint32_t)token) ||
            (el.kind == G_TOKEN_NOT && el.value != (uint32_t)token && !m->v->eog[token]))
            expand(m, after(m, n.pos + 1, n.next), 0);
    }
    normalize(m, start);
    return start;
}

static bool has_empty(const uint32_t *s, size_t n) { return n > 0 && s[0] == 0; }

/* The state after `token`, or false when the grammar does not allow it. */
static bool step_token(quill_grammar_matcher *m, int32_t token, pstate *out) {
    const quill_grammar_vocab *v = m->v;
    if (!v || token < 0 || token >= v->n_vocab || m->broken) return false;
    pstate p = current(m);
    if (m->broken) return false;
    if (v->eog[token]) {
        *out = p;
        return p.remain == 0 && has_empty(m->scratch + p.s, p.e - p.s);
    }
    size_t ts = advance_token_elems(m, p, token);
    pstate by_token = {ts, m->n_scratch, 0, 0, 0};
    pstate by_text;
    bool text_ok = v->len[token] > 0 && feed_text(m, p, v->bytes + v->off[token], v->len[token], &by_text);
    if (m->broken) return false;
    if (by_token.e > by_token.s && !(text_ok && by_text.remain == 0)) {
        *out = by_token;
        return true;
    }
    if (by_token.e > by_token.s) {
        /* both ways: the union */
        size_t start = m->n_scratch;
        for (size_t i = by_token.s; i < by_token.e; i++) push_scratch(m, m->scratch[i]);
        for (size_t i = by_text.s; i < by_text.e; i++) push_scratch(m, m->scratch[i]);
        normalize(m, start);
        *out = (pstate){start, m->n_scratch, 0, 0, 0};
        return !m->broken;
    }
    if (text_ok) *out = by_text;
    return text_ok;
}

static void start_state(quill_grammar_matcher *m) {
    m->n_scratch = 0;
    new_stamp(m);
    const grule *r = &m->g->rules[m->g->root];
    for (uint32_t a = 0; a < r->n_alts && !m->broken; a++) {
        uint32_t start = m->g->alts[r->first_alt + a];
        if (m->g->elems[start].kind == G_END) push_scratch(m, 0);
        else {
            uint32_t s = intern(m, start, 0);
            if (s) expand(m, s, 0);
        }
    }
    normalize(m, 0);
    commit(m, (pstate){0, m->n_scratch, 0, 0, 0});
}

void quill_grammar_matcher_reset(quill_grammar_matcher *m) {
    if (!m) return;
    m->broken = false;
    m->why.message[0] = 0;
    m->n_cur = 0;
    m->pv = 0;
    m->remain = m->len = 0;
    start_state(m);
}

void quill_grammar_matcher_free(quill_grammar_matcher *m) {
    if (!m) return;
    for (int i = 0; i < N_CACHE; i++) free(m->cache[i].key), free(m->cache[i].bits);
    free(m->nodes), free(m->seen), free(m->table), free(m->cur), free(m->scratch);
    free(m->succ), free(m->exp_first), free(m->exp_n), free(m->exp_out);
    free(m);
}

quill_status quill_grammar_matcher_new(const quill_grammar *g, const quill_grammar_vocab *v, quill_grammar_matcher **out,
                                       quill_error *err) {
    if (!out) return quill_fail(err, QUILL_E_ARG, "grammar matcher: `out` must not be NULL");
    *out = NULL;
    if (!g) return quill_fail(err, QUILL_E_ARG, "grammar matcher: no grammar given");
    quill_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return quill_fail(err, QUILL_E_NOMEM, "grammar matcher: out of memory");
    m->g = g;
    m->v = v;
    m->cap_nodes = 1024;
    m->nodes = malloc(m->cap_nodes * sizeof *m->nodes);
    m->seen = calloc(m->cap_nodes, sizeof *m->seen);
    m->succ = malloc(m->cap_nodes * sizeof *m->succ);
    m->exp_first = malloc(m->cap_nodes * sizeof *m->exp_first);
    m->exp_n = malloc(m->cap_nodes * sizeof *m->exp_n);
    if (m->succ) memset(m->succ, 0xFF, m->cap_nodes * sizeof *m->succ);
    if (m->exp_first) memset(m->exp_first, 0xFF, m->cap_nodes * sizeof *m->exp_first);
    m->n_nodes = 1;
    m->words = v ? ((size_t)v->n_vocab + 63) / 64 : 0;
    if (!m->nodes || !m->seen || !m->succ || !m->exp_first || !m->exp_n) {
        quill_grammar_matcher_free(m);
        return quill_fail(err, QUILL_E_NOMEM, "grammar matcher: out of memory");
    }
    quill_grammar_matcher_reset(m);
    if (m->broken) {
        quill_status st = quill_fail(err, m->why.status, "%s", m->why.message);
        quill_grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return QUILL_OK;
}

bool quill_grammar_matcher_accept_token(quill_grammar_matcher *m, int32_t token) {
    if (!m) return false;
    pstate p;
    bool ok = step_token(m, token, &p) && commit(m, p);
    m->n_scratch = 0;
    return ok;
}

bool quill_grammar_matcher_accept_text(quill_grammar_matcher *m, const char *text, size_t len) {
    if (!m || m->broken || (!text && len)) return false;
    pstate p = current(m);
    bool ok = !m->broken && feed_text(m, p, (const unsigned char *)text, len, &p) && commit(m, p);
    m->n_scratch = 0;
    return ok;
}

bool quill_grammar_matcher_can_end(const quill_grammar_matcher *m) {
    return m && !m->broken && m->remain == 0 && has_empty(m->cur, m->n_cur);
}

bool quill_grammar_matcher_is_dead(const quill_grammar_matcher *m) { return !m || m->broken || m->n_cur == 0; }

bool quill_grammar_accepts(const quill_grammar *g, const char *text, size_t len) {
    quill_grammar_matcher *m;
    if (quill_grammar_matcher_new(g, NULL, &m, NULL)) return false;
    bool ok = quill_grammar_matcher_accept_text(m, text, len) && quill_grammar_matcher_can_end(m);
    quill_grammar_matcher_free(m);
    return ok;
}

/* ---------------------------------------------------------------- masks */

static inline void set_bit(uint64_t *bits, int32_t i) { bits[(uint32_t)i >> 6] |= 1ull << (i & 63); }
static inline bool get_bit(const uint64_t *bits, int32_t i) { return bits[(uint32_t)i >> 6] >> (i & 63) & 1; }

/* The tokens a trie subtree holds that may follow p. */
static void walk(quill_grammar_matcher *m, uint32_t node, pstate p, uint64_t *bits) {
    const quill_grammar_vocab *v = m->v;
    const tnode *t = v->trie;
    for (uint32_t c = node + 1; c < t[node].skip && !m->broken; c = t[c].skip) {
        size_t mark = m->n_scratch;
        pstate q;
        if (feed(m, p, t[c].byte, &q)) {
            for (uint32_t k = 0; k < t[c].tok_n; k++) set_bit(bits, v->order[t[c].tok_first + k]);
            if (t[c].skip > c + 1) walk(m, c, q, bits);
        }
        m->n_scratch = mark;
    }
}

/* What both ways of computing a mask share: end of generation and token elements. */
static void mask_common(quill_grammar_matcher *m, pstate p, uint64_t *bits) {
    const quill_grammar_vocab *v = m->v;
    memset(bits, 0, m->words * sizeof *bits);
    if (p.remain == 0 && has_empty(m->scratch + p.s, p.e - p.s))
        for (size_t i = 0; i < v->n_eog; i++) set_bit(bits, v->eog_ids[i]);
    if (p.remain) return;
    for (size_t i = p.s; i < p.e; i++) {
        uint32_t st = m->scratch[i];
        if (!st) continue;
        const gelem el = m->g->elems[m->nodes[st].pos];
        if (el.kind == G_TOKEN && el.value < (uint32_t)v->n_vocab && !v->eog[el.value]) set_bit(bits, (int32_t)el.value);
        if (el.kind == G_TOKEN_NOT)
            for (int32_t t = 0; t < v->n_vocab; t++)
                if ((uint32_t)t != el.value && !v->eog[t]) set_bit(bits, t);
    }
}

/* Sets token t's bit when its whole text can follow p; the scratch it used is given back. */
static inline void try_token(quill_grammar_matcher *m, pstate p, int32_t t, uint64_t *bits) {
    const quill_grammar_vocab *v = m->v;
    size_t mark = m->n_scratch;
    pstate q;
    if (feed_text(m, p, v->bytes + v->off[t], v->len[t], &q)) set_bit(bits, t);
    m->n_scratch = mark;
}

/* A mask's end: the scratch emptied, the error that broke the matcher if one did. */
static quill_status mask_end(quill_grammar_matcher *m, quill_error *err) {
    m->n_scratch = 0;
    if (m->broken) return quill_fail(err, m->why.status, "%s", m->why.message);
    return QUILL_OK;
}

static quill_status mask_fast(quill_grammar_matcher *m, uint64_t *bits, quill_error *err) {
    pstate p = current(m);
    if (!m->broken) {
        mask_common(m, p, bits);
        walk(m, 0, p, bits);
        const quill_grammar_vocab *v = m->v;
        for (size_t i = 0; i < v->n_long && !m->broken; i++) try_token(m, p, v->long_ids[i], bits);
    }
    return mask_end(m, err);
}

quill_status quill_grammar_matcher_mask_plain(quill_grammar_matcher *m, uint64_t *bits, quill_error *err) {
    if (!m || !m->v || !bits) return quill_fail(err, QUILL_E_ARG, "grammar mask: needs a matcher with a vocabulary");
    pstate p = current(m);
    if (!m->broken) {
        mask_common(m, p, bits);
        const quill_grammar_vocab *v = m->v;
        for (int32_t t = 0; t < v->n_vocab && !m->broken; t++)
            if (!v->eog[t] && v->len[t] != 0) try_token(m, p, t, bits);
    }
    return mask_end(m, err);
}

static cache_entry *cache_find(quill_grammar_matcher *m) {
    for (int i = 0; i < N_CACHE; i++) {
        cache_entry *c = &m->cache[i];
        if (c->used && c->n_key == m->n_cur && c->pv == m->pv && c->remain == m->remain && c->len == m->len &&
            !memcmp(c->key, m->cur, m->n_cur * sizeof *m->cur)) {
            c->used = ++m->tick;
            return c;
        }
    }
    return NULL;
}

/* The current state's mask, from the cache or computed into it. NULL on failure. */
static const uint64_t *mask_cached(quill_grammar_matcher *m, quill_error *err) {
    cache_entry *c = cache_find(m);
    if (c) return c->bits;
    c = &m->cache[0];
    for (int i = 1; i < N_CACHE; i++)
        if (m->cache[i].used < c->used) c = &m->cache[i];
    c->used = 0;
    if ((!c->bits && !(c->bits = malloc(m->words * sizeof *c->bits))) || !grow_u32(&c->key, &c->cap_key, m->n_cur + 1)) {
        quill_fail(err, QUILL_E_NOMEM, "grammar: out of memory for a token mask");
        return NULL;
    }
    if (mask_fast(m, c->bits, err)) return NULL;
    memcpy(c->key, m->cur, m->n_cur * sizeof *m->cur);
    c->n_key = m->n_cur;
    c->pv = m->pv;
    c->remain = m->remain;
    c->len = m->len;
    c->used = ++m->tick;
    return c->bits;
}

quill_status quill_grammar_matcher_mask(quill_grammar_matcher *m, uint64_t *bits, quill_error *err) {
    if (!m || !m->v || !bits) return quill_fail(err, QUILL_E_ARG, "grammar mask: needs a matcher with a vocabulary");
    if (m->broken) return quill_fail(err, m->why.status, "%s", m->why.message);
    const uint64_t *b = mask_cached(m, err);
    if (!b) return err ? err->status : QUILL_E_NOMEM;
    memcpy(bits, b, m->words * sizeof *bits);
    return QUILL_OK;
}

bool quill_grammar_matcher_allows(quill_grammar_matcher *m, int32_t token) {
    if (!m || !m->v || m->broken || token < 0 || token >= m->v->n_vocab) return false;
    const cache_entry *c = cache_find(m);
    if (c) return get_bit(c->bits, token);
    pstate p;
    bool ok = step_token(m, token, &p);
    m->n_scratch = 0;
    return ok;
}

/* ---------------------------------------------------------------- the sampler stage */

typedef struct grammar_stage {
    quill_grammar_matcher *m;
    int32_t refused;             /* a token accepted that the grammar does not allow, or -1 */
} grammar_stage;

static bool stage_fail(quill_error *err, quill_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool stage_fail(quill_error *err, quill_status status, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    quill_fail(err, status, "%s", msg);
    return false;
}

static bool stage_apply(void *state, float *logits, int32_t n_vocab, quill_error *err) {
    grammar_stage *gs = state;
    quill_grammar_matcher *m = gs->m;
    if (gs->refused >= 0)
        return stage_fail(err, QUILL_E_ARG, "grammar: token %d was accepted but the grammar does not allow it",
                          (int)gs->refused);
    if (n_vocab != m->v->n_vocab)
        return stage_fail(err, QUILL_E_ARG, "grammar: the sampler has %d tokens but the vocabulary %d", (int)n_vocab,
                          (int)m->v->n_vocab);
    const uint64_t *bits = mask_cached(m, err);
    if (!bits) return false;
    bool any = false;
    for (size_t w = 0; w < m->words; w++) {
        uint64_t b = bits[w];
        size_t base = w * 64, n = (size_t)n_vocab - base < 64 ? (size_t)n_vocab - base : 64;
        if (b == ~0ull && n == 64) {
            any = true;
            continue;
        }
        any = any || b;
        for (size_t i = 0; i < n; i++)
            if (!(b >> i & 1)) logits[base + i] = -INFINITY;
    }
    if (!any)
        return stage_fail(err, QUILL_E_ARG,
                          "grammar: no token of the vocabulary can continue the text here (the grammar needs "
                          "characters no token provides, or it is complete and the model has no end-of-generation "
                          "token)");
    return true;
}

static bool stage_allows(void *state, int32_t token) {
    grammar_stage *gs = state;
    return gs->refused < 0 && quill_grammar_matcher_allows(gs->m, token);
}

static void stage_accept(void *state, int32_t token) {
    grammar_stage *gs = state;
    if (gs->refused < 0 && !quill_grammar_matcher_accept_token(gs->m, token)) gs->refused = token;
}

static void stage_reset(void *state) {
    grammar_stage *gs = state;
    gs->refused = -1;
    quill_grammar_matcher_reset(gs->m);
}

static void stage_free(void *state) {
    grammar_stage *gs = state;
    if (!gs) return;
    quill_grammar_matcher_free(gs->m);
    free(gs);
}

quill_status quill_sampler_add_grammar(quill_sampler *s, const quill_grammar *g, const quill_grammar_vocab *v,
                                       quill_error *err) {
    if (!s || !g || !v) return quill_fail(err, QUILL_E_ARG, "grammar stage: needs a sampler, a grammar and a vocabulary");
    grammar_stage *gs = calloc(1, sizeof *gs);
    if (!gs) return quill_fail(err, QUILL_E_NOMEM, "grammar stage: out of memory");
    gs->refused = -1;
    quill_status st = quill_grammar_matcher_new(g, v, &gs->m, err);
    if (st) {
        free(gs);
        return st;
    }
    quill_sampler_stage stage = {"grammar", stage_apply, stage_allows, stage_accept, stage_reset, stage_free, gs};
    return quill_sampler_add_stage(s, &stage, err);
}

/* ---------------------------------------------------------------- a grammar from a trigger on
 *
 * With tool_choice "auto" a reply may be prose or a call; only a call must follow the call grammar.
 * The stage draws freely and watches the text (special tokens rendered, as the reply's parser reads
 * them) for a trigger, the text every call begins with; from the token where one appears the
 * grammar applies, fed first with the text from the trigger's start: the call then parses by
 * construction. Text the grammar cannot follow (the model wrote the trigger and went elsewhere in
 * the same token) leaves the reply unconstrained rather than failing it. */

typedef struct lazy_stage {
    quill_grammar_matcher *m;
    const quill_tokenizer *tok;
    char **triggers;
    size_t n_triggers, longest;
    bool active, given_up;
    strbuf text;                 /* the reply so far, until a trigger appears */
    int32_t *ids;                /* its tokens and where each begins in text */
    size_t *starts, n_ids, cap_ids;
} lazy_stage;

static bool lazy_apply(void *state, float *logits, int32_t n_vocab, quill_error *err) {
    lazy_stage *ls = state;
    if (!ls->active || ls->given_up) return true;
    grammar_stage gs = {ls->m, -1};
    return stage_apply(&gs, logits, n_vocab, err);
}

static bool lazy_allows(void *state, int32_t token) {
    lazy_stage *ls = state;
    return !ls->active || ls->given_up || quill_grammar_matcher_allows(ls->m, token);
}

/* The grammar takes over at byte `at` of the text: the rest of the token holding it as text,
 * then the later tokens as tokens (so that marks written as <[id]> match). */
static void lazy_activate(lazy_stage *ls, size_t at) {
    ls->active = true;
    size_t k = ls->n_ids - 1;
    while (k > 0 && ls->starts[k] > at) k--;
    size_t end = k + 1 < ls->n_ids ? ls->starts[k + 1] : ls->text.len;
    bool ok = at == ls->starts[k] ? quill_grammar_matcher_accept_token(ls->m, ls->ids[k])
                                  : quill_grammar_matcher_accept_text(ls->m, ls->text.buf + at, end - at);
    for (size_t i = k + 1; ok && i < ls->n_ids; i++) ok = quill_grammar_matcher_accept_token(ls->m, ls->ids[i]);
    ls->given_up = !ok;
}

static void lazy_accept(void *state, int32_t token) {
    lazy_stage *ls = state;
    if (ls->given_up) return;
    if (ls->active) {
        ls->given_up = !quill_grammar_matcher_accept_token(ls->m, token);
        return;
    }
    if (quill_tokenizer_is_eog(ls->tok, token)) return;
    char piece[256];
    int n = quill_token_to_bytes(ls->tok, token, true, piece, sizeof piece);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof piece) n = (int)sizeof piece;
    if (ls->n_ids == ls->cap_ids) {
        size_t cap = ls->cap_ids ? ls->cap_ids * 2 : 64;
        int32_t *ids = realloc(ls->ids, cap * sizeof *ids);
        if (ids) ls->ids = ids;
        size_t *starts = ids ? realloc(ls->starts, cap * sizeof *starts) : NULL;
        if (starts) ls->starts = starts;
        if (!ids || !starts) {
            ls->given_up = true;   /* out of memory: the reply stays unconstrained */
            return;
        }
        ls->cap_ids = cap;
    }
    const size_t before = ls->text.len;
    strbuf_put(&ls->text, piece, (size_t)n);
    if (ls->text.oom) {
        ls->given_up = true;   /* out of memory: the reply stays unconstrained */
        return;
    }
    ls->ids[ls->n_ids] = token;
    ls->starts[ls->n_ids++] = before;
    if (!ls->text.buf) return;   /* no text yet */
    /* the earliest trigger that this token completes */
    size_t from = before >= ls->longest ? before - ls->longest + 1 : 0, best = SIZE_MAX;
    for (size_t t = 0; t < ls->n_triggers; t++) {
        const char *hit = strstr(ls->text.buf + from, ls->triggers[t]);
        if (hit && (size_t)(hit - ls->text.buf) < best) best = (size_t)(hit - ls->text.buf);
    }
    if (best != SIZE_MAX) lazy_activate(ls, best);
}

static void lazy_reset(void *state) {
    lazy_stage *ls = state;
    ls->active = ls->given_up = false;
    ls->n_ids = 0;
    ls->text.len = 0;
    if (ls->text.buf) ls->text.buf[0] = 0;
    quill_grammar_matcher_reset(ls->m);
}

static void lazy_free(void *state) {
    lazy_stage *ls = state;
    if (!ls) return;
    quill_grammar_matcher_free(ls->m);
    for (size_t i = 0; i < ls->n_triggers; i++) free(ls->triggers[i]);
    free(ls->triggers);
    free(ls->text.buf);
    free(ls->ids);
    free(ls->starts);
    free(ls);
}

quill_status quill_sampler_add_grammar_lazy(quill_sampler *s, const quill_grammar *g, const quill_grammar_vocab *v,
                                            const char *const *triggers, size_t n_triggers, quill_error *err) {
    if (!s || !g || !v || !v->tok)
        return quill_fail(err, QUILL_E_ARG, "lazy grammar stage: needs a sampler, a grammar and a vocabulary");
    if (!triggers || !n_triggers) return quill_fail(err, QUILL_E_ARG, "lazy grammar stage: needs at least one trigger");
    for (size_t t = 0; t < n_triggers; t++)
        if (!triggers[t] || !*triggers[t])
            return quill_fail(err, QUILL_E_ARG, "lazy grammar stage: trigger %zu is empty", t);
    lazy_stage *ls = calloc(1, sizeof *ls);
    if (!ls) return quill_fail(err, QUILL_E_NOMEM, "lazy grammar stage: out of memory");
    ls->tok = v->tok;
    ls->triggers = calloc(n_triggers, sizeof *ls->triggers);
    bool ok = ls->triggers != NULL;
    for (size_t t = 0; ok && t < n_triggers; t++) {
        ok = (ls->triggers[t] = strdup(triggers[t])) != NULL;
        ls->n_triggers += ok;
        size_t n = strlen(triggers[t]);
        if (n > ls->longest) ls->longest = n;
    }
    if (!ok) {
        lazy_free(ls);
        return quill_fail(err, QUILL_E_NOMEM, "lazy grammar stage: out of memory");
    }
    quill_status st = quill_grammar_matcher_new(g, v, &ls->m, err);
    if (st) {
        lazy_free(ls);
        return st;
    }
    quill_sampler_stage stage = {"grammar (lazy)", lazy_apply, lazy_allows, lazy_accept, lazy_reset, lazy_free, ls};
    return quill_sampler_add_stage(s, &stage, err);
}
