// Internal to kernels/cuda: launch checking, half conversions and warp/block reductions.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

// STRATA_LAUNCH(kernel, grid, block, stream)(args...) is kernel<<<grid, block, 0, stream>>>(args...);
// under the CPU emulator (STRATA_CUDA=EMU, emu/cuda_emu.hpp) the emulator's launcher, which the host
// compiler can parse.
#if defined(STRATA_CUDA_EMU)
#define STRATA_LAUNCH(kernel, grid, block, stream) ::cuemu::make_launcher(kernel, grid, block, stream, #kernel)
#else
#define STRATA_LAUNCH(kernel, grid, block, stream) kernel<<<grid, block, 0, stream>>>
#endif

namespace strata::kernels::cuda::detail {

constexpr int kWarp = 32;

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Throws when the last launch failed (bad configuration, no device); does not synchronise.
inline void check_launch(const char* kernel) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        throw std::runtime_error(std::string("CUDA kernel ") + kernel + " failed to launch: " + cudaGetErrorString(e));
}

inline unsigned grid_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ __forceinline__ float half_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ uint16_t float_to_half(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(uint32_t{bits} << 16); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : -INFINITY;
    return warp_max(v);
}

}  // namespace strata::kernels::cuda::detail
