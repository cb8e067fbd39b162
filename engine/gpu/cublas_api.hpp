// Internal to engine/gpu: the cuBLAS entry points the CUDA backend calls, resolved when the first cuBLAS
// handle is made. cuBLAS is opened then (dlopen), so a process that never uses a GPU never maps it: its
// static data alone is tens of MiB resident, which a CPU-only run on a CUDA build would carry for nothing.
#pragma once

#include <cublas_v2.h>

namespace strata::engine::gpu {

struct cublas_api {
    cublasStatus_t (*create)(cublasHandle_t*);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k, const void* alpha,
                              const void* a, cudaDataType_t a_type, int lda, const void* b, cudaDataType_t b_type, int ldb,
                              const void* beta, void* c, cudaDataType_t c_type, int ldc, cublasComputeType_t compute,
                              cublasGemmAlgo_t algo);
};

// The entry points, loading cuBLAS on the first call. Throws std::runtime_error naming the library and
// the loader's message when it cannot be loaded (the next call tries again).
const cublas_api& cublas_functions();

}  // namespace strata::engine::gpu
