/* Included by every .cu file (private to cuda/): the same source
 * builds with nvcc for a GPU and with g++ against the CPU emulator
 * (cuda/emu/cuda_emu.h). Kernels are launched only through CU_LAUNCH and take
 * dynamic shared memory only through CU_DYNAMIC_SHARED, and ask for loop
 * unrolling with CU_UNROLL (g++ would warn about `#pragma unroll`): the
 * spellings that differ between the builds. */
#ifndef POTSERVE_CU_CUH
#define POTSERVE_CU_CUH

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* kernel<<<grid, block, shmem, stream>>>(args...); errors via cudaGetLastError. */
#define CU_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
/* T *name = the launch's dynamic shared memory (16-byte aligned). */
#define CU_DYNAMIC_SHARED(T, name)                           \
    extern __shared__ __align__(16) unsigned char cu_smem_[]; \
    T *name = reinterpret_cast<T *>(cu_smem_)
#define CU_UNROLL _Pragma("unroll")
#else
#include "cuda/emu/cuda_emu.h"
#endif

#endif
