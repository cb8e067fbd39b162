// Element-wise kernels of the MoE block and the residual stream: SiLU-mul, add, bias, the shared
// expert's sigmoid gate, and the routed experts' weighted sum.
#include "common.cuh"
#include "cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void add_bias_kernel(float* x, const float* bias, int64_t n, int64_t total) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i < total) x[i] += bias[i % n];
}

__global__ void scale_by_sigmoid_kernel(float* y, const float* g, int64_t n, int64_t total) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i < total) y[i] *= 1.0f / (1.0f + expf(-g[i / n]));
}

// One thread per (token, element): jobs of token t are summed in job order.
__global__ void weighted_sum_kernel(const float* y, const float* weight, const int32_t* job_begin, int n_tok,
                                    int64_t n, float* out) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i >= int64_t{n_tok} * n) return;
    const int64_t t = i / n, c = i % n;
    float acc = 0.0f;
    for (int32_t j = job_begin[t]; j < job_begin[t + 1]; ++j) acc += weight[j] * y[int64_t{j} * n + c];
    out[i] = acc;
}

}  // namespace

void silu_mul(const float* gate, const float* up, int64_t n, float* out, stream_t stream) {
    if (n <= 0) return;
    STRATA_LAUNCH(silu_mul_kernel, grid_for(n, kThreads), kThreads, as_stream(stream))(gate, up, n, out);
    check_launch("silu_mul");
}

void add(float* x, const float* y, int64_t n, stream_t stream) {
    if (n <= 0) return;
    STRATA_LAUNCH(add_kernel, grid_for(n, kThreads), kThreads, as_stream(stream))(x, y, n);
    check_launch("add");
}

void add_bias(float* x, const float* bias, int64_t n, int64_t n_rows, stream_t stream) {
    const int64_t total = n * n_rows;
    if (total <= 0) return;
    STRATA_LAUNCH(add_bias_kernel, grid_for(total, kThreads), kThreads, as_stream(stream))(x, bias, n, total);
    check_launch("add_bias");
}

void scale_by_sigmoid(float* y, const float* g, int64_t n, int64_t n_rows, stream_t stream) {
    const int64_t total = n * n_rows;
    if (total <= 0) return;
    STRATA_LAUNCH(scale_by_sigmoid_kernel, grid_for(total, kThreads), kThreads, as_stream(stream))(y, g, n, total);
    check_launch("scale_by_sigmoid");
}

void weighted_sum(const float* y, const float* weight, const int32_t* job_begin, int n_tok, int64_t n, float* out,
                  stream_t stream) {
    const int64_t total = int64_t{n_tok} * n;
    if (total <= 0) return;
    STRATA_LAUNCH(weighted_sum_kernel, grid_for(total, kThreads), kThreads, as_stream(stream))(
        y, weight, job_begin, n_tok, n, out);
    check_launch("weighted_sum");
}

}  // namespace strata::kernels::cuda
