/* Tokenizer from GGUF tokenizer.ggml.* metadata, matching llama.cpp's
 * llama_tokenize / llama_token_to_piece (the reference; see tests/reference/).
 *
 *   text --special-token partition--> raw fragments and special tokens
 *   raw (gpt2) --pre-tokenizer stages--> words --byte map + ranked merges--> ids
 *   raw (llama/SPM) --' '->U+2581, prefix space--> score-driven bigram merges --> ids
 *
 * Pre-tokenizer stages follow llama.cpp's regex lists per tokenizer.ggml.pre.
 * The four regexes llama.cpp runs through hand-written scanners (gpt2, llama3,
 * qwen2, qwen35) are scanners here too; every other regex runs through PCRE2 on
 * the same "collapsed" text llama.cpp feeds std::regex (one byte per codepoint,
 * \p{..} classes mapped to marker bytes), so the results agree codepoint for
 * codepoint. Unicode classes come from tokenizer_unicode.c (Unicode 15.1, as
 * llama.cpp's tables).
 *
 * Streaming: every stage can run "open" (more text may follow). Then it reports
 * which of its boundaries can no longer move: scanners track the furthest
 * codepoint they looked at, PCRE2 runs with PCRE2_PARTIAL_HARD. tok_stream
 * emits the words before the first boundary that could still move. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <ctype.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* ------------------------------------------------------------------------- */
/* small helpers                                                             */

#define TOK_NULL (-1)

enum { // llama.cpp's llama_token_attr bits
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
    ATTR_LSTRIP = 1 << 7,
    ATTR_RSTRIP = 1 << 8,
};

enum { MODEL_BPE = 1, MODEL_SPM = 2 };

static void *xrealloc(void *p, size_t n) { return realloc(p, n ? n : 1); }

/* growable vectors (common/common.h): int32 and size_t */
typedef VEC(int32_t) ivec;
typedef VEC(size_t) zvec;

/* growable byte buffer */
typedef struct {
    char *p;
    size_t n, cap;
} bbuf;

static int bbuf_reserve(bbuf *b, size_t extra) { return vec_reserve_((void **)&b->p, &b->cap, b->n + extra, 1); }

static int bbuf_add(bbuf *b, const void *s, size_t n) { return vec_append_((void **)&b->p, &b->n, &b->cap, s, n, 1); }

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define HASH_INIT 0xcbf29ce484222325ULL

/* ------------------------------------------------------------------------- */
/* Unicode                                                                   */

extern const uint32_t tok_uc_n_ranges;
extern const uint32_t tok_uc_ranges[];

enum { // per-codepoint flag bits (0 means "outside the fragment")
    UF_NUMBER = 0x01,
    UF_LETTER = 0x02,
    UF_MARK = 0x04,
    UF_PUNCT = 0x08,
    UF_SYMBOL = 0x10,
    UF_SPACE = 0x20, // llama.cpp's whitespace set (Unicode White_Space)
    UF_VALID = 0x80, // every codepoint inside the fragment has it
};
#define MAX_CPT 0x110000u
#define OOR 0xFFFFFFFFu /* codepoint "outside the fragment" */

static uint8_t g_uflags[MAX_CPT];
static pthread_once_t g_uflags_once = PTHREAD_ONCE_INIT;

static void uflags_init(void) {
    /* class codes of gen_unicode_flags.py: 0 unassigned, 1 number, 2 letter,
     * 3 separator, 4 mark, 5 punctuation, 6 symbol, 7 other */
    static const uint8_t cls_bits[8] = {0, UF_NUMBER, UF_LETTER, 0, UF_MARK, UF_PUNCT, UF_SYMBOL, 0};
    for (uint32_t i = 0; i < tok_uc_n_ranges; i++) {
        uint32_t start = tok_uc_ranges[i] >> 4;
        uint32_t end = i + 1 < tok_uc_n_ranges ? tok_uc_ranges[i + 1] >> 4 : MAX_CPT;
        uint8_t f = (uint8_t)(cls_bits[tok_uc_ranges[i] & 15] | UF_VALID);
        memset(g_uflags + start, f, end - start);
    }
    static const uint32_t ws[] = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680,
                                  0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006,
                                  0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F,
                                  0x205F, 0x3000};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) g_uflags[ws[i]] |= UF_SPACE;
}

static inline uint8_t uflags(uint32_t c) { return c < MAX_CPT ? g_uflags[c] : 0; }

/* Length of the longest prefix of s made of complete valid sequences; *bad is
 * set when an invalid sequence (not merely a cut-short one) follows it. */
static size_t utf8_valid_prefix(const char *s, size_t n, int *bad) {
    size_t i = 0;
    *bad = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)s + i, n - i, &cp);
        if (l < 0) {
            *bad = 1;
            return i;
        }
        if (l == 0) return i;
        i += (size_t)l;
    }
    return i;
}

static int utf8_put(uint32_t c, char *o) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* llama.cpp's lenient decoder (unicode_cpt_from_utf8 + the U+FFFD fallback of
 * unicode_cpts_from_utf8), used only on token texts, which may be any bytes. */
static uint32_t lenient_cpt(const unsigned char *s, size_t n, size_t *off) {
    size_t o = *off;
    unsigned char c = s[o];
    if (!(c & 0x80)) {
        *off = o + 1;
        return c;
    }
    if ((c & 0x40) && !(c & 0x20)) {
        if (o + 1 < n && (s[o + 1] & 0xC0) == 0x80) {
            *off = o + 2;
            return ((uint32_t)(c & 0x1F) << 6) | (s[o + 1] & 0x3F);
        }
    } else if ((c & 0x40) && !(c & 0x10)) {
        if (o + 2 < n && (s[o + 1] & 0xC0) == 0x80 && (s[o + 2] & 0xC0) == 0x80) {
            *off = o + 3;
            return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[o + 1] & 0x3F) << 6) |
                   (s[o + 2] & 0x3F);
        }
    } else if ((c & 0x40) && !(c & 0x08)) {
        if (o + 3 < n && (s[o + 1] & 0xC0) == 0x80 && (s[o + 2] & 0xC0) == 0x80 &&
            (s[o + 3] & 0xC0) == 0x80) {
            *off = o + 4;
            return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[o + 1] & 0x3F) << 12) |
                   ((uint32_t)(s[o + 2] & 0x3F) << 6) | (s[o + 3] & 0x3F);
        }
    }
    *off = o + 1;
    return 0xFFFD;
}

/* GPT-2 byte <-> codepoint map: printable Latin-1 bytes map to themselves, the
 * rest to 256, 257, ... in byte order. */
typedef struct {
    char enc[256][2];
    uint8_t enc_len[256];
    int16_t dec[512]; /* codepoint -> byte, -1 if none */
} byte_map;

static void byte_map_init(byte_map *m) {
    int n = 0;
    for (int i = 0; i < 512; i++) m->dec[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        char tmp[4];
        int l = utf8_put(cp, tmp);
        memcpy(m->enc[b], tmp, (size_t)l);
        m->enc_len[b] = (uint8_t)l;
        m->dec[cp] = (int16_t)b;
    }
}

/* ------------------------------------------------------------------------- */
/* pre-tokenizer descriptions                                                */

enum {
    PRE_RE = 0,     /* generic regex through PCRE2 */
    PRE_GPT2,       /* llama.cpp's custom scanners */
    PRE_LLAMA3,
    PRE_QWEN2,
    PRE_QWEN35,
    PRE_DIGITS,     /* "\p{N}": every number codepoint on its own */
};

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                          \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                           \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                          \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?"         \
    "[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|" \
    "'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])" \
    "([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| "          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    int ignore_merges;
    int add_bos;       /* 1: llama.cpp turns add_bos on for these (before the GGUF key) */
    int no_bos;        /* 1: default BOS id is none */
    const char *re[8]; /* regex list, NULL-terminated */
} pre_desc;

static const pre_desc PRE_TABLE[] = {
    {"default", 0, 0, 0,
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", 1, 1, 0,
     {RE_LLAMA3, NULL}},
    {"dbrx|smaug-bpe", 0, 0, 0, {RE_LLAMA3, NULL}},
    {"chatglm-bpe", 0, 0, 1, {RE_LLAMA3, NULL}},
    {"glm4|glm5", 1, 0, 1, {RE_LLAMA3, NULL}},
    {"deepseek-llm", 0, 0, 0,
     {
      "[\r\n]",
      "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba\xc6\xbc-\xc6"
      "\xbf\xc7\x84-\xca\x93\xca\x95-\xca\xaf\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7\xcd\xbb-\xcd"
      "\xbd\xcd\xbf\xce\x86\xce\x88-\xce\x8a\xce\x8c\xce\x8e-\xce\xa1\xce\xa3-\xcf\xb5\xcf"
      "\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96\xe1\x82\xa0-\xe1\x83\x85\xe1\x8e\xa0"
      "-\xe1\x8f\xb5\xe1\x8f\xb8-\xe1\x8f\xbd\xe1\xb2\x90-\xe1\xb2\xba\xe1\xb2\xbd-\xe1\xb2"
      "\xbf\xe1\xb4\x80-\xe1\xb4\xab\xe1\xb5\xab-\xe1\xb5\xb7\xe1\xb5\xb9-\xe1\xb6\x9a\xe1"
      "\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d\xe1\xbc\xa0-\xe1\xbd\x85\xe1\xbd\x88"
      "-\xe1\xbd\x8d\xe1\xbd\x90-\xe1\xbd\x97\xe1\xbd\x99\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd"
      "\x9f-\xe1\xbd\xbd\xe1\xbe\x80-\xe1\xbe\xb4\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe\xe1"
      "\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-\xe1\xbf\x8c\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96"
      "-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac\xe1\xbf\xb2-\xe1\xbf\xb4\xe1\xbf\xb6-\xe1\xbf"
      "\xbc\xe2\x84\x82\xe2\x84\x87\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95\xe2\x84\x99-\xe2"
      "\x84\x9d\xe2\x84\xa4\xe2\x84\xa6\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf"
      "-\xe2\x84\xb4\xe2\x84\xb9\xe2\x84\xbc-\xe2\x84\xbf\xe2\x85\x85-\xe2\x85\x89\xe2\x85"
      "\x8e\xe2\x86\x83\xe2\x86\x84\xe2\xb0\x80-\xe2\xb1\xbb\xe2\xb1\xbe-\xe2\xb3\xa4\xe2"
      "\xb3\xab-\xe2\xb3\xae\xe2\xb3\xb2\xe2\xb3\xb3\xea\x99\x80-\xea\x99\xad\xea\x9a\x80"
      "-\xea\x9a\x9b\xea\x9c\xa2-\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87\xea\x9e\x8b-\xea\x9e"
      "\x8e\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-\xef\xac\x86\xef\xac\x93-\xef\xac\x97\xef"
      "\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90\x91\x8f\xf0"
      "\x90\x92\xb0-\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb\xf0\x90\xb2\x80-\xf0"
      "\x90\xb2\xb2\xf0\x90\xb3\x80-\xf0\x90\xb3\xb2\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0"
      "\x9e\xa4\x80-\xf0\x9e\xa5\x83]+",
      "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80"
      "\x9f\xe3\x80\x80-\xe3\x80\x82]+",
      "\\s+$",
      "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
      "\\p{N}+",
      NULL}},
    {"deepseek-coder", 0, 0, 0,
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}", NULL}},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", 0, 0, 0,
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"falcon", 0, 0, 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", 0, 0, 0,
     {"\\p{N}", RE_GPT2, NULL}},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|"
     "jina-v1-en|jina-v2-code|roberta-bpe|mpt|olmo|jais|trillion|granite-docling|exaone4",
     0, 0, 0, {RE_GPT2, NULL}},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|stablelm2|hunyuan|megrez|solar-open|grok-2", 0, 0, 0,
     {RE_QWEN2, NULL}},
    {"qwen35", 0, 0, 0, {RE_QWEN35, NULL}},
    {"poro-chat|bloom|gpt3-finnish", 0, 0, 0, {" ?[^(\\s|.,!?…。，、।۔،)]+", NULL}},
    {"viking", 0, 0, 0, {" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}", NULL}},
    {"tekken", 1, 1, 0,
     {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?"
      "((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*["
      "\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", 0, 0, 0, {RE_GPT4O, NULL}},
    {"seed-coder", 0, 0, 0,
     {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
      "\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"bailingmoe|bailingmoe2|llada-moe", 0, 0, 0,
     {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
      NULL}},
    {"ufakzeka", 0, 0, 0,
     {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
      "\\s+",
      NULL}},
};

static int name_in_list(const char *list, const char *name, size_t nlen) {
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == nlen && memcmp(p, name, nlen) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* One compiled stage. */
typedef struct {
    int kind;
    int collapsed; /* PRE_RE: runs on the collapsed text (the regex uses \p{..}) */
    pcre2_code *re;
} pre_stage;

/* llama.cpp's unicode_regex_split: regexes naming \p{N}/\p{L}/\p{P}/\p{M}/\p{S}
 * (or \p{Lu} ...) run on a one-byte-per-codepoint text where non-ASCII
 * codepoints become marker bytes, and each \p{X} in the regex becomes a class of
 * its marker plus the ASCII members. */
static const struct {
    const char *pat;
    char code;
    const char *ascii;
} UCAT[] = {
    {"\\p{N}", (char)0xD1, "0-9"},
    {"\\p{L}", (char)0xD2, "A-Za-z"},
    {"\\p{P}", (char)0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", (char)0xD4, ""},
    {"\\p{S}", (char)0xD5, "\\$\\+<->^`\\|\\~"},
    {"\\p{Lu}", (char)0xD2, "A-Za-z"},
    {"\\p{Ll}", (char)0xD2, "A-Za-z"},
    {"\\p{Lt}", (char)0xD2, "A-Za-z"},
    {"\\p{Lm}", (char)0xD2, "A-Za-z"},
    {"\\p{Lo}", (char)0xD2, "A-Za-z"},
};
#define N_UCAT (sizeof UCAT / sizeof UCAT[0])

static int regex_uses_ucat(const char *re) {
    for (size_t i = 0; i < N_UCAT; i++)
        if (strstr(re, UCAT[i].pat)) return 1;
    return 0;
}

/* Rewrites re into its collapsed form (as llama.cpp does before std::regex). */
static int collapse_regex(const char *re, bbuf *out) {
    size_t n = strlen(re);
    int inside = 0;
    out->n = 0;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
            if (bbuf_add(out, "[", 1)) return -1;
            inside = 1;
            continue;
        }
        if (inside && re[i] == ']' && re[i - 1] != '\\') {
            if (bbuf_add(out, "]", 1)) return -1;
            inside = 0;
            continue;
        }
        if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const char *close = strchr(re + i + 3, '}');
            if (close && (size_t)(close - re) <= i + 10) {
                size_t plen = (size_t)(close - re) - i + 1;
                size_t k;
                for (k = 0; k < N_UCAT; k++)
                    if (strlen(UCAT[k].pat) == plen && memcmp(UCAT[k].pat, re + i, plen) == 0) break;
                if (k < N_UCAT) {
                    if (!inside && bbuf_add(out, "[", 1)) return -1;
                    if (bbuf_add(out, &UCAT[k].code, 1)) return -1;
                    if (bbuf_add(out, UCAT[k].ascii, strlen(UCAT[k].ascii))) return -1;
                    if (!inside && bbuf_add(out, "]", 1)) return -1;
                    i += plen - 1;
                    continue;
                }
            }
        }
        if (bbuf_add(out, re + i, 1)) return -1;
    }
    return bbuf_add(out, "", 1); /* NUL */
}

static int compile_stage(const char *re, pre_stage *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (strcmp(re, RE_GPT2) == 0) st->kind = PRE_GPT2;
    else if (strcmp(re, RE_LLAMA3) == 0) st->kind = PRE_LLAMA3;
    else if (strcmp(re, RE_QWEN2) == 0) st->kind = PRE_QWEN2;
    else if (strcmp(re, RE_QWEN35) == 0) st->kind = PRE_QWEN35;
    else if (strcmp(re, "\\p{N}") == 0) st->kind = PRE_DIGITS;
    else st->kind = PRE_RE;
    if (st->kind != PRE_RE) return 0;
    int ec;
    PCRE2_SIZE eo;
    if (regex_uses_ucat(re)) {
        bbuf b = {0};
        if (collapse_regex(re, &b)) {
            free(b.p);
            set_err(err, errlen, "tokenizer: out of memory");
            return -1;
        }
        st->collapsed = 1;
        st->re = pcre2_compile((PCRE2_SPTR)b.p, b.n - 1, PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        free(b.p);
    } else {
        st->re = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
    }
    if (!st->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        set_err(err, errlen, "tokenizer: cannot compile pre-tokenizer regex: %s", (char *)msg);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* the tokenizer                                                             */

typedef struct {
    uint32_t key_off;  /* "left" then "right" in merge_blob */
    uint32_t left_len;
    uint32_t right_len;
    int32_t rank;
} merge_ent;

struct tokenizer {
    int model; /* MODEL_BPE / MODEL_SPM */
    int32_t n_vocab;
    char *blob; /* token texts */
    uint64_t *tok_off;
    uint32_t *tok_len;
    float *score;
    uint32_t *attr;
    size_t max_token_len;

    int32_t *vhash; /* open addressing: id + 1, 0 empty */
    size_t vmask;

    char *merge_blob;
    merge_ent *merges;
    size_t n_merges;
    int32_t *mhash; /* index + 1 */
    size_t mmask;
    /* the same merges keyed by (left id, right id) when both halves are
     * tokens, with the id of the merged text (-1 if it is none) */
    struct pair_ent {
        uint64_t key; /* left << 32 | right; PAIR_EMPTY when unused */
        int32_t rank, result;
    } *pairs;
    size_t pmask;
    int32_t byte_tok[256]; /* id of each byte's gpt2-encoded character, or -1 */

    int32_t *special; /* control / user-defined / unknown ids, longest text first */
    int32_t n_special;

    uint8_t *eog;
    int32_t bos, eos, eot, eom, unk;
    int32_t fim_pre, fim_suf, fim_mid; /* fill-in-the-middle's markers (TOK_NULL: none) */
    int add_bos, add_eos, add_space_prefix, ignore_merges;

    pre_stage stages[8];
    int n_stages;
    byte_map bmap;

    char *piece_blob; /* piece of every token (render_special on) */
    uint64_t *piece_off;
    uint32_t *piece_len;
    size_t max_token_bytes; /* the most text bytes one token stands for */
};

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static inline const char *tok_text(const tokenizer *t, int32_t id) { return t->blob + t->tok_off[id]; }

static int32_t vocab_find(const tokenizer *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(HASH_INIT, s, n);
    for (size_t i = (size_t)h & t->vmask;; i = (i + 1) & t->vmask) {
        int32_t e = t->vhash[i];
        if (!e) return TOK_NULL;
        int32_t id = e - 1;
        if (t->tok_len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return id;
    }
}

/* token_to_id[text] = id: a later duplicate text wins, as in llama.cpp */
static void vocab_insert(tokenizer *t, int32_t id) {
    const char *s = tok_text(t, id);
    size_t n = t->tok_len[id];
    uint64_t h = hash_bytes(HASH_INIT, s, n);
    for (size_t i = (size_t)h & t->vmask;; i = (i + 1) & t->vmask) {
        int32_t e = t->vhash[i];
        if (!e) {
            t->vhash[i] = id + 1;
            return;
        }
        int32_t o = e - 1;
        if (t->tok_len[o] == n && memcmp(tok_text(t, o), s, n) == 0) {
            t->vhash[i] = id + 1;
            return;
        }
    }
}

static uint64_t merge_hash(const char *l, size_t ln, const char *r, size_t rn) {
    uint64_t h = hash_bytes(HASH_INIT, l, ln);
    h = hash_bytes(h, "\xff", 1);
    return hash_bytes(h, r, rn);
}

#define PAIR_EMPTY UINT64_MAX

static inline size_t pair_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
}

static const struct pair_ent *pair_find(const tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    for (size_t i = pair_slot(key, t->pmask);; i = (i + 1) & t->pmask) {
        const struct pair_ent *e = &t->pairs[i];
        if (e->key == key) return e;
        if (e->key == PAIR_EMPTY) return NULL;
    }
}

static int merge_rank(const tokenizer *t, const char *l, size_t ln, const char *r, size_t rn) {
    if (!t->mhash) return -1;
    uint64_t h = merge_hash(l, ln, r, rn);
    for (size_t i = (size_t)h & t->mmask;; i = (i + 1) & t->mmask) {
        int32_t e = t->mhash[i];
        if (!e) return -1;
        const merge_ent *m = &t->merges[e - 1];
        if (m->left_len == ln && m->right_len == rn) {
            const char *k = t->merge_blob + m->key_off;
            if (memcmp(k, l, ln) == 0 && memcmp(k + ln, r, rn) == 0) return m->rank;
        }
    }
}

size_t tokenizer_min_tokens(const tokenizer *t, size_t bytes) {
    size_t most = t->max_token_bytes ? t->max_token_bytes : 1;
    return bytes > 1 ? (bytes - 1) / most : 0; /* (an SPM prefix space is one byte no text had) */
}

int32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int tokenizer_adds_bos(const tokenizer *t) { return t->add_bos && t->bos != TOK_NULL; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
const char *tokenizer_model_name(const tokenizer *t) { return t->model == MODEL_BPE ? "gpt2" : "llama"; }

int tokenizer_is_eog(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

int tokenizer_fim(const tokenizer *t, int32_t *pre, int32_t *suf, int32_t *mid) {
    *pre = t->fim_pre;
    *suf = t->fim_suf;
    *mid = t->fim_mid;
    return t->fim_pre != TOK_NULL && t->fim_suf != TOK_NULL && t->fim_mid != TOK_NULL;
}

int32_t tokenizer_find(const tokenizer *t, const char *text, size_t len) {
    return vocab_find(t, text, len);
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->blob);
    free(t->tok_off);
    free(t->tok_len);
    free(t->score);
    free(t->attr);
    free(t->vhash);
    free(t->merge_blob);
    free(t->merges);
    free(t->mhash);
    free(t->pairs);
    free(t->special);
    free(t->eog);
    for (int i = 0; i < t->n_stages; i++) pcre2_code_free(t->stages[i].re);
    free(t->piece_blob);
    free(t->piece_off);
    free(t->piece_len);
    free(t);
}

/* ---- loading ---- */

static int get_opt_bool(const gguf_file *f, const char *key, int *val, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return 0;
    if (kv->type != GGUF_BOOL) {
        set_err(err, errlen, "tokenizer: %s is not a bool", key);
        return -1;
    }
    *val = (int)kv->u;
    return 0;
}

/* Special-token id keys: absent keeps the default; present must be an integer
 * naming a token (!strict: a bad value is ignored, as llama.cpp does, for ids
 * this tokenizer does not otherwise use). */
static int get_opt_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *val,
                      int strict, char *err, size_t errlen) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return 0;
    uint64_t u;
    if (gguf_get_u64(f, key, &u)) {
        if (!strict) return 0;
        set_err(err, errlen, "tokenizer: %s is not a non-negative integer", key);
        return -1;
    }
    if (u >= (uint64_t)n_vocab) {
        if (!strict) return 0;
        set_err(err, errlen, "tokenizer: %s = %llu is out of range (vocabulary has %d tokens)", key,
                (unsigned long long)u, (int)n_vocab);
        return -1;
    }
    *val = (int32_t)u;
    return 0;
}

static int text_is(const tokenizer *t, int32_t id, const char *s) {
    size_t n = strlen(s);
    return t->tok_len[id] == n && memcmp(tok_text(t, id), s, n) == 0;
}

static int text_in(const tokenizer *t, int32_t id, const char *const *list) {
    for (; *list; list++)
        if (text_is(t, id, *list)) return 1;
    return 0;
}

/* llama.cpp's token_to_byte: strtol of text[3..5) in base 16 */
static uint8_t token_byte_value(const tokenizer *t, int32_t id) {
    const char *s = tok_text(t, id);
    size_t n = t->tok_len[id];
    unsigned v = 0;
    for (size_t i = 3; i < 5 && i < n; i++) {
        int c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else break;
        v = v * 16 + (unsigned)d;
    }
    return (uint8_t)v;
}

/* Piece with render_special on, as llama.cpp's token_to_piece cache. */
static int build_piece(const tokenizer *t, int32_t id, bbuf *out) {
    uint32_t a = t->attr[id];
    const char *s = tok_text(t, id);
    size_t n = t->tok_len[id];
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) return bbuf_add(out, s, n);
    if (a & ATTR_NORMAL) {
        if (t->model == MODEL_SPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    if (bbuf_add(out, " ", 1)) return -1;
                    i += 3;
                } else {
                    if (bbuf_add(out, s + i, 1)) return -1;
                    i++;
                }
            }
            return 0;
        }
        for (size_t i = 0; i < n;) {
            uint32_t c = lenient_cpt((const unsigned char *)s, n, &i);
            if (c < 512 && t->bmap.dec[c] >= 0) {
                char b = (char)t->bmap.dec[c];
                if (bbuf_add(out, &b, 1)) return -1;
            } else {
                char u[4], hx[3];
                int l = utf8_put(c, u);
                if (bbuf_add(out, "[UNK_BYTE_0x", 12)) return -1;
                for (int k = 0; k < l; k++) {
                    snprintf(hx, sizeof hx, "%02x", (unsigned char)u[k]);
                    if (bbuf_add(out, hx, 2)) return -1;
                }
                if (bbuf_add(out, s, n) || bbuf_add(out, "]", 1)) return -1;
            }
        }
        return 0;
    }
    if (a & ATTR_BYTE) {
        char b = (char)token_byte_value(t, id);
        return bbuf_add(out, &b, 1);
    }
    return 0;
}

typedef struct {
    uint32_t len;
    int32_t id;
} len_id;

static int cmp_len_id(const void *pa, const void *pb) {
    const len_id *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t errlen) {
    pthread_once(&g_uflags_once, uflags_init);
    if (err && errlen) err[0] = 0;
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, errlen, "tokenizer: out of memory");
        return NULL;
    }
    byte_map_init(&t->bmap);
    t->bos = t->eos = t->eot = t->eom = t->unk = TOK_NULL;
    t->fim_pre = t->fim_suf = t->fim_mid = TOK_NULL;

    /* model */
    gguf_str model;
    if (!gguf_find(f, "tokenizer.ggml.model")) {
        set_err(err, errlen, "tokenizer: missing tokenizer.ggml.model");
        goto fail;
    }
    if (gguf_get_str(f, "tokenizer.ggml.model", &model)) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.model is not a string");
        goto fail;
    }
    if (gguf_str_eq(model, "gpt2")) t->model = MODEL_BPE;
    else if (gguf_str_eq(model, "llama")) t->model = MODEL_SPM;
    else {
        set_err(err, errlen, "tokenizer: unsupported tokenizer.ggml.model '%.*s'",
                (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto fail;
    }

    /* pre-tokenizer (BPE) and per-model defaults */
    const pre_desc *pre = NULL;
    int pre_no_bos = 0;
    if (t->model == MODEL_BPE) {
        gguf_str ps = {"default", 7};
        const gguf_kv *pkv = gguf_find(f, "tokenizer.ggml.pre");
        if (pkv) {
            if (pkv->type != GGUF_STRING) {
                set_err(err, errlen, "tokenizer: tokenizer.ggml.pre is not a string");
                goto fail;
            }
            ps = pkv->s;
            if (ps.len == 0) ps = (gguf_str){"default", 7};
        }
        for (size_t i = 0; i < sizeof PRE_TABLE / sizeof PRE_TABLE[0]; i++)
            if (name_in_list(PRE_TABLE[i].names, ps.ptr, (size_t)ps.len)) pre = &PRE_TABLE[i];
        if (!pre) {
            set_err(err, errlen, "tokenizer: unsupported pre-tokenizer tokenizer.ggml.pre = '%.*s'",
                    (int)(ps.len > 64 ? 64 : ps.len), ps.ptr);
            goto fail;
        }
        t->ignore_merges = pre->ignore_merges;
        pre_no_bos = pre->no_bos;
        t->add_space_prefix = 0;
        t->add_bos = pre->add_bos;
        t->add_eos = 0;
        for (int i = 0; pre->re[i]; i++) {
            if (compile_stage(pre->re[i], &t->stages[i], err, errlen)) goto fail;
            t->n_stages = i + 1;
        }
    } else {
        t->add_space_prefix = 1;
        t->add_bos = 1;
        t->add_eos = 0;
    }
    if (get_opt_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, errlen))
        goto fail;

    /* tokens */
    const gguf_kv *tk = gguf_find(f, "tokenizer.ggml.tokens");
    if (!tk) {
        set_err(err, errlen, "tokenizer: missing tokenizer.ggml.tokens");
        goto fail;
    }
    if (tk->type != GGUF_ARRAY || tk->arr_type != GGUF_STRING) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.tokens is not an array of strings");
        goto fail;
    }
    if (tk->arr_n == 0 || tk->arr_n > 0x7FFFFFFF) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                (unsigned long long)tk->arr_n);
        goto fail;
    }
    int32_t nv = (int32_t)tk->arr_n;
    t->n_vocab = nv;

    const gguf_kv *sc = gguf_find(f, "tokenizer.ggml.scores");
    if (sc && (sc->type != GGUF_ARRAY ||
               (sc->arr_type != GGUF_FLOAT32 && sc->arr_type != GGUF_INT32))) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.scores is not an array of float32/int32");
        goto fail;
    }
    if (sc && sc->arr_n != tk->arr_n) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.scores has %llu entries, tokens %llu",
                (unsigned long long)sc->arr_n, (unsigned long long)tk->arr_n);
        goto fail;
    }
    const gguf_kv *tt = gguf_find(f, "tokenizer.ggml.token_type");
    if (tt && (tt->type != GGUF_ARRAY || tt->arr_type != GGUF_INT32)) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.token_type is not an array of int32");
        goto fail;
    }
    if (tt && tt->arr_n != tk->arr_n) {
        set_err(err, errlen, "tokenizer: tokenizer.ggml.token_type has %llu entries, tokens %llu",
                (unsigned long long)tt->arr_n, (unsigned long long)tk->arr_n);
        goto fail;
    }

    t->tok_off = malloc((size_t)nv * sizeof *t->tok_off);
    t->tok_len = malloc((size_t)nv * sizeof *t->tok_len);
    t->score = malloc((size_t)nv * sizeof *t->score);
    t->attr = malloc((size_t)nv * sizeof *t->attr);
    t->eog = calloc((size_t)nv, 1);
    if (!t->tok_off || !t->tok_len || !t->score || !t->attr || !t->eog) {
        set_err(err, errlen, "tokenizer: out of memory");
        goto fail;
    }
    {
        bbuf blob = {0};
        for (int32_t i = 0; i < nv; i++) {
            gguf_str s = tk->arr_str[i];
            char tmp[32];
            const char *p = s.ptr;
            size_t n = (size_t)s.len;
            if (n == 0) { /* llama.cpp renames empty tokens */
                n = (size_t)snprintf(tmp, sizeof tmp, "[EMPTY_%d]", (int)i);
                p = tmp;
            }
            if (n > 0xFFFFFFFFu) {
                free(blob.p);
                set_err(err, errlen, "tokenizer: token %d is too long", (int)i);
                goto fail;
            }
            t->tok_off[i] = blob.n;
            t->tok_len[i] = (uint32_t)n;
            if (n > t->max_token_len) t->max_token_len = n;
            if (bbuf_add(&blob, p, n)) {
                free(blob.p);
                set_err(err, errlen, "tokenizer: out of memory");
                goto fail;
            }
            t->score[i] = sc ? (float)gguf_arr_f64(sc, (uint64_t)i) : 0.0f;
            uint32_t a = ATTR_NORMAL;
            if (tt) {
                switch (gguf_arr_i64(tt, (uint64_t)i)) {
                case 1: a = ATTR_NORMAL; break;
                case 2: a = ATTR_UNKNOWN; break;
                case 3: a = ATTR_CONTROL; break;
                case 4: a = ATTR_USER_DEFINED; break;
                case 5: a = ATTR_UNUSED; break;
                case 6: a = ATTR_BYTE; break;
                default: a = 0; break;
                }
            }
            t->attr[i] = a;
        }
        t->blob = blob.p ? blob.p : malloc(1);
    }
    t->vmask = pow2_at_least((size_t)nv * 2) - 1;
    t->vhash = calloc(t->vmask + 1, sizeof *t->vhash);
    if (!t->vhash) {
        set_err(err, errlen, "tokenizer: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < nv; i++) vocab_insert(t, i);

    /* merges (BPE) */
    if (t->model == MODEL_BPE) {
        const gguf_kv *mk = gguf_find(f, "tokenizer.ggml.merges");
        if (!mk) {
            set_err(err, errlen, "tokenizer: missing tokenizer.ggml.merges");
            goto fail;
        }
        if (mk->type != GGUF_ARRAY || mk->arr_type != GGUF_STRING) {
            set_err(err, errlen, "tokenizer: tokenizer.ggml.merges is not an array of strings");
            goto fail;
        }
        if (mk->arr_n > 0x7FFFFFFF) {
            set_err(err, errlen, "tokenizer: tokenizer.ggml.merges is too large");
            goto fail;
        }
        size_t nm = (size_t)mk->arr_n;
        size_t total = 0;
        for (size_t i = 0; i < nm; i++) total += (size_t)mk->arr_str[i].len;
        if (total > 0xFFFFFFFFu) {
            set_err(err, errlen, "tokenizer: tokenizer.ggml.merges is too large");
            goto fail;
        }
        t->merge_blob = malloc(total ? total : 1);
        t->merges = malloc((nm ? nm : 1) * sizeof *t->merges);
        t->mmask = pow2_at_least(nm * 2) - 1;
        t->mhash = calloc(t->mmask + 1, sizeof *t->mhash);
        t->pmask = pow2_at_least(nm * 2) - 1;
        t->pairs = malloc((t->pmask + 1) * sizeof *t->pairs);
        if (t->pairs)
            for (size_t i = 0; i <= t->pmask; i++) t->pairs[i].key = PAIR_EMPTY;
        if (!t->merge_blob || !t->merges || !t->mhash || !t->pairs) {
            set_err(err, errlen, "tokenizer: out of memory");
            goto fail;
        }
        size_t off = 0;
        for (size_t i = 0; i < nm; i++) {
            gguf_str s = mk->arr_str[i];
            const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', (size_t)s.len - 1) : NULL;
            if (!sp) {
                set_err(err, errlen,
                        "tokenizer: tokenizer.ggml.merges[%llu] is malformed (no 'left right' pair)",
                        (unsigned long long)i);
                goto fail;
            }
            size_t ln = (size_t)(sp - s.ptr), rn = (size_t)s.len - ln - 1;
            merge_ent m = {(uint32_t)off, (uint32_t)ln, (uint32_t)rn, (int32_t)i};
            memcpy(t->merge_blob + off, s.ptr, ln);
            memcpy(t->merge_blob + off + ln, sp + 1, rn);
            off += ln + rn;
            /* first occurrence of a pair keeps its rank (bpe_ranks.emplace) */
            uint64_t h = merge_hash(s.ptr, ln, sp + 1, rn);
            size_t j = (size_t)h & t->mmask;
            int dup = 0;
            for (;; j = (j + 1) & t->mmask) {
                int32_t e = t->mhash[j];
                if (!e) break;
                const merge_ent *o = &t->merges[e - 1];
                if (o->left_len == ln && o->right_len == rn &&
                    memcmp(t->merge_blob + o->key_off, t->merge_blob + off - ln - rn, ln + rn) == 0) {
                    dup = 1;
                    break;
                }
            }
            t->merges[t->n_merges] = m;
            if (!dup) {
                t->mhash[j] = (int32_t)t->n_merges + 1;
                const char *k = t->merge_blob + m.key_off;
                int32_t lid = vocab_find(t, k, ln), rid = vocab_find(t, k + ln, rn);
                if (lid != TOK_NULL && rid != TOK_NULL) {
                    uint64_t key = (uint64_t)(uint32_t)lid << 32 | (uint32_t)rid;
                    size_t q = pair_slot(key, t->pmask);
                    while (t->pairs[q].key != PAIR_EMPTY && t->pairs[q].key != key) q = (q + 1) & t->pmask;
                    if (t->pairs[q].key == PAIR_EMPTY) /* equal texts give equal ids: never a repeat */
                        t->pairs[q] = (struct pair_ent){key, m.rank, vocab_find(t, k, ln + rn)};
                }
            }
            t->n_merges++;
        }
        for (int b = 0; b < 256; b++) t->byte_tok[b] = vocab_find(t, t->bmap.enc[b], t->bmap.enc_len[b]);
        /* default special ids: llama.cpp uses 11 for gpt2-style vocabularies */
        t->bos = pre_no_bos ? TOK_NULL : 11;
        t->eos = 11;
        t->unk = TOK_NULL;
    } else {
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
    }
    if (t->bos >= nv) t->bos = TOK_NULL;
    if (t->eos >= nv) t->eos = TOK_NULL;
    if (t->unk >= nv) t->unk = TOK_NULL;

    /* FIM ids matter only for the end-of-generation list; llama.cpp ignores
     * bad ones, as it does bad padding / separator / mask ids (unused here) */
    int32_t fim_pad = TOK_NULL, fim_rep = TOK_NULL, fim_sep = TOK_NULL;
    if (get_opt_id(f, "tokenizer.ggml.bos_token_id", nv, &t->bos, 1, err, errlen) ||
        get_opt_id(f, "tokenizer.ggml.eos_token_id", nv, &t->eos, 1, err, errlen) ||
        get_opt_id(f, "tokenizer.ggml.eot_token_id", nv, &t->eot, 1, err, errlen) ||
        get_opt_id(f, "tokenizer.ggml.eom_token_id", nv, &t->eom, 1, err, errlen) ||
        get_opt_id(f, "tokenizer.ggml.unknown_token_id", nv, &t->unk, 1, err, errlen) ||
        get_opt_id(f, "tokenizer.ggml.fim_pad_token_id", nv, &fim_pad, 0, NULL, 0) ||
        get_opt_id(f, "tokenizer.ggml.fim_rep_token_id", nv, &fim_rep, 0, NULL, 0) ||
        get_opt_id(f, "tokenizer.ggml.fim_sep_token_id", nv, &fim_sep, 0, NULL, 0))
        goto fail;
    if (get_opt_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err, errlen) ||
        get_opt_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err, errlen))
        goto fail;

    /* token texts llama.cpp recognises (its load(): EOT/EOM/FIM detection,
     * end-of-generation list); where it picks "the first" of several
     * candidates from a hash map we take the lowest id. */
    {
        static const char *const eot_names[] = {
            "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
            "<end_of_utterance>", NULL};
        static const char *const eom_names[] = {"<|eom_id|>", NULL};
        static const char *const fpre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                           "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                           "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
        static const char *const fsuf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                           "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>",
                                           "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
        static const char *const fmid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                           "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                           "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
        static const char *const fpad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
        static const char *const frep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                           "<reponame>", NULL};
        static const char *const fsep[] = {"<|file_sep|>", NULL};
        static const char *const eog_names[] = {
            "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
            "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
            "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
            "<|tool_response>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
            "[e~[", NULL};
        static const char *const user_names[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                  "<|constrain|>", NULL};
        int32_t fim_pre = TOK_NULL, fim_suf = TOK_NULL, fim_mid = TOK_NULL;
        get_opt_id(f, "tokenizer.ggml.fim_pre_token_id", nv, &fim_pre, 0, NULL, 0);
        get_opt_id(f, "tokenizer.ggml.fim_suf_token_id", nv, &fim_suf, 0, NULL, 0);
        get_opt_id(f, "tokenizer.ggml.fim_mid_token_id", nv, &fim_mid, 0, NULL, 0);
        struct {
            int32_t *id;
            const char *const *names;
        } det[] = {{&t->eot, eot_names}, {&t->eom, eom_names}, {&fim_pre, fpre}, {&fim_suf, fsuf},
                   {&fim_mid, fmid},     {&fim_pad, fpad},     {&fim_rep, frep}, {&fim_sep, fsep}};
        int32_t was_null[8];
        for (size_t k = 0; k < 8; k++) was_null[k] = *det[k].id == TOK_NULL;
        for (int32_t i = 0; i < nv; i++) {
            if (t->tok_len[i] > 40 || tok_text(t, i)[0] == 0) continue;
            for (size_t k = 0; k < 8; k++) {
                if (was_null[k] && *det[k].id == TOK_NULL && text_in(t, i, det[k].names)) {
                    *det[k].id = i;
                    t->attr[i] |= ATTR_CONTROL;
                }
            }
        }
        /* control tokens named "unused" */
        for (int32_t i = 0; i < nv; i++) {
            if ((t->attr[i] & ATTR_CONTROL) && memmem(tok_text(t, i), t->tok_len[i], "unused", 6))
                t->attr[i] |= ATTR_UNUSED;
        }
        t->fim_pre = fim_pre;
        t->fim_suf = fim_suf;
        t->fim_mid = fim_mid;
        if (fim_pad != TOK_NULL) t->eog[fim_pad] = 1;
        if (fim_rep != TOK_NULL) t->eog[fim_rep] = 1;
        if (fim_sep != TOK_NULL) t->eog[fim_sep] = 1;
        for (int32_t i = 0; i < nv; i++) {
            if (t->tok_len[i] <= 40 && text_in(t, i, eog_names)) {
                t->eog[i] = 1;
                t->attr[i] |= ATTR_CONTROL;
            }
        }
        for (int32_t i = 0; i < nv; i++)
            if (t->tok_len[i] <= 16 && text_in(t, i, user_names)) t->attr[i] = ATTR_USER_DEFINED;
        if (t->eos != TOK_NULL) t->eog[t->eos] = 1;
        if (t->eot != TOK_NULL) t->eog[t->eot] = 1;
        if (t->eom != TOK_NULL) t->eog[t->eom] = 1;
        /* o200k_harmony / solar-open: "<|end|>" is not end-of-generation there */
        {
            int has_return = 0, has_call = 0, has_flush = 0;
            int32_t end_id = TOK_NULL;
            for (int32_t i = 0; i < nv; i++) {
                if (!t->eog[i]) continue;
                if (text_is(t, i, "<|return|>")) has_return = 1;
                else if (text_is(t, i, "<|call|>") || text_is(t, i, "<|calls|>")) has_call = 1;
                else if (text_is(t, i, "<|flush|>")) has_flush = 1;
                else if (text_is(t, i, "<|end|>")) end_id = i;
            }
            if (end_id != TOK_NULL && ((has_return && has_call) || (has_call && has_flush))) {
                t->eog[end_id] = 0;
                t->attr[end_id] = ATTR_USER_DEFINED;
            }
        }
        /* gemma4 / plamo: "</s>" is a normal token there */
        {
            int marker = 0;
            int32_t s_id = TOK_NULL;
            for (int32_t i = 0; i < nv; i++) {
                if (!t->eog[i]) continue;
                if (text_is(t, i, "<|tool_response>") || text_is(t, i, "<|plamo:eos|>")) marker = 1;
                else if (text_is(t, i, "</s>")) s_id = i;
            }
            if (marker && s_id != TOK_NULL) {
                t->eog[s_id] = 0;
                t->attr[s_id] = ATTR_NORMAL;
            }
        }
    }

    /* special tokens, longest text first */
    {
        int32_t n = 0;
        for (int32_t i = 0; i < nv; i++)
            if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) n++;
        t->special = malloc((size_t)(n ? n : 1) * sizeof *t->special);
        if (!t->special) {
            set_err(err, errlen, "tokenizer: out of memory");
            goto fail;
        }
        n = 0;
        for (int32_t i = 0; i < nv; i++)
            if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) t->special[n++] = i;
        t->n_special = n;
        len_id *li = malloc((size_t)(n ? n : 1) * sizeof *li);
        if (!li) {
            set_err(err, errlen, "tokenizer: out of memory");
            goto fail;
        }
        for (int32_t i = 0; i < n; i++) li[i] = (len_id){t->tok_len[t->special[i]], t->special[i]};
        qsort(li, (size_t)n, sizeof *li, cmp_len_id);
        for (int32_t i = 0; i < n; i++) t->special[i] = li[i].id;
        free(li);
    }

    /* per-model strip attributes llama.cpp sets by name */
    {
        char name[256] = "", prestr[64] = "";
        gguf_get_cstr(f, "general.name", name, sizeof name);
        gguf_get_cstr(f, "tokenizer.ggml.pre", prestr, sizeof prestr);
        for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
        if (strstr(prestr, "jina-v2-de") || strstr(prestr, "jina-v2-es") ||
            strstr(prestr, "jina-v2-code")) {
            int32_t id = vocab_find(t, "<mask>", 6);
            if (id >= 0) t->attr[id] |= ATTR_LSTRIP;
        } else if (strstr(name, "phi-3") || strstr(name, "phi3")) {
            for (int32_t i = 0; i < t->n_special; i++) t->attr[t->special[i]] |= ATTR_RSTRIP;
            int32_t id = vocab_find(t, "</s>", 4);
            if (id >= 0) t->attr[id] |= ATTR_RSTRIP;
            static const char *const no_rstrip[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (int k = 0; k < 3; k++) {
                id = vocab_find(t, no_rstrip[k], strlen(no_rstrip[k]));
                if (id >= 0) t->attr[id] &= ~(uint32_t)ATTR_RSTRIP;
            }
        } else if (strstr(name, "modern-bert")) {
            int32_t id = vocab_find(t, "[MASK]", 6);
            if (id >= 0) t->attr[id] |= ATTR_LSTRIP;
        }
    }

    /* pieces */
    {
        bbuf pb = {0};
        t->piece_off = malloc((size_t)nv * sizeof *t->piece_off);
        t->piece_len = malloc((size_t)nv * sizeof *t->piece_len);
        if (!t->piece_off || !t->piece_len) {
            set_err(err, errlen, "tokenizer: out of memory");
            goto fail;
        }
        for (int32_t i = 0; i < nv; i++) {
            size_t before = pb.n;
            if (build_piece(t, i, &pb)) {
                free(pb.p);
                set_err(err, errlen, "tokenizer: out of memory");
                goto fail;
            }
            t->piece_off[i] = before;
            t->piece_len[i] = (uint32_t)(pb.n - before);
            if (t->piece_len[i] > t->max_token_bytes) t->max_token_bytes = t->piece_len[i];
            if (t->tok_len[i] > t->max_token_bytes) t->max_token_bytes = t->tok_len[i];
        }
        t->piece_blob = pb.p ? pb.p : malloc(1);
    }
    return t;

fail:
    tokenizer_free(t);
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* special-token partition (llama.cpp's tokenizer_st_partition)              */

typedef struct {
    int32_t id; /* TOK_NULL: raw text */
    size_t off, len;
} frag;

typedef VEC(frag) fvec;

static int special_active(const tokenizer *t, int32_t id, int parse_special) {
    return parse_special || !(t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN));
}

static int partition(const tokenizer *t, const char *text, size_t len, int parse_special, fvec *out,
                     fvec *tmp) {
    out->n = 0;
    if (len == 0) return 0;
    if (vec_push(out, (frag){TOK_NULL, 0, len})) return -1;
    for (int32_t si = 0; si < t->n_special; si++) {
        int32_t id = t->special[si];
        if (!special_active(t, id, parse_special)) continue;
        const char *st = tok_text(t, id);
        size_t sl = t->tok_len[id];
        uint32_t attr = t->attr[id];
        /* quick reject: the token text must occur somewhere in a raw fragment */
        int any = 0;
        for (size_t k = 0; k < out->n && !any; k++)
            if (out->v[k].id == TOK_NULL && out->v[k].len >= sl &&
                memmem(text + out->v[k].off, out->v[k].len, st, sl))
                any = 1;
        if (!any) continue;
        tmp->n = 0;
        for (size_t k = 0; k < out->n; k++) {
            frag fr = out->v[k];
            if (fr.id != TOK_NULL) {
                if (vec_push(tmp, fr)) return -1;
                continue;
            }
            size_t base = fr.off, blen = fr.len;
            for (;;) {
                const char *m = blen >= sl ? memmem(text + base, blen, st, sl) : NULL;
                if (!m) {
                    if (blen > 0 && vec_push(tmp, (frag){TOK_NULL, base, blen})) return -1;
                    break;
                }
                size_t mo = (size_t)(m - text);
                size_t ll = mo - base;
                if (attr & ATTR_LSTRIP)
                    while (ll > 0 && isspace((unsigned char)text[base + ll - 1])) ll--;
                if (ll > 0 && vec_push(tmp, (frag){TOK_NULL, base, ll})) return -1;
                if (vec_push(tmp, (frag){id, mo, sl})) return -1;
                size_t ro = mo + sl, rl = base + blen - ro;
                if (attr & ATTR_RSTRIP)
                    while (rl > 0 && isspace((unsigned char)text[ro])) ro++, rl--;
                base = ro;
                blen = rl;
            }
        }
        fvec sw = *out;
        *out = *tmp;
        *tmp = sw;
        tmp->n = 0;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* pre-tokenizer                                                             */

typedef struct {
    uint32_t *cp;  /* codepoints of the raw fragment */
    size_t *boff;  /* byte offset of each codepoint (n + 1 entries) */
    size_t n, cap;
    char *col;     /* collapsed text (lazily) */
    int have_col;
    char *u8;      /* UTF-8 text with non-ASCII whitespace as \v (lazily) */
    size_t *u8cpt; /* byte offset in u8 of each codepoint (n + 1 entries) */
    int have_u8;
    size_t u8cap;
} cpbuf;

static int cpbuf_load(cpbuf *c, const char *s, size_t n) {
    if (n + 1 > c->cap) {
        size_t nc = n + 1 + n / 2;
        uint32_t *cp = xrealloc(c->cp, nc * sizeof *cp);
        if (!cp) return -1;
        c->cp = cp;
        size_t *bo = xrealloc(c->boff, nc * sizeof *bo);
        if (!bo) return -1;
        c->boff = bo;
        char *col = xrealloc(c->col, nc);
        if (!col) return -1;
        c->col = col;
        size_t *uc = xrealloc(c->u8cpt, nc * sizeof *uc);
        if (!uc) return -1;
        c->u8cpt = uc;
        c->cap = nc;
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t v;
        int l = utf8_seq((const unsigned char *)s + i, n - i, &v);
        if (l <= 0) return -1; /* input was validated */
        c->cp[k] = v;
        c->boff[k] = i;
        k++;
        i += (size_t)l;
    }
    c->boff[k] = n;
    c->n = k;
    c->have_col = 0;
    c->have_u8 = 0;
    return 0;
}

static void cpbuf_collapse(cpbuf *c) {
    if (c->have_col) return;
    for (size_t i = 0; i < c->n; i++) {
        uint32_t v = c->cp[i];
        if (v < 128) {
            c->col[i] = (char)v;
            continue;
        }
        uint8_t f = uflags(v);
        char x;
        if (f & UF_SPACE) x = 0x0B;
        else if (f & UF_NUMBER) x = (char)0xD1;
        else if (f & UF_LETTER) x = (char)0xD2;
        else if (f & UF_PUNCT) x = (char)0xD3;
        else if (f & UF_MARK) x = (char)0xD4;
        else if (f & UF_SYMBOL) x = (char)0xD5;
        else x = (char)0xD0;
        c->col[i] = x;
    }
    c->have_col = 1;
}

static int cpbuf_u8(cpbuf *c) {
    if (c->have_u8) return 0;
    size_t need = c->n * 4 + 1;
    if (need > c->u8cap) {
        char *p = xrealloc(c->u8, need);
        if (!p) return -1;
        c->u8 = p;
        c->u8cap = need;
    }
    size_t o = 0;
    for (size_t i = 0; i < c->n; i++) {
        uint32_t v = c->cp[i];
        c->u8cpt[i] = o;
        if (v > 0x7F && (uflags(v) & UF_SPACE)) v = 0x0B;
        o += (size_t)utf8_put(v, c->u8 + o);
    }
    c->u8cpt[c->n] = o;
    c->have_u8 = 1;
    return 0;
}

static void cpbuf_free(cpbuf *c) {
    free(c->cp);
    free(c->boff);
    free(c->col);
    free(c->u8);
    free(c->u8cpt);
}

/* Scanner state over one fragment [s, e) of codepoints. Every look at a
 * position is recorded in maxpos; a look at e (the end) means the result could
 * change if the fragment were longer. */
typedef struct {
    const uint32_t *cp;
    size_t s, e, maxpos;
    zvec *out;
    int open;        /* record stable ends only while maxpos < e */
    size_t stable;   /* end of the last token that is final */
    int unstable;
    size_t prev_end;
    int oom;
} scan;

static inline uint32_t sc_cpt(scan *S, size_t p) {
    if (p > S->maxpos) S->maxpos = p;
    return p < S->e ? S->cp[p] : OOR;
}

static inline uint8_t sc_flags(scan *S, size_t p) {
    if (p > S->maxpos) S->maxpos = p;
    return p < S->e ? uflags(S->cp[p]) : 0;
}

static size_t sc_emit(scan *S, size_t end) {
    size_t len = end - S->prev_end;
    if (len > 0) {
        if (!S->unstable && S->maxpos < S->e) {
            if (vec_push(S->out, end)) S->oom = 1;
            S->stable = end;
        } else {
            S->unstable = 1;
            if (!S->open && vec_push(S->out, end)) S->oom = 1;
        }
    }
    S->prev_end = end;
    return len;
}

static inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* ' followed by s t m d / re ve ll (case-folded when fold); returns token end or 0 */
static size_t sc_contraction(scan *S, size_t pos, int fold) {
    if (sc_cpt(S, pos) != '\'' || sc_cpt(S, pos + 1) == OOR) return 0;
    uint32_t n1 = sc_cpt(S, pos + 1);
    if (fold) n1 = ascii_lower(n1);
    if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return pos + 2;
    uint32_t n2 = sc_cpt(S, pos + 2);
    if (n2 == OOR) return 0;
    if (fold) n2 = ascii_lower(n2);
    if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return pos + 3;
    return 0;
}

#define NOT_LNW(f) (!((f) & (UF_SPACE | UF_LETTER | UF_NUMBER)))

/* The last alternatives of the GPT-2 family's pattern, `\s+(?!\S)|\s+` and then one
 * character of any kind: where the token starting at pos ends, given the nws
 * spaces that start there (0 or more). A run of spaces before a non-space
 * leaves its last space to the next token. */
static size_t sc_space_end(scan *S, size_t pos, size_t nws) {
    if (nws > 1 && sc_cpt(S, pos + nws) != OOR) return pos + nws - 1;
    return pos + (nws > 0 ? nws : 1);
}

static void scan_gpt2(scan *S) {
    size_t pos = S->s;
    while (pos < S->e) {
        uint32_t c = sc_cpt(S, pos);
        uint8_t f = sc_flags(S, pos);
        size_t ce = sc_contraction(S, pos, 0);
        if (ce) {
            pos += sc_emit(S, ce);
            continue;
        }
        uint8_t f2 = c == ' ' ? sc_flags(S, pos + 1) : f;
        if (f2 & UF_LETTER) {
            pos += c == ' ';
            while (f2 & UF_LETTER) f2 = sc_flags(S, ++pos);
            sc_emit(S, pos);
            continue;
        }
        if (f2 & UF_NUMBER) {
            pos += c == ' ';
            while (f2 & UF_NUMBER) f2 = sc_flags(S, ++pos);
            sc_emit(S, pos);
            continue;
        }
        if (NOT_LNW(f2) && f2) {
            pos += c == ' ';
            while (NOT_LNW(f2) && f2) f2 = sc_flags(S, ++pos);
            sc_emit(S, pos);
            continue;
        }
        size_t nws = 0;
        while (sc_flags(S, pos + nws) & UF_SPACE) nws++;
        pos = sc_space_end(S, pos, nws);
        sc_emit(S, pos);
    }
}

/* llama3 (digits 3), qwen2 (digits 1), qwen35 (digits 1, marks join letters) */
static void scan_llama3(scan *S, int digits, int marks) {
    const uint8_t LM = marks ? (UF_LETTER | UF_MARK) : UF_LETTER;
    size_t pos = S->s;
    while (pos < S->e) {
        uint32_t c = sc_cpt(S, pos);
        uint8_t f = sc_flags(S, pos);
        size_t ce = sc_contraction(S, pos, 1);
        if (ce) {
            pos += sc_emit(S, ce);
            continue;
        }
        if (!(c == '\r' || c == '\n' || (f & UF_NUMBER))) {
            if ((f & LM) || (sc_flags(S, pos + 1) & LM)) {
                pos++;
                while (sc_flags(S, pos) & LM) pos++;
                sc_emit(S, pos);
                continue;
            }
        }
        if (f & UF_NUMBER) {
            if (digits == 1) {
                pos++;
                sc_emit(S, pos);
                continue;
            }
            size_t ini = pos;
            while (sc_flags(S, pos) & UF_NUMBER) {
                if (++pos - ini >= 3) {
                    sc_emit(S, pos);
                    ini = pos;
                }
            }
            sc_emit(S, pos);
            continue;
        }
        uint8_t f2 = c == ' ' ? sc_flags(S, pos + 1) : f;
        uint8_t excl = (uint8_t)(UF_SPACE | UF_LETTER | UF_NUMBER | (marks ? UF_MARK : 0));
        if (!(f2 & excl) && f) {
            pos += c == ' ';
            while (!(f2 & excl) && f2) f2 = sc_flags(S, ++pos);
            uint32_t c2 = sc_cpt(S, pos);
            while (c2 == '\r' || c2 == '\n') c2 = sc_cpt(S, ++pos);
            sc_emit(S, pos);
            continue;
        }
        size_t nws = 0, last_rn = 0;
        while (sc_flags(S, pos + nws) & UF_SPACE) {
            uint32_t c2 = sc_cpt(S, pos + nws);
            if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) {
            pos = last_rn;
            sc_emit(S, pos);
            continue;
        }
        pos = sc_space_end(S, pos, nws);
        sc_emit(S, pos);
    }
}

static void scan_digits(scan *S) {
    size_t pos = S->s;
    while (pos < S->e) {
        if (uflags(S->cp[pos]) & UF_NUMBER) {
            sc_emit(S, pos);
            sc_emit(S, pos + 1);
        }
        pos++;
    }
    /* the text after the last number runs to the fragment end, which may move */
    if (S->prev_end < S->e) {
        if (S->open) S->unstable = 1;
        else if (vec_push(S->out, S->e)) S->oom = 1;
        S->prev_end = S->e;
    }
}

/* subject offset (collapsed: codepoints, else UTF-8 bytes) -> codepoint index */
static size_t subj_to_cpt(const cpbuf *c, const pre_stage *st, size_t s, size_t e, size_t u) {
    if (st->collapsed) return s + u;
    size_t base = c->u8cpt[s], lo = s, hi = e;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->u8cpt[mid] - base < u) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Runs stage st over [s, e). Closed mode pushes every fragment end. Open mode
 * pushes the ends that are final and returns in *open_start / *open_limit the
 * unstable rest: a fragment starting at *open_start whose codepoints before
 * *open_limit are known to belong to it. */
static int run_stage(const pre_stage *st, cpbuf *c, size_t s, size_t e, int open, zvec *out,
                     pcre2_match_data *md, size_t *open_start, size_t *open_limit) {
    if (st->kind != PRE_RE) {
        scan S = {c->cp, s, e, s, out, open, s, 0, s, 0};
        switch (st->kind) {
        case PRE_GPT2: scan_gpt2(&S); break;
        case PRE_LLAMA3: scan_llama3(&S, 3, 0); break;
        case PRE_QWEN2: scan_llama3(&S, 1, 0); break;
        case PRE_QWEN35: scan_llama3(&S, 1, 1); break;
        default: scan_digits(&S); break;
        }
        if (S.oom) return -1;
        if (open) {
            *open_start = S.stable;
            /* digits stage: the text after the last number is one fragment
             * growing to the end: all of it is known to belong to it */
            *open_limit = st->kind == PRE_DIGITS ? e : S.stable;
        }
        return 0;
    }
    const char *subj;
    size_t slen;
    if (st->collapsed) {
        cpbuf_collapse(c);
        subj = c->col + s;
        slen = e - s;
    } else {
        if (cpbuf_u8(c)) return -1;
        subj = c->u8 + c->u8cpt[s];
        slen = c->u8cpt[e] - c->u8cpt[s];
    }
    size_t pos = 0, last = 0; /* subject offsets: search start, last fragment end */
    for (;;) {
        if (pos >= slen) {
            if (open) *open_start = *open_limit = e;
            return 0;
        }
        int rc = pcre2_match(st->re, (PCRE2_SPTR)subj, slen, pos,
                             (open ? PCRE2_PARTIAL_HARD : 0) | (st->collapsed ? 0 : PCRE2_NO_UTF_CHECK),
                             md, NULL);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (rc == PCRE2_ERROR_PARTIAL || rc == PCRE2_ERROR_NOMATCH) {
            if (open) {
                /* the unmatched text from `last` runs at least to where the
                 * partial match starts (or to the end) */
                *open_start = subj_to_cpt(c, st, s, e, last);
                *open_limit = rc == PCRE2_ERROR_PARTIAL ? subj_to_cpt(c, st, s, e, ov[0]) : e;
            } else if (vec_push(out, e)) {
                return -1;
            }
            return 0;
        }
        if (rc < 0) return -1;
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step over a codepoint (no supported regex matches empty) */
            pos++;
            if (!st->collapsed)
                while (pos < slen && ((unsigned char)subj[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > last && vec_push(out, subj_to_cpt(c, st, s, e, ms))) return -1;
        if (vec_push(out, subj_to_cpt(c, st, s, e, me))) return -1;
        pos = last = me;
    }
}

/* Pre-tokenizes codepoints [0, n) of c. Closed: word ends into out (last = n).
 * Open: only the ends that are final; *cut = where the unstable rest begins. */
static int pretokenize(const tokenizer *t, cpbuf *c, int open, zvec *out, zvec *tmp,
                       pcre2_match_data **md, size_t *cut) {
    out->n = 0;
    size_t n = c->n;
    if (n == 0) {
        if (cut) *cut = 0;
        return 0;
    }
    if (vec_push(out, n)) return -1;
    size_t ostart = 0, olimit = n; /* open fragment [ostart, ...) trusted below olimit */
    int has_open = open;
    if (open) out->n = 0;
    for (int si = 0; si < t->n_stages; si++) {
        const pre_stage *st = &t->stages[si];
        if (st->kind == PRE_RE && !*md) {
            *md = pcre2_match_data_create(8, NULL);
            if (!*md) return -1;
        }
        tmp->n = 0;
        size_t prev = 0;
        for (size_t k = 0; k < out->n; k++) {
            if (run_stage(st, c, prev, out->v[k], 0, tmp, *md, NULL, NULL)) return -1;
            prev = out->v[k];
        }
        if (has_open) {
            size_t os = ostart, ol = olimit;
            if (ol > os) {
                if (run_stage(st, c, os, ol, 1, tmp, *md, &ostart, &olimit)) return -1;
            } else {
                ostart = os;
                olimit = os;
            }
        }
        zvec sw = *out;
        *out = *tmp;
        *tmp = sw;
    }
    if (cut) *cut = has_open ? ostart : n;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* BPE and SPM merging                                                       */

typedef struct {
    int32_t prev, next;
    uint32_t off, n; /* bytes in the (encoded) text */
    int32_t id;      /* BPE: token id of the symbol's text, or -1 */
} sym;

typedef struct {
    float score; /* SPM */
    int32_t rank; /* BPE */
    int32_t left, right;
    uint32_t ln, rn; /* sizes when queued */
    int32_t result;  /* BPE: id of the merged text, -1 none, -2 look it up */
} bigram;

typedef struct {
    bbuf enc;
    sym *syms;
    size_t nsym, capsym;
    bigram *heap;
    size_t nheap, capheap;
    cpbuf cp;
    zvec words, tmpw;
    fvec frags, tmpf;
    pcre2_match_data *md;
    bbuf esc;
} work;

static void work_free(work *w) {
    free(w->enc.p);
    free(w->syms);
    free(w->heap);
    cpbuf_free(&w->cp);
    free(w->words.v);
    free(w->tmpw.v);
    free(w->frags.v);
    free(w->tmpf.v);
    if (w->md) pcre2_match_data_free(w->md);
    free(w->esc.p);
}

static int syms_reserve(work *w, size_t n) {
    if (n <= w->capsym) return 0;
    size_t nc = n + n / 2 + 16;
    sym *s = xrealloc(w->syms, nc * sizeof *s);
    if (!s) return -1;
    w->syms = s;
    w->capsym = nc;
    return 0;
}

/* heap order: BPE lowest rank first, SPM highest score first; ties leftmost */
static inline int bg_before(const bigram *a, const bigram *b, int spm) {
    if (spm) {
        if (a->score != b->score) return a->score > b->score;
    } else if (a->rank != b->rank) {
        return a->rank < b->rank;
    }
    return a->left < b->left;
}

static int heap_push(work *w, bigram b, int spm) {
    if (w->nheap == w->capheap) {
        size_t nc = w->capheap ? w->capheap * 2 : 64;
        bigram *h = xrealloc(w->heap, nc * sizeof *h);
        if (!h) return -1;
        w->heap = h;
        w->capheap = nc;
    }
    size_t i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_before(&b, &w->heap[p], spm)) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return 0;
}

static bigram heap_pop(work *w, int spm) {
    bigram top = w->heap[0];
    bigram last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bigram *best = &last;
        if (l < n && bg_before(&w->heap[l], best, spm)) m = l, best = &w->heap[l];
        if (r < n && bg_before(&w->heap[r], best, spm)) m = r;
        if (m == i) break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n) w->heap[i] = last;
    return top;
}

static int bpe_add_bigram(const tokenizer *t, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const sym *L = &w->syms[l], *R = &w->syms[r];
    int rank;
    int32_t result;
    if (L->id >= 0 && R->id >= 0) { /* both halves are tokens: the id-pair table is complete */
        const struct pair_ent *e = pair_find(t, L->id, R->id);
        if (!e) return 0;
        rank = e->rank;
        result = e->result;
    } else {
        rank = merge_rank(t, w->enc.p + L->off, L->n, w->enc.p + R->off, R->n);
        result = -2;
    }
    if (rank < 0) return 0;
    bigram b = {0, rank, l, r, L->n, R->n, result};
    return heap_push(w, b, 0);
}

/* One pre-token (raw bytes) -> ids (llama.cpp's llm_tokenizer_bpe_session). */
static int bpe_word(const tokenizer *t, work *w, const char *s, size_t n, ivec *out) {
    w->enc.n = 0;
    if (bbuf_reserve(&w->enc, n * 2)) return -1;
    if (syms_reserve(w, n)) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        w->syms[i].off = (uint32_t)w->enc.n;
        w->syms[i].n = t->bmap.enc_len[b];
        w->syms[i].prev = (int32_t)i - 1;
        w->syms[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        w->syms[i].id = t->byte_tok[b];
        memcpy(w->enc.p + w->enc.n, t->bmap.enc[b], t->bmap.enc_len[b]);
        w->enc.n += t->bmap.enc_len[b];
    }
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, w->enc.p, w->enc.n);
        if (id != TOK_NULL) return vec_push(out, id);
    }
    w->nsym = n;
    w->nheap = 0;
    for (size_t i = 1; i < n; i++)
        if (bpe_add_bigram(t, w, (int32_t)i - 1, (int32_t)i)) return -1;
    while (w->nheap) {
        bigram b = heap_pop(w, 0);
        sym *L = &w->syms[b.left], *R = &w->syms[b.right];
        if (L->n == 0 || R->n == 0 || L->n != b.ln || R->n != b.rn) continue;
        L->n += R->n;
        R->n = 0;
        L->id = b.result != -2 ? b.result : vocab_find(t, w->enc.p + L->off, L->n);
        L->next = R->next;
        if (R->next >= 0) w->syms[R->next].prev = b.left;
        if (bpe_add_bigram(t, w, L->prev, b.left) || bpe_add_bigram(t, w, b.left, L->next))
            return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const sym *S = &w->syms[i];
        if (S->n == 0) continue;
        int32_t id = S->id;
        if (id != TOK_NULL) {
            if (vec_push(out, id)) return -1;
            continue;
        }
        for (uint32_t k = 0; k < S->n; k++) { /* llama.cpp looks up each single byte */
            int32_t bid = vocab_find(t, w->enc.p + S->off + k, 1);
            if (bid != TOK_NULL && vec_push(out, bid)) return -1;
        }
    }
    return 0;
}

static int spm_add_bigram(const tokenizer *t, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const sym *L = &w->syms[l], *R = &w->syms[r];
    int32_t id = vocab_find(t, w->enc.p + L->off, L->n + R->n);
    if (id == TOK_NULL) return 0;
    bigram b = {t->score[id], 0, l, r, L->n, R->n, -1};
    return heap_push(w, b, 1);
}

static int32_t spm_byte_token(const tokenizer *t, unsigned char b) {
    static const char hx[] = "0123456789ABCDEF";
    char buf[6] = {'<', '0', 'x', hx[b >> 4], hx[b & 15], '>'};
    int32_t id = vocab_find(t, buf, 6);
    if (id != TOK_NULL) return id;
    char c = (char)b;
    id = vocab_find(t, &c, 1);
    return id != TOK_NULL ? id : t->unk;
}

/* SPM on the escaped text in w->enc (llama.cpp's llm_tokenizer_spm_session) */
static int spm_run(const tokenizer *t, work *w, ivec *out) {
    size_t n = w->enc.n;
    if (n == 0) return 0;
    if (syms_reserve(w, n)) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)w->enc.p[i];
        size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (l > n - i) l = n - i;
        w->syms[k].off = (uint32_t)i;
        w->syms[k].n = (uint32_t)l;
        w->syms[k].prev = (int32_t)k - 1;
        i += l;
        w->syms[k].next = i < n ? (int32_t)k + 1 : -1;
        k++;
    }
    w->nsym = k;
    w->nheap = 0;
    for (size_t i = 1; i < k; i++)
        if (spm_add_bigram(t, w, (int32_t)i - 1, (int32_t)i)) return -1;
    while (w->nheap) {
        bigram b = heap_pop(w, 1);
        sym *L = &w->syms[b.left], *R = &w->syms[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.ln + b.rn) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) w->syms[R->next].prev = b.left;
        if (spm_add_bigram(t, w, L->prev, b.left) || spm_add_bigram(t, w, b.left, L->next))
            return -1;
    }
    for (int32_t i = 0; i != -1; i = w->syms[i].next) {
        const sym *S = &w->syms[i];
        int32_t id = vocab_find(t, w->enc.p + S->off, S->n);
        if (id != TOK_NULL) {
            if (vec_push(out, id)) return -1;
            continue;
        }
        /* every merged symbol is a token, so this is one character: bytes */
        for (uint32_t j = 0; j < S->n; j++) {
            int32_t bid = spm_byte_token(t, (unsigned char)w->enc.p[S->off + j]);
            if (bid != TOK_NULL && vec_push(out, bid)) return -1;
        }
    }
    return 0;
}

/* escaped SPM text of raw bytes into buf: optional leading U+2581, ' ' -> U+2581 */
static int spm_escape(bbuf *buf, const char *s, size_t n, int prefix) {
    buf->n = 0;
    if (bbuf_reserve(buf, n * 3 + 3)) return -1;
    if (prefix) {
        memcpy(buf->p, "\xe2\x96\x81", 3);
        buf->n = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf->p + buf->n, "\xe2\x96\x81", 3);
            buf->n += 3;
        } else {
            buf->p[buf->n++] = s[i];
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* encoding                                                                  */

static int encode_raw_bpe(const tokenizer *t, work *w, const char *s, size_t n, int open,
                          ivec *out, size_t *cut) {
    if (cpbuf_load(&w->cp, s, n)) return -1;
    size_t ccut = 0;
    if (pretokenize(t, &w->cp, open, &w->words, &w->tmpw, &w->md, &ccut)) return -1;
    size_t prev = 0;
    for (size_t k = 0; k < w->words.n; k++) {
        size_t e = w->words.v[k];
        size_t bs = w->cp.boff[prev], be = w->cp.boff[e];
        if (bpe_word(t, w, s + bs, be - bs, out)) return -1;
        prev = e;
    }
    if (cut) *cut = w->cp.boff[open ? ccut : w->cp.n];
    return 0;
}

/* Does some vocabulary token occur in E across escaped offset b, with every
 * such occurrence lying inside E? Returns 1 (yes / unknown), 0 (clean cut). */
static int spm_cut_blocked(const tokenizer *t, const char *E, size_t En, size_t b) {
    size_t ml = t->max_token_len;
    if (b + ml > En + 1) return 1; /* a token across b could reach past what we know */
    size_t s0 = b >= ml ? b - ml + 1 : 0;
    for (size_t s = s0; s < b; s++) {
        if (((unsigned char)E[s] & 0xC0) == 0x80) continue;
        size_t emax = s + ml < En ? s + ml : En;
        for (size_t e = b + 1; e <= emax; e++) {
            if (e < En && ((unsigned char)E[e] & 0xC0) == 0x80) continue;
            if (vocab_find(t, E + s, e - s) != TOK_NULL) return 1;
        }
    }
    return 0;
}

static int encode_raw_spm(const tokenizer *t, work *w, const char *s, size_t n, int prefix,
                          int open, ivec *out, size_t *cut) {
    size_t use = n;
    if (open) {
        /* find the last raw offset b where no token can span the cut */
        if (spm_escape(&w->esc, s, n, prefix)) return -1;
        size_t best = 0;
        size_t tries = 0;
        size_t eb = w->esc.n; /* escaped offset of raw offset b, walked backwards */
        for (size_t b = n; b > 0 && tries < 256;) {
            /* step b back one character */
            size_t nb = b - 1;
            while (nb > 0 && ((unsigned char)s[nb] & 0xC0) == 0x80) nb--;
            eb -= s[nb] == ' ' ? 3 : b - nb;
            b = nb;
            if (b == 0) break;
            if (eb + t->max_token_len > w->esc.n + 1) continue; /* too close to the end */
            tries++;
            if (!spm_cut_blocked(t, w->esc.p, w->esc.n, eb)) {
                best = b;
                break;
            }
        }
        use = best;
        *cut = best;
    }
    if (use == 0) return 0;
    if (spm_escape(&w->enc, s, use, prefix)) return -1;
    return spm_run(t, w, out);
}

/* The earliest offset from which the text could still turn into (part of) a
 * special token once more text arrives: a proper prefix of an active special
 * token at the end, pushed back past any complete occurrence straddling it. */
static size_t special_limit(const tokenizer *t, const char *p, size_t n, int parse_special) {
    size_t L = n;
    for (int32_t si = 0; si < t->n_special; si++) {
        int32_t id = t->special[si];
        if (!special_active(t, id, parse_special)) continue;
        size_t sl = t->tok_len[id];
        const char *st = tok_text(t, id);
        size_t from = n >= sl ? n - sl + 1 : 0;
        for (size_t s = from; s < n && s < L; s++)
            if (memcmp(p + s, st, n - s) == 0) {
                L = s;
                break;
            }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t si = 0; si < t->n_special; si++) {
            int32_t id = t->special[si];
            if (!special_active(t, id, parse_special)) continue;
            size_t sl = t->tok_len[id];
            if (sl < 2) continue;
            const char *st = tok_text(t, id);
            size_t from = L >= sl - 1 ? L - (sl - 1) : 0;
            for (size_t s = from; s < L; s++) {
                if (s + sl <= n && memcmp(p + s, st, sl) == 0) {
                    L = s;
                    changed = 1;
                    break;
                }
            }
        }
    }
    return L;
}

static int special_crosses(const tokenizer *t, const char *p, size_t n, size_t at,
                           int parse_special) {
    for (int32_t si = 0; si < t->n_special; si++) {
        int32_t id = t->special[si];
        if (!special_active(t, id, parse_special)) continue;
        size_t sl = t->tok_len[id];
        if (sl < 2) continue;
        size_t from = at >= sl - 1 ? at - (sl - 1) : 0;
        for (size_t s = from; s < at; s++)
            if (s + sl <= n && memcmp(p + s, tok_text(t, id), sl) == 0) return 1;
    }
    return 0;
}

/* The class of a character for the runs cut at TOK_RUN_CUT bytes. */
static int run_class(uint32_t c) {
    uint8_t f = uflags(c);
    return (f & UF_SPACE) ? 0 : (f & (UF_LETTER | UF_MARK)) ? 1 : (f & UF_NUMBER) ? 2 : 3;
}

/* Scans the valid UTF-8 p[0, n) from run state *r: 1 with *at the offset just
 * after the character at which the run reaches TOK_RUN_CUT bytes (the state
 * then that of the cut: its class, 0 bytes), or 0 when there is none (the
 * state at n). */
static int next_run_cut(const char *p, size_t n, tok_run *r, size_t *at) {
    for (size_t i = 0; i < n;) {
        uint32_t c = (unsigned char)p[i];
        int l = c < 0x80 ? 1 : utf8_seq((const unsigned char *)p + i, n - i, &c);
        if (l <= 0) l = 1; /* (valid text: not reached) */
        int cls = run_class(c);
        if (cls != r->cls) r->cls = cls, r->bytes = 0;
        r->bytes += (uint32_t)l;
        i += (size_t)l;
        if (r->bytes >= TOK_RUN_CUT) {
            r->bytes = 0;
            *at = i;
            return 1;
        }
    }
    return 0;
}

/* Encodes p[0, n) (valid UTF-8). Closed (open == 0): everything. Open: only
 * the tokens that more text cannot change; *cut = bytes consumed.
 * cont: p starts inside a raw fragment (no SPM prefix space for it). */
static int encode_core(const tokenizer *t, work *w, const char *p, size_t n, int parse_special,
                       int cont, int open, ivec *out, size_t *cut, int *cut_in_raw) {
    if (partition(t, p, n, parse_special, &w->frags, &w->tmpf)) return -1;
    size_t L0 = open ? special_limit(t, p, n, parse_special) : n;
    size_t done = 0;
    if (cut_in_raw) *cut_in_raw = 0;
    /* (encode_raw_* use the other buffers of w, never w->frags) */
    for (size_t k = 0; k < w->frags.n; k++) {
        frag fr = w->frags.v[k];
        if (fr.id != TOK_NULL) {
            if (fr.off + fr.len > L0) break;
            if (vec_push(out, fr.id)) return -1;
            done = fr.off + fr.len;
            continue;
        }
        if (fr.off >= L0) break;
        int prefix = t->model == MODEL_SPM && t->add_space_prefix && !(cont && fr.off == 0);
        int is_open = open && fr.off + fr.len >= L0;
        size_t len = is_open ? L0 - fr.off : fr.len;
        size_t c = len;
        size_t mark = out->n;
        int rc = t->model == MODEL_BPE
                     ? encode_raw_bpe(t, w, p + fr.off, len, is_open, out, &c)
                     : encode_raw_spm(t, w, p + fr.off, len, prefix, is_open, out, &c);
        if (rc) return -1;
        if (is_open) {
            if (c > 0 && special_crosses(t, p, n, fr.off + c, parse_special)) {
                out->n = mark; /* paranoid: fall back to the fragment start */
                c = 0;
            }
            done = fr.off + c;
            if (cut_in_raw) *cut_in_raw = c > 0;
            break;
        }
        done = fr.off + fr.len;
    }
    if (cut) *cut = open ? done : n;
    return 0;
}

/* Whole texts go through a stream, in pieces: the same ids (tok_stream's
 * promise), with the work memory of a piece rather than of the text. */
int64_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_special,
                         int parse_special, int32_t *out, int64_t cap) {
    if (!t || (!text && len)) return -1;
    enum { PIECE = 64 * 1024 };
    tok_stream *s = tok_stream_new(t, add_special, parse_special);
    int32_t *ids = NULL;
    size_t n = 0, at = 0;
    int rc = s ? 0 : -1;
    while (!rc) {
        size_t k = len - at < PIECE ? len - at : PIECE;
        rc = tok_stream_feed(s, text ? text + at : "", k, at + k == len, &ids, &n);
        at += k;
        if (at == len) break;
    }
    tok_stream_free(s);
    if (!rc && out && cap > 0 && n > 0) memcpy(out, ids, (size_t)((int64_t)n < cap ? (int64_t)n : cap) * sizeof *out);
    free(ids);
    return rc ? -1 : (int64_t)n;
}

/* Whether [off, off + len) meets a span of plain, n_plain offsets in pairs. */
static int meets_plain(const size_t *plain, size_t n_plain, size_t off, size_t len) {
    for (size_t k = 0; k + 1 < n_plain; k += 2)
        if (off < plain[k + 1] && plain[k] < off + len) return 1;
    return 0;
}

/* Control tokens split a text into stretches that are tokenized apart (the
 * partition); here only the template's own split it, and each stretch between
 * two of them, message text with any control-token text in it, is tokenized
 * as plain text. */
int64_t tokenizer_encode_chat(const tokenizer *t, const char *text, size_t len, const size_t *plain,
                              size_t n_plain, int32_t *out, int64_t cap) {
    if (!t || (!text && len)) return -1;
    fvec frags = {0}, tmp = {0};
    ivec ids = {0};
    int rc = partition(t, text, len, 1, &frags, &tmp);
    size_t from = 0, to = 0; /* the stretch read as plain text so far */
    int have = 0;
    for (size_t k = 0; !rc && k <= frags.n; k++) {
        frag fr = k < frags.n ? frags.v[k] : (frag){TOK_NULL, len, 0};
        int marker = k < frags.n && fr.id != TOK_NULL && !special_active(t, fr.id, 0) &&
                     !meets_plain(plain, n_plain, fr.off, fr.len);
        if (k < frags.n && !marker) { /* text, or a token read as text */
            if (!have) from = fr.off;
            to = fr.off + fr.len;
            have = 1;
            continue;
        }
        if (have) {
            int64_t n = tokenizer_encode(t, text + from, to - from, 0, 0, NULL, 0);
            rc = n < 0 || vec_reserve(&ids, ids.n + (size_t)n + 1) ? -1 : 0;
            if (!rc) tokenizer_encode(t, text + from, to - from, 0, 0, ids.v + ids.n, n);
            if (!rc) ids.n += (size_t)n;
            have = 0;
        }
        if (!rc && marker) rc = vec_push(&ids, fr.id);
    }
    free(frags.v);
    free(tmp.v);
    if (!rc && out && cap > 0 && ids.n > 0)
        memcpy(out, ids.v, (size_t)((int64_t)ids.n < cap ? (int64_t)ids.n : cap) * sizeof *out);
    free(ids.v);
    return rc ? -1 : (int64_t)ids.n;
}

/* ------------------------------------------------------------------------- */
/* pieces and detokenization                                                 */

int tokenizer_piece(const tokenizer *t, int32_t id, int render_special, char *buf, size_t cap) {
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    if (!render_special && (t->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL))) return 0;
    size_t n = t->piece_len[id];
    if (buf && cap) memcpy(buf, t->piece_blob + t->piece_off[id], n < cap ? n : cap);
    return (int)n;
}

/* Emits complete sequences of in[0, n) into out, replacing each maximal invalid
 * subpart by U+FFFD; returns how many input bytes were consumed (the rest is a
 * cut-short sequence unless final). */
static size_t utf8_sanitize(const char *in, size_t n, int final, char *out, size_t cap,
                            size_t *wrote) {
    size_t i = 0, o = *wrote;
    while (i < n) {
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)in + i, n - i, &cp);
        const char *src = in + i;
        size_t sl = (size_t)l;
        if (l == 0 && !final) break;
        if (l <= 0) {
            /* maximal subpart: the lead byte plus continuation bytes that
             * still fit a valid sequence */
            size_t k = 1;
            unsigned char c = (unsigned char)in[i];
            size_t want = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                        : (c >= 0xF0 && c <= 0xF4) ? 4 : 1;
            while (k < want && i + k < n) {
                unsigned char d = (unsigned char)in[i + k];
                if ((d & 0xC0) != 0x80) break;
                if (k == 1 && ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) ||
                               (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F)))
                    break;
                k++;
            }
            src = "\xef\xbf\xbd";
            sl = 3;
            if (o + sl > cap) break;
            memcpy(out + o, src, sl);
            o += sl;
            i += k;
            continue;
        }
        if (o + sl > cap) break;
        memcpy(out + o, src, sl);
        o += sl;
        i += sl;
    }
    *wrote = o;
    return i;
}

size_t detok_push(const tokenizer *t, detok_state *st, int32_t id, int render_special, char *out,
                  size_t cap) {
    if (!t || !st || id < 0 || id >= t->n_vocab) return 0;
    const char *pc = t->piece_blob + t->piece_off[id];
    size_t pn = t->piece_len[id];
    if (!render_special && (t->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL))) pn = 0;
    if (!st->leading_space_done) {
        st->leading_space_done = 1;
        if (t->add_space_prefix && pn > 0 && pc[0] == ' ') pc++, pn--;
    }
    if (st->n_pending < 0 || st->n_pending > (int)sizeof st->pending) st->n_pending = 0;
    size_t np = (size_t)st->n_pending, total = np + pn;
    char stackbuf[512];
    char *buf = total <= sizeof stackbuf ? stackbuf : malloc(total);
    if (!buf) return 0;
    memcpy(buf, st->pending, np);
    if (pn) memcpy(buf + np, pc, pn);
    size_t wrote = 0;
    size_t used = utf8_sanitize(buf, total, 0, out, cap, &wrote);
    /* what is left is a cut-short sequence (<= 3 bytes), unless out ran out of
     * room: then the caller's buffer was too small and the excess is dropped */
    size_t rest = total - used;
    if (rest > 3) rest = 0;
    memcpy(st->pending, buf + used, rest);
    st->n_pending = (int)rest;
    if (buf != stackbuf) free(buf);
    return wrote;
}

size_t tokenizer_utf8_clean(const char *in, size_t n, char *out, size_t cap) {
    size_t wrote = 0;
    utf8_sanitize(in, n, 1, out, cap, &wrote);
    return wrote;
}

size_t detok_flush(detok_state *st, char *out, size_t cap) {
    if (!st || st->n_pending <= 0) return 0;
    size_t wrote = 0;
    utf8_sanitize(st->pending, (size_t)st->n_pending, 1, out, cap, &wrote);
    st->n_pending = 0;
    return wrote;
}

/* ------------------------------------------------------------------------- */
/* streaming                                                                 */

struct tok_stream {
    const tokenizer *t;
    int add_special, parse_special;
    int started, broken, finished;
    int cont;    /* pending text starts inside a raw fragment */
    bbuf pend;   /* complete UTF-8 not yet tokenized */
    tok_run run0; /* the run of one class where pend starts */
    tok_run run;  /* ... and where its first `scanned` bytes end */
    size_t scanned;
    size_t retry_at; /* after a feed that could cut nothing, wait for this much pending text */
    char part[4];
    int npart;   /* bytes of a cut-short UTF-8 sequence */
    work w;
};

tok_stream *tok_stream_new(const tokenizer *t, int add_special, int parse_special) {
    if (!t) return NULL;
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->add_special = add_special;
    s->parse_special = parse_special;
    s->run0 = s->run = (tok_run){.cls = -1};
    return s;
}

tok_stream *tok_stream_resume(const tokenizer *t, int add_special, int parse_special, const tok_resume *at) {
    tok_stream *s = tok_stream_new(t, add_special, parse_special);
    if (s) {
        s->started = 1;
        s->cont = at->cont ? 1 : 0;
        s->run0 = s->run = at->run;
    }
    return s;
}

size_t tok_stream_held(const tok_stream *s, char *buf, size_t cap, tok_resume *at) {
    size_t n = s->pend.n + (size_t)s->npart;
    if (buf && cap >= n) {
        if (s->pend.n) memcpy(buf, s->pend.p, s->pend.n);
        memcpy(buf + s->pend.n, s->part, (size_t)s->npart);
    }
    if (at) *at = (tok_resume){.cont = s->cont, .run = s->run0};
    return n;
}

/* Drops the first n pending bytes (tokenized), keeping the run state where
 * pend starts: after a TOK_RUN_CUT cut it is the scan's, else the bytes are
 * scanned again (each byte is scanned at most twice). */
static void pend_drop(tok_stream *s, size_t n, int at_run_cut) {
    if (at_run_cut) {
        s->run0 = s->run;
    } else {
        size_t ignored;
        next_run_cut(s->pend.p, n, &s->run0, &ignored); /* (no cut inside: the scan found none) */
    }
    memmove(s->pend.p, s->pend.p + n, s->pend.n - n);
    s->pend.n -= n;
    s->scanned -= n;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->pend.p);
    work_free(&s->w);
    free(s);
}

static int append_ids(const ivec *src, int32_t **ids, size_t *n_ids) {
    if (!src->n) return 0;
    int32_t *nv = xrealloc(*ids, (*n_ids + src->n) * sizeof *nv);
    if (!nv) return -1;
    memcpy(nv + *n_ids, src->v, src->n * sizeof *nv);
    *ids = nv;
    *n_ids += src->n;
    return 0;
}

int tok_stream_feed(tok_stream *s, const char *bytes, size_t n, int final, int32_t **ids,
                    size_t *n_ids) {
    if (!s || s->broken || s->finished || (!bytes && n) || !ids || !n_ids) return -1;
    const tokenizer *t = s->t;
    pthread_once(&g_uflags_once, uflags_init);
    /* complete the cut-short sequence, then take the valid prefix */
    size_t i = 0;
    while (s->npart > 0 && i < n) {
        s->part[s->npart++] = bytes[i++];
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)s->part, (size_t)s->npart, &cp);
        if (l < 0) goto bad;
        if (l > 0) {
            if (bbuf_add(&s->pend, s->part, (size_t)l)) goto bad;
            s->npart = 0;
        }
    }
    if (i < n) {
        int badseq = 0;
        size_t ok = utf8_valid_prefix(bytes + i, n - i, &badseq);
        if (badseq) goto bad;
        if (bbuf_add(&s->pend, bytes + i, ok)) goto bad;
        size_t rest = n - i - ok;
        memcpy(s->part, bytes + i + ok, rest);
        s->npart = (int)rest;
    }
    if (final && s->npart) goto bad;

    ivec out = {0};
    if (!s->started) {
        s->started = 1;
        if (s->add_special && t->add_bos && t->bos != TOK_NULL && vec_push(&out, t->bos)) goto oom;
    }
    /* a run of one class reaching TOK_RUN_CUT bytes ends a part: tokenized whole */
    size_t cut = 0;
    while (s->pend.n > s->scanned && next_run_cut(s->pend.p + s->scanned, s->pend.n - s->scanned, &s->run, &cut)) {
        cut += s->scanned;
        if (encode_core(t, &s->w, s->pend.p, cut, s->parse_special, s->cont, 0, &out, NULL, NULL)) goto oom;
        s->scanned = cut;
        pend_drop(s, cut, 1);
        s->cont = 1;
        s->retry_at = 0;
    }
    s->scanned = s->pend.n;
    cut = 0;
    int in_raw = 0;
    /* Text without a settled boundary (a long word, a run of spaces: at most
     * TOK_RUN_CUT bytes of one class) would be re-scanned on every feed: after
     * a fruitless attempt, wait until the pending text has grown
     * geometrically, keeping the total work linear. */
    if (s->pend.n && (final || s->pend.n >= s->retry_at)) {
        if (encode_core(t, &s->w, s->pend.p, s->pend.n, s->parse_special, s->cont, !final, &out,
                        &cut, &in_raw))
            goto oom;
        s->retry_at = cut > 0 ? 0 : s->pend.n + (s->pend.n / 2 > 1 ? s->pend.n / 2 : 1);
    }
    if (cut > 0) {
        s->cont = in_raw;
        pend_drop(s, cut, 0);
    }
    if (final) {
        s->finished = 1;
        if (s->add_special && t->add_eos && t->eos != TOK_NULL && vec_push(&out, t->eos)) goto oom;
    }
    if (append_ids(&out, ids, n_ids)) goto oom;
    free(out.v);
    return 0;
oom:
    free(out.v);
bad:
    s->broken = 1;
    return -1;
}
