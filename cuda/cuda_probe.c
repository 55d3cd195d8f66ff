/* cuda_probe: asks the CUDA runtime for device 0 and starts and stops cuBLAS
 * once, so a server asked for the CUDA backend can refuse with a clear line
 * instead of failing on its first forward. */
#include "cuda_backend.h"

#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

int cuda_probe(char *msg, size_t msglen) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        snprintf(msg, msglen, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return -1;
    }
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
        snprintf(msg, msglen, "CUDA device 0: %s", cudaGetErrorString(e));
        return -1;
    }
    if (prop.major < 8) {
        snprintf(msg, msglen, "CUDA device 0 (%s) has compute capability %d.%d; potserve's kernels need 8.0 or newer",
                 prop.name, prop.major, prop.minor);
        return -1;
    }
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(msg, msglen, "cuBLAS does not start on %s: %s", prop.name, cublasGetStatusString(s));
        return -1;
    }
    cublasDestroy(h);
    snprintf(msg, msglen, "%s, compute capability %d.%d, %.1f GiB", prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}
