/* The emulator's engine (see cuda_emu.h): fibers for the threads of a block,
 * the barriers and warp collectives they switch at, and the CUDA runtime
 * calls the backend and its tests use, with "device" memory in host memory
 * and every stream executing in order on the calling thread. */
#include "cuda_emu.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

/* Fiber switches. On x86-64 a dozen instructions that save the callee-saved
 * registers and swap stack pointers: glibc's swapcontext also saves the signal
 * mask with a system call on every switch, which made barrier-heavy kernels
 * ten times slower. Elsewhere (or with -DCUEMU_UCONTEXT) ucontext. */
#if defined(__x86_64__) && !defined(CUEMU_UCONTEXT)
#define CUEMU_ASM_SWITCH 1
/* Saves the callee-saved registers on the current stack, stores its pointer
 * in *from, continues on stack `to` (saved the same way, or made by
 * context_make). */
extern "C" void cuemu_switch(void **from, void *to);
asm(".text\n"
    ".globl cuemu_switch\n"
    ".type cuemu_switch,@function\n"
    "cuemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cuemu_switch, .-cuemu_switch\n");
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace cuemu {

thread_local fiber *self;

enum fiber_state { RUNNABLE = 0, WAIT_BLOCK, WAIT_WARP, DONE };
enum {
    STACK_BYTES = 64 * 1024, /* per GPU thread: kernels keep small frames */
    GUARD_BYTES = 4096,      /* an inaccessible page below each stack turns overflow into a crash */
    MAX_THREADS = 1024,
    MAX_DYNAMIC_SHARED = 48 * 1024, /* the default limit (no cudaFuncSetAttribute opt-in here) */
};

/* Fiber stacks and the dynamic shared memory buffer, kept per OS thread and
 * reused by later launches (a launch grows them when it needs more). */
struct launch_memory {
    unsigned char *stacks = nullptr; /* n_stacks * (GUARD_BYTES + STACK_BYTES) */
    int n_stacks = 0;
    void *shared = nullptr;
    size_t shared_bytes = 0;
    ~launch_memory() {
        if (stacks) munmap(stacks, (size_t)n_stacks * (GUARD_BYTES + STACK_BYTES));
        free(shared);
    }
    unsigned char *stack(int i) { return stacks + (size_t)i * (GUARD_BYTES + STACK_BYTES) + GUARD_BYTES; }
    bool reserve(int n, size_t shmem) {
        if (n > n_stacks) {
            size_t bytes = (size_t)n * (GUARD_BYTES + STACK_BYTES);
            void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) return false;
            for (int i = 0; i < n; i++)
                mprotect((unsigned char *)p + (size_t)i * (GUARD_BYTES + STACK_BYTES), GUARD_BYTES, PROT_NONE);
            if (stacks) munmap(stacks, (size_t)n_stacks * (GUARD_BYTES + STACK_BYTES));
            stacks = (unsigned char *)p;
            n_stacks = n;
        }
        if (shmem > shared_bytes) {
            void *p = aligned_alloc(256, (shmem + 255) / 256 * 256);
            if (!p) return false;
            free(shared);
            shared = p;
            shared_bytes = shmem;
        }
        return true;
    }
};

static thread_local launch_memory memory;
static thread_local cudaError_t last_error = cudaSuccess;

/* Where a suspended fiber (or the scheduler) resumes. */
struct context {
#ifdef CUEMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
};

/* The running launch's private state beside the public launch_ctx. */
struct block_run {
    launch_ctx pub;
    std::vector<fiber> fibers;
    std::vector<context> contexts;
    std::vector<warp_state> warps;
    context scheduler;
#ifndef CUEMU_ASM_SWITCH
    ucontext_t base; /* the template fiber contexts are made from (signal mask, FP state) */
#endif
    const std::function<void()> *body;
};

static void fiber_main();

/* Prepares c to start fiber_main on the given stack. */
static void context_make(block_run *R, context *c, unsigned char *stack, size_t bytes) {
#ifdef CUEMU_ASM_SWITCH
    (void)R;
    /* cuemu_switch pops six registers and returns into fiber_main, which then
     * sees its stack as after a call (8 mod 16, a null return address). */
    void **top = reinterpret_cast<void **>(stack + bytes);
    top[-1] = nullptr;
    top[-2] = reinterpret_cast<void *>(&fiber_main);
    for (int i = 3; i <= 8; i++) top[-i] = nullptr;
    c->sp = top - 8;
#else
    c->uc = R->base;
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = &R->scheduler.uc;
    makecontext(&c->uc, fiber_main, 0);
#endif
}

/* Suspends `from` and resumes `to`. */
static void context_switch(context *from, context *to) {
#ifdef CUEMU_ASM_SWITCH
    cuemu_switch(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
}

[[noreturn]] static void fail(const launch_ctx *L, const char *what) {
    fprintf(stderr, "cuda emu: kernel %s, block (%u,%u,%u): %s\n", L->name, L->block_idx.x, L->block_idx.y,
            L->block_idx.z, what);
    abort();
}

static block_run *run_of(launch_ctx *L) { return static_cast<block_run *>(L->run); }

static void release_block(block_run *R) {
    for (fiber &f : R->fibers)
        if (f.state == WAIT_BLOCK) f.state = RUNNABLE;
    R->pub.block_arrived = 0;
}

static void release_warp(block_run *R, warp_state *w) {
    int first = (int)(w - R->warps.data()) * WARP_SIZE;
    for (int i = first; i < first + WARP_SIZE && i < R->pub.n_threads; i++)
        if (R->fibers[i].state == WAIT_WARP) R->fibers[i].state = RUNNABLE;
    w->arrived = 0;
}

/* Back to the scheduler until a barrier releases this fiber. */
static void wait_here(fiber *f) {
    block_run *R = run_of(f->launch);
    context_switch(static_cast<context *>(f->context), &R->scheduler);
}

void syncthreads() {
    fiber *f = self;
    block_run *R = run_of(f->launch);
    f->state = WAIT_BLOCK;
    if (++R->pub.block_arrived == R->pub.live)
        release_block(R); /* the last to arrive goes on without a switch */
    else
        wait_here(f);
}

static void warp_barrier(fiber *f, unsigned mask, const char *what) {
    warp_state *w = f->warp;
    if ((mask & w->live_mask) != w->live_mask) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s with mask %08x leaves out running lanes %08x of warp %d (the emulator needs them all)",
                 what, mask, w->live_mask & ~mask, f->index / WARP_SIZE);
        fail(f->launch, msg);
    }
    f->state = WAIT_WARP;
    if (++w->arrived == w->live)
        release_warp(run_of(f->launch), w);
    else
        wait_here(f);
}

void syncwarp(unsigned mask) { warp_barrier(self, mask, "__syncwarp"); }

const unsigned char (*warp_exchange(unsigned mask, const void *value, size_t n, const char *what))[MAX_EXCHANGE_BYTES] {
    fiber *f = self;
    int p = f->parity;
    f->parity ^= 1;
    memcpy(f->warp->slot[p][f->lane], value, n);
    f->exchanges++;
    warp_barrier(f, mask, what);
    return f->warp->slot[p];
}

/* Lane `lane` of f's warp wrote a value for f's latest collective: it exists
 * and had not exited before it (lanes run in step between collectives, so
 * its count is f's, or one more when it is already in the next one). */
static bool took_part(const fiber *f, int lane) {
    int i = f->index - f->lane + lane;
    block_run *R = run_of(f->launch);
    return lane >= 0 && lane < WARP_SIZE && i < R->pub.n_threads && R->fibers[i].exchanges >= f->exchanges;
}

void check_source_lane(int src, const char *what) {
    fiber *f = self;
    if (!took_part(f, src)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: lane %d of warp %d reads lane %d, which is absent or has exited", what,
                 f->lane, f->index / WARP_SIZE, src);
        fail(f->launch, msg);
    }
}

unsigned ballot(unsigned mask, int predicate, unsigned *participants) {
    int pred = predicate != 0;
    auto all = warp_exchange(mask, &pred, sizeof pred, "__ballot_sync");
    unsigned bits = 0, lanes = 0;
    for (int lane = 0; lane < WARP_SIZE; lane++) {
        if (!(mask >> lane & 1u) || !took_part(self, lane)) continue;
        int v;
        memcpy(&v, all[lane], sizeof v);
        lanes |= 1u << lane;
        if (v) bits |= 1u << lane;
    }
    *participants = lanes;
    return bits;
}

unsigned active_mask() { return self->warp->live_mask; }

void *dynamic_shared() { return self->launch->dynamic_shared; }

static void fiber_main() {
    fiber *f = self;
    block_run *R = run_of(f->launch);
    (*R->body)();
    f->state = DONE;
    R->pub.live--;
    warp_state *w = f->warp;
    w->live--;
    w->live_mask &= ~(1u << f->lane);
    /* an exited thread no longer holds back the barriers the others wait at */
    if (R->pub.block_arrived && R->pub.block_arrived == R->pub.live) release_block(R);
    if (w->arrived && w->arrived == w->live) release_warp(R, w);
    /* back to the scheduler for good (with ucontext, returning would do the same) */
    context_switch(static_cast<context *>(f->context), &R->scheduler);
    abort(); /* a finished fiber is never resumed */
}

static void run_block(block_run *R) {
    int n = R->pub.n_threads;
    R->pub.live = n;
    R->pub.block_arrived = 0;
    for (int i = 0; i < (int)R->warps.size(); i++) {
        warp_state &w = R->warps[i];
        int lanes = n - i * WARP_SIZE < WARP_SIZE ? n - i * WARP_SIZE : WARP_SIZE;
        w.live = lanes;
        w.arrived = 0;
        w.live_mask = lanes == WARP_SIZE ? 0xffffffffu : (1u << lanes) - 1;
    }
    for (int i = 0; i < n; i++) {
        fiber &f = R->fibers[i];
        f.state = RUNNABLE;
        f.parity = 0;
        f.exchanges = 0;
        context_make(R, &R->contexts[i], memory.stack(i), STACK_BYTES);
    }
    if (R->pub.dynamic_shared) memset(R->pub.dynamic_shared, 0xff, memory.shared_bytes); /* not zeroed on a GPU either */
    while (R->pub.live > 0) {
        bool ran = false;
        for (int i = 0; i < n; i++) {
            if (R->fibers[i].state != RUNNABLE) continue;
            ran = true;
            self = &R->fibers[i];
            context_switch(&R->scheduler, &R->contexts[i]);
        }
        self = nullptr;
        if (!ran) {
            int at_block = 0, at_warp = 0;
            for (const fiber &f : R->fibers) at_block += f.state == WAIT_BLOCK, at_warp += f.state == WAIT_WARP;
            char msg[160];
            snprintf(msg, sizeof msg, "threads wait at different barriers (%d at __syncthreads, %d at warp collectives): a GPU would hang",
                     at_block, at_warp);
            fail(&R->pub, msg);
        }
    }
}

/* Kernels run so far, by name (tests count launches: cuemu_kernel_runs). */
static std::mutex runs_lock;
static std::unordered_map<std::string, unsigned long long> runs;

static void execute(const char *name, dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body) {
    {
        std::lock_guard<std::mutex> hold(runs_lock);
        runs[name]++;
    }
    int n = (int)(block.x * block.y * block.z);
    if (!memory.reserve(n, shmem)) {
        last_error = cudaErrorMemoryAllocation;
        return;
    }
    block_run R;
    R.pub = launch_ctx{name, grid, block, uint3{0, 0, 0}, shmem ? memory.shared : nullptr, n, 0, 0, &R};
    R.body = &body;
    R.fibers.resize((size_t)n);
    R.contexts.resize((size_t)n);
    R.warps.resize((size_t)(n + WARP_SIZE - 1) / WARP_SIZE);
#ifndef CUEMU_ASM_SWITCH
    getcontext(&R.base);
#endif
    for (int i = 0; i < n; i++) {
        fiber &f = R.fibers[i];
        f.index = i;
        f.lane = i % WARP_SIZE;
        f.tid = uint3{(unsigned)i % block.x, (unsigned)i / block.x % block.y, (unsigned)i / (block.x * block.y)};
        f.warp = &R.warps[i / WARP_SIZE];
        f.launch = &R.pub;
        f.context = &R.contexts[i];
    }
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                R.pub.block_idx = uint3{x, y, z};
                run_block(&R);
            }
}

} // namespace cuemu

/* ---- streams and graphs: recorded work, replayed in order ------------------------ */

struct CUstream_st {
    bool capturing = false;
    CUgraph_st *graph = nullptr;
};
struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point at;
    bool recorded = false;
};

/* The special handles (0, cudaStreamLegacy, cudaStreamPerThread) never capture. */
static CUstream_st *stream_of(cudaStream_t s) { return (uintptr_t)s <= 2 ? nullptr : s; }

namespace cuemu {
void enqueue(cudaStream_t stream, std::function<void()> op) {
    CUstream_st *s = stream_of(stream);
    if (s && s->capturing)
        s->graph->ops.push_back(std::move(op));
    else
        op();
}

void launch(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, std::function<void()> body) {
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    /* a block dimension beyond the device's limits is an invalid value (as an
     * H200 with CUDA 13 answers a 2048-thread block); the other bad shapes an
     * invalid configuration */
    if (block.x > MAX_THREADS || block.y > MAX_THREADS || block.z > 64) {
        last_error = cudaErrorInvalidValue;
        return;
    }
    if (!grid.x || !grid.y || !grid.z || grid.y > 65535 || grid.z > 65535 || !threads || threads > MAX_THREADS ||
        shmem > MAX_DYNAMIC_SHARED) {
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    enqueue(stream, [=]() { execute(name, grid, block, shmem, body); });
}
} // namespace cuemu

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t e = cuemu::last_error;
    cuemu::last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return cuemu::last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    default: return "unknown error (CPU emulator)";
    }
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "potserve CPU emulator");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    prop->totalGlobalMem = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    prop->sharedMemPerBlock = cuemu::MAX_DYNAMIC_SHARED;
    prop->warpSize = cuemu::WARP_SIZE;
    prop->maxThreadsPerBlock = cuemu::MAX_THREADS;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->multiProcessorCount = 1;
    prop->major = 8;
    prop->minor = 0;
    return cudaSuccess;
}

/* Device memory accounting, for a test's memory limit (cuemu_set_memory_limit). */
static std::mutex device_lock;
static std::unordered_map<void *, size_t> device_sizes;
static size_t device_in_use, device_limit;

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    *total = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    *free_bytes = avail > 0 && page > 0 ? (size_t)avail * (size_t)page : 0;
    std::lock_guard<std::mutex> hold(device_lock);
    if (device_limit) {
        *total = device_limit;
        *free_bytes = device_limit > device_in_use ? device_limit - device_in_use : 0;
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

/* Device memory is host memory, filled with 0xff (NaN as floats) since
 * cudaMalloc does not clear it either: a kernel reading what nobody wrote
 * shows up in the results. Beyond the limit a test set, it fails as a full
 * GPU does. */
cudaError_t cudaMalloc(void **ptr, size_t size) {
    size_t bytes = (size ? size + 255 : 256) / 256 * 256;
    std::lock_guard<std::mutex> hold(device_lock);
    if (device_limit && device_in_use + bytes > device_limit) {
        *ptr = nullptr;
        return cuemu::last_error = cudaErrorMemoryAllocation;
    }
    *ptr = aligned_alloc(256, bytes);
    if (!*ptr) return cuemu::last_error = cudaErrorMemoryAllocation;
    memset(*ptr, 0xff, size);
    device_sizes[*ptr] = bytes;
    device_in_use += bytes;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    std::lock_guard<std::mutex> hold(device_lock);
    auto it = device_sizes.find(ptr);
    if (it != device_sizes.end()) {
        device_in_use -= it->second;
        device_sizes.erase(it);
    }
    free(ptr);
    return cudaSuccess;
}

/* Emulator only (tests; declare them weak, a GPU build lacks them): bytes
 * cudaMalloc holds, and a limit on them (0: none). */
size_t cuemu_memory_in_use(void) {
    std::lock_guard<std::mutex> hold(device_lock);
    return device_in_use;
}

/* Emulator only (tests): kernels run so far (directly or by a graph) whose
 * name (as CU_LAUNCH spells it, template arguments included) starts with prefix. */
unsigned long long cuemu_kernel_runs(const char *prefix) {
    std::lock_guard<std::mutex> hold(cuemu::runs_lock);
    unsigned long long n = 0;
    size_t len = strlen(prefix);
    for (const auto &r : cuemu::runs)
        if (r.first.compare(0, len, prefix) == 0) n += r.second;
    return n;
}

void cuemu_set_memory_limit(size_t bytes) {
    std::lock_guard<std::mutex> hold(device_lock);
    device_limit = bytes;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    *ptr = malloc(size ? size : 1);
    return *ptr ? cudaSuccess : (cuemu::last_error = cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *ptr) {
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    (void)kind;
    if (count) memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    (void)kind;
    cuemu::enqueue(stream, [=]() {
        if (count) memmove(dst, src, count);
    });
    return cudaSuccess;
}

/* height rows of width bytes, rows dpitch / spitch bytes apart. */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
    (void)kind;
    if (width > dpitch || width > spitch) return cuemu::last_error = cudaErrorInvalidPitchValue;
    cuemu::enqueue(stream, [=]() {
        for (size_t r = 0; r < height && width; r++)
            memmove(static_cast<char *>(dst) + r * dpitch, static_cast<const char *>(src) + r * spitch, width);
    });
    return cudaSuccess;
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind kind) {
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, nullptr);
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
    memset(ptr, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
    cuemu::enqueue(stream, [=]() { memset(ptr, value, count); });
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    *stream = new CUstream_st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    (void)flags;
    return cudaStreamCreate(stream);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    CUstream_st *s = stream_of(stream);
    if (s && s->capturing) delete s->graph;
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    CUstream_st *s = stream_of(stream);
    return s && s->capturing ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    (void)stream, (void)event, (void)flags;
    return cudaSuccess; /* everything before the event has run already */
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    *event = new CUevent_st;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(event);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

/* Work runs when submitted, so the host clock at submission times it. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    cuemu::enqueue(stream, [event]() {
        event->at = std::chrono::steady_clock::now();
        event->recorded = true;
    });
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    (void)event;
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start->recorded || !end->recorded) return cudaErrorInvalidValue;
    *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    (void)mode;
    CUstream_st *s = stream_of(stream);
    if (!s || s->capturing) return cudaErrorStreamCaptureUnsupported; /* as CUDA: not the legacy stream */
    s->capturing = true;
    s->graph = new CUgraph_st;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    CUstream_st *s = stream_of(stream);
    if (!s || !s->capturing) return cudaErrorInvalidValue;
    *graph = s->graph;
    s->capturing = false;
    s->graph = nullptr;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
    CUstream_st *s = stream_of(stream);
    *status = s && s->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    (void)flags;
    *exec = new CUgraphExec_st{graph->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    for (const auto &op : exec->ops) cuemu::enqueue(stream, op);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

} /* extern "C" */
