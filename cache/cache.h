/* Memory pots: the per-sequence KV store the engine reads and appends to.
 * Per layer and KV head, K (stored BEFORE RoPE: a slot's index is its RoPE
 * position, so entries can be re-packed after compaction without re-rotating)
 * and V, each [capacity][head_dim], in f16 (default) or f32; one shared count
 * of valid slots. Per (layer, head, slot): the original token index in the
 * document, its surprisal (NuC) and an accumulated attention score (H2O);
 * heads select independently, so these differ between heads.
 * Nothing here knows which backend runs. */
#ifndef POTSERVE_CACHE_H
#define POTSERVE_CACHE_H

#include <stddef.h>
#include <stdint.h>

enum pot_dtype { POT_F16 = 0, POT_F32 = 1 };

typedef struct pot_device pot_device; /* a device holding the pot's K/V (below) */

typedef struct pot {
    int32_t n_layer, n_head_kv, head_dim;
    int32_t capacity;     /* slots per (layer, head) */
    int32_t n;            /* valid slots, shared by all layers and heads */
    int32_t n_pinned;     /* front slots never evicted (template prefix, system prompt) */
    enum pot_dtype dtype;
    void *k, *v;          /* [n_layer][n_head_kv][capacity][head_dim] of dtype, K pre-RoPE */
    int64_t *token_index; /* [n_layer][n_head_kv][capacity] index of the slot's token in the document */
    float *surprisal;     /* same layout: -log p(token | what preceded it when it was read) */
    float *score_acc;     /* same layout: attention received so far (policies that accumulate) */
    uint8_t *joins;       /* same layout: 1 when the slot's token continues the word of the
                             document token before it (no space between: a digit after a digit,
                             the rest of a split name), so selection can keep words and numbers
                             whole (select_params.whole_words); set by whoever reads the tokens */
    int64_t n_seen;       /* tokens of the document seen so far (the next token index) */
    pot_device *device;   /* NULL, or the device whose K/V are authoritative (below) */
    /* Optional cache of keys rotated to their slot's RoPE position (NULL unless
     * pot_cache_rotated_keys): same layout and dtype as k, valid for slots
     * [0, n_rot) of every (layer, head). A decode step otherwise re-rotates every
     * key of the pot; a backend fills it and advances n_rot, and anything that
     * changes a key below n_rot (pot_write, pot_compact, pot_truncate) lowers
     * n_rot. Derived data: never saved, and copied only between pots that both
     * have it. */
    void *k_rot;
    int32_t n_rot;
    int original_positions; /* ablation (no context reset): see pot_rope_pos */
    /* Sliding-window layers (pot_new_windowed; NULL and unused otherwise): a
     * layer with ring[l] > 0 keeps the K/V of its newest ring[l] slots only,
     * slot s in row (ring_base + s) mod ring[l], the oldest overwritten first;
     * its slots below ring_oldest[l] were overwritten and read back as zeros.
     * Its metadata (token_index, ...) keeps every slot, as other layers'.
     * Such a layer is only ever compacted to its newest slots (pot_compact),
     * which keeps each slot's row. layer_row0[l]: the layer's first K/V row. */
    int32_t *ring, *ring_oldest;
    int64_t ring_base;
    size_t *layer_row0;
} pot;

/* Allocates an empty pot; NULL + err when sizes are invalid or memory is short.
 * The caller owns it (pot_free). */
pot *pot_new(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
             enum pot_dtype dtype, char *err, size_t errlen);
/* pot_new for a model with sliding-window layers: layer l with window[l] > 0
 * (it attends to its query and the window[l] - 1 positions before) keeps its
 * K/V in a ring of window[l] - 1 + slack rows when that is fewer than
 * capacity; slack is the most tokens one forward appends (and a truncation
 * removes) while the next query still needs the window: a chunk with its
 * scoring rows. window NULL: pot_new. */
pot *pot_new_windowed(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                      enum pot_dtype dtype, const int32_t *window, int32_t slack, char *err, size_t errlen);
void pot_free(pot *p);
/* Bytes a pot of these sizes holds (for admission control), 0 on overflow. */
size_t pot_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                 enum pot_dtype dtype);
/* The same for pot_new_windowed's pots (window NULL: pot_bytes). */
size_t pot_windowed_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                          enum pot_dtype dtype, const int32_t *window, int32_t slack);
/* Bytes p holds (pot_windowed_bytes of its sizes; the rotated-key cache not counted). */
size_t pot_memory(const pot *p);
/* Rows of layer's ring, 0 for a layer that keeps every slot. */
int32_t pot_ring_rows(const pot *p, int32_t layer);
/* Index of (layer, head, slot) in the per-slot arrays. */
size_t pot_slot(const pot *p, int32_t layer, int32_t head, int32_t slot);
/* Its row (head_dim elements) in k, v and k_rot: pot_slot but for pots with
 * ring layers. Rows of consecutive slots are adjacent except in a ring. */
size_t pot_row(const pot *p, int32_t layer, int32_t head, int32_t slot);

/* Stores one slot's pre-RoPE key and value (head_dim floats each), converting
 * to the pot's dtype. 0, or -1 with nothing written when a device held the
 * pot and reading its K/V back failed (pot_host_take): the host copy is then
 * stale and the pot lost. */
int pot_write(pot *p, int32_t layer, int32_t head, int32_t slot, const float *k, const float *v);
/* Allocates p->k_rot (empty: n_rot = 0); 0, or -1 when memory is short. For
 * pots that decode many steps over many entries (generations, answers). */
int pot_cache_rotated_keys(pot *p);
/* Bytes pot_cache_rotated_keys adds to a pot of these sizes. */
size_t pot_rotated_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                         enum pot_dtype dtype);
/* Stores / reads rotated keys (head_dim floats a slot) in p->k_rot; the caller
 * keeps n_rot consistent. */
void pot_write_k_rotated(pot *p, int32_t layer, int32_t head, int32_t slot, const float *k);
void pot_read_k_rotated(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst);
/* Rounds a row of head_dim floats to the pot's entry precision (f16: the
 * value a store and a load give back; f32: unchanged). Backends round rotated
 * keys so, whether or not they come from the cache: as llama.cpp, which
 * stores keys after RoPE in f16. */
void pot_round_row(const pot *p, float *row);
/* Reads n consecutive slots from slot0 as f32 rows into dst ([n][head_dim]). */
void pot_read_k(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst);
void pot_read_v(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst);

/* The RoPE position of (layer, head, slot): the slot itself (context-reset
 * positions, the default). With original_positions (InfiniPot's ablation of
 * the InfiniPot paper's Table 4: a plain sliding cache) it is the token's index in the
 * stream instead, and slots from p->n on (a forward's new tokens) continue
 * from n_seen, so positions grow past the model's window on long documents.
 * Without evictions both agree. Every backend that honours the flag rotates
 * by this and nothing else. */
int64_t pot_rope_pos(const pot *p, int32_t layer, int32_t head, int32_t slot);

/* Forgets every slot from n on (n <= p->n); used to drop a question's tokens. */
void pot_truncate(pot *p, int32_t n);
/* After a backend wrote K/V for n new entries at slots p->n ... p->n + n - 1
 * of every (layer, head): makes them valid, with the next document token
 * indices and zero surprisal and score (every backend ends a forward so). */
void pot_append_done(pot *p, int32_t n);
/* Copies the valid slots of src into dst (same shape and dtype, dst->capacity >= src->n). */
int pot_copy(pot *dst, const pot *src);

/* Keeps, in every (layer, head), the n_keep slots listed in
 * keep[(layer * n_head_kv + head) * n_keep + i] (strictly increasing, < p->n),
 * moving them to slots 0..n_keep-1 in that order; p->n becomes n_keep. Slot
 * index is the RoPE position, so kept keys are re-positioned by this move.
 * 0, or -1 with nothing moved when a ring layer's list is not its newest
 * n_keep slots, or when the K/V had to come back from a device and could not
 * (pot_host_take): the pot is then lost. */
int pot_compact(pot *p, const int32_t *keep, int32_t n_keep);

/* ---- pots held by a device (cache/pot_device.c) ---------------------------------
 * A backend that keeps pots in device memory (cuda/) attaches a pot_device
 * to the pot. Its K/V are then the authoritative ones: p->k and p->v are a
 * host copy that is brought up to date (sync) only when host code needs it:
 * pot_read_k/v, pot_copy from the pot, a snapshot. pot_compact moves the
 * per-slot metadata (token_index, surprisal, score_acc: always current on
 * the host, the policies select with them) and lets the device move its K/V;
 * pot_write takes the pot back to the host (sync, release); pot_free and
 * pot_copy into the pot release the device's copy. With device == NULL
 * nothing changes. The callbacks run on the thread that owns the pot. */
struct pot_device {
    /* Brings p->k, p->v up to the device's K/V of slots [0, p->n). 0 or -1. */
    int (*sync)(pot_device *d, pot *p);
    /* pot_compact's K/V move (same keep list) done on the device. 0, or -1
     * with the device's copy unchanged (pot_compact then takes the pot back
     * to the host and compacts it there). */
    int (*compact)(pot_device *d, pot *p, const int32_t *keep, int32_t n_keep);
    /* Optional (NULL: none): dst's K/V slots [0, src->n) made on the device
     * from src's (src->device == d), dst attached to d. 0, or -1 with dst
     * unchanged (pot_copy then copies through the host). */
    int (*copy)(pot_device *d, pot *dst, const pot *src);
    /* Drops the device's copy without syncing; sets p->device = NULL. */
    void (*release)(pot_device *d, pot *p);
};

/* Brings the host's K/V of p up to date when a device holds them (the host
 * copy is a cache, hence const). 0, or -1 when the device failed. */
int pot_host_sync(const pot *p);
/* Makes the host authoritative again: sync, then release the device's copy.
 * 0, or -1 when the sync failed (the device's copy is released anyway). */
int pot_host_take(pot *p);

/* ---- compression policies (cache/policy.c) -------------------------------------
 * Every policy is one primitive with different inputs: score the pot's slots,
 * pick n_keep per (layer, KV head) (pinned slots always), keep them in document
 * order (pot_compact). Which rows produce the scores is the engine's business:
 * catalyst rows (infinipot), question rows (finch), the chunk's last rows
 * (snapkv), every row (h2o); streaming and truncate need no scores. */

/* The policies, the one list their enum, names and messages derive from:
 * X(ID, "name") per policy, SEP between two. */
#define POT_POLICIES(X, SEP)                                                                  \
    X(INFINIPOT, "infinipot") SEP /* catalyst-prompt attention (CaP) + novelty under          \
                                     compression (NuC) */                                     \
    X(FINCH, "finch") SEP         /* question-row attention */                               \
    X(SNAPKV, "snapkv") SEP       /* observation window (last rows of the chunk), pooled */  \
    X(STREAMING, "streaming") SEP /* attention sinks + most recent entries */                \
    X(H2O, "h2o") SEP             /* accumulated attention (heavy hitters) + recent entries */ \
    X(CASCADE, "cascade") SEP     /* cascading sub-caches with EMA attention scores          \
                                     (cache/cascade.c) */                                     \
    X(TRUNCATE, "truncate") SEP   /* head + tail of the document */                          \
    X(NONE, "none")               /* never compress: a document that does not fit is refused */

/* X's of the name lists: the name alone, and the name with a comma */
#define POT_NAME_STRING_(id, name) name
#define POT_NAME_ENTRY_(id, name) name,
#define POT_POLICY_ENUM_(id, name) POLICY_##id,
enum pot_policy { POT_POLICIES(POT_POLICY_ENUM_, ) POLICY_COUNT_ };
/* "infinipot, finch, ..." (a string literal): for messages and help texts */
#define POT_POLICY_LIST POT_POLICIES(POT_NAME_STRING_, ", ")

int pot_policy_from_name(const char *name); /* -1 for an unknown name */
const char *pot_policy_name(enum pot_policy p);
/* POT_POLICY_LIST, for messages */
const char *pot_policy_list(void);

typedef struct select_params {
    enum pot_policy policy;
    int32_t n_keep;       /* entries to keep per (layer, head), pinned included */
    const float *scores;  /* [n_layer][n_head_kv][scores_stride] attention received by each slot,
                             for the policies that use scores (NULL otherwise) */
    int32_t scores_stride;
    float nuc_share;      /* infinipot: share of the unpinned kept slots chosen by surprisal (alpha) */
    int32_t window;       /* snapkv: newest entries always kept; h2o/streaming: see policy.c */
    int32_t n_sinks;      /* streaming: oldest unpinned entries always kept */
    int32_t pool;         /* width of the pooling of scores over neighbouring slots before the
                             top-k (odd; 0 or 1: none): snapkv the mean (its paper); infinipot
                             (CaP scores and NuC surprisal) and finch the max, so that a kept
                             token keeps its neighbours: spans survive, not scattered tokens.
                             Centred, except NuC's: from pool/4 slots before a surprising
                             token to the rest after it (pot_nuc_lead) */
    int shared;           /* infinipot, finch, snapkv: one choice for every layer and head, by the
                             scores summed over them (surprisal from layer 0, head 0), so a fact
                             is kept or dropped whole in all layers; needs a pot whose heads hold
                             the same tokens (one only ever compacted so) */
    int32_t regions;      /* infinipot: > 1 splits NuC's slots evenly between this many equal parts
                             of the document read so far (by token index) */
    int whole_words;      /* infinipot, finch, snapkv: after the pooling, every slot of a word (a
                             run of slots joined by pot.joins) takes the word's best score, so a
                             word or number is kept or dropped as one, not cut (a 7-digit number
                             that loses its last digit answers wrong) */
    uint8_t *why;         /* NULL, or [n_layer][n_head_kv][p->n] filled with each slot's
                             pot_keep_reason (diagnostics: which scorer won a slot) */
} select_params;

/* Why pot_select kept a slot (select_params.why). */
enum pot_keep_reason {
    POT_DROPPED = 0,
    POT_KEPT_PINNED,  /* the pinned prefix */
    POT_KEPT_FORCED,  /* the policy's fixed slots: snapkv's window, sinks, recent entries */
    POT_KEPT_NUC,     /* infinipot: by surprisal */
    POT_KEPT_SCORE    /* by attention score (CaP, question rows, observation rows, H2O) */
};

/* Slots before a surprising token in NuC's span of `width` (the rest follow it). */
int32_t pot_nuc_lead(int32_t width);
/* Chooses, for every (layer, head), n_keep of p's valid slots into
 * keep[(layer * n_head_kv + head) * n_keep + i], strictly increasing: the
 * pinned slots, then what the policy prefers (ties go to the older slot).
 * 0, or -1 with err (n_keep out of range, scores missing). */
int pot_select(const pot *p, const select_params *sp, int32_t *keep, char *err, size_t errlen);
/* Adds scores ([n_layer][n_head_kv][stride], first p->n entries) to p->score_acc (h2o). */
void pot_accumulate_scores(pot *p, const float *scores, int32_t stride);
/* p->score_acc of each valid slot becomes the larger of it and scores (same layout as
 * pot_accumulate_scores): an entry keeps the best score any compression gave it. */
void pot_remember_max_scores(pot *p, const float *scores, int32_t stride);

/* ---- the cascading policy (cache/cascade.c) ----------------------------------
 * Cascading KV Cache (Willette et al.): sinks, then N cascades of C/N entries per (layer, KV head); state
 * lives beside the pot. The caller keeps p->score_acc as each entry's moving
 * average of attention, then after each chunk calls cascade_update with the
 * chunk's document token indices and, when that returns fewer than p->n,
 * cascade_keep + pot_compact. */
typedef struct cascade cascade;
cascade *cascade_new(int32_t n_layer, int32_t n_head_kv, int32_t n_cascades, int32_t capacity,
                     int32_t n_sinks, char *err, size_t errlen);
void cascade_free(cascade *c);
/* Inserts tokens [first, first + n) (already in p); returns the entries to keep. */
int32_t cascade_update(cascade *c, const pot *p, int64_t first, int64_t n);
/* The kept slots of every (layer, head), increasing, n_keep each (the value
 * cascade_update returned). 0, or -1 if the state and the pot disagree. */
int cascade_keep(const cascade *c, const pot *p, int32_t *keep, int32_t n_keep);

/* ---- chunk schedules (cache/chunk_schedule.c) ---------------------------------------
 * Engine chunks are chosen here, never by how a client split its upload. The
 * engine asks for the next plan with the pot's current fill, forwards that
 * many tokens (fewer only at the end of the document), then compresses the pot
 * to keep_after entries when compress_after is set. */

/* The schedules, as POT_POLICIES: X(ID, "name"). */
#define SCHEDULE_KINDS(X, SEP)                                                                \
    X(FIXED, "fixed") SEP /* chunks of chunk_tokens; compress to keep when the pot is full */ \
    X(IMDC, "imdc")       /* incremental memory, decremental chunks ("Memorize Step by Step"), \
                             without knowing the document length (docs/methods.md, "IMDC") */
#define SCHEDULE_KIND_ENUM_(id, name) SCHEDULE_##id,
enum schedule_kind { SCHEDULE_KINDS(SCHEDULE_KIND_ENUM_, ) SCHEDULE_COUNT_ };
/* "fixed, imdc" (a string literal) */
#define SCHEDULE_KIND_LIST SCHEDULE_KINDS(POT_NAME_STRING_, ", ")

typedef struct chunk_schedule {
    enum schedule_kind kind;
    int32_t budget;       /* |M|: document entries the pot may hold */
    int32_t keep;         /* |C|: entries kept by a compression (fixed); m_max for imdc */
    int32_t chunk_tokens; /* c: chunk size (fixed); the first and base chunk for imdc */
    int32_t n_pinned;     /* front entries that are never evicted (count toward budget) */
    /* state, advanced by schedule_next */
    int32_t step;
    int64_t tokens_planned;
} chunk_schedule;

typedef struct chunk_plan {
    int32_t chunk_tokens; /* > 0; 0 only for a caller error (see schedule_next) */
    int compress_after;   /* compress once this chunk is in */
    int32_t keep_after;   /* entries to keep when compressing (< pot fill then, >= n_pinned) */
} chunk_plan;

/* Validates the settings (0 <= pinned < keep < budget, 0 < chunk <= budget,
 * imdc: budget >= chunk + keep/2, budget <= 2^24). 0, or
 * -1 with the offending field named in err. Resets the state. */
int schedule_init(chunk_schedule *s, enum schedule_kind kind, int32_t budget, int32_t keep,
                  int32_t chunk_tokens, int32_t n_pinned, char *err, size_t errlen);
/* The next chunk for a pot holding n entries (0 <= n < budget: a full pot has
 * been compressed by the previous plan). Guarantees 0 < chunk_tokens <=
 * the schedule's chunk_tokens, n + chunk_tokens <= budget, and
 * n + chunk_tokens == budget whenever compress_after is set by the fixed
 * schedule. n < 0 or n >= budget is a caller error: the plan is all zeros and
 * the state does not advance. When the document ends inside a chunk the caller
 * forwards the remainder only; the pot then fits the budget, so compressing
 * after that last piece is the caller's choice (and only if fill > keep_after).
 * imdc: memory target min(keep, n_pinned + T) after T planned document tokens
 * (a document that fits in keep is never compressed), working set
 * W = max(chunk + keep/2, keep + c_min) <= budget, chunks W - memory within
 * [c_min, chunk], c_min = max(1, min(chunk/4, budget - keep)) (the rule and
 * its reasons: chunk_schedule.c). */
chunk_plan schedule_next(chunk_schedule *s, int32_t n);
/* Name <-> kind ("fixed", "imdc"); -1 for an unknown name. */
int schedule_kind_from_name(const char *name);
const char *schedule_kind_name(enum schedule_kind k);

/* ---- snapshots (cache/snapshot.c) -------------------------------------------------
 * A pot on disk: a versioned header (format version, model fingerprint, the
 * session's settings as text, the byte offset of the session log the pot
 * covers), optional extra bytes of the caller's (a document's state beside its
 * pot), the pot's valid slots, and a checksum over everything. Written to a
 * temporary file, fsynced and renamed, so a crash leaves the old snapshot or
 * the new one, never a torn file. */

typedef struct pot_snapshot_meta {
    uint64_t model_fingerprint; /* identifies the model the pot was computed with */
    uint64_t log_offset;        /* bytes of the session log this pot covers */
    char settings[1024];        /* the session's pot settings, as the caller encodes them */
} pot_snapshot_meta;

/* Writes p and meta to path atomically (path.tmp, fsync, rename, fsync dir).
 * 0, or -1 with err; on failure the previous file at path is untouched and no
 * temporary file is left (except when only the final directory fsync fails:
 * the new snapshot is then in place but may not survive a power loss).
 * meta->settings must be NUL-terminated. One writer per path at a time.
 * Layout (little-endian, CRC-32C at the end): cache/snapshot.c. */
int pot_snapshot_write(const char *path, const pot *p, const pot_snapshot_meta *meta, char *err,
                       size_t errlen);
/* pot_snapshot_write that also stores extra[extra_len] (opaque bytes, borrowed,
 * at most 2^30) under the same checksum and the same atomic replacement. */
int pot_snapshot_write_extra(const char *path, const pot *p, const pot_snapshot_meta *meta,
                             const void *extra, size_t extra_len, char *err, size_t errlen);
/* Reads a snapshot: NULL with one line in err for a missing, truncated,
 * corrupt (checksum), foreign or future-version file. On success the pot
 * (capacity = max(its n, min_capacity, 1)) is the caller's and meta is filled.
 * Reads format versions 1 to 3; extra bytes, if any, are checked and dropped. */
pot *pot_snapshot_read(const char *path, int32_t min_capacity, pot_snapshot_meta *meta, char *err,
                       size_t errlen);
/* pot_snapshot_read that also hands out the extra bytes: *extra a malloc'd copy
 * the caller frees and *extra_len its length (NULL and 0 when there are none:
 * empty, or a version 1 file; and on failure). extra_len may be NULL; extra
 * NULL drops them. */
pot *pot_snapshot_read_extra(const char *path, int32_t min_capacity, pot_snapshot_meta *meta,
                             void **extra, size_t *extra_len, char *err, size_t errlen);

#endif
