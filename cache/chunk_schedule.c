/* Chunk schedules: how many document tokens the engine forwards per step and
 * when it compresses the pot (see cache.h).
 *
 * fixed: chunks of c = chunk_tokens until the pot is full (budget), then
 * compress to keep. The working set before a compression is the whole budget.
 *
 * imdc (docs/methods.md, "IMDC"; "Memorize Step by Step", Zeng et al.), in the form that needs no document
 * length: a fixed working set W, a memory target that grows with the tokens
 * seen, and chunks that shrink as memory grows so that memory + chunk <= W.
 *   T_i   document tokens planned up to and including step i (T_-1 = 0)
 *   m(T)  = min(m_max, n_pinned + RHO * T), m_max = keep, RHO = 1
 *   c_min = max(1, min(c / 4, budget - m_max))
 *   W     = max(c + floor(m_max / 2), m_max + c_min)   (<= budget; the paper's B
 *           = c + m_max/2 unless the floor needs more)
 *   c_i   = clamp(W - max(n, m(T_{i-1})), c_min, c), and never past budget
 *   after step i compress to m_i = m(T_i) when the pot holds more than that.
 * Why RHO = 1 (memory keeps every token until it reaches m_max): without L no
 * rule with RHO < 1 can tell a document that will fit in m_max from one that
 * will not, and any RHO < 1 evicts tokens of documents the pot could hold
 * whole. RHO = 1 keeps the paper's correctness property (section 4: with
 * m_max >= L, IMDC equals full attention) and avoids IM's blind spot at
 * depths 0-10 % (section 2), and it costs little: under the section 3 cost
 * model for SmolLM2 (c = m_max = 1024, prefill FLOPs relative to FM with
 * budget c + m_max) RHO = 1 gives 0.950 at L = 8K and 0.945 at 64K, RHO = 1/2
 * 0.943 and 0.944; the paper's IMDC, which knows L, 0.894 and 0.881. Once
 * memory is full both are the same schedule: the saving comes from the
 * decremental chunks (steady working set c + m_max/2 instead of c + m_max,
 * and a pot of that size: -25 % KV memory for c = m_max).
 * c_i <= c always: chunk_tokens sizes the engine's per-step activations and
 * latency, so no step may be longer (the paper's largest chunk, c_1, can be).
 * The floor c_min keeps steps at least a quarter of c, so per-step costs (a
 * pass over the weights, one compression) stay amortized, unless the budget
 * leaves less room above m_max (then that room, as the fixed schedule's steady
 * chunk would be); where the paper's rule would leave nothing (m_max >= 2c)
 * the floor raises W to m_max + c_min. The memory target uses the schedule's
 * own token count T, never how the document arrived, so the plans depend only
 * on the settings and the document length (T can be restored from n_seen). */
#include "cache.h"

#include <stdio.h>
#include <string.h>

enum {
    IMDC_RHO_NUM = 1, /* RHO = NUM / DEN: see above */
    IMDC_RHO_DEN = 1,
    /* Largest budget and chunk accepted: 16M entries is far past any pot that fits memory. */
    SCHEDULE_MAX_TOKENS = 1 << 24,
};

static int32_t imdc_min_chunk(const chunk_schedule *s) {
    int32_t c = s->chunk_tokens / 4, room = s->budget - s->keep;
    if (room < c) c = room;
    return c > 1 ? c : 1;
}

/* Working set of the imdc schedule (int64: the inputs are validated but the sum is not). */
static int64_t imdc_working_set(const chunk_schedule *s) {
    int64_t a = (int64_t)s->chunk_tokens + s->keep / 2, b = (int64_t)s->keep + imdc_min_chunk(s);
    return a > b ? a : b;
}

static int32_t imdc_memory_target(const chunk_schedule *s, int64_t tokens) {
    int64_t m = s->n_pinned + tokens * IMDC_RHO_NUM / IMDC_RHO_DEN;
    return m < s->keep ? (int32_t)m : s->keep;
}

int schedule_init(chunk_schedule *s, enum schedule_kind kind, int32_t budget, int32_t keep,
                  int32_t chunk_tokens, int32_t n_pinned, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    if (kind != SCHEDULE_FIXED && kind != SCHEDULE_IMDC) {
        snprintf(err, errlen, "schedule: unknown kind %d", (int)kind);
        return -1;
    }
    if (budget <= 0 || budget > SCHEDULE_MAX_TOKENS) {
        snprintf(err, errlen, "budget_tokens must be in 1..%d (got %d)", SCHEDULE_MAX_TOKENS,
                 budget);
        return -1;
    }
    if (chunk_tokens <= 0 || chunk_tokens > budget) {
        snprintf(err, errlen, "chunk_tokens must be in 1..budget_tokens (%d) (got %d)", budget,
                 chunk_tokens);
        return -1;
    }
    if (n_pinned < 0) {
        snprintf(err, errlen, "schedule: pinned entries must be >= 0 (got %d)", n_pinned);
        return -1;
    }
    if (keep <= n_pinned || keep >= budget) {
        snprintf(err, errlen,
                 "keep_tokens must exceed the %d pinned entries and be below budget_tokens (%d) "
                 "(got %d)",
                 n_pinned, budget, keep);
        return -1;
    }
    if (kind == SCHEDULE_IMDC && (int64_t)chunk_tokens + keep / 2 > budget) {
        snprintf(err, errlen,
                 "budget_tokens (%d) is below the imdc working set chunk_tokens + keep_tokens/2 "
                 "= %lld",
                 budget, (long long)chunk_tokens + keep / 2);
        return -1;
    }
    s->kind = kind;
    s->budget = budget;
    s->keep = keep;
    s->chunk_tokens = chunk_tokens;
    s->n_pinned = n_pinned;
    return 0;
}

chunk_plan schedule_next(chunk_schedule *s, int32_t n) {
    chunk_plan plan = {0, 0, 0};
    if (n < 0 || n >= s->budget || s->chunk_tokens <= 0) return plan; /* caller error */
    int32_t room = s->budget - n;
    if (s->kind == SCHEDULE_IMDC) {
        int32_t mem = imdc_memory_target(s, s->tokens_planned);
        if (n > mem) mem = n;
        int64_t c = imdc_working_set(s) - mem;
        int32_t c_min = imdc_min_chunk(s);
        if (c < c_min) c = c_min;
        if (c > s->chunk_tokens) c = s->chunk_tokens;
        if (c > room) c = room;
        plan.chunk_tokens = (int32_t)c;
        plan.keep_after = imdc_memory_target(s, s->tokens_planned + c);
        plan.compress_after = n + plan.chunk_tokens > plan.keep_after;
    } else {
        plan.chunk_tokens = s->chunk_tokens < room ? s->chunk_tokens : room;
        plan.compress_after = plan.chunk_tokens == room;
        plan.keep_after = s->keep;
    }
    s->step++;
    s->tokens_planned += plan.chunk_tokens;
    return plan;
}

static const char *const schedule_names[] = {SCHEDULE_KINDS(POT_NAME_ENTRY_, )};
enum { N_SCHEDULES = sizeof schedule_names / sizeof schedule_names[0] };

int schedule_kind_from_name(const char *name) {
    for (int i = 0; name && i < N_SCHEDULES; i++)
        if (strcmp(name, schedule_names[i]) == 0) return i;
    return -1;
}

const char *schedule_kind_name(enum schedule_kind k) {
    return (unsigned)k < N_SCHEDULES ? schedule_names[k] : "unknown";
}
