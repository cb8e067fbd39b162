// Block layouts of the quantized GGUF formats, byte-identical to ggml's.
// Every weight row is a sequence of these blocks; scales are IEEE half (stored as uint16_t)
// except Q8_K's, which is f32.
#pragma once

#include <cstdint>

namespace strata::formats {

using fp16_t = uint16_t;  // IEEE 754 binary16 bits
using bf16_t = uint16_t;  // bfloat16 bits

inline constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
inline constexpr int QK4_NL = 32;
inline constexpr int QK_K = 256;
inline constexpr int K_SCALE_SIZE = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K

// ---- 32-element blocks ----

struct block_q4_0 {      // x = d * (q - 8), q in [0, 15]
    fp16_t d;
    uint8_t qs[QK4_0 / 2];   // element i in low nibble of qs[i], element i+16 in high nibble
};
static_assert(sizeof(block_q4_0) == 18);

struct block_q4_1 {      // x = d * q + m
    fp16_t d, m;
    uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(block_q4_1) == 20);

struct block_q5_0 {      // x = d * (q - 16); bit 4 of element i is bit i of qh
    fp16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
static_assert(sizeof(block_q5_0) == 22);

struct block_q5_1 {      // x = d * q + m
    fp16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(block_q5_1) == 24);

struct block_q8_0 {      // x = d * q
    fp16_t d;
    int8_t qs[QK8_0];
};
static_assert(sizeof(block_q8_0) == 34);

struct block_q8_1 {      // activation format for the _1 weight formats; s = d * sum(qs)
    fp16_t d, s;
    int8_t qs[QK8_1];
};
static_assert(sizeof(block_q8_1) == 36);

struct block_iq4_nl {    // x = d * kvalues_iq4nl[q]
    fp16_t d;
    uint8_t qs[QK4_NL / 2];
};
static_assert(sizeof(block_iq4_nl) == 18);

// ---- 256-element super-blocks ("k-quants") ----

struct block_q2_K {      // 16 sub-blocks of 16: x = d * (scales & 15) * q - dmin * (scales >> 4)
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    fp16_t d, dmin;
};
static_assert(sizeof(block_q2_K) == 84);

struct block_q3_K {      // 16 sub-blocks of 16, 6-bit signed scales; high bit of q in hmask
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    fp16_t d;
};
static_assert(sizeof(block_q3_K) == 110);

struct block_q4_K {      // 8 sub-blocks of 32: x = d * sc * q - dmin * m (6-bit sc, m)
    fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q4_K) == 144);

struct block_q5_K {      // as Q4_K with a fifth bit per element in qh
    fp16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q5_K) == 176);

struct block_q6_K {      // 16 sub-blocks of 16: x = d * scales[j] * (q - 32)
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    fp16_t d;
};
static_assert(sizeof(block_q6_K) == 210);

struct block_q8_K {      // activation format for the k-quants; bsums = sums of 16 qs each
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
static_assert(sizeof(block_q8_K) == 292);

struct block_iq4_xs {    // 8 sub-blocks of 32, 6-bit scales (low 4 in scales_l, high 2 in scales_h), bias -32
    fp16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_iq4_xs) == 136);

// ---- lattice-code-book formats (IQ1 / IQ2 / IQ3; code books in formats/iq_grids.hpp) ----
// Sub-block scales are odd multiples: a 4-bit (3-bit for IQ1) code s stands for 2s + 1.

struct block_iq2_xxs {   // per 32: 4 x (8-bit grid index) then 4 x 7 sign bits + 4-bit scale; x = d (2s+1)/8 g
    fp16_t d;
    uint16_t qs[QK_K / 8];
};
static_assert(sizeof(block_iq2_xxs) == 66);

struct block_iq2_xs {    // qs: 9-bit grid index | 7 sign bits << 9; a 4-bit scale per 16; x = d (2s+1)/8 g
    fp16_t d;
    uint16_t qs[QK_K / 8];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_xs) == 74);

struct block_iq2_s {     // qs: low 8 index bits, then 8 sign bits per group; qh: 2 high index bits per group
    fp16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_s) == 82);

struct block_iq3_xxs {   // qs: 64 8-bit indices of 4-element entries, then per 32: 4 x 7 sign bits + 4-bit scale
    fp16_t d;
    uint8_t qs[3 * QK_K / 8];
};
static_assert(sizeof(block_iq3_xxs) == 98);

struct block_iq3_s {     // 9-bit indices of 4-element entries (high bits in qh), 8 sign bits per 8, x = d (2s+1) g
    fp16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
};
static_assert(sizeof(block_iq3_s) == 110);

struct block_iq1_s {     // per 32: qh = 4 x 3 high index bits | 3-bit scale << 12 | delta sign << 15
    fp16_t d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];
};
static_assert(sizeof(block_iq1_s) == 50);

struct block_iq1_m {     // no d field: the half scale is the top nibbles of the four uint16 words of scales
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];      // per group of 8: 3 high index bits + delta sign (a nibble)
    uint8_t scales[QK_K / 32];  // 3-bit scale per 16 elements
};
static_assert(sizeof(block_iq1_m) == 56);

// ---- MXFP4 (OCP microscaling): 32 E2M1 values sharing an E8M0 exponent ----

inline constexpr int QK_MXFP4 = 32;
struct block_mxfp4 {     // x = 2^(e - 128) * kvalues_mxfp4[q] (the code book holds twice the E2M1 values)
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];  // IQ4_NL's nibble order
};
static_assert(sizeof(block_mxfp4) == 17);

// E2M1 values doubled, as ggml's kvalues_mxfp4 (codes 8..15 are the negatives of 0..7).
inline constexpr int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// IQ1's offset of the code book values, in units of the sub-block scale (sign in the block).
inline constexpr float IQ1S_DELTA = 0.125f;

// The IQ2 / IQ3_XXS sign code: 7 stored bits, the eighth makes the count of negatives even
// (ggml's ksigns_iq2xs[i]). Bit j set: element j of the group of 8 is negative.
constexpr uint8_t even_signs(unsigned bits7) {
    unsigned parity = bits7 & 0x7f;
    parity ^= parity >> 4;
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return static_cast<uint8_t>((bits7 & 0x7f) | ((parity & 1) << 7));
}

// The non-linear 4-bit code book shared by IQ4_NL and IQ4_XS.
inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace strata::formats
