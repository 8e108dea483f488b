/* The queue of candidate merges that both tokenizers' merge loops share (spm.c, bpe.c): a binary
 * min-heap of pairs ordered by one 64-bit key, whose high half is the merge's priority and low
 * half the left symbol's index, so that one integer compare orders pairs as the reference's
 * comparators do (best priority first, then the leftmost pair). Each tokenizer makes the key;
 * stale pairs are left in the heap and skipped by the caller when popped. */
#ifndef QUILL_MERGE_HEAP_H
#define QUILL_MERGE_HEAP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* A piece of the text being merged, linked to its neighbours; n = 0 once merged into its left one. */
typedef struct {
    int prev, next;
    size_t start, n;
} merge_symbol;

typedef struct {
    uint64_t key;   /* priority << 32 | left symbol: the lowest key merges first */
    int32_t right;
    uint32_t size;  /* bytes of the two sides when queued: a pair is stale once it changed */
} merge_pair;

typedef struct {
    merge_pair *items;
    size_t n, cap;
} merge_heap;

static inline int32_t merge_pair_left(merge_pair p) { return (int32_t)(uint32_t)p.key; }

static inline bool merge_heap_push(merge_heap *h, merge_pair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        merge_pair *items = realloc(h->items, cap * sizeof *items);
        if (!items) return false;
        h->items = items;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->items[parent].key <= p.key) break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = p;
    return true;
}

static inline merge_pair merge_heap_pop(merge_heap *h) {
    merge_pair top = h->items[0], last = h->items[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h->items[c + 1].key < h->items[c].key) c++;
        if (h->items[c].key >= last.key) break;
        h->items[i] = h->items[c];
        i = c;
    }
    if (n) h->items[i] = last;
    return top;
}

/* Pops pairs until one is still valid (a side that changed since it was queued makes it stale: a
 * side only grows), merges its right symbol into its left one and returns the left's index; -1
 * once the heap is empty. The caller then queues the left symbol's new pairs with its neighbours. */
static inline int merge_heap_merge_next(merge_heap *h, merge_symbol *sym) {
    while (h->n) {
        const merge_pair p = merge_heap_pop(h);
        const int left = merge_pair_left(p);
        merge_symbol *l = &sym[left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = left;
        return left;
    }
    return -1;
}

#endif
