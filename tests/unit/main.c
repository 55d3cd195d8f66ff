/* Unit-test runner: runs every registered test (or those whose name contains
 * argv[1]) and ends with the "N passed, N failed" line CI reads. */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

int test_failures;

enum { MAX_TESTS = 1024 };
static struct {
    const char *name;
    void (*fn)(void);
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

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0;
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        test_failures = 0;
        tests[i].fn();
        if (test_failures) {
            failed++;
            fprintf(stderr, "FAIL %s\n", tests[i].name);
        } else {
            passed++;
            if (getenv("VERBOSE")) fprintf(stderr, "ok   %s\n", tests[i].name);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
