// Internal to kernels/cuda: element access per weight format, byte-identical to the block layouts of
// kernels/formats/blocks.hpp and the reference dequantizers in kernels/formats/*.cpp.
//
// Each format is a traits struct: qk elements per block of `block` bytes, and value(b, e) for element
// e < qk of block b. The matvec reads a block with the 32 lanes of a warp, lane l taking elements
// l, l + 32, ...; for the 256-element super-blocks that puts lane l's j-th element in sub-block j.
// The code-book formats (IQ1 / IQ2 / IQ3: 256 elements, groups of 8 sharing a code-book entry and a
// sign byte) are `grouped` instead: group(b, g, w) writes the 8 values of group g, and lane l of the
// warp takes group l of each block, so every lane reads one code-book entry per block.
// Values are computed with the reference's operations in its order, so they are the reference's bits.
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

// ---- code-book formats (kernels/formats/iq1.cpp, iq2.cpp, iq3.cpp) ----

// The code books in device memory, from the data the CPU side is built from.
namespace grid {
#define STRATA_IQ_GRID(type, name, size) static __device__ const type name[size] =
#include "formats/iq_grids.inc"
#undef STRATA_IQ_GRID
}  // namespace grid

// formats::even_signs: 7 stored sign bits and an eighth that makes the count of negatives even.
__device__ __forceinline__ unsigned even_signs(unsigned bits7) {
    bits7 &= 0x7f;
    unsigned parity = bits7 ^ (bits7 >> 4);
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return bits7 | ((parity & 1) << 7);
}

// w[j] = dl * (+-value j of the entry), bit j of signs negating; `n` values (8 or 4) from w[first].
__device__ __forceinline__ void put_signed(float* w, uint64_t entry, unsigned signs, float dl, int n) {
    for (int j = 0; j < n; ++j) {
        const int q = static_cast<int>((entry >> (8 * j)) & 0xff);
        w[j] = dl * static_cast<float>((signs >> j) & 1 ? -q : q);
    }
}

// A 4-bit odd scale multiplier 2 s + 1 from the nibbles of `scales`: nibble k.
__device__ __forceinline__ int odd_nibble(const uint8_t* scales, int k) {
    return 2 * ((scales[k / 2] >> (4 * (k % 2))) & 0x0f) + 1;
}

struct fmt_iq2_xxs {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq2_xxs;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const uint16_t* q = b.qs + 4 * (g / 4);  // two uint16 of entry indices, two of signs and scale
        const int l = g % 4;
        const uint32_t meta = q[2] | (uint32_t{q[3]} << 16);
        const int index = (q[l / 2] >> (8 * (l % 2))) & 0xff;
        const float dl = half_to_float(b.d) * (0.125f * static_cast<float>(2 * static_cast<int>(meta >> 28) + 1));
        put_signed(w, grid::iq2xxs_grid[index], even_signs(meta >> (7 * l)), dl, 8);
    }
};

struct fmt_iq2_xs {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq2_xs;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const float dl = half_to_float(b.d) * (0.125f * static_cast<float>(odd_nibble(b.scales, g / 2)));
        put_signed(w, grid::iq2xs_grid[b.qs[g] & 511], even_signs(b.qs[g] >> 9), dl, 8);
    }
};

struct fmt_iq2_s {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq2_s;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int index = b.qs[g] | (((b.qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
        const float dl = half_to_float(b.d) * (0.125f * static_cast<float>(odd_nibble(b.scales, g / 2)));
        put_signed(w, grid::iq2s_grid[index], b.qs[f::QK_K / 8 + g], dl, 8);
    }
};

struct fmt_iq3_xxs {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq3_xxs;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int ib = g / 4, l = g % 4;
        const uint8_t* m = b.qs + f::QK_K / 4 + 4 * ib;  // four 7-bit sign codes and the scale, little-endian
        const uint32_t meta = m[0] | (uint32_t{m[1]} << 8) | (uint32_t{m[2]} << 16) | (uint32_t{m[3]} << 24);
        const unsigned signs = even_signs(meta >> (7 * l));
        const float dl = half_to_float(b.d) * (0.25f * static_cast<float>(2 * static_cast<int>(meta >> 28) + 1));
        put_signed(w, grid::iq3xxs_grid[b.qs[8 * ib + 2 * l]], signs, dl, 4);
        put_signed(w + 4, grid::iq3xxs_grid[b.qs[8 * ib + 2 * l + 1]], signs >> 4, dl, 4);
    }
};

struct fmt_iq3_s {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq3_s;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int ib = g / 4, k = 2 * (g % 4);  // entries k, k + 1 of sub-block ib
        const float dl = half_to_float(b.d) * (1.0f * static_cast<float>(odd_nibble(b.scales, ib)));
        const int i0 = b.qs[8 * ib + k] | (((b.qh[ib] >> k) & 1) << 8);
        const int i1 = b.qs[8 * ib + k + 1] | (((b.qh[ib] >> (k + 1)) & 1) << 8);
        put_signed(w, grid::iq3s_grid[i0], b.signs[g], dl, 4);
        put_signed(w + 4, grid::iq3s_grid[i1], b.signs[g] >> 4, dl, 4);
    }
};

// IQ1: w[j] = (d * ls) * (value j + -+delta), the entry's values signed bytes -1, 0, 1.
__device__ __forceinline__ void put_iq1(float (&w)[8], int index, bool neg, float dl) {
    const uint64_t entry = grid::iq1s_grid[index];
    const float delta = neg ? -f::IQ1S_DELTA : f::IQ1S_DELTA;
    for (int j = 0; j < 8; ++j)
        w[j] = dl * (static_cast<float>(static_cast<int8_t>((entry >> (8 * j)) & 0xff)) + delta);
}

struct fmt_iq1_s {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq1_s;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int qh = b.qh[g / 4], l = g % 4;
        const float dl = half_to_float(b.d) * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
        put_iq1(w, b.qs[g] | (((qh >> (3 * l)) & 7) << 8), (qh & 0x8000) != 0, dl);
    }
};

struct fmt_iq1_m {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq1_m;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        uint32_t sc[4];  // the four little-endian uint16 words of scales
        for (int k = 0; k < 4; ++k) sc[k] = b.scales[2 * k] | (uint32_t{b.scales[2 * k + 1]} << 8);
        const uint32_t d = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        const int s = g / 2;  // scales per 16 elements
        const float dl = half_to_float(static_cast<uint16_t>(d)) * static_cast<float>(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
        const int nibble = (b.qh[g / 2] >> (4 * (g % 2))) & 0x0f;
        put_iq1(w, b.qs[g] | ((nibble & 7) << 8), (nibble & 8) != 0, dl);
    }
};

// ---- MXFP4 (kernels/formats/mxfp4.cpp) ----

struct fmt_mxfp4 {
    static constexpr int qk = f::QK_MXFP4;
    using block = f::block_mxfp4;
    __device__ static float value(const block& b, int e) {
        const int q = e < qk / 2 ? b.qs[e] & 0x0f : b.qs[e - qk / 2] >> 4;
        return static_cast<float>(kvalues(q)) * e8m0_half(b.e);
    }
    // formats::kvalues_mxfp4: the E2M1 values doubled.
    __device__ static int kvalues(int i) {
        constexpr int8_t table[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        return table[i];
    }
    // 2^(e - 128), exactly (e 0 and 1 are subnormal floats).
    __device__ static float e8m0_half(uint8_t e) {
        return __uint_as_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
    }
};

}  // namespace strata::kernels::cuda::detail
