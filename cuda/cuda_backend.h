/* The CUDA backend's public header (built with `make CUDA=1`): the probe a
 * `--backend cuda` option calls first, then the backend itself, which
 * implements engine/backend.h's interface on the GPU (cuda/cuda_backend.c). */
#ifndef POTSERVE_CUDA_BACKEND_H
#define POTSERVE_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

struct model;

/* 0 when a CUDA device and cuBLAS are usable, with the device described in
 * msg; -1 with the reason in msg otherwise (no driver, no device, cuBLAS
 * failing to start). Leaves nothing allocated. */
int cuda_probe(char *msg, size_t msglen);

/* The CUDA backend for a llama-family model (llama, qwen2 biases included):
 * weights uploaded once in their file types (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0 and the K-quants Q2_K..Q6_K: every type the CPU backend reads;
 * any other is refused with a message), forward() as engine/backend.h
 * describes, the same results as cpu_backend_new within float rounding.
 * n_threads is unused (the host side is one thread). exact = 1 runs every
 * matrix product in f32; exact = 0 runs the products of more than 16 rows
 * (prefill) with f16 operands and f32 accumulation on the tensor cores
 * (activations rounded to f16: about 1e-3 relative, as llama.cpp's cuBLAS
 * path). The model must outlive the backend.
 *
 * Pots live in device memory: a span's pot is attached to this backend on
 * its first forward (cache/cache.h, "pots held by a device"), its K/V are
 * written on the device only, and cache/pot.c calls back to sync them to
 * the host when host code reads them, to compact them on the device, to
 * copy them device to device and to free them. Pots may outlive the
 * backend: freeing it syncs every pot it holds back to the host and
 * detaches it. base.pot_memory reports the device memory pots may take
 * (what was free after the weights, less a reserve for the forward's
 * buffers). NULL + err on
 * failure (no device, out of device memory, unsupported weight type). */
backend *cuda_backend_new(const struct model *m, int n_threads, int exact, char *err, size_t errlen);

/* Takes p back to the host if b holds it (pot_host_take): 0, or -1 when
 * reading it back failed. */
int cuda_backend_forget_pot(backend *b, pot *p);
/* 1 when b holds p's K/V on its device (tests). */
int cuda_backend_holds_pot(backend *b, const pot *p);
/* Device bytes of the pots b holds, K and V together (tests, metrics). */
size_t cuda_backend_pot_bytes(backend *b);
/* Decode steps (every span one token, at most 16) run as CUDA graphs unless
 * turned off here or by POTSERVE_CUDA_GRAPHS=0 (tests, benchmarks). */
void cuda_backend_use_graphs(backend *b, int on);
/* Graphs captured and replayed so far. */
void cuda_backend_graph_counts(backend *b, uint64_t *captures, uint64_t *replays);

/* Where a forward's time goes, for finding what bounds a GPU: with
 * POTSERVE_CUDA_PHASES=1 (or cuda_backend_time_phases) every forward times its
 * host phases (plan, pots acquired, inputs uploaded, body launched, outputs
 * downloaded, the final sync) and the device's time for the body (events),
 * apart for decode steps (kind 1) and other forwards (kind 0); the totals are
 * printed to stderr when the backend is freed. */
enum cuda_phase { CUDA_PHASE_PLAN, CUDA_PHASE_ACQUIRE, CUDA_PHASE_UPLOAD, CUDA_PHASE_LAUNCH, CUDA_PHASE_DOWNLOAD,
                  CUDA_PHASE_SYNC, CUDA_PHASE_COUNT };
typedef struct cuda_phase_totals {
    uint64_t forwards[2];
    double host_s[2][CUDA_PHASE_COUNT];
    double body_device_s[2];
} cuda_phase_totals;
void cuda_backend_time_phases(backend *b, int on);
/* The totals so far (zeros while timing is off). */
cuda_phase_totals cuda_backend_phase_totals(backend *b);

#endif
