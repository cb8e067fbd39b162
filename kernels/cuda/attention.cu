// The f16 KV cache in VRAM and causal grouped-query attention over it.
//
// Layout per layer: K and V both [n_ctx][n_kv] halves (n_kv = n_head_kv * head_dim), one row per
// position. (The CPU cache transposes V; here each thread block reads whole rows, so rows are the
// coalesced choice for both.)
#include "common.cuh"
#include "cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 128;

__global__ void kv_store_kernel(const float* k, const float* v, int n_tok, int n_kv, int pos0, uint16_t* k_cache,
                                uint16_t* v_cache) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i >= int64_t{n_tok} * n_kv) return;
    const int64_t dst = int64_t{pos0} * n_kv + i;  // token t's row is position pos0 + t
    k_cache[dst] = float_to_half(k[i]);
    v_cache[dst] = float_to_half(v[i]);
}

// One block per (query head h, token t). Phase 1: scores over positions [0, n_pos) into scratch;
// phase 2: softmax; phase 3: out[d] = sum_p p[p] * V[p][g][d], one thread per d (strided).
__global__ void attention_kernel(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, int pos0,
                                 int n_head, int n_head_kv, int head_dim, float scale, float* scratch, int scratch_len,
                                 float* out) {
    __shared__ float shared[kWarp];
    const int h = blockIdx.x, t = blockIdx.y;
    const int g = h / (n_head / n_head_kv);
    const int n_kv = n_head_kv * head_dim;
    const int n_pos = pos0 + t + 1;
    const float* qh = q + (int64_t{t} * n_head + h) * head_dim;
    float* p = scratch + (int64_t{t} * n_head + h) * scratch_len;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;

    // scores: one warp per position, lanes across the head dimension
    for (int pos = warp; pos < n_pos; pos += n_warps) {
        const uint16_t* kr = k_cache + int64_t{pos} * n_kv + int64_t{g} * head_dim;
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += kWarp) s += qh[d] * half_to_float(kr[d]);
        s = warp_sum(s);
        if (lane == 0) p[pos] = s * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int pos = threadIdx.x; pos < n_pos; pos += blockDim.x) m = fmaxf(m, p[pos]);
    m = block_max(m, shared);
    float sum = 0.0f;
    for (int pos = threadIdx.x; pos < n_pos; pos += blockDim.x) {
        const float e = __expf(p[pos] - m);
        p[pos] = e;
        sum += e;
    }
    sum = block_sum(sum, shared);
    __syncthreads();
    const float inv = 1.0f / sum;
    float* oh = out + (int64_t{t} * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        const uint16_t* vc = v_cache + int64_t{g} * head_dim + d;
        float acc = 0.0f;
        for (int pos = 0; pos < n_pos; ++pos) acc += p[pos] * half_to_float(vc[int64_t{pos} * n_kv]);
        oh[d] = acc * inv;
    }
}

}  // namespace

void kv_store_f16(const float* k, const float* v, int n_tok, int n_kv, int pos0, uint16_t* k_cache,
                  uint16_t* v_cache, stream_t stream) {
    const int64_t n = int64_t{n_tok} * n_kv;
    if (n <= 0) return;
    STRATA_LAUNCH(kv_store_kernel, grid_for(n, 256), 256, as_stream(stream))(k, v, n_tok, n_kv, pos0, k_cache, v_cache);
    check_launch("kv_store_f16");
}

void attention_f16(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, int n_tok, int pos0, int n_head,
                   int n_head_kv, int head_dim, float scale, float* scratch, float* out, stream_t stream) {
    if (n_tok <= 0) return;
    const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>(n_tok));
    STRATA_LAUNCH(attention_kernel, grid, kThreads, as_stream(stream))(
        q, k_cache, v_cache, pos0, n_head, n_head_kv, head_dim, scale, scratch, pos0 + n_tok, out);
    check_launch("attention_f16");
}

}  // namespace strata::kernels::cuda
