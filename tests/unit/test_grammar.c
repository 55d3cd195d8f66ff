/* The JSON grammar automaton (engine/grammar.c) compiled from schemas by
 * api/schema.c: which texts it accepts whole, that the trie mask equals
 * feeding every token on its own, and that the shortest-completion cost
 * always leads to a finished value. */
#include <stdlib.h>
#include <time.h>

#include "api/api.h"
#include "test.h"
#include "tests/grammar_walk.h"

static grammar *compile(const char *schema_text) {
    json_error_t je;
    json_t *s = json_loads(schema_text, 0, &je);
    api_error e;
    grammar *g = s ? api_schema_grammar(s, "response_format", &e) : NULL;
    if (!g) fprintf(stderr, "  compile failed: %s\n", s ? e.message : je.text);
    json_decref(s);
    return g;
}

/* 1 when text is a whole value of g. */
static int accepts(const grammar *g, const char *text) {
    grammar_state st;
    grammar_start(g, &st);
    return grammar_feed(g, &st, text, strlen(text)) && grammar_can_end(g, &st);
}

static const char PERSON[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bb\"]},"
    "\"minItems\":1,\"maxItems\":2},\"pet\":{\"anyOf\":[{\"$ref\":\"#/$defs/Pet\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false,"
    "\"$defs\":{\"Pet\":{\"type\":\"object\",\"properties\":{\"legs\":{\"type\":\"number\"}},\"required\":[\"legs\"]}}}";

TEST(grammar_accepts_exactly_the_schema) {
    grammar *g = compile(PERSON);
    CHECK(g != NULL);
    if (!g) return;
    CHECK(accepts(g, "{\"name\":\"Al\",\"age\":3}"));
    CHECK(accepts(g, "{ \"age\": -12 ,\n \"name\" : \"\\u00e9x\", \"tags\": [\"a\",\"bb\"], \"pet\": null}"));
    CHECK(accepts(g, "{\"pet\":{\"legs\":4.5e+1},\"name\":\"\",\"age\":0}"));
    CHECK(accepts(g, "{\"pet\":{\"legs\":-9.5E-99},\"name\":\"\",\"age\":0}"));
    CHECK(!accepts(g, "{\"pet\":{\"legs\":1e100},\"name\":\"\",\"age\":0}")); /* beyond a double's reach */
    CHECK(!accepts(g, "{\"name\":\"Al\"}"));                      /* age is required */
    CHECK(!accepts(g, "{\"name\":\"Alfred\",\"age\":3}"));        /* maxLength 5 */
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":3.5}"));          /* integer */
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":3,\"x\":1}"));    /* no other keys */
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":3,\"tags\":[]}")); /* minItems 1 */
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":3,\"tags\":[\"c\"]}"));
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":3,\"tags\":[\"a\",\"a\",\"a\"]}"));
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":3,\"name\":\"B\"}")); /* twice */
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":03}"));
    CHECK(!accepts(g, " {\"name\":\"Al\",\"age\":3}"));           /* nothing before */
    CHECK(!accepts(g, "{\"name\":\"Al\",\"age\":3} "));           /* nor after */
    CHECK(!accepts(g, "{\"name\":\"A\nl\",\"age\":3}"));          /* raw control character */
    grammar_unref(g);
    /* property names with a quote or a backslash: the '"' inside a name did end the key (a probe
       found every schema with one answered "the grammar and logit_bias leave no token") */
    g = compile("{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"integer\"},"
                "\"c\\\\\":{\"type\":\"integer\"},\"a\":{\"type\":\"integer\"}},\"required\":[\"a\\\"b\"]}");
    CHECK(g != NULL);
    if (!g) return;
    CHECK(accepts(g, "{\"a\\\"b\":1}"));
    CHECK(accepts(g, "{\"a\\\"b\":1,\"c\\\\\":2,\"a\":3}"));
    CHECK(!accepts(g, "{\"a\":3}"));                  /* a"b is required */
    CHECK(!accepts(g, "{\"a\\\"b\":1,\"c\\\":2}")); /* c\ is a backslash, escaped */
    grammar_unref(g);
}

/* The schema is a 400 on response_format whose message holds needle. */
static void check_refused(const char *schema_text, const char *needle) {
    json_t *s = json_loads(schema_text, 0, NULL);
    api_error e;
    grammar *g = api_schema_grammar(s, "response_format", &e);
    CHECK(g == NULL);
    if (!g) {
        CHECK(strstr(e.message, needle) != NULL);
        CHECK_STR(e.param, "response_format");
        CHECK_EQ_INT(e.status, 400);
    }
    if (g || !strstr(e.message, needle)) fprintf(stderr, "  %s: %s\n", schema_text, g ? "compiled" : e.message);
    grammar_unref(g);
    json_decref(s);
}

TEST(grammar_unsupported_keywords_are_named) {
    const char *bad[][2] = {{"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookahead"},
                            {"{\"type\":\"integer\",\"not\":{\"const\":3}}", "'not'"},
                            {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "no type in common"},
                            {"{\"anyOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                             "{\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}]}", "anyOf"},
                            {"{\"$ref\":\"#\"}", "never ends"},
                            {"{\"type\":\"sound\"}", "'sound'"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) check_refused(bad[i][0], bad[i][1]);
    check_refused("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems needs items that are an enum");
    check_refused("{\"type\":\"integer\",\"if\":{\"minimum\":3}}", "'if'");
    /* keywords JSON Schema does not define are annotations (validators ignore them), beside $ref too */
    grammar *g = compile("{\"type\":\"object\",\"markdownDescription\":\"**x**\",\"x-order\":3,\"properties\":"
                         "{\"a\":{\"$ref\":\"#/$defs/A\",\"deprecationMessage\":\"old\"}},\"$defs\":{\"A\":{\"type\":\"integer\"}}}");
    CHECK(g != NULL);
    if (g) CHECK(accepts(g, "{\"a\":1}") && !accepts(g, "{\"a\":\"x\"}"));
    grammar_unref(g);
}

/* A keyword beside $ref, const, enum or anyOf/oneOf was ignored (only the first of them was
 * compiled): output that broke the schema came back "stop" (a probe with SchemaStore's and
 * OpenAI's schemas). Now each holds, or the schema is a 400 naming the keyword. */
TEST(grammar_keywords_beside_ref_enum_const_and_anyof_hold) {
    const char *refused[][2] = {
        {"{\"type\":\"string\",\"maxLength\":1,\"enum\":[\"aa\",\"b\"]}", "'maxLength' beside enum"},
        {"{\"type\":\"array\",\"minItems\":2,\"const\":[1]}", "'minItems' beside enum or const"},
        {"{\"type\":\"string\",\"const\":5}", "no value of enum or const"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false,"
         "\"anyOf\":[{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}", "'properties' both"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"],\"additionalProperties\":false}",
         "required property 'b'"},
        {"{\"type\":\"null\",\"anyOf\":[{\"type\":\"string\"}]}", "no alternative of anyOf"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) check_refused(refused[i][0], refused[i][1]);
    /* a type list beside enum keeps the values of any listed type (OpenAI's "units" example) */
    grammar *g = compile("{\"type\":[\"string\",\"null\"],\"enum\":[\"celsius\",\"fahrenheit\"]}");
    CHECK(g && accepts(g, "\"celsius\"") && !accepts(g, "null") && !accepts(g, "\"kelvin\""));
    grammar_unref(g);
    /* anyOf's siblings hold in every alternative; an alternative of a type they exclude is dropped */
    g = compile("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}],\"maxLength\":2}");
    CHECK(g && accepts(g, "\"ab\"") && !accepts(g, "\"abc\"") && accepts(g, "null"));
    grammar_unref(g);
    g = compile("{\"type\":\"object\",\"anyOf\":[{\"$ref\":\"#/$defs/A\"},{\"type\":\"null\"}],"
                "\"$defs\":{\"A\":{\"properties\":{\"k\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"k\"]}}}");
    CHECK(g && accepts(g, "{\"k\":\"abc\"}") && !accepts(g, "null") && !accepts(g, "{}"));
    grammar_unref(g);
    g = compile("{\"enum\":[\"a\",1,null],\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}");
    CHECK(g && accepts(g, "\"a\"") && accepts(g, "1") && !accepts(g, "null"));
    grammar_unref(g);
    /* both anyOf and oneOf: each must hold (oneOf was ignored) */
    g = compile("{\"anyOf\":[{\"type\":\"string\"}],\"oneOf\":[{\"maxLength\":2}]}");
    CHECK(g && accepts(g, "\"ab\"") && !accepts(g, "\"abc\""));
    grammar_unref(g);
    /* required properties not listed take additionalProperties' values (they were a 400) */
    g = compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"t\"],"
                "\"additionalProperties\":{\"type\":\"boolean\"}}");
    CHECK(g && accepts(g, "{\"t\":true}") && accepts(g, "{\"a\":1,\"t\":false}") && !accepts(g, "{\"a\":1}") &&
          !accepts(g, "{\"t\":1}"));
    grammar_unref(g);
    /* constraints beside $ref hold with its target's (151 of the 562 SchemaStore schemas refused
       were a 400 "'type' beside $ref"); what the two cannot both allow is a 400 */
    g = compile("{\"$ref\":\"#/$defs/s\",\"enum\":[\"red\",7],\"$defs\":{\"s\":{\"type\":\"string\"}}}");
    CHECK(g && accepts(g, "\"red\"") && !accepts(g, "7") && !accepts(g, "\"blue\""));
    grammar_unref(g);
    g = compile("{\"properties\":{\"o\":{\"$ref\":\"#/$defs/o\",\"type\":\"object\",\"required\":[\"a\"]}},"
                "\"required\":[\"o\"],\"$defs\":{\"o\":{\"$ref\":\"#/$defs/p\"},\"p\":{\"type\":[\"object\",\"null\"],"
                "\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}}}}}");
    CHECK(g && accepts(g, "{\"o\":{\"a\":1}}") && accepts(g, "{\"o\":{\"b\":\"x\",\"a\":1}}") &&
          !accepts(g, "{\"o\":{\"b\":\"x\"}}") && !accepts(g, "{\"o\":null}"));
    grammar_unref(g);
    check_refused("{\"$ref\":\"#/$defs/s\",\"type\":\"integer\",\"$defs\":{\"s\":{\"type\":\"string\"}}}",
                  "no type in common");
    check_refused("{\"$ref\":\"#/$defs/s\",\"maxLength\":3,\"$defs\":{\"s\":{\"maxLength\":2}}}", "'maxLength' both");
    /* a $ref written as a URI fragment, percent-encoded (RFC 6901 section 6) */
    g = compile("{\"$defs\":{\"sp ace\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/sp%20ace\"}");
    CHECK(g && accepts(g, "7") && !accepts(g, "\"7\""));
    grammar_unref(g);
}

/* 1 when g takes every text of `yes` and none of `no` (NULL-terminated); names the first miss. */
static int takes_exactly(const grammar *g, const char *const *yes, const char *const *no) {
    for (; yes && *yes; yes++)
        if (!accepts(g, *yes)) return fprintf(stderr, "  refused: %s\n", *yes), 0;
    for (; no && *no; no++)
        if (accepts(g, *no)) return fprintf(stderr, "  taken: %s\n", *no), 0;
    return 1;
}

/* The schema compiles, and its grammar takes every text of `yes` and none of `no`. */
static void check_values(const char *schema, const char *const *yes, const char *const *no) {
    grammar *g = compile(schema);
    CHECK(g != NULL);
    if (g && !takes_exactly(g, yes, no)) {
        fprintf(stderr, "  in %s\n", schema);
        CHECK(0);
    }
    grammar_unref(g);
}

/* minProperties, maxProperties, propertyNames and patternProperties were a 400 (SchemaStore's
 * schemas use them 41, 15 and 50 times among the 562 refused). */
TEST(grammar_property_counts_names_and_patterns) {
    struct {
        const char *schema;
        const char *yes[6], *no[6];
    } cases[] = {
        {"{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"integer\"}},"
         "\"minProperties\":2,\"maxProperties\":2}",
         {"{\"a\":1,\"b\":2}", "{\"c\":1,\"a\":2}"}, {"{}", "{\"a\":1}", "{\"a\":1,\"b\":2,\"c\":3}"}},
        /* maxProperties keeps room for the required ones */
        {"{\"properties\":{\"a\":{},\"b\":{},\"c\":{}},\"required\":[\"c\"],\"maxProperties\":2}",
         {"{\"c\":1}", "{\"a\":1,\"c\":2}"}, {"{\"a\":1,\"b\":2,\"c\":3}", "{\"a\":1,\"b\":2}", "{}"}},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"minProperties\":1,\"maxProperties\":2}",
         {"{\"x\":1}", "{\"x\":1,\"y\":2}"}, {"{}", "{\"x\":1,\"y\":2,\"z\":3}", "{\"x\":\"1\"}"}},
        /* propertyNames: the keys of a map, or which listed properties may be written */
        {"{\"type\":\"object\",\"propertyNames\":{\"pattern\":\"^[a-z]+$\",\"maxLength\":3},"
         "\"additionalProperties\":{\"type\":\"boolean\"}}",
         {"{}", "{\"ab\":true,\"abc\":false}"}, {"{\"Ab\":true}", "{\"abcd\":true}", "{\"\":true}", "{\"ab\":1}"}},
        {"{\"properties\":{\"a\":{},\"B\":{}},\"propertyNames\":{\"enum\":[\"a\",\"c\"]}}",
         {"{\"a\":1}", "{}"}, {"{\"B\":1}", "{\"c\":1}"}},
        /* patternProperties: a map's keys and values, or the listed properties it names */
        {"{\"patternProperties\":{\"^x-\":{\"type\":\"string\"}},\"additionalProperties\":false,\"maxProperties\":1}",
         {"{\"x-a\":\"s\"}", "{}"}, {"{\"y\":\"s\"}", "{\"x-a\":1}", "{\"x-a\":\"s\",\"x-b\":\"t\"}"}},
        {"{\"properties\":{\"x-a\":{\"maxLength\":2},\"b\":{\"type\":\"integer\"}},"
         "\"patternProperties\":{\"x-\":{\"type\":\"string\"},\"^b\":{\"minimum\":0}}}",
         {"{\"x-a\":\"ab\",\"b\":0}"}, {"{\"x-a\":1}", "{\"x-a\":\"abc\"}", "{\"b\":-1}"}},
        /* a required property not listed takes the patterns it matches, not additionalProperties */
        {"{\"required\":[\"x-k\",\"n\"],\"patternProperties\":{\"^x-\":{\"type\":\"integer\"}},"
         "\"additionalProperties\":{\"type\":\"string\"}}",
         {"{\"x-k\":1,\"n\":\"s\"}"}, {"{\"x-k\":\"s\",\"n\":\"s\"}", "{\"x-k\":1,\"n\":1}"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_values(cases[i].schema, cases[i].yes, cases[i].no);
    check_refused("{\"type\":\"object\",\"minProperties\":2}", "minProperties above 1");
    check_refused("{\"properties\":{\"a\":{}},\"minProperties\":2}", "exceeds the 1 properties");
    check_refused("{\"properties\":{\"a\":{},\"b\":{}},\"required\":[\"a\",\"b\"],\"maxProperties\":1}",
                  "below the 2 required");
    check_refused("{\"type\":\"object\",\"minProperties\":2,\"maxProperties\":1}", "exceeds maxProperties");
    check_refused("{\"properties\":{\"a\":{}},\"required\":[\"a\"],\"propertyNames\":{\"maxLength\":0}}",
                  "propertyNames");
    check_refused("{\"patternProperties\":{\"^a\":{},\"^b\":{}}}", "more than one pattern");
    check_refused("{\"patternProperties\":{\"(?=a)\":{}}}", "lookahead");
    check_refused("{\"type\":\"object\",\"propertyNames\":{\"type\":\"integer\"}}", "property names must be strings");
}

/* anyOf's alternatives may overlap (a value valid for two is valid): a string covers
 * SchemaStore's "enum of suggestions or any string" (1,759 such anyOfs in the schemas of
 * `make bench-schemas`), enums and consts are joined. oneOf's may not. */
TEST(grammar_any_of_alternatives_may_overlap) {
    struct {
        const char *schema;
        const char *yes[6], *no[4];
    } cases[] = {
        {"{\"anyOf\":[{\"type\":\"string\",\"enum\":[\"a\",\"b\"]},{\"type\":\"string\"}]}", {"\"a\"", "\"zzz\""}, {"1"}},
        {"{\"anyOf\":[{\"enum\":[\"a\",1]},{\"const\":\"c\"},{\"type\":\"null\"},{\"enum\":[1,12]}]}",
         {"\"a\"", "1", "12", "\"c\"", "null"}, {"\"d\"", "2"}},
        {"{\"type\":[\"integer\",\"number\"]}", {"3", "1.5"}, {"\"3\""}},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"x\",1]}]}", {"\"x\"", "\"q\"", "1"}, {"2", "null"}},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"properties\":{\"a\":{\"type\":\"integer\"}}}]}", {"{\"a\":\"x\"}", "{}"}, {"[]"}},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"pattern\":\"^ab$\",\"maxLength\":2},{\"enum\":[\"xy\"]}]}",
         {"\"ab\"", "\"xy\"", "\"q\"", "\"abc\""}, {"1"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_values(cases[i].schema, cases[i].yes, cases[i].no);
    /* patterns, and strings among the enums beside them, joined into one automaton (Azure
       Pipelines' "boolean" is eight anchored patterns) */
    struct {
        const char *schema;
        const char *yes[7], *no[7];
    } joined[] = {
        {"{\"anyOf\":[{\"pattern\":\"^true$\"},{\"type\":\"string\",\"pattern\":\"^y$\"},{\"pattern\":\"^(on|off)$\"}]}",
         {"\"true\"", "\"y\"", "\"on\"", "\"off\""}, {"\"yes\"", "\"tru\"", "\"\"", "\"onoff\""}},
        {"{\"anyOf\":[{\"pattern\":\"^[0-9]+$\"},{\"enum\":[\"auto\",\"a.b*\",\"q\\\"x/\\n\",5]}]}",
         {"\"12\"", "\"auto\"", "\"a.b*\"", "\"q\\\"x/\\n\"", "\"q\\\"x\\/\\n\"", "5"},
         {"\"a.bb\"", "\"aut\"", "6", "\"12a\"", "\"q\\\"x/\""}},
    };
    for (size_t i = 0; i < sizeof joined / sizeof *joined; i++) check_values(joined[i].schema, joined[i].yes, joined[i].no);
    check_refused("{\"oneOf\":[{\"enum\":[\"a\"]},{\"type\":\"string\"}]}", "start alike");
    check_refused("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\",\"maximum\":3}]}", "start alike");
}

#define CAT_DOG(list)                                                                                          \
    "{\"" list "\":[{\"$ref\":\"#/$defs/Cat\"},{\"$ref\":\"#/$defs/Dog\"}],\"$defs\":{"                               \
    "\"Cat\":{\"type\":\"object\",\"properties\":{\"pet_type\":{\"const\":\"cat\"},\"meows\":{\"type\":\"integer\"}},"       \
    "\"required\":[\"pet_type\",\"meows\"]},"                                                                  \
    "\"Dog\":{\"type\":\"object\",\"properties\":{\"pet_type\":{\"enum\":[\"dog\"]},\"barks\":{\"type\":\"number\"}},"       \
    "\"required\":[\"pet_type\",\"barks\"]}}}"

/* Objects among the alternatives (Pydantic's Union[Cat, Dog]) were a 400 "two objects": the
 * first property tells which is written, a name only one lists or a discriminator's value. */
TEST(grammar_objects_in_any_of_commit_at_their_first_property) {
    struct {
        const char *schema;
        const char *yes[6], *no[6];
    } cases[] = {
        {CAT_DOG("anyOf"),
         {"{\"pet_type\":\"cat\",\"meows\":3}", "{\"pet_type\" : \"dog\", \"barks\":1.5}", "{\"meows\":3,\"pet_type\":\"cat\"}",
          "{\"barks\":2,\"pet_type\":\"dog\"}"},
         {"{\"pet_type\":\"cat\",\"barks\":1}", "{\"pet_type\":\"dog\"}", "{}", "{\"pet_type\":\"bird\",\"meows\":1}",
          "{\"meows\":1,\"pet_type\":\"dog\"}"}},
        /* oneOf: what is written must fail the others; here each requires a property the other
           does not list */
        {CAT_DOG("oneOf"),
         {"{\"pet_type\":\"cat\",\"meows\":3}", "{\"pet_type\":\"dog\",\"barks\":0}", "{\"meows\":3,\"pet_type\":\"cat\"}"},
         {"{}", "{\"pet_type\":\"cat\",\"barks\":0}"}},
        /* oneOf where one requires nothing: it may start with its own name, and {} is it; the
           other's own name could leave an object the first takes too (it allows more properties) */
        {"{\"oneOf\":[{\"properties\":{\"a\":{}},\"required\":[\"a\"]},{\"properties\":{\"b\":{}}}]}", {"{}", "{\"b\":1}"},
         {"{\"a\":1}"}},
        /* numbers as discriminators, one the start of the other */
        {"{\"anyOf\":[{\"properties\":{\"v\":{\"const\":1},\"a\":{\"type\":\"string\"}},\"required\":[\"v\",\"a\"]},"
         "{\"properties\":{\"v\":{\"const\":12},\"b\":{\"type\":\"string\"}},\"required\":[\"v\",\"b\"]},{\"type\":\"null\"}]}",
         {"{\"v\":1,\"a\":\"x\"}", "{\"v\":12,\"b\":\"x\"}", "{\"v\":1 ,\"a\":\"x\"}", "null"},
         {"{\"v\":12,\"a\":\"x\"}", "{\"v\":1,\"b\":\"x\"}", "{\"v\":2,\"a\":\"x\"}"}},
        /* no property required: {} is one of them */
        {"{\"anyOf\":[{\"properties\":{\"a\":{}}},{\"properties\":{\"b\":{}}}]}", {"{}", "{\"a\":1}", "{\"b\":[2]}"},
         {"{\"a\":1,\"b\":2}", "{\"c\":1}"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_values(cases[i].schema, cases[i].yes, cases[i].no);
    /* oneOf of objects that all take {} and each other's properties: nothing written fails the others */
    check_refused("{\"oneOf\":[{\"properties\":{\"a\":{}}},{\"properties\":{\"b\":{}}}]}", "start alike");
}

#define TREE                                                                                              \
    "{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","         \
    "\"items\":{\"$ref\":\"#/$defs/N\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/N\"}"

/* A recursive $ref (a tree, a JSON value of JSON values) was a 400: it is written four
 * levels deep (MAX_UNROLL copies inside the first), where what holds the next level is left
 * out (an optional property, an array's items, an anyOf alternative). */
TEST(grammar_recursive_refs_are_written_a_few_levels_deep) {
    grammar *g = compile(TREE);
    CHECK(g != NULL);
    static const char *const yes[] = {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}",
                                      "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}]}", NULL};
    static const char *const no[] = {"{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[{\"v\":5}]}]}]}]}",
                                     "{\"kids\":[]}", NULL};
    CHECK(g && takes_exactly(g, yes, no));
    grammar_unref(g);
    g = compile("{\"$defs\":{\"J\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/J\"}},"
                "{\"type\":\"object\",\"additionalProperties\":{\"$ref\":\"#/$defs/J\"}}]}},\"$ref\":\"#/$defs/J\"}");
    static const char *const json_yes[] = {"\"a\"", "[\"a\",[\"b\",{\"k\":[]}]]", "{\"k\":{\"l\":\"x\"}}", NULL};
    static const char *const json_no[] = {"1", "[[[[[\"deep\"]]]]]", NULL};
    CHECK(g && takes_exactly(g, json_yes, json_no));
    grammar_unref(g);
    /* where every level needs the next, no value ends */
    check_refused("{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/N\"}},"
                  "\"required\":[\"next\"]}},\"$ref\":\"#/$defs/N\"}", "never ends");
    check_refused("{\"$defs\":{\"L\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/L\"},\"minItems\":1}},\"$ref\":\"#/$defs/L\"}",
                  "never ends");
}

/* `not` was a 400: `not: {}` (and the schema false) is no value, so a property that has it is left
 * out (SchemaStore's schemas use it 80 times, as "this property must be absent"), and `not:
 * {"required": [...]}` leaves out a property it names. Other complements stay a 400. */
TEST(grammar_not_leaves_properties_out) {
    struct {
        const char *schema;
        const char *yes[4], *no[4];
    } cases[] = {
        {"{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"not\":{}},\"c\":false}}", {"{}", "{\"a\":1}"},
         {"{\"b\":1}", "{\"c\":null}"}},
        {"{\"properties\":{\"a\":{},\"b\":{}},\"required\":[\"a\"],\"not\":{\"required\":[\"a\",\"b\"]}}",
         {"{\"a\":1}"}, {"{\"a\":1,\"b\":2}", "{}"}},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"not\":{}}]}", {"\"x\""}, {"1", "null"}},
        {"{\"type\":\"integer\",\"not\":false}", {"1"}, {"\"1\""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_values(cases[i].schema, cases[i].yes, cases[i].no);
    check_refused("{\"properties\":{\"a\":{}},\"required\":[\"a\"],\"not\":{\"required\":[\"a\"]}}", "no value meets it");
    check_refused("{\"properties\":{\"a\":{\"not\":{}}},\"required\":[\"a\"]}", "no value meets it");
    check_refused("{\"not\":{\"type\":\"string\"}}", "'not' is supported as {}");
    check_refused("{\"type\":\"object\",\"not\":{\"required\":[\"x\"]}}", "needs the properties listed");
}

/* `not` of a pattern, enum or const was a 400 (SchemaStore's "not: {pattern: '^(and|or)$'}",
 * "a string that starts with no space"): strings the pattern does not match, or that are
 * none of the values, within the string's own pattern and lengths (a difference of DFAs). */
TEST(grammar_not_takes_strings_out) {
    struct {
        const char *schema;
        const char *yes[6], *no[6];
    } cases[] = {
        {"{\"type\":\"string\",\"not\":{\"pattern\":\"^(and|or)$\"}}", {"\"an\"", "\"andor\"", "\"\"", "\"Or\""},
         {"\"and\"", "\"or\"", "1"}},
        {"{\"not\":{\"pattern\":\"^\\\\s|\\\\s$\"},\"minLength\":1}", {"\"a b\"", "\"x\""},
         {"\" a\"", "\"a \"", "\"\"", "null"}},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"maxLength\":3,\"not\":{\"enum\":[\"abc\",\"x\",7]}}",
         {"\"ab\"", "\"abd\"", "\"y\""}, {"\"abc\"", "\"x\"", "\"abcd\"", "7", "\"A\""}},
        {"{\"type\":[\"string\",\"null\"],\"not\":{\"const\":\"a\\\"b\"}}", {"\"a\\\"c\"", "\"ab\""},
         {"\"a\\\"b\"", "null"}},
        {"{\"not\":{\"type\":\"string\",\"enum\":[1,2]}}", {"\"1\"", "\"\""}, {"1", "true"}},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z-]+$\",\"not\":{\"anyOf\":[{\"pattern\":\"^ab\"},{\"enum\":[\"x\"]},"
         "{\"pattern\":\"--\"}]}}",
         {"\"a\"", "\"ba\"", "\"xy\"", "\"a-b\""}, {"\"ab\"", "\"abc\"", "\"x\"", "\"a--b\"", "\"A\""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_values(cases[i].schema, cases[i].yes, cases[i].no);
    check_refused("{\"type\":\"string\",\"enum\":[\"a\"],\"not\":{\"const\":\"a\"}}", "beside $ref, enum");
    check_refused("{\"type\":\"string\",\"pattern\":\"^a$\",\"not\":{\"pattern\":\"a\"}}", "no string is left");
    check_refused("{\"type\":\"integer\",\"not\":{\"pattern\":\"a\"}}", "type allows none");
    check_refused("{\"type\":\"string\",\"format\":\"date\",\"not\":{\"pattern\":\"a\"}}", "format beside 'not'");
    check_refused("{\"type\":\"string\",\"not\":{\"pattern\":\"(?=a)\"}}", "pattern and 'not'");
}

/* uniqueItems was a 400: an array of an enum's values (Pydantic's set[Literal[...]]) writes
 * each at most once; an array of at most one item is unique as it is. */
TEST(grammar_unique_items_are_written_once) {
    struct {
        const char *schema;
        const char *yes[6], *no[6];
    } cases[] = {
        {"{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",1,12]},\"uniqueItems\":true}",
         {"[]", "[\"red\"]", "[1,12]", "[12 , 1,\"green\",\"red\"]"},
         {"[\"red\",\"red\"]", "[1,12,1]", "[\"blue\"]", "[12,12]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"uniqueItems\":true,\"minItems\":2}",
         {"[true,false]", "[false,true]"}, {"[true]", "[true,true]", "[true,false,true]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true,\"maxItems\":1}", {"[]", "[\"x\"]"},
         {"[\"x\",\"y\"]"}},
        {"{\"type\":\"array\",\"items\":{\"const\":0},\"uniqueItems\":false}", {"[0,0]"}, {"[1]"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_values(cases[i].schema, cases[i].yes, cases[i].no);
    check_refused("{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"uniqueItems\":true,\"minItems\":3}",
                  "minItems 3 exceeds the 2 values");
    check_refused("{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}", "uniqueItems needs");
}

/* A toy vocabulary: single bytes and some multi-byte pieces. */
static vocab_trie *toy_vocab(int32_t *n_out, const char ***pieces_out) {
    static const char *extra[] = {"{\"", "\":", "\",", "name", "age", "\"}", "true", "null", "12",
                                  " \"", "ab", "\"a", "]}", "},", "\\u", "é", "\n  "};
    static const char *pieces[128 + sizeof extra / sizeof *extra];
    static char singles[128][2];
    int32_t n = 0;
    for (int c = 0; c < 128; c++) {
        singles[c][0] = (char)c;
        pieces[n++] = c ? singles[c] : ""; /* token 0: a control token, empty piece */
    }
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) pieces[n++] = extra[i];
    uint32_t *off = malloc(((size_t)n + 1) * sizeof *off);
    char *bytes = malloc(4096);
    uint32_t len = 0;
    for (int32_t i = 0; i < n; i++) {
        off[i] = len;
        memcpy(bytes + len, pieces[i], strlen(pieces[i]));
        len += (uint32_t)strlen(pieces[i]);
    }
    off[n] = len;
    vocab_trie *t = vocab_trie_new(bytes, off, n);
    free(off);
    free(bytes);
    *n_out = n;
    *pieces_out = pieces;
    return t;
}

TEST(grammar_mask_equals_feeding_each_token) {
    grammar *g = compile(PERSON);
    int32_t n;
    const char **pieces;
    vocab_trie *t = toy_vocab(&n, &pieces);
    CHECK(g && t);
    if (!g || !t) return;
    const char *prefixes[] = {"", "{", "{\"na", "{\"name\":\"A", "{\"name\":\"Al\",\"age\":1",
                              "{\"age\":1,\"tags\":[", "{\"age\":1,\"pet\":{\"legs\":2"};
    uint8_t *allowed = malloc((size_t)n);
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++) {
        grammar_state st;
        grammar_start(g, &st);
        CHECK(grammar_feed(g, &st, prefixes[p], strlen(prefixes[p])));
        for (int budget_kind = 0; budget_kind < 2; budget_kind++) {
            uint32_t budget = budget_kind ? grammar_cost(g, &st) : UINT32_MAX;
            grammar_mask(g, &st, t, budget, allowed);
            for (int32_t i = 0; i < n; i++) {
                grammar_state s2 = st;
                size_t len = strlen(pieces[i]);
                int ok = len && grammar_feed(g, &s2, pieces[i], len) &&
                         (budget == UINT32_MAX || grammar_cost(g, &s2) <= budget);
                if (ok != allowed[i]) fprintf(stderr, "  prefix '%s' token '%s'\n", prefixes[p], pieces[i]);
                CHECK_EQ_INT(allowed[i], ok);
            }
        }
    }
    free(allowed);
    vocab_trie_free(t);
    grammar_unref(g);
}

TEST(grammar_cost_always_reaches_the_end) {
    /* from many prefixes, grammar_shortest_completion's bytes (each one that
       lowers the cost by one) end in a complete value after exactly `cost`
       bytes; a buffer one byte short is refused */
    grammar *g = compile(PERSON);
    CHECK(g != NULL);
    if (!g) return;
    const char *prefixes[] = {"", "{\"pet\":{", "{\"name\":\"Alf", "{\"tags\":[\"a\",", "{\"age\":-",
                              "{\"pet\":nu", "{\"pet\":{\"legs\":1e", "{\"name\":\"\\u00", "{\"age\":12", "{\"name\":\"a\",\"age\":1"};
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++) {
        grammar_state st;
        grammar_start(g, &st);
        CHECK(grammar_feed(g, &st, prefixes[p], strlen(prefixes[p])));
        uint32_t cost = grammar_cost(g, &st);
        char out[256];
        int64_t n = grammar_shortest_completion(g, &st, out, sizeof out);
        CHECK_EQ_INT(n, (int64_t)cost);
        if (n < 0) continue;
        if (cost) CHECK_EQ_INT(grammar_shortest_completion(g, &st, out, cost - 1), -1);
        CHECK(grammar_feed(g, &st, out, (size_t)n));
        CHECK(grammar_can_end(g, &st));
        CHECK_EQ_INT(grammar_cost(g, &st), 0);
    }
    grammar_unref(g);
}

TEST(vocab_trie_split_takes_the_longest_pieces) {
    int32_t n;
    const char **pieces;
    vocab_trie *t = toy_vocab(&n, &pieces);
    CHECK(t != NULL);
    if (!t) return;
    const char text[] = "{\"name\":\"ab\"}";
    int32_t ids[32];
    int64_t k = vocab_trie_split(t, text, strlen(text), ids, 32);
    /* {" name ": " ab "} : the multi-byte pieces wherever they start */
    CHECK_EQ_INT(k, 6);
    char joined[64] = "";
    for (int64_t i = 0; i < k && k <= 32; i++) strcat(joined, pieces[ids[i]]);
    CHECK_STR(joined, text);
    if (k == 6) CHECK_STR(pieces[ids[1]], "name");
    CHECK_EQ_INT(vocab_trie_split(t, text, strlen(text), ids, 5), -1); /* more than cap */
    CHECK_EQ_INT(vocab_trie_split(t, "a\xff", 2, ids, 32), -1);       /* a byte no piece starts with */
    CHECK_EQ_INT(vocab_trie_split(t, "", 0, ids, 32), 0);
    vocab_trie_free(t);
}

TEST(grammar_strings_are_text_every_json_reader_takes) {
    /* strict readers (jansson, Go, Rust's serde) refuse overlong and surrogate
       UTF-8 and a lone \u surrogate; the automaton accepted them (tests/fuzz/fuzz_schema.c
       found an overlong F0 80 80 80 in a string) */
    grammar *g = compile("{\"type\":\"string\"}");
    CHECK(g != NULL);
    if (!g) return;
    const char *good[] = {"\"\xc3\xa9\"", "\"\xe0\xa0\x80\"", "\"\xed\x9f\xbf\"", "\"\xf0\x90\x80\x80\"",
                          "\"\xf4\x8f\xbf\xbf\"", "\"\xf0\x9f\x98\x80\"", "\"\\ud83d\\ude00\"", "\"\\uD800\\uDC00x\"",
                          "\"\\u00e9\\ud7ff\\ue000\\uffff\""};
    const char *bad[] = {"\"\xc0\x80\"", "\"\xc1\xbf\"", "\"\xe0\x80\x80\"", "\"\xe0\x9f\xbf\"", "\"\xed\xa0\x80\"",
                         "\"\xf0\x80\x80\x80\"", "\"\xf0\x8f\xbf\xbf\"", "\"\xf4\x90\x80\x80\"", "\"\xf5\x80\x80\x80\"",
                         "\"\\ud800\"", "\"\\ud800x\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\ud800\\ud800\""};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!accepts(g, good[i])) {
            fprintf(stderr, "  refused good[%zu]\n", i);
            CHECK(0);
        }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (accepts(g, bad[i])) {
            fprintf(stderr, "  accepted bad[%zu]\n", i);
            CHECK(0);
        }
    /* a half-written high surrogate costs its second half too, and completes to a pair */
    grammar_state st;
    grammar_start(g, &st);
    CHECK(grammar_feed(g, &st, "\"\\uD8", 5));
    CHECK_EQ_INT(grammar_cost(g, &st), 2 + 6 + 1);
    char out[32];
    int64_t n = grammar_shortest_completion(g, &st, out, sizeof out);
    CHECK_EQ_INT(n, 9);
    CHECK(n == 9 && !memcmp(out + 2, "\\u", 2) && (out[4] | 0x20) == 'd');
    grammar_unref(g);
}

/* A short number text's value in millionths (texts of at most 5 bytes: 4 fraction digits). */
static long long millionths(const char *text) {
    int negative = *text == '-';
    long long whole = 0, frac = 0, scale = 1000000;
    const char *p = text + negative;
    for (; *p >= '0' && *p <= '9'; p++) whole = whole * 10 + (*p - '0');
    if (*p == '.')
        for (p++; *p; p++) frac += (scale /= 10) * (*p - '0');
    long long v = whole * 1000000 + frac;
    return negative ? -v : v;
}

TEST(grammar_number_limits_accept_exactly_the_numbers_within) {
    /* every text of up to 5 bytes of "-0123456789." is a whole value of the bounded schema
       exactly when the unbounded one takes it and its value is within the limits */
    static const struct {
        const char *type, *limits;
        long long lo, hi; /* millionths, inclusive (the oracle) */
        long long multiple; /* whole; 0: none */
    } cases[] = {
        {"integer", "\"multipleOf\":7", -999999999999, 999999999999, 7},
        {"integer", "\"multipleOf\":25,\"minimum\":-60,\"maximum\":130", -60000000, 130000000, 25},
        {"number", "\"multipleOf\":4,\"exclusiveMinimum\":0", 1, 999999999999, 4},
        {"integer", "\"minimum\":3,\"maximum\":42", 3000000, 42000000, 0},
        {"integer", "\"minimum\":-17,\"exclusiveMaximum\":-3", -17000000, -4000000, 0},
        {"integer", "\"exclusiveMinimum\":-2.5,\"maximum\":7.9", -2000000, 7000000, 0},
        {"integer", "\"minimum\":120", 120000000, 999999999999, 0},
        {"integer", "\"maximum\":0", -999999999999, 0, 0},
        {"number", "\"minimum\":0,\"maximum\":1", 0, 1000000, 0},
        {"number", "\"minimum\":-1.25,\"maximum\":0.5", -1250000, 500000, 0},
        {"number", "\"exclusiveMinimum\":0,\"exclusiveMaximum\":10", 1, 9999999, 0},
        {"number", "\"minimum\":99.5", 99500000, 999999999999, 0},
        {"number", "\"maximum\":-0.001", -999999999999, -1000, 0},
        {"number", "\"minimum\":2,\"exclusiveMinimum\":2.5,\"maximum\":3.75,\"exclusiveMaximum\":4", 2500001, 3750000, 0},
    };
    static const char alphabet[] = "-0123456789.";
    int wrong = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char text[200];
        snprintf(text, sizeof text, "{\"type\":\"%s\",%s}", cases[k].type, cases[k].limits);
        grammar *g = compile(text);
        snprintf(text, sizeof text, "{\"type\":\"%s\"}", cases[k].type);
        grammar *plain = compile(text);
        CHECK(g != NULL && plain != NULL);
        if (!g || !plain) continue;
        int taken = 0;
        for (int len = 1; len <= 5; len++) {
            int digit[5] = {0};
            for (;;) {
                char t[6];
                for (int i = 0; i < len; i++) t[i] = alphabet[digit[i]];
                t[len] = 0;
                int want = accepts(plain, t) && millionths(t) >= cases[k].lo && millionths(t) <= cases[k].hi &&
                           (t[0] != '-' || millionths(t) < 0) && /* no -0 */
                           (!cases[k].multiple || millionths(t) % (cases[k].multiple * 1000000) == 0);
                int got = accepts(g, t);
                taken += got;
                if (got != want && wrong++ < 5) fprintf(stderr, "  %s: '%s' %s\n", cases[k].limits, t, got ? "taken" : "refused");
                int i = len - 1;
                while (i >= 0 && ++digit[i] == (int)sizeof alphabet - 1) digit[i--] = 0;
                if (i < 0) break;
            }
        }
        CHECK(taken > 0);
        CHECK(!accepts(g, "5e0") && !accepts(g, "1E1")); /* no exponent once bounded */
        grammar_unref(g);
        grammar_unref(plain);
    }
    CHECK_EQ_INT(wrong, 0);

    /* the shortest value, and an end the automaton knows: 42 of [3, 42] takes no digit after it */
    grammar *g = compile("{\"type\":\"integer\",\"minimum\":100,\"maximum\":420}");
    CHECK(g != NULL);
    if (g) {
        grammar_state st;
        grammar_start(g, &st);
        CHECK_EQ_INT(grammar_cost(g, &st), 3);
        char out[8];
        CHECK_EQ_INT(grammar_shortest_completion(g, &st, out, sizeof out), 3);
        CHECK(!memcmp(out, "100", 3));
        CHECK(!grammar_feed(g, &st, "5", 1)); /* 5, 50..59, 500..: none within */
        grammar_start(g, &st);
        CHECK(grammar_feed(g, &st, "42", 2) && !grammar_can_end(g, &st) && grammar_cost(g, &st) == 1);
        CHECK(grammar_feed(g, &st, "0", 1) && grammar_can_end(g, &st) && grammar_must_end(g, &st));
        grammar_start(g, &st);
        CHECK(grammar_feed(g, &st, "399", 3) && grammar_must_end(g, &st));
        grammar_start(g, &st);
        CHECK(grammar_feed(g, &st, "39", 2) && !grammar_must_end(g, &st));
        grammar_unref(g);
    }
    g = compile("{\"type\":\"number\",\"maximum\":5}");
    if (g) { /* 5 may still take a fraction of zeros: it cannot end the answer by itself */
        grammar_state st;
        grammar_start(g, &st);
        CHECK(grammar_feed(g, &st, "5", 1) && grammar_can_end(g, &st) && !grammar_must_end(g, &st));
        CHECK(grammar_feed(g, &st, ".000", 4) && !grammar_feed(g, &st, "1", 1));
        grammar_unref(g);
    }
    /* limits that no number written meets, and limits of the wrong kind, are a 400 naming them */
    check_refused("{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":1.9}", "no number lies within");
    check_refused("{\"type\":\"number\",\"minimum\":3,\"exclusiveMaximum\":3}", "no number lies within");
    check_refused("{\"type\":\"number\",\"minimum\":1e20}", "at most 16 integer digits");
    check_refused("{\"type\":\"integer\",\"maximum\":\"7\"}", "maximum must be a number");
    check_refused("{\"type\":\"number\",\"exclusiveMinimum\":true,\"minimum\":1}", "exclusiveMinimum must be a number");
    check_refused("{\"enum\":[1,2],\"minimum\":1}", "'minimum' beside enum");
    check_refused("{\"type\":\"number\",\"multipleOf\":0.5}", "a fraction is not supported");
    check_refused("{\"type\":\"integer\",\"multipleOf\":10,\"minimum\":1,\"maximum\":9}", "no number lies within");
}

/* 1 when the quoted text is a whole value of g. */
static int accepts_quoted(const grammar *g, const char *text) {
    char q[96];
    snprintf(q, sizeof q, "\"%s\"", text);
    return accepts(g, q);
}

TEST(grammar_formats_write_only_real_dates_times_and_addresses) {
    grammar *date = compile("{\"type\":\"string\",\"format\":\"date\"}");
    grammar *time_ = compile("{\"format\":\"time\"}"); /* format alone implies a string */
    grammar *stamp = compile("{\"type\":\"string\",\"format\":\"date-time\"}");
    grammar *uuid = compile("{\"type\":\"string\",\"format\":\"uuid\"}");
    grammar *ip = compile("{\"type\":\"string\",\"format\":\"ipv4\"}");
    CHECK(date && time_ && stamp && uuid && ip);
    if (!date || !time_ || !stamp || !uuid || !ip) return;
    /* dates against the C library's calendar (timegm normalises 2023-02-29 to March 1st) */
    static const int years[] = {0, 1, 4, 99, 100, 400, 1899, 1900, 1999, 2000, 2023, 2024, 2100, 2400, 9999};
    int wrong = 0;
    for (size_t y = 0; y < sizeof years / sizeof *years; y++)
        for (int m = 0; m <= 13; m++)
            for (int d = 0; d <= 32; d++) {
                char text[48];
                snprintf(text, sizeof text, "%04d-%02d-%02d", years[y], m, d);
                struct tm tm = {.tm_year = years[y] - 1900, .tm_mon = m - 1, .tm_mday = d, .tm_hour = 12};
                time_t t = timegm(&tm);
                struct tm back;
                gmtime_r(&t, &back);
                int real = years[y] >= 1 && m >= 1 && d >= 1 && back.tm_mon == m - 1 && back.tm_mday == d;
                if (accepts_quoted(date, text) != real && wrong++ < 5) fprintf(stderr, "  date %s\n", text);
                char full[64];
                snprintf(full, sizeof full, "%sT23:59:59Z", text);
                if (accepts_quoted(stamp, full) != real && wrong++ < 5) fprintf(stderr, "  date-time %s\n", full);
            }
    for (int h = 0; h <= 25; h++)
        for (int m = 0; m <= 61; m++)
            for (int sec = 0; sec <= 61; sec += 1) {
                char text[48];
                snprintf(text, sizeof text, "%02d:%02d:%02dZ", h, m, sec);
                if (accepts_quoted(time_, text) != (h < 24 && m < 60 && sec < 60) && wrong++ < 5)
                    fprintf(stderr, "  time %s\n", text);
            }
    CHECK_EQ_INT(wrong, 0);
    const char *times_ok[] = {"00:00:00Z", "12:30:05.5Z", "12:30:05.123456+05:30", "23:59:59-23:59", "08:00:00+00:00"};
    const char *times_bad[] = {"12:30:05", "12:30:05z", "12:30:05.Z", "12:30:05.1234567Z", "12:30:05+24:00",
                               "12:30:05+05:60", "12:30:05+0530", "1:30:05Z", "12:30Z", "12:30:05ZZ"};
    for (size_t i = 0; i < sizeof times_ok / sizeof *times_ok; i++) CHECK(accepts_quoted(time_, times_ok[i]));
    for (size_t i = 0; i < sizeof times_bad / sizeof *times_bad; i++) CHECK(!accepts_quoted(time_, times_bad[i]));
    CHECK(accepts_quoted(stamp, "2024-02-29T08:15:00.250+01:00"));
    CHECK(!accepts_quoted(stamp, "2024-02-29 08:15:00Z") && !accepts_quoted(stamp, "2024-02-29t08:15:00Z"));
    CHECK(accepts_quoted(uuid, "123e4567-e89b-12d3-a456-426614174000"));
    CHECK(accepts_quoted(uuid, "123E4567-E89B-12D3-A456-426614174000"));
    CHECK(!accepts_quoted(uuid, "123e4567e89b12d3a456426614174000") && !accepts_quoted(uuid, "123e4567-e89b-12d3-a456-42661417400g"));
    /* an address's first part, every text of up to 4 digits, against its rule: 0-255, no leading zero */
    for (int len = 1; len <= 4; len++)
        for (int v = 0; v < (len == 1 ? 10 : len == 2 ? 100 : len == 3 ? 1000 : 10000); v++) {
            char part[16], text[48];
            snprintf(part, sizeof part, "%0*d", len, v);
            snprintf(text, sizeof text, "%s.10.0.255", part);
            int real = v <= 255 && (len == 1 || part[0] != '0');
            if (accepts_quoted(ip, text) != real && wrong++ < 5) fprintf(stderr, "  ipv4 %s\n", text);
        }
    CHECK_EQ_INT(wrong, 0);
    CHECK(!accepts_quoted(ip, "1.2.3") && !accepts_quoted(ip, "1.2.3.4.5") && !accepts_quoted(ip, "1..3.4"));
    /* shortest values */
    grammar *all[] = {date, time_, stamp, uuid, ip};
    const char *shortest[] = {"\"0001-01-01\"", "\"00:00:00Z\"", "\"0001-01-01T00:00:00Z\"",
                              "\"00000000-0000-0000-0000-000000000000\"", "\"0.0.0.0\""};
    for (int i = 0; i < 5; i++) {
        grammar_state st;
        grammar_start(all[i], &st);
        char out[64];
        int64_t n = grammar_shortest_completion(all[i], &st, out, sizeof out);
        CHECK(n == (int64_t)strlen(shortest[i]) && !memcmp(out, shortest[i], (size_t)n));
        grammar_unref(all[i]);
    }
    /* a format JSON Schema does not define is an annotation (validators ignore it) */
    grammar *free_text = compile("{\"type\":\"string\",\"format\":\"simple-template\",\"maxLength\":3}");
    CHECK(free_text && accepts(free_text, "\"{x}\"") && !accepts(free_text, "\"{xy}\""));
    grammar_unref(free_text);
    /* the rest of JSON Schema's formats, written as patterns */
    static const char *const shapes[][3] = {
        {"duration", "P3D|PT1H30M|P1Y2M3DT4H5M6S|P2W|P1M|PT45S", "P|PT|P1H|P1DT|P1W2D|PT1H1S|P1Y1D"},
        {"ipv6", "1:2:3:4:5:6:7:8|fe80:0:0:0:0:0:0:ab12", "1:2:3:4:5:6:7|1::8|12345:2:3:4:5:6:7:8"},
        {"json-pointer", "|/a/b|/a_b.c/0", "a|/a b|/a~2"},
        {"relative-json-pointer", "0|1#|10/a/b", "01|#|/a"},
        {"regex", "abc|a b-c_d|", "a(|a*|\\\\d"},
        {"uri-reference", "https://example.com/a/b", "example.com|http://example.local"},
        {"idn-hostname", "xn--bcher-kva.example", "Example.com|-a.b"}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"format\":\"%s\"}", shapes[i][0]);
        grammar *fg = compile(schema);
        CHECK(fg != NULL);
        for (int good = 1; fg && good >= 0; good--)
            for (const char *v = shapes[i][good ? 1 : 2];; v++) { /* '|'-separated values, the empty one too */
                size_t len = strcspn(v, "|");
                char one[64];
                snprintf(one, sizeof one, "%.*s", (int)len, v);
                if (accepts_quoted(fg, one) != good) {
                    fprintf(stderr, "  %s %s: %s\n", shapes[i][0], good ? "refused" : "taken", one);
                    CHECK(0);
                }
                v += len;
                if (!*v) break;
            }
        grammar_unref(fg);
    }
    grammar *email = compile("{\"type\":\"string\",\"format\":\"email\"}");
    grammar *host = compile("{\"type\":\"string\",\"format\":\"hostname\"}");
    CHECK(email && host);
    if (email && host) {
        CHECK(accepts_quoted(email, "ada.lovelace+notes@mail.example.co.uk") && accepts_quoted(email, "x@y.io"));
        CHECK(!accepts_quoted(email, "ada..l@y.io") && !accepts_quoted(email, "ada@localhost") &&
              !accepts_quoted(email, "ada@y.local") && !accepts_quoted(email, ".ada@y.io") && !accepts_quoted(email, "a@-y.io"));
        CHECK(accepts_quoted(host, "db-1.internal.example") && accepts_quoted(host, "localhost"));
        CHECK(!accepts_quoted(host, "-db.x") && !accepts_quoted(host, "db..x") && !accepts_quoted(host, "db_1"));
    }
    grammar_unref(email);
    grammar_unref(host);
    grammar *uri = compile("{\"type\":\"string\",\"format\":\"uri\",\"minLength\":1,\"maxLength\":2083}");
    CHECK(uri != NULL); /* Pydantic's HttpUrl */
    if (uri) {
        CHECK(accepts_quoted(uri, "https://docs.example.org/guide/intro.html") && accepts_quoted(uri, "http://a.io/"));
        CHECK(!accepts_quoted(uri, "ftp://a.io") && !accepts_quoted(uri, "https://a.io/b c") && !accepts_quoted(uri, "https:/a.io"));
        grammar_unref(uri);
    }
    check_refused("{\"type\":\"string\",\"format\":\"date\",\"maxLength\":8}", "would cut it");
    grammar *sized = compile("{\"type\":\"string\",\"format\":\"uuid\",\"minLength\":36,\"maxLength\":36}");
    CHECK(sized != NULL); /* lengths the format implies */
    grammar_unref(sized);
}

TEST(grammar_patterns_write_matching_json_strings) {
    /* the DFA runs on the string's decoded bytes: escapes in, raw control characters out */
    grammar *g = compile("{\"type\":\"string\",\"pattern\":\"^a\\\"\\\\\\\\[\\n\\t]\\\\d{2,3}$\"}"); /* ^a"\\[\n\t]\d{2,3}$ */
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "\"a\\\"\\\\\\n12\""));       /* "a\"\\\n12" */
        CHECK(accepts(g, "\"a\\\"\\\\\\t123\""));
        CHECK(!accepts(g, "\"a\\\"\\\\\n12\""));        /* a raw newline is no JSON */
        CHECK(!accepts(g, "\"a\\\"\\\\\\n1234\""));
        CHECK(!accepts(g, "\"a\\\"\\\\\\r12\""));
        grammar_state st;
        grammar_start(g, &st);
        CHECK_EQ_INT(grammar_cost(g, &st), 11); /* "a\"\\\n00" */
        grammar_unref(g);
    }
    g = compile("{\"pattern\":\"日本\"}"); /* a search: anything around it */
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "\"日本\"") && accepts(g, "\"x 日本語\"") && !accepts(g, "\"日\""));
        CHECK(!accepts(g, "\"\xe6\x97\"")); /* half a character */
        grammar_unref(g);
    }
    check_refused("{\"type\":\"string\",\"pattern\":\"^\\\\x01$\"}", "no string a JSON text can hold");
    /* minLength and maxLength beside a pattern count characters, not bytes */
    g = compile("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "\"ba\"") && accepts(g, "\"aaa\"") && accepts(g, "\"日a本\""));
        CHECK(!accepts(g, "\"bbba\"") && !accepts(g, "\"\"") && !accepts(g, "\"日本語a\""));
        grammar_unref(g);
    }
    g = compile("{\"pattern\":\"^.+$\",\"minLength\":2,\"maxLength\":2}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "\"日本\"") && accepts(g, "\"\\\"x\""));
        CHECK(!accepts(g, "\"日本語\"") && !accepts(g, "\"日\""));
        grammar_state st;
        grammar_start(g, &st);
        CHECK_EQ_INT(grammar_cost(g, &st), 4);
        grammar_unref(g);
    }
    g = compile("{\"type\":\"string\",\"format\":\"email\",\"maxLength\":12}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "\"ab@cd.io\"") && !accepts(g, "\"abcdefg@cd.io\""));
        grammar_unref(g);
    }
    check_refused("{\"type\":\"string\",\"pattern\":\"^ab$\",\"minLength\":3}", "matches no string");
    check_refused("{\"type\":\"string\",\"pattern\":\"a\",\"format\":\"date\"}", "format beside pattern");
    check_refused("{\"type\":\"string\",\"pattern\":\"(a|b)\\\\1\"}", "backreferences");
    /* a schema's patterns share one bound (each ^.{0,1000}$ takes 10,001 states) */
    char many[600] = "{\"type\":\"object\",\"properties\":{";
    for (int i = 0; i < 7; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s\"p%d\":{\"pattern\":\"^.{0,1000}$\"}", i ? "," : "", i);
    strcat(many, "}}");
    check_refused(many, "need more than 65536 automaton states together");
}

TEST(grammar_spaces_inside_names_and_literals_are_text) {
    /* whitespace was counted as padding between tokens (at most 20 in a row) inside a property
       name or an enum string too: one with 21 spaces could never be written (make fuzz found it) */
    char spaces[31];
    memset(spaces, ' ', 30);
    spaces[30] = 0;
    char schema[256], text[256];
    snprintf(schema, sizeof schema, "{\"type\":\"object\",\"properties\":{\"%s\":{\"enum\":[\"%s\"]}},\"required\":[\"%s\"]}",
             spaces, spaces, spaces);
    grammar *g = compile(schema);
    CHECK(g != NULL);
    if (g) {
        snprintf(text, sizeof text, "{\"%s\":\"%s\"}", spaces, spaces);
        CHECK(accepts(g, text));
        grammar_unref(g);
    }
}

TEST(grammar_prefix_items_type_each_position) {
    /* Pydantic's Tuple[int, str]: prefixItems, and items false after them */
    grammar *g = compile("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],"
                         "\"minItems\":2,\"maxItems\":2}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "[1,\"a\"]") && accepts(g, "[ -7 , \"\" ]"));
        CHECK(!accepts(g, "[\"a\",1]") && !accepts(g, "[1]") && !accepts(g, "[1,\"a\",2]") && !accepts(g, "[]"));
        grammar_state st;
        grammar_start(g, &st);
        char out[16];
        int64_t n = grammar_shortest_completion(g, &st, out, sizeof out);
        CHECK(n == 6 && !memcmp(out, "[0,\"\"]", 6));
        grammar_unref(g);
    }
    g = compile("{\"prefixItems\":[{\"type\":\"boolean\"}],\"items\":{\"type\":\"integer\"}}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "[]") && accepts(g, "[true]") && accepts(g, "[false,1,2]"));
        CHECK(!accepts(g, "[1]") && !accepts(g, "[true,\"x\"]"));
        grammar_unref(g);
    }
    g = compile("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"}],\"items\":false}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "[]") && accepts(g, "[null]") && !accepts(g, "[null,null]"));
        grammar_unref(g);
    }
    check_refused("{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "minItems 2 exceeds maxItems 1");
}

TEST(grammar_all_of_holds_every_schema) {
    /* Pydantic v1 and other generators wrap a $ref in allOf to describe it; two objects join */
    grammar *g = compile("{\"type\":\"object\",\"properties\":{\"pet\":{\"allOf\":[{\"$ref\":\"#/$defs/Pet\"}],"
                         "\"description\":\"the pet\"},\"n\":{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":3},"
                         "{\"maximum\":5}]}},\"required\":[\"pet\",\"n\"],\"$defs\":{\"Pet\":{\"type\":\"object\","
                         "\"properties\":{\"legs\":{\"type\":\"integer\"}},\"required\":[\"legs\"]}}}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "{\"pet\":{\"legs\":4},\"n\":3}") && accepts(g, "{\"n\":5,\"pet\":{\"legs\":0}}"));
        CHECK(!accepts(g, "{\"pet\":{},\"n\":3}") && !accepts(g, "{\"pet\":{\"legs\":4},\"n\":6}") &&
              !accepts(g, "{\"pet\":{\"legs\":4},\"n\":4.5}"));
        grammar_unref(g);
    }
    g = compile("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
                "{\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "{\"a\":\"x\",\"b\":true}") && !accepts(g, "{\"a\":\"x\"}") && !accepts(g, "{\"b\":true}"));
        grammar_unref(g);
    }
    check_refused("{\"allOf\":[{\"type\":\"string\",\"maxLength\":3},{\"maxLength\":5}]}", "maxLength");
    check_refused("{\"allOf\":[]}", "allOf needs 1 to 16");
    /* a $ref, then more: the $ref's schema is what the rest is merged into */
    g = compile("{\"allOf\":[{\"$ref\":\"#/$defs/Base\"},{\"properties\":{\"extra\":{\"type\":\"boolean\"}},"
                "\"required\":[\"extra\"]}],\"$defs\":{\"Base\":{\"type\":\"object\",\"properties\":{\"id\":"
                "{\"type\":\"integer\"}},\"required\":[\"id\"]}}}");
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "{\"id\":1,\"extra\":false}") && !accepts(g, "{\"id\":1}") && !accepts(g, "{\"extra\":true}"));
        grammar_unref(g);
    }
}

static void walk_failed(const char *what, const char *text, size_t n) {
    fprintf(stderr, "  %s after %zu bytes: '%.*s'\n", what, n, (int)n, text);
}

TEST(grammar_random_walks_keep_their_promises) {
    /* tests/grammar_walk.h's promises (no dead end, an exact shortest
       completion that ends the value, JSON jansson reads) along seeded random
       walks through schemas of every kind of node; `make fuzz` runs the same
       checks on schemas the fuzzer writes (tests/fuzz/fuzz_schema.c) */
    const char *schemas[] = {
        PERSON,
        "{}",
        "{\"type\":\"string\",\"minLength\":2,\"maxLength\":40}",
        "{\"type\":\"string\",\"maxLength\":6,\"not\":{\"pattern\":\"^(and|or|a)$|^\\\\s\"}}",
        "{\"type\":\"string\",\"pattern\":\"^[a-c]{1,3}$\",\"not\":{\"enum\":[\"a\",\"b\",\"ab\",\"abc\"]}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":6}",
        "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
        "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,\"x\",null,true,2.5]}}}]}",
        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"object\",\"properties\":{\"y\":{\"type\":\"array\","
        "\"items\":{\"type\":\"boolean\"}}},\"required\":[\"y\"]},\"s\":{\"const\":\"h\\u00e9\\n\"}},\"required\":[\"x\",\"s\"]}",
        "{\"type\":[\"string\",\"null\",\"integer\"]}",
        "{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"integer\"},\"a\":{\"type\":\"string\"},"
        "\"\\\\\\\"\":{\"type\":\"null\"}}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-300,\"exclusiveMaximum\":1000000}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":0.125,\"maximum\":0.5}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"multipleOf\":15,\"minimum\":-100,\"maximum\":2000}}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\",\"maximum\":-7.5e-9},{\"type\":\"null\"}]}}",
        "{\"type\":\"array\",\"items\":{\"exclusiveMinimum\":1234567890123.5,\"maximum\":1e300}}",
        "{\"type\":\"object\",\"properties\":{\"d\":{\"format\":\"date\"},\"t\":{\"format\":\"time\"},"
        "\"at\":{\"type\":[\"string\",\"null\"],\"format\":\"date-time\"},\"id\":{\"format\":\"uuid\"},"
        "\"ip\":{\"type\":\"array\",\"items\":{\"format\":\"ipv4\"}}}}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"pattern\":\"^[A-Z]{2}-\\\\d{3,5}(\\\\.[a-z\\\"\\\\\\\\é]+)?$\"},"
        "{\"type\":\"null\"}]}}",
        "{\"type\":\"object\",\"properties\":{\"p\":{\"pattern\":\"x[\\\\s\\\\S]y\"},\"q\":{\"pattern\":\"^(ab|c){2,4}$\"}}}",
        "{\"type\":\"array\",\"items\":{\"pattern\":\"é|[0-9]\",\"minLength\":2,\"maxLength\":5}}",
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"enum\":[\"a\",\"bc\"]},{\"type\":\"object\"}],"
        "\"items\":{\"type\":\"boolean\"},\"minItems\":4,\"maxItems\":6}",
        "{\"properties\":{\"long\":{\"type\":\"string\",\"minLength\":9},\"a\":{\"type\":\"integer\"},\"bb\":{\"enum\":[true]},"
        "\"c\":{\"type\":\"array\"},\"r\":{}},\"required\":[\"r\"],\"minProperties\":3,\"maxProperties\":4}",
        "{\"type\":\"array\",\"items\":{\"patternProperties\":{\"^k[0-9]$\":{\"type\":\"integer\"}},\"minProperties\":1,"
        "\"maxProperties\":3}}",
        "{\"type\":\"array\",\"items\":{\"propertyNames\":{\"enum\":[\"on\",\"off\"]},\"additionalProperties\":{\"format\":"
        "\"duration\"},\"minProperties\":1}}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"enum\":[\"a\",1,true]},{\"const\":12},{\"type\":\"string\",\"enum\":"
        "[\"\\u00e9\"]},{\"type\":\"object\"}]}}",
        CAT_DOG("anyOf"),
        CAT_DOG("oneOf"),
        TREE,
        "{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"enum\":[\"aaaa\",\"b\",1,12,123,null,\"\\u00e9\"]},"
        "\"uniqueItems\":true,\"minItems\":3}}",
        "{\"$defs\":{\"J\":{\"anyOf\":[{\"type\":[\"string\",\"null\",\"number\"]},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/J\"}},"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/J\"},\"b\":{\"$ref\":\"#/$defs/J\"}}}]}},\"$ref\":\"#/$defs/J\"}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"pattern\":\"^(ab)+$\"},{\"pattern\":\"x\",\"maxLength\":3},"
        "{\"enum\":[\"\\u00e9\\t\",\"{x}\",null]}]}}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"properties\":{\"v\":{\"enum\":[1,\"x\"]},\"long\":{\"minLength\":30}},"
        "\"required\":[\"v\",\"long\"]},{\"properties\":{\"v\":{\"enum\":[12,\"xy\"]},\"n\":{}},\"required\":[\"v\"]},"
        "{\"properties\":{\"only\":{\"type\":\"boolean\"},\"v\":{\"type\":\"string\"}}},{\"type\":\"string\"}]}}",
        "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/v\",\"format\":\"ipv6\"},\"$defs\":{\"v\":{\"type\":\"string\"}}}",
    };
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    unsigned char walk[300];
    int failures = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        grammar *g = compile(schemas[i]);
        CHECK(g != NULL);
        for (int w = 0; g && w < 40 && failures < 3; w++) {
            for (size_t b = 0; b < sizeof walk; b++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                walk[b] = (unsigned char)(rng >> 24);
            }
            if (!grammar_walk(g, walk, sizeof walk, walk_failed)) {
                fprintf(stderr, "  schema %zu, walk %d\n", i, w);
                failures++;
            }
        }
        grammar_unref(g);
    }
    CHECK_EQ_INT(failures, 0);
}
