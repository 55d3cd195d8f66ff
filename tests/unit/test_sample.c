/* Sampling (greedy, temperature, top_k/top_p/min_p, penalties, logit_bias,
 * seeded PRNG, logprobs) and the stop-string matcher. */
#include "test.h"

#include <stdint.h>
#include <stdlib.h>

#include "engine/sample.h"

/* deterministic test data: a small LCG, independent of the sampler's PRNG */
static uint32_t lcg_state;
static uint32_t lcg(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return lcg_state >> 8;
}
static float rnd_logit(float scale) { return ((float)(lcg() % 100000) / 100000.0f - 0.5f) * scale; }

static sampler *mk(const sample_params *p, int32_t nv) {
    char err[256] = "";
    sampler *s = sampler_new(p, nv, err, sizeof err);
    if (!s) fprintf(stderr, "  sampler_new: %s\n", err);
    CHECK(s != NULL);
    return s;
}

/* samples once from a copy of logits (sampler_sample changes its input) */
static int32_t draw(sampler *s, const float *logits, int32_t nv, sample_logprobs *lp) {
    float tmp[1024];
    float *buf = nv <= 1024 ? tmp : malloc((size_t)nv * sizeof *buf);
    memcpy(buf, logits, (size_t)nv * sizeof *buf);
    int32_t t = sampler_sample(s, buf, lp);
    if (buf != tmp) free(buf);
    return t;
}

static int32_t argmax(const float *l, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void softmax(const float *l, int32_t n, double temp, double *p) {
    double m = -INFINITY, z = 0;
    for (int32_t i = 0; i < n; i++)
        if (l[i] > m) m = l[i];
    for (int32_t i = 0; i < n; i++) z += (p[i] = exp(((double)l[i] - m) / temp));
    for (int32_t i = 0; i < n; i++) p[i] /= z;
}

/* Pearson chi-square of observed counts against probabilities (cells with
 * p == 0 must have no counts: those add +inf). */
static double chi_square(const long *obs, const double *p, int32_t n, long total) {
    double x = 0;
    for (int32_t i = 0; i < n; i++) {
        if (p[i] == 0) {
            if (obs[i]) return INFINITY;
            continue;
        }
        double e = p[i] * (double)total;
        x += ((double)obs[i] - e) * ((double)obs[i] - e) / e;
    }
    return x;
}

TEST(sample_greedy_is_argmax) {
    sample_params p = sample_params_default();
    p.temperature = 0;
    enum { V = 1000 };
    static float l[V];
    lcg_state = 1;
    sampler *s = mk(&p, V);
    for (int r = 0; r < 50; r++) {
        for (int i = 0; i < V; i++) l[i] = rnd_logit(20);
        CHECK_EQ_INT(draw(s, l, V, NULL), argmax(l, V));
    }
    /* ties go to the lowest id */
    for (int i = 0; i < V; i++) l[i] = 1.0f;
    l[700] = l[300] = l[900] = 5.0f;
    CHECK_EQ_INT(draw(s, l, V, NULL), 300);
    sampler_free(s);
    /* negative temperature is greedy too */
    p.temperature = -1.0f;
    s = mk(&p, V);
    CHECK_EQ_INT(draw(s, l, V, NULL), 300);
    sampler_free(s);
}

/* Greedy with logit_bias and penalties against a plain reference (apply
 * them to a copy, then the lowest id with the largest value): vocabularies
 * of 1..37 and 1000..1003 tokens, many ties (logits on a coarse grid), biases
 * that ban, raise or lower the best token, penalty windows over recent
 * tokens; the sampler finds the maximum once and then looks only at the
 * tokens these changed. */
TEST(sample_greedy_with_bias_and_penalties_matches_reference) {
    lcg_state = 99;
    int bad = 0;
    for (int rep = 0; rep < 3000; rep++) {
        const int32_t nv = rep % 3 ? 1 + (int32_t)(lcg() % 37) : 1000 + (int32_t)(lcg() % 4);
        float l[1003], ref[1003];
        for (int32_t i = 0; i < nv; i++) l[i] = (float)(int)(lcg() % 9) - 4.0f; /* ties */
        sample_params p = sample_params_default();
        p.temperature = 0;
        logit_bias bias[4];
        p.n_bias = lcg() % 5;
        for (size_t i = 0; i < p.n_bias; i++) {
            const float kinds[] = {-INFINITY, 3.0f, -2.0f, 0.5f, 9.0f};
            bias[i] = (logit_bias){(int32_t)(lcg() % (uint32_t)nv), kinds[lcg() % 5]};
            if (lcg() % 3 == 0) bias[i].token = argmax(l, nv); /* hit the best */
        }
        p.bias = bias;
        const int pen = lcg() % 2;
        const int raise = lcg() % 2; /* penalties below 1 / negative raise logits */
        const float rp = raise ? 0.75f : 1.5f, pp = raise ? -0.5f : 0.5f, fp = raise ? -1.0f : 0.25f;
        if (pen) {
            p.repeat_penalty = rp;
            p.presence_penalty = pp;
            p.frequency_penalty = fp;
            p.repeat_last_n = 8;
        }
        sampler *smp = mk(&p, nv);
        if (!smp) return;
        int32_t hist[12], n_hist = pen ? (int32_t)(lcg() % 12) : 0;
        for (int32_t i = 0; i < n_hist; i++) {
            hist[i] = lcg() % 2 ? argmax(l, nv) : (int32_t)(lcg() % (uint32_t)nv);
            sampler_accept(smp, hist[i]);
        }
        /* the reference: bias, then the penalties over the last 8 accepted tokens */
        memcpy(ref, l, (size_t)nv * sizeof *ref);
        for (size_t i = 0; i < p.n_bias; i++) ref[bias[i].token] += bias[i].bias;
        int32_t count[1003] = {0};
        for (int32_t i = n_hist > 8 ? n_hist - 8 : 0; i < n_hist; i++) count[hist[i]]++;
        for (int32_t t = 0; t < nv; t++)
            if (count[t]) {
                float x = ref[t] <= 0.0f ? ref[t] * rp : ref[t] / rp;
                ref[t] = x - ((float)count[t] * fp + pp);
            }
        int32_t want = -1;
        for (int32_t t = 0; t < nv; t++)
            if (ref[t] > -INFINITY && (want < 0 || ref[t] > ref[want])) want = t;
        const int32_t got = draw(smp, l, nv, NULL);
        if (got != want && bad++ < 5) fprintf(stderr, "  rep %d: nv %d got %d want %d\n", rep, nv, got, want);
        sampler_free(smp);
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(sample_seed_determinism) {
    enum { V = 50, N = 1000 };
    float l[V];
    lcg_state = 7;
    for (int i = 0; i < V; i++) l[i] = rnd_logit(4);
    sample_params p = sample_params_default();
    p.seed = 42;
    static int32_t a[N], b[N], c[N];
    sampler *s1 = mk(&p, V), *s2 = mk(&p, V);
    p.seed = 43;
    sampler *s3 = mk(&p, V);
    int same = 1, differ = 0;
    for (int i = 0; i < N; i++) {
        a[i] = draw(s1, l, V, NULL);
        b[i] = draw(s2, l, V, NULL);
        c[i] = draw(s3, l, V, NULL);
        same &= a[i] == b[i];
        differ += a[i] != c[i];
    }
    CHECK(same);
    CHECK(differ > N / 2);
    sampler_free(s1);
    sampler_free(s2);
    sampler_free(s3);
}

/* The first draws for a fixed seed and fixed logits, recorded from this
 * implementation: they must never change (across machines or versions). */
TEST(sample_seed_golden_sequence) {
    enum { V = 32 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)((i * 37) % 11) * 0.25f - 1.0f;
    sample_params p = sample_params_default();
    p.seed = 1234;
    p.temperature = 0.9f;
    p.top_k = 20;
    p.top_p = 0.95f;
    p.min_p = 0.02f;
    sampler *s = mk(&p, V);
    static const int32_t want[20] = {8, 18, 24, 18, 8, 29, 16, 19, 2, 13, 27, 30, 19, 13, 5, 7, 13, 26, 26, 7};
    for (int i = 0; i < 20; i++) {
        int32_t t = draw(s, l, V, NULL);
        if (getenv("PRINT_GOLDEN")) fprintf(stderr, "%d,", (int)t);
        CHECK_EQ_INT(t, want[i]);
    }
    if (getenv("PRINT_GOLDEN")) fprintf(stderr, "\n");
    sampler_free(s);
}

static void check_frequencies(const float *l, int32_t V, const sample_params *p,
                              const double *prob, long n, double bound) {
    sampler *s = mk(p, V);
    long obs[64] = {0};
    for (long i = 0; i < n; i++) {
        int32_t t = draw(s, l, V, NULL);
        CHECK(t >= 0 && t < V);
        if (t >= 0 && t < V) obs[t]++;
    }
    double x = chi_square(obs, prob, V, n);
    if (!(x < bound)) fprintf(stderr, "  chi-square %g >= %g\n", x, bound);
    CHECK(x < bound);
    sampler_free(s);
}

TEST(sample_frequencies_match_softmax) {
    enum { V = 8 };
    const float l[V] = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.5f, 1.2f, 0.7f};
    double prob[V];
    sample_params p = sample_params_default();
    p.seed = 99;
    /* chi-square, 7 degrees of freedom: P(X > 24.32) = 0.001 */
    softmax(l, V, 1.0, prob);
    check_frequencies(l, V, &p, prob, 200000, 24.32);
    p.temperature = 0.5f;
    softmax(l, V, 0.5, prob);
    check_frequencies(l, V, &p, prob, 200000, 24.32);
    p.temperature = 2.5f;
    softmax(l, V, 2.5, prob);
    check_frequencies(l, V, &p, prob, 200000, 24.32);
}

/* probabilities of a truncated distribution, computed by a plain full sort */
static void truncated(const float *l, int32_t V, double temp, int top_k, double top_p,
                      double min_p, double *prob) {
    double q[64];
    int32_t ord[64];
    softmax(l, V, temp, q);
    for (int32_t i = 0; i < V; i++) ord[i] = i;
    for (int32_t i = 0; i < V; i++) /* selection sort, descending, ties by id */
        for (int32_t j = i + 1; j < V; j++)
            if (q[ord[j]] > q[ord[i]]) {
                int32_t t = ord[i];
                ord[i] = ord[j];
                ord[j] = t;
            }
    int32_t k = top_k > 0 && top_k < V ? top_k : V;
    double z = 0;
    for (int32_t i = 0; i < k; i++) z += q[ord[i]];
    if (top_p < 1) {
        double cum = 0;
        int32_t keep = 0;
        while (keep < k) {
            cum += q[ord[keep]] / z;
            keep++;
            if (cum >= top_p) break;
        }
        k = keep;
    }
    int32_t keep = 1;
    while (keep < k && q[ord[keep]] >= min_p * q[ord[0]]) keep++;
    if (min_p > 0) k = keep;
    for (int32_t i = 0; i < V; i++) prob[i] = 0;
    z = 0;
    for (int32_t i = 0; i < k; i++) z += q[ord[i]];
    for (int32_t i = 0; i < k; i++) prob[ord[i]] = q[ord[i]] / z;
}

TEST(sample_truncation_frequencies) {
    enum { V = 30 };
    float l[V];
    lcg_state = 3;
    for (int i = 0; i < V; i++) l[i] = rnd_logit(6);
    double prob[V];
    sample_params p = sample_params_default();
    p.seed = 5;
    struct {
        float temp;
        int top_k;
        float top_p, min_p;
    } cfg[] = {
        {1.0f, 5, 1.0f, 0.0f},  {1.0f, 0, 0.6f, 0.0f},  {0.7f, 0, 1.0f, 0.1f},
        {1.3f, 10, 0.8f, 0.0f}, {0.8f, 10, 0.7f, 0.05f}, {1.0f, 0, 0.9f, 0.2f},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        p.temperature = cfg[c].temp;
        p.top_k = cfg[c].top_k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        truncated(l, V, cfg[c].temp, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, prob);
        int32_t kept = 0;
        for (int i = 0; i < V; i++) kept += prob[i] > 0;
        CHECK(kept >= 2 && kept < V); /* each case truncates something */
        /* bound: chi-square with <= 29 dof at P = 0.001 is < 58.3 */
        check_frequencies(l, V, &p, prob, 100000, 58.3);
    }
}

TEST(sample_top_k_1_and_tiny_top_p_are_greedy) {
    enum { V = 500 };
    static float l[V];
    lcg_state = 11;
    sample_params p = sample_params_default();
    p.temperature = 1.5f;
    p.top_k = 1;
    p.seed = 1;
    sampler *a = mk(&p, V);
    p.top_k = 0;
    p.top_p = 1e-6f;
    sampler *b = mk(&p, V);
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    sampler *c = mk(&p, V);
    for (int r = 0; r < 200; r++) {
        for (int i = 0; i < V; i++) l[i] = rnd_logit(3);
        int32_t g = argmax(l, V);
        l[g] += 0.01f; /* a unique maximum (min_p = 1 keeps every tied maximum) */
        CHECK_EQ_INT(draw(a, l, V, NULL), g);
        CHECK_EQ_INT(draw(b, l, V, NULL), g);
        CHECK_EQ_INT(draw(c, l, V, NULL), g);
    }
    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
}

TEST(sample_min_p_filters) {
    /* probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.2 keeps p >= 0.1 */
    const float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    sample_params p = sample_params_default();
    p.min_p = 0.2f;
    p.seed = 8;
    const double prob[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    check_frequencies(l, 4, &p, prob, 50000, 16.27); /* 3 dof, P = 0.001 */
    p.min_p = 0.7f; /* only token 0 (0.3 < 0.35) */
    sampler *s = mk(&p, 4);
    for (int i = 0; i < 1000; i++) CHECK_EQ_INT(draw(s, l, 4, NULL), 0);
    sampler_free(s);
}

TEST(sample_penalties_hand_example) {
    const float l[4] = {2.0f, -1.0f, 0.5f, 3.0f};
    sample_params p = sample_params_default();
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.n_top_logprobs = 4;
    sampler *s = mk(&p, 4);
    const int32_t ctx[] = {0, 1, 1, 3};
    for (int i = 0; i < 4; i++) sampler_accept(s, ctx[i]);
    /* token 0 (count 1): 2/2 - (0.25 + 0.5) = 0.25
     * token 1 (count 2): -1*2 - (0.5 + 0.5) = -3
     * token 2: 0.5; token 3 (count 1): 3/2 - 0.75 = 0.75 */
    float want[4] = {0.25f, -3.0f, 0.5f, 0.75f};
    double q[4];
    softmax(want, 4, 1.0, q);
    sample_logprobs lp;
    CHECK_EQ_INT(draw(s, l, 4, &lp), 3);
    CHECK_EQ_INT(lp.n_top, 4);
    const int32_t order[4] = {3, 2, 0, 1};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(lp.top_tokens[i], order[i]);
        CHECK_NEAR(lp.top_logprobs[i], log(q[order[i]]), 1e-5);
    }
    CHECK_NEAR(lp.logprob, log(q[3]), 1e-5);
    sampler_free(s);

    /* window of 2: only the last two accepted tokens (1, 3) count */
    p.repeat_last_n = 2;
    s = mk(&p, 4);
    for (int i = 0; i < 4; i++) sampler_accept(s, ctx[i]);
    float want2[4] = {2.0f, -2.75f, 0.5f, 0.75f};
    softmax(want2, 4, 1.0, q);
    CHECK_EQ_INT(draw(s, l, 4, &lp), 0);
    for (int i = 0; i < 4; i++) CHECK_NEAR(lp.top_logprobs[i], log(q[lp.top_tokens[i]]), 1e-5);
    CHECK_EQ_INT(lp.top_tokens[0], 0);
    CHECK_EQ_INT(lp.top_tokens[3], 1);
    sampler_free(s);

    /* whole history (-1), longer than the initial ring: 300 accepts of token 2 */
    p.repeat_last_n = -1;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.01f;
    s = mk(&p, 4);
    for (int i = 0; i < 300; i++) sampler_accept(s, 2);
    sampler_accept(s, 77); /* out of range: ignored */
    sampler_accept(s, -1);
    float want3[4] = {2.0f, -1.0f, 0.5f - 3.0f, 3.0f};
    softmax(want3, 4, 1.0, q);
    draw(s, l, 4, &lp);
    for (int i = 0; i < 4; i++) CHECK_NEAR(lp.top_logprobs[i], log(q[lp.top_tokens[i]]), 1e-5);
    CHECK_EQ_INT(lp.top_tokens[3], 2);
    sampler_free(s);

    /* repeat_last_n = 0 turns all penalties off */
    p.repeat_last_n = 0;
    p.repeat_penalty = 3.0f;
    s = mk(&p, 4);
    sampler_accept(s, 3);
    CHECK_EQ_INT(draw(s, l, 4, NULL), 3);
    sampler_free(s);
}

TEST(sample_logit_bias) {
    enum { V = 6 };
    const float l[V] = {0.1f, 3.0f, 0.2f, 2.9f, -1.0f, 0.0f};
    logit_bias ban[] = {{1, -INFINITY}};
    sample_params p = sample_params_default();
    p.temperature = 0;
    p.bias = ban;
    p.n_bias = 1;
    p.n_top_logprobs = V;
    sampler *s = mk(&p, V);
    sample_logprobs lp;
    CHECK_EQ_INT(draw(s, l, V, &lp), 3);
    CHECK_EQ_INT(lp.n_top, V - 1); /* banned tokens have no logprob */
    for (int i = 0; i < lp.n_top; i++) CHECK(lp.top_tokens[i] != 1);
    sampler_free(s);

    /* sampling never picks a banned token; a positive bias promotes */
    logit_bias b2[] = {{1, -INFINITY}, {3, -INFINITY}, {4, 4.5f}};
    p.temperature = 1.0f;
    p.bias = b2;
    p.n_bias = 3;
    p.seed = 3;
    float biased[V] = {0.1f, -INFINITY, 0.2f, -INFINITY, 3.5f, 0.0f};
    double prob[V];
    softmax(biased, V, 1.0, prob);
    check_frequencies(l, V, &p, prob, 50000, 20.52); /* 4 dof at 0.001 (+ zeros) */

    /* the copy of the bias array belongs to the sampler */
    logit_bias tmp[] = {{0, 100.0f}};
    p.bias = tmp;
    p.n_bias = 1;
    p.temperature = 0;
    s = mk(&p, V);
    tmp[0].token = 5;
    CHECK_EQ_INT(draw(s, l, V, NULL), 0);
    sampler_free(s);

    /* everything banned: -1 */
    logit_bias all[V];
    for (int i = 0; i < V; i++) all[i] = (logit_bias){i, -INFINITY};
    p.bias = all;
    p.n_bias = V;
    s = mk(&p, V);
    CHECK_EQ_INT(draw(s, l, V, &lp), -1);
    CHECK_EQ_INT(lp.token, -1);
    CHECK_EQ_INT(lp.n_top, 0);
    sampler_free(s);
}

TEST(sample_logprobs_sum_and_order) {
    enum { V = 20 };
    float l[V];
    lcg_state = 21;
    for (int i = 0; i < V; i++) l[i] = rnd_logit(8);
    l[4] = l[9]; /* a tie: lower id first */
    sample_params p = sample_params_default();
    p.n_top_logprobs = 20;
    p.seed = 77;
    p.temperature = 0.3f;
    sampler *a = mk(&p, V);
    p.temperature = 1.7f;
    p.top_k = 3;
    sampler *b = mk(&p, V);
    sample_logprobs la, lb;
    int32_t ta = draw(a, l, V, &la), tb = draw(b, l, V, &lb);
    CHECK_EQ_INT(la.n_top, V);
    double sum = 0;
    for (int i = 0; i < la.n_top; i++) {
        sum += exp(la.top_logprobs[i]);
        if (i) CHECK(la.top_logprobs[i] <= la.top_logprobs[i - 1]);
        if (la.top_tokens[i] == ta) CHECK_NEAR(la.logprob, la.top_logprobs[i], 0);
        /* independent of temperature and truncation */
        CHECK_EQ_INT(lb.top_tokens[i], la.top_tokens[i]);
        CHECK_NEAR(lb.top_logprobs[i], la.top_logprobs[i], 0);
    }
    CHECK_NEAR(sum, 1.0, 1e-5);
    CHECK_EQ_INT(la.token, ta);
    CHECK_EQ_INT(lb.token, tb);
    for (int i = 0; i + 1 < V; i++)
        if (la.top_tokens[i] == 9) CHECK(la.top_tokens[i + 1] != 4); /* 4 comes before 9 */
    double q[V];
    softmax(l, V, 1.0, q);
    for (int i = 0; i < V; i++) CHECK_NEAR(la.top_logprobs[i], log(q[la.top_tokens[i]]), 1e-5);
    sampler_free(a);
    sampler_free(b);

    /* fewer alternatives than the vocabulary: the best ones */
    p.n_top_logprobs = 3;
    p.top_k = 0;
    sampler *c = mk(&p, V);
    sample_logprobs lc;
    draw(c, l, V, &lc);
    CHECK_EQ_INT(lc.n_top, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(lc.top_tokens[i], la.top_tokens[i]);
    sampler_free(c);
}

/* ranks ids by logit (desc), ties by id: reference order for membership checks */
static const float *rank_logits;
static int rank_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (rank_logits[x] != rank_logits[y]) return rank_logits[x] > rank_logits[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

TEST(sample_large_vocab) {
    /* 150k vocabulary: results equal a full-sort reference of the kept set */
    enum { V = 150000 };
    float *l = malloc(V * sizeof *l);
    lcg_state = 5;
    for (int i = 0; i < V; i++) l[i] = rnd_logit(10);
    for (int i = 0; i < 100; i++) l[lcg() % V] += 12.0f; /* a peaked head */
    /* the reference nucleus for top_p = 0.9 at temperature 1 */
    int32_t *ord = malloc(V * sizeof *ord);
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < V; i++) z += exp(l[i] - m);
    for (int i = 0; i < V; i++) ord[i] = i;
    rank_logits = l;
    qsort(ord, V, sizeof *ord, rank_cmp);
    const int32_t n_head = V;
    double cum = 0;
    int32_t nucleus = 0;
    while (nucleus < n_head) {
        cum += exp(l[ord[nucleus]] - m) / z;
        nucleus++;
        if (cum >= 0.9) break;
    }
    CHECK(cum >= 0.9 && nucleus < n_head);
    char *in_nucleus = calloc(V, 1);
    for (int32_t i = 0; i < nucleus; i++) in_nucleus[ord[i]] = 1;

    sample_params p = sample_params_default();
    p.top_p = 0.9f;
    p.seed = 11;
    sampler *s = mk(&p, V);
    p.top_p = 1.0f;
    p.top_k = 40;
    sampler *k = mk(&p, V);
    float *buf = malloc(V * sizeof *buf);
    int hit_nucleus = 1, hit_topk = 1;
    for (int r = 0; r < 50; r++) {
        memcpy(buf, l, V * sizeof *buf);
        int32_t t = sampler_sample(s, buf, NULL);
        hit_nucleus &= t >= 0 && t < V && in_nucleus[t];
        memcpy(buf, l, V * sizeof *buf);
        t = sampler_sample(k, buf, NULL);
        int32_t rank = -1;
        for (int32_t i = 0; i < 40 && i < n_head; i++)
            if (ord[i] == t) rank = i;
        hit_topk &= rank >= 0;
    }
    CHECK(hit_nucleus);
    CHECK(hit_topk);
    sampler_free(s);
    sampler_free(k);
    free(buf);
    free(in_nucleus);
    free(ord);
    free(l);
}

TEST(sample_large_top_k_and_flat_top_p) {
    /* the quickselect path (top_k > 1024) and the radix path (a flat
     * distribution where top_p keeps most of the vocabulary) */
    enum { V = 20000 };
    float *l = malloc(V * sizeof *l), *buf = malloc(V * sizeof *buf);
    int32_t *ord = malloc(V * sizeof *ord);
    char *rank_ok = malloc(V);
    lcg_state = 99;
    for (int i = 0; i < V; i++) l[i] = rnd_logit(2);
    for (int i = 0; i < V; i += 7) l[i] = l[i / 7]; /* plenty of ties */
    for (int i = 0; i < V; i++) ord[i] = i;
    rank_logits = l;
    qsort(ord, V, sizeof *ord, rank_cmp);

    /* top_k = 3000 */
    memset(rank_ok, 0, V);
    for (int i = 0; i < 3000; i++) rank_ok[ord[i]] = 1;
    sample_params p = sample_params_default();
    p.top_k = 3000;
    p.temperature = 3.0f;
    p.seed = 4;
    sampler *s = mk(&p, V);
    int ok = 1, above = 0;
    for (int r = 0; r < 300; r++) {
        memcpy(buf, l, V * sizeof *buf);
        int32_t t = sampler_sample(s, buf, NULL);
        ok &= t >= 0 && t < V && rank_ok[t];
        above += t >= 0 && t < V && rank_ok[t] && !(l[t] > l[ord[1500]]);
    }
    CHECK(ok);
    CHECK(above > 0); /* the lower half of the kept set is reachable */
    sampler_free(s);

    /* flat: top_p = 0.97 at temperature 1 keeps most tokens; reference nucleus */
    double m = l[ord[0]], z = 0, cum = 0;
    for (int i = 0; i < V; i++) z += exp(l[i] - m);
    int32_t nucleus = 0;
    while (nucleus < V) {
        cum += exp(l[ord[nucleus]] - m) / z;
        nucleus++;
        if (cum >= 0.97) break;
    }
    CHECK(nucleus > 5000 && nucleus < V);
    memset(rank_ok, 0, V);
    for (int i = 0; i < nucleus; i++) rank_ok[ord[i]] = 1;
    p = sample_params_default();
    p.top_p = 0.97f;
    p.seed = 6;
    s = mk(&p, V);
    ok = 1;
    int deep = 0;
    for (int r = 0; r < 300; r++) {
        memcpy(buf, l, V * sizeof *buf);
        int32_t t = sampler_sample(s, buf, NULL);
        ok &= t >= 0 && t < V && rank_ok[t];
        deep += t >= 0 && t < V && !(l[t] > l[ord[2000]]);
    }
    CHECK(ok);
    CHECK(deep > 0); /* beyond the chunks ranked by selection */
    sampler_free(s);
    free(l);
    free(buf);
    free(ord);
    free(rank_ok);
}

TEST(sample_bad_params_rejected) {
    struct {
        const char *what;
        sample_params p;
        int32_t nv;
    } bad[16];
    int n = 0;
    logit_bias out_of_range[] = {{10, 1.0f}};
    logit_bias negative[] = {{-1, 1.0f}};
    logit_bias nan_bias[] = {{1, NAN}};
    logit_bias pinf[] = {{1, INFINITY}};
#define BAD(field, value)                                                                         \
    do {                                                                                          \
        bad[n].what = #field " = " #value;                                                       \
        bad[n].p = sample_params_default();                                                       \
        bad[n].p.field = value;                                                                   \
        bad[n].nv = 10;                                                                           \
        n++;                                                                                      \
    } while (0)
    BAD(temperature, NAN);
    BAD(temperature, INFINITY);
    BAD(top_p, 0.0f);
    BAD(top_p, 1.5f);
    BAD(top_p, -0.1f);
    BAD(min_p, -0.1f);
    BAD(min_p, 1.01f);
    BAD(repeat_penalty, 0.0f);
    BAD(repeat_penalty, NAN);
    BAD(repeat_last_n, -2);
    BAD(presence_penalty, INFINITY);
    BAD(n_top_logprobs, 21);
    BAD(n_top_logprobs, -1);
    BAD(n_bias, 1); /* no array */
#undef BAD
    for (int i = 0; i < n; i++) {
        char err[256] = "";
        sampler *s = sampler_new(&bad[i].p, bad[i].nv, err, sizeof err);
        if (s) fprintf(stderr, "  accepted: %s\n", bad[i].what);
        CHECK(s == NULL);
        CHECK(err[0] != 0 && strchr(err, '\n') == NULL);
        sampler_free(s);
    }
    logit_bias *biases[] = {out_of_range, negative, nan_bias, pinf};
    for (size_t i = 0; i < sizeof biases / sizeof biases[0]; i++) {
        sample_params p = sample_params_default();
        p.bias = biases[i];
        p.n_bias = 1;
        char err[256] = "";
        sampler *s = sampler_new(&p, 10, err, sizeof err);
        CHECK(s == NULL);
        CHECK(strstr(err, "logit_bias") != NULL);
        sampler_free(s);
    }
    sample_params p = sample_params_default();
    char err[256] = "";
    CHECK(sampler_new(&p, 0, err, sizeof err) == NULL);
    /* the edges that are valid */
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.n_top_logprobs = 20;
    p.repeat_last_n = -1;
    p.temperature = -0.5f;
    sampler *s = mk(&p, 10);
    sampler_free(s);
}

/* ---- stop strings ---------------------------------------------------------------- */

typedef struct {
    char out[512];
    size_t n;
    int stopped;
    int stop_calls; /* pushes that returned 1 */
} collected;

static void push(stop_matcher *m, collected *c, const char *s, size_t len) {
    const char *e;
    size_t ne;
    int r = stop_matcher_push(m, s, len, &e, &ne);
    if (c->n + ne < sizeof c->out) memcpy(c->out + c->n, e, ne);
    c->n += ne;
    if (r) c->stopped = 1, c->stop_calls++;
}

static void finish(stop_matcher *m, collected *c) {
    const char *e;
    size_t ne;
    stop_matcher_flush(m, &e, &ne);
    if (c->n + ne < sizeof c->out) memcpy(c->out + c->n, e, ne);
    c->n += ne;
    c->out[c->n < sizeof c->out ? c->n : sizeof c->out - 1] = 0;
}

/* streams text cut at the given points (sorted, within text), stop strings
 * applying before guard only (NULL: everywhere) */
static collected stream_guarded(const char *const *stops, size_t ns, const char *guard, const char *text,
                                const size_t *cuts, size_t ncuts) {
    collected c = {{0}, 0, 0, 0};
    stop_matcher *m = stop_matcher_new(stops, ns, guard);
    size_t len = strlen(text), at = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t to = i < ncuts ? cuts[i] : len;
        push(m, &c, text + at, to - at);
        at = to;
    }
    finish(m, &c);
    stop_matcher_free(m);
    return c;
}

static collected stream(const char *const *stops, size_t ns, const char *text, const size_t *cuts,
                        size_t ncuts) {
    return stream_guarded(stops, ns, NULL, text, cuts, ncuts);
}

/* A tool call's opening markup as the guard: a stop string never cuts the
 * call open (nor matches inside it), and still stops the text before it, or
 * text that only looked like the markup's start; for every split in three. */
TEST(stop_guard_keeps_a_tool_call_whole) {
    static const struct {
        const char *stop, *text, *out;
        int stopped;
    } cases[] = {
        {"<", "Sure.<tool_call>\n{\"a\": 1}\n</tool_call>", "Sure.<tool_call>\n{\"a\": 1}\n</tool_call>", 0},
        {"\n", "<tool_call>\n{\"a\": 1}\n</tool_call>", "<tool_call>\n{\"a\": 1}\n</tool_call>", 0},
        {"call", "<tool_call>x</tool_call>", "<tool_call>x</tool_call>", 0},
        {"<", "a<b rest", "a", 1},
        {"\n", "Let me check.\n<tool_call>", "Let me check.", 1},
        {"c<t", "abc<tx", "ab", 1},          /* ran into what looked like the markup: it was not */
        {"c<t", "abc<tool_call>x", "abc<tool_call>x", 0},
        {"c<t", "abc<t", "ab", 0},           /* ended there: flushed up to the stop string */
        {"<tool", "x <tool_call>", "x <tool_call>", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *stops[] = {cases[k].stop};
        size_t len = strlen(cases[k].text);
        for (size_t i = 0; i <= len; i++)
            for (size_t j = i; j <= len; j++) {
                size_t cuts[2] = {i, j};
                collected c = stream_guarded(stops, 1, "<tool_call>", cases[k].text, cuts, 2);
                CHECK_STR(c.out, cases[k].out);
                CHECK_EQ_INT(c.stopped, cases[k].stopped);
            }
    }
}

TEST(stop_split_at_every_byte) {
    const char *stops[] = {"<|end|>"};
    const char *text = "Hello world<|end|> trailing";
    size_t len = strlen(text);
    for (size_t i = 0; i <= len; i++)
        for (size_t j = i; j <= len; j++) {
            size_t cuts[2] = {i, j};
            collected c = stream(stops, 1, text, cuts, 2);
            CHECK_STR(c.out, "Hello world");
            CHECK(c.stopped);
        }
    /* byte by byte */
    size_t cuts[64];
    for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
    collected c = stream(stops, 1, text, cuts, len - 1);
    CHECK_STR(c.out, "Hello world");
    CHECK_EQ_INT(c.stop_calls, 1 + (int)(len - strlen("Hello world<|end|>")));
    /* no stop: everything comes out, a partial "<|en" at the end by flush */
    collected d = stream(stops, 1, "abc<|en", NULL, 0);
    CHECK_STR(d.out, "abc<|en");
    CHECK(!d.stopped);
}

TEST(stop_hold_back_is_minimal) {
    const char *stops[] = {"</s>", "###"};
    stop_matcher *m = stop_matcher_new(stops, 2, NULL);
    const char *e;
    size_t ne;
    CHECK_EQ_INT(stop_matcher_push(m, "abc</", 5, &e, &ne), 0);
    CHECK_EQ_INT(ne, 3); /* "</" held */
    CHECK(memcmp(e, "abc", 3) == 0);
    CHECK_EQ_INT(stop_matcher_push(m, "x#", 2, &e, &ne), 0);
    CHECK_EQ_INT(ne, 3); /* "</x" out, "#" held */
    CHECK(memcmp(e, "</x", 3) == 0);
    CHECK_EQ_INT(stop_matcher_push(m, "#", 1, &e, &ne), 0);
    CHECK_EQ_INT(ne, 0);
    CHECK_EQ_INT(stop_matcher_push(m, "#tail", 5, &e, &ne), 1);
    CHECK_EQ_INT(ne, 0);
    /* after a stop: nothing more */
    CHECK_EQ_INT(stop_matcher_push(m, "more", 4, &e, &ne), 1);
    CHECK_EQ_INT(ne, 0);
    stop_matcher_flush(m, &e, &ne);
    CHECK_EQ_INT(ne, 0);
    stop_matcher_free(m);
}

TEST(stop_overlapping_and_multiple) {
    /* the stop that completes first wins, whatever the pushes */
    const char *s1[] = {"abcd", "bc"};
    const char *s2[] = {"abcx", "bcd"};
    const char *s3[] = {"aab"};
    const char *s4[] = {"xyz", "yz!", "z"};
    struct {
        const char *const *stops;
        size_t n;
        const char *text, *want;
    } cases[] = {
        {s1, 2, "xabcdy", "xa"},   /* "bc" completes before "abcd" */
        {s2, 2, "zabcd", "za"},    /* "abc" was a prefix of "abcx" */
        {s3, 1, "aaab", "a"},      /* self-overlapping prefix */
        {s4, 3, "wxyz!", "w"},     /* "xyz" and "z" complete together: the longer */
        {s4, 3, "wyz!", "wy"},     /* "z" completes before "yz!" */
        {s1, 2, "bcd", ""},        /* stop at the very start */
        {s3, 1, "aab", ""},
        {s4, 3, "no match", "no match"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = strlen(cases[i].text);
        /* whole, every single split, byte by byte */
        collected c = stream(cases[i].stops, cases[i].n, cases[i].text, NULL, 0);
        CHECK_STR(c.out, cases[i].want);
        for (size_t j = 0; j <= len; j++) {
            size_t cut = j;
            c = stream(cases[i].stops, cases[i].n, cases[i].text, &cut, 1);
            CHECK_STR(c.out, cases[i].want);
        }
        size_t cuts[32];
        for (size_t j = 0; j + 1 < len; j++) cuts[j] = j + 1;
        c = stream(cases[i].stops, cases[i].n, cases[i].text, cuts, len ? len - 1 : 0);
        CHECK_STR(c.out, cases[i].want);
    }
}

TEST(stop_utf8_bytes_opaque) {
    const char *stops[] = {"\xc3\xa9"}; /* é */
    size_t cut = 4;                     /* inside é */
    collected c = stream(stops, 1, "caf\xc3\xa9!", &cut, 1);
    CHECK_STR(c.out, "caf");
    c = stream(stops, 1, "ca\xc3\xb1o", &cut, 1); /* ñ shares the first byte */
    CHECK_STR(c.out, "ca\xc3\xb1o");
    CHECK(!c.stopped);
    const char *emoji[] = {"\xf0\x9f\xa4\x96"};
    for (size_t j = 0; j <= 7; j++) {
        size_t k = j;
        c = stream(emoji, 1, "ab\xf0\x9f\xa4\x96z", &k, 1);
        CHECK_STR(c.out, "ab");
    }
}

TEST(stop_no_stops_and_empty) {
    const char *stops[] = {"", NULL};
    stop_matcher *m = stop_matcher_new(stops, 1, NULL); /* empty strings are ignored */
    const char *e;
    size_t ne;
    CHECK_EQ_INT(stop_matcher_push(m, "abc", 3, &e, &ne), 0);
    CHECK_EQ_INT(ne, 3);
    CHECK_EQ_INT(stop_matcher_push(m, "", 0, &e, &ne), 0);
    CHECK_EQ_INT(ne, 0);
    stop_matcher_free(m);
    m = stop_matcher_new(NULL, 0, NULL);
    CHECK_EQ_INT(stop_matcher_push(m, "x", 1, &e, &ne), 0);
    CHECK_EQ_INT(ne, 1);
    stop_matcher_free(m);
}

TEST(stop_random_against_reference) {
    /* random texts and stops over a 3-letter alphabet, random cuts; the
     * reference scans the text byte by byte for the first completed stop */
    lcg_state = 2024;
    for (int iter = 0; iter < 3000; iter++) {
        char stopbuf[3][5];
        const char *stops[3];
        size_t ns = 1 + lcg() % 3;
        for (size_t i = 0; i < ns; i++) {
            size_t l = 1 + lcg() % 4;
            for (size_t j = 0; j < l; j++) stopbuf[i][j] = (char)('a' + lcg() % 3);
            stopbuf[i][l] = 0;
            stops[i] = stopbuf[i];
        }
        char text[40];
        size_t len = lcg() % 30;
        for (size_t j = 0; j < len; j++) text[j] = (char)('a' + lcg() % 3);
        text[len] = 0;
        size_t want = len;
        int want_stop = 0;
        for (size_t end = 1; end <= len && !want_stop; end++) {
            for (size_t i = 0; i < ns; i++) {
                size_t l = strlen(stops[i]);
                if (l <= end && memcmp(text + end - l, stops[i], l) == 0 &&
                    (!want_stop || end - l < want))
                    want = end - l, want_stop = 1;
            }
        }
        size_t cuts[8], nc = lcg() % 6;
        for (size_t j = 0; j < nc; j++) cuts[j] = len ? lcg() % (len + 1) : 0;
        for (size_t a = 1; a < nc; a++) /* sort */
            for (size_t b = a; b > 0 && cuts[b - 1] > cuts[b]; b--) {
                size_t t = cuts[b];
                cuts[b] = cuts[b - 1];
                cuts[b - 1] = t;
            }
        collected c = stream(stops, ns, text, cuts, nc);
        if (c.n != want || memcmp(c.out, text, want) != 0 || c.stopped != want_stop) {
            test_failures++;
            fprintf(stderr, "  text \"%s\" stops \"%s\" \"%s\" \"%s\": got \"%s\", want %zu\n", text,
                    stops[0], ns > 1 ? stops[1] : "", ns > 2 ? stops[2] : "", c.out, want);
            break;
        }
    }
}
