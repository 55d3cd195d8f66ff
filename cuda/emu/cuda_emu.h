/* The CPU stand-in for nvcc (private to cuda/ and its tests): included by
 * cuda/cu.cuh when a .cu file is compiled as C++ by g++, it supplies what the
 * kernels use of CUDA: the built-in indices, __shared__ memory, barriers, warp
 * shuffles and votes, atomics, and a launcher. The host API (cudaMalloc,
 * streams, events, graphs) and the cuBLAS subset are defined in cuda_emu.cpp
 * and cublas_emu.cpp against the real CUDA headers, so host code and tests
 * compile unchanged. The CUDA types (__half, __nv_bfloat16, dim3) are the real
 * ones from the toolkit's headers.
 *
 * Execution model: a launch runs its blocks one after another on the calling
 * thread; the threads of a block are cooperative fibers (ucontext) that run
 * until they reach a barrier (__syncthreads, or a warp collective for the
 * fibers of one warp) and switch there. Running blocks one at a time makes a
 * static __shared__ array (a function-local `static thread_local`) private to
 * the block by construction. Fibers are never preempted, so atomics are plain
 * read-modify-writes. Threads that wait at different barriers (a hang on a
 * GPU) abort with the kernel's name; so does a shuffle that reads an exited or
 * absent lane (undefined on a GPU). */
#ifndef POTSERVE_CUDA_EMU_H
#define POTSERVE_CUDA_EMU_H

#ifdef __CUDACC__
#error "cuda_emu.h stands in for nvcc; it is not for nvcc builds"
#endif
#ifndef __cplusplus
#error "cuda_emu.h is C++ (the .cu files compile as C++)"
#endif

/* Replaces the empty __shared__ of host_defines.h, whether or not the CUDA
 * headers came first (their include guards keep this one afterwards). */
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cuemu {

enum { WARP_SIZE = 32, MAX_EXCHANGE_BYTES = 8 };

struct launch_ctx;

/* One warp of the running block: how many lanes are still running, how many
 * wait at its barrier, and two exchange buffers (a collective writes one while
 * a lane that is still reading the previous collective's values reads the
 * other, so each collective needs one barrier, not two). */
struct warp_state {
    int live, arrived;
    uint32_t live_mask;
    alignas(8) unsigned char slot[2][WARP_SIZE][MAX_EXCHANGE_BYTES];
};

/* One GPU thread of the running block. */
struct fiber {
    uint3 tid;
    int index, lane, state, parity;
    unsigned exchanges; /* warp collectives this thread has written its value to */
    warp_state *warp;
    launch_ctx *launch;
    void *context; /* where it resumes (cuda_emu.cpp) */
};

/* Everything about the launch in progress; lives while it runs. */
struct launch_ctx {
    const char *name;
    dim3 grid, block;
    uint3 block_idx;
    void *dynamic_shared;
    int n_threads, live, block_arrived;
    void *run; /* the emulator's bookkeeping for the running block (cuda_emu.cpp) */
};

/* The fiber running now on this OS thread (NULL outside a kernel). */
extern thread_local fiber *self;

/* Runs body once per GPU thread of every block (or, when stream is capturing
 * a graph, records it for cudaGraphLaunch). Sets the error cudaGetLastError
 * reports: invalid configuration for empty grids, blocks over 1024 threads or
 * over 48 KiB of dynamic shared memory. */
void launch(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
            std::function<void()> body);

/* Runs op now, or appends it to the graph the stream is capturing (every
 * stream runs in order on the calling thread). */
void enqueue(cudaStream_t stream, std::function<void()> op);

/* The kernel's arguments are converted to its parameter types once, at the
 * launch, as CUDA does, and every thread calls it with the same copies. */
template <class... P, class... A>
void launch_kernel(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem,
                   cudaStream_t stream, A &&...args) {
    std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
    launch(name, grid, block, shmem, stream, [kernel, params]() { std::apply(kernel, params); });
}

void syncthreads();
void syncwarp(unsigned mask);
/* Writes this lane's value (n <= 8 bytes) and waits for the warp; returns the
 * warp's values, [lane][8]. mask must hold every running lane of the warp. */
const unsigned char (*warp_exchange(unsigned mask, const void *value, size_t n, const char *what))[MAX_EXCHANGE_BYTES];
/* Aborts unless lane src of the caller's warp took part in the caller's
 * latest collective (it may have exited since: its value stays readable). */
void check_source_lane(int src, const char *what);
void *dynamic_shared();

/* Source lane of a shuffle, as the CUDA programming guide defines it per
 * variant; a lane outside the caller's width-segment reads its own value. */
inline int segment_base(int lane, int width) { return lane & ~(width - 1); }

template <class T, class Pick>
T shuffle(unsigned mask, T v, int width, const char *what, Pick pick) {
    static_assert(sizeof(T) <= MAX_EXCHANGE_BYTES, "shuffles move at most 8 bytes");
    auto all = warp_exchange(mask, &v, sizeof v, what);
    int lane = self->lane, src = pick(lane, width);
    if (src != lane) check_source_lane(src, what);
    T out;
    memcpy(&out, all[src], sizeof out);
    return out;
}

/* The predicates of the lanes taking part, as bits; *participants gets those lanes. */
unsigned ballot(unsigned mask, int predicate, unsigned *participants);
unsigned active_mask();

} // namespace cuemu

/* ---- built-in variables ------------------------------------------------------ */
#define threadIdx (static_cast<const uint3 &>(::cuemu::self->tid))
#define blockIdx (static_cast<const uint3 &>(::cuemu::self->launch->block_idx))
#define blockDim (static_cast<const dim3 &>(::cuemu::self->launch->block))
#define gridDim (static_cast<const dim3 &>(::cuemu::self->launch->grid))
inline constexpr int warpSize = 32;

/* ---- barriers, warp collectives --------------------------------------------- */
#define __syncthreads() ::cuemu::syncthreads()
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cuemu::syncwarp(mask); }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T> T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
    return ::cuemu::shuffle(mask, v, width, "__shfl_sync", [src_lane](int lane, int w) {
        return ::cuemu::segment_base(lane, w) + (src_lane & (w - 1));
    });
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    return ::cuemu::shuffle(mask, v, width, "__shfl_xor_sync", [lane_mask](int lane, int w) {
        int src = lane ^ lane_mask;
        return src >= ::cuemu::segment_base(lane, w) + w || src >= warpSize ? lane : src;
    });
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    return ::cuemu::shuffle(mask, v, width, "__shfl_down_sync", [delta](int lane, int w) {
        int src = lane + (int)delta;
        return src >= ::cuemu::segment_base(lane, w) + w ? lane : src;
    });
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    return ::cuemu::shuffle(mask, v, width, "__shfl_up_sync", [delta](int lane, int w) {
        int src = lane - (int)delta;
        return src < ::cuemu::segment_base(lane, w) ? lane : src;
    });
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    unsigned lanes;
    return ::cuemu::ballot(mask, predicate, &lanes);
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
    unsigned lanes;
    return ::cuemu::ballot(mask, predicate, &lanes) == lanes;
}
inline unsigned __activemask() { return ::cuemu::active_mask(); }

/* ---- atomics: fibers are not preemptive, so a plain read-modify-write is atomic */
/* The value's type follows the pointer (CUDA's overloads convert it likewise). */
template <class T> using cuemu_same = typename std::enable_if<true, T>::type;
template <class T> T atomicAdd(T *p, cuemu_same<T> v) { T old = *p; *p = old + v; return old; }
template <class T> T atomicSub(T *p, cuemu_same<T> v) { T old = *p; *p = old - v; return old; }
template <class T> T atomicMax(T *p, cuemu_same<T> v) { T old = *p; *p = old < v ? v : old; return old; }
template <class T> T atomicMin(T *p, cuemu_same<T> v) { T old = *p; *p = v < old ? v : old; return old; }
template <class T> T atomicExch(T *p, cuemu_same<T> v) { T old = *p; *p = v; return old; }
template <class T> T atomicCAS(T *p, cuemu_same<T> expected, cuemu_same<T> v) {
    T old = *p;
    if (old == expected) *p = v;
    return old;
}

/* ---- device intrinsics the kernels use ------------------------------------ */
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, sizeof i); return i; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, sizeof u); return u; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, sizeof f); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
template <class T> T __ldg(const T *p) { return *p; }

/* ---- launch, dynamic shared memory (the cu.cuh spellings) --------------------- */
#define CU_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    ::cuemu::launch_kernel(#kernel, kernel, (grid), (block), (shmem), (stream), __VA_ARGS__)
#define CU_DYNAMIC_SHARED(T, name) T *name = static_cast<T *>(::cuemu::dynamic_shared())
#define CU_UNROLL

#endif
