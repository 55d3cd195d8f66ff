/* Helpers the unit tests share: temporary directories, whole-file reads and
 * writes (test.h), opening the default model and the lighthouse document
 * (test_model.h). Linked into build/unit_tests only, never the CUDA tests. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model.h"
#include "test.h"
#include "test_model.h"

/* ---- files ----------------------------------------------------------------------- */

char *test_make_tempdir(const char *prefix) {
    char tmpl[256];
    snprintf(tmpl, sizeof tmpl, "/tmp/%sXXXXXX", prefix);
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void test_remove_dir(char *dir) {
    if (!dir) return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4200];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

long test_file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

unsigned char *test_slurp(const char *path, long *len) {
    *len = test_file_size(path);
    if (*len < 0) return NULL;
    unsigned char *b = malloc((size_t)*len + 1);
    FILE *f = fopen(path, "rb");
    if (!b || !f || fread(b, 1, (size_t)*len, f) != (size_t)*len) {
        free(b);
        b = NULL;
    }
    if (f) fclose(f);
    return b;
}

int test_spit(const char *path, const unsigned char *b, long len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = len ? fwrite(b, 1, (size_t)len, f) : 0;
    return fclose(f) == 0 && w == (size_t)len ? 0 : -1;
}

/* ---- models ---------------------------------------------------------------------- */

engine *test_open_engine(const char *path, const engine_options *opt) {
    char err[512];
    if (!path) {
        fprintf(stderr, "  model missing (make model / make fixtures)\n");
        return NULL;
    }
    engine *e = engine_open(path, opt, err, sizeof err);
    if (!e) fprintf(stderr, "  %s\n", err);
    return e;
}

engine *test_open_default_engine(int n_threads) {
    const char *path = test_model_path();
    if (!path) {
        fprintf(stderr, "  model missing (make model)\n");
        return NULL;
    }
    engine_options opt = {.n_threads = n_threads};
    return test_open_engine(path, &opt);
}

struct model *test_load_default_model(void) {
    const char *path = test_model_path();
    char err[512];
    if (!path) {
        fprintf(stderr, "  default model missing (make model)\n");
        return NULL;
    }
    model *m = model_load(path, err, sizeof err);
    if (!m) fprintf(stderr, "  %s\n", err);
    return m;
}

static const char lighthouse_text[] =
    "The lighthouse keeper counted the ships that passed each night. In March there were "
    "seventeen, in April twenty-two, and in May the fog kept every vessel in port. The keeper's "
    "daughter, who was nine, wrote the numbers on the wall in chalk: 17, 22, 0. When the "
    "inspector came in June he asked why the wall was covered in numbers, and she said that the "
    "sea was a library and the ships were its books. He wrote that down too. ";

char *test_lighthouse_doc(size_t len) {
    size_t n = strlen(lighthouse_text);
    char *d = malloc(len + 1);
    if (!d) return NULL;
    for (size_t i = 0; i < len; i++) d[i] = lighthouse_text[i % n];
    d[len] = 0;
    return d;
}
