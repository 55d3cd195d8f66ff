/* POST /v1/embeddings: OpenAI's embeddings request and response. Inputs are
 * tokenized (off the loop when the body is large), then read on the engine
 * thread by engine tasks of about EMBED_TASK_TOKENS tokens each
 * (engine_embedder), so that generations and ingests take their turns in
 * between; a client that leaves stops the work after the task under way.
 * The answer's text is made off the loop. */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server_internal.h"

enum {
    EMBED_TASK_TOKENS = 1024, /* tokens read in one engine task: then the engine's other work */
    EMBED_RETRY_SECONDS = 2,  /* a 429's Retry-After: other requests' pots are freed as they end */
};

typedef struct embed_job {
    server *srv;
    request *r;
    api_embed_request q;
    int32_t **ids;  /* [n]: each input's token ids (q's own, or tokenized here) */
    size_t *lens;
    float *vecs;    /* [n][n_embd] */
    engine_embedder *x; /* on the engine thread */
    int64_t tokens;     /* of all inputs */
    int64_t task_tokens; /* read by the last engine task */
    int rc;             /* of the last step: 1 more to read, 0 done, -1 failed (err) */
    int stop;           /* the next task frees the embedder, and the job is done */
    double deadline_ms; /* request_timeout (0: none) */
    size_t memory;      /* its pots' bytes at most, counted in the server's pot_memory while it runs */
    char err[256];
    char *text;     /* the answer */
    size_t len;
    api_error e;
} embed_job;

static void embed_job_free(embed_job *j) {
    engine_embedder_free(j->x);
    if (j->memory) j->srv->pot_memory -= j->memory;
    for (size_t i = 0; j->ids && i < j->q.n; i++)
        if (j->q.texts[i]) free(j->ids[i]);
    free(j->ids);
    free(j->lens);
    free(j->vecs);
    free(j->text);
    api_embed_request_free(&j->q);
    free(j);
}

/* Tokenizes the text inputs (as llama.cpp's embedding does: the model's
 * special tokens added, none parsed from the text) and checks every length. */
static void embed_tokenize(void *arg) {
    embed_job *j = arg;
    const int32_t window = j->srv->info.n_ctx_train;
    for (size_t i = 0; !j->e.status && i < j->q.n; i++) {
        if (j->q.texts[i]) {
            size_t len = strlen(j->q.texts[i]);
            int64_t n = engine_tokenize(j->srv->eng, j->q.texts[i], len, 1, 0, NULL, 0);
            if (n < 0) {
                api_fail(&j->e, 400, "invalid_utf8", "input", "input[%zu] is not valid UTF-8", i);
                break;
            }
            if (n > window) {
                api_fail(&j->e, 400, "context_length_exceeded", "input",
                         "input[%zu] has %lld tokens, more than the model's window of %d", i, (long long)n, window);
                break;
            }
            if (!(j->ids[i] = malloc((size_t)(n ? n : 1) * sizeof **j->ids))) {
                api_fail(&j->e, 500, NULL, NULL, "out of memory");
                break;
            }
            engine_tokenize(j->srv->eng, j->q.texts[i], len, 1, 0, j->ids[i], n);
            j->lens[i] = (size_t)n;
        } else {
            j->ids[i] = j->q.tokens[i];
            j->lens[i] = j->q.counts[i];
            if (j->lens[i] > (size_t)window)
                api_fail(&j->e, 400, "context_length_exceeded", "input",
                         "input[%zu] has %zu tokens, more than the model's window of %d", i, j->lens[i], window);
        }
        if (!j->e.status && !j->lens[i]) api_fail(&j->e, 400, "invalid_value", "input", "input[%zu] has no tokens", i);
        j->tokens += (int64_t)j->lens[i];
    }
}

static void base64_encode(const unsigned char *src, size_t n, char *out) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)src[i] << 16 | (i + 1 < n ? (uint32_t)src[i + 1] << 8 : 0) | (i + 2 < n ? src[i + 2] : 0);
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = i + 1 < n ? abc[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? abc[v & 63] : '=';
    }
    out[o] = 0;
}

/* One embedding as the request asked: floats, or base64 of little-endian float32s. */
static json_t *embedding_value(const float *v, int32_t d, int base64) {
    if (!base64) {
        json_t *a = json_array();
        for (int32_t k = 0; a && k < d; k++)
            if (json_array_append_new(a, json_real(v[k]))) json_decref(a), a = NULL;
        return a;
    }
    unsigned char *bytes = malloc((size_t)d * 4);
    char *text = malloc(((size_t)d * 4 + 2) / 3 * 4 + 1);
    json_t *s = NULL;
    if (bytes && text) {
        for (int32_t k = 0; k < d; k++) {
            uint32_t u;
            memcpy(&u, &v[k], 4);
            le_put_u32(bytes + 4 * (size_t)k, u);
        }
        base64_encode(bytes, (size_t)d * 4, text);
        s = json_string(text);
    }
    free(bytes);
    free(text);
    return s;
}

static void embed_answer(void *arg) {
    embed_job *j = arg;
    const int32_t d = j->srv->info.n_embd;
    json_t *data = json_array();
    for (size_t i = 0; data && i < j->q.n; i++) {
        json_t *v = embedding_value(j->vecs + i * (size_t)d, d, j->q.base64);
        if (!v || json_array_append_new(data, json_pack("{s:s, s:I, s:o}", "object", "embedding", "index",
                                                        (json_int_t)i, "embedding", v)))
            json_decref(data), data = NULL;
    }
    json_t *body = data ? json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model",
                                    j->srv->model_id, "usage", "prompt_tokens", (json_int_t)j->tokens,
                                    "total_tokens", (json_int_t)j->tokens)
                        : NULL;
    /* float32 values need 9 significant digits to come back exactly, not jansson's 17 */
    if (!(j->text = json_text_flags(body, JSON_COMPACT | JSON_REAL_PRECISION(9), &j->len)))
        api_fail(&j->e, 500, NULL, NULL, "out of memory");
}

static void embed_answered(request *r, void *arg) {
    embed_job *j = arg;
    if (j->e.status) {
        respond_error(r, &j->e);
    } else {
        r->tokens = j->tokens;
        respond_json_text(r, 200, j->text, j->len);
        j->text = NULL;
    }
    embed_job_free(j);
}

static void embed_submit(embed_job *j);

/* The loop, after each engine task: answer, stop, or read on. */
static void embed_task_back(server *s, void *arg) {
    embed_job *j = arg;
    request *r = j->r;
    s->m.tokens_embedded += j->task_tokens;
    if (j->stop) { /* the embedder is freed: nothing more to do */
        embed_job_free(j);
    } else if (!r->conn || request_client_gone(r)) {
        if (r->conn) { /* the answer lets MHD see the close */
            client_closed_error(&j->e, "reading the inputs");
            r->close_conn = 1;
            respond_error(r, &j->e);
        }
        if (j->x) { /* its pots are freed on the engine thread */
            j->stop = 1;
            embed_submit(j);
        } else {
            embed_job_free(j);
        }
    } else if (j->rc > 0 && j->deadline_ms && monotonic_ms() > j->deadline_ms) {
        api_fail(&j->e, 503, "request_timeout", NULL, "the inputs were not read within request_timeout (%lld s): "
                 "send fewer or shorter inputs at a time", (long long)s->cfg.request_timeout);
        respond_retry(r, &j->e, srv_timeout_retry_seconds(s));
        j->stop = 1;
        embed_submit(j); /* (its pots are freed on the engine thread) */
    } else if (j->rc < 0) {
        api_fail(&j->e, 500, NULL, NULL, "embedding failed: %s", j->err);
        respond_error(r, &j->e);
        embed_job_free(j);
    } else if (j->rc > 0) {
        embed_submit(j);
    } else {
        request_work(r, j->q.n * (size_t)s->info.n_embd > 64 * 1024 ? WORK_POOL : WORK_HERE, embed_answer,
                     embed_answered, j);
    }
    request_unref(r);
}

/* Engine thread: reads on for about EMBED_TASK_TOKENS tokens (or frees the
 * embedder when told to stop, or when it is done). */
static void embed_task(engine *e, void *arg) {
    embed_job *j = arg;
    j->task_tokens = 0;
    if (!j->stop && !j->x &&
        !(j->x = engine_embedder_new(e, (const int32_t *const *)j->ids, j->lens, j->q.n, j->vecs, j->err,
                                     sizeof j->err)))
        j->rc = -1;
    while (!j->stop && j->x && j->task_tokens < EMBED_TASK_TOKENS) {
        int64_t n = 0;
        j->rc = engine_embedder_step(j->x, &n, j->err, sizeof j->err);
        j->task_tokens += n;
        if (j->rc != 1) break;
    }
    if (j->stop || j->rc != 1) {
        engine_embedder_free(j->x);
        j->x = NULL;
    }
    srv_post(j->srv, embed_task_back, j);
}

static void embed_submit(embed_job *j) {
    request_ref(j->r);
    if (!j->stop) request_suspend(j->r); /* (a stopping job's request has its answer) */
    if (srv_task(j->srv, NULL, embed_task, j)) { /* the engine is stopping */
        if (!j->stop) {
            api_fail(&j->e, 503, "unavailable", NULL, "the server is shutting down");
            respond_error(j->r, &j->e);
        }
        request_unref(j->r);
        embed_job_free(j);
    }
}

/* Its pots count against pot_memory_limit while it runs, as every pot does. */
static int embed_admit(server *s, embed_job *j) {
    size_t bytes = engine_embed_memory(s->eng, j->lens, j->q.n);
    if (pot_memory_admit(s, bytes, "input", "these inputs' reading", &j->e)) return -1;
    if (!pots_make_room(s, bytes))
        return api_fail(&j->e, 429, "insufficient_memory", "input",
                        "reading these inputs needs %zu bytes of pots: %zu of pot_memory_limit %lld are in use",
                        bytes, s->pot_memory, (long long)s->cfg.pot_memory_limit);
    s->pot_memory += j->memory = bytes;
    return 0;
}

static void embed_tokenized(request *r, void *arg) {
    embed_job *j = arg;
    if (j->e.status || embed_admit(r->srv, j)) {
        if (j->e.status == 429) respond_retry(r, &j->e, EMBED_RETRY_SECONDS);
        else respond_error(r, &j->e);
        return embed_job_free(j);
    }
    embed_submit(j);
}

void route_embeddings(request *r) {
    api_error e;
    embed_job *j = calloc(1, sizeof *j);
    json_t *body = request_json(r, &e);
    if (!j) api_fail(&e, 500, NULL, NULL, "out of memory");
    int bad = !j || !body || api_parse_embeddings(body, r->srv->info.n_vocab, r->srv->info.n_embd, &j->q, &e);
    json_decref(body);
    if (!bad && (!(j->ids = calloc(j->q.n, sizeof *j->ids)) || !(j->lens = calloc(j->q.n, sizeof *j->lens)) ||
                 !(j->vecs = malloc(j->q.n * (size_t)r->srv->info.n_embd * sizeof *j->vecs))))
        bad = api_fail(&e, 500, NULL, NULL, "out of memory");
    if (bad) {
        if (j) embed_job_free(j);
        return respond_error(r, &e);
    }
    j->srv = r->srv;
    j->r = r;
    j->deadline_ms = srv_request_deadline(r->srv);
    request_work_input(r, embed_tokenize, embed_tokenized, j);
}
