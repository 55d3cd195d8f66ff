/* Reductions and scans the kernels share (private to cuda/kernels/). Block
 * versions assume blockDim.x is a multiple of 32 (<= 1024) and blockDim.y ==
 * blockDim.z == 1, and that every thread of the block calls them. */
#ifndef POTSERVE_CUDA_COMMON_CUH
#define POTSERVE_CUDA_COMMON_CUH

#include "cuda/cu.cuh"

#define CU_FULL_MASK 0xffffffffu

/* An f32 value stored as T (f16: round to nearest even, as pot_write does). */
template <class T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(CU_FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(CU_FULL_MASK, v, off));
    return v;
}

/* Sum over the block, returned to every thread. The leading barrier lets a
 * caller reduce twice in a row without the second call overwriting partials
 * the first is still reading. */
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_sum(lane < n_warps ? partial[lane] : 0.0f);
}

/* Max over the block, returned to every thread (same barrier rule as block_sum). */
__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_max(lane < n_warps ? partial[lane] : -INFINITY);
}

/* Integer sum over the block, returned to every thread (same barrier rule). */
__device__ __forceinline__ int block_sum_int(int v) {
    __shared__ int partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(CU_FULL_MASK, v, off);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : 0;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(CU_FULL_MASK, v, off);
    return v;
}

/* Exclusive prefix count of flag (0/1) over the block in thread order; *total
 * gets the block's count. */
__device__ __forceinline__ int block_scan_flags(int flag, int *total) {
    __shared__ int warp_counts[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    unsigned bits = __ballot_sync(CU_FULL_MASK, flag);
    int before = __popc(bits & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0) warp_counts[warp] = __popc(bits);
    __syncthreads();
    int sum = 0, all = 0;
    for (int w = 0; w < n_warps; w++) {
        sum += w < warp ? warp_counts[w] : 0;
        all += warp_counts[w];
    }
    *total = all;
    return sum + before;
}

/* Reads a little-endian 16-bit half or bfloat16 (scales in quantised blocks
 * sit at 2-byte offsets). */
__device__ __forceinline__ float load_f16(const unsigned char *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}
__device__ __forceinline__ float load_bf16(const unsigned char *p) {
    return __uint_as_float((unsigned)(p[0] | (p[1] << 8)) << 16);
}

#endif
