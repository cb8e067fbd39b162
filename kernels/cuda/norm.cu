// RMSNorm over contiguous rows (the residual stream, or q/k heads for QK-norm).
#include "common.cuh"
#include "cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;

// One block per row; as kernels::cpu::rms_norm: scale = 1 / sqrt(mean(x^2) + eps), out = x * scale * w.
__global__ void rms_norm_kernel(const float* x, const float* weight, float eps, int64_t n, float* out) {
    __shared__ float shared[kWarp];
    const float* xr = x + blockIdx.x * n;
    float* yr = out + blockIdx.x * n;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i] * xr[i];
    sum = block_sum(sum, shared);
    const float scale = rsqrtf(sum / static_cast<float>(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * (weight ? weight[i] : 1.0f);
}

}  // namespace

void rms_norm(const float* x, const float* weight, float eps, int64_t n, int64_t n_rows, float* out, stream_t stream) {
    if (n_rows <= 0) return;
    STRATA_LAUNCH(rms_norm_kernel, static_cast<unsigned>(n_rows), kThreads, as_stream(stream))(x, weight, eps, n, out);
    check_launch("rms_norm");
}

}  // namespace strata::kernels::cuda
