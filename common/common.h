/* Small helpers every module may use (a module below all others, knowing
 * none of them): one-line error messages, growable vectors, and the bytes of
 * on-disk formats (little-endian integers, CRC-32C, durable renames). */
#ifndef POTSERVE_COMMON_H
#define POTSERVE_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* ---- errors ------------------------------------------------------------------
 * Formats one line into err[errlen] (nothing when err is NULL or errlen 0):
 * what every `char *err, size_t errlen` parameter here receives. */
void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- growable vectors ----------------------------------------------------------
 * A vector is any struct with `T *v; size_t n, cap;` (VEC(T) declares one);
 * zero-initialised it is empty, and the owner frees v. The macros return 0,
 * or -1 when memory is short (the vector then unchanged). */
#define VEC(T)     \
    struct {       \
        T *v;      \
        size_t n;  \
        size_t cap; \
    }
/* Room for `need` elements of `elem` bytes in *v (capacity *cap), doubling
 * from 16 elements. Used through the macros below. */
int vec_reserve_(void **v, size_t *cap, size_t need, size_t elem);
#define vec_reserve(a, need) vec_reserve_((void **)&(a)->v, &(a)->cap, (need), sizeof *(a)->v)
/* Appends one element (variadic so that a compound literal's commas pass). */
#define vec_push(a, ...) (vec_reserve((a), (a)->n + 1) ? -1 : ((a)->v[(a)->n++] = (__VA_ARGS__), 0))
/* Appends k elements from src (which may be NULL when k is 0). */
#define vec_append(a, src, k) \
    vec_append_((void **)&(a)->v, &(a)->n, &(a)->cap, (src), (k), sizeof *(a)->v)
int vec_append_(void **v, size_t *n, size_t *cap, const void *src, size_t k, size_t elem);

/* ---- bytes of on-disk formats ----------------------------------------------------
 * Little-endian integers, as every on-disk format here stores them
 * (snapshots, the server's chunk log). */
static inline void le_put_u32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static inline void le_put_u64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t le_get_u32(const unsigned char *b) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
    return v;
}
static inline uint64_t le_get_u64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* ---- time --------------------------------------------------------------------
 * The monotonic clock (CLOCK_MONOTONIC): for durations and deadlines, never
 * for dates. */
int64_t monotonic_ns(void);
double monotonic_ms(void);

/* fsyncs the directory holding path, so a file created or renamed into it
 * survives a power loss; 0 or an errno. Shared by snapshots and the server's
 * chunk log. */
int fsync_parent_dir(const char *path);

/* CRC-32C (Castagnoli) of len bytes, continuing from crc (0 to start), so
 * crc32c(crc32c(0, a, na), b, nb) == crc32c(0, a b, na + nb). */
uint32_t crc32c(uint32_t crc, const void *data, size_t len);

/* ---- UTF-8 ------------------------------------------------------------------
 * Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF): the
 * length of the valid sequence at s (n bytes available) with its code point
 * in *cp, 0 when the bytes can only be the start of a sequence cut short by
 * the end, -1 when invalid. The tokenizer's and the API's one definition. */
int utf8_seq(const unsigned char *s, size_t n, uint32_t *cp);
/* Characters of UTF-8 text: its n bytes that start one (OpenAI's limits
 * count characters, not bytes). */
size_t utf8_chars(const char *text, size_t n);

#endif
