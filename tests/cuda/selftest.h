/* Kernels that pin down the CUDA semantics the emulator reproduces (block
 * barriers, shared memory per block, shuffles and votes, dynamic shared
 * memory, atomics, indices, __half / __nv_bfloat16): the same tests run on a
 * GPU (`make test-cuda`) and on the emulator (`make test-cuda-emu`), so a
 * disagreement between the two shows up as a failure in one of them. */
#ifndef POTSERVE_CUDA_SELFTEST_H
#define POTSERVE_CUDA_SELFTEST_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[b * threads + t] = value thread (t + 1) % threads of block b wrote to
 * shared memory, then (after a second barrier) that value's negation added. */
cudaError_t selftest_shared_exchange(int *out, int blocks, int threads);
/* One block of 64 threads; out[8][64]: shfl idx (lane*7), xor 5, down 3, up 2,
 * idx width 16 (src 3), ballot(lane % 3 == 0), any(lane == 63), all(lane < 64). */
cudaError_t selftest_warp_ops(int *out);
/* out[b][t] = in[b][threads - 1 - t] through dynamic shared memory. */
cudaError_t selftest_dynamic_shared(float *out, const float *in, int blocks, int threads);
/* counter += 1 and max = max(max, global thread id) from every thread. */
cudaError_t selftest_atomics(unsigned *counter, int *max, int blocks, int threads);
/* A (2,3,2) grid of (4,2,3) blocks; out[linear thread] = the packed indices
 * (see selftest.cu). */
cudaError_t selftest_indices(uint32_t *out);
/* out[i] = float(h[i]) * 2 + float(b[i]), computed as __half / __nv_bfloat16. */
cudaError_t selftest_half(float *out, const uint16_t *h, const uint16_t *b, int n);
/* A launch of 2048 threads per block: returns cudaGetLastError's verdict. */
cudaError_t selftest_bad_launch(void);
/* Threads 0..15 wait at __syncthreads, the rest at __syncwarp: a GPU hangs,
 * the emulator aborts. Only for the emulator (run in a child process). */
cudaError_t selftest_divergent_barriers(void);

#ifdef __cplusplus
}
#endif

#endif
