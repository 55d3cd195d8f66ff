/* Chat templates (private to engine/): recognise the family of a GGUF's
 * tokenizer.chat_template and render messages the way that template does.
 * We do not run Jinja; each family is rendered by code that mirrors the
 * template text of the models that ship it. */
#ifndef POTSERVE_CHAT_H
#define POTSERVE_CHAT_H

#include <stddef.h>

#include "engine/engine.h" /* ENGINE_CHAT_FAMILIES */

#define CHAT_FAMILY_ENUM_(id, name) CHAT_##id,
enum chat_family { CHAT_UNKNOWN = 0, ENGINE_CHAT_FAMILIES(CHAT_FAMILY_ENUM_, ) CHAT_FAMILY_END_ };
enum { CHAT_FAMILY_LAST = CHAT_FAMILY_END_ - 1 };

typedef struct chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} chat_message;

typedef struct chat_template {
    enum chat_family family;
    char default_system[512]; /* system prompt the template inserts when none is given ("" if none) */
    char bos_text[32];        /* BOS token text the template writes itself (llama2/llama3/gemma), or "" */
    char eos_text[32];        /* EOS token text written after assistant turns, or "" */
    /* Addition: layout details that differ between real templates of one family
     * and are read from the template text. 0 is the default layout of each family
     * (what chat_family_from_name users get):
     *   CHAT_MISTRAL: one of enum chat_mistral_variant;
     *   CHAT_LLAMA3:  CHAT_LLAMA3_DATED for the Llama 3.1+ templates, which always
     *                 open with a system header holding "Cutting Knowledge Date:
     *                 December 2023\nToday Date: <date>\n\n" before the system text.
     * date: for CHAT_LLAMA3_DATED, the template's fixed date ("26 Jul 2024"), or ""
     * when the template asks for today's date (strftime_now: "%d %b %Y", local time). */
    int variant;
    char date[16];
} chat_template;

enum chat_mistral_variant {
    CHAT_MISTRAL_V1 = 0,     /* " [INST] sys\n\nuser [/INST]" + " reply</s>" (v0.1/v0.2 current) */
    CHAT_MISTRAL_V3,         /* "[INST] user[/INST]" + " reply</s>", system on the last user turn */
    CHAT_MISTRAL_V3_TEKKEN,  /* "[INST]user[/INST]" + "reply</s>", system on the last user turn */
    CHAT_MISTRAL_LEGACY,     /* "[INST] user [/INST]" + "reply</s>" (original v0.1/v0.2: no system
                              * role; we merge it into the first user turn as v1 does) */
};
enum { CHAT_LLAMA3_PLAIN = 0, CHAT_LLAMA3_DATED = 1 };

/* Fills tpl from the template text (NULL/"" gives CHAT_UNKNOWN). bos/eos are
 * the model's BOS/EOS token texts (may be NULL). Returns 0, or -1 when the
 * family is not recognised (tpl->family = CHAT_UNKNOWN).
 * (Added detail: bos_text/eos_text are filled only when the template uses
 * bos_token/eos_token; a BOS/EOS text longer than 31 bytes also gives -1.) */
int chat_template_detect(const char *template_text, const char *bos, const char *eos,
                         chat_template *tpl);
/* Family from its name ("chatml", "llama2", "llama3", "mistral", "zephyr",
 * "gemma", "qwen3", "phi3"); CHAT_UNKNOWN if no such name. */
enum chat_family chat_family_from_name(const char *name);
const char *chat_family_name(enum chat_family f);
/* ENGINE_CHAT_TEMPLATE_LIST, for error messages. */
const char *chat_family_list(void);

/* (Added detail: n == 0 is an error; user/assistant alternation is not
 * enforced; families without a system role take it into the first user turn;
 * a system message after the first is an error for mistral and gemma.)
 * Renders messages (roles system/user/assistant; others -> -1 with err) into
 * a malloc'd NUL-terminated string the caller frees. add_generation_prompt
 * appends the assistant header. The text contains special-token text and is
 * tokenized with add_special=0, its control tokens read outside the messages'
 * text only (chat_render_spans). NULL + err on failure. */
char *chat_render(const chat_template *tpl, const chat_message *msgs, size_t n,
                  int add_generation_prompt, char *err, size_t errlen);

/* Per-request switches of the templates that have them (zero: the template's defaults). */
typedef struct chat_options {
    int no_thinking; /* Qwen3's enable_thinking=false: an empty think block after the assistant header */
} chat_options;
/* chat_render with options (NULL: none); the same ownership. */
char *chat_render_opts(const chat_template *tpl, const chat_message *msgs, size_t n, int add_generation_prompt,
                       const chat_options *opt, char *err, size_t errlen);
/* Which bytes of a rendering are the messages' own text: [v[2k], v[2k+1]) for
 * k < n / 2, in order. Control tokens are read only outside them
 * (tokenizer_encode_chat): a message cannot write the template's markers. */
typedef struct chat_spans {
    size_t *v;
    size_t n, cap;
} chat_spans;
/* chat_render_opts that also fills *spans (its v freed by the caller; NULL:
 * not wanted). */
char *chat_render_spans(const chat_template *tpl, const chat_message *msgs, size_t n, int add_generation_prompt,
                        const chat_options *opt, chat_spans *spans, char *err, size_t errlen);

#endif
