/* Token sampling and stop strings.
 *
 * Pipeline of sampler_sample (logits[] is scratch):
 *   NaN -> -inf, +inf -> FLT_MAX
 *   -> logit_bias (added; -INFINITY bans)
 *   -> repetition penalty (llama.cpp: over the last repeat_last_n accepted
 *      tokens, logit > 0 divided by it, logit <= 0 multiplied)
 *   -> presence/frequency penalties (OpenAI: logit -= count * frequency +
 *      (count > 0) * presence, same window)
 *   -> log-softmax: the reported logprobs
 *   -> temperature <= 0 (or negative: documented as greedy): argmax, ties to
 *      the lowest id; otherwise logits / temperature
 *   -> top_k -> top_p (smallest prefix of the sorted, renormalised candidates
 *      whose mass reaches top_p; at least one) -> min_p (keep p >= min_p * p_max)
 *   -> one draw from the seeded PRNG (xoshiro256** seeded by splitmix64).
 *
 * Determinism: the token choice uses only IEEE-754 double arithmetic (+ - * /,
 * comparisons, integer conversion) and our own exp (det_exp, table + polynomial,
 * relative error < 1e-15), no libm transcendental, so the same seed and logits
 * give the same token on every IEEE-754 machine (C11 mode compiles with FP
 * contraction off; -ffast-math is not supported). Logprobs add one libm log().
 *
 * Cost per call: a few O(V) passes. top_k <= 1024: one pass with a heap of
 * top_k entries; larger top_k: quickselect (O(V)) + sort of the k. top_p
 * without top_k ranks the best 64, then 1088 candidates by selection, and only
 * for a flat distribution radix-sorts the rest, so a peaked distribution never
 * sorts the vocabulary. */
#include "sample.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

sample_params sample_params_default(void) {
    sample_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 0;
    p.bias = NULL;
    p.n_bias = 0;
    p.n_top_logprobs = 0;
    return p;
}

/* ---- PRNG: splitmix64 seeding xoshiro256** ------------------------------------ */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* exp(x) for x <= 0 with double arithmetic only (bit-identical everywhere):
 * x = (64 e + j) ln2/64 + r with |r| <= ln2/128; exp(x) = 2^e * 2^(j/64) * p(r),
 * p a degree-5 Taylor polynomial (relative error < 1e-16 + table rounding). */
static const double exp2_64th[64] = {
    0x1.0000000000000p+0, 0x1.02c9a3e778061p+0, 0x1.059b0d3158574p+0,
    0x1.0874518759bc8p+0, 0x1.0b5586cf9890fp+0, 0x1.0e3ec32d3d1a2p+0,
    0x1.11301d0125b51p+0, 0x1.1429aaea92de0p+0, 0x1.172b83c7d517bp+0,
    0x1.1a35beb6fcb75p+0, 0x1.1d4873168b9aap+0, 0x1.2063b88628cd6p+0,
    0x1.2387a6e756238p+0, 0x1.26b4565e27cddp+0, 0x1.29e9df51fdee1p+0,
    0x1.2d285a6e4030bp+0, 0x1.306fe0a31b715p+0, 0x1.33c08b26416ffp+0,
    0x1.371a7373aa9cbp+0, 0x1.3a7db34e59ff7p+0, 0x1.3dea64c123422p+0,
    0x1.4160a21f72e2ap+0, 0x1.44e086061892dp+0, 0x1.486a2b5c13cd0p+0,
    0x1.4bfdad5362a27p+0, 0x1.4f9b2769d2ca7p+0, 0x1.5342b569d4f82p+0,
    0x1.56f4736b527dap+0, 0x1.5ab07dd485429p+0, 0x1.5e76f15ad2148p+0,
    0x1.6247eb03a5585p+0, 0x1.6623882552225p+0, 0x1.6a09e667f3bcdp+0,
    0x1.6dfb23c651a2fp+0, 0x1.71f75e8ec5f74p+0, 0x1.75feb564267c9p+0,
    0x1.7a11473eb0187p+0, 0x1.7e2f336cf4e62p+0, 0x1.82589994cce13p+0,
    0x1.868d99b4492edp+0, 0x1.8ace5422aa0dbp+0, 0x1.8f1ae99157736p+0,
    0x1.93737b0cdc5e5p+0, 0x1.97d829fde4e50p+0, 0x1.9c49182a3f090p+0,
    0x1.a0c667b5de565p+0, 0x1.a5503b23e255dp+0, 0x1.a9e6b5579fdbfp+0,
    0x1.ae89f995ad3adp+0, 0x1.b33a2b84f15fbp+0, 0x1.b7f76f2fb5e47p+0,
    0x1.bcc1e904bc1d2p+0, 0x1.c199bdd85529cp+0, 0x1.c67f12e57d14bp+0,
    0x1.cb720dcef9069p+0, 0x1.d072d4a07897cp+0, 0x1.d5818dcfba487p+0,
    0x1.da9e603db3285p+0, 0x1.dfc97337b9b5fp+0, 0x1.e502ee78b3ff6p+0,
    0x1.ea4afa2a490dap+0, 0x1.efa1bee615a27p+0, 0x1.f50765b6e4540p+0,
    0x1.fa7c1819e90d8p+0,
};

static inline double det_exp(double x) {
    if (!(x > -708.0)) return 0.0; /* < 3.3e-308; also -inf and NaN */
    if (x > 0.0) x = 0.0;
    const double ln2_64_hi = 0x1.62e42ff000000p-7, ln2_64_lo = -0x1.718432a1b0e26p-41;
    double z = x * 0x1.71547652b82fep+6 + 0.5; /* k = floor(x * 64/ln2 + 0.5) <= 0 */
    int64_t k = (int64_t)z;                     /* truncation toward zero */
    if ((double)k > z) k--;
    double kd = (double)k;
    double r = (x - kd * ln2_64_hi) - kd * ln2_64_lo;
    double p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120)))));
    int64_t e = -((-k + 63) / 64); /* floor(k / 64) for k <= 0 */
    int j = (int)(k - e * 64);
    union {
        uint64_t u;
        double d;
    } two_e = {.u = (uint64_t)(1023 + e) << 52};
    return p * exp2_64th[j] * two_e.d;
}

/* ---- sampler ---------------------------------------------------------------------- */

struct sampler {
    sample_params p;
    logit_bias *bias;
    int32_t n_vocab;
    uint64_t rng[4];
    int penalties;   /* any penalty active (and a window) */
    int32_t *hist;   /* penalty window: ring of cap (or growing when repeat_last_n == -1) */
    size_t hist_cap, hist_len, hist_head;
    int32_t *count;  /* occurrences of each token in the window */
    int32_t *idx;    /* scratch: candidate ids */
    double *w;       /* scratch: sampling weights by token id */
    uint32_t *rkey;  /* radix sort scratch (3 * n_vocab words), allocated on first use */
};

static int finite_f(float x) { return isfinite(x) != 0; }

sampler *sampler_new(const sample_params *p, int32_t n_vocab, char *err, size_t errlen) {
    if (!p) {
        set_err(err, errlen, "no sampling parameters");
        return NULL;
    }
    if (n_vocab <= 0) {
        set_err(err, errlen, "vocabulary size must be positive (got %d)", (int)n_vocab);
        return NULL;
    }
    /* temperature < 0 is accepted and means greedy, like 0 */
    if (isnan(p->temperature) || isinf(p->temperature)) {
        set_err(err, errlen, "temperature must be a finite number");
        return NULL;
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        set_err(err, errlen, "top_p must be in (0, 1] (got %g)", (double)p->top_p);
        return NULL;
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        set_err(err, errlen, "min_p must be in [0, 1] (got %g)", (double)p->min_p);
        return NULL;
    }
    if (!(finite_f(p->repeat_penalty) && p->repeat_penalty > 0.0f)) {
        set_err(err, errlen, "repeat_penalty must be a positive number (got %g)",
                (double)p->repeat_penalty);
        return NULL;
    }
    if (p->repeat_last_n < -1) {
        set_err(err, errlen, "repeat_last_n must be -1 (whole history), 0 (off) or positive (got %d)",
                (int)p->repeat_last_n);
        return NULL;
    }
    if (!finite_f(p->presence_penalty) || !finite_f(p->frequency_penalty)) {
        set_err(err, errlen, "presence_penalty and frequency_penalty must be finite numbers");
        return NULL;
    }
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > SAMPLE_MAX_TOP_LOGPROBS) {
        set_err(err, errlen, "n_top_logprobs must be in 0..%d (got %d)", SAMPLE_MAX_TOP_LOGPROBS,
                (int)p->n_top_logprobs);
        return NULL;
    }
    if (p->n_bias > 0 && !p->bias) {
        set_err(err, errlen, "logit_bias: %zu entries but no array", p->n_bias);
        return NULL;
    }
    for (size_t i = 0; i < p->n_bias; i++) {
        if (p->bias[i].token < 0 || p->bias[i].token >= n_vocab) {
            set_err(err, errlen, "logit_bias: token %d is out of range (vocabulary has %d tokens)",
                    (int)p->bias[i].token, (int)n_vocab);
            return NULL;
        }
        float b = p->bias[i].bias;
        if (isnan(b) || b == INFINITY) {
            set_err(err, errlen, "logit_bias: bias of token %d must be a number or -infinity",
                    (int)p->bias[i].token);
            return NULL;
        }
    }

    sampler *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->p = *p;
    s->n_vocab = n_vocab;
    if (p->n_bias) {
        s->bias = malloc(p->n_bias * sizeof *s->bias);
        if (!s->bias) goto oom;
        memcpy(s->bias, p->bias, p->n_bias * sizeof *s->bias);
    }
    s->p.bias = s->bias;
    s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
    s->w = malloc((size_t)n_vocab * sizeof *s->w);
    if (!s->idx || !s->w) goto oom;
    s->penalties = p->repeat_last_n != 0 && (p->repeat_penalty != 1.0f ||
                                             p->presence_penalty != 0.0f ||
                                             p->frequency_penalty != 0.0f);
    if (s->penalties) {
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
        s->hist_cap = p->repeat_last_n > 0 ? (size_t)p->repeat_last_n : 256;
        s->hist = malloc(s->hist_cap * sizeof *s->hist);
        if (!s->count || !s->hist) goto oom;
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    return s;
oom:
    sampler_free(s);
    set_err(err, errlen, "out of memory creating the sampler");
    return NULL;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->hist);
    free(s->count);
    free(s->idx);
    free(s->w);
    free(s->rkey);
    free(s);
}

void sampler_accept(sampler *s, int32_t token) {
    if (!s || !s->penalties || token < 0 || token >= s->n_vocab) return;
    if (s->p.repeat_last_n > 0) {
        size_t cap = s->hist_cap;
        if (s->hist_len == cap) { /* evict the oldest */
            s->count[s->hist[s->hist_head]]--;
            s->hist[s->hist_head] = token;
            s->hist_head = (s->hist_head + 1) % cap;
        } else {
            s->hist[(s->hist_head + s->hist_len) % cap] = token;
            s->hist_len++;
        }
    } else { /* whole history */
        if (s->hist_len == s->hist_cap) {
            size_t cap = s->hist_cap * 2;
            int32_t *h = realloc(s->hist, cap * sizeof *h);
            if (!h) return; /* keeps the history so far */
            s->hist = h;
            s->hist_cap = cap;
        }
        s->hist[s->hist_len++] = token;
    }
    s->count[token]++;
}

void sampler_accept_history(sampler *dst, const sampler *src) {
    if (!src || !src->penalties) return;
    for (size_t i = 0; i < src->hist_len; i++) sampler_accept(dst, src->hist[(src->hist_head + i) % src->hist_cap]);
}

static void apply_penalties(sampler *s, float *logits) {
    const float rp = s->p.repeat_penalty, fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
    for (size_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        int32_t c = s->count[t];
        if (c <= 0) continue; /* already done (marked negative) */
        float l = logits[t];
        if (rp != 1.0f) l = l <= 0.0f ? l * rp : l / rp;
        l -= (float)c * fp + (c > 0 ? pp : 0.0f);
        logits[t] = l + 0.0f; /* no -0: equal logits must have equal sort keys */
        s->count[t] = -c;
    }
    for (size_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        if (s->count[t] < 0) s->count[t] = -s->count[t];
    }
}

/* a ranks before b: higher logit, then lower id (a total order) */
static int before(const float *l, int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

static void sift_down(int32_t *v, size_t n, size_t i, const float *l) {
    /* heap whose root is the element ranked last */
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && before(l, v[c], v[c + 1])) c++;
        if (!before(l, v[i], v[c])) return;
        int32_t t = v[i];
        v[i] = v[c];
        v[c] = t;
        i = c;
    }
}

/* sorts v[0..n) best first (heapsort: O(n log n), no recursion) */
static void sort_ranked(int32_t *v, size_t n, const float *l) {
    if (n < 2) return;
    for (size_t i = n / 2; i-- > 0;) sift_down(v, n, i, l);
    for (size_t end = n - 1; end > 0; end--) {
        int32_t t = v[0];
        v[0] = v[end];
        v[end] = t;
        sift_down(v, end, 0, l);
    }
}

/* Partial selection: afterwards v[0..k) holds the k best of v[0..n) (any order)
 * and v[k..n) the rest. Quickselect with median-of-three, falling back to a
 * heapsort when it degenerates. */
static void select_top(int32_t *v, size_t n, size_t k, const float *l) {
    if (k == 0 || k >= n) return;
    size_t lo = 0, hi = n; /* the k-th boundary lies in [lo, hi) */
    int budget = 64;
    while (hi - lo > 16) {
        if (budget-- == 0) {
            sort_ranked(v + lo, hi - lo, l);
            return;
        }
        size_t mid = lo + (hi - lo) / 2;
        int32_t a = v[lo], b = v[mid], c = v[hi - 1], pivot;
        if (before(l, a, b)) pivot = before(l, b, c) ? b : (before(l, a, c) ? c : a);
        else pivot = before(l, a, c) ? a : (before(l, b, c) ? c : b);
        /* three-way is unnecessary: the order is total, the pivot is unique */
        size_t i = lo, j = hi - 1;
        for (;;) {
            while (before(l, v[i], pivot)) i++;
            while (before(l, pivot, v[j])) j--;
            if (i >= j) break;
            int32_t t = v[i];
            v[i] = v[j];
            v[j] = t;
            i++, j--;
        }
        /* v[lo..j] ranks before-or-equal pivot, v[j+1..hi) after-or-equal */
        if (k <= j) hi = j + 1;
        else lo = j + 1;
        if (lo >= k || hi <= k) return;
    }
    sort_ranked(v + lo, hi - lo, l);
}

/* Order key: smaller key = ranks first (higher logit). -0.0 was turned into
 * +0.0 before, so equal logits have equal keys. */
static uint32_t rank_key(float f) {
    union {
        float f;
        uint32_t u;
    } c = {.f = f};
    uint32_t asc = (c.u & 0x80000000u) ? ~c.u : (c.u | 0x80000000u);
    return ~asc;
}

/* Sorts v[0..n) (ids in ascending order on entry) by rank: LSD radix sort on
 * the 32-bit keys, stable, so equal logits stay in id order. 0, or -1 when the
 * scratch cannot be allocated. */
static int radix_rank(sampler *s, int32_t *v, size_t n, const float *l) {
    if (!s->rkey) {
        s->rkey = malloc((size_t)s->n_vocab * 3 * sizeof *s->rkey);
        if (!s->rkey) return -1;
    }
    uint32_t *key = s->rkey, *key2 = key + s->n_vocab;
    int32_t *v2 = (int32_t *)(key2 + s->n_vocab);
    for (size_t i = 0; i < n; i++) key[i] = rank_key(l[v[i]]);
    static const int shift[3] = {0, 11, 22};
    for (int pass = 0; pass < 3; pass++) {
        size_t cnt[2048] = {0};
        const int sh = shift[pass];
        for (size_t i = 0; i < n; i++) cnt[(key[i] >> sh) & 2047]++;
        size_t sum = 0;
        for (int b = 0; b < 2048; b++) {
            size_t c = cnt[b];
            cnt[b] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) {
            size_t o = cnt[(key[i] >> sh) & 2047]++;
            key2[o] = key[i];
            v2[o] = v[i];
        }
        /* swap roles: results of this pass become the input of the next */
        for (size_t i = 0; i < n; i++) key[i] = key2[i], v[i] = v2[i];
    }
    return 0;
}

/* Draws the token for temperature > 0. l[] holds the penalised logits and
 * lmax their maximum (finite). */
static int32_t sample_dist(sampler *s, const float *l, float lmax) {
    const double inv_t = 1.0 / (double)s->p.temperature;
    const double m = (double)lmax;
    int32_t *v = s->idx;
    double *w = s->w; /* by token id: exp((l - lmax) / T), 1 for the best */
    size_t n = 0, k;
    int sorted = 0; /* v[0..k) sorted best first */
    size_t n_sorted = 0;
    if (s->p.top_k > 0 && s->p.top_k <= 1024) {
        /* one pass keeping the top_k best in a heap whose root ranks last; a
         * later id ranks after an equal logit, so one compare rejects most */
        const size_t want = (size_t)s->p.top_k;
        for (int32_t i = 0; i < s->n_vocab; i++) {
            if (!(l[i] > -INFINITY)) continue;
            if (n < want) {
                size_t c = n++;
                v[c] = i;
                while (c > 0 && before(l, v[(c - 1) / 2], v[c])) { /* sift up */
                    int32_t t = v[c];
                    v[c] = v[(c - 1) / 2];
                    v[(c - 1) / 2] = t;
                    c = (c - 1) / 2;
                }
            } else if (l[i] > l[v[0]]) {
                v[0] = i;
                sift_down(v, n, 0, l);
            }
        }
        k = n;
        sort_ranked(v, k, l);
        sorted = 1;
        n_sorted = k;
    } else {
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (l[i] > -INFINITY) v[n++] = i;
        k = n;
        if (s->p.top_k > 0 && (size_t)s->p.top_k < n) {
            k = (size_t)s->p.top_k;
            select_top(v, n, k, l);
            sort_ranked(v, k, l);
            sorted = 1;
            n_sorted = k;
        }
    }
    for (size_t i = 0; i < k; i++) w[v[i]] = det_exp(((double)l[v[i]] - m) * inv_t);
    if (s->p.top_p < 1.0f) {
        double z = 0.0;
        for (size_t i = 0; i < k; i++) z += w[v[i]];
        const double target = (double)s->p.top_p * z;
        double cum = 0.0;
        size_t keep = 0, chunk = 64;
        for (;;) {
            if (keep == n_sorted) { /* rank more candidates */
                if (chunk <= 1024) {
                    size_t want = n_sorted + chunk < k ? n_sorted + chunk : k;
                    select_top(v + n_sorted, k - n_sorted, want - n_sorted, l);
                    sort_ranked(v + n_sorted, want - n_sorted, l);
                    n_sorted = want;
                    chunk *= 16;
                } else { /* a flat distribution: rank all the rest at once */
                    size_t m = n_sorted;
                    int32_t last = v[n_sorted - 1];
                    for (int32_t i = 0; i < s->n_vocab; i++) /* the rest, in id order */
                        if (l[i] > -INFINITY && before(l, last, i)) v[m++] = i;
                    if (radix_rank(s, v + n_sorted, k - n_sorted, l) != 0)
                        sort_ranked(v + n_sorted, k - n_sorted, l);
                    n_sorted = k;
                }
            }
            cum += w[v[keep]];
            keep++;
            if (cum >= target || keep == k) break;
        }
        k = keep;
        sorted = 1;
    }
    if (s->p.min_p > 0.0f) {
        /* p >= min_p * p_max  <=>  w >= min_p (w of the best is 1) */
        const double mp = (double)s->p.min_p;
        if (sorted) {
            size_t keep = 1;
            while (keep < k && w[v[keep]] >= mp) keep++;
            k = keep;
        } else {
            size_t o = 0;
            for (size_t i = 0; i < k; i++)
                if (w[v[i]] >= mp) v[o++] = v[i];
            k = o;
        }
    }
    double total = 0.0;
    for (size_t i = 0; i < k; i++) total += w[v[i]];
    const double u = rng_uniform(s->rng) * total;
    double cum = 0.0;
    for (size_t i = 0; i < k; i++) {
        cum += w[v[i]];
        if (u < cum) return v[i];
    }
    /* rounding left u at the very end: the last candidate with weight */
    for (size_t i = k; i-- > 0;)
        if (w[v[i]] > 0.0) return v[i];
    return v[0];
}

/* NaN -> -inf, +inf -> FLT_MAX, -0 -> +0. */
static inline float sanitize(float x) {
    x = x != x ? -INFINITY : x;
    x = x > FLT_MAX ? FLT_MAX : x;
    return x + 0.0f;
}

/* The passes over the whole vocabulary run on four lanes at a time (GCC's
 * vector extensions; element i in lane i % 4), which -O2 does not do for
 * these loops by itself: a greedy token of eight batched sequences costs a
 * few microseconds, not the ~50 the scalar passes took on the engine thread
 * while the workers waited. The results do not depend on the lanes. */
enum { LANES = 4 };
typedef float lanes_f __attribute__((vector_size(4 * LANES)));
typedef int32_t lanes_i __attribute__((vector_size(4 * LANES)));

/* mask ? a : b, lane by lane (a macro: vector arguments would change the ABI) */
#define SELECT_F(mask, a, b) ((lanes_f)(((lanes_i)(a) & (mask)) | ((lanes_i)(b) & ~(mask))))

/* Sanitises l[0..n) (sanitize above) and returns the largest value and the
 * lowest index holding it, in one pass. */
static float sanitize_max(float *l, int32_t n, int32_t *at) {
    const lanes_f zero = {0}, ninf = zero - INFINITY, big = zero + FLT_MAX;
    const lanes_i izero = {0};
    lanes_f m = ninf;
    lanes_i idx = izero - 1, lane_i = {0, 1, 2, 3};
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES, lane_i += LANES) {
        lanes_f x;
        memcpy(&x, l + i, sizeof x);
        x = SELECT_F(x != x, ninf, x);
        x = SELECT_F(x > big, big, x);
        x = x + 0.0f;
        memcpy(l + i, &x, sizeof x);
        const lanes_i gt = x > m; /* strictly greater: each lane keeps its first maximum */
        m = SELECT_F(gt, x, m);
        idx = (lane_i & gt) | (idx & ~gt);
    }
    float best = -INFINITY;
    int32_t best_i = -1;
    for (int k = 0; k < LANES; k++)
        if (m[k] > best || (m[k] == best && idx[k] < best_i)) best = m[k], best_i = idx[k];
    for (; i < n; i++) {
        l[i] = sanitize(l[i]);
        if (l[i] > best) best = l[i], best_i = i;
    }
    *at = best_i;
    return best;
}

/* The maximum after logit_bias and penalties changed a few tokens: only they
 * can have risen above it; a full pass only when the old best itself
 * changed. */
static float max_after_changes(const sampler *s, float *l, float lmax, int32_t *best) {
    if (*best < 0 || l[*best] != lmax) return sanitize_max(l, s->n_vocab, best); /* no NaNs left: only finds the maximum */
    for (size_t i = 0; i < s->p.n_bias; i++) {
        const int32_t t = s->bias[i].token;
        if (l[t] > lmax || (l[t] == lmax && t < *best)) lmax = l[t], *best = t;
    }
    for (size_t i = 0; s->penalties && i < s->hist_len; i++) {
        const int32_t t = s->hist[i];
        if (l[t] > lmax || (l[t] == lmax && t < *best)) lmax = l[t], *best = t;
    }
    return lmax;
}

/* lp for token under logits (log-softmax; lmax their largest), with the n_top likeliest. */
static void fill_logprobs(const float *logits, int32_t nv, float lmax, int32_t token, int32_t want,
                          sample_logprobs *lp) {
    double z = 0.0;
    for (int32_t i = 0; i < nv; i++) z += det_exp((double)logits[i] - (double)lmax);
    const double logz = log(z);
    memset(lp, 0, sizeof *lp);
    lp->token = token;
    lp->logprob = (float)((double)logits[token] - (double)lmax - logz);
    int32_t n = 0;
    int32_t *top = lp->top_tokens;
    if (want > SAMPLE_MAX_TOP_LOGPROBS) want = SAMPLE_MAX_TOP_LOGPROBS;
    if (want > 0) {
        for (int32_t i = 0; i < nv; i++) {
            if (!(logits[i] > -INFINITY)) continue;
            if (n == want && !before(logits, i, top[n - 1])) continue;
            int32_t j = n < want ? n++ : n - 1;
            while (j > 0 && before(logits, i, top[j - 1])) {
                top[j] = top[j - 1];
                j--;
            }
            top[j] = i;
        }
        for (int32_t j = 0; j < n; j++) lp->top_logprobs[j] = (float)((double)logits[top[j]] - (double)lmax - logz);
    }
    lp->n_top = n;
}

int32_t sampler_sample(sampler *s, float *logits, sample_logprobs *lp) {
    const int32_t nv = s->n_vocab;
    int32_t best; /* the lowest id with the maximum */
    float lmax = sanitize_max(logits, nv, &best);
    for (size_t i = 0; i < s->p.n_bias; i++) {
        float x = logits[s->bias[i].token] + s->bias[i].bias;
        logits[s->bias[i].token] = (x > FLT_MAX ? FLT_MAX : x) + 0.0f;
    }
    if (s->penalties) apply_penalties(s, logits);
    if (s->p.n_bias || s->penalties) lmax = max_after_changes(s, logits, lmax, &best);
    if (!(lmax > -INFINITY)) { /* every token banned */
        if (lp) {
            memset(lp, 0, sizeof *lp);
            lp->token = -1;
            lp->logprob = -INFINITY;
        }
        return -1;
    }

    int32_t tok = s->p.temperature <= 0.0f ? best : sample_dist(s, logits, lmax);
    if (lp) fill_logprobs(logits, nv, lmax, tok, s->p.n_top_logprobs, lp);
    return tok;
}

void sample_logprobs_of(float *logits, int32_t n_vocab, int32_t token, int32_t n_top, sample_logprobs *lp) {
    int32_t best;
    fill_logprobs(logits, n_vocab, sanitize_max(logits, n_vocab, &best), token, n_top, lp);
}

/* ---- stop strings --------------------------------------------------------------------- */

struct stop_matcher {
    char **stops;
    size_t *lens;
    size_t n;
    char *buf; /* emitted bytes of the last call, then the held-back bytes */
    size_t len, cap;
    size_t held; /* bytes at the end of buf not emitted yet */
    int stopped;
    char *guard;    /* stop strings apply only before it (NULL: everywhere) */
    size_t guard_len;
    int guarded;    /* the guard came: nothing more is matched */
};

stop_matcher *stop_matcher_new(const char *const *stops, size_t n_stops, const char *guard) {
    stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (guard && *guard) {
        m->guard = strdup(guard);
        if (!m->guard) goto oom;
        m->guard_len = strlen(guard);
    }
    if (n_stops) {
        m->stops = calloc(n_stops, sizeof *m->stops);
        m->lens = calloc(n_stops, sizeof *m->lens);
        if (!m->stops || !m->lens) goto oom;
    }
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) continue; /* empty stop strings are ignored */
        size_t l = strlen(stops[i]);
        m->stops[m->n] = malloc(l + 1);
        if (!m->stops[m->n]) goto oom;
        memcpy(m->stops[m->n], stops[i], l + 1);
        m->lens[m->n] = l;
        m->n++;
    }
    return m;
oom:
    stop_matcher_free(m);
    return NULL;
}

void stop_matcher_free(stop_matcher *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->buf);
    free(m->guard);
    free(m);
}

/* Where the first stop string completes in b[0..n): the match that ends
 * first (then the longest of those), as if the text had come byte by byte, so
 * the result does not depend on how the text was split into pushes. Returns
 * its start, or n when there is none. */
static size_t find_stop(const stop_matcher *m, const char *b, size_t n) {
    size_t best_start = n, best_end = SIZE_MAX;
    for (size_t i = 0; i < m->n; i++) {
        if (m->lens[i] > n) continue;
        const char *p = memmem(b, n, m->stops[i], m->lens[i]);
        if (!p) continue;
        size_t start = (size_t)(p - b), end = start + m->lens[i];
        if (end < best_end || (end == best_end && start < best_start))
            best_start = start, best_end = end;
    }
    return best_start;
}

/* length of the longest suffix of b[0..n) that is a proper prefix of s[0..len) */
static size_t suffix_in(const char *b, size_t n, const char *s, size_t len) {
    for (size_t l = len - 1 < n ? len - 1 : n; l > 0; l--)
        if (!memcmp(b + n - l, s, l)) return l;
    return 0;
}

/* length of the longest suffix of b[0..n) that is a proper prefix of a stop string */
static size_t partial_suffix(const stop_matcher *m, const char *b, size_t n) {
    size_t best = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t max = m->lens[i] - 1 < n ? m->lens[i] - 1 : n;
        for (size_t l = max; l > best; l--)
            if (memcmp(b + n - l, m->stops[i], l) == 0) {
                best = l;
                break;
            }
    }
    return best;
}

int stop_matcher_push(stop_matcher *m, const char *text, size_t len, const char **emit,
                      size_t *n_emit) {
    *emit = "";
    *n_emit = 0;
    if (m->stopped) return 1;
    /* keep only the held-back bytes, then append */
    if (m->held && m->len > m->held) memmove(m->buf, m->buf + m->len - m->held, m->held);
    m->len = m->held;
    if (m->len + len + 1 > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap < m->len + len + 1) cap *= 2;
        char *b = realloc(m->buf, cap);
        if (!b) { /* cannot hold more: emit what we have, unmatched */
            *emit = m->buf ? m->buf : "";
            *n_emit = m->len;
            m->held = 0;
            return 0;
        }
        m->buf = b;
        m->cap = cap;
    }
    if (len) memcpy(m->buf + m->len, text, len);
    m->len += len;
    m->buf[m->len] = 0;

    *emit = m->buf;
    if (m->guarded) {
        *n_emit = m->len;
        m->held = 0;
        return 0;
    }
    /* stop strings count only before the guard: where it is, or where it may be starting */
    size_t limit = m->len;
    const char *g = m->guard ? memmem(m->buf, m->len, m->guard, m->guard_len) : NULL;
    if (g) limit = (size_t)(g - m->buf);
    else if (m->guard) limit = m->len - suffix_in(m->buf, m->len, m->guard, m->guard_len);
    size_t at = find_stop(m, m->buf, limit);
    if (at < limit) {
        *n_emit = at;
        m->held = 0;
        m->stopped = 1;
        return 1;
    }
    if (g) {
        m->guarded = 1;
        *n_emit = m->len;
        m->held = 0;
        return 0;
    }
    /* held back: a possible start of a stop string, a possible start of the
       guard, and a stop string that runs into that (it counts if the guard
       does not come after all) */
    size_t from = m->len - partial_suffix(m, m->buf, m->len);
    if (limit < from) from = limit;
    for (size_t i = 0; i < m->n && limit < m->len; i++)
        for (size_t st = limit >= m->lens[i] ? limit - m->lens[i] + 1 : 0; st < limit && st < from; st++)
            if (st + m->lens[i] <= m->len && !memcmp(m->buf + st, m->stops[i], m->lens[i])) {
                from = st;
                break;
            }
    m->held = m->len - from;
    *n_emit = from;
    return 0;
}

void stop_matcher_flush(stop_matcher *m, const char **emit, size_t *n_emit) {
    *emit = "";
    *n_emit = 0;
    if (m->stopped || !m->held) return;
    if (m->len > m->held) memmove(m->buf, m->buf + m->len - m->held, m->held);
    m->len = m->held;
    m->held = 0;
    *emit = m->buf;
    *n_emit = m->guard ? find_stop(m, m->buf, m->len) : m->len; /* the guard never came */
}
