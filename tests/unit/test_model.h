/* Unit-test helpers that need the engine: opening models and a document to
 * feed them. Kept out of test.h, which the CUDA tests include too. */
#ifndef POTSERVE_TEST_MODEL_H
#define POTSERVE_TEST_MODEL_H

#include <stddef.h>

#include "engine/engine.h"

struct model;

/* engine_open(path, opt); NULL with a message when path is NULL (model missing)
 * or the open fails. The caller closes it with engine_close. */
engine *test_open_engine(const char *path, const engine_options *opt);
/* The default model (test_model_path()) with n_threads threads, otherwise default
 * options; NULL with a message when it is missing. The caller closes it with engine_close. */
engine *test_open_default_engine(int n_threads);
/* model_load of the default model; NULL with a message when it is missing or
 * fails to load. The caller frees it with model_free. */
struct model *test_load_default_model(void);
/* The lighthouse story repeated to len bytes, NUL-terminated; NULL when out of
 * memory. The caller frees it. */
char *test_lighthouse_doc(size_t len);

#endif
