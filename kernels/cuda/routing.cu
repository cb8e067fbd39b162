// Router: softmax over the expert logits, then top-k, as engine::route_token on the CPU.
#include "common.cuh"
#include "cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kMaxExpert = 1024;
constexpr int kMaxUsed = 64;

// One block per token. The probabilities are computed in parallel; thread 0 then selects the top k
// (k passes over at most 1024 values: cheap next to the router matvec, and ties resolve exactly as on
// the CPU: the larger probability, then the lower id).
__global__ void route_kernel(const float* logits, int n_expert, int k, bool normalize, int32_t* ids, float* weights) {
    __shared__ float p[kMaxExpert];
    __shared__ float shared[kWarp];
    const float* lt = logits + int64_t{blockIdx.x} * n_expert;
    float m = -INFINITY;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) m = fmaxf(m, lt[e]);
    m = block_max(m, shared);
    float sum = 0.0f;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        p[e] = expf(lt[e] - m);
        sum += p[e];
    }
    sum = block_sum(sum, shared);
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) p[e] /= sum;
    __syncthreads();
    if (threadIdx.x != 0) return;
    int32_t* it = ids + int64_t{blockIdx.x} * k;
    float* wt = weights + int64_t{blockIdx.x} * k;
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < n_expert; ++e)
            if (p[e] >= 0.0f && (best < 0 || p[e] > p[best])) best = e;  // strict >: the lower id wins ties
        it[j] = best;
        wt[j] = p[best];
        total += p[best];
        p[best] = -1.0f;  // taken
    }
    if (normalize)
        for (int j = 0; j < k; ++j) wt[j] /= total;
}

}  // namespace

void route_topk(const float* logits, int n_tok, int n_expert, int k, bool normalize, int32_t* ids, float* weights,
                stream_t stream) {
    if (n_expert > kMaxExpert || k > kMaxUsed || k > n_expert || k < 1)
        throw std::invalid_argument("route_topk: " + std::to_string(n_expert) + " experts with " + std::to_string(k) +
                                    " used is outside the kernel's range (at most 1024 experts, 1..64 used)");
    if (n_tok <= 0) return;
    STRATA_LAUNCH(route_kernel, static_cast<unsigned>(n_tok), kThreads, as_stream(stream))(
        logits, n_expert, k, normalize, ids, weights);
    check_launch("route_topk");
}

}  // namespace strata::kernels::cuda
