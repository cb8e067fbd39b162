// Internal to kernels/cuda: element access per weight format, byte-identical to the block layouts of
// kernels/formats/blocks.hpp and the reference dequantizers in kernels/formats/*.cpp.
//
// Each format is a traits struct: qk elements per block of `block` bytes, and group(b, g, w), which
// writes the 8 consecutive values 8 g .. 8 g + 7 of block b (the scale of a group is computed once; a
// code-book group shares one entry and sign byte). Lane l of a warp takes group l % (qk / 8) of block
// l / (qk / 8) of each pass over a row (matvec.cu), so a warp reads 32 groups of adjacent bytes.
// Values are computed with the reference's operations in its order, so they are the reference's bits.
#pragma once

#include "common.cuh"
#include "formats/blocks.hpp"

namespace strata::kernels::cuda::detail {

namespace f = strata::formats;

// 16 signed bytes packed in two words, read with shifts: a local array indexed at run time would live
// in local memory.
__device__ __forceinline__ int packed_i8(uint64_t lo, uint64_t hi, int i) {
    return static_cast<int8_t>(static_cast<uint8_t>((i < 8 ? lo : hi) >> (8 * (i & 7))));
}

// Byte j of group g of a 32-element nibble block (Q4_0, IQ4_NL's order, MXFP4): elements 0-15 are the
// low nibbles of qs[0..15], 16-31 the high ones, so groups 0 and 1 read low nibbles, 2 and 3 high.
__device__ __forceinline__ int nibble32(const uint8_t* qs, int g, int j) {
    return g < 2 ? qs[8 * g + j] & 0x0f : qs[8 * (g - 2) + j] >> 4;
}

struct fmt_f32 {
    static constexpr int qk = 32;
    static constexpr bool grouped = true;
    struct block { float v[32]; };
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        for (int j = 0; j < 8; ++j) w[j] = b.v[8 * g + j];
    }
};

struct fmt_f16 {
    static constexpr int qk = 32;
    static constexpr bool grouped = true;
    struct block { uint16_t v[32]; };
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        for (int j = 0; j < 8; ++j) w[j] = half_to_float(b.v[8 * g + j]);
    }
};

struct fmt_bf16 {
    static constexpr int qk = 32;
    static constexpr bool grouped = true;
    struct block { uint16_t v[32]; };
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        for (int j = 0; j < 8; ++j) w[j] = bf16_to_float(b.v[8 * g + j]);
    }
};

struct fmt_q4_0 {
    static constexpr int qk = f::QK4_0;
    static constexpr bool grouped = true;
    using block = f::block_q4_0;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const float d = half_to_float(b.d);
        for (int j = 0; j < 8; ++j) w[j] = d * static_cast<float>(nibble32(b.qs, g, j) - 8);
    }
};

struct fmt_q8_0 {
    static constexpr int qk = f::QK8_0;
    static constexpr bool grouped = true;
    using block = f::block_q8_0;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const float d = half_to_float(b.d);
        for (int j = 0; j < 8; ++j) w[j] = d * static_cast<float>(b.qs[8 * g + j]);
    }
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

// Q4_K and Q5_K: group g lies in sub-block g / 4, whose nibbles are the low (even sub-block) or high
// (odd) halves of qs[32 * (g / 8) .. + 32); its 8 bytes start at 8 * (g % 4) there.
struct fmt_q4_k {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_q4_K;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int s = g / 4;
        int sc, m;
        k_scale_min(b.scales, s, sc, m);
        const float dsc = half_to_float(b.d) * static_cast<float>(sc);
        const float dm = half_to_float(b.dmin) * static_cast<float>(m);
        const uint8_t* q = b.qs + 32 * (g / 8) + 8 * (g % 4);
        for (int j = 0; j < 8; ++j) w[j] = dsc * static_cast<float>((q[j] >> (4 * (s % 2))) & 0x0f) - dm;
    }
};

struct fmt_q5_k {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_q5_K;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int s = g / 4;
        int sc, m;
        k_scale_min(b.scales, s, sc, m);
        const float dsc = half_to_float(b.d) * static_cast<float>(sc);
        const float dm = half_to_float(b.dmin) * static_cast<float>(m);
        const uint8_t* q = b.qs + 32 * (g / 8) + 8 * (g % 4);
        const uint8_t* h = b.qh + 8 * (g % 4);
        for (int j = 0; j < 8; ++j) {
            const int v = ((q[j] >> (4 * (s % 2))) & 0x0f) | (((h[j] >> s) & 1) << 4);
            w[j] = dsc * static_cast<float>(v) - dm;
        }
    }
};

// Q6_K: group g is in the half g / 16 of the block; its low nibbles come from ql (low or high half of
// the byte by (g % 16) / 8), its high two bits from qh (shift by (g % 16) / 4), its scale is g / 2.
struct fmt_q6_k {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_q6_K;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int n = g / 16, r = g % 16;
        const uint8_t* ql = b.ql + 64 * n + 32 * ((g / 4) % 2) + 8 * (g % 4);
        const uint8_t* qh = b.qh + 32 * n + 8 * (g % 4);
        const float ds = half_to_float(b.d) * static_cast<float>(b.scales[g / 2]);
        for (int j = 0; j < 8; ++j) {
            const int lo = (ql[j] >> (4 * (r / 8))) & 0x0f, hi = (qh[j] >> (2 * (r / 4))) & 0x03;
            w[j] = ds * static_cast<float>((lo | (hi << 4)) - 32);
        }
    }
};

struct fmt_iq4_xs {
    static constexpr int qk = f::QK_K;
    static constexpr bool grouped = true;
    using block = f::block_iq4_xs;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const int s = g / 4;
        const int lo = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
        const int hi = (b.scales_h >> (2 * s)) & 0x03;
        const float dl = half_to_float(b.d) * static_cast<float>((lo | (hi << 4)) - 32);
        for (int j = 0; j < 8; ++j) w[j] = dl * static_cast<float>(kvalues(nibble32(b.qs + 16 * s, g % 4, j)));
    }
    // formats::kvalues_iq4nl, packed.
    __device__ static int kvalues(int i) { return packed_i8(0xf6eaddcfbfad9881ull, 0x7159453526190d01ull, i); }
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
    static constexpr bool grouped = true;
    using block = f::block_mxfp4;
    __device__ static void group(const block& b, int g, float (&w)[8]) {
        const float scale = e8m0_half(b.e);
        for (int j = 0; j < 8; ++j) w[j] = static_cast<float>(kvalues(nibble32(b.qs, g, j))) * scale;
    }
    // formats::kvalues_mxfp4 (the E2M1 values doubled), packed.
    __device__ static int kvalues(int i) { return packed_i8(0x0c08060403020100ull, 0xf4f8fafcfdfeff00ull, i); }
    // 2^(e - 128), exactly (e 0 and 1 are subnormal floats).
    __device__ static float e8m0_half(uint8_t e) {
        return __uint_as_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
    }
};

}  // namespace strata::kernels::cuda::detail
