/* Compression policies: per (layer, KV head) scoring of the pot's slots and a
 * top-k that keeps document order. Pinned slots are kept first; a policy's
 * forced slots (NuC tokens, the SnapKV window, sinks, the recent window) come
 * next; the best-scored remaining slots fill the rest. */
#include "cache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const policy_names[POLICY_COUNT_] = {POT_POLICIES(POT_NAME_ENTRY_, )};

int pot_policy_from_name(const char *name) {
    for (int i = 0; i < POLICY_COUNT_; i++)
        if (name && !strcmp(name, policy_names[i])) return i;
    return -1;
}

const char *pot_policy_name(enum pot_policy p) {
    return (unsigned)p < POLICY_COUNT_ ? policy_names[p] : "unknown";
}

const char *pot_policy_list(void) { return POT_POLICY_LIST; }

typedef struct ranked {
    float value;
    int32_t slot;
} ranked;

/* Higher value first; equal values: the older (lower) slot first. */
static int by_value_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->value != y->value) return x->value > y->value ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

/* Marks the best `count` unmarked slots in [from, n) by value[] with `why`. */
static void take_best(const float *value, int32_t from, int32_t n, int32_t count, uint8_t *kept,
                      uint8_t why, ranked *tmp) {
    int32_t m = 0;
    for (int32_t s = from; s < n; s++)
        if (!kept[s]) tmp[m++] = (ranked){isnan(value[s]) ? -INFINITY : value[s], s};
    if (count > m) count = m;
    qsort(tmp, (size_t)m, sizeof *tmp, by_value_desc);
    for (int32_t i = 0; i < count; i++) kept[tmp[i].slot] = why;
}

/* take_best within each of `regions` equal parts of the document read so far
 * (by each slot's token index): part r gets count / regions slots (the first
 * count % regions parts one more), so old text keeps its share however
 * surprising newer text is. value_tmp: n floats of scratch. */
static void take_best_by_region(const pot *p, size_t base, const float *value, int32_t from, int32_t n,
                                int32_t count, int32_t regions, uint8_t *kept, uint8_t why, ranked *tmp,
                                float *value_tmp) {
    int64_t seen = p->n_seen > 0 ? p->n_seen : 1;
    for (int32_t r = 0; r < regions; r++) {
        int32_t quota = count / regions + (r < count % regions), in_region = 0;
        for (int32_t s = 0; s < n; s++) {
            int64_t at = p->token_index[base + s] * regions / seen;
            int inside = (at < 0 ? 0 : at >= regions ? regions - 1 : at) == r;
            value_tmp[s] = inside ? value[s] : NAN;
            in_region += inside && s >= from && !kept[s];
        }
        take_best(value_tmp, from, n, quota < in_region ? quota : in_region, kept, why, tmp);
    }
}

static int32_t count_kept(const uint8_t *kept, int32_t n) {
    int32_t c = 0;
    for (int32_t s = 0; s < n; s++) c += kept[s] != 0;
    return c;
}

/* Pooling over slots [0, n) in which each value reaches `lead` slots before
 * it and `trail` slots after it: out[s] pools in[s - trail .. s + lead], by
 * the mean (SnapKV) or by the max, under which a chosen token brings the
 * tokens around it. Symmetric (lead = trail = w/2) except for NuC. */
static void pool_scores(const float *in, int32_t n, int32_t lead, int32_t trail, int use_max,
                        float *out) {
    for (int32_t s = 0; s < n; s++) {
        double sum = 0;
        float mx = -INFINITY;
        int32_t lo = s - trail > 0 ? s - trail : 0, hi = s + lead < n - 1 ? s + lead : n - 1;
        for (int32_t j = lo; j <= hi; j++) {
            sum += in[j];
            if (in[j] > mx) mx = in[j]; /* NaN never wins */
        }
        out[s] = use_max ? mx : (float)(sum / (hi - lo + 1));
    }
}

/* Every word's slots (a run of slots each joined to the one before by p->joins,
 * at consecutive token indices) take the largest of their values, so that the
 * ranking keeps or drops the word as one (select_params.whole_words). */
static void join_words(const pot *p, size_t base, float *value, int32_t n) {
    for (int32_t s = 0; s < n;) {
        int32_t end = s + 1;
        while (end < n && p->joins[base + end] && p->token_index[base + end] == p->token_index[base + end - 1] + 1)
            end++;
        float best = -INFINITY;
        for (int32_t j = s; j < end; j++)
            if (value[j] > best) best = value[j]; /* NaN never wins */
        for (int32_t j = s; j < end; j++) value[j] = best;
        s = end;
    }
}

/* NuC's span of w slots around a surprising token starts w/4 slots before
 * it: surprisal peaks where a new phrase begins (the needle's " key", not its
 * digits), and what makes the phrase new follows the peak. docs/results/longdoc.md,
 * "Span pooling": the 32K prose needles, 60/60 found against 33/60 with centred spans. */
int32_t pot_nuc_lead(int32_t width) { return width > 1 ? width / 4 : 0; }

static int uses_scores(enum pot_policy p) {
    return p == POLICY_INFINIPOT || p == POLICY_FINCH || p == POLICY_SNAPKV;
}

int pot_select(const pot *p, const select_params *sp, int32_t *keep, char *err, size_t errlen) {
    int32_t n = p->n, k = sp->n_keep, pinned = p->n_pinned;
    if (k < pinned || k > n || k <= 0) {
        snprintf(err, errlen, "keep_tokens: %d entries cannot be kept from %d (%d pinned)", k, n, pinned);
        return -1;
    }
    if (uses_scores(sp->policy) && (!sp->scores || sp->scores_stride < n)) {
        snprintf(err, errlen, "policy %s needs attention scores", pot_policy_name(sp->policy));
        return -1;
    }
    if (sp->policy == POLICY_NONE) {
        snprintf(err, errlen, "policy none never compresses: the document does not fit the pot");
        return -1;
    }
    if (sp->policy == POLICY_CASCADE) {
        snprintf(err, errlen, "policy cascade keeps its own state (cascade_update/cascade_keep)");
        return -1;
    }
    uint8_t *kept = malloc((size_t)n);
    ranked *tmp = malloc((size_t)n * sizeof *tmp);
    float *work = malloc((size_t)n * sizeof *work);
    float *region_tmp = sp->regions > 1 ? malloc((size_t)n * sizeof *region_tmp) : NULL;
    /* shared: the choice of layer 0, head 0 over the scores summed over every layer and head,
       copied to the others */
    int shared = sp->shared && uses_scores(sp->policy);
    float *summed = shared ? calloc((size_t)n, sizeof *summed) : NULL;
    if (!kept || !tmp || !work || (sp->regions > 1 && !region_tmp) || (shared && !summed)) {
        free(kept);
        free(tmp);
        free(work);
        free(region_tmp);
        free(summed);
        snprintf(err, errlen, "out of memory selecting pot entries");
        return -1;
    }
    for (int32_t lh = 0; shared && lh < p->n_layer * p->n_head_kv; lh++)
        for (int32_t s = 0; s < n; s++) summed[s] += sp->scores[(size_t)lh * sp->scores_stride + s];
    int32_t free_slots = k - pinned; /* what the policy chooses beyond the pinned slots */
    int32_t width = sp->pool > 1 ? sp->pool : 1; /* of the pooling */
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            size_t base = pot_slot(p, l, h, 0);
            int32_t *out = keep + ((size_t)l * p->n_head_kv + h) * k, m = 0;
            if (shared && (l || h)) {
                memcpy(out, keep, (size_t)k * sizeof *out);
                if (sp->why) memcpy(sp->why + ((size_t)l * p->n_head_kv + h) * n, sp->why, (size_t)n);
                continue;
            }
            const float *score = shared       ? summed
                                 : sp->scores ? sp->scores + ((size_t)l * p->n_head_kv + h) * sp->scores_stride
                                              : NULL;
            memset(kept, 0, (size_t)n);
            memset(kept, POT_KEPT_PINNED, (size_t)pinned);
            switch (sp->policy) {
            case POLICY_INFINIPOT: {
                /* NuC first: the most surprising tokens, then CaP attention */
                int32_t t = (int32_t)floorf(sp->nuc_share * (float)free_slots);
                int32_t lead = pot_nuc_lead(width);
                pool_scores(p->surprisal + base, n, lead, width - 1 - lead, 1, work);
                if (sp->whole_words) join_words(p, base, work, n);
                if (sp->regions > 1)
                    take_best_by_region(p, base, work, pinned, n, t, sp->regions, kept, POT_KEPT_NUC, tmp, region_tmp);
                else
                    take_best(work, pinned, n, t, kept, POT_KEPT_NUC, tmp);
                pool_scores(score, n, width / 2, width / 2, 1, work);
                if (sp->whole_words) join_words(p, base, work, n);
                take_best(work, pinned, n, k - count_kept(kept, n), kept, POT_KEPT_SCORE, tmp);
                break;
            }
            case POLICY_FINCH:
                pool_scores(score, n, width / 2, width / 2, 1, work);
                if (sp->whole_words) join_words(p, base, work, n);
                take_best(work, pinned, n, free_slots, kept, POT_KEPT_SCORE, tmp);
                break;
            case POLICY_SNAPKV: {
                int32_t w = sp->window < free_slots ? sp->window : free_slots;
                for (int32_t s = n - w; s < n; s++) kept[s] = POT_KEPT_FORCED;
                pool_scores(score, n, width / 2, width / 2, 0, work);
                if (sp->whole_words) join_words(p, base, work, n);
                take_best(work, pinned, n, k - count_kept(kept, n), kept, POT_KEPT_SCORE, tmp);
                break;
            }
            case POLICY_H2O: {
                /* half recent, half heavy hitters by accumulated attention */
                int32_t recent = free_slots / 2;
                for (int32_t s = n - recent; s < n; s++) kept[s] = POT_KEPT_FORCED;
                take_best(p->score_acc + base, pinned, n, k - count_kept(kept, n), kept, POT_KEPT_SCORE, tmp);
                break;
            }
            case POLICY_STREAMING: {
                int32_t sinks = sp->n_sinks < free_slots ? sp->n_sinks : free_slots;
                for (int32_t s = pinned; s < pinned + sinks; s++) kept[s] = POT_KEPT_FORCED;
                for (int32_t s = n - 1, left = free_slots - sinks; left > 0; s--)
                    if (!kept[s]) kept[s] = POT_KEPT_FORCED, left--;
                break;
            }
            case POLICY_TRUNCATE: {
                int32_t head = free_slots / 2;
                for (int32_t s = pinned; s < pinned + head; s++) kept[s] = POT_KEPT_FORCED;
                for (int32_t s = n - 1, left = free_slots - head; left > 0; s--)
                    if (!kept[s]) kept[s] = POT_KEPT_FORCED, left--;
                break;
            }
            default:
                break;
            }
            /* every branch marks exactly k slots: there are always enough candidates */
            for (int32_t s = 0; s < n && m < k; s++)
                if (kept[s]) out[m++] = s;
            if (sp->why) memcpy(sp->why + ((size_t)l * p->n_head_kv + h) * n, kept, (size_t)n);
        }
    free(kept);
    free(tmp);
    free(work);
    free(summed);
    free(region_tmp);
    return 0;
}

/* Folds scores into every valid slot's score_acc: their sum, or their max. */
static void fold_scores(pot *p, const float *scores, int32_t stride, int use_max) {
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            const float *s = scores + ((size_t)l * p->n_head_kv + h) * stride;
            float *acc = p->score_acc + pot_slot(p, l, h, 0);
            for (int32_t j = 0; j < p->n; j++) acc[j] = use_max ? (s[j] > acc[j] ? s[j] : acc[j]) : acc[j] + s[j];
        }
}

void pot_accumulate_scores(pot *p, const float *scores, int32_t stride) { fold_scores(p, scores, stride, 0); }

void pot_remember_max_scores(pot *p, const float *scores, int32_t stride) { fold_scores(p, scores, stride, 1); }
