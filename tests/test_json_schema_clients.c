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

/* zod 4 (z.toJSONSchema, as the AI SDK's generateObject sends it): ints with the safe-integer
 * bounds, positive() as exclusiveMinimum, nullable() as anyOf with null, enums, arrays. */
static const char zod4_schema[] =
    "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
    "\"string\"},\"count\":{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991},\"score\":"
    "{\"type\":\"number\",\"exclusiveMinimum\":0},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"kind\":"
    "{\"type\":\"string\",\"enum\":[\"a\",\"b\"]},\"nickname\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"name\",\"count\",\"score\",\"tags\",\"kind\",\"nickname\"],\"additionalProperties\":false}";

/* zod 3 through zod-to-json-schema (the AI SDK before zod 4): a nested array of objects, int().positive() */
static const char zod3_schema[] =
    "{\"type\":\"object\",\"properties\":{\"recipe\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"ingredients\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"amount\":{\"type\":\"string\"}},\"required\":[\"name\",\"amount\"],\"additionalProperties\":false}},\"steps\":{\"type\":"
    "\"array\",\"items\":{\"type\":\"string\"}},\"servings\":{\"type\":\"integer\",\"exclusiveMinimum\":0}},\"required\":"
    "[\"name\",\"ingredients\",\"steps\",\"servings\"],\"additionalProperties\":false}},\"required\":[\"recipe\"],"
    "\"additionalProperties\":false,\"$schema\":\"http://json-schema.org/draft-07/schema#\"}";

/* OpenAI's zodResponseFormat (strict): nullable() as a type list, a reused object as a $ref to definitions */
static const char zod_response_format_schema[] =
    "{\"type\":\"object\",\"properties\":{\"steps\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/step\"}},"
    "\"final_answer\":{\"type\":\"string\"},\"confidence\":{\"type\":[\"number\",\"null\"]},\"check\":{\"anyOf\":[{\"$ref\":"
    "\"#/definitions/step\"},{\"type\":\"null\"}]}},\"required\":[\"steps\",\"final_answer\",\"confidence\",\"check\"],"
    "\"additionalProperties\":false,\"definitions\":{\"step\":{\"type\":\"object\",\"properties\":{\"explanation\":{\"type\":"
    "\"string\"},\"output\":{\"type\":\"string\"}},\"required\":[\"explanation\",\"output\"],\"additionalProperties\":false}},"
    "\"$schema\":\"http://json-schema.org/draft-07/schema#\"}";

/* Pydantic 2's Order.model_json_schema(): titles everywhere, $defs, an enum class, conint(ge=1, le=100),
 * confloat(gt=0), Optional[str] = None, list[list[str]] = [] */
static const char pydantic_schema[] =
    "{\"$defs\":{\"Item\":{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\"},\"qty\":{\"maximum\":100,"
    "\"minimum\":1,\"title\":\"Qty\",\"type\":\"integer\"},\"price\":{\"exclusiveMinimum\":0,\"title\":\"Price\",\"type\":"
    "\"number\"}},\"required\":[\"name\",\"qty\",\"price\"],\"title\":\"Item\",\"type\":\"object\"},\"Unit\":{\"enum\":[\"c\","
    "\"f\"],\"title\":\"Unit\",\"type\":\"string\"}},\"properties\":{\"id\":{\"title\":\"Id\",\"type\":\"integer\"},\"unit\":"
    "{\"$ref\":\"#/$defs/Unit\"},\"items\":{\"items\":{\"$ref\":\"#/$defs/Item\"},\"title\":\"Items\",\"type\":\"array\"},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"default\":null,\"title\":\"Note\"},\"tags\":{\"default\":"
    "[],\"items\":{\"items\":{\"type\":\"string\"},\"type\":\"array\"},\"title\":\"Tags\",\"type\":\"array\"}},\"required\":"
    "[\"id\",\"unit\",\"items\"],\"title\":\"Order\",\"type\":\"object\"}";

TEST(json_schema_client_libraries) {
    schema_case(zod4_schema,
                LIST("{\"name\": \"x\", \"count\": 3, \"score\": 0.5, \"tags\": [], \"kind\": \"a\", \"nickname\": null}",
                     "{\"name\":\"\",\"count\":-9007199254740991,\"score\":12,\"tags\":[\"t\"],\"kind\":\"b\",\"nickname\":\"n\"}"),
                LIST("{\"name\": \"x\", \"count\": 3.5, \"score\": 1, \"tags\": [], \"kind\": \"a\", \"nickname\": null}",
                     "{\"name\": \"x\", \"count\": 3, \"score\": 0, \"tags\": [], \"kind\": \"a\", \"nickname\": null}",
                     "{\"name\": \"x\", \"count\": 3, \"score\": 1, \"tags\": [], \"kind\": \"c\", \"nickname\": null}",
                     "{\"name\": \"x\", \"count\": 3, \"score\": 1, \"tags\": [], \"kind\": \"a\"}"));
    schema_case(zod3_schema,
                LIST("{\"recipe\": {\"name\": \"soup\", \"ingredients\": [{\"name\": \"leek\", \"amount\": \"2\"}, {\"name\": "
                     "\"salt\", \"amount\": \"1 tsp\"}], \"steps\": [\"boil\"], \"servings\": 4}}"),
                LIST("{\"recipe\": {\"name\": \"soup\", \"ingredients\": [{\"name\": \"leek\"}], \"steps\": [], \"servings\": 4}}",
                     "{\"recipe\": {\"name\": \"soup\", \"ingredients\": [], \"steps\": [], \"servings\": 0}}"));
    schema_case(zod_response_format_schema,
                LIST("{\"steps\": [{\"explanation\": \"e\", \"output\": \"o\"}], \"final_answer\": \"42\", \"confidence\": null, "
                     "\"check\": null}",
                     "{\"steps\": [], \"final_answer\": \"\", \"confidence\": 0.9, \"check\": {\"explanation\": \"\", \"output\": \"\"}}"),
                LIST("{\"steps\": [{\"explanation\": \"e\"}], \"final_answer\": \"42\", \"confidence\": null, \"check\": null}"));
    schema_case(pydantic_schema,
                LIST("{\"id\": 1, \"unit\": \"c\", \"items\": [{\"name\": \"a\", \"qty\": 100, \"price\": 9.99}]}",
                     "{\"id\": -3, \"unit\": \"f\", \"items\": [], \"note\": null, \"tags\": [[\"x\", \"y\"], []]}",
                     "{\"id\": 1, \"unit\": \"c\", \"items\": [], \"note\": \"n\"}"),
                LIST("{\"id\": 1, \"unit\": \"k\", \"items\": []}",
                     "{\"id\": 1, \"unit\": \"c\", \"items\": [{\"name\": \"a\", \"qty\": 0, \"price\": 1}]}",
                     "{\"id\": 1, \"unit\": \"c\", \"items\": [{\"name\": \"a\", \"qty\": 1, \"price\": 0}]}",
                     "{\"id\": 1, \"unit\": \"c\", \"items\": [], \"tags\": [\"x\"]}", "{\"unit\": \"c\", \"items\": []}"));
}
