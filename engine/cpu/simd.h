/* Vector helpers for the CPU backend's attention loops (private to engine/cpu/).
 * Each has an AVX2+FMA kernel, chosen at run time when the CPU has AVX2, FMA and F16C and
 * POTSERVE_NO_SIMD is unset or "0" (read once), and a portable scalar one; the
 * batched row kernels also have AVX-512 forms (simd_cpu_probe level 2).
 *
 * Numerics: every helper gives the same bits on every path (dot: eight lanes,
 * lane i%8, each acc = fmaf(a[i], b[i], acc), reduced as ((l0+l1) + (l2+l3)) +
 * ((l4+l5) + (l6+l7)), then the n%8 tail s = fmaf(a[i], b[i], s) in order;
 * axpy: y = fmaf(a, x, y), one rounding; max: NaNs skipped). simd_exp_sub_sum's scalar path is libm's expf and a double
 * sum in eight partial sums (lane i%8, combined as the dot's lanes); its AVX2 path computes glibc's expf algorithm
 * (x86-64 FMA variant) in vectors, bit-identical to glibc >= 2.28's expf on
 * the CPUs it runs on (with another libm: within its expf's error, about 1
 * ulp), and sums in the same order. */
#ifndef POTSERVE_SIMD_H
#define POTSERVE_SIMD_H

#include <stdint.h>

/* sum of a[i] * b[i], i < n (0 for n <= 0). */
float simd_dot_f32(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i], i < n. */
void simd_axpy_f32(float *y, float a, const float *x, int64_t n);
/* The largest x[i], i < n, ignoring NaNs; -INFINITY for n <= 0 or all NaN. */
float simd_max_f32(const float *x, int64_t n);
/* out[i] = x[i] * scale * w[i], i < n, scale = 1 / sqrt(mean of x[i]^2 + eps):
 * the squares summed in double in eight partial sums (lane i % 8, combined as
 * the dot's lanes), the same bits on both paths. out may not overlap x. */
void simd_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* g[i] = silu(g[i]) * up[i] = g[i] / (1 + expf(-g[i])) * up[i], i < n, with
 * expf as simd_exp_sub_sum computes it. */
void simd_swiglu(float *g, const float *up, int64_t n);
/* g = gelu(g) * up, GELU in its tanh form (gemma3's gated FFN). */
void simd_geglu(float *g, const float *up, int64_t n);
/* The same as ggml computes it on CPUs: GELU of x rounded to f16, the result
 * rounded to f16 (its lookup table), 0 below -10 and x above 10. */
void simd_geglu_f16(float *g, const float *up, int64_t n);
/* p[i] = expf(p[i] - mx), i < n; returns the sum of the new p[i] (in double,
 * eight partial sums as above). */
double simd_exp_sub_sum(float *p, int64_t n, float mx);

/* Batched forms for the attention loops: several queries (the query heads of
 * a KV group, several tokens) against the same rows, each result bit for bit
 * what the one-row helpers above give; the vector kernels read every row once
 * for all the queries, outputs in registers (AVX2: tiles of 4 queries x 2
 * rows; AVX-512, rows of n <= 256 in multiples of 8: 4 pairs of queries x 4
 * rows).
 * out[i * out_stride + k] = simd_dot_f32(a[i], b + k * b_stride, n) * scale,
 * i < n_a, k < n_rows. */
void simd_dot_rows_f32(float *out, int64_t out_stride, const float *const *a, int n_a, const float *b,
                       int64_t b_stride, int64_t n_rows, int64_t n, float scale);
/* for i < n_y, for k = 0 .. n_rows-1 in order:
 * simd_axpy_f32(y[i], w[i * w_stride + k], x + k * x_stride, n). */
void simd_axpy_rows_f32(float *const *y, int n_y, const float *w, int64_t w_stride, const float *x, int64_t x_stride,
                        int64_t n_rows, int64_t n);

/* The same two with the rows (b, x) in IEEE half precision, as pots store
 * entries: the same bits as converting the rows to f32 first (the conversion
 * is exact), without the pass that would do it. */
void simd_dot_rows_f16(float *out, int64_t out_stride, const float *const *a, int n_a, const uint16_t *b,
                       int64_t b_stride, int64_t n_rows, int64_t n, float scale);
void simd_axpy_rows_f16(float *const *y, int n_y, const float *w, int64_t w_stride, const uint16_t *x,
                        int64_t x_stride, int64_t n_rows, int64_t n);

/* The CPU's vector features, the one probe of the CPU backend (these helpers
 * and the quantised kernels, engine/cpu/quant_kernels.c, cache its result):
 * 0 when POTSERVE_NO_SIMD is set to anything but "" or "0", or the CPU lacks
 * AVX2, FMA or F16C; 1 with them; 2 when it also has AVX512-VNNI, VL and BW. */
int simd_cpu_probe(void);

/* Kernels in use: "avx2+avx512" (the row kernels above in AVX-512, the rest
 * AVX2), "avx2" (AVX2, FMA and F16C) or "scalar". */
const char *simd_name(void);
/* Test-only: on != 0 forces the scalar kernels, 0 restores the default. */
void simd_force_scalar(int on);
/* Test-only: on != 0 keeps the row kernels on AVX2, 0 restores the default. */
void simd_force_no_avx512(int on);

#endif
