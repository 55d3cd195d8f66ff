/* The GPU top-k chooses exactly what cache/policy.c's pot_select chooses
 * (finch: pinned + best scores; infinipot: pinned + NuC by surprisal + best
 * scores), on random pots with heavy ties, NaN, -inf and both zeros. */
#include "cache/cache.h"
#include "cuda/kernels.h"
#include "tests/cuda/cuda_test.h"

/* A random value: continuous, one of a handful of levels (ties), or special. */
static float tricky(test_rng *g, int levels) {
    uint32_t u = rng_u32(g) % 100;
    if (u < 3) return NAN;
    if (u < 5) return -INFINITY;
    if (u < 8) return -0.0f;
    if (u < 11) return 0.0f;
    if (levels) return (float)(rng_u32(g) % levels) * 0.25f - 0.5f;
    return rng_float(g, -1, 1);
}

/* Runs the GPU steps for one policy and compares the kept slots. */
static void check_policy(pot *p, enum pot_policy policy, const float *scores, int32_t stride, int32_t k, float share) {
    char err[128];
    int32_t rows = p->n_layer * p->n_head_kv, n = p->n, pinned = p->n_pinned;
    int32_t *want = malloc((size_t)rows * k * 4), *got = malloc((size_t)rows * k * 4);
    select_params sp = {.policy = policy, .n_keep = k, .scores = scores, .scores_stride = stride, .nuc_share = share};
    CHECK(pot_select(p, &sp, want, err, sizeof err) == 0);

    float *dscores = dev_from(scores, (size_t)rows * stride * 4);
    float *dsurp = dev_from(p->surprisal, (size_t)rows * p->capacity * 4);
    uint8_t *dkept = dev_alloc((size_t)rows * n);
    int32_t *dkeep = dev_alloc((size_t)rows * k * 4);
    CHECK_CUDA(cuda_kept_init(dkept, n, rows, n, pinned, 0));
    if (policy == POLICY_INFINIPOT) {
        int32_t t = (int32_t)floorf(share * (float)(k - pinned));
        CHECK_CUDA(cuda_topk_fill(dsurp, p->capacity, dkept, n, rows, pinned, n, pinned + t, 0));
    }
    CHECK_CUDA(cuda_topk_fill(dscores, stride, dkept, n, rows, pinned, n, k, 0));
    CHECK_CUDA(cuda_kept_to_slots(dkept, n, rows, n, k, dkeep, 0));
    host_from(got, dkeep, (size_t)rows * k * 4);
    if (memcmp(got, want, (size_t)rows * k * 4)) {
        for (int32_t i = 0; i < rows * k; i++)
            if (got[i] != want[i]) {
                fprintf(stderr, "  %s n %d k %d pinned %d: keep[%d] = %d, expected %d\n", pot_policy_name(policy), n, k,
                        pinned, i, got[i], want[i]);
                break;
            }
        test_failures++;
    }
    cudaFree(dscores), cudaFree(dsurp), cudaFree(dkept), cudaFree(dkeep);
    free(want), free(got);
}

TEST(cuda_topk_matches_pot_select) {
    test_rng g = {31};
    int32_t sizes[] = {1, 2, 7, 100, 257, 1000, 3001};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++)
        for (int levels = 0; levels <= 6; levels += 6) {
            int32_t n = sizes[c], stride = n + 5;
            char err[128];
            pot *p = pot_new(3, 2, 4, n + 2, POT_F16, err, sizeof err);
            CHECK(p != NULL);
            if (!p) return;
            p->n = n;
            int32_t rows = 6;
            float *scores = malloc((size_t)rows * stride * 4);
            for (int32_t i = 0; i < rows * stride; i++) scores[i] = tricky(&g, levels);
            for (int32_t i = 0; i < rows * p->capacity; i++) p->surprisal[i] = tricky(&g, levels);
            for (int32_t pinned = 0; pinned <= 3 && pinned <= n; pinned += 3) {
                p->n_pinned = pinned;
                int32_t ks[] = {pinned, pinned + 1, n / 2, n - 1, n};
                for (size_t j = 0; j < 5; j++) {
                    int32_t k = ks[j];
                    if (k < pinned || k > n || k <= 0) continue;
                    check_policy(p, POLICY_FINCH, scores, stride, k, 0);
                    check_policy(p, POLICY_INFINIPOT, scores, stride, k, 0.3f);
                }
            }
            free(scores);
            pot_free(p);
        }
}
