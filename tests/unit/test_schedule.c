/* Chunk schedules: validation, names, exact plans for known settings, and the
 * invariants of both kinds over simulated documents of many lengths (each plan
 * fed back: the pot holds keep_after after a compression, n + chunk otherwise). */
#include <stdint.h>
#include <string.h>

#include "cache/cache.h"
#include "test.h"

/* The imdc chunk floor and working set as documented in cache.h, computed independently. */
static int32_t min_chunk(int32_t budget, int32_t chunk, int32_t keep) {
    int32_t c = chunk / 4 < budget - keep ? chunk / 4 : budget - keep;
    return c > 1 ? c : 1;
}
static int64_t working_set(int32_t budget, int32_t chunk, int32_t keep) {
    int64_t a = (int64_t)chunk + keep / 2, b = (int64_t)keep + min_chunk(budget, chunk, keep);
    return a > b ? a : b;
}

TEST(schedule_kind_names) {
    CHECK_EQ_INT(schedule_kind_from_name("fixed"), SCHEDULE_FIXED);
    CHECK_EQ_INT(schedule_kind_from_name("imdc"), SCHEDULE_IMDC);
    CHECK_EQ_INT(schedule_kind_from_name("IMDC"), -1);
    CHECK_EQ_INT(schedule_kind_from_name(""), -1);
    CHECK_EQ_INT(schedule_kind_from_name(NULL), -1);
    CHECK_STR(schedule_kind_name(SCHEDULE_FIXED), "fixed");
    CHECK_STR(schedule_kind_name(SCHEDULE_IMDC), "imdc");
    CHECK_STR(schedule_kind_name((enum schedule_kind)7), "unknown");
}

TEST(schedule_init_rejects_bad_settings) {
    static const struct {
        int kind;
        int32_t budget, keep, chunk, pinned;
        const char *field;
    } bad[] = {
        {SCHEDULE_FIXED, 0, 0, 16, 0, "budget_tokens"},
        {SCHEDULE_FIXED, -5, 1, 16, 0, "budget_tokens"},
        {SCHEDULE_FIXED, INT32_MAX, 1024, 512, 4, "budget_tokens"},
        {SCHEDULE_FIXED, 2048, 1024, 0, 4, "chunk_tokens"},
        {SCHEDULE_FIXED, 2048, 1024, -1, 4, "chunk_tokens"},
        {SCHEDULE_FIXED, 2048, 1024, 4096, 4, "chunk_tokens"},
        {SCHEDULE_FIXED, 2048, 2048, 512, 4, "keep_tokens"},
        {SCHEDULE_FIXED, 2048, 4096, 512, 4, "keep_tokens"},
        {SCHEDULE_FIXED, 2048, 4, 512, 4, "keep_tokens"},
        {SCHEDULE_FIXED, 2048, 0, 512, 0, "keep_tokens"},
        {SCHEDULE_FIXED, 2048, -3, 512, 0, "keep_tokens"},
        {SCHEDULE_FIXED, 2048, 1024, 512, -1, "pinned"},
        {SCHEDULE_IMDC, 1535, 1024, 1024, 4, "budget_tokens"}, /* c + m/2 = 1536 */
        {SCHEDULE_IMDC, 1500, 1000, 1024, 4, "budget_tokens"},
        {SCHEDULE_IMDC, 1024, 1023, 1024, 4, "budget_tokens"},
        {SCHEDULE_IMDC, 1536, 1536, 1024, 4, "keep_tokens"},
        {SCHEDULE_IMDC, 1536, 1024, 0, 4, "chunk_tokens"},
        {7, 2048, 1024, 512, 4, "kind"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        chunk_schedule s;
        char err[256] = "";
        int rc = schedule_init(&s, (enum schedule_kind)bad[i].kind, bad[i].budget, bad[i].keep,
                               bad[i].chunk, bad[i].pinned, err, sizeof err);
        CHECK_EQ_INT(rc, -1);
        if (!strstr(err, bad[i].field)) {
            test_failures++;
            fprintf(stderr, "  case %zu: \"%s\" does not name %s\n", i, err, bad[i].field);
        }
    }
    chunk_schedule s;
    char err[256];
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_FIXED, 2048, 1024, 1024, 4, err, sizeof err), 0);
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_FIXED, 2, 1, 2, 0, err, sizeof err), 0);
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 1536, 1024, 1024, 4, err, sizeof err), 0);
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 2304, 2048, 1024, 4, err, sizeof err), 0);
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 2048, 2047, 1024, 4, err, sizeof err), 0);
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 3, 2, 1, 1, err, sizeof err), 0);
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 1 << 24, (1 << 24) - (1 << 21), 1 << 22, 4, err,
                               sizeof err),
                 0);
    CHECK(s.step == 0 && s.tokens_planned == 0);
}

TEST(schedule_fixed_plans) {
    chunk_schedule s;
    char err[256];
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_FIXED, 2048, 1024, 1024, 4, err, sizeof err), 0);
    /* 4 pinned entries, then 1024, 1020 (fills the pot), then compress to 1024, chunks of 1024 */
    chunk_plan p = schedule_next(&s, 4);
    CHECK(p.chunk_tokens == 1024 && !p.compress_after && p.keep_after == 1024);
    p = schedule_next(&s, 1028);
    CHECK(p.chunk_tokens == 1020 && p.compress_after && p.keep_after == 1024);
    p = schedule_next(&s, 1024);
    CHECK(p.chunk_tokens == 1024 && p.compress_after && p.keep_after == 1024);
    CHECK_EQ_INT(s.step, 3);
    CHECK_EQ_INT(s.tokens_planned, 1024 + 1020 + 1024);
    /* a full (or impossible) pot is a caller error: zero plan, state unchanged */
    static const int32_t wrong[] = {2048, 2049, -1, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        p = schedule_next(&s, wrong[i]);
        CHECK(p.chunk_tokens == 0 && !p.compress_after && p.keep_after == 0);
    }
    CHECK_EQ_INT(s.step, 3);
    CHECK_EQ_INT(s.tokens_planned, 1024 + 1020 + 1024);
    /* one slot of room left: a chunk of 1 that fills the pot */
    p = schedule_next(&s, 2047);
    CHECK(p.chunk_tokens == 1 && p.compress_after);
    /* an uninitialized-looking (zeroed) schedule never plans a chunk */
    chunk_schedule zero;
    memset(&zero, 0, sizeof zero);
    CHECK_EQ_INT(schedule_next(&zero, 0).chunk_tokens, 0);
}

TEST(schedule_imdc_plans) {
    chunk_schedule s;
    char err[256];
    /* c = m_max = 1024, 4 pinned: W = 1536; memory keeps everything up to 1024 */
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 1536, 1024, 1024, 4, err, sizeof err), 0);
    chunk_plan p = schedule_next(&s, 4);
    CHECK(p.chunk_tokens == 1024 && p.compress_after && p.keep_after == 1024);
    for (int i = 0; i < 5; i++) {
        p = schedule_next(&s, 1024);
        CHECK(p.chunk_tokens == 512 && p.compress_after && p.keep_after == 1024);
    }
    /* c = 1024, m_max = 2048 (past the paper's m_max < 2c): the floor c/4 raises W to 2304 */
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 4096, 2048, 1024, 4, err, sizeof err), 0);
    static const int32_t want_chunk[] = {1024, 1024, 256, 256, 256};
    static const int32_t want_keep[] = {1028, 2048, 2048, 2048, 2048};
    static const int want_compress[] = {0, 1, 1, 1, 1};
    int32_t n = 4;
    for (int i = 0; i < 5; i++) {
        p = schedule_next(&s, n);
        CHECK_EQ_INT(p.chunk_tokens, want_chunk[i]);
        CHECK_EQ_INT(p.keep_after, want_keep[i]);
        CHECK_EQ_INT(p.compress_after, want_compress[i]);
        CHECK(n + p.chunk_tokens <= 2304);
        n = p.compress_after ? p.keep_after : n + p.chunk_tokens;
    }
    /* the same with only 52 entries of room above m_max: the floor is that room */
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 2100, 2048, 1024, 4, err, sizeof err), 0);
    CHECK_EQ_INT(schedule_next(&s, 4).chunk_tokens, 1024);
    CHECK_EQ_INT(schedule_next(&s, 1028).chunk_tokens, 1024);
    p = schedule_next(&s, 2048);
    CHECK(p.chunk_tokens == 52 && p.compress_after && p.keep_after == 2048);
    /* chunks shrink from c to W - m_max as memory fills: 20 pinned, c = 40, m_max = 242 */
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 250, 242, 40, 20, err, sizeof err), 0);
    static const int32_t shrinking[] = {40, 40, 40, 40, 40, 30, 8, 8};
    n = 20;
    for (int i = 0; i < 8; i++) {
        p = schedule_next(&s, n);
        CHECK_EQ_INT(p.chunk_tokens, shrinking[i]);
        CHECK_EQ_INT(p.compress_after, i >= 5);
        n = p.compress_after ? p.keep_after : n + p.chunk_tokens;
    }
    /* a pot below the memory target (e.g. restored with T from its n_seen) is not compressed */
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 1536, 1024, 1024, 4, err, sizeof err), 0);
    s.tokens_planned = 100000;
    p = schedule_next(&s, 4);
    CHECK(p.chunk_tokens == 512 && !p.compress_after && p.keep_after == 1024);
    p = schedule_next(&s, 516);
    CHECK(p.chunk_tokens == 512 && p.compress_after && p.keep_after == 1024);
    /* a fuller pot than the plans allow (out of contract) still gets a chunk that fits */
    p = schedule_next(&s, 1500);
    CHECK(p.chunk_tokens == 36 && p.compress_after && p.keep_after == 1024);
    p = schedule_next(&s, 1536);
    CHECK_EQ_INT(p.chunk_tokens, 0);
    /* a pot that starts fuller than the target (a long unpinned prefix) keeps the working set */
    CHECK_EQ_INT(schedule_init(&s, SCHEDULE_IMDC, 2048, 1024, 1024, 4, err, sizeof err), 0);
    p = schedule_next(&s, 600);
    CHECK(p.chunk_tokens == 936 && p.compress_after && p.keep_after == 4 + 936);
    /* and one past m_max (restored from another schedule) still gets the floor c/4 */
    s.tokens_planned = 100000;
    p = schedule_next(&s, 1500);
    CHECK(p.chunk_tokens == 256 && p.compress_after && p.keep_after == 1024);
}

typedef struct sim_result {
    int64_t steps, compressions, total;
    int32_t max_fill;
} sim_result;

/* Runs a document of L tokens through the schedule from a pot of n0 entries,
 * checking every invariant on the way. */
static sim_result simulate(enum schedule_kind kind, int32_t budget, int32_t keep, int32_t chunk,
                           int32_t pinned, int32_t n0, int64_t L) {
    sim_result r = {0, 0, 0, n0};
    chunk_schedule s;
    char err[256];
    if (schedule_init(&s, kind, budget, keep, chunk, pinned, err, sizeof err) != 0) {
        test_failures++;
        fprintf(stderr, "  init %s %d/%d/%d/%d: %s\n", schedule_kind_name(kind), budget, keep,
                chunk, pinned, err);
        return r;
    }
    int64_t B = working_set(budget, chunk, keep);
    int32_t n = n0, prev_chunk = INT32_MAX, prev_fill = n0;
    int failures_before = test_failures;
    while (r.total < L && test_failures == failures_before) {
        chunk_plan p = schedule_next(&s, n);
        r.steps++;
        CHECK(p.chunk_tokens > 0 && p.chunk_tokens <= chunk);
        CHECK(n + p.chunk_tokens <= budget);
        if (p.chunk_tokens <= 0) break;
        if (p.compress_after) {
            CHECK(p.keep_after < n + p.chunk_tokens);
            CHECK(p.keep_after >= pinned);
        }
        if (kind == SCHEDULE_FIXED) {
            CHECK_EQ_INT(p.compress_after, n + p.chunk_tokens == budget);
            CHECK_EQ_INT(p.keep_after, keep);
        } else {
            int64_t target = pinned + s.tokens_planned;
            CHECK_EQ_INT(p.keep_after, target < keep ? target : keep);
            CHECK_EQ_INT(p.compress_after, n + p.chunk_tokens > p.keep_after);
            CHECK(n + p.chunk_tokens <= B);
            if (n == keep) CHECK_EQ_INT(n + p.chunk_tokens, B);
            CHECK(p.chunk_tokens <= prev_chunk); /* decremental */
            CHECK(p.chunk_tokens >= min_chunk(budget, chunk, keep));
            prev_chunk = p.chunk_tokens;
        }
        int64_t take = L - r.total < p.chunk_tokens ? L - r.total : p.chunk_tokens;
        r.total += take;
        if (n + take > r.max_fill) r.max_fill = (int32_t)(n + take);
        if (take == p.chunk_tokens && p.compress_after) {
            n = p.keep_after;
            r.compressions++;
        } else {
            n += (int32_t)take; /* the last piece of a document may stay uncompressed */
        }
        CHECK(n <= budget);
        if (kind == SCHEDULE_IMDC) CHECK(n >= prev_fill); /* memory never shrinks */
        prev_fill = n;
        CHECK_EQ_INT(s.tokens_planned, r.total + (p.chunk_tokens - take));
    }
    CHECK_EQ_INT(r.total, L);
    CHECK(r.max_fill <= budget);
    /* imdc never evicts from a document that fits in m_max (full attention, section 4) */
    if (kind == SCHEDULE_IMDC && n0 + L <= keep) CHECK_EQ_INT(r.compressions, 0);
    if (test_failures != failures_before)
        fprintf(stderr, "  ... in %s budget %d keep %d chunk %d pinned %d n0 %d L %lld\n",
                schedule_kind_name(kind), budget, keep, chunk, pinned, n0, (long long)L);
    return r;
}

static const struct {
    int32_t budget, keep, chunk, pinned;
} fixed_settings[] = {
    {2048, 1024, 1024, 4}, {2048, 1024, 512, 4}, {2048, 1024, 2048, 4}, {1000, 999, 7, 4},
    {10, 5, 3, 4},         {2, 1, 2, 0},         {4096, 2048, 1000, 0}, {64, 32, 48, 4},
};
static const struct {
    int32_t budget, keep, chunk, pinned;
} imdc_settings[] = {
    {1536, 1024, 1024, 4}, {2048, 1024, 1024, 4}, {2304, 2048, 1024, 4}, {1152, 1024, 512, 4},
    {1536, 1024, 768, 4},  {9, 5, 7, 4},          {3, 2, 1, 1},          {80, 16, 64, 4},
    {1017, 37, 999, 4},    {640, 512, 100, 8},    {250, 242, 40, 20},    {2100, 2048, 1024, 4},
    {1030, 1024, 8, 4},
};

TEST(schedule_invariants_over_document_lengths) {
    static const int64_t lengths[] = {1,    2,    3,    4,    5,     7,     100,    511,
                                      512,  513,  1023, 1024, 1025,  1536,  2047,   2048,
                                      2049, 3000, 4095, 5000, 12345, 65536, 100003, 1000000};
    int32_t n_fixed = sizeof fixed_settings / sizeof fixed_settings[0];
    int32_t n_imdc = sizeof imdc_settings / sizeof imdc_settings[0];
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
        for (int start = 0; start < 2; start++) {
            for (int32_t i = 0; i < n_fixed; i++) {
                int32_t n0 = start ? fixed_settings[i].pinned : 0;
                simulate(SCHEDULE_FIXED, fixed_settings[i].budget, fixed_settings[i].keep,
                         fixed_settings[i].chunk, fixed_settings[i].pinned, n0, lengths[li]);
            }
            for (int32_t i = 0; i < n_imdc; i++) {
                int32_t n0 = start ? imdc_settings[i].pinned : 0;
                simulate(SCHEDULE_IMDC, imdc_settings[i].budget, imdc_settings[i].keep,
                         imdc_settings[i].chunk, imdc_settings[i].pinned, n0, lengths[li]);
            }
        }
    /* every length up to a few pots, for small settings */
    for (int64_t L = 0; L <= 700; L++) {
        simulate(SCHEDULE_FIXED, 64, 32, 48, 4, 4, L);
        simulate(SCHEDULE_FIXED, 10, 5, 3, 4, 0, L);
        simulate(SCHEDULE_IMDC, 80, 16, 64, 4, 4, L);
        simulate(SCHEDULE_IMDC, 9, 5, 7, 4, 0, L);
        simulate(SCHEDULE_IMDC, 250, 242, 40, 20, 20, L);
        simulate(SCHEDULE_IMDC, 400, 300, 64, 4, 4, L);
    }
}

TEST(schedule_imdc_reaches_steady_state) {
    /* After the growth phase memory stays at m_max and every chunk is B - m_max. */
    sim_result r = simulate(SCHEDULE_IMDC, 1536, 1024, 1024, 4, 4, 1000000);
    /* 1024 tokens reach m_max, then 512 per step */
    CHECK_EQ_INT(r.steps, 1 + (1000000 - 1024 + 511) / 512);
    CHECK_EQ_INT(r.max_fill, 1536);
    sim_result f = simulate(SCHEDULE_FIXED, 2048, 1024, 1024, 4, 4, 1000000);
    CHECK_EQ_INT(f.max_fill, 2048);
    CHECK(f.steps < r.steps);
    /* a document that fits the first chunk is one step; the caller may leave it uncompressed */
    r = simulate(SCHEDULE_IMDC, 1536, 1024, 1024, 4, 4, 1000);
    CHECK(r.steps == 1 && r.compressions == 0 && r.max_fill == 1004);
}
