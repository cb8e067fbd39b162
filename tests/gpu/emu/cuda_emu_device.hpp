// strata's CUDA emulator, device side: what kernel code sees (the execution-space keywords, the
// built-in thread coordinates, __syncthreads, warp shuffles, device math) and the launcher that
// stands in for kernel<<<grid, block, 0, stream>>>(...) (STRATA_LAUNCH in kernels/cuda/common.cuh).
// Included by the emulator's cuda_runtime.h only: host code that includes cuda_runtime_api.h does not
// get these macros.
#pragma once

#include "cuda_emu.hpp"

// ---- device code ----

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Per kernel function (kernels run one at a time, one block at a time), in one linker section that the
// scheduler fills with a poison pattern (NaN bytes) before every block, so a read before any write
// in the block sees garbage as on a GPU instead of the previous block's values.
#define __shared__ __attribute__((section("strata_cuemu_shared"))) static

namespace cuemu {

// The CUDA thread the calling fiber runs.
struct thread_coords {
    dim3 thread_idx, block_idx, block_dim, grid_dim;
};
extern thread_local const thread_coords* tl_coords;

// `file` and `line`: the call site, so a barrier reached from two different places is reported.
void syncthreads(const char* file, int line);
uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width);

// ---- kernel launches ----

struct launch_config {
    dim3 grid, block;
    cudaStream_t stream;
    const char* kernel;  // the kernel's name, for error lines
};

// Checks the configuration and the pointer arguments (device memory or null), then queues body (the
// kernel's code for one CUDA thread) on the stream. Returns the launch error, also kept for
// cudaGetLastError.
cudaError_t enqueue_kernel(const launch_config& config, const std::vector<const void*>& pointer_args,
                           std::function<void()> body);

template <class T>
void collect_pointer(std::vector<const void*>& out, const T& v) {
    if constexpr (std::is_pointer_v<T>) out.push_back(static_cast<const void*>(v));
}

// kernel(args...) as if by kernel<<<grid, block, 0, stream>>>(args...).
template <class... P>
class launcher {
public:
    launcher(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, const char* name)
        : kernel_(kernel), config_{grid, block, stream, name} {}
    template <class... A>
    void operator()(A&&... args) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        std::tuple<std::decay_t<P>...> a(static_cast<P>(std::forward<A>(args))...);
        std::vector<const void*> pointers;
        std::apply([&](const auto&... v) { (collect_pointer(pointers, v), ...); }, a);
        auto kernel = kernel_;
        enqueue_kernel(config_, pointers, [kernel, a] { std::apply(kernel, a); });
    }

private:
    void (*kernel_)(P...);
    launch_config config_;
};

template <class... P>
launcher<P...> make_launcher(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, const char* name) {
    return launcher<P...>(kernel, grid, block, stream, name);
}

}  // namespace cuemu

#define threadIdx (::cuemu::tl_coords->thread_idx)
#define blockIdx (::cuemu::tl_coords->block_idx)
#define blockDim (::cuemu::tl_coords->block_dim)
#define gridDim (::cuemu::tl_coords->grid_dim)

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    cuemu::syncthreads(file, line);
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "__shfl_xor_sync of a type the emulator cannot move");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    bits = cuemu::shuffle_xor(mask, bits, lane_mask, width);
    T out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
template <class T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
template <class T>
inline T max(T a, T b) {
    return a < b ? b : a;
}

