/* Aggregate decode throughput of the engine thread (engine/sched.c) with 1,
 * 4, 8 and 16 concurrent greedy generations of 64 tokens each on the default
 * model with 2 worker threads: every decode step of all of them is one
 * batched forward, so the weights stream once per step instead of once per
 * sequence. Not part of `make test`. From the repository root:
 *
 *   make bench-batch            (builds build/bench_batch and runs it)
 *   build/bench_batch [MODEL] [THREADS] [COUNTS]
 *
 * COUNTS is a comma-separated list of sequence counts (default 1,4,8,16),
 * e.g. "8" alone for a profile of the 8-sequence step.
 *
 * Columns: sequences, tokens generated in all, the decode wall time (from the
 * end of the prompts' prefill to the last token; the prompts are short and
 * prefilled in the first step), aggregate tokens per second, its ratio to one
 * sequence, and the time of one step (what each stream waits per token).
 * Best of REPEATS runs. The end-of-sequence token is banned so every
 * generation runs its 64 tokens. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

enum { MAX_SEQS = 16, N_TOKENS = 64, REPEATS = 2 };

static const char *const topics[MAX_SEQS] = {
    "the ocean", "mountains", "a busy city", "the history of bread", "volcanoes", "honeybees",
    "the moon landing", "jazz music", "winter forests", "old libraries", "trains", "deserts",
    "the printing press", "coral reefs", "chess", "thunderstorms",
};

typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, failed;
    engine_gen_result res[MAX_SEQS];
} run;

typedef struct slot {
    run *r;
    int i;
} slot;

static void on_done(void *user, int rc, const engine_gen_result *res, const char *err) {
    slot *s = user;
    pthread_mutex_lock(&s->r->mu);
    s->r->res[s->i] = *res;
    if (rc) {
        fprintf(stderr, "generation %d: %s\n", s->i, err);
        s->r->failed = 1;
    }
    s->r->done++;
    pthread_cond_signal(&s->r->cv);
    pthread_mutex_unlock(&s->r->mu);
}

/* Runs n generations together; aggregate tokens and decode seconds. */
static int run_batch(engine *e, int n, int64_t *tokens, double *seconds) {
    char err[512];
    int32_t *prompts[MAX_SEQS] = {0};
    size_t n_prompt[MAX_SEQS];
    logit_bias ban = {engine_eos(e), -INFINITY};
    run r = {.done = 0};
    slot slots[MAX_SEQS];
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    engine_sched *s = engine_sched_new(e, err, sizeof err);
    int rc = s ? 0 : -1, submitted = 0;
    for (int i = 0; !rc && i < n; i++) {
        char text[256];
        snprintf(text, sizeof text, "Here is a long essay about %s.\n\n", topics[i]);
        prompts[i] = engine_tokenize_prompt(e, text, &n_prompt[i], err, sizeof err);
        if (!prompts[i]) {
            rc = -1;
            break;
        }
        engine_gen_params gp = {.sampling = sample_params_default(), .max_tokens = N_TOKENS};
        gp.sampling.temperature = 0;
        gp.sampling.bias = &ban;
        gp.sampling.n_bias = 1;
        slots[i] = (slot){&r, i};
        engine_gen_request req = {.prompt = prompts[i], .n_prompt = n_prompt[i], .params = gp,
                                  .on_done = on_done, .user = &slots[i]};
        rc = engine_sched_generate(s, &req, err, sizeof err);
        submitted += !rc;
    }
    pthread_mutex_lock(&r.mu);
    while (r.done < submitted) pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    engine_sched_free(s);
    if (rc) fprintf(stderr, "%s\n", err);
    *tokens = 0;
    *seconds = 0;
    for (int i = 0; i < submitted; i++) {
        *tokens += r.res[i].n_generated;
        if (r.res[i].decode_ms / 1e3 > *seconds) *seconds = r.res[i].decode_ms / 1e3;
    }
    for (int i = 0; i < n; i++) free(prompts[i]);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    return rc || r.failed ? -1 : 0;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    char err[512];
    engine_options opt = {.n_threads = threads};
    engine *e = engine_open(path, &opt, err, sizeof err);
    if (!e) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    engine_info info;
    engine_get_info(e, &info);
    printf("%s (%s), %d threads, %d greedy tokens per sequence, best of %d\n\n", info.name,
           info.quant, info.n_threads, N_TOKENS, REPEATS);
    printf("| sequences | tokens | decode s | tokens/s | vs 1 | ms/step |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    int counts[8] = {1, 4, 8, 16}, n_counts = 4;
    if (argc > 3) {
        n_counts = 0;
        for (char *tok = strtok(argv[3], ","); tok && n_counts < 8; tok = strtok(NULL, ",")) {
            int n = atoi(tok);
            if (n < 1 || n > MAX_SEQS) {
                fprintf(stderr, "sequence counts must be 1..%d: %s\n", MAX_SEQS, tok);
                return 2;
            }
            counts[n_counts++] = n;
        }
    }
    double base = 0;
    for (int c = 0; c < n_counts; c++) {
        int n = counts[c];
        double best = 0, best_s = 0;
        int64_t best_tok = 0;
        for (int rep = 0; rep < REPEATS; rep++) {
            int64_t tok;
            double sec;
            if (run_batch(e, n, &tok, &sec)) {
                engine_close(e);
                return 1;
            }
            if (sec > 0 && tok / sec > best) best = tok / sec, best_s = sec, best_tok = tok;
        }
        if (n == 1) base = best;
        printf("| %d | %lld | %.2f | %.1f | %.2fx | %.1f |\n", n, (long long)best_tok, best_s, best,
               base > 0 ? best / base : 0, best_s * 1e3 / (double)(best_tok / n));
        fflush(stdout);
    }
    engine_close(e);
    return 0;
}
