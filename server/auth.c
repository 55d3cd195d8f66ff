/* API keys: loading (--api-key, keys file), constant-time checking, owner
 * tags (a key's SHA-256 prefix names it on disk, never the key itself) and
 * the per-key token-bucket rate limit. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"

/* ---- SHA-256 (FIPS 180-4) ----------------------------------------------------------- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void sha256_hex(const void *data, size_t n, char out[65]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const uint8_t *p = data;
    size_t left = n;
    for (; left >= 64; left -= 64, p += 64) sha256_block(h, p);
    uint8_t tail[128] = {0};
    memcpy(tail, p, left);
    tail[left] = 0x80;
    size_t tn = left + 9 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[tn - 1 - i] = (uint8_t)(bits >> (8 * i));
    sha256_block(h, tail);
    if (tn == 128) sha256_block(h, tail + 64);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", h[i]);
}

/* ---- keys ------------------------------------------------------------------------------ */

static int add_key(server *s, const char *key, size_t len, const char *name, size_t name_len,
                   char *err, size_t errlen) {
    if (len < 8) return snprintf(err, errlen, "api keys must be at least 8 characters"), -1;
    for (size_t i = 0; i < len; i++) /* (a browser sends a header's other bytes as Latin-1: never equal) */
        if ((unsigned char)key[i] < 0x21 || (unsigned char)key[i] > 0x7e)
            return snprintf(err, errlen, "api keys are printable ASCII without spaces"), -1;
    api_key *t = realloc(s->keys, (s->n_keys + 1) * sizeof *t);
    if (!t) return snprintf(err, errlen, "out of memory"), -1;
    s->keys = t;
    api_key *k = &s->keys[s->n_keys];
    memset(k, 0, sizeof *k);
    k->key = strndup(key, len);
    if (!k->key) return snprintf(err, errlen, "out of memory"), -1;
    char hex[65];
    sha256_hex(key, len, hex);
    memcpy(k->owner, hex, 16);
    k->owner[16] = 0;
    if (name_len >= sizeof k->name) name_len = sizeof k->name - 1;
    memcpy(k->name, name, name_len);
    k->tokens = (double)s->cfg.rate_burst;
    s->n_keys++;
    return 0;
}

int auth_load(server *s, char *err, size_t errlen) {
    memset(&s->anonymous, 0, sizeof s->anonymous);
    snprintf(s->anonymous.owner, sizeof s->anonymous.owner, "anonymous");
    s->anonymous.tokens = (double)s->cfg.rate_burst;
    if (*s->cfg.api_key && add_key(s, s->cfg.api_key, strlen(s->cfg.api_key), "default", 7, err, errlen))
        return -1;
    if (!*s->cfg.api_keys_file) return 0;
    FILE *f = fopen(s->cfg.api_keys_file, "r");
    if (!f) return snprintf(err, errlen, "api_keys_file: cannot open %s", s->cfg.api_keys_file), -1;
    char *line = NULL; /* (a whole line however long: a cut one would make two keys of one) */
    size_t cap = 0;
    int lineno = 0, rc = 0;
    while (!rc && getline(&line, &cap, f) >= 0) {
        lineno++;
        char *p = line;
        if (lineno == 1 && !strncmp(p, "\xef\xbb\xbf", 3)) p += 3; /* a UTF-8 BOM (Windows editors): not the key's */
        while (isspace((unsigned char)*p)) p++;
        if (!*p || *p == '#') continue;
        char *key = p;
        while (*p && !isspace((unsigned char)*p)) p++;
        size_t klen = (size_t)(p - key);
        while (isspace((unsigned char)*p)) p++;
        char *name = p;
        size_t nlen = strcspn(name, "#\r\n"); /* a comment may follow the name */
        while (nlen && isspace((unsigned char)name[nlen - 1])) nlen--;
        char e2[128];
        if (add_key(s, key, klen, name, nlen, e2, sizeof e2)) {
            snprintf(err, errlen, "api_keys_file %s line %d: %s", s->cfg.api_keys_file, lineno, e2);
            rc = -1;
        }
    }
    free(line);
    fclose(f);
    if (!rc && !s->n_keys) {
        snprintf(err, errlen, "api_keys_file %s holds no keys", s->cfg.api_keys_file);
        rc = -1;
    }
    return rc;
}

/* Compares in time that depends only on the lengths. */
static int same_secret(const char *a, size_t an, const char *b, size_t bn) {
    unsigned diff = (unsigned)(an ^ bn);
    for (size_t i = 0; i < an; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (bn ? bn : 1)];
    return diff == 0 && bn > 0;
}

api_key *auth_check(server *s, struct MHD_Connection *c) {
    if (!s->n_keys) return &s->anonymous;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return NULL;
    const char *given = h + 7;
    while (*given == ' ' || *given == '\t') given++;
    size_t n = strlen(given);
    while (n && (given[n - 1] == ' ' || given[n - 1] == '\t')) n--; /* not part of the value (RFC 9110 5.5) */
    api_key *found = NULL;
    for (size_t i = 0; i < s->n_keys; i++) /* every key is compared: no early exit */
        if (same_secret(given, n, s->keys[i].key, strlen(s->keys[i].key))) found = &s->keys[i];
    return found;
}

int auth_rate_limit(server *s, api_key *k) {
    double rate = s->cfg.rate_limit;
    if (rate <= 0) return 0;
    double now = monotonic_ms();
    if (k->last_ms > 0) k->tokens += (now - k->last_ms) / 1000.0 * rate;
    if (k->tokens > (double)s->cfg.rate_burst) k->tokens = (double)s->cfg.rate_burst;
    k->last_ms = now;
    if (k->tokens >= 1) {
        k->tokens -= 1;
        return 0;
    }
    int wait = (int)((1 - k->tokens) / rate + 0.999);
    return wait < 1 ? 1 : wait;
}
