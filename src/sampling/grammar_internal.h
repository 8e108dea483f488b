/* GBNF grammars inside the library: the compiled form (grammar.c) that the matcher
 * (grammar_match.c) runs. */
#ifndef QUILL_GRAMMAR_INTERNAL_H
#define QUILL_GRAMMAR_INTERNAL_H

#include "base/error.h"

#include <stdbool.h>
#include <stdint.h>

/* Element kinds. A rule's alternatives are runs of elements, each ended by G_END. */
enum { G_END, G_CHARS, G_RULE, G_TOKEN, G_TOKEN_NOT };

typedef struct gelem {
    uint8_t kind;
    uint32_t value;         /* G_CHARS: class index; G_RULE: rule id; G_TOKEN(_NOT): token id */
} gelem;

typedef struct cp_range {
    uint32_t lo, hi;        /* code points, inclusive */
} cp_range;

/* A character class: disjoint, sorted ranges; negated matches what none of them holds. */
typedef struct gclass {
    bool negated;
    uint32_t first, n;      /* ranges[first .. first + n) */
} gclass;

typedef struct grule {
    uint32_t first_alt, n_alts;   /* alts[first_alt ..]: element index where each alternative starts */
    bool defined;
    uint32_t first_use;           /* byte offset in the source, for messages */
} grule;

struct quill_grammar {
    gelem *elems;
    size_t n_elems;
    uint32_t *alts;
    size_t n_alts;
    grule *rules;
    char **names;
    size_t n_rules;
    gclass *classes;
    size_t n_classes;
    cp_range *ranges;
    size_t n_ranges;
    uint32_t root;
};

#endif
