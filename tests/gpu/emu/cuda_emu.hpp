// strata's CUDA emulator (STRATA_CUDA=EMU): the part of the CUDA runtime, cuda_fp16 and cuBLAS that
// strata uses, executed on the CPU, so the CUDA backend (kernels/cuda, engine/gpu) runs in CI on
// machines without a GPU. docs/GPU.md, "CUDA emulator", says what it checks and what it cannot.
//
// What it models:
// - device memory: host memory registered as device allocations, with a capacity
//   (STRATA_CUDA_EMU_MEM_MIB, default 2048) that cudaMalloc and cudaMemGetInfo respect;
// - page-locked host memory: cudaMallocHost and cudaHostRegister ranges, which asynchronous copies
//   leave in place (pageable memory is staged or waited for, as CUDA does);
// - streams: one worker thread each, running its queue in order, concurrently with the host and the
//   other streams; events order them (cudaEventRecord / cudaStreamWaitEvent / cudaEventSynchronize);
// - kernels: every CUDA thread of a block is a fiber on the stream's worker; __syncthreads() and
//   __shfl_xor_sync() switch between them, so block and warp cooperation runs as written. Kernels run
//   one at a time (a __shared__ array is a function-static).
//
// What it checks, failing the call with an error (and one line on stderr) where CUDA would fail or
// where the result on a GPU would be undefined: launch configurations (block size, grid limits), a
// kernel argument pointer outside device memory, memory copies whose direction or range do not match
// the allocations, host registrations that overlap or are released twice, cuBLAS leading dimensions and operand extents, shuffles with inactive lanes and
// barriers that not every thread reaches.
//
// What it does not model: timing, memory coalescing, device-side out-of-bounds reads inside an
// allocation's neighbour, and pointers stored inside structures (only direct kernel arguments are
// checked).
#pragma once

#include <math.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---- runtime API: types ----

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
};

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;

constexpr unsigned cudaStreamDefault = 0x0;
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaHostRegisterDefault = 0x0;
constexpr unsigned cudaHostRegisterPortable = 0x1;
constexpr unsigned cudaHostRegisterMapped = 0x2;
constexpr unsigned cudaHostRegisterIoMemory = 0x4;
constexpr unsigned cudaHostRegisterReadOnly = 0x8;
constexpr unsigned cudaEventDefault = 0x0;
constexpr unsigned cudaEventBlockingSync = 0x1;
constexpr unsigned cudaEventDisableTiming = 0x2;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int maxThreadsPerBlock;
    int warpSize;
};

struct alignas(16) float4 {
    float x, y, z, w;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// ---- runtime API: functions ----

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();
// Waits for all work and clears a kernel fault (allocations stay: unlike CUDA, nothing is freed).
cudaError_t cudaDeviceReset();

cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
// Page-locks [p, p + bytes) of memory the caller owns (copies from and to it then run asynchronously).
// cudaErrorHostMemoryAlreadyRegistered when any byte of it is already page-locked (registered, or from
// cudaMallocHost); cudaErrorInvalidValue for a null range, unknown flags or device memory.
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags);
// cudaErrorHostMemoryNotRegistered unless p is where a registered range starts.
cudaError_t cudaHostUnregister(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// ---- cuda_fp16 ----

struct __half {
    uint16_t bits;
};
inline float __half2float(__half h) {
    _Float16 f;
    std::memcpy(&f, &h.bits, sizeof f);
    return static_cast<float>(f);
}
inline __half __float2half_rn(float x) {
    const _Float16 f = static_cast<_Float16>(x);  // round to nearest even, as __float2half_rn
    __half h;
    std::memcpy(&h.bits, &f, sizeof f);
    return h;
}
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyintf(x)); }  // round to nearest even
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// ---- cuBLAS (the GEMM of the prompt path) ----

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_16F = 64, CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

struct cublasContext;
using cublasHandle_t = cublasContext*;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s);
// C = alpha op(A) op(B) + beta C, column-major; A, B f16 or f32, C f32, f32 compute.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
