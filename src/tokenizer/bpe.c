/* Byte-level BPE ("gpt2") tokenizer, behaving like the reference (llama.cpp's llm_tokenizer_bpe and
 * unicode_regex_split): the pre-tokenizer named by tokenizer.ggml.pre cuts a raw fragment into
 * words with its list of regular expressions, each word's bytes are mapped to GPT-2's printable
 * characters, and the adjacent pair with the lowest merge rank merges first.
 *
 * The expressions run on PCRE2, but on what the reference matches them against, so that the
 * words come out the same and not just the expressions:
 * - The text is decoded as the reference decodes it: a lax decoder (overlong forms and surrogates
 *   accepted), every byte it cannot decode becomes U+FFFD.
 * - Non-ASCII whitespace becomes U+000B before matching (the reference's std::regex does not know
 *   it), which changes what literal ranges such as DeepSeek's [ࠀ-一] match.
 * - An expression that names a Unicode category (\p{L}, \p{N}, \p{P}, \p{M}, \p{S} and the letter
 *   subcategories) is matched as the reference matches it: against the text "collapsed" to one
 *   byte per character (ASCII as is, every other character replaced by a byte that stands for its
 *   category), with the categories rewritten as classes of those bytes. The categories themselves
 *   come from PCRE2's Unicode tables (UTF + UCP). This keeps the reference's quirks: \p{Lu} means
 *   any letter, \p{S} does not match '~'.
 * - The other expressions (literal ranges) run in UTF mode with ASCII \s \d \w \b, as in the
 *   reference's std::wregex.
 * - Each expression splits the pieces the previous one left, and text no match covers is a piece
 *   of its own. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/merge_heap.h"
#include "tokenizer/vocab.h"
#include "base/utf8.h"

#include <pcre2.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- pre-tokenizers */

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_LLAMA3                                                                              \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
                 "\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                               \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"     \
                 "\\s+(?!\\S)|\\s+"
/* A letter that is not a-z / not A-Z: how the reference spells \p{Lu}/\p{Ll} for std::regex. */
#define RX_UPPER "((?=[\\p{L}])([^a-z]))"
#define RX_LOWER "((?=[\\p{L}])([^A-Z]))"
#define RX_POREDO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"
#define RX_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* DeepSeek's cased letters (\p{LC} of the Unicode version its tokenizer was made with). */
#define RX_DEEPSEEK_LETTERS                                                                    \
    "\\s?[A-Za-z\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}"             \
    "\\x{01BC}-\\x{01BF}\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}\\x{0376}"      \
    "\\x{0377}\\x{037B}-\\x{037D}\\x{037F}\\x{0386}\\x{0388}-\\x{038A}\\x{038C}"                \
    "\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}\\x{03F7}-\\x{0481}\\x{048A}-\\x{052F}"              \
    "\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"              \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"              \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"              \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"      \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"     \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"              \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"      \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"                \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"      \
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"              \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"              \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"              \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"        \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
#define RX_DEEPSEEK_PUNCT "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"

static const char *const x_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL};
static const char *const x_gpt2[] = {RX_GPT2, NULL};
static const char *const x_llama3[] = {RX_LLAMA3, NULL};
static const char *const x_qwen2[] = {RX_QWEN2, NULL};
static const char *const x_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]", NULL};
static const char *const x_starcoder[] = {"\\p{N}", RX_GPT2, NULL};
static const char *const x_deepseek_llm[] = {"[\r\n]", RX_DEEPSEEK_LETTERS, RX_DEEPSEEK_PUNCT, "\\s+$", RX_CJK,
                                             "\\p{N}+", NULL};
static const char *const x_deepseek_coder[] = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK, "\\p{N}", NULL};
static const char *const x_deepseek_v3[] = {
    "\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+", NULL};
static const char *const x_jais2[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|"
    "\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}", NULL};
static const char *const x_qwen35[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+", NULL};
static const char *const x_poro[] = {RX_POREDO, NULL};
static const char *const x_viking[] = {RX_POREDO, "\\p{N}", NULL};
static const char *const x_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" RX_UPPER "*" RX_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" RX_UPPER "+" RX_LOWER "*|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL};
static const char *const x_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" RX_UPPER "*" RX_LOWER "+" CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?" RX_UPPER "+" RX_LOWER
    "*" CONTRACTIONS "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL};
static const char *const x_bailingmoe[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+", NULL};
static const char *const x_seed_coder[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const x_ufakzeka[] = {
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL};
static const char *const x_laguna[] = {"[^\\n]+|[\\n]+", RX_QWEN2, NULL};
/* Gemma 4's SentencePiece-style BPE: lines and runs of newlines, merged whole */
static const char *const x_gemma4[] = {"[^\\n]+|[\\n]+", NULL};
static const char *const x_exaone_moe[] = {
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|"
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+", NULL};
static const char *const x_minicpm5[] = {
    "\\p{N}{1,3}",
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};

enum { PRE_IGNORE_MERGES = 1, PRE_ADD_BOS = 2, PRE_NO_BOS = 4 };

typedef struct {
    const char *names;              /* the tokenizer.ggml.pre values, separated by '|' */
    const char *const *exprs;
    int flags;
} pre_spec;

/* The reference's choice of expressions and defaults for each `pre` value (llama-vocab.cpp). */
static const pre_spec pre_specs[] = {
    {"default", x_default, 0},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", x_llama3,
     PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"dbrx|smaug-bpe", x_llama3, 0},
    {"glm4|chatglm-bpe", x_llama3, PRE_NO_BOS},
    {"deepseek-llm", x_deepseek_llm, 0},
    {"deepseek-coder", x_deepseek_coder, 0},
    {"deepseek-v3|hunyuan-dense|joyai-llm", x_deepseek_v3, 0},
    {"falcon", x_falcon, 0},
    {"gpt-2|phi-2|gigachat|a.x-4.0|mellum|exaone4|mpt|olmo|jais|trillion|granite-docling", x_gpt2, 0},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", x_starcoder, 0},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2", x_qwen2, 0},
    {"qwen35", x_qwen35, 0},
    {"jais-2", x_jais2, 0},
    {"poro-chat|bloom|gpt3-finnish", x_poro, 0},
    {"viking", x_viking, 0},
    {"tekken", x_tekken, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", x_gpt4o, 0},
    {"bailingmoe|bailingmoe2|llada-moe", x_bailingmoe, 0},
    {"seed-coder", x_seed_coder, 0},
    {"ufakzeka", x_ufakzeka, 0},
    {"laguna", x_laguna, 0},
    {"exaone-moe", x_exaone_moe, 0},
    {"minicpm5", x_minicpm5, PRE_IGNORE_MERGES},
};

/* (not chosen by tokenizer.ggml.pre: by the tokenizer model, gemma4) */
static const pre_spec gemma4_spec = {"gemma4", x_gemma4, PRE_ADD_BOS};

static bool name_in(const char *list, const char *s, size_t n) {
    for (const char *p = list;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, s, n) == 0) return true;
        if (!bar) return false;
        p = bar + 1;
    }
}

/* ---------------------------------------------------------------- compiled expressions */

typedef struct {
    pcre2_code *code;
    bool collapsed;         /* matched against the one-byte-per-character text */
} expr;

struct bpe_model {
    char pre[64];
    expr *exprs;
    int n_exprs;
    bool need_collapse;
    bool ignore_merges;
    bool spm_style;         /* Gemma 4: spaces are U+2581, pieces merge over their raw UTF-8, unknown bytes
                             * are <0xXX> tokens, a piece of newlines that is a token stays whole */
    pcre2_code *classify;   /* UTF + UCP: runs of one category, for the collapsed text */
    /* merges: "left right" strings, an open-addressing hash over them, and each one's rank */
    char *merge_text;
    size_t *merge_off;
    uint32_t *merge_left;   /* byte length of the left part */
    uint32_t *merge_len;
    int32_t *merge_rank;
    int32_t n_merges;
    int32_t *slots;
    uint32_t slot_mask;
};

/* Bytes the reference puts in the collapsed text for characters of 128 and up. */
enum { C_OTHER = 0xD0, C_NUMBER = 0xD1, C_LETTER = 0xD2, C_PUNCT = 0xD3, C_MARK = 0xD4, C_SYMBOL = 0xD5, C_SPACE = 0x0B };

typedef struct {
    const char *name;
    unsigned char byte;
    const char *ascii;      /* the ASCII characters of the category, as a class body */
} category;

static const category categories[] = {
    {"\\p{N}", C_NUMBER, "0-9"},
    {"\\p{L}", C_LETTER, "A-Za-z"},
    {"\\p{P}", C_PUNCT, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", C_MARK, ""},
    {"\\p{S}", C_SYMBOL, "\\$\\+<->^`\\|"},
    {"\\p{Lu}", C_LETTER, "A-Za-z"}, {"\\p{Ll}", C_LETTER, "A-Za-z"}, {"\\p{Lt}", C_LETTER, "A-Za-z"},
    {"\\p{Lm}", C_LETTER, "A-Za-z"}, {"\\p{Lo}", C_LETTER, "A-Za-z"},
};
#define N_CATEGORIES (sizeof categories / sizeof categories[0])

/* The category named at s ("\\p{...}" as a whole), or NULL. */
static const category *category_at(const char *s) {
    if (strncmp(s, "\\p{", 3) != 0) return NULL;
    const char *close = strchr(s, '}');
    if (!close) return NULL;
    size_t n = (size_t)(close - s) + 1;
    for (size_t c = 0; c < N_CATEGORIES; c++)
        if (strlen(categories[c].name) == n && memcmp(s, categories[c].name, n) == 0) return &categories[c];
    return NULL;
}

/* The reference's rewriting of an expression for the collapsed text: each category becomes a
 * class of its byte and its ASCII members (merged into the enclosing class when inside one). */
static char *collapse_expr(const char *rx) {
    size_t n = strlen(rx);
    char *out = malloc(n * 12 + 1);
    if (!out) return NULL;
    size_t j = 0;
    bool inside = false;
    for (size_t i = 0; i < n; i++) {
        if (rx[i] == '[' && (i == 0 || rx[i - 1] != '\\')) {
            out[j++] = '[';
            inside = true;
            continue;
        }
        if (inside && rx[i] == ']' && rx[i - 1] != '\\') {
            out[j++] = ']';
            inside = false;
            continue;
        }
        const category *c = rx[i] == '\\' ? category_at(rx + i) : NULL;
        if (c) {
            if (!inside) out[j++] = '[';
            out[j++] = (char)c->byte;
            memcpy(out + j, c->ascii, strlen(c->ascii));
            j += strlen(c->ascii);
            if (!inside) out[j++] = ']';
            i += strlen(c->name) - 1;
            continue;
        }
        out[j++] = rx[i];
    }
    out[j] = 0;
    return out;
}

static bool uses_category(const char *rx) {
    for (const char *p = strchr(rx, '\\'); p; p = strchr(p + 1, '\\'))
        if (category_at(p)) return true;
    return false;
}

static quill_status compile(const char *path, const char *pre, const char *rx, size_t len, uint32_t options,
                            pcre2_code **out, quill_error *err) {
    int code;
    PCRE2_SIZE at;
    *out = pcre2_compile((PCRE2_SPTR)rx, len, options, &code, &at, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: the expression of pre-tokenizer '%s' does not compile with PCRE2 (%s at offset %zu)",
                          path, pre, (const char *)msg, (size_t)at);
    }
    /* JIT is an optimization: where it is unavailable the interpreter gives the same matches. */
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    return QUILL_OK;
}

static quill_status compile_pre(const char *path, bpe_model *b, const pre_spec *spec, quill_error *err) {
    int n = 0;
    while (spec->exprs[n]) n++;
    b->exprs = calloc((size_t)n, sizeof *b->exprs);
    if (!b->exprs) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", path);
    b->n_exprs = n;
    for (int i = 0; i < n; i++) {
        const char *rx = spec->exprs[i];
        expr *e = &b->exprs[i];
        quill_status s;
        if (uses_category(rx)) {
            char *c = collapse_expr(rx);
            if (!c) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", path);
            s = compile(path, b->pre, c, strlen(c), PCRE2_DOLLAR_ENDONLY, &e->code, err);
            free(c);
            e->collapsed = true;
            b->need_collapse = true;
        } else {
            s = compile(path, b->pre, rx, strlen(rx), PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &e->code, err);
        }
        if (s) return s;
    }
    if (b->need_collapse) {
        static const char classify[] = "(\\p{N}+)|(\\p{L}+)|(\\p{P}+)|(\\p{M}+)|(\\p{S}+)";
        return compile(path, b->pre, classify, sizeof classify - 1, PCRE2_UTF | PCRE2_UCP, &b->classify, err);
    }
    return QUILL_OK;
}

/* ---------------------------------------------------------------- GPT-2's byte characters */

/* Printable Latin-1 bytes stand for themselves; the others (controls, space, 0x7F-0xA0, the soft
 * hyphen) are numbered from U+0100 in byte order. */
static uint32_t byte_char(unsigned char b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xA0) return 0x100u + 33 + (b - 0x7Fu);
    return 0x100u + 33 + 34;   /* 0xAD */
}

static int char_byte(uint32_t c) {
    if ((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)) return (int)c;
    if (c >= 0x100 && c <= 0x120) return (int)(c - 0x100);
    if (c >= 0x121 && c <= 0x142) return (int)(c - 0x121 + 0x7F);
    if (c == 0x143) return 0xAD;
    return -1;
}

/* One character the reference's way: overlong forms and surrogates pass; a byte that starts no
 * complete sequence is U+FFFD and consumes one byte. Values past U+10FFFF (which make the
 * reference throw) are treated as undecodable too. */
static uint32_t next_char(const unsigned char *s, size_t n, size_t *i) {
    unsigned char c = s[*i];
    size_t need = c < 0x80 ? 1 : c < 0xC0 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 0;
    if (need == 1) { (*i)++; return c; }
    if (need == 0 || *i + need > n) { (*i)++; return 0xFFFD; }
    uint32_t v = c & (0x7Fu >> need);
    for (size_t k = 1; k < need; k++) {
        if ((s[*i + k] & 0xC0) != 0x80) { (*i)++; return 0xFFFD; }
        v = v << 6 | (s[*i + k] & 0x3Fu);
    }
    if (v > 0x10FFFF) { (*i)++; return 0xFFFD; }
    *i += need;
    return v;
}

size_t bpe_decoded_size(const char *s, size_t n) {
    size_t total = 0;
    for (size_t i = 0; i < n;) {
        size_t at = i;
        int b = char_byte(next_char((const unsigned char *)s, n, &i));
        /* "[UNK_BYTE_0x" + the character's bytes in hex + the token's text + "]" */
        total += b >= 0 ? 1 : 12 + 2 * 4 * (i - at) + n + 1;
    }
    return total;
}

size_t bpe_decode_text(const char *s, size_t n, char *dst) {
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c = next_char((const unsigned char *)s, n, &i);
        int b = char_byte(c);
        if (b >= 0) {
            dst[j++] = (char)b;
            continue;
        }
        /* The reference names a character outside the mapping by its bytes, then the whole text. */
        char u[4];
        size_t un = utf8_encode(c, u);
        memcpy(dst + j, "[UNK_BYTE_0x", 12);
        j += 12;
        for (size_t k = 0; k < un; k++) j += (size_t)sprintf(dst + j, "%02x", (unsigned char)u[k]);
        memcpy(dst + j, s, n);
        j += n;
        dst[j++] = ']';
    }
    return j;
}

/* ---------------------------------------------------------------- merges */

static int32_t merge_find(const bpe_model *b, const char *l, size_t ln, const char *r, size_t rn) {
    if (!b->slots) return -1;
    uint32_t h = vocab_hash_more(vocab_hash_more(vocab_hash(l, ln), " ", 1), r, rn);
    for (uint32_t i = h & b->slot_mask;; i = (i + 1) & b->slot_mask) {
        int32_t m = b->slots[i];
        if (m < 0) return -1;
        const char *t = b->merge_text + b->merge_off[m];
        if (b->merge_left[m] == ln && b->merge_len[m] == ln + 1 + rn && memcmp(t, l, ln) == 0 &&
            memcmp(t + ln + 1, r, rn) == 0)
            return b->merge_rank[m];
    }
}

/* The reference splits each merge at its first space after the first byte and keeps the first
 * rank of a pair. A part with a space in it can never match (words have no spaces once their
 * bytes are mapped), so such merges, like those without a space, only use up their rank. */
static quill_status load_merges(const quill_gguf *g, const char *path, bpe_model *b, quill_error *err) {
    quill_gguf_value arr;
    quill_status s = quill_gguf_get_arr(g, "tokenizer.ggml.merges", &arr, err);
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: a 'gpt2' (BPE) vocabulary needs tokenizer.ggml.merges, which is missing", path);
    if (s) return s;
    if (arr.elem_type != QUILL_GGUF_STRING)
        return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.merges is an array of %s, expected strings", path,
                          quill_gguf_type_name(arr.elem_type));
    if (arr.count > INT32_MAX / 2)
        return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.merges has %llu entries; at most %d are supported",
                          path, (unsigned long long)arr.count, INT32_MAX / 2);
    const int32_t n = (int32_t)arr.count;
    b->merge_off = malloc(((size_t)n + 1) * sizeof *b->merge_off);
    b->merge_left = malloc(((size_t)n + 1) * sizeof *b->merge_left);
    b->merge_len = malloc(((size_t)n + 1) * sizeof *b->merge_len);
    b->merge_rank = malloc(((size_t)n + 1) * sizeof *b->merge_rank);
    if (!b->merge_off || !b->merge_left || !b->merge_len || !b->merge_rank)
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for %d merges", path, n);
    size_t total = 0, cap = 0;
    uint64_t cur = 0;
    quill_gguf_value e;
    for (int32_t i = 0; i < n; i++) {
        if (!quill_gguf_array_next(&arr, &cur, &e))
            return quill_fail(err, QUILL_E_FORMAT, "%s: tokenizer.ggml.merges ends after %d of %d entries", path, i, n);
        const char *p = (const char *)e.data;
        size_t len = e.count;
        const char *nul = memchr(p, 0, len);   /* read as a C string, like the reference */
        if (nul) len = (size_t)(nul - p);
        const char *sp = len > 1 ? memchr(p + 1, ' ', len - 1) : NULL;
        if (!sp || memchr(p, ' ', (size_t)(sp - p)) || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - p)) ||
            sp + 1 == p + len)
            continue;
        if (len > MAX_TOKEN_BYTES)
            return quill_fail(err, QUILL_E_FORMAT, "%s: merge %d is %zu bytes long", path, i, len);
        if (total + len > cap) {
            size_t c = cap ? cap * 2 : 1 << 20;
            while (c < total + len) c *= 2;
            char *t = realloc(b->merge_text, c);
            if (!t) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for the merges", path);
            b->merge_text = t;
            cap = c;
        }
        memcpy(b->merge_text + total, p, len);
        int32_t m = b->n_merges++;
        b->merge_off[m] = total;
        b->merge_left[m] = (uint32_t)(sp - p);
        b->merge_len[m] = (uint32_t)len;
        b->merge_rank[m] = i;
        total += len;
    }
    if (b->n_merges == 0) return QUILL_OK;
    uint32_t slots = 16;
    while (slots < (uint32_t)b->n_merges * 2u) slots <<= 1;
    b->slots = malloc((size_t)slots * sizeof *b->slots);
    if (!b->slots) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for the merge hash", path);
    memset(b->slots, 0xff, (size_t)slots * sizeof *b->slots);
    b->slot_mask = slots - 1;
    for (int32_t m = 0; m < b->n_merges; m++) {
        const char *t = b->merge_text + b->merge_off[m];
        uint32_t i = vocab_hash(t, b->merge_len[m]) & b->slot_mask;
        bool dup = false;
        for (;; i = (i + 1) & b->slot_mask) {
            int32_t o = b->slots[i];
            if (o < 0) break;
            if (b->merge_len[o] == b->merge_len[m] && b->merge_left[o] == b->merge_left[m] &&
                memcmp(b->merge_text + b->merge_off[o], t, b->merge_len[m]) == 0) {
                dup = true;
                break;
            }
        }
        if (!dup) b->slots[i] = m;
    }
    return QUILL_OK;
}

void bpe_free(bpe_model *b) {
    if (!b) return;
    for (int i = 0; i < b->n_exprs; i++) pcre2_code_free(b->exprs[i].code);
    free(b->exprs);
    pcre2_code_free(b->classify);
    free(b->merge_text);
    free(b->merge_off);
    free(b->merge_left);
    free(b->merge_len);
    free(b->merge_rank);
    free(b->slots);
    free(b);
}

const char *bpe_pre_name(const bpe_model *b) { return b ? b->pre : NULL; }

quill_status bpe_load(const quill_gguf *g, quill_tokenizer *t, bool spm_style, quill_error *err) {
    const char *path = quill_gguf_path(g) ? quill_gguf_path(g) : "(gguf)";
    const char *pre = "default";
    size_t pre_len = 7;
    /* (the reference's gemma4 tokenizer model always takes its own pre-tokenizer) */
    quill_status s = spm_style ? QUILL_OK : quill_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pre_len, err);
    if (spm_style) pre = "gemma4", pre_len = 6;
    if (s && s != QUILL_E_NOT_FOUND) return s;
    if (s == QUILL_E_NOT_FOUND || pre_len == 0) {
        quill_log(QUILL_LOG_WARN, "%s: tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer, as the "
                  "reference does (its output may differ from the model's own tokenizer)", path);
        pre = "default";
        pre_len = 7;
    }
    /* (the gemma4 pre-tokenizer also in a gpt2 vocabulary, as the reference maps these names) */
    spm_style = spm_style || name_in("gemma4|granite-embed-multi-311m", pre, pre_len);
    t->spm_text = spm_style;
    const pre_spec *spec = spm_style ? &gemma4_spec : NULL;
    for (size_t i = 0; i < sizeof pre_specs / sizeof pre_specs[0] && !spec; i++)
        if (name_in(pre_specs[i].names, pre, pre_len)) spec = &pre_specs[i];
    if (!spec) {
        char shown[64];
        size_t k = 0;
        for (; k < pre_len && k + 4 < sizeof shown; k++)
            shown[k] = (pre[k] >= 0x20 && pre[k] < 0x7f) ? pre[k] : '?';
        shown[k] = 0;
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: pre-tokenizer '%s' (tokenizer.ggml.pre) is not supported; quill implements llama3 / "
                          "llama-bpe, qwen2, deepseek-llm, deepseek-coder, deepseek-v3, falcon, gpt-2, mpt, starcoder, refact, "
                          "tekken, gpt-4o and the others listed in docs/models.md", path, shown);
    }
    bpe_model *b = calloc(1, sizeof *b);
    if (!b) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", path);
    t->bpe = b;
    memcpy(b->pre, pre, pre_len);
    b->ignore_merges = spec->flags & PRE_IGNORE_MERGES;
    b->spm_style = spm_style;
    if (spec->flags & PRE_ADD_BOS) t->add_bos = true;
    if (spec->flags & PRE_NO_BOS) t->bos = -1;
    s = load_merges(g, path, b, err);
    if (!s) s = compile_pre(path, b, spec, err);
    return s;
}

/* ---------------------------------------------------------------- pre-tokenizing */

typedef struct {
    uint32_t *cp;           /* the characters, as the reference decodes them */
    size_t n;
    char *sub;              /* UTF-8 the UTF expressions see: non-ASCII whitespace is U+000B */
    size_t *sub_off;        /* byte offset of each character in sub, n + 1 entries */
    int32_t *sub_char;      /* character index of each byte of sub */
    unsigned char *col;     /* collapsed text: one byte per character */
    size_t *pieces;         /* lengths in characters */
    size_t n_pieces, cap_pieces;
} split_state;

static bool is_space_above_ascii(uint32_t c) {
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

static void split_free(split_state *st) {
    free(st->cp);
    free(st->sub);
    free(st->sub_off);
    free(st->sub_char);
    free(st->col);
    free(st->pieces);
}

static bool push_piece(size_t **v, size_t *n, size_t *cap, size_t len) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        size_t *p = realloc(*v, c * sizeof *p);
        if (!p) return false;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = len;
    return true;
}

static quill_status match_error(int rc, const bpe_model *b, size_t len, quill_error *err) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return quill_fail(err, QUILL_E_UNSUPPORTED,
                      "pre-tokenizer '%s' failed on a text of %zu bytes: %s (PCRE2); split the text into smaller parts",
                      b->pre, len, (const char *)msg);
}

/* pcre2_match, falling back to the interpreter when the JIT's stack is too small for a match.
 * Empty matches are excluded: no expression of the table can match nothing, and the reference's
 * iterator would only step past them. */
static int run(const pcre2_code *code, const unsigned char *s, size_t n, size_t start, pcre2_match_data *md) {
    const uint32_t opt = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
    int rc = pcre2_match(code, s, n, start, opt, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(code, s, n, start, opt | PCRE2_NO_JIT, md, NULL);
    return rc;
}

static quill_status build_subject(const bpe_model *b, split_state *st, const char *text, size_t len,
                                  quill_error *err) {
    st->cp = malloc((len + 1) * sizeof *st->cp);
    st->sub = malloc(3 * len + 1);
    st->sub_off = malloc((len + 1) * sizeof *st->sub_off);
    if (!st->cp || !st->sub || !st->sub_off) goto oom;
    size_t j = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c = next_char((const unsigned char *)text, len, &i);
        st->sub_off[st->n] = j;
        st->cp[st->n++] = c;
        if (is_space_above_ascii(c)) st->sub[j++] = 0x0B;
        else if (c >= 0xD800 && c <= 0xDFFF) j += utf8_encode(0xE000, st->sub + j);   /* same class: none */
        else j += utf8_encode(c, st->sub + j);
    }
    st->sub_off[st->n] = j;
    st->sub_char = malloc((j + 1) * sizeof *st->sub_char);
    if (!st->sub_char) goto oom;
    for (size_t k = 0; k < st->n; k++)
        for (size_t o = st->sub_off[k]; o < st->sub_off[k + 1]; o++) st->sub_char[o] = (int32_t)k;
    st->sub_char[j] = (int32_t)st->n;
    if (!b->need_collapse) return QUILL_OK;

    st->col = malloc(st->n + 1);
    if (!st->col) goto oom;
    for (size_t k = 0; k < st->n; k++) {
        uint32_t c = st->cp[k];
        st->col[k] = c < 0x80 ? (unsigned char)c : is_space_above_ascii(c) ? C_SPACE : C_OTHER;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->classify, NULL);
    if (!md) goto oom;
    static const unsigned char group_byte[] = {0, C_NUMBER, C_LETTER, C_PUNCT, C_MARK, C_SYMBOL};
    for (size_t at = 0; at < j;) {
        int rc = run(b->classify, (const unsigned char *)st->sub, j, at, md);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            pcre2_match_data_free(md);
            return match_error(rc, b, len, err);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        unsigned char byte = group_byte[rc - 1];
        for (int32_t k = st->sub_char[ov[0]]; k < st->sub_char[ov[1]]; k++)
            if (st->cp[k] >= 0x80) st->col[k] = byte;
        at = ov[1];
    }
    pcre2_match_data_free(md);
    return QUILL_OK;
oom:
    return quill_fail(err, QUILL_E_NOMEM, "out of memory while pre-tokenizing %zu bytes", len);
}

/* Splits each piece of `st` with one expression; text no match covers stays a piece. */
static quill_status split_with(const bpe_model *b, const expr *e, split_state *st, size_t len, quill_error *err) {
    size_t *out = NULL, n_out = 0, cap = 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(e->code, NULL);
    if (!md) return quill_fail(err, QUILL_E_NOMEM, "out of memory while pre-tokenizing");
    size_t start = 0;   /* in characters */
    quill_status s = QUILL_OK;
    for (size_t p = 0; p < st->n_pieces && !s; p++) {
        size_t n = st->pieces[p];
        const unsigned char *subj;
        size_t subj_len;
        if (e->collapsed) {
            subj = st->col + start;
            subj_len = n;
        } else {
            subj = (const unsigned char *)st->sub + st->sub_off[start];
            subj_len = st->sub_off[start + n] - st->sub_off[start];
        }
        size_t done = 0, at = 0;   /* characters of the piece emitted; byte position in subj */
        while (at < subj_len) {
            int rc = run(e->code, subj, subj_len, at, md);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                s = match_error(rc, b, len, err);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (!e->collapsed) {
                ms = (size_t)st->sub_char[st->sub_off[start] + ms] - start;
                me = (size_t)st->sub_char[st->sub_off[start] + me] - start;
            }
            if ((ms > done && !push_piece(&out, &n_out, &cap, ms - done)) || !push_piece(&out, &n_out, &cap, me - ms)) {
                s = quill_fail(err, QUILL_E_NOMEM, "out of memory while pre-tokenizing");
                break;
            }
            done = me;
            at = ov[1];
        }
        if (!s && done < n && !push_piece(&out, &n_out, &cap, n - done))
            s = quill_fail(err, QUILL_E_NOMEM, "out of memory while pre-tokenizing");
        start += n;
    }
    pcre2_match_data_free(md);
    if (s) {
        free(out);
        return s;
    }
    free(st->pieces);
    st->pieces = out;
    st->n_pieces = n_out;
    st->cap_pieces = cap;
    return QUILL_OK;
}

/* ---------------------------------------------------------------- merging */

/* start and n: bytes of the word */
typedef merge_symbol symbol;

/* Pairs merge lowest rank first, then leftmost, as the reference's comparator orders them: the
 * merge heap's key is rank << 32 | left. */
typedef struct {
    symbol *sym;
    size_t sym_cap;
    merge_heap heap;
} bpe_scratch;

static bool try_pair(const bpe_model *b, bpe_scratch *s, const char *w, int left, int right) {
    if (left < 0 || right < 0) return true;
    const symbol *l = &s->sym[left], *r = &s->sym[right];
    int32_t rank = merge_find(b, w + l->start, l->n, w + r->start, r->n);
    if (rank < 0) return true;
    return merge_heap_push(&s->heap, (merge_pair){(uint64_t)rank << 32 | (uint32_t)left, right, (uint32_t)(l->n + r->n)});
}

static bool bpe_word(const quill_tokenizer *t, bpe_scratch *s, const char *w, size_t n, ivec *out) {
    const bpe_model *b = t->bpe;
    size_t newlines = 0;
    while (b->spm_style && newlines < n && w[newlines] == '\n') newlines++;
    if (b->ignore_merges || (n && newlines == n)) {
        int32_t id = vocab_lookup(t, w, n);
        if (id >= 0) return ivec_push(out, id);
    }
    if (n > s->sym_cap) {
        symbol *y = realloc(s->sym, n * sizeof *y);
        if (!y) return false;
        s->sym = y;
        s->sym_cap = n;
    }
    int count = 0;
    for (size_t off = 0; off < n; count++) {
        size_t cl = utf8_lead_len((unsigned char)w[off]);
        if (cl > n - off) cl = n - off;
        s->sym[count] = (symbol){count - 1, off + cl == n ? -1 : count + 1, off, cl};
        off += cl;
    }
    s->heap.n = 0;
    for (int i = 1; i < count; i++)
        if (!try_pair(b, s, w, i - 1, i)) return false;
    for (int left; (left = merge_heap_merge_next(&s->heap, s->sym)) >= 0;)
        if (!try_pair(b, s, w, s->sym[left].prev, left) || !try_pair(b, s, w, left, s->sym[left].next)) return false;
    for (int i = 0; i != -1 && count; i = s->sym[i].next) {
        const char *p = w + s->sym[i].start;
        size_t sn = s->sym[i].n;
        int32_t id = vocab_lookup(t, p, sn);
        if (id >= 0) {
            if (!ivec_push(out, id)) return false;
            continue;
        }
        /* As the reference: each byte of the unknown symbol that is a token by itself (only the
         * printable ASCII ones can be; Gemma 4: its <0xXX> token), the others are dropped. */
        for (size_t k = 0; k < sn; k++) {
            char hex[7];
            snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)p[k]);
            int32_t bt = b->spm_style ? vocab_lookup(t, hex, 6) : vocab_lookup(t, p + k, 1);
            if (bt >= 0 && !ivec_push(out, bt)) return false;
        }
    }
    return true;
}

quill_status bpe_fragment(const quill_tokenizer *t, const char *text, size_t len, ivec *out, quill_error *err) {
    const bpe_model *b = t->bpe;
    char *escaped = NULL;
    if (b->spm_style) {
        /* SentencePiece's normalizer: every space is U+2581 */
        size_t spaces = 0;
        for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
        if (spaces) {
            if (!(escaped = malloc(len + 2 * spaces + 1)))
                return quill_fail(err, QUILL_E_NOMEM, "out of memory while tokenizing %zu bytes", len);
            size_t j = 0;
            for (size_t i = 0; i < len; i++)
                if (text[i] == ' ') memcpy(escaped + j, "\xe2\x96\x81", 3), j += 3;
                else escaped[j++] = text[i];
            text = escaped;
            len = j;
        }
    }
    split_state st = {0};
    quill_status s = build_subject(b, &st, text, len, err);
    if (!s && st.n && !push_piece(&st.pieces, &st.n_pieces, &st.cap_pieces, st.n))
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory while pre-tokenizing %zu bytes", len);
    for (int i = 0; i < b->n_exprs && !s && st.n; i++) s = split_with(b, &b->exprs[i], &st, len, err);
    if (s) {
        split_free(&st);
        free(escaped);
        return s;
    }
    /* Each piece: its characters in UTF-8, each byte as GPT-2's character for it (at most 2 bytes;
     * Gemma 4: the UTF-8 itself). */
    char *word = malloc(8 * len + 8);
    bpe_scratch scratch = {0};
    bool ok = word != NULL;
    size_t start = 0;
    for (size_t p = 0; p < st.n_pieces && ok; p++) {
        size_t wn = 0;
        for (size_t k = start; k < start + st.pieces[p]; k++) {
            char u[4];
            size_t un = utf8_encode(st.cp[k], u);
            for (size_t q = 0; q < un; q++)
                wn += b->spm_style ? (word[wn] = u[q], 1) : utf8_encode(byte_char((unsigned char)u[q]), word + wn);
        }
        ok = bpe_word(t, &scratch, word, wn, out);
        start += st.pieces[p];
    }
    free(word);
    free(escaped);
    free(scratch.sym);
    free(scratch.heap.items);
    split_free(&st);
    return ok ? QUILL_OK : quill_fail(err, QUILL_E_NOMEM, "out of memory while tokenizing %zu bytes", len);
}
