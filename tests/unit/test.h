/* Minimal unit-test harness: a test file defines TEST(name) { ... } and the
 * test registers itself (a constructor), so files never edit a shared table.
 * `build/unit_tests [substring]` runs the tests whose name contains the
 * substring, prints one line per failed check and ends with "N passed, N failed"
 * (and ", N skipped" when a test said it could not run here). */
#ifndef POTSERVE_TEST_H
#define POTSERVE_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Failures of the currently running test; reset by the runner before each test. */
extern int test_failures;

void test_register(const char *name, void (*fn)(void));

/* Marks the running test skipped (it must return then, having checked nothing):
 * the runner counts it apart from the passed ones and prints why. */
void test_skip(const char *why);

#define TEST(name)                                                                  \
    static void name(void);                                                         \
    __attribute__((constructor)) static void name##_register(void) {                \
        test_register(#name, name);                                                 \
    }                                                                               \
    static void name(void)

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            test_failures++;                                                        \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                           \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                          \
    do {                                                                            \
        long long a_ = (long long)(a), b_ = (long long)(b);                         \
        if (a_ != b_) {                                                             \
            test_failures++;                                                        \
            fprintf(stderr, "  %s:%d: %s == %lld, expected %s == %lld\n", __FILE__, \
                    __LINE__, #a, a_, #b, b_);                                      \
        }                                                                           \
    } while (0)

#define CHECK_STR(a, b)                                                             \
    do {                                                                            \
        const char *a_ = (a), *b_ = (b);                                            \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                    \
            test_failures++;                                                        \
            fprintf(stderr, "  %s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__,   \
                    __LINE__, #a, a_ ? a_ : "(null)", b_ ? b_ : "(null)");          \
        }                                                                           \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                       \
    do {                                                                            \
        double a_ = (double)(a), b_ = (double)(b);                                  \
        if (!(fabs(a_ - b_) <= (tol))) {                                            \
            test_failures++;                                                        \
            fprintf(stderr, "  %s:%d: %s = %g, expected %g (tol %g)\n", __FILE__,   \
                    __LINE__, #a, a_, b_, (double)(tol));                           \
        }                                                                           \
    } while (0)

/* 1 in sanitizer builds (make asan), which run the real model some twenty
 * times slower: there model-heavy tests take the tiny fixture models or fewer
 * configurations (the plain build runs them whole). */
#if defined(__SANITIZE_ADDRESS__)
enum { TEST_SANITIZED = 1 };
#else
enum { TEST_SANITIZED = 0 };
#endif

/* A float's bits and back, for bit-exact checks and hand-made values. */
static inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Path of a fixture file written by tests/make_fixtures.py (build/fixtures/NAME). */
const char *test_fixture(const char *name);
/* Path of the default model, or NULL when it is absent (tests needing it then fail). */
const char *test_model_path(void);

/* Whole-file and temporary-directory helpers (tests/unit/test_util.c; not linked
 * into the CUDA tests). Model helpers are in test_model.h. */

/* A fresh directory /tmp/<prefix>XXXXXX; NULL on failure. The caller frees it with
 * test_remove_dir. */
char *test_make_tempdir(const char *prefix);
/* Removes the files in dir, then dir itself, and frees dir (NULL is a no-op). */
void test_remove_dir(char *dir);
/* Size of the file at path in bytes, -1 when it cannot be stat'ed. */
long test_file_size(const char *path);
/* The whole file at path (one spare byte allocated), its size in *len; NULL when
 * it cannot be read. The caller frees it. */
unsigned char *test_slurp(const char *path, long *len);
/* Writes len bytes of b to path (created or truncated); 0 or -1. Nothing to free. */
int test_spit(const char *path, const unsigned char *b, long len);

#endif
