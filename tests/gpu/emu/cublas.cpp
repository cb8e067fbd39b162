// The CUDA emulator's cuBLAS: the one GEMM strata calls (cublasGemmEx, f16/f32 operands, f32
// compute), column-major as cuBLAS documents it, with its argument checks; queued on the handle's stream.
#include <algorithm>
#include <string>

#include "emu_internal.hpp"

using namespace cuemu::detail;

struct cublasContext {
    cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

float load(const void* p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
    const uint16_t bits = static_cast<const uint16_t*>(p)[i];
    if (t == CUDA_R_16F) return __half2float(__ushort_as_half(bits));
    return __uint_as_float(uint32_t{bits} << 16);
}

cublasStatus_t blas_fail(const std::string& what) {
    report("cublasGemmEx: " + what);
    return CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (sticky() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (m < 0 || n < 0 || k < 0) return blas_fail("negative dimension");
    if (transa == CUBLAS_OP_C || transb == CUBLAS_OP_C) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Ctype != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    // Stored shapes (column-major): op(A) is m x k, op(B) is k x n.
    const int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    const int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
        return blas_fail("leading dimensions lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " +
                         std::to_string(ldc) + " are below the rows " + std::to_string(a_rows) + ", " +
                         std::to_string(b_rows) + ", " + std::to_string(m));
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    auto span = [](int ld, int rows, int cols) { return cols == 0 ? 0 : size_t(ld) * size_t(cols - 1) + size_t(rows); };
    const memory_map& mm = memory();
    if (k > 0 && !mm.is_device(A, span(lda, a_rows, a_cols) * type_bytes(Atype)))
        return blas_fail("A (" + std::to_string(a_rows) + " x " + std::to_string(a_cols) + ", lda " +
                         std::to_string(lda) + ") is not inside one device allocation");
    if (k > 0 && !mm.is_device(B, span(ldb, b_rows, b_cols) * type_bytes(Btype)))
        return blas_fail("B (" + std::to_string(b_rows) + " x " + std::to_string(b_cols) + ", ldb " +
                         std::to_string(ldb) + ") is not inside one device allocation");
    if (!mm.is_device(C, span(ldc, m, n) * 4))
        return blas_fail("C (" + std::to_string(m) + " x " + std::to_string(n) + ", ldc " + std::to_string(ldc) +
                         ") is not inside one device allocation");
    const float a = *static_cast<const float*>(alpha), bt = *static_cast<const float*>(beta);
    target(handle->stream)->push([=] {
        auto* c = static_cast<float*>(C);
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                float sum = 0.0f;
                for (int p = 0; p < k; ++p) {
                    const size_t ai = transa == CUBLAS_OP_N ? size_t(p) * lda + i : size_t(i) * lda + p;
                    const size_t bi = transb == CUBLAS_OP_N ? size_t(j) * ldb + p : size_t(p) * ldb + j;
                    sum += load(A, Atype, ai) * load(B, Btype, bi);
                }
                float& out = c[size_t(j) * ldc + i];
                out = bt == 0.0f ? a * sum : a * sum + bt * out;  // beta 0: C is not read, as cuBLAS
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}
