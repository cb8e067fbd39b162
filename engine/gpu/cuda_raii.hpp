// Internal to engine/gpu: owners for CUDA runtime resources (streams, events, device buffers, a cuBLAS
// handle) and the error check. Included only by the .cpp files of the CUDA backend. Pinned host memory
// is host_pool.hpp's (bound to the hot node, page-locked with cudaHostRegister).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "gpu/cublas_api.hpp"

namespace strata::engine::gpu {

// Throws std::runtime_error naming the call and CUDA's message.
inline void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

// Movable, non-copyable owner of a handle with a destroy function.
template <class H, class Traits>
class cuda_handle {
public:
    cuda_handle() = default;
    explicit cuda_handle(H h) : h_(h) {}
    cuda_handle(cuda_handle&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
    cuda_handle& operator=(cuda_handle&& o) noexcept {
        if (this != &o) {
            reset();
            h_ = std::exchange(o.h_, H{});
        }
        return *this;
    }
    cuda_handle(const cuda_handle&) = delete;
    cuda_handle& operator=(const cuda_handle&) = delete;
    ~cuda_handle() { reset(); }
    void reset() {
        if (h_) Traits::destroy(h_);
        h_ = H{};
    }
    H get() const { return h_; }
    operator H() const { return h_; }  // NOLINT: passes straight into CUDA calls

private:
    H h_{};
};

struct stream_traits {
    static void destroy(cudaStream_t s) { cudaStreamDestroy(s); }
};
struct event_traits {
    static void destroy(cudaEvent_t e) { cudaEventDestroy(e); }
};
struct cublas_traits {
    static void destroy(cublasHandle_t h) { cublas_functions().destroy(h); }
};

class stream : public cuda_handle<cudaStream_t, stream_traits> {
public:
    static stream create() {
        cudaStream_t s{};
        check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        return stream(s);
    }
    void synchronize() const { check(cudaStreamSynchronize(get()), "cudaStreamSynchronize"); }
    void* raw() const { return static_cast<void*>(get()); }  // for kernels::cuda (stream_t)

private:
    using cuda_handle::cuda_handle;
};

class event : public cuda_handle<cudaEvent_t, event_traits> {
public:
    static event create(bool timing = false) {
        cudaEvent_t e{};
        check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
        return event(e);
    }
    void record(cudaStream_t s) const { check(cudaEventRecord(get(), s), "cudaEventRecord"); }
    void synchronize() const { check(cudaEventSynchronize(get()), "cudaEventSynchronize"); }
    bool done() const {
        const cudaError_t e = cudaEventQuery(get());
        if (e == cudaErrorNotReady) return false;
        check(e, "cudaEventQuery");
        return true;
    }
    // Milliseconds from `from` to this event (both recorded with timing, both complete).
    float ms_since(const event& from) const {
        float ms = 0;
        check(cudaEventElapsedTime(&ms, from.get(), get()), "cudaEventElapsedTime");
        return ms;
    }

private:
    using cuda_handle::cuda_handle;
};

class cublas {
public:
    cublas() {
        cublasHandle_t h{};
        check(cublas_functions().create(&h), "cublasCreate");
        h_ = cuda_handle<cublasHandle_t, cublas_traits>(h);
    }
    cublasHandle_t get() const { return h_.get(); }

private:
    cuda_handle<cublasHandle_t, cublas_traits> h_;
};

// n elements of T in VRAM (uninitialised).
template <class T>
class device_buffer {
public:
    device_buffer() = default;
    explicit device_buffer(size_t n) : n_(n) {
        if (n) check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)),
                     ("cudaMalloc of " + std::to_string(n * sizeof(T) >> 20) + " MiB").c_str());
    }
    // n elements, or an empty buffer when VRAM has no room for them (CUDA's error is cleared then).
    static device_buffer try_allocate(size_t n) {
        device_buffer b;
        const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&b.p_), n * sizeof(T));
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            b.p_ = nullptr;
            return b;
        }
        check(e, ("cudaMalloc of " + std::to_string(n * sizeof(T) >> 20) + " MiB").c_str());
        b.n_ = n;
        return b;
    }
    device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    device_buffer& operator=(device_buffer&& o) noexcept {
        if (this != &o) {
            release();
            p_ = std::exchange(o.p_, nullptr);
            n_ = std::exchange(o.n_, 0);
        }
        return *this;
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
    ~device_buffer() { release(); }
    T* data() const { return p_; }
    size_t size() const { return n_; }
    size_t bytes() const { return n_ * sizeof(T); }

private:
    void release() {
        if (p_) cudaFree(p_);
        p_ = nullptr;
    }
    T* p_ = nullptr;
    size_t n_ = 0;
};

// Asynchronous copies on a stream (the host side must be a host_pool for them to overlap).
template <class T>
void copy_to_device(T* dst, const T* src, size_t n, cudaStream_t s) {
    check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync host to device");
}
template <class T>
void copy_to_host(T* dst, const T* src, size_t n, cudaStream_t s) {
    check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync device to host");
}

}  // namespace strata::engine::gpu
