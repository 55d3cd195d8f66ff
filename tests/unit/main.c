/* Unit-test runner: runs every registered test, or those a name argument
 * selects (a test runs if its name contains one of the plain arguments, or
 * there are none, and none of the "!"-prefixed ones), names the slowest ones
 * (where a slow CI run's time went) and ends with the "N passed, N failed"
 * line CI reads. */
#include "test.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int test_failures;
static const char *skip_reason; /* set by test_skip for the running test */

void test_skip(const char *why) { skip_reason = why; }

enum { MAX_TESTS = 1024 };
enum { SLOWEST_SHOWN = 8 };
static struct {
    const char *name;
    void (*fn)(void);
    double seconds;
} tests[MAX_TESTS];
static int n_tests;

void test_register(const char *name, void (*fn)(void)) {
    if (n_tests == MAX_TESTS) {
        fprintf(stderr, "too many tests (raise MAX_TESTS)\n");
        exit(2);
    }
    tests[n_tests].name = name;
    tests[n_tests].fn = fn;
    n_tests++;
}

const char *test_fixture(const char *name) {
    static char path[4096];
    const char *dir = getenv("POTSERVE_FIXTURES");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "build/fixtures", name);
    return path;
}

const char *test_model_path(void) {
    const char *p = getenv("POTSERVE_MODEL");
    if (!p) p = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    return access(p, R_OK) == 0 ? p : NULL;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void print_slowest(void) {
    int shown[SLOWEST_SHOWN], n = 0;
    for (; n < SLOWEST_SHOWN; n++) {
        int best = -1;
        for (int i = 0; i < n_tests; i++) {
            int taken = 0;
            for (int k = 0; k < n; k++) taken |= shown[k] == i;
            if (!taken && tests[i].seconds > 0 && (best < 0 || tests[i].seconds > tests[best].seconds)) best = i;
        }
        if (best < 0) break;
        shown[n] = best;
    }
    if (n) fprintf(stderr, "slowest:");
    for (int k = 0; k < n; k++) fprintf(stderr, " %s %.1f s%s", tests[shown[k]].name, tests[shown[k]].seconds, k + 1 < n ? "," : "\n");
}

static int selected(const char *name, int argc, char **argv) {
    int any_plain = 0, matched = 0;
    for (int k = 1; k < argc; k++) {
        if (argv[k][0] == '!') {
            if (strstr(name, argv[k] + 1)) return 0;
        } else {
            any_plain = 1;
            matched |= strstr(name, argv[k]) != NULL;
        }
    }
    return !any_plain || matched;
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n_tests; i++) {
        if (!selected(tests[i].name, argc, argv)) continue;
        test_failures = 0;
        skip_reason = NULL;
        double t0 = wall_seconds();
        tests[i].fn();
        tests[i].seconds = wall_seconds() - t0;
        if (test_failures) {
            failed++;
            fprintf(stderr, "FAIL %s\n", tests[i].name);
        } else if (skip_reason) {
            skipped++;
            fprintf(stderr, "SKIP %s: %s\n", tests[i].name, skip_reason);
        } else {
            passed++;
            if (getenv("VERBOSE")) fprintf(stderr, "ok   %s (%.2f s)\n", tests[i].name, tests[i].seconds);
        }
    }
    print_slowest();
    if (skipped) printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    else printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
