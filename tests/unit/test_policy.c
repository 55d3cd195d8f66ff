/* cache/policy.c's pot_select against a plain reference: for every policy,
 * with and without pooling, on random pots with ties, NaN and infinities;
 * the reference picks one slot at a time by a linear scan (best value, then
 * the older slot) over plainly pooled values. And what max pooling is for:
 * one outstanding token keeps the span around it (centred for attention
 * scores, mostly after it for NuC's surprisal). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Continuous values, a few levels (ties), or NaN / -inf / +inf. */
static float tricky(void) {
    uint32_t u = rnd() % 100;
    if (u < 3) return NAN;
    if (u < 5) return -INFINITY;
    if (u < 6) return INFINITY;
    if (u < 40) return (float)(rnd() % 4);
    return (float)(rnd() % 100000) / 1000.0f;
}

/* in[j] for j from s - trail to s + lead (a value reaches `lead` slots before
 * it and `trail` after): their max (NaN never wins), or their mean. */
static float pooled(const float *in, int32_t n, int32_t s, int32_t lead, int32_t trail, int use_max) {
    int32_t c = 0;
    double sum = 0;
    float mx = -INFINITY;
    for (int32_t j = s - trail; j <= s + lead; j++) {
        if (j < 0 || j >= n) continue;
        sum += in[j];
        c++;
        if (!isnan(in[j]) && in[j] > mx) mx = in[j];
    }
    return use_max ? mx : (float)(sum / c);
}

/* Marks `count` more slots of [pinned, n): each time the best unmarked one. */
static void ref_take(const float *v, int32_t pinned, int32_t n, int32_t count, uint8_t *kept) {
    for (int32_t c = 0; c < count; c++) {
        int32_t best = -1;
        for (int32_t s = pinned; s < n; s++) {
            if (kept[s]) continue;
            float x = isnan(v[s]) ? -INFINITY : v[s];
            float b = best < 0 ? 0 : isnan(v[best]) ? -INFINITY : v[best];
            if (best < 0 || x > b) best = s;
        }
        if (best < 0) return;
        kept[best] = 1;
    }
}

static int32_t n_kept(const uint8_t *kept, int32_t n) {
    int32_t c = 0;
    for (int32_t s = 0; s < n; s++) c += kept[s];
    return c;
}

static void ref_select(const pot *p, const select_params *sp, int32_t *keep) {
    int32_t n = p->n, k = sp->n_keep, pinned = p->n_pinned, free_slots = k - pinned;
    /* centred spans of w slots, except NuC's: w/4 before a peak, the rest after it */
    int32_t w = sp->pool > 1 ? sp->pool : 1, r = w / 2, nuc_before = w / 4;
    uint8_t *kept = malloc((size_t)n);
    float *v = malloc((size_t)n * sizeof *v);
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            size_t base = pot_slot(p, l, h, 0);
            const float *score = sp->scores ? sp->scores + ((size_t)l * p->n_head_kv + h) * sp->scores_stride : NULL;
            memset(kept, 0, (size_t)n);
            for (int32_t s = 0; s < pinned; s++) kept[s] = 1;
            switch (sp->policy) {
            case POLICY_INFINIPOT:
                for (int32_t s = 0; s < n; s++) v[s] = pooled(p->surprisal + base, n, s, nuc_before, w - 1 - nuc_before, 1);
                ref_take(v, pinned, n, (int32_t)floorf(sp->nuc_share * (float)free_slots), kept);
                for (int32_t s = 0; s < n; s++) v[s] = pooled(score, n, s, r, r, 1);
                ref_take(v, pinned, n, k - n_kept(kept, n), kept);
                break;
            case POLICY_FINCH:
                for (int32_t s = 0; s < n; s++) v[s] = pooled(score, n, s, r, r, 1);
                ref_take(v, pinned, n, free_slots, kept);
                break;
            case POLICY_SNAPKV:
                for (int32_t s = n - (sp->window < free_slots ? sp->window : free_slots); s < n; s++) kept[s] = 1;
                for (int32_t s = 0; s < n; s++) v[s] = pooled(score, n, s, r, r, 0);
                ref_take(v, pinned, n, k - n_kept(kept, n), kept);
                break;
            case POLICY_H2O:
                for (int32_t s = n - free_slots / 2; s < n; s++) kept[s] = 1;
                ref_take(p->score_acc + base, pinned, n, k - n_kept(kept, n), kept);
                break;
            case POLICY_STREAMING:
            case POLICY_TRUNCATE: {
                int32_t head = sp->policy == POLICY_TRUNCATE ? free_slots / 2
                               : sp->n_sinks < free_slots    ? sp->n_sinks
                                                             : free_slots;
                for (int32_t s = pinned; s < pinned + head; s++) kept[s] = 1;
                for (int32_t s = n - 1; n_kept(kept, n) < k; s--) kept[s] = 1;
                break;
            }
            default:
                break;
            }
            int32_t *out = keep + ((size_t)l * p->n_head_kv + h) * k, m = 0;
            for (int32_t s = 0; s < n; s++)
                if (kept[s]) out[m++] = s;
        }
    free(kept);
    free(v);
}

/* Names and the list of them come from one table (cache/cache.h's POT_POLICIES). */
TEST(policy_names_round_trip_and_list_in_order) {
    const char *list = pot_policy_list(), *at = list;
    for (int i = 0; i < POLICY_COUNT_; i++) {
        const char *name = pot_policy_name((enum pot_policy)i);
        CHECK_EQ_INT(pot_policy_from_name(name), i);
        const char *found = strstr(at, name);
        CHECK(found != NULL);
        if (found) at = found + strlen(name);
    }
    CHECK_STR(at, "");
    CHECK_STR(pot_policy_name(POLICY_CASCADE), "cascade");
    CHECK_STR(pot_policy_name(POLICY_COUNT_), "unknown");
    CHECK_EQ_INT(pot_policy_from_name("lru"), -1);
    CHECK_EQ_INT(pot_policy_from_name(NULL), -1);
    CHECK_STR(list, "infinipot, finch, snapkv, streaming, h2o, cascade, truncate, none");
}

TEST(policy_select_matches_plain_reference) {
    const enum pot_policy policies[] = {POLICY_INFINIPOT, POLICY_FINCH, POLICY_SNAPKV,
                                        POLICY_H2O, POLICY_STREAMING, POLICY_TRUNCATE};
    const int32_t pools[] = {0, 1, 3, 15};
    const int32_t sizes[] = {1, 5, 40, 333};
    char err[160];
    int mismatches = 0, cases = 0;
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
        int32_t n = sizes[c], stride = n + 3;
        pot *p = pot_new(2, 3, 4, n, POT_F16, err, sizeof err);
        CHECK(p != NULL);
        if (!p) return;
        p->n = n;
        float *scores = malloc((size_t)2 * 3 * stride * sizeof *scores);
        for (int32_t i = 0; i < 2 * 3 * stride; i++) scores[i] = tricky();
        for (int32_t lh = 0; lh < 2 * 3; lh++)
            for (int32_t s = 0; s < n; s++) {
                p->surprisal[(size_t)lh * p->capacity + s] = tricky();
                p->score_acc[(size_t)lh * p->capacity + s] = tricky();
            }
        for (int32_t pinned = 0; pinned <= (n > 3 ? 3 : 0); pinned += 3) {
            p->n_pinned = pinned;
            for (int32_t k = pinned > 0 ? pinned : 1; k <= n; k += 1 + n / 7) {
                for (size_t q = 0; q < sizeof policies / sizeof *policies; q++)
                    for (size_t w = 0; w < sizeof pools / sizeof *pools; w++) {
                        select_params sp = {.policy = policies[q], .n_keep = k, .scores = scores,
                                            .scores_stride = stride, .nuc_share = 0.5f, .window = 4,
                                            .n_sinks = 2, .pool = pools[w]};
                        int32_t *got = malloc((size_t)6 * k * sizeof *got), *want = malloc((size_t)6 * k * sizeof *want);
                        CHECK_EQ_INT(pot_select(p, &sp, got, err, sizeof err), 0);
                        ref_select(p, &sp, want);
                        cases++;
                        if (memcmp(got, want, (size_t)6 * k * sizeof *got)) {
                            if (!mismatches++)
                                fprintf(stderr, "  %s n %d k %d pinned %d pool %d differs\n",
                                        pot_policy_name(policies[q]), n, k, pinned, pools[w]);
                        }
                        free(got);
                        free(want);
                    }
            }
        }
        free(scores);
        pot_free(p);
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK(cases > 500);
}

/* One outstanding slot among equal ones: without pooling the ties go to the
 * oldest slots; max pooling of width w keeps the w slots centred on it
 * (NuC's surprisal: w/4 slots before it, the rest after). */
TEST(policy_max_pooling_keeps_the_span_around_a_peak) {
    char err[160];
    int32_t n = 200, k = 15, peak = 120;
    pot *p = pot_new(1, 1, 4, n, POT_F32, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    p->n = n;
    float *scores = calloc((size_t)n, sizeof *scores);
    scores[peak] = 1;
    int32_t keep[30];
    select_params sp = {.policy = POLICY_FINCH, .n_keep = k, .scores = scores, .scores_stride = n, .pool = 15};
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    for (int32_t i = 0; i < k; i++) CHECK_EQ_INT(keep[i], peak - 7 + i);
    sp.pool = 1;
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    CHECK_EQ_INT(keep[0], 0);          /* the oldest of the ties */
    CHECK_EQ_INT(keep[k - 1], peak);   /* and the peak itself */
    /* infinipot pools the surprisal too: a surprising token keeps its neighbours */
    memset(scores, 0, (size_t)n * sizeof *scores);
    p->surprisal[40] = 9;
    sp = (select_params){.policy = POLICY_INFINIPOT, .n_keep = 10, .scores = scores, .scores_stride = n,
                         .nuc_share = 0.5f, .pool = 5};
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    /* five by surprisal (from 5/4 = 1 before to 3 after: 39..43), five by the
       flat scores (the oldest: 0..4) */
    const int32_t want[10] = {0, 1, 2, 3, 4, 39, 40, 41, 42, 43};
    CHECK(memcmp(keep, want, sizeof want) == 0);
    /* at the default width, 15: the surprising token, 3 before it and 11 after */
    sp.n_keep = 30;
    sp.pool = 15;
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    for (int32_t i = 0; i < 15; i++) CHECK_EQ_INT(keep[i], i);
    for (int32_t i = 0; i < 15; i++) CHECK_EQ_INT(keep[15 + i], 37 + i);
    free(scores);
    pot_free(p);
}

/* whole_words: a number's digits (slots joined to the one before at consecutive
 * token indices) are kept or dropped together. Here the peak pools over 7
 * slots (3 after it), and the 7-digit number after it would lose its tail;
 * joined, the whole number is kept, and a slot that joins a slot not just
 * before it in the document (the one between was dropped) starts a new word. */
TEST(policy_whole_words_keeps_a_number_whole) {
    char err[160];
    int32_t n = 60, peak = 20;
    pot *p = pot_new(1, 1, 4, n, POT_F32, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    p->n = n;
    for (int32_t s = 0; s < n; s++) p->token_index[s] = s;
    for (int32_t s = peak + 2; s < peak + 8; s++) p->joins[s] = 1; /* digits at peak+1 .. peak+7 */
    float *scores = calloc((size_t)n, sizeof *scores);
    for (int32_t s = 0; s < n; s++) scores[s] = 0.001f * (float)(n - s); /* older first on ties */
    scores[peak] = 1;
    int32_t keep[16];
    select_params sp = {.policy = POLICY_FINCH, .n_keep = 11, .scores = scores, .scores_stride = n, .pool = 7};
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    CHECK_EQ_INT(keep[0], 0); /* the peak's span, 17..23, and the best of the rest: 0..3 */
    CHECK_EQ_INT(keep[4], peak - 3);
    CHECK_EQ_INT(keep[10], peak + 3);
    sp.whole_words = 1;
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    for (int32_t i = 0; i < 11; i++) CHECK_EQ_INT(keep[i], peak - 3 + i); /* 17 .. 27: all seven digits */
    /* a gap in the token indices ends the word: 24 .. 27 no longer join 21 .. 23 */
    for (int32_t s = peak + 4; s < n; s++) p->token_index[s] = s + 1;
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    CHECK_EQ_INT(keep[0], 0);
    CHECK_EQ_INT(keep[10], peak + 3);
    /* infinipot and snapkv join words too */
    sp.policy = POLICY_SNAPKV;
    sp.window = 0;
    for (int32_t s = peak + 4; s < n; s++) p->token_index[s] = s;
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    for (int32_t i = 0; i < 11; i++) CHECK_EQ_INT(keep[i], peak - 3 + i);
    sp = (select_params){.policy = POLICY_INFINIPOT, .n_keep = 11, .scores = scores, .scores_stride = n,
                         .pool = 7, .whole_words = 1};
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    for (int32_t i = 0; i < 11; i++) CHECK_EQ_INT(keep[i], peak - 3 + i);
    free(scores);
    pot_free(p);
}

/* Shared selection: every (layer, head) gets the choice a one-head pot makes
 * over the scores summed over all of them (surprisal from layer 0, head 0),
 * for each policy that scores. */
TEST(policy_shared_selection_is_one_choice_over_summed_scores) {
    char err[160];
    const int32_t L = 3, H = 2, n = 90, k = 31;
    const enum pot_policy policies[] = {POLICY_INFINIPOT, POLICY_FINCH, POLICY_SNAPKV};
    pot *p = pot_new(L, H, 4, n, POT_F32, err, sizeof err), *one = pot_new(1, 1, 4, n, POT_F32, err, sizeof err);
    float *scores = malloc((size_t)L * H * n * sizeof *scores), *sum = calloc((size_t)n, sizeof *sum);
    int32_t *keep = malloc((size_t)L * H * k * sizeof *keep), want[31];
    CHECK(p && one && scores && sum && keep);
    if (!p || !one || !scores || !sum || !keep) return;
    p->n = one->n = n;
    p->n_pinned = one->n_pinned = 2;
    for (int32_t i = 0; i < L * H * n; i++) scores[i] = (float)(rnd() % 1000) / 100.0f;
    for (int32_t i = 0; i < L * H * n; i++) p->surprisal[i] = (float)(rnd() % 1000) / 100.0f;
    for (int32_t i = 0; i < L * H * n; i++) sum[i % n] += scores[i];
    memcpy(one->surprisal, p->surprisal, (size_t)n * sizeof *sum); /* layer 0, head 0 */
    int differs = 0;
    for (size_t q = 0; q < sizeof policies / sizeof *policies; q++) {
        select_params sp = {.policy = policies[q], .n_keep = k, .scores = scores, .scores_stride = n,
                            .nuc_share = 0.5f, .window = 4, .pool = 5, .shared = 1};
        CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
        select_params ref = sp;
        ref.scores = sum;
        ref.shared = 0;
        CHECK_EQ_INT(pot_select(one, &ref, want, err, sizeof err), 0);
        for (int32_t lh = 0; lh < L * H; lh++)
            CHECK(memcmp(keep + (size_t)lh * k, want, sizeof want) == 0);
        /* not shared, the heads choose differently on these scores */
        sp.shared = 0;
        CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
        for (int32_t lh = 1; lh < L * H; lh++) differs += memcmp(keep + (size_t)lh * k, keep, sizeof want) != 0;
    }
    CHECK(differs > 0);
    free(scores);
    free(sum);
    free(keep);
    pot_free(p);
    pot_free(one);
}

/* Score memory: score_acc keeps the best score each slot was ever given. */
TEST(policy_remember_max_scores_keeps_the_best) {
    char err[160];
    pot *p = pot_new(2, 1, 4, 8, POT_F32, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    p->n = 3;
    const float first[2 * 4] = {1, 5, 2, 9, 0, 3, 3, 9}, second[2 * 4] = {4, 1, 2, 9, 1, 7, 0, 9};
    pot_remember_max_scores(p, first, 4);
    pot_remember_max_scores(p, second, 4);
    const float want[2][3] = {{4, 5, 2}, {1, 7, 3}};
    for (int32_t l = 0; l < 2; l++)
        for (int32_t s = 0; s < 3; s++) CHECK(p->score_acc[pot_slot(p, l, 0, s)] == want[l][s]);
    CHECK(p->score_acc[pot_slot(p, 0, 0, 3)] == 0); /* beyond p->n: untouched */
    pot_free(p);
}

/* NuC by regions: each equal part of the document read so far gets its share
 * of NuC's slots, however much more surprising the newer part is. */
TEST(policy_nuc_regions_share_the_slots_between_parts_of_the_document) {
    char err[160];
    const int32_t n = 40, k = 10;
    pot *p = pot_new(1, 1, 4, n, POT_F32, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    p->n = n;
    p->n_seen = n;
    float scores[40] = {0};
    for (int32_t s = 0; s < n; s++) {
        p->token_index[s] = s;
        p->surprisal[s] = s < n / 2 ? (float)s : 100.0f + (float)s; /* the newer half: far more surprising */
    }
    int32_t keep[10];
    select_params sp = {.policy = POLICY_INFINIPOT, .n_keep = k, .scores = scores, .scores_stride = n,
                        .nuc_share = 1.0f, .pool = 1};
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    for (int32_t i = 0; i < k; i++) CHECK_EQ_INT(keep[i], 30 + i); /* all from the newer half */
    sp.regions = 2;
    CHECK_EQ_INT(pot_select(p, &sp, keep, err, sizeof err), 0);
    for (int32_t i = 0; i < 5; i++) CHECK_EQ_INT(keep[i], 15 + i); /* the best five of the older half */
    for (int32_t i = 5; i < k; i++) CHECK_EQ_INT(keep[i], 30 + i);
    pot_free(p);
}
