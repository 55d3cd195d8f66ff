/* The CUDA backend's public header (built with `make CUDA=1`). For now only
 * the probe a `--backend cuda` option can call before anything else: the
 * backend itself (engine/backend.h's interface on the GPU) comes next. */
#ifndef POTSERVE_CUDA_BACKEND_H
#define POTSERVE_CUDA_BACKEND_H

#include <stddef.h>

/* 0 when a CUDA device and cuBLAS are usable, with the device described in
 * msg; -1 with the reason in msg otherwise (no driver, no device, cuBLAS
 * failing to start). Leaves nothing allocated. */
int cuda_probe(char *msg, size_t msglen);

#endif
