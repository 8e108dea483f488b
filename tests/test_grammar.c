/* Constrained decoding: the GBNF parser (what it accepts, what it refuses and how it says so),
 * the matcher (texts in and out of a grammar, the fast token mask against the plain one), JSON
 * Schema conversion (each schema's grammar checked on texts it must accept and refuse), and
 * generation under a grammar (always a sentence of it, even from a model that follows nothing;
 * deterministic at temperature 0). */
#include "golden.h"
#include "test.h"

#include "quill.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static quill_grammar *parse_ok(const char *text) {
    quill_grammar *g = NULL;
    quill_error err;
    if (quill_grammar_parse(NULL, text, strlen(text), NULL, &g, &err) != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "grammar refused: %s\n%s", err.message, text);
        return NULL;
    }
    return g;
}

static bool accepts(const quill_grammar *g, const char *text) { return quill_grammar_accepts(g, text, strlen(text)); }

/* Every piece of the syntax the reference's grammars use. */
static const char syntax_grammar[] =
    "# a comment line\r\n"
    "root ::= greeting \" \" name punct? tail{0,2} list   # after a rule too\n"
    "greeting ::= (\"hello\" | \"hi\" |\n"
    "              \"hey\")\n"
    "name ::= [A-Z] [a-z]+ | \"\\x41\\u00e9\\U0001F600\"\n"
    "punct ::= [.!?]\n"
    "tail ::= \"~\"\n"
    "list ::= \"[\" ( item (\",\" item)* )? \"]\" any{2} digits\n"
    "item ::= [^,\\[\\]]{1,3}\n"
    "any ::= .\n"
    "digits ::= [0-9]{2,} | \"-\"+\n";

TEST(grammar_parses_the_reference_syntax) {
    quill_grammar *g = parse_ok(syntax_grammar);
    if (!g) return;
    CHECK(accepts(g, "hello Bob![a,bc]xy12"));
    CHECK(accepts(g, "hey Zed~~[]\xc3\xa9z-"));
    CHECK(accepts(g, "hi A\xc3\xa9\xf0\x9f\x98\x80[]..123456"));
    CHECK(!accepts(g, "hello bob[]xy12"), "lower-case name");
    CHECK(!accepts(g, "hello Bob~~~[]xy12"), "three tails");
    CHECK(!accepts(g, "hello Bob[abcd]xy12"), "item of four");
    CHECK(!accepts(g, "hello Bob[]xy1"), "one digit");
    CHECK(!accepts(g, "hello Bob[]x"), "one any");
    CHECK(!accepts(g, "hello Bob[]xy12 "), "trailing text");
    CHECK(!accepts(g, "hello Bob[a,]xy12"), "empty item");
    CHECK(!accepts(g, "hello Bob! []xy12"), "a space the grammar does not have");
    quill_grammar_free(g);

    /* another root, and token elements (matched only by tokens, never by text) */
    const char *alt = "start ::= \"a\" | <[5]> \"b\"\n";
    quill_grammar *h = NULL;
    quill_error err;
    CHECK(quill_grammar_parse(NULL, alt, strlen(alt), "start", &h, &err) == QUILL_OK, "%s", err.message);
    CHECK(accepts(h, "a") && !accepts(h, "b"));
    quill_grammar_free(h);
}

TEST(grammar_errors_say_where_and_what) {
    static const struct {
        const char *text, *message;
    } cases[] = {
        {"root ::= foo\n", "line 1, column 10: rule 'foo' is used but never defined"},
        {"root ::= \"a\" | root \"b\"\n", "rule 'root' is left-recursive"},
        {"root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"\n", "rule 'x' is left-recursive"},
        {"x ::= \"a\"\n", "there is no rule 'root'"},
        {"", "the grammar is empty"},
        {"root ::= \"a\"{3,1}\n", "whose maximum is below its minimum"},
        {"root ::= \"a\"{2001}\n", "a repetition count above 2000"},
        {"root ::= (\"a\"\n", "expected ')'"},
        {"root ::= \"\\q\"\n", "line 1, column 11: unknown escape '\\q'"},
        {"root = \"a\"\n", "expected '::=' after the rule name 'root'"},
        {"root ::= \"abc\n", "unterminated string literal"},
        {"root ::= [abc\n", "unterminated character class"},
        {"root ::= [z-a]\n", "is empty"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule 'root' is defined twice"},
        {"root ::= * \"a\"\n", "needs something before it"},
        {"root ::= \"a\" )\n", "unexpected ')'"},
        {"root ::= \"\\x4\"\n", "expected 2 hex digits"},
        {"root ::= <|im_end|>\n", "needs the model's vocabulary"},
        {"root ::= \"\xff\"\n", "invalid UTF-8"},
        {"root ::= \"a\"{1,2}{3}\n", "needs something before it"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        quill_grammar *g = (quill_grammar *)1;
        quill_error err = {0};
        quill_status st = quill_grammar_parse(NULL, cases[i].text, strlen(cases[i].text), NULL, &g, &err);
        CHECK(st == QUILL_E_FORMAT && g == NULL, "case %zu (%s) parsed", i, cases[i].text);
        CHECK_STR_CONTAINS(err.message, cases[i].message);
    }
    quill_grammar *g;
    CHECK_EQ_INT(quill_grammar_parse(NULL, NULL, 0, NULL, &g, NULL), QUILL_E_ARG);
    /* a repetition that would expand past the size limit is refused, not built */
    char big[800];
    memset(big, 'a', sizeof big);
    memcpy(big, "root ::= \"", 10);
    memcpy(big + sizeof big - 10, "\"{2000}\n", 9);
    big[sizeof big - 1] = 0;
    quill_error err2;
    CHECK_EQ_INT(quill_grammar_parse(NULL, big, strlen(big), NULL, &g, &err2), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err2.message, "the grammar is too large");
    /* groups repeat by reference: deep nesting of large repetitions stays small */
    const char *nested = "root ::= ((((\"a\"{1000}){1000}){1000}){1000})\n";
    CHECK_EQ_INT(quill_grammar_parse(NULL, nested, strlen(nested), NULL, &g, &err2), QUILL_OK);
    CHECK(quill_grammar_n_rules(g) < 5000, "%zu rules", quill_grammar_n_rules(g));
    quill_grammar_free(g);
}

static const char json_gbnf[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

TEST(grammar_matcher_follows_text) {
    quill_grammar *g = parse_ok(json_gbnf);
    if (!g) return;
    CHECK(accepts(g, "{}"));
    CHECK(accepts(g, "{\"a\": 1, \"b\": [true, null, \"x\\n\\u00e9\"], \"c\": {\"d\": -1.5e3}}"));
    CHECK(!accepts(g, "{"));
    CHECK(!accepts(g, "[1]"));
    CHECK(!accepts(g, "{\"a\" 1}"));
    CHECK(!accepts(g, "{\"a\": 01}"));
    quill_grammar_matcher *m;
    quill_error err;
    CHECK(quill_grammar_matcher_new(g, NULL, &m, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_grammar_matcher_accept_text(m, "{\"k\": \"\xc3", 8));   /* half a character */
    CHECK(!quill_grammar_matcher_can_end(m));
    CHECK(!quill_grammar_matcher_accept_text(m, "x", 1), "a character cut short");
    CHECK(quill_grammar_matcher_accept_text(m, "\xa9\"}", 3));
    CHECK(quill_grammar_matcher_can_end(m) && !quill_grammar_matcher_is_dead(m));
    CHECK(!quill_grammar_matcher_accept_text(m, "x", 1));
    quill_grammar_matcher_reset(m);
    CHECK(!quill_grammar_matcher_can_end(m) && quill_grammar_matcher_accept_text(m, "{}", 2));
    quill_grammar_matcher_free(m);
    quill_grammar_free(g);

    /* only valid UTF-8 gets through: no overlong forms, surrogates or values past U+10FFFF */
    g = parse_ok("root ::= .+\n");
    CHECK(g && accepts(g, "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf"));
    static const char *const invalid[] = {"\xc0\x80", "\xc1\xbf", "\xe0\x81\x81", "\xed\xa0\x80", "\xf0\x80\x80\x80",
                                          "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "\xff"};
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) CHECK(!accepts(g, invalid[i]), "invalid %zu", i);
    quill_grammar_free(g);
    /* nullable items repeated many times: the parse state stays small and quick */
    g = parse_ok("root ::= \"a\" (\"x\" | y){0,300} \"!\"\ny ::= [^z!]*\n");
    CHECK(g && accepts(g, "axxbyx!") && accepts(g, "a!") && !accepts(g, "az!"));
    quill_grammar_free(g);
}

static bool load_vocab(const char *shared, const char *file, quill_gguf **gg, quill_tokenizer **tok,
                       quill_grammar_vocab **v) {
    char *path = path_join(shared, file);
    quill_error err;
    bool ok = quill_gguf_open(path, gg, &err) == QUILL_OK;
    free(path);
    if (ok && quill_tokenizer_load(*gg, tok, &err) != QUILL_OK) {
        quill_gguf_close(*gg);
        ok = false;
    }
    if (ok && quill_grammar_vocab_new(*tok, v, &err) != QUILL_OK) {
        quill_tokenizer_free(*tok);
        quill_gguf_close(*gg);
        ok = false;
    }
    if (!ok) test_fail(__FILE__, __LINE__, "%s: %s", file, err.message);
    return ok;
}

/* The trie walk and the token-by-token check give the same mask, along random paths through
 * the grammar, on a SentencePiece and a byte-level BPE vocabulary (byte tokens, pieces that cut
 * characters, leading spaces). */
TEST(grammar_fast_mask_matches_plain) {
    REQUIRE_SHARED(shared);
    static const char *const vocabs[] = {"tokenizer/ggml-vocab-llama-spm.gguf", "tokenizer/ggml-vocab-qwen2.gguf"};
    static const char *const grammars[] = {
        json_gbnf,
        "root ::= (\"- \" item \"\\n\")+\nitem ::= [^\\n\xc3\xa9]{1,12} | \"\xc3\xa9t\xc3\xa9\" | [\\u4e00-\\u9fff]+\n",
    };
    uint64_t rng = 42;
    for (size_t vi = 0; vi < 2; vi++) {
        quill_gguf *gg;
        quill_tokenizer *tok;
        quill_grammar_vocab *v;
        if (!load_vocab(shared, vocabs[vi], &gg, &tok, &v)) return;
        const int32_t n = quill_tokenizer_n_vocab(tok);
        const size_t words = ((size_t)n + 63) / 64;
        uint64_t *fast = malloc(words * 8), *plain = malloc(words * 8);
        for (size_t gi = 0; gi < 2; gi++) {
            quill_grammar *g = parse_ok(grammars[gi]);
            quill_grammar_matcher *m;
            quill_error err;
            CHECK(g && quill_grammar_matcher_new(g, v, &m, &err) == QUILL_OK);
            for (int walk = 0; walk < 2; walk++) {
                quill_grammar_matcher_reset(m);
                for (int step = 0; step < 16; step++) {
                    CHECK(quill_grammar_matcher_mask(m, fast, &err) == QUILL_OK, "%s", err.message);
                    CHECK(quill_grammar_matcher_mask_plain(m, plain, &err) == QUILL_OK, "%s", err.message);
                    size_t allowed = 0;
                    for (int32_t t = 0; t < n; t++) {
                        bool a = fast[t / 64] >> (t % 64) & 1, b = plain[t / 64] >> (t % 64) & 1;
                        CHECK(a == b, "%s, grammar %zu, step %d: token %d (%s) fast %d plain %d", vocabs[vi], gi, step,
                              t, quill_tokenizer_piece(tok, t), a, b);
                        if (t % 7 == 0) CHECK(a == quill_grammar_matcher_allows(m, t), "allows() disagrees on %d", t);
                        allowed += a;
                    }
                    CHECK(allowed > 0, "nothing allowed at step %d", step);
                    /* a random allowed token, an end-of-generation one only at the end */
                    size_t pick = test_rand(&rng) % allowed;
                    int32_t t = 0;
                    for (; t < n; t++)
                        if ((fast[t / 64] >> (t % 64) & 1) && pick-- == 0) break;
                    if (quill_tokenizer_is_eog(tok, t)) break;
                    CHECK(quill_grammar_matcher_accept_token(m, t), "token %d was allowed but not accepted", t);
                }
            }
            quill_grammar_matcher_free(m);
            quill_grammar_free(g);
        }
        free(fast);
        free(plain);
        quill_grammar_vocab_free(v);
        quill_tokenizer_free(tok);
        quill_gguf_close(gg);
    }
}

/* Tokens named in the grammar: <|text|> by the vocabulary's own text, <[id]> and !<[id]> by id.
 * An end-of-generation token only ends a complete text, as in the reference. */
TEST(grammar_token_elements) {
    REQUIRE_SHARED(shared);
    quill_gguf *gg;
    quill_tokenizer *tok;
    quill_grammar_vocab *v;
    if (!load_vocab(shared, "tokenizer/ggml-vocab-qwen2.gguf", &gg, &tok, &v)) return;
    int32_t *ids = NULL;
    size_t n = 0;
    quill_error err;
    CHECK(quill_tokenize(tok, "<|im_start|>", 12, false, true, &ids, &n, &err) == QUILL_OK && n == 1);
    const int32_t im_start = ids[0];
    free(ids);
    CHECK(quill_tokenize(tok, "<|im_end|>", 10, false, true, &ids, &n, &err) == QUILL_OK && n == 1);
    const int32_t im_end = ids[0];
    free(ids);
    const char *text = "root ::= \"ok\" <|im_start|> !<[0]>\n";
    quill_grammar *g = NULL;
    CHECK(quill_grammar_parse(tok, text, strlen(text), NULL, &g, &err) == QUILL_OK, "%s", err.message);
    quill_grammar_matcher *m;
    CHECK(quill_grammar_matcher_new(g, v, &m, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_grammar_matcher_accept_text(m, "ok", 2));
    const size_t words = ((size_t)quill_tokenizer_n_vocab(tok) + 63) / 64;
    uint64_t *bits = malloc(words * 8), *plain = malloc(words * 8);
    CHECK(quill_grammar_matcher_mask(m, bits, &err) == QUILL_OK && quill_grammar_matcher_mask_plain(m, plain, &err) == QUILL_OK);
    size_t allowed = 0;
    for (size_t w = 0; w < words; w++) allowed += (size_t)__builtin_popcountll(bits[w]);
    const bool has_start = bits[im_start / 64] >> (im_start & 63) & 1;
    CHECK(allowed == 1 && has_start && !memcmp(bits, plain, words * 8), "%zu allowed", allowed);
    CHECK(!quill_grammar_matcher_accept_token(m, im_end), "end of generation before the text is complete");
    CHECK(quill_grammar_matcher_accept_token(m, im_start) && !quill_grammar_matcher_can_end(m));
    CHECK(!quill_grammar_matcher_allows(m, 0) && quill_grammar_matcher_allows(m, 1) && !quill_grammar_matcher_allows(m, im_end));
    CHECK(quill_grammar_matcher_accept_token(m, 5) && quill_grammar_matcher_can_end(m));
    CHECK(quill_grammar_matcher_allows(m, im_end) && !quill_grammar_matcher_allows(m, 5));
    free(bits);
    free(plain);
    quill_grammar_matcher_free(m);
    quill_grammar_free(g);
    quill_grammar_vocab_free(v);
    quill_tokenizer_free(tok);
    quill_gguf_close(gg);
}

/* ---------------------------------------------------------------- JSON Schema */

static void schema_case(const char *schema, const char *const *good, const char *const *bad) {
    char *gbnf = NULL;
    quill_error err;
    if (quill_json_schema_to_grammar(schema, strlen(schema), &gbnf, &err) != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "schema refused: %s\n%s", err.message, schema);
        return;
    }
    quill_grammar *g = NULL;
    if (quill_grammar_parse(NULL, gbnf, strlen(gbnf), NULL, &g, &err) != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "the grammar of %s does not parse: %s\n%s", schema, err.message, gbnf);
        free(gbnf);
        return;
    }
    for (int i = 0; good && good[i]; i++)
        if (!accepts(g, good[i])) test_fail(__FILE__, __LINE__, "%s should accept %s; grammar:\n%s", schema, good[i], gbnf);
    for (int i = 0; bad && bad[i]; i++)
        if (accepts(g, bad[i])) test_fail(__FILE__, __LINE__, "%s should refuse %s; grammar:\n%s", schema, bad[i], gbnf);
    quill_grammar_free(g);
    free(gbnf);
}

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

TEST(json_schema_conversions) {
    schema_case("{\"type\":\"object\"}", LIST("{}", "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}"), LIST("[]", "{"));
    schema_case("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
                "\"minItems\":1,\"maxItems\":2}},\"required\":[\"name\",\"age\"]}",
                LIST("{\"name\": \"bob\", \"age\": 3}", "{\"name\":\"\",\"age\":-1,\"tags\":[\"x\"]}",
                     "{ \"name\": \"ab\", \"age\": 0, \"tags\": [\"a\", \"b\"] }"),
                LIST("{\"age\": 3, \"name\": \"bob\"}", "{\"name\": \"bobbyb\", \"age\": 3}",
                     "{\"name\":\"a\",\"age\":1,\"tags\":[]}", "{\"name\":\"a\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"]}",
                     "{\"name\":\"a\",\"age\":1.5}", "{\"name\":\"a\",\"age\":1,\"x\":1}", "{\"name\":\"a\"}"));
    schema_case("{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1]},\"q\\\"\\\\\"]}",
                LIST("\"red\"", "1", "null", "{\"a\":[1]}", "\"q\\\"\\\\\""), LIST("\"blue\"", "2", "\"Red\""));
    schema_case("{\"const\":\"x\\\"y\"}", LIST("\"x\\\"y\""), LIST("\"xy\""));
    schema_case("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}", LIST("12", "true"), LIST("\"a\"", "1.5"));
    schema_case("{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"number\"}]}", LIST("null", "-0.5e+3"), LIST("true"));
    /* $ref, also recursive, to $defs and definitions */
    schema_case("{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":"
                "{\"type\":\"number\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},"
                "\"required\":[\"v\",\"next\"]}}}",
                LIST("{\"v\": 1, \"next\": {\"v\": 2.5, \"next\": null}}"), LIST("{\"v\": 1}", "{\"v\": 1, \"next\": 2}"));
    schema_case("{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/b\"},\"definitions\":{\"b\":{\"type\":\"boolean\"}}}",
                LIST("[]", "[true, false]"), LIST("[1]"));
    /* optional properties: each at most once, in order; without a required one any may come first */
    schema_case("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"}}}",
                LIST("{}", "{\"a\": true}", "{\"b\": null}", "{\"a\": false, \"b\": null}"),
                LIST("{\"b\": null, \"a\": true}", "{,}", "{\"a\": true, \"a\": true}"));
    schema_case("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},\"additionalProperties\":"
                "{\"type\":\"integer\"}}",
                LIST("{}", "{\"a\": true, \"z\": 1}", "{\"q\": 2, \"r\": 3}"), LIST("{\"q\": \"s\"}"));
    schema_case("{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":false}",
                LIST("{\"a\": [1]}", "{}"), LIST("{\"b\": 1}"));
    schema_case("{\"type\":[\"string\",\"null\"],\"format\":\"date\"}", LIST("\"2024-02-29\"", "null"),
                LIST("\"2024-13-01\"", "\"24-01-01\""));
    schema_case("{\"type\":\"string\",\"format\":\"date-time\"}",
                LIST("\"2024-02-29T12:30:00Z\"", "\"2024-02-29T12:30:00.123+01:00\""), LIST("\"2024-02-29 12:30:00\""));
    schema_case("{\"type\":\"string\",\"format\":\"time\"}", LIST("\"23:59:59Z\""), LIST("\"24:00:00Z\""));
    schema_case("{\"type\":\"string\",\"format\":\"uuid\"}", LIST("\"123e4567-e89b-12d3-a456-426614174000\""),
                LIST("\"123e4567\""));
    schema_case("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", LIST("\"ab\"", "\"a\\nb\""),
                LIST("\"a\"", "\"abcd\""));
    schema_case("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}",
                LIST("[1, \"a\"]"), LIST("[1]", "[1, \"a\", 2]"));
    schema_case("{\"type\":\"array\",\"maxItems\":0}", LIST("[]"), LIST("[1]"));
    schema_case("{\"title\":\"anything\",\"description\":\"no type\"}", LIST("1", "\"s\"", "[{}]"), LIST("x"));
    schema_case("true", LIST("1", "{\"a\":null}"), NULL);
    /* integer bounds, digit by digit */
    schema_case("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":123}", LIST("-5", "-1", "0", "7", "99", "100", "123"),
                LIST("-6", "-0", "124", "200", "1000", "01", "1.5"));
    schema_case("{\"type\":\"integer\",\"exclusiveMinimum\":0}", LIST("1", "9", "10", "12345678901234567890"),
                LIST("0", "-1", "007"));
    schema_case("{\"type\":\"integer\",\"minimum\":10,\"maximum\":10}", LIST("10"), LIST("1", "11", "0"));
    schema_case("{\"type\":\"integer\",\"maximum\":-3}", LIST("-3", "-4", "-100000"), LIST("-2", "0", "3"));
    schema_case("{\"type\":\"integer\",\"minimum\":1.5,\"exclusiveMaximum\":40}", LIST("2", "39"), LIST("1", "40"));
    schema_case("{\"type\":\"integer\",\"minimum\":250,\"maximum\":31999}", LIST("250", "299", "999", "1000", "31999", "30000"),
                LIST("249", "32000", "99999", "25"));
}

TEST(json_schema_refusals_name_the_keyword) {
    static const struct {
        const char *schema, *message;
        quill_status status;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", "the keyword 'pattern' at # is not supported", QUILL_E_UNSUPPORTED},
        {"{\"type\":\"number\",\"minimum\":0.5}", "'minimum' 0.5 at # is not a whole number", QUILL_E_UNSUPPORTED},
        {"{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", "leave no value", QUILL_E_FORMAT},
        {"{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\",\"format\":\"email\"}}}",
         "the string format 'email' at #/properties/e is not supported", QUILL_E_UNSUPPORTED},
        {"{\"allOf\":[{\"type\":\"string\"}]}", "the keyword 'allOf'", QUILL_E_UNSUPPORTED},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "the keyword 'uniqueItems'", QUILL_E_UNSUPPORTED},
        {"{\"type\":\"object\",\"patternProperties\":{}}", "the keyword 'patternProperties'", QUILL_E_UNSUPPORTED},
        {"{\"$ref\":\"#/$defs/missing\"}", "points to nothing", QUILL_E_FORMAT},
        {"{\"$ref\":\"http://example.com/s.json\"}", "is not supported (only #/$defs/NAME", QUILL_E_UNSUPPORTED},
        {"{\"type\":\"strin\"}", "the type 'strin' at # is not a JSON Schema type", QUILL_E_UNSUPPORTED},
        {"{\"type\":\"object\",", "malformed JSON", QUILL_E_FORMAT},
        {"{\"enum\":[]}", "is empty", QUILL_E_FORMAT},
        {"{\"type\":\"string\",\"maxLength\":-1}", "'maxLength' at # must be a whole number", QUILL_E_FORMAT},
        {"{\"type\":\"object\",\"required\":[\"x\"],\"properties\":{}}", "names 'x', which is not among",
         QUILL_E_UNSUPPORTED},
        {"false", "accepts nothing", QUILL_E_UNSUPPORTED},
        {"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "nested too deep", QUILL_E_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *gbnf = (char *)1;
        quill_error err = {0};
        quill_status st = quill_json_schema_to_grammar(cases[i].schema, strlen(cases[i].schema), &gbnf, &err);
        CHECK(st == cases[i].status && gbnf == NULL, "case %zu: status %d", i, st);
        CHECK_STR_CONTAINS(err.message, cases[i].message);
    }
}

/* ---------------------------------------------------------------- generation under a grammar */

typedef struct {
    char text[8192];
    size_t len;
    int32_t tokens[1024];
    int n_tokens;
} collected;

static bool collect(int32_t token, const char *text, size_t len, void *user) {
    collected *c = user;
    if (token >= 0 && c->n_tokens < 1024) c->tokens[c->n_tokens++] = token;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = 0;
    }
    return true;
}

/* stories260K knows nothing of JSON: at a high temperature it draws almost any token, so every
 * token passes through the grammar's mask. The text must be a sentence of the grammar whenever
 * generation ends by itself, and a prefix of one when the length limit cuts it. */
TEST(grammar_generation_always_follows_the_grammar) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_model *model;
    quill_error err;
    CHECK(quill_model_load(path, &model, &err) == QUILL_OK, "%s", err.message);
    free(path);
    quill_context *c;
    quill_context_params cp = {.n_ctx = 512, .n_threads = 1};
    CHECK(quill_context_new(model, &cp, &c, &err) == QUILL_OK, "%s", err.message);
    const quill_tokenizer *tok = quill_model_tokenizer(model);
    quill_grammar_vocab *v;
    CHECK(quill_grammar_vocab_new(tok, &v, &err) == QUILL_OK, "%s", err.message);
    char *schema_gbnf = NULL;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
                         "\"ok\":{\"type\":\"boolean\"},\"n\":{\"enum\":[1,2,3]}},\"required\":[\"name\",\"ok\"]}";
    CHECK(quill_json_schema_to_grammar(schema, strlen(schema), &schema_gbnf, &err) == QUILL_OK, "%s", err.message);
    const char *grammars[] = {"root ::= (\"yes\" | \"no\" | [0-9]{1,3}) \".\"\n", schema_gbnf,
                              "root ::= \"Once\" [a-z ]{0,20} \"!\"\n"};
    int ended = 0;
    for (size_t gi = 0; gi < 3; gi++) {
        quill_grammar *g = parse_ok(grammars[gi]);
        if (!g) break;
        for (uint64_t seed = 1; seed <= 4; seed++) {
            quill_generate_params p = quill_generate_defaults();
            p.sampling.temperature = 2.0f;
            p.sampling.top_k = 0;
            p.sampling.top_p = 1.0f;
            p.sampling.min_p = 0.0f;
            p.sampling.seed = seed;
            p.n_predict = 200;
            p.grammar = g;
            p.grammar_vocab = v;
            collected out = {0};
            quill_generate_result res;
            CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &out, &res, &err) == QUILL_OK, "%s",
                  err.message);
            quill_grammar_matcher *m;
            CHECK(quill_grammar_matcher_new(g, NULL, &m, &err) == QUILL_OK);
            CHECK(quill_grammar_matcher_accept_text(m, out.text, out.len), "grammar %zu seed %llu: \"%s\" left it",
                  gi, (unsigned long long)seed, out.text);
            if (res.finish == QUILL_FINISH_STOP) {
                CHECK(quill_grammar_matcher_can_end(m), "grammar %zu: \"%s\" ended unfinished", gi, out.text);
                ended++;
            }
            quill_grammar_matcher_free(m);
        }
        quill_grammar_free(g);
    }
    CHECK(ended >= 8, "only %d of 12 generations ended by themselves", ended);
    free(schema_gbnf);
    quill_grammar_vocab_free(v);
    quill_context_free(c);
    quill_model_free(model);
}

/* At temperature 0 the same request gives the same tokens; the grammar changes greedy text only
 * where the model's choice is not allowed. */
TEST(grammar_generation_is_deterministic) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_model *model;
    quill_error err;
    CHECK(quill_model_load(path, &model, &err) == QUILL_OK, "%s", err.message);
    free(path);
    quill_context *c;
    quill_context_params cp = {.n_ctx = 256, .n_threads = 1};
    CHECK(quill_context_new(model, &cp, &c, &err) == QUILL_OK, "%s", err.message);
    quill_grammar_vocab *v;
    CHECK(quill_grammar_vocab_new(quill_model_tokenizer(model), &v, &err) == QUILL_OK, "%s", err.message);
    /* the model's own greedy words fit: the text is the unconstrained one */
    quill_grammar *free_text = parse_ok("root ::= [a-zA-Z ,.]+\n");
    quill_grammar *digits = parse_ok("root ::= \", there were \" [0-9]{2} \" \" [a-z]+ \".\"\n");
    CHECK(free_text && digits);
    collected a = {0}, b = {0}, plain = {0};
    quill_generate_params p = quill_generate_defaults();
    p.sampling.temperature = 0;
    p.n_predict = 20;
    quill_generate_result res;
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &plain, &res, &err) == QUILL_OK, "%s", err.message);
    p.grammar = free_text;
    p.grammar_vocab = v;
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &a, &res, &err) == QUILL_OK, "%s", err.message);
    CHECK(!strcmp(a.text, plain.text), "\"%s\" vs \"%s\"", a.text, plain.text);
    p.grammar = digits;
    p.n_predict = 40;
    memset(&a, 0, sizeof a);
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &a, &res, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &b, &res, &err) == QUILL_OK, "%s", err.message);
    CHECK(a.n_tokens == b.n_tokens && !memcmp(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof *a.tokens));
    CHECK(accepts(digits, a.text), "\"%s\"", a.text);
    /* a sampler of the caller's takes the grammar as a stage; the generator refuses both at once */
    quill_generator *gen;
    quill_sampler *smp;
    CHECK(quill_sampler_new(&p.sampling, quill_tokenizer_n_vocab(quill_model_tokenizer(model)), &smp, &err) == QUILL_OK);
    CHECK_EQ_INT(quill_generator_new(quill_model_tokenizer(model), smp, &p, &gen, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "quill_sampler_add_grammar");
    CHECK(quill_sampler_add_grammar(smp, digits, v, &err) == QUILL_OK, "%s", err.message);
    p.grammar = NULL;
    memset(&b, 0, sizeof b);
    quill_context_truncate(c, 0);
    int32_t *ids;
    size_t n;
    CHECK(quill_tokenize(quill_model_tokenizer(model), "Once upon a time", 16, true, false, &ids, &n, &err) == QUILL_OK);
    CHECK(quill_generate(c, smp, ids, n, &p, collect, &b, &res, &err) == QUILL_OK, "%s", err.message);
    free(ids);
    CHECK(!strcmp(a.text, b.text), "\"%s\" vs \"%s\"", a.text, b.text);
    quill_sampler_free(smp);
    quill_grammar_free(free_text);
    quill_grammar_free(digits);
    quill_grammar_vocab_free(v);
    quill_context_free(c);
    quill_model_free(model);
}

/* The step-wise generator driven by hand (as the server's scheduler does, with the logits it
 * batched) gives what quill_generate gives. */
TEST(generator_driven_step_by_step_matches_the_loop) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_model *model;
    quill_error err;
    CHECK(quill_model_load(path, &model, &err) == QUILL_OK, "%s", err.message);
    free(path);
    quill_context *c;
    quill_context_params cp = {.n_ctx = 256, .n_threads = 1};
    CHECK(quill_context_new(model, &cp, &c, &err) == QUILL_OK, "%s", err.message);
    const quill_tokenizer *tok = quill_model_tokenizer(model);
    quill_generate_params p = quill_generate_defaults();
    p.sampling.seed = 7;
    p.sampling.repeat_penalty = 1.3f;
    p.penalize_prompt = true;
    p.n_predict = 30;
    const char *stops[] = {"park"};
    p.stop = stops;
    p.n_stop = 1;
    collected loop = {0};
    quill_generate_result res;
    CHECK(quill_generate_text(c, "Once upon a time", &p, collect, &loop, &res, &err) == QUILL_OK, "%s", err.message);

    int32_t *ids;
    size_t n;
    CHECK(quill_tokenize(tok, "Once upon a time", 16, true, false, &ids, &n, &err) == QUILL_OK);
    quill_generator *gen;
    p.text_start = false;
    CHECK(quill_generator_new(tok, NULL, &p, &gen, &err) == QUILL_OK, "%s", err.message);
    float *logits = malloc((size_t)quill_tokenizer_n_vocab(tok) * sizeof *logits);
    quill_context_truncate(c, 0);
    CHECK(quill_eval(c, ids, (int)n, logits, false, &err) == QUILL_OK);
    quill_generator_begin(gen, ids, n);
    collected step = {0};
    quill_generator_event ev = {0};
    while (!ev.done) {
        CHECK(quill_generator_step(gen, logits, quill_context_pos(c) < quill_context_n_ctx(c), &ev, &err) == QUILL_OK,
              "%s", err.message);
        if (!ev.eog) collect(ev.token, ev.text, ev.len, &step);
        collect(-1, ev.tail, ev.tail_len, &step);
        if (!ev.done) CHECK(quill_eval(c, &ev.token, 1, logits, false, &err) == QUILL_OK);
    }
    CHECK(!strcmp(loop.text, step.text), "\"%s\" vs \"%s\"", loop.text, step.text);
    CHECK(loop.n_tokens == step.n_tokens && !memcmp(loop.tokens, step.tokens, (size_t)step.n_tokens * sizeof(int32_t)));
    CHECK_EQ_INT(quill_generator_result(gen)->n_generated, res.n_generated);
    CHECK_EQ_INT(quill_generator_result(gen)->finish, res.finish);
    CHECK_EQ_INT(quill_generator_step(gen, logits, true, &ev, &err), QUILL_E_ARG);   /* over until begin */
    free(logits);
    free(ids);
    quill_generator_free(gen);
    quill_context_free(c);
    quill_model_free(model);
}

/* A caller's stage: never lets an even token through. */
static bool ban_even(void *state, float *logits, int32_t n_vocab, quill_error *err) {
    (void)err;
    int *calls = state;
    (*calls)++;
    for (int32_t i = 0; i < n_vocab; i += 2) logits[i] = -INFINITY;
    return true;
}
static bool odd_only(void *state, int32_t token) {
    (void)state;
    return token % 2 == 1;
}

TEST(sampler_stage_restricts_and_checks_first) {
    quill_sampler_params sp = quill_sampler_defaults();
    sp.seed = 3;
    quill_sampler *s;
    quill_error err;
    CHECK(quill_sampler_new(&sp, 1000, &s, &err) == QUILL_OK);
    int calls = 0;
    quill_sampler_stage st = {"ban-even", ban_even, odd_only, NULL, NULL, NULL, &calls};
    CHECK(quill_sampler_add_stage(s, &st, &err) == QUILL_OK);
    float logits[1000];
    uint64_t rng = 5;
    int draws = 200;
    for (int d = 0; d < draws; d++) {
        for (int i = 0; i < 1000; i++) logits[i] = test_randf(&rng) * 4;
        int32_t t = quill_sampler_sample(s, logits);
        CHECK(t >= 0 && (t & 1), "drew %d", t);
    }
    /* the full restriction runs only when the first draw was refused (about half the time) */
    CHECK(calls > draws / 4 && calls < draws * 3 / 4, "%d restrictions for %d draws", calls, draws);
    quill_sampler_free(s);
}

/* ---------------------------------------------------------------- the CLI's flags */

static int quill_cmd(char **out, bool merge, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int quill_cmd(char **out, bool merge, const char *fmt, ...) {
    char args[2048], cmd[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", quill_bin(), args);
    return run_cmd(cmd, out, merge);
}

TEST(grammar_cli_flags) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    char *out = NULL;
    int rc = quill_cmd(&out, false, "run -m %s -p 'Once upon a time' -n 30 --temp 0 --no-display-prompt "
                                    "--grammar 'root ::= \", there \" (\"was\" | \"were\") \" a \" [a-z]+ \".\"' 2>/dev/null",
                       model);
    CHECK(rc == 0 && out && !strncmp(out, ", there was a ", 14) && strstr(out, ".\n"), "exit %d: %s", rc, out);
    free(out);
    /* a schema: the output is one of its values */
    rc = quill_cmd(&out, false, "run -m %s -p 'Once upon a time' -n 30 --temp 0.7 -s 5 --no-display-prompt "
                                "-j '{\"enum\": [\"yes\", \"no\"]}' 2>/dev/null", model);
    CHECK(rc == 0 && out && (!strncmp(out, "\"yes\"", 5) || !strncmp(out, "\"no\"", 4)), "exit %d: %s", rc, out);
    free(out);
    /* a grammar file, and its errors with the option, line and column */
    char *path = path_join(tmp_dir(), "bad.gbnf");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("root ::= item+\nitem ::= [a-z] | undefined-rule\n", f);
    fclose(f);
    rc = quill_cmd(&out, true, "run -m %s -p x -n 4 --grammar-file %s", model, path);
    CHECK(rc == 1 && out && strstr(out, "--grammar-file: grammar: line 2, column 18: rule 'undefined-rule' is used but "
                                        "never defined"), "exit %d: %s", rc, out);
    free(out);
    free(path);
    /* a schema is checked before any model loads; two constraints at once are refused */
    rc = quill_cmd(&out, true, "run -m /nonexistent.gguf -p x --json-schema '{\"type\": \"strin\"}'");
    CHECK(rc == 1 && out && strstr(out, "--json-schema: json_schema: the type 'strin'") && !strstr(out, "nonexistent"),
          "exit %d: %s", rc, out);
    free(out);
    rc = quill_cmd(&out, true, "run -m %s -p x --grammar 'root ::= \"a\"' -j '{}'", model);
    CHECK(rc == 1 && out && strstr(out, "give one of --grammar"), "exit %d: %s", rc, out);
    free(out);
    /* chat: every reply follows the grammar (raw mode: stories260K has no template) */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\nThe dog\\n/quit\\n' | %s chat -m %s -n 20 --temp 0 "
                              "--grammar 'root ::= \" [\" [a-z ]{1,12} \"]\"' 2>/dev/null", quill_bin(), model);
    rc = run_cmd(cmd, &out, false);
    const char *first = out ? strstr(out, " [") : NULL;
    const char *second = first ? strstr(first + 2, " [") : NULL;
    CHECK(rc == 0 && first && second && strchr(first, ']') && strchr(second, ']'), "exit %d: %s", rc, out);
    free(out);
    free(model);
}
