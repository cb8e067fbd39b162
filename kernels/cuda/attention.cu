// The KV cache in VRAM (f16 or Q8_0 rows) and causal grouped-query attention over it.
//
// Layout per layer: K and V both one row of n_kv elements per position (n_kv = n_head_kv * head_dim).
// (The CPU's f16 cache transposes V; here each thread block reads whole rows, so rows are the
// coalesced choice for both.)
#include "common.cuh"
#include "cuda_kernels.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;
using formats::block_q8_0;

constexpr int kThreads = 128;
constexpr int kQ8 = formats::QK8_0;
constexpr int kMaxQ8HeadDim = 1024;  // the quantized query lives in shared memory

// Element i of a cache row, per format.
struct cache_f16 {
    static constexpr bool quantized = false;
    __device__ static float load(const uint8_t* row, int64_t i) {
        return half_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
    }
};
struct cache_q8 {
    static constexpr bool quantized = true;
    __device__ static float load(const uint8_t* row, int64_t i) {
        const block_q8_0& b = reinterpret_cast<const block_q8_0*>(row)[i / kQ8];
        return half_to_float(b.d) * static_cast<float>(b.qs[i % kQ8]);
    }
};

__global__ void kv_store_f16_kernel(const float* k, const float* v, int n_tok, int n_kv, int pos0, uint16_t* k_cache,
                                    uint16_t* v_cache) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i >= int64_t{n_tok} * n_kv) return;
    const int64_t dst = int64_t{pos0} * n_kv + i;  // token t's row is position pos0 + t
    k_cache[dst] = float_to_half(k[i]);
    v_cache[dst] = float_to_half(v[i]);
}

// As formats::quantize_q8_0: d = half(max|x| / 127), q = clamp(round-to-even(x / d), -127, 127).
__device__ void quantize_block_q8(const float* x, block_q8_0& out) {
    float amax = 0.0f;
    for (int j = 0; j < kQ8; ++j) amax = fmaxf(amax, fabsf(x[j]));
    const uint16_t d = float_to_half(amax / 127.0f);
    const float dd = half_to_float(d);
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int j = 0; j < kQ8; ++j) {
        const int q = static_cast<int>(rintf(x[j] * id));
        out.qs[j] = static_cast<int8_t>(q < -127 ? -127 : (q > 127 ? 127 : q));
    }
    out.d = d;
}

// One thread per (token, block of 32).
__global__ void kv_store_q8_kernel(const float* k, const float* v, int n_tok, int n_kv, int pos0, size_t row_bytes,
                                   uint8_t* k_cache, uint8_t* v_cache) {
    const int n_blocks = n_kv / kQ8;
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i >= int64_t{n_tok} * n_blocks) return;
    const int64_t t = i / n_blocks, b = i % n_blocks;
    const size_t row = static_cast<size_t>(pos0 + t) * row_bytes;
    quantize_block_q8(k + t * n_kv + b * kQ8, reinterpret_cast<block_q8_0*>(k_cache + row)[b]);
    quantize_block_q8(v + t * n_kv + b * kQ8, reinterpret_cast<block_q8_0*>(v_cache + row)[b]);
}

// One block per (query head h, token t). Phase 1: scores over positions [0, n_pos) into scratch;
// phase 2: softmax; phase 3: out[d] = sum_p p[p] * V[p][g][d], one thread per d (strided).
template <class C>
__global__ void attention_kernel(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, size_t row_bytes,
                                 int pos0, int n_head, int n_head_kv, int head_dim, float scale, float* scratch,
                                 int scratch_len, float* out) {
    __shared__ float shared[kWarp];
    const int h = blockIdx.x, t = blockIdx.y;
    const int g = h / (n_head / n_head_kv);
    const int64_t head = int64_t{g} * head_dim;  // the kv head's first element within a row
    const int n_pos = pos0 + t + 1;
    const float* qh = q + (int64_t{t} * n_head + h) * head_dim;
    float* p = scratch + (int64_t{t} * n_head + h) * scratch_len;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;

    // Q8_0 keys: the query quantized to Q8_0, one warp per block of 32 (the CPU's int8 scores,
    // cpu/attention.hpp: d = half(max|q| / 127), q = clamp(round-to-even(x / d), -127, 127)).
    __shared__ int8_t qq[C::quantized ? kMaxQ8HeadDim : 1];
    __shared__ float dq[C::quantized ? kMaxQ8HeadDim / kQ8 : 1];
    if constexpr (C::quantized) {
        for (int b = warp; b < head_dim / kQ8; b += n_warps) {
            const float x = qh[b * kQ8 + lane];
            const float d = half_to_float(float_to_half(warp_max(fabsf(x)) / 127.0f));
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            qq[b * kQ8 + lane] = static_cast<int8_t>(max(-127, min(127, __float2int_rn(x * id))));
            if (lane == 0) dq[b] = d;
        }
        __syncthreads();
    }

    // scores: one warp per position, lanes across the head dimension
    for (int pos = warp; pos < n_pos; pos += n_warps) {
        const uint8_t* kr = k_cache + static_cast<size_t>(pos) * row_bytes;
        float s = 0.0f;
        if constexpr (C::quantized) {
            // Per block the exact int sum (below 2^24, so exact in f32 too), then one term in block order.
            const block_q8_0* kb = reinterpret_cast<const block_q8_0*>(kr) + head / kQ8;
            for (int b = 0; b < head_dim / kQ8; ++b) {
                const float isum = warp_sum(static_cast<float>(int{qq[b * kQ8 + lane]} * int{kb[b].qs[lane]}));
                s += isum * (half_to_float(kb[b].d) * dq[b]);
            }
        } else {
            for (int d = lane; d < head_dim; d += kWarp) s += qh[d] * C::load(kr, head + d);
            s = warp_sum(s);
        }
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
        float acc = 0.0f;
        for (int pos = 0; pos < n_pos; ++pos)
            acc += p[pos] * C::load(v_cache + static_cast<size_t>(pos) * row_bytes, head + d);
        oh[d] = acc * inv;
    }
}

}  // namespace

size_t kv_row_bytes(kv_format format, int n_kv) {
    if (format == kv_format::f16) return static_cast<size_t>(n_kv) * sizeof(uint16_t);
    if (n_kv % kQ8 != 0)
        throw std::invalid_argument("an int8 (Q8_0) KV cache needs rows of whole 32-element blocks; a row of " +
                                    std::to_string(n_kv) + " keys is not");
    return static_cast<size_t>(n_kv / kQ8) * sizeof(block_q8_0);
}

void kv_store(kv_format format, const float* k, const float* v, int n_tok, int n_kv, int pos0, void* k_cache,
              void* v_cache, stream_t stream) {
    if (n_tok <= 0 || n_kv <= 0) return;
    if (format == kv_format::f16) {
        const int64_t n = int64_t{n_tok} * n_kv;
        STRATA_LAUNCH(kv_store_f16_kernel, grid_for(n, 256), 256, as_stream(stream))(
            k, v, n_tok, n_kv, pos0, static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache));
    } else {
        const size_t row = kv_row_bytes(format, n_kv);
        const int64_t n = int64_t{n_tok} * (n_kv / kQ8);
        STRATA_LAUNCH(kv_store_q8_kernel, grid_for(n, 256), 256, as_stream(stream))(
            k, v, n_tok, n_kv, pos0, row, static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache));
    }
    check_launch("kv_store");
}

void attention(kv_format format, const float* q, const void* k_cache, const void* v_cache, int n_tok, int pos0,
               int n_head, int n_head_kv, int head_dim, float scale, float* scratch, float* out, stream_t stream) {
    if (n_tok <= 0) return;
    const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>(n_tok));
    if (format == kv_format::q8_0 && (head_dim % kQ8 != 0 || head_dim > kMaxQ8HeadDim))
        throw std::invalid_argument("an int8 (Q8_0) KV cache needs a head size that is a multiple of 32 and at most " +
                                    std::to_string(kMaxQ8HeadDim) + "; this model's is " + std::to_string(head_dim));
    const size_t row = kv_row_bytes(format, n_head_kv * head_dim);
    const auto* kc = static_cast<const uint8_t*>(k_cache);
    const auto* vc = static_cast<const uint8_t*>(v_cache);
    if (format == kv_format::f16)
        STRATA_LAUNCH(attention_kernel<cache_f16>, grid, kThreads, as_stream(stream))(
            q, kc, vc, row, pos0, n_head, n_head_kv, head_dim, scale, scratch, pos0 + n_tok, out);
    else
        STRATA_LAUNCH(attention_kernel<cache_q8>, grid, kThreads, as_stream(stream))(
            q, kc, vc, row, pos0, n_head, n_head_kv, head_dim, scale, scratch, pos0 + n_tok, out);
    check_launch("attention");
}

}  // namespace strata::kernels::cuda
