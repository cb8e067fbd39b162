// Internal to kernels/cuda: element access per weight format, byte-identical to the block layouts of
// kernels/formats/blocks.hpp and the reference dequantizers in kernels/formats/*.cpp.
//
// Each format is a traits struct: qk elements per block of `block` bytes, and value(b, e) for element
// e < qk of block b. The matvec reads a block with the 32 lanes of a warp, lane l taking elements
// l, l + 32, ...; for the 256-element super-blocks that puts lane l's j-th element in sub-block j.
#pragma once

#include "common.cuh"
#include "formats/blocks.hpp"

namespace strata::kernels::cuda::detail {

namespace f = strata::formats;

struct fmt_f32 {
    static constexpr int qk = 32;
    struct block { float v[32]; };
    __device__ static float value(const block& b, int e) { return b.v[e]; }
};

struct fmt_f16 {
    static constexpr int qk = 32;
    struct block { uint16_t v[32]; };
    __device__ static float value(const block& b, int e) { return half_to_float(b.v[e]); }
};

struct fmt_bf16 {
    static constexpr int qk = 32;
    struct block { uint16_t v[32]; };
    __device__ static float value(const block& b, int e) { return bf16_to_float(b.v[e]); }
};

struct fmt_q4_0 {
    static constexpr int qk = f::QK4_0;
    using block = f::block_q4_0;
    __device__ static float value(const block& b, int e) {
        const int q = e < 16 ? b.qs[e] & 0x0f : b.qs[e - 16] >> 4;
        return half_to_float(b.d) * static_cast<float>(q - 8);
    }
};

struct fmt_q8_0 {
    static constexpr int qk = f::QK8_0;
    using block = f::block_q8_0;
    __device__ static float value(const block& b, int e) { return half_to_float(b.d) * static_cast<float>(b.qs[e]); }
};

// Q4_K / Q5_K 6-bit scale and min of sub-block s (see kernels/formats/q4_k.cpp).
__device__ __forceinline__ void k_scale_min(const uint8_t* q, int s, int& sc, int& m) {
    if (s < 4) {
        sc = q[s] & 63;
        m = q[s + 4] & 63;
    } else {
        sc = (q[s + 4] & 0x0f) | ((q[s - 4] >> 6) << 4);
        m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

struct fmt_q4_k {
    static constexpr int qk = f::QK_K;
    using block = f::block_q4_K;
    __device__ static float value(const block& b, int e) {
        const int s = e / 32;
        int sc, m;
        k_scale_min(b.scales, s, sc, m);
        const int q = (b.qs[32 * (e / 64) + e % 32] >> (4 * (s % 2))) & 0x0f;
        return half_to_float(b.d) * static_cast<float>(sc) * static_cast<float>(q) -
               half_to_float(b.dmin) * static_cast<float>(m);
    }
};

struct fmt_q5_k {
    static constexpr int qk = f::QK_K;
    using block = f::block_q5_K;
    __device__ static float value(const block& b, int e) {
        const int s = e / 32;
        int sc, m;
        k_scale_min(b.scales, s, sc, m);
        const int q = ((b.qs[32 * (e / 64) + e % 32] >> (4 * (s % 2))) & 0x0f) | (((b.qh[e % 32] >> s) & 1) << 4);
        return half_to_float(b.d) * static_cast<float>(sc) * static_cast<float>(q) -
               half_to_float(b.dmin) * static_cast<float>(m);
    }
};

struct fmt_q6_k {
    static constexpr int qk = f::QK_K;
    using block = f::block_q6_K;
    __device__ static float value(const block& b, int e) {
        const int lo = (b.ql[64 * (e / 128) + 32 * ((e / 32) % 2) + e % 32] >> (4 * ((e % 128) / 64))) & 0x0f;
        const int hi = (b.qh[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 0x03;
        return half_to_float(b.d) * static_cast<float>(b.scales[e / 16]) * static_cast<float>((lo | (hi << 4)) - 32);
    }
};

struct fmt_iq4_xs {
    static constexpr int qk = f::QK_K;
    using block = f::block_iq4_xs;
    __device__ static float value(const block& b, int e) {
        const int s = e / 32, i = e % 32;
        const int lo = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
        const int hi = (b.scales_h >> (2 * s)) & 0x03;
        const uint8_t* qs = b.qs + 16 * s;
        const int idx = i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4;
        return half_to_float(b.d) * static_cast<float>((lo | (hi << 4)) - 32) * static_cast<float>(kvalues(idx));
    }
    __device__ static int kvalues(int i) {
        constexpr int8_t table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        return table[i];
    }
};

}  // namespace strata::kernels::cuda::detail
