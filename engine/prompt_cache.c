/* The prompt cache: the KV entries of recent sessionless prompts, so a
 * prompt that starts like one of them (the same system message, the same
 * conversation one turn longer, the same prompt again) reads only what
 * differs. Each entry is a pot of exactly its prompt's entries (copied out
 * of the finished generation's pot) and the prompt's tokens; a hit copies
 * the longest shared prefix into the new generation's pot. Entries are
 * immutable, so any number of generations can start from one. Least
 * recently used entries go first when the count or byte budget is exceeded.
 * Engine thread only. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

typedef struct pc_entry {
    pot *p;
    int32_t *tokens;
    size_t n;
    size_t bytes;
    uint64_t used; /* LRU clock */
} pc_entry;

struct prompt_cache {
    pc_entry *e;
    int n, max_entries;
    size_t bytes, max_bytes;
    uint64_t clock;
    int64_t hits, hit_tokens;
};

prompt_cache *prompt_cache_new(int max_entries, size_t max_bytes) {
    if (max_entries <= 0 || !max_bytes) return NULL;
    prompt_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->e = calloc((size_t)max_entries, sizeof *c->e);
    if (!c->e) {
        free(c);
        return NULL;
    }
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    return c;
}

static void drop(prompt_cache *c, int i) {
    pot_free(c->e[i].p);
    free(c->e[i].tokens);
    c->bytes -= c->e[i].bytes;
    c->e[i] = c->e[--c->n];
}

void prompt_cache_free(prompt_cache *c) {
    if (!c) return;
    while (c->n) drop(c, 0);
    free(c->e);
    free(c);
}

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

const pot *prompt_cache_find(prompt_cache *c, const int32_t *tokens, size_t n, size_t *lcp) {
    *lcp = 0;
    if (!c) return NULL;
    int best = -1;
    for (int i = 0; i < c->n; i++) {
        size_t k = common_prefix(c->e[i].tokens, c->e[i].n, tokens, n);
        if (k > *lcp) *lcp = k, best = i;
    }
    if (best < 0) return NULL;
    c->e[best].used = ++c->clock;
    c->hits++;
    c->hit_tokens += (int64_t)*lcp;
    return c->e[best].p;
}

void prompt_cache_put(prompt_cache *c, pot *p, const int32_t *tokens, size_t n) {
    if (!c || !p) return pot_free(p);
    size_t bytes = pot_bytes(p->n_layer, p->n_head_kv, p->head_dim, p->capacity, p->dtype);
    int32_t *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!copy || bytes > c->max_bytes) {
        free(copy);
        return pot_free(p);
    }
    memcpy(copy, tokens, n * sizeof *copy);
    /* an entry this one extends (or repeats) is no longer needed */
    for (int i = 0; i < c->n;)
        if (common_prefix(c->e[i].tokens, c->e[i].n, tokens, n) == c->e[i].n) drop(c, i);
        else i++;
    while (c->n && (c->n == c->max_entries || c->bytes + bytes > c->max_bytes)) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[lru].used) lru = i;
        drop(c, lru);
    }
    c->e[c->n++] = (pc_entry){.p = p, .tokens = copy, .n = n, .bytes = bytes, .used = ++c->clock};
    c->bytes += bytes;
}

void prompt_cache_stats(const prompt_cache *c, int *entries, size_t *bytes, int64_t *hits, int64_t *hit_tokens) {
    *entries = c ? c->n : 0;
    *bytes = c ? c->bytes : 0;
    *hits = c ? c->hits : 0;
    *hit_tokens = c ? c->hit_tokens : 0;
}
