/* api/tools.c: the tool formats of chatml (Qwen2.5's template) and llama3
 * (Llama 3.1's), and finding calls in generated text (tool_choice auto). */
#include <stdlib.h>

#include "api/api.h"
#include "test.h"

static const char REQUEST[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
    "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
    "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"get_sky\",\"arguments\":\"{}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"21C\"},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"sunny\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]%s}";

static int parse(api_gen_request *r, const char *extra) {
    char body[2048];
    snprintf(body, sizeof body, REQUEST, extra);
    api_error e;
    json_t *root = api_parse_object(body, strlen(body), &e);
    int rc = root ? api_parse_gen_request(root, 1, 1000, r, &e) : -1;
    json_decref(root);
    if (rc) fprintf(stderr, "  %s\n", e.message);
    return rc;
}

TEST(tools_chatml_format) {
    api_gen_request r;
    api_error e;
    CHECK_EQ_INT(parse(&r, ""), 0);
    CHECK_EQ_INT(api_render_tools(&r, "chatml", &e), 0);
    CHECK_EQ_INT(r.n_messages, 4); /* system (with tools), user, assistant, one user turn of results */
    CHECK_STR(r.messages[0].role, "system");
    CHECK(!strncmp(r.messages[0].content, "Be brief.\n\n# Tools\n", 19));
    CHECK(strstr(r.messages[0].content, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"") != NULL);
    CHECK_STR(r.messages[2].content,
              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
              "<tool_call>\n{\"name\": \"get_sky\", \"arguments\": {}}\n</tool_call>");
    CHECK_STR(r.messages[3].role, "user");
    CHECK_STR(r.messages[3].content, "<tool_response>\n21C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>");
    api_gen_request_free(&r);
}

TEST(tools_llama3_format) {
    api_gen_request r;
    api_error e;
    CHECK_EQ_INT(parse(&r, ""), 0);
    CHECK_EQ_INT(api_render_tools(&r, "llama3", &e), 0);
    CHECK_EQ_INT(r.n_messages, 5);
    CHECK_STR(r.messages[0].content, "Be brief.");
    CHECK(!strncmp(r.messages[1].content, "Given the following functions", 29));
    CHECK(strstr(r.messages[1].content, "Weather in Paris?") != NULL);
    CHECK_STR(r.messages[2].content, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n"
                                     "{\"name\": \"get_sky\", \"parameters\": {}}");
    CHECK_STR(r.messages[3].role, "ipython");
    CHECK_STR(r.messages[3].content, "21C");
    api_gen_request_free(&r);
}

TEST(tools_other_families_refuse) {
    api_gen_request r;
    api_error e;
    CHECK_EQ_INT(parse(&r, ""), 0);
    CHECK_EQ_INT(api_render_tools(&r, "gemma", &e), -1);
    CHECK_EQ_INT(e.status, 400);
    CHECK_STR(e.param, "tools");
    api_gen_request_free(&r);
}

TEST(tools_found_in_generated_text) {
    api_gen_request r;
    api_error e;
    CHECK_EQ_INT(parse(&r, ""), 0);
    CHECK_EQ_INT(api_render_tools(&r, "chatml", &e), 0);
    const char *text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
                       "</tool_call>\n<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
    char *content;
    json_t *calls = api_find_tool_calls(&r, text, strlen(text), &content);
    CHECK_EQ_INT(json_array_size(calls), 2); /* the unknown tool stays text; the unclosed last one counts */
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    CHECK_STR(json_string_value(json_object_get(fn, "name")), "get_weather");
    CHECK_STR(json_string_value(json_object_get(fn, "arguments")), "{\"city\": \"Rome\"}"); /* as written */
    CHECK(content && !strncmp(content, "Let me check.", 13) && strstr(content, "nope"));
    free(content);
    json_decref(calls);
    calls = api_find_tool_calls(&r, "no calls here", 13, &content);
    CHECK(calls == NULL && content == NULL);
    /* a call max_tokens cut open is not text (its markup never comes back): [] and the text before */
    const char *cut = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"";
    calls = api_find_tool_calls(&r, cut, strlen(cut), &content);
    CHECK(calls != NULL && json_array_size(calls) == 0);
    CHECK_STR(content ? content : "(null)", "Checking.");
    free(content);
    json_decref(calls);
    const char *one_and_cut = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
                              "</tool_call>\n<tool_call>\n{\"name\":";
    calls = api_find_tool_calls(&r, one_and_cut, strlen(one_and_cut), &content);
    CHECK_EQ_INT(json_array_size(calls), 1);
    CHECK(content == NULL);
    free(content);
    json_decref(calls);
    /* cut inside the next call's tag: its start is not text either (it came back as "<tool") */
    const char *cut_in_tag = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>\n<tool";
    calls = api_find_tool_calls(&r, cut_in_tag, strlen(cut_in_tag), &content);
    CHECK_EQ_INT(json_array_size(calls), 1);
    CHECK_STR(content ? content : "(null)", "(null)");
    free(content);
    json_decref(calls);
    /* stop strings do not cut a call the model writes itself */
    CHECK_STR(r.params.stop_guard ? r.params.stop_guard : "(null)", "<tool_call>");
    api_gen_request_free(&r);
    CHECK_EQ_INT(parse(&r, ",\"parallel_tool_calls\":false"), 0);
    CHECK_EQ_INT(api_render_tools(&r, "chatml", &e), 0);
    calls = api_find_tool_calls(&r, text, strlen(text), &content);
    CHECK_EQ_INT(json_array_size(calls), 1);
    free(content);
    json_decref(calls);
    api_gen_request_free(&r);
}

/* What a stream may send as content while an answer with tools (auto) is generated:
 * at every prefix of an answer, the bytes said ready are the start of the content
 * the whole answer gets (its text around the calls, or all of it without calls),
 * less any whitespace before it; never the start of a call's markup. */
TEST(tools_text_ready_is_the_content_so_far) {
    static const char *const chatml[] = {
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
        "It is sunny in Paris, 21 degrees.  \n",
        "  Hello <b>there</b> < tool_call> <tool_cal",
        "One.\n\n<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call> Two.",
    };
    static const char *const llama3[] = {
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
        "  {\"name\": \"get_weather\", \"parameters\": {}}",
        "The weather is fine. {not a call}",
    };
    for (int fam = 0; fam < 2; fam++) {
        api_gen_request r;
        api_error e;
        CHECK_EQ_INT(parse(&r, ""), 0);
        CHECK_EQ_INT(api_render_tools(&r, fam ? "llama3" : "chatml", &e), 0);
        const char *const *answers = fam ? llama3 : chatml;
        size_t n = fam ? sizeof llama3 / sizeof *llama3 : sizeof chatml / sizeof *chatml;
        for (size_t i = 0; i < n; i++) {
            const char *text = answers[i];
            size_t len = strlen(text);
            char *content = NULL;
            json_t *calls = api_find_tool_calls(&r, text, len, &content);
            const char *whole = calls ? (content ? content : "") : text;
            size_t lead = 0;
            while (!calls && strchr(" \t\r\n", text[lead]) && text[lead]) lead++; /* (content is trimmed) */
            size_t last = 0;
            for (size_t k = 0; k <= len; k++) {
                size_t ready = api_tool_text_ready(&r, text, k);
                size_t from = 0;
                while (from < ready && strchr(" \t\r\n", text[from])) from++;
                CHECK(ready >= last || ready == 0);
                CHECK(ready == 0 || !strncmp(text + from, whole + (calls ? 0 : lead), ready - from));
                if (ready) last = ready;
            }
            if (!calls && !strchr(text, '<')) /* a plain answer is all sent, but for the whitespace at its end */
                CHECK_EQ_INT((int)last, (int)(strlen(text) - (strstr(text, "  \n") ? 3 : 0)));
            free(content);
            json_decref(calls);
        }
        api_gen_request_free(&r);
    }
    api_gen_request r;
    CHECK_EQ_INT(parse(&r, ",\"tool_choice\":\"required\""), 0); /* a forced call is never text */
    api_error e;
    CHECK_EQ_INT(api_render_tools(&r, "chatml", &e), 0);
    CHECK_EQ_INT((int)api_tool_text_ready(&r, "Sure", 4), 0);
    api_gen_request_free(&r);
}

/* A call as a stream sends it (api_call_progress at every prefix of text): the
 * name from prefix length `from` on, arguments that only grow, are the start of
 * want (the whole answer's, as written) and whole (through their closing brace,
 * nothing of the call's end) from the moment that brace comes. */
static void check_streamed_call(const api_gen_request *r, const char *text, const char *want, size_t from) {
    size_t len = strlen(text), at0 = (size_t)(strstr(text, want) - text), last = 0;
    int was_whole = 0;
    for (size_t k = 0; k <= len; k++) {
        size_t at = 0, n = 0;
        int whole = 0;
        const char *name = api_call_progress(r, text, k, &at, &n, &whole);
        CHECK((name != NULL) == (k >= from));
        if (!name) continue;
        CHECK_STR(name, "get_weather");
        CHECK_EQ_INT((int)at, (int)at0);
        CHECK(n >= last && n <= strlen(want) && !strncmp(text + at, want, n));
        CHECK_EQ_INT(whole, k >= at0 + strlen(want));
        CHECK(!was_whole || whole);
        last = n;
        was_whole = whole;
    }
    CHECK(was_whole && last == strlen(want));
}

/* A call as a stream sends it (check_streamed_call), forced (required) or written by
 * the model itself (auto), both formats: the name once the prefix the grammar forces
 * is written, or (auto) once the model has written it whole and it names a tool (not
 * while it could still be another: "get_weather" is not "get_weather_now"), after
 * the text before it; the whole answer's arguments are the text the model wrote
 * (spaces kept). A call written in another shape (arguments first), or naming no
 * tool, is not streamed, and its arguments are the object as parsed. */
TEST(tools_calls_stream_their_arguments_as_written) {
    static const struct {
        const char *choice, *family, *text, *args, *content;
        size_t after; /* the name is sure this many bytes after the arguments start */
    } cases[] = {
        {"required", "chatml",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome \\\"}{\\\"\", \"n\": [1, {}]}}\n"
         "</tool_call>",
         "{\"city\": \"Rome \\\"}{\\\"\", \"n\": [1, {}]}", NULL, 0},
        {"required", "llama3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Nice\"}}",
         "{\"city\": \"Nice\"}", NULL, 0},
        {"auto", "chatml",
         "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"n\": [1, 2]}}\n"
         "</tool_call>",
         "{\"city\": \"Oslo\", \"n\": [1, 2]}", "Let me look.", 1},
        {"auto", "llama3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Nice\"}}",
         "{\"city\": \"Nice\"}", NULL, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_gen_request r;
        api_error e;
        char extra[64];
        snprintf(extra, sizeof extra, ",\"tool_choice\":\"%s\"", cases[i].choice);
        CHECK_EQ_INT(parse(&r, extra), 0);
        CHECK_EQ_INT(api_render_tools(&r, cases[i].family, &e), 0);
        const char *text = cases[i].text, *want = cases[i].args;
        check_streamed_call(&r, text, want, (size_t)(strstr(text, want) - text) + cases[i].after);
        char *content = NULL;
        json_t *found = api_find_tool_calls(&r, text, strlen(text), &content);
        CHECK_EQ_INT(json_array_size(found), 1);
        CHECK_STR(json_string_value(json_object_get(json_object_get(json_array_get(found, 0), "function"), "arguments")),
                  want);
        CHECK(cases[i].content ? content && !strcmp(content, cases[i].content) : content == NULL);
        free(content);
        json_decref(found);
        api_gen_request_free(&r);
    }
    api_gen_request r;
    api_error e;
    CHECK_EQ_INT(parse(&r, ",\"tool_choice\":\"auto\""), 0);
    CHECK_EQ_INT(api_render_tools(&r, "chatml", &e), 0);
    static const char *const unstreamed[] = {
        "<tool_call>\n{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather_now\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        "The weather is fine.",
    };
    for (int i = 0; i < 3; i++) {
        size_t at, n;
        int whole;
        CHECK(api_call_progress(&r, unstreamed[i], strlen(unstreamed[i]), &at, &n, &whole) == NULL);
    }
    char *content = NULL;
    json_t *found = api_find_tool_calls(&r, unstreamed[0], strlen(unstreamed[0]), &content);
    CHECK_STR(json_string_value(json_object_get(json_object_get(json_array_get(found, 0), "function"), "arguments")),
              "{\"city\":\"Oslo\"}");
    json_decref(found);
    free(content);
    api_gen_request_free(&r);
}
