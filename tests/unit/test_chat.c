/* Chat templates: family detection and rendering, checked byte for byte
 * against jinja2 renderings of the real templates (tests/fixtures/ref_chat.json,
 * written by tests/reference/record_chat.py). */
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <time.h>

#include "engine/chat.h"

static const char *ref_chat_path(void) {
    const char *p = getenv("POTSERVE_REF_CHAT");
    return p ? p : "tests/fixtures/ref_chat.json";
}

/* Renders one fixture case; 1 when it equals the expected text. */
static int check_case(const chat_template *tpl, const char *tname, json_t *c) {
    json_t *msgs = json_object_get(c, "messages");
    const char *expected = json_string_value(json_object_get(c, "expected"));
    int agp = json_is_true(json_object_get(c, "add_generation_prompt"));
    if (!json_is_array(msgs) || !expected) {
        CHECK(!"malformed fixture case");
        return 0;
    }
    size_t n = json_array_size(msgs);
    chat_message m[16];
    CHECK(n <= 16);
    if (n > 16) return 0;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(msgs, i);
        m[i].role = json_string_value(json_object_get(o, "role"));
        m[i].content = json_string_value(json_object_get(o, "content"));
    }
    char err[256] = "";
    const chat_options opt = {.no_thinking = json_is_false(json_object_get(c, "enable_thinking"))};
    char *out = chat_render_opts(tpl, m, n, agp, &opt, err, sizeof err);
    int ok = out && strcmp(out, expected) == 0;
    if (!ok) {
        test_failures++;
        fprintf(stderr, "  %s / %s (agp=%d): got \"%s\" (%s), expected \"%s\"\n", tname,
                json_string_value(json_object_get(c, "name")), agp, out ? out : "(null)", err,
                expected);
    }
    free(out);
    return ok;
}

TEST(chat_matches_jinja_reference) {
    json_error_t jerr;
    json_t *root = json_load_file(ref_chat_path(), 0, &jerr);
    if (!root) {
        fprintf(stderr, "  cannot load %s: %s\n", ref_chat_path(), jerr.text);
        CHECK(root != NULL);
        return;
    }
    json_t *tpls = json_object_get(root, "templates");
    CHECK(json_array_size(tpls) >= 7);
    int seen[CHAT_FAMILY_LAST + 1] = {0};
    size_t total = 0, matched = 0, lenient = 0, lenient_matched = 0;
    for (size_t i = 0; i < json_array_size(tpls); i++) {
        json_t *t = json_array_get(tpls, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *family = json_string_value(json_object_get(t, "family"));
        const char *text = json_string_value(json_object_get(t, "template"));
        const char *bos = json_string_value(json_object_get(t, "bos"));
        const char *eos = json_string_value(json_object_get(t, "eos"));
        chat_template tpl;
        int rc = chat_template_detect(text, bos, eos, &tpl);
        if (rc != 0 || tpl.family != chat_family_from_name(family)) {
            test_failures++;
            fprintf(stderr, "  %s: detected %s, expected %s\n", name, chat_family_name(tpl.family),
                    family);
            continue;
        }
        seen[tpl.family] = 1;
        json_t *cases = json_object_get(t, "cases");
        size_t t_total = 0, t_ok = 0;
        for (size_t j = 0; j < json_array_size(cases); j++) {
            json_t *c = json_array_get(cases, j);
            int is_lenient = json_is_true(json_object_get(c, "lenient"));
            int ok = check_case(&tpl, name, c);
            total++, t_total++;
            matched += ok, t_ok += ok;
            lenient += is_lenient;
            lenient_matched += is_lenient && ok;
        }
        if (getenv("VERBOSE"))
            fprintf(stderr, "       %-48s %-8s %zu/%zu\n", name, family, t_ok, t_total);
    }
    for (int f = CHAT_CHATML; f <= CHAT_FAMILY_LAST; f++) {
        if (!seen[f]) fprintf(stderr, "  no reference template for %s\n", chat_family_name(f));
        CHECK(seen[f]);
    }
    CHECK(total >= 100);
    CHECK_EQ_INT(matched, total);
    if (getenv("VERBOSE"))
        fprintf(stderr, "       chat reference: %zu/%zu byte-exact (%zu jinja, %zu/%zu lenient)\n",
                matched, total, total - lenient, lenient_matched, lenient);
    json_decref(root);
}

TEST(chat_family_names) {
    const char *list = chat_family_list();
    const char *names[] = {"chatml", "llama2", "llama3", "mistral", "zephyr", "gemma", "qwen3", "phi3"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK(strstr(list, names[i]) != NULL);
        enum chat_family f = chat_family_from_name(names[i]);
        CHECK(f != CHAT_UNKNOWN);
        CHECK_STR(chat_family_name(f), names[i]);
    }
    CHECK_EQ_INT(chat_family_from_name("vicuna"), CHAT_UNKNOWN);
    CHECK_EQ_INT(chat_family_from_name(NULL), CHAT_UNKNOWN);
    CHECK_EQ_INT(chat_family_from_name(""), CHAT_UNKNOWN);
}

TEST(chat_unknown_templates_fail) {
    const char *bad[] = {
        NULL,
        "",
        "INVALID TEMPLATE",
        /* vicuna */
        "{%- for message in messages %}{%- if message['role'] == 'system' -%}{{- '' + "
        "message['content'] + '\n\n' -}}{%- else -%}{%- if message['role'] == 'user' -%}{{-'USER: ' "
        "+ message['content'] + '\n'-}}{%- else -%}{{-'ASSISTANT: ' + message['content'] + "
        "'</s>\n' -}}{%- endif -%}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt "
        "-%}{{-'ASSISTANT:'-}}{%- endif -%}",
        /* phi-3 */
        "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] "
        "+ '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% "
        "endif %}{# <|user|> #}",
        /* phi-4 */
        "{% for message in messages %}{% if (message['role'] == 'system') "
        "%}{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% "
        "endfor %}",
        /* a reasoning ChatML other than Qwen3's (QwQ-style: drops <think> from history, no switch) */
        "{%- for message in messages %}{%- if message.role == 'assistant' %}{%- set content = "
        "message.content.split('</think>')[-1] %}{{ '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}"
        "{%- else %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{%- endif %}",
        /* mistral v7 */
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] "
        "' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ "
        "'[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% endif %}{% endfor %}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        chat_template tpl;
        tpl.family = CHAT_GEMMA;
        CHECK_EQ_INT(chat_template_detect(bad[i], "<s>", "</s>", &tpl), -1);
        CHECK_EQ_INT(tpl.family, CHAT_UNKNOWN);
        chat_message m = {"user", "hi"};
        char err[128] = "";
        CHECK(chat_render(&tpl, &m, 1, 1, err, sizeof err) == NULL);
        CHECK(strstr(err, "chatml, llama2") != NULL);
    }
}

/* The template text of SmolLM2-135M-Instruct's GGUF (real newlines inside the
 * string literals), with the model's BOS/EOS texts. */
static const char smollm2_tpl[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

TEST(chat_smollm2_default_system) {
    chat_template tpl;
    CHECK_EQ_INT(chat_template_detect(smollm2_tpl, "<|im_start|>", "<|im_end|>", &tpl), 0);
    CHECK_EQ_INT(tpl.family, CHAT_CHATML);
    CHECK_STR(tpl.default_system,
              "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    CHECK_STR(tpl.bos_text, ""); /* the template never writes bos_token */
    CHECK_STR(tpl.eos_text, "");
    chat_message m[] = {{"user", "Explain."}};
    char err[128];
    char *out = chat_render(&tpl, m, 1, 1, err, sizeof err);
    CHECK_STR(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                   "Hugging Face<|im_end|>\n<|im_start|>user\nExplain.<|im_end|>\n"
                   "<|im_start|>assistant\n");
    free(out);
    /* same with escaped "\n" in the literal (as other GGUFs store it) */
    const char *esc = "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
                      "'system' %}{{ '<|im_start|>system\\nBe \\'brief\\'.<|im_end|>\\n' }}{% "
                      "endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                      "'<|im_end|>' + '\\n'}}{% endfor %}";
    CHECK_EQ_INT(chat_template_detect(esc, NULL, NULL, &tpl), 0);
    CHECK_STR(tpl.default_system, "Be 'brief'.");
}

TEST(chat_bad_input) {
    chat_template tpl;
    CHECK_EQ_INT(chat_template_detect(smollm2_tpl, "<|im_start|>", "<|im_end|>", &tpl), 0);
    char err[128] = "";
    chat_message tool[] = {{"user", "x"}, {"tool", "y"}};
    CHECK(chat_render(&tpl, tool, 2, 1, err, sizeof err) == NULL);
    CHECK(strstr(err, "tool") != NULL && strchr(err, '\n') == NULL);
    err[0] = 0;
    CHECK(chat_render(&tpl, tool, 0, 1, err, sizeof err) == NULL);
    CHECK(err[0] != 0);
    chat_message nul[] = {{"user", NULL}};
    CHECK(chat_render(&tpl, nul, 1, 1, err, sizeof err) == NULL);

    /* a later system message: no place for it in gemma or mistral */
    chat_template g = {0};
    g.family = CHAT_GEMMA;
    chat_message late[] = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
    err[0] = 0;
    CHECK(chat_render(&g, late, 3, 1, err, sizeof err) == NULL);
    CHECK(strstr(err, "system") != NULL);
    chat_template mi = {0};
    mi.family = CHAT_MISTRAL;
    err[0] = 0;
    CHECK(chat_render(&mi, late, 3, 1, err, sizeof err) == NULL);
    CHECK(strstr(err, "system") != NULL);

    /* BOS text that does not fit */
    char longbos[64];
    memset(longbos, 'x', sizeof longbos - 1);
    longbos[sizeof longbos - 1] = 0;
    CHECK_EQ_INT(chat_template_detect("{{ bos_token }}<start_of_turn>", longbos, "", &tpl), -1);
}

TEST(chat_family_by_name_renders) {
    /* a template chosen by name (no template text): default layouts */
    chat_message m[] = {{"system", "S"}, {"user", " U "}};
    struct {
        const char *name, *want;
    } cases[] = {
        {"chatml", "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n"
                   "<|im_start|>assistant\n"},
        {"llama2", "[INST] <<SYS>>\nS\n<</SYS>>\n\n U [/INST]"}, /* strip() of the whole turn */
        {"llama3", "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"mistral", " [INST] S\n\n U  [/INST]"},
        {"zephyr", "<|system|>\nS\n<|user|>\n U \n<|assistant|>\n"},
        {"gemma", "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        chat_template tpl = {0};
        tpl.family = chat_family_from_name(cases[i].name);
        char err[128];
        char *out = chat_render(&tpl, m, 2, 1, err, sizeof err);
        CHECK_STR(out, cases[i].want);
        free(out);
    }
}

TEST(chat_llama32_today) {
    /* Llama 3.2's template takes today's date from strftime_now */
    const char *t = "{{- bos_token }}{%- if not date_string is defined %}{%- if strftime_now is "
                    "defined %}{%- set date_string = strftime_now(\"%d %b %Y\") %}{%- endif %}"
                    "{%- endif %}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
                    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}{{- \"Today Date: \" + "
                    "date_string + \"\\n\\n\" }}";
    chat_template tpl;
    CHECK_EQ_INT(chat_template_detect(t, "<|begin_of_text|>", "<|eot_id|>", &tpl), 0);
    CHECK_EQ_INT(tpl.family, CHAT_LLAMA3);
    CHECK_EQ_INT(tpl.variant, CHAT_LLAMA3_DATED);
    CHECK_STR(tpl.date, "");
    chat_message m[] = {{"user", "hi"}};
    char err[128], want[128], day[32];
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    strftime(day, sizeof day, "%d %b %Y", &tmv);
    snprintf(want, sizeof want, "Today Date: %s\n\n<|eot_id|>", day);
    char *out = chat_render(&tpl, m, 1, 1, err, sizeof err);
    CHECK(out && strstr(out, want) != NULL);
    CHECK(out && strncmp(out, "<|begin_of_text|><|start_header_id|>system", 41) == 0);
    free(out);
}

TEST(chat_trim_is_python_strip) {
    /* Gemma trims content like Python's str.strip(): Unicode spaces too, but
     * not U+200B (zero width space) or U+FEFF. */
    chat_template tpl = {0};
    tpl.family = CHAT_GEMMA;
    chat_message m[] = {{"user", "\xe3\x80\x80\xc2\xa0 x \xe2\x80\xa8\x1f\xc2\x85"}};
    char err[128];
    char *out = chat_render(&tpl, m, 1, 0, err, sizeof err);
    CHECK_STR(out, "<start_of_turn>user\nx<end_of_turn>\n");
    free(out);
    chat_message z[] = {{"user", "\xe2\x80\x8bx\xef\xbb\xbf"}};
    out = chat_render(&tpl, z, 1, 0, err, sizeof err);
    CHECK_STR(out, "<start_of_turn>user\n\xe2\x80\x8bx\xef\xbb\xbf<end_of_turn>\n");
    free(out);
    chat_message ws[] = {{"user", " \t\n "}};
    out = chat_render(&tpl, ws, 1, 0, err, sizeof err);
    CHECK_STR(out, "<start_of_turn>user\n<end_of_turn>\n");
    free(out);
}
