/* The CUDA backend's public header (built with `make CUDA=1`): the probe a
 * `--backend cuda` option calls first, then the backend itself, which
 * implements engine/backend.h's interface on the GPU (cuda/cuda_backend.c). */
#ifndef POTSERVE_CUDA_BACKEND_H
#define POTSERVE_CUDA_BACKEND_H

#include <stddef.h>

#include "engine/backend.h"

struct model;

/* 0 when a CUDA device and cuBLAS are usable, with the device described in
 * msg; -1 with the reason in msg otherwise (no driver, no device, cuBLAS
 * failing to start). Leaves nothing allocated. */
int cuda_probe(char *msg, size_t msglen);

/* The CUDA backend for a llama-family model (llama, qwen2 biases included):
 * weights uploaded once in their file types (F32, F16, BF16, Q4_0, Q4_1, Q8_0;
 * other types are refused with a message), forward() as engine/backend.h
 * describes, the same results as cpu_backend_new within float rounding.
 * n_threads is unused (the host side is one thread). exact = 1 runs every
 * matrix product in f32; exact = 0 lets cuBLAS use TF32 for prefill products
 * (faster on a GPU, about 1e-3 relative). The model must outlive the backend.
 *
 * Pots stay host structs (cache/cache.h); the backend keeps a device mirror of
 * each pot it has seen, keyed by the pot's address, and writes the K/V of
 * every forwarded token back into the host pot, so the CPU-side policies keep
 * working. Between forwards the host may change a pot (pot_compact,
 * pot_truncate, pot_copy, a snapshot read into a reused address): the mirror
 * notices a shrunk count or a changed fingerprint and uploads the pot again
 * (see cuda_backend.c, "pot mirrors"). NULL + err on failure (no device, out
 * of device memory, unsupported weight type). */
backend *cuda_backend_new(const struct model *m, int n_threads, int exact, char *err, size_t errlen);

/* Drops the device mirror of p, if any (call before pot_free to return the
 * device memory at once; otherwise mirrors are evicted least recently used).
 * b must come from cuda_backend_new. */
void cuda_backend_forget_pot(backend *b, const pot *p);

/* For tests: 1 when the device mirror of p exists and its valid slots hold
 * exactly the bytes of the host pot's valid slots, 0 otherwise. */
int cuda_backend_mirror_matches(backend *b, const pot *p);

#endif
