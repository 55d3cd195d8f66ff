/* Records the golden dot products of tests/unit/test_quant_dot.c from ggml
 * itself: for every quantised weight type and the ten cases gen_case() builds
 * (tests/quant_cases.h), ggml's own activation quantiser and integer dot product
 * (type_traits_cpu[type].vec_dot on the activations made by
 * type_traits_cpu[vec_dot_type].from_float), printed as the lines of the test's
 * `golden` table. `make test-reference` builds it against the libggml of
 * `make llama-bench` (llama.cpp's sources from the llama-cpp-python sdist) and
 * checks that the table in the test holds every line it prints.
 *
 * ggml.h cannot be included beside engine/quant.h (both name the GGML_TYPE_*
 * ids, with the same values: the GGUF type ids), so the three ggml functions
 * used are declared here as ggml-cpu.h declares them. */
#include "tests/quant_cases.h"

#include <stdio.h>

typedef void (*ggml_from_float_fn)(const float *x, void *y, int64_t k);
typedef void (*ggml_vec_dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
struct ggml_type_traits_cpu { /* ggml/include/ggml-cpu.h */
    ggml_from_float_fn from_float;
    ggml_vec_dot_fn vec_dot;
    int vec_dot_type; /* enum ggml_type */
    int64_t nrows;
};
const struct ggml_type_traits_cpu *ggml_get_type_traits_cpu(int type);
void ggml_cpu_init(void);

static const uint32_t recorded_types[] = {
    GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
    GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};

int main(void) {
    enum { MAX_N = 9 * 256 };
    static uint8_t row[MAX_N * 4], act[MAX_N * 4];
    static float x[MAX_N];
    ggml_cpu_init();
    for (size_t t = 0; t < sizeof recorded_types / sizeof recorded_types[0]; t++) {
        const uint32_t type = recorded_types[t];
        const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu((int)type);
        const struct ggml_type_traits_cpu *act_tr = ggml_get_type_traits_cpu(tr->vec_dot_type);
        if (!tr->vec_dot || !act_tr->from_float || tr->vec_dot_type != (int)quant_vec_dot_type(type)) {
            fprintf(stderr, "ggml_vec_dot_golden: ggml pairs %s with activation type %d, potserve with %u\n",
                    quant_type_name(type), tr->vec_dot_type, quant_vec_dot_type(type));
            return 1;
        }
        printf("    {GGML_TYPE_%s, {", quant_type_name(type));
        for (int idx = 0; idx < 10; idx++) {
            const int64_t n = gen_case(type, idx, row, x);
            act_tr->from_float(x, act, n);
            float s = 0.0f;
            tr->vec_dot((int)n, &s, 0, row, 0, act, 0, 1);
            uint32_t bits;
            memcpy(&bits, &s, 4);
            printf("%s0x%08x", idx ? ", " : "", bits);
        }
        printf("}},\n");
    }
    return 0;
}
