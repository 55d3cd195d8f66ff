/* api/api.c: document text as JSON strings (api_text_json), which the
 * answers' recall passages and GET /v1/sessions/{id}/text are built with:
 * valid UTF-8 unchanged, anything else as U+FFFD, and garbage never refused;
 * integer fields read exactly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "common/common.h"
#include "test.h"

/* The JSON string's bytes equal want[0, n). */
static int json_text_is(const char *in, size_t in_len, const char *want, size_t n) {
    json_t *j = api_text_json(in, in_len);
    int ok = j && json_is_string(j) && json_string_length(j) == n && !memcmp(json_string_value(j), want, n);
    json_decref(j);
    return ok;
}

TEST(api_text_json_keeps_utf8_and_mends_the_rest) {
    CHECK(json_text_is("", 0, "", 0));
    CHECK(json_text_is("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14));
    CHECK(json_text_is("a\0b", 3, "a\0b", 3));                                  /* NUL stays */
    CHECK(json_text_is("a\xFF" "b", 3, "a\xEF\xBF\xBD" "b", 5));                 /* a stray byte */
    CHECK(json_text_is("x\xE2\x82", 3, "x\xEF\xBF\xBD\xEF\xBF\xBD", 7));        /* cut at the end */
    CHECK(json_text_is("\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD", 6));           /* overlong */
    CHECK(json_text_is("\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 9)); /* a surrogate */
}

TEST(api_text_json_takes_any_bytes) {
    unsigned seed = 12345;
    char buf[64];
    for (int round = 0; round < 20000; round++) {
        size_t n = (size_t)(rand_r(&seed) % (int)sizeof buf);
        for (size_t i = 0; i < n; i++) {
            int r = rand_r(&seed);
            buf[i] = (char)(r % 3 ? r >> 8 : "ab\xC3\xA9\xE2\x82\xAC"[r % 7]); /* bytes, some of them UTF-8 */
        }
        json_t *j = api_text_json(buf, n);
        CHECK(j && json_is_string(j));
        if (!j) continue;
        /* every valid sequence survives in order; each other byte is one U+FFFD */
        const char *out = json_string_value(j);
        size_t k = 0, len = json_string_length(j);
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int l = utf8_seq((const unsigned char *)buf + i, n - i, &cp);
            size_t m = l > 0 ? (size_t)l : 3;
            const char *want = l > 0 ? buf + i : "\xEF\xBF\xBD";
            if (k + m > len || memcmp(out + k, want, m)) {
                CHECK(!"the bytes come out as they went in, or as U+FFFD");
                break;
            }
            k += m;
            i += l > 0 ? (size_t)l : 1;
        }
        CHECK(k == len);
        json_decref(j);
    }
}

/* Integer fields are read as integers: through a double, seeds above 2^53 merged
 * and 2^63 - 1 rounded to 2^63, out of int64_t's range (undefined behaviour). */
TEST(api_integers_are_kept_exact) {
    static const struct { const char *seed; uint64_t want; } cases[] = {
        {"9007199254740992", 9007199254740992u}, {"9007199254740993", 9007199254740993u},
        {"9223372036854775807", 9223372036854775807u}, {"9223372036854775806", 9223372036854775806u},
        {"-9223372036854775808", (uint64_t)INT64_MIN}, {"2048.0", 2048}, {"-0.0", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"seed\": %s}", cases[i].seed);
        api_gen_request r;
        api_error e;
        json_t *root = api_parse_object(body, strlen(body), &e);
        CHECK(root && api_parse_gen_request(root, 0, 100, &r, &e) == 0);
        json_decref(root);
        CHECK(r.params.sampling.seed == cases[i].want);
        api_gen_request_free(&r);
    }
    static const char *const refused[] = {"1e19", "-1e19", "9.3e18", "1e308", "2048.5", "\"7\""};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"seed\": %s}", refused[i]);
        api_gen_request r;
        api_error e;
        json_t *root = api_parse_object(body, strlen(body), &e);
        CHECK(root && api_parse_gen_request(root, 0, 100, &r, &e) != 0);
        json_decref(root);
        CHECK(e.status == 400 && !strcmp(e.param, "seed"));
        api_gen_request_free(&r);
    }
}
