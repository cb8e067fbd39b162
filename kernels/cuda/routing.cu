// Router: softmax or sigmoid scores, an optional selection bias, optional group-limited selection,
// then top-k, renormalisation and scale, as engine::route_token on the CPU.
#include "common.cuh"
#include "cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kMaxExpert = 1024;
constexpr int kMaxUsed = 64;
constexpr float kMinSum = 6.103515625e-5f;  // 2^-14: the CPU's (and llama.cpp's) clamp of the weight sum

struct route_consts {
    bool sigmoid;
    const float* bias;  // [n_expert] or nullptr
    bool normalize;
    float scale;
    int n_group, n_group_used;
};

// Thread 0 only: every expert outside the n_group_used groups whose two best selection scores sum
// highest drops to -inf (ties: the lower group), as engine::keep_best_groups.
__device__ void keep_best_groups(float* sel, int n_expert, int n_group, int n_group_used, float* group_score) {
    const int per_group = n_expert / n_group;
    for (int g = 0; g < n_group; ++g) {
        float best = -INFINITY, second = -INFINITY;
        for (int i = g * per_group; i < (g + 1) * per_group; ++i) {
            if (sel[i] > best) {
                second = best;
                best = sel[i];
            } else if (sel[i] > second) {
                second = sel[i];
            }
        }
        group_score[g] = best + second;
    }
    for (int j = 0; j < n_group_used; ++j) {  // mark the kept groups with +inf
        int top = -1;
        for (int g = 0; g < n_group; ++g)
            if (group_score[g] != INFINITY && (top < 0 || group_score[g] > group_score[top])) top = g;
        group_score[top] = INFINITY;
    }
    for (int g = 0; g < n_group; ++g)
        if (group_score[g] != INFINITY)
            for (int i = g * per_group; i < (g + 1) * per_group; ++i) sel[i] = -INFINITY;
}

// One block per token. The scores are computed in parallel; thread 0 then selects the top k (k passes
// over at most 1024 values: cheap next to the router matvec, and ties resolve exactly as on the CPU:
// the larger selection score, then the lower id).
__global__ void route_kernel(const float* logits, int n_expert, int k, route_consts c, int32_t* ids, float* weights) {
    __shared__ float p[kMaxExpert];    // scores: the weights of the chosen experts
    __shared__ float sel[kMaxExpert];  // selection scores: p + bias, -inf outside the kept groups
    __shared__ bool taken[kMaxExpert];
    __shared__ float group_score[kMaxExpert];
    __shared__ float shared[kWarp];
    const float* lt = logits + int64_t{blockIdx.x} * n_expert;
    if (c.sigmoid) {
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) p[e] = 1.0f / (1.0f + expf(-lt[e]));
    } else {
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
    }
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        sel[e] = c.bias ? p[e] + c.bias[e] : p[e];
        taken[e] = false;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    if (c.n_group > 1) keep_best_groups(sel, n_expert, c.n_group, c.n_group_used, group_score);
    int32_t* it = ids + int64_t{blockIdx.x} * k;
    float* wt = weights + int64_t{blockIdx.x} * k;
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < n_expert; ++e)
            if (!taken[e] && (best < 0 || sel[e] > sel[best])) best = e;  // strict >: the lower id wins ties
        taken[best] = true;
        it[j] = best;
        wt[j] = p[best];
        total += p[best];
    }
    if (c.normalize)
        for (int j = 0; j < k; ++j) wt[j] /= fmaxf(total, kMinSum);
    if (c.scale != 0.0f && c.scale != 1.0f)
        for (int j = 0; j < k; ++j) wt[j] *= c.scale;
}

}  // namespace

void route_topk(const float* logits, int n_tok, int n_expert, int k, const route_params& p, int32_t* ids,
                float* weights, stream_t stream) {
    if (n_expert > kMaxExpert || k > kMaxUsed || k > n_expert || k < 1)
        throw std::invalid_argument("route_topk: " + std::to_string(n_expert) + " experts with " + std::to_string(k) +
                                    " used is outside the kernel's range (at most 1024 experts, 1..64 used)");
    if (p.n_group > 1 && (n_expert % p.n_group != 0 || p.n_group_used < 1 || p.n_group_used > p.n_group))
        throw std::invalid_argument("route_topk: " + std::to_string(n_expert) + " experts cannot be split into " +
                                    std::to_string(p.n_group) + " equal groups of which " +
                                    std::to_string(p.n_group_used) + " are kept");
    if (n_tok <= 0) return;
    const route_consts c{p.sigmoid, p.bias, p.normalize, p.scale, p.n_group, p.n_group_used};
    STRATA_LAUNCH(route_kernel, static_cast<unsigned>(n_tok), kThreads, as_stream(stream))(logits, n_expert, k, c, ids,
                                                                                           weights);
    check_launch("route_topk");
}

void route_topk(const float* logits, int n_tok, int n_expert, int k, bool normalize, int32_t* ids, float* weights,
                stream_t stream) {
    route_params p;
    p.normalize = normalize;
    route_topk(logits, n_tok, n_expert, k, p, ids, weights, stream);
}

}  // namespace strata::kernels::cuda
