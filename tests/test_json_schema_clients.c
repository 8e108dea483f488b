/* JSON Schemas as the common client libraries write them, converted to grammars: zod through the
 * Vercel AI SDK (zod 4's toJSONSchema and zod 3's zod-to-json-schema) and through OpenAI's
 * zodResponseFormat, Pydantic's model_json_schema() as users paste it ($defs/$ref, anyOf with null
 * for Optional, enums, nested arrays of objects); numeric bounds up to 64 bits, exclusive bounds
 * and multipleOf; what a grammar cannot express is refused naming the keyword. */
#include "test.h"

#include "quill_model.h"

#include <stdlib.h>
#include <string.h>

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
        if (!quill_grammar_accepts(g, good[i], strlen(good[i])))
            test_fail(__FILE__, __LINE__, "%s should accept %s; grammar:\n%s", schema, good[i], gbnf);
    for (int i = 0; bad && bad[i]; i++)
        if (quill_grammar_accepts(g, bad[i], strlen(bad[i])))
            test_fail(__FILE__, __LINE__, "%s should refuse %s; grammar:\n%s", schema, bad[i], gbnf);
    quill_grammar_free(g);
    free(gbnf);
}

static void refused(const char *schema, const char *message) {
    char *gbnf = NULL;
    quill_error err = {0};
    quill_status st = quill_json_schema_to_grammar(schema, strlen(schema), &gbnf, &err);
    if (st == QUILL_OK) test_fail(__FILE__, __LINE__, "%s was accepted", schema);
    else if (!strstr(err.message, message)) test_fail(__FILE__, __LINE__, "%s: [%s] does not say [%s]", schema, err.message, message);
    free(gbnf);
}

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

TEST(json_schema_numeric_bounds) {
    /* zod's z.int() / z.number().int(): the safe-integer bounds, 16 digits */
    schema_case("{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}",
                LIST("0", "42", "-7", "9007199254740991", "-9007199254740991", "1000000000000000"),
                LIST("9007199254740992", "-9007199254740992", "10000000000000000", "1.5", "-0", "01"));
    /* 64-bit */
    schema_case("{\"type\":\"integer\",\"minimum\":-9223372036854775807,\"maximum\":9223372036854775807}",
                LIST("9223372036854775807", "-9223372036854775807", "123"), LIST("9223372036854775808", "-9223372036854775808"));
    schema_case("{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true}", LIST("1", "70"), LIST("0", "-1"));
    schema_case("{\"type\":\"integer\",\"exclusiveMaximum\":9223372036854775807}", LIST("9223372036854775806", "-5"),
                LIST("9223372036854775807"));
    schema_case("{\"type\":\"integer\",\"minimum\":1,\"maximum\":7,\"multipleOf\":1}", LIST("1", "7"), LIST("0", "8", "1.0"));
    /* numbers: whole bounds, inclusive and exclusive (zod's positive() is exclusiveMinimum 0) */
    schema_case("{\"type\":\"number\",\"minimum\":0,\"maximum\":100}", LIST("0", "0.5", "99.99", "100", "100.0", "7"),
                LIST("-0.5", "100.5", "101", "-1", "100.01"));
    schema_case("{\"type\":\"number\",\"exclusiveMinimum\":0}", LIST("0.5", "1", "12.25", "0.001", "123456789"),
                LIST("0", "-0.5", "0.0", "-1", "-0"));
    schema_case("{\"type\":\"number\",\"exclusiveMaximum\":0}", LIST("-0.5", "-3", "-100.25"), LIST("0", "0.5", "-0", "-0.0"));
    schema_case("{\"type\":\"number\",\"minimum\":-1,\"exclusiveMaximum\":1}", LIST("-1", "-0.5", "0", "0.99", "-1.0"),
                LIST("1", "1.0", "-1.5", "-2"));
    schema_case("{\"type\":\"number\",\"minimum\":-10,\"maximum\":-2}", LIST("-10", "-2", "-2.0", "-5.5", "-9.99"),
                LIST("-1.5", "-10.5", "0", "-11"));
    schema_case("{\"type\":\"number\",\"multipleOf\":0.01}", LIST("1.25", "-3", "0.1", "0"), LIST("1.255", "1e2"));
    schema_case("{\"type\":\"number\",\"multipleOf\":1,\"minimum\":2}", LIST("2", "30"), LIST("2.5", "1"));
    /* what no grammar here expresses is refused, naming the keyword */
    refused("{\"type\":\"integer\",\"maximum\":18446744073709551615}", "'maximum' 18446744073709551615 at # is beyond 64-bit");
    refused("{\"type\":\"number\",\"minimum\":0.5}", "'minimum' 0.5 at # is not a whole number");
    refused("{\"type\":\"integer\",\"multipleOf\":5}", "'multipleOf' 5 at # is not supported");
    refused("{\"type\":\"number\",\"multipleOf\":0.25}", "'multipleOf' 0.25 at # is not supported");
    refused("{\"type\":\"number\",\"minimum\":3,\"exclusiveMaximum\":3}", "leave no value");
}
