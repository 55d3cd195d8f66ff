/* Chat templates: family detection from the GGUF's tokenizer.chat_template and
 * rendering that mirrors the real Jinja templates of each family (checked byte
 * for byte against jinja2 by tests/unit/test_chat.c with tests/fixtures/ref_chat.json).
 *
 * Where the real template raises an exception we either fail with an error
 * (a system message that is not the first one, in families without a system
 * role) or, on purpose, stay lenient:
 *   - user/assistant alternation is not enforced (the text is rendered message
 *     by message with the template's per-message rules);
 *   - Gemma templates before Gemma 3 and the legacy Mistral template reject a
 *     system message: we merge it into the first user turn the way Gemma 3 and
 *     the Mistral v1 template do ("system\n\nuser");
 *   - an empty message list is rejected (most templates index messages[0]). */
#include "chat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

/* ---- names ------------------------------------------------------------------ */

#define CHAT_FAMILY_ENTRY_(id, name) [CHAT_##id] = name,
static const char *const family_names[] = {[CHAT_UNKNOWN] = "unknown", ENGINE_CHAT_FAMILIES(CHAT_FAMILY_ENTRY_, )};
enum { N_FAMILIES = sizeof family_names / sizeof family_names[0] };

enum chat_family chat_family_from_name(const char *name) {
    if (!name) return CHAT_UNKNOWN;
    for (int f = CHAT_UNKNOWN + 1; f < N_FAMILIES; f++)
        if (strcmp(name, family_names[f]) == 0) return (enum chat_family)f;
    return CHAT_UNKNOWN;
}

const char *chat_family_name(enum chat_family f) {
    if ((int)f < CHAT_UNKNOWN || (int)f >= N_FAMILIES) return family_names[CHAT_UNKNOWN];
    return family_names[f];
}

const char *chat_family_list(void) { return ENGINE_CHAT_TEMPLATE_LIST; }

/* ---- detection ------------------------------------------------------------------ */

static int has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* Copies src into dst[cap]; 0, or -1 when it does not fit. */
static int copy_text(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) return -1;
    memcpy(dst, src, n + 1);
    return 0;
}

/* Decodes the body of a Jinja string literal (escapes \n \t \r \\ \' \") into
 * out[cap]; 0, or -1 when it does not fit or has an escape we do not know. */
static int unescape_literal(const char *s, size_t len, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '\\') {
            if (++i == len) return -1;
            switch (s[i]) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case '\\': c = '\\'; break;
            case '\'': c = '\''; break;
            case '"': c = '"'; break;
            default: return -1;
            }
        }
        if (o + 1 >= cap) return -1;
        out[o++] = c;
    }
    out[o] = 0;
    return 0;
}

/* ChatML default system prompt: the literal text of a
 * '<|im_start|>system\n...<|im_end|>' inside one string literal (SmolLM2,
 * Qwen2, Qwen2.5). Only considered when the template tests for a missing
 * system message. "" when none. */
static int chatml_default_system(const char *t, char *out, size_t cap) {
    out[0] = 0;
    if (!has(t, "!= 'system'") && !has(t, "!= \"system\"") && !has(t, "== 'system'") &&
        !has(t, "== \"system\""))
        return 0;
    static const char open[] = "<|im_start|>system";
    for (const char *p = strstr(t, open); p; p = strstr(p + 1, open)) {
        const char *q = p + sizeof open - 1;
        if (q[0] == '\n') q += 1;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q) continue;
        /* the text must sit inside the same literal: no unescaped quote in between */
        int inside = 1;
        for (const char *r = q; r < end && inside; r++) {
            if (*r == '\\') r++;
            else if (*r == '\'' || *r == '"' || *r == '{' || *r == '}') inside = 0;
        }
        if (!inside) continue;
        return unescape_literal(q, (size_t)(end - q), out, cap);
    }
    return 0;
}

/* Llama 3.1+: the default date literal of `set date_string = "..."`. */
static int llama3_default_date(const char *t, char *out, size_t cap) {
    out[0] = 0;
    if (has(t, "strftime_now")) return 0; /* today's date at render time */
    const char *p = strstr(t, "date_string = ");
    if (!p) return -1;
    p += strlen("date_string = ");
    char q = *p;
    if (q != '"' && q != '\'') return -1;
    const char *e = strchr(p + 1, q);
    if (!e) return -1;
    return unescape_literal(p + 1, (size_t)(e - p - 1), out, cap);
}

int chat_template_detect(const char *t, const char *bos, const char *eos, chat_template *tpl) {
    memset(tpl, 0, sizeof *tpl);
    tpl->family = CHAT_UNKNOWN;
    if (!t || !*t) return -1;
    if (!bos) bos = "";
    if (!eos) eos = "";

    enum chat_family f = CHAT_UNKNOWN;
    int variant = 0;
    if (has(t, "<|im_start|>")) {
        /* phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) look alike but differ */
        if (has(t, "<think>") || has(t, "reasoning_content")) {
            /* Qwen3 (hybrid thinking); QwQ and the other reasoning ChatMLs differ in detail */
            if (has(t, "enable_thinking") && has(t, "last_query_index")) f = CHAT_QWEN3;
        } else if (!has(t, "<|im_sep|>") && !has(t, "<end_of_utterance>")) {
            f = CHAT_CHATML;
        }
    } else if (has(t, "[INST]")) {
        if (has(t, "<<SYS>>")) {
            /* Llama 2 chat: bos_token + '[INST] ' per user turn, content.strip() */
            if (has(t, "bos_token + '[INST] '") && has(t, ".strip()")) f = CHAT_LLAMA2;
        } else if (has(t, "[SYSTEM_PROMPT]")) {
            f = CHAT_UNKNOWN; /* Mistral v7: not supported */
        } else if (has(t, "' [INST] '") || has(t, "\" [INST] \"")) {
            f = CHAT_MISTRAL, variant = CHAT_MISTRAL_V1;
        } else if (has(t, "\"[INST] \"") || has(t, "'[INST] ' + system_message")) {
            f = CHAT_MISTRAL, variant = CHAT_MISTRAL_V3;
        } else if (has(t, "\"[INST]\"") || has(t, "'[INST]' +")) {
            f = CHAT_MISTRAL, variant = CHAT_MISTRAL_V3_TEKKEN;
        } else if (has(t, "'[INST] ' + message['content'] + ' [/INST]'") ||
                   has(t, "\"[INST] \" + message[\"content\"] + \" [/INST]\"")) {
            f = CHAT_MISTRAL, variant = CHAT_MISTRAL_LEGACY;
        }
    } else if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) {
        f = CHAT_LLAMA3;
        if (has(t, "Cutting Knowledge Date: December 2023")) {
            variant = CHAT_LLAMA3_DATED;
            if (llama3_default_date(t, tpl->date, sizeof tpl->date) != 0) f = CHAT_UNKNOWN;
        }
    } else if (has(t, "<start_of_turn>")) {
        f = CHAT_GEMMA;
    } else if (has(t, "<|user|>") && has(t, "<|assistant|>") && !has(t, "<|end|>")) {
        f = CHAT_ZEPHYR; /* Phi-3 (<|end|>) looks alike but differs */
    } else if (has(t, "<|user|>") && has(t, "<|assistant|>") && has(t, "<|end|>") &&
               has(t, "message['role'] == 'system' and message['content']")) {
        f = CHAT_PHI3; /* Phi-3.5-mini; Phi-3-mini's older template (no system turn) is not this one */
    }
    if (f == CHAT_UNKNOWN) return -1;

    /* The templates write BOS/EOS through the bos_token/eos_token variables. */
    if (has(t, "bos_token") && copy_text(tpl->bos_text, sizeof tpl->bos_text, bos) != 0) return -1;
    if (has(t, "eos_token") && copy_text(tpl->eos_text, sizeof tpl->eos_text, eos) != 0) return -1;
    if (f == CHAT_CHATML &&
        chatml_default_system(t, tpl->default_system, sizeof tpl->default_system) != 0) {
        tpl->default_system[0] = 0;
        return -1;
    }
    tpl->family = f;
    tpl->variant = variant;
    return 0;
}

/* ---- rendering helpers ------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
    chat_spans *spans; /* where the messages' text went (NULL: not kept) */
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom || vec_reserve_((void **)&b->p, &b->cap, b->len + n + 1, 1)) {
        b->oom = 1;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* A message's own text (not the template's): appended, and its span kept. */
static void sb_text(sbuf *b, const char *s, size_t n) {
    size_t at = b->len;
    sb_add(b, s, n);
    if (b->oom || !n || !b->spans) return;
    chat_spans *sp = b->spans;
    if (sp->n && sp->v[sp->n - 1] == at) { /* (joined to the one before) */
        sp->v[sp->n - 1] = at + n;
        return;
    }
    if (vec_reserve(sp, sp->n + 2)) {
        b->oom = 1;
        return;
    }
    sp->v[sp->n++] = at;
    sp->v[sp->n++] = at + n;
}

static void sb_text_str(sbuf *b, const char *s) { sb_text(b, s, strlen(s)); }

/* Python's str.isspace() for one code point (what Jinja's trim and
 * str.strip() remove). */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Decodes the UTF-8 sequence at s[i] (n bytes left): code point and its
 * length; invalid bytes decode as themselves (never whitespace). */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *len) {
    unsigned char c = s[0];
    int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (k == 0 || (size_t)k > n) {
        *len = 1;
        return 0xfffd;
    }
    uint32_t cp = k == 1 ? c : k == 2 ? (c & 0x1fu) : k == 3 ? (c & 0x0fu) : (c & 0x07u);
    for (int j = 1; j < k; j++) {
        if ((s[j] & 0xc0) != 0x80) {
            *len = 1;
            return 0xfffd;
        }
        cp = (cp << 6) | (s[j] & 0x3fu);
    }
    *len = (size_t)k;
    return cp;
}

/* Bounds of s[0..n) with Python whitespace stripped at both ends. */
static void py_strip(const char *str, size_t n, size_t *b, size_t *e) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        size_t l;
        uint32_t c = utf8_at(s + i, n - i, &l);
        if (!py_space(c)) break;
        i += l;
    }
    size_t j = n;
    while (j > i) {
        size_t k = j - 1; /* start of the last sequence */
        while (k > i && (s[k] & 0xc0) == 0x80 && j - k < 4) k--;
        size_t l;
        uint32_t c = utf8_at(s + k, j - k, &l);
        if (k + l != j) { /* not one whole sequence: a stray byte */
            break;
        }
        if (!py_space(c)) break;
        j = k;
    }
    *b = i;
    *e = j;
}

/* A message's text, strip()ped. */
static void sb_text_stripped(sbuf *b, const char *s, size_t n) {
    size_t i, j;
    py_strip(s, n, &i, &j);
    sb_text(b, s + i, j - i);
}

static int is_role(const chat_message *m, const char *role) { return strcmp(m->role, role) == 0; }

/* ---- families ---------------------------------------------------------------------- */

static void render_chatml(const chat_template *t, const chat_message *m, size_t n, int agp,
                          sbuf *b) {
    sb_str(b, t->bos_text);
    for (size_t i = 0; i < n; i++) {
        if (i == 0 && t->default_system[0] && !is_role(&m[0], "system")) {
            sb_str(b, "<|im_start|>system\n");
            sb_str(b, t->default_system);
            sb_str(b, "<|im_end|>\n");
        }
        sb_str(b, "<|im_start|>");
        sb_str(b, m[i].role);
        sb_str(b, "\n");
        sb_text_str(b, m[i].content);
        sb_str(b, "<|im_end|>\n");
    }
    if (agp) sb_str(b, "<|im_start|>assistant\n");
}

/* meta-llama/Llama-2-*-chat: the system text goes into the first turn inside
 * <<SYS>> and the whole turn is strip()ped; add_generation_prompt is ignored. */
static void render_llama2(const chat_template *t, const chat_message *m, size_t n, sbuf *b) {
    size_t first = 0;
    const char *sys = NULL;
    if (is_role(&m[0], "system")) sys = m[0].content, first = 1;
    sbuf tmp = {0};
    for (size_t i = first; i < n; i++) {
        const char *content = m[i].content;
        size_t clen = strlen(content);
        tmp.len = 0;
        if (i == first && sys) {
            sb_str(&tmp, "<<SYS>>\n");
            sb_str(&tmp, sys);
            sb_str(&tmp, "\n<</SYS>>\n\n");
            sb_add(&tmp, content, clen);
            if (tmp.oom) {
                b->oom = 1;
                break;
            }
            content = tmp.p, clen = tmp.len;
        }
        if (is_role(&m[i], "user")) {
            sb_str(b, t->bos_text);
            sb_str(b, "[INST] ");
            sb_text_stripped(b, content, clen);
            sb_str(b, " [/INST]");
        } else if (is_role(&m[i], "assistant")) {
            sb_str(b, " ");
            sb_text_stripped(b, content, clen);
            sb_str(b, " ");
            sb_str(b, t->eos_text);
        } /* a later system message renders nothing in this template */
    }
    free(tmp.p);
}

static void llama3_turn(sbuf *b, const char *role, const char *content) {
    sb_str(b, "<|start_header_id|>");
    sb_str(b, role);
    sb_str(b, "<|end_header_id|>\n\n");
    sb_text_stripped(b, content, strlen(content));
    sb_str(b, "<|eot_id|>");
}

static void render_llama3(const chat_template *t, const chat_message *m, size_t n, int agp,
                          sbuf *b) {
    if (t->variant == CHAT_LLAMA3_DATED) {
        /* Llama 3.1/3.2/3.3 without tools: a system header always comes first. */
        char today[32];
        const char *date = t->date;
        if (!date[0]) {
            time_t now = time(NULL);
            struct tm tmv;
            if (!localtime_r(&now, &tmv) || !strftime(today, sizeof today, "%d %b %Y", &tmv))
                snprintf(today, sizeof today, "26 Jul 2024");
            date = today;
        }
        size_t first = 0;
        const char *sys = "";
        if (is_role(&m[0], "system")) sys = m[0].content, first = 1;
        sb_str(b, t->bos_text);
        sb_str(b, "<|start_header_id|>system<|end_header_id|>\n\n");
        sb_str(b, "Cutting Knowledge Date: December 2023\n");
        sb_str(b, "Today Date: ");
        sb_str(b, date);
        sb_str(b, "\n\n");
        sb_text_stripped(b, sys, strlen(sys));
        sb_str(b, "<|eot_id|>");
        for (size_t i = first; i < n; i++) llama3_turn(b, m[i].role, m[i].content);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (i == 0) sb_str(b, t->bos_text);
            llama3_turn(b, m[i].role, m[i].content);
        }
    }
    if (agp) sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Mistral v1/v3/v3-tekken/legacy; add_generation_prompt is ignored by all of them. */
static int render_mistral(const chat_template *t, const chat_message *m, size_t n, sbuf *b,
                          char *err, size_t errlen) {
    size_t first = 0;
    const char *sys = NULL;
    if (is_role(&m[0], "system")) sys = m[0].content, first = 1;
    for (size_t i = first; i < n; i++)
        if (!is_role(&m[i], "user") && !is_role(&m[i], "assistant")) {
            set_err(err, errlen, "mistral chat template: only the first message may be a system message");
            return -1;
        }
    int v = t->variant;
    sb_str(b, t->bos_text);
    for (size_t i = first; i < n; i++) {
        if (is_role(&m[i], "user")) {
            /* v1 and legacy put the system text into the first turn, v3 into the last */
            int with_sys = sys && ((v == CHAT_MISTRAL_V1 || v == CHAT_MISTRAL_LEGACY)
                                       ? i == first
                                       : i == n - 1);
            sb_str(b, v == CHAT_MISTRAL_V1 ? " [INST] " : v == CHAT_MISTRAL_V3_TEKKEN ? "[INST]" : "[INST] ");
            if (with_sys) {
                sb_text_str(b, sys);
                sb_text_str(b, "\n\n");
            }
            sb_text_str(b, m[i].content);
            sb_str(b, (v == CHAT_MISTRAL_V1 || v == CHAT_MISTRAL_LEGACY) ? " [/INST]" : "[/INST]");
        } else {
            if (v == CHAT_MISTRAL_V1 || v == CHAT_MISTRAL_V3) sb_str(b, " ");
            if (v == CHAT_MISTRAL_V3) sb_text_stripped(b, m[i].content, strlen(m[i].content));
            else sb_text_str(b, m[i].content);
            sb_str(b, t->eos_text);
        }
    }
    return 0;
}

/* HuggingFaceH4/zephyr-7b-beta (rendered with trim_blocks: one "\n" per turn). */
static void render_zephyr(const chat_template *t, const chat_message *m, size_t n, int agp,
                          sbuf *b) {
    for (size_t i = 0; i < n; i++) {
        sb_str(b, "<|");
        sb_str(b, m[i].role);
        sb_str(b, "|>\n");
        sb_text_str(b, m[i].content);
        sb_str(b, t->eos_text);
        sb_str(b, "\n");
        if (i == n - 1 && agp) sb_str(b, "<|assistant|>\n");
    }
}

/* Gemma (gemma-7b-it, gemma-2, gemma-3): assistant is "model"; the system text
 * (as Gemma 3 does it) is put untrimmed, plus "\n\n", before the first turn. */
static int render_gemma(const chat_template *t, const chat_message *m, size_t n, int agp,
                        sbuf *b, char *err, size_t errlen) {
    size_t first = 0;
    const char *sys = NULL;
    if (is_role(&m[0], "system")) sys = m[0].content, first = 1;
    for (size_t i = first; i < n; i++)
        if (is_role(&m[i], "system")) {
            set_err(err, errlen, "gemma chat template: only the first message may be a system message");
            return -1;
        }
    sb_str(b, t->bos_text);
    for (size_t i = first; i < n; i++) {
        sb_str(b, "<start_of_turn>");
        sb_str(b, is_role(&m[i], "assistant") ? "model" : m[i].role);
        sb_str(b, "\n");
        if (i == first && sys) {
            sb_text_str(b, sys);
            sb_text_str(b, "\n\n");
        }
        sb_text_stripped(b, m[i].content, strlen(m[i].content));
        sb_str(b, "<end_of_turn>\n");
    }
    if (agp) sb_str(b, "<start_of_turn>model\n");
    return 0;
}

/* Python's str.split(sep)[0] / [-1] and strip(chars) on one set of characters, as Qwen3's
 * template uses them: bounds [*b, *e) inside s[0..n). */
static const char *find_last(const char *s, size_t n, const char *sep) {
    const char *last = NULL;
    size_t k = strlen(sep);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, sep, k)) last = s + i;
    return last;
}

static void strip_newlines(const char *s, size_t *b, size_t *e, int left, int right) {
    while (left && *b < *e && s[*b] == '\n') (*b)++;
    while (right && *e > *b && s[*e - 1] == '\n') (*e)--;
}

/* Qwen3 (Qwen/Qwen3-*: the hybrid-thinking template, without tools): ChatML
 * whose assistant turns after the last user query show their reasoning (the
 * text before </think>) in a <think> block; earlier turns drop it. */
static void render_qwen3(const chat_message *m, size_t n, int agp, const chat_options *opt, sbuf *b) {
    if (is_role(&m[0], "system")) {
        sb_str(b, "<|im_start|>system\n");
        sb_text_str(b, m[0].content);
        sb_str(b, "<|im_end|>\n");
    }
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) { /* the last user message that is not a tool response */
        const char *c = m[k].content;
        size_t len = strlen(c);
        int tool = len >= 15 && !strncmp(c, "<tool_response>", 15) && len >= 16 &&
                   !strcmp(c + len - 16, "</tool_response>");
        if (is_role(&m[k], "user") && !tool) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        size_t len = strlen(c);
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0)) {
            sb_str(b, "<|im_start|>");
            sb_str(b, m[i].role);
            sb_str(b, "\n");
            sb_text_str(b, c);
            sb_str(b, "<|im_end|>\n");
            continue;
        }
        if (!is_role(&m[i], "assistant")) continue;
        size_t cb = 0, ce = len, rb = 0, re = 0; /* content and reasoning bounds */
        const char *close = find_last(c, len, "</think>");
        if (close) {
            cb = (size_t)(close - c) + 8; /* split('</think>')[-1].lstrip('\n') */
            strip_newlines(c, &cb, &ce, 1, 0);
            const char *first_close = strstr(c, "</think>");
            re = (size_t)(first_close - c); /* split('</think>')[0].rstrip('\n') */
            strip_newlines(c, &rb, &re, 0, 1);
            const char *open = find_last(c, re, "<think>"); /* .split('<think>')[-1].lstrip('\n') */
            if (open) rb = (size_t)(open - c) + 7;
            strip_newlines(c, &rb, &re, 1, 0);
        }
        sb_str(b, "<|im_start|>assistant\n");
        if (i > last_query && (i == n - 1 || re > rb)) {
            size_t sb0 = rb, se = re;
            strip_newlines(c, &sb0, &se, 1, 1);
            sb_str(b, "<think>\n");
            sb_text(b, c + sb0, se - sb0);
            sb_str(b, "\n</think>\n\n");
            strip_newlines(c, &cb, &ce, 1, 0);
        }
        sb_text(b, c + cb, ce - cb);
        sb_str(b, "<|im_end|>\n");
    }
    if (agp) {
        sb_str(b, "<|im_start|>assistant\n");
        if (opt && opt->no_thinking) sb_str(b, "<think>\n\n</think>\n\n");
    }
}

/* microsoft/Phi-3.5-mini-instruct: an empty system message renders nothing;
 * without add_generation_prompt the text ends with EOS. */
static void render_phi3(const chat_template *t, const chat_message *m, size_t n, int agp, sbuf *b) {
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "system") && !m[i].content[0]) continue;
        sb_str(b, "<|");
        sb_str(b, m[i].role);
        sb_str(b, "|>\n");
        sb_text_str(b, m[i].content);
        sb_str(b, "<|end|>\n");
    }
    sb_str(b, agp ? "<|assistant|>\n" : t->eos_text);
}

char *chat_render(const chat_template *tpl, const chat_message *msgs, size_t n,
                  int add_generation_prompt, char *err, size_t errlen) {
    return chat_render_opts(tpl, msgs, n, add_generation_prompt, NULL, err, errlen);
}

char *chat_render_opts(const chat_template *tpl, const chat_message *msgs, size_t n, int add_generation_prompt,
                       const chat_options *opt, char *err, size_t errlen) {
    return chat_render_spans(tpl, msgs, n, add_generation_prompt, opt, NULL, err, errlen);
}

char *chat_render_spans(const chat_template *tpl, const chat_message *msgs, size_t n, int add_generation_prompt,
                        const chat_options *opt, chat_spans *spans, char *err, size_t errlen) {
    if (spans) spans->n = 0;
    if (!tpl || tpl->family == CHAT_UNKNOWN || (int)tpl->family > CHAT_FAMILY_LAST) {
        set_err(err, errlen, "unknown chat template (supported: %s)", chat_family_list());
        return NULL;
    }
    if (n == 0 || !msgs) {
        set_err(err, errlen, "no messages to render");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            set_err(err, errlen, "message %zu has no role or content", i);
            return NULL;
        }
        /* ipython: tool results in Llama 3.1's template (api/tools.c) */
        int tool_result = tpl->family == CHAT_LLAMA3 && is_role(&msgs[i], "ipython");
        if (!is_role(&msgs[i], "system") && !is_role(&msgs[i], "user") &&
            !is_role(&msgs[i], "assistant") && !tool_result) {
            set_err(err, errlen, "message %zu: unsupported role \"%.32s\" (system, user, assistant)",
                    i, msgs[i].role);
            return NULL;
        }
    }
    sbuf b = {.spans = spans};
    sb_add(&b, "", 0); /* "" even when the template renders nothing */
    int rc = 0;
    switch (tpl->family) {
    case CHAT_CHATML: render_chatml(tpl, msgs, n, add_generation_prompt, &b); break;
    case CHAT_LLAMA2: render_llama2(tpl, msgs, n, &b); break;
    case CHAT_LLAMA3: render_llama3(tpl, msgs, n, add_generation_prompt, &b); break;
    case CHAT_MISTRAL: rc = render_mistral(tpl, msgs, n, &b, err, errlen); break;
    case CHAT_ZEPHYR: render_zephyr(tpl, msgs, n, add_generation_prompt, &b); break;
    case CHAT_GEMMA: rc = render_gemma(tpl, msgs, n, add_generation_prompt, &b, err, errlen); break;
    case CHAT_QWEN3: render_qwen3(msgs, n, add_generation_prompt, opt, &b); break;
    case CHAT_PHI3: render_phi3(tpl, msgs, n, add_generation_prompt, &b); break;
    default: rc = -1; break;
    }
    if (rc == 0 && b.oom) {
        set_err(err, errlen, "out of memory rendering the chat");
        rc = -1;
    }
    if (rc != 0) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
