/* RoPE's device arithmetic (private to cuda/kernels/), shared by rope.cu and
 * attention.cu: the angle of (position, pair) from the f32 table or, beyond
 * it, in double, and the rotation of one pair without fused multiply-adds,
 * which makes it bit-identical to engine/rope.c's rope_rotate. */
#ifndef POTSERVE_CUDA_ROPE_CUH
#define POTSERVE_CUDA_ROPE_CUH

#include "cuda/kernels.h"
#include "cuda/kernels/common.cuh"

#include <math.h>

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

/* cos and sin of pos * inv_freq[i], as rope_rotate takes them. */
__device__ __forceinline__ void rope_angle(const cuda_rope &r, int64_t pos, int i, float *c, float *s) {
    int half = r.n_rot / 2;
    if (pos < r.n_table) {
        const float *cs = r.cs + ((size_t)pos * half + i) * 2;
        *c = cs[0];
        *s = cs[1];
    } else {
        double theta = (double)pos * r.inv_freq[i];
        *c = (float)cos(theta);
        *s = (float)sin(theta);
    }
}

/* Rotates pair i of src into dst (may be src). __fmul_rn/__fadd_rn keep nvcc
 * from contracting to FMAs, which would round differently from the CPU. */
template <class T>
__device__ __forceinline__ void rope_pair(const cuda_rope &r, const T *src, float *dst, int64_t pos, int i) {
    int half = r.n_rot / 2;
    int a = r.layout == 0 ? 2 * i : i, b = r.layout == 0 ? 2 * i + 1 : i + half;
    float c, s;
    rope_angle(r, pos, i, &c, &s);
    float x0 = to_f32(src[a]), x1 = to_f32(src[b]);
    dst[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    dst[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* v rounded to the precision of a pot entry of type T. */
__device__ __forceinline__ float round_as(float v, const float *) { return v; }
__device__ __forceinline__ float round_as(float v, const __half *) { return __half2float(__float2half_rn(v)); }

/* Pair i of a pot key rotated to position pos, then rounded to the pot's
 * entry precision: the value the CPU backend attends with (its rotated-key
 * cache holds keys in the pot's dtype, and it rounds the same way without
 * the cache), so f16 pots agree to the bit before the dot products. */
template <class T>
__device__ __forceinline__ void rope_key_pair(const cuda_rope &r, const T *src, float *dst, int64_t pos, int i) {
    rope_pair(r, src, dst, pos, i);
    int half = r.n_rot / 2;
    int a = r.layout == 0 ? 2 * i : i, b = r.layout == 0 ? 2 * i + 1 : i + half;
    dst[a] = round_as(dst[a], src);
    dst[b] = round_as(dst[b], src);
}

#endif
