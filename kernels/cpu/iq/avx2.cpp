// The code book formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) x Q8_K and MXFP4 x Q8_0,
// AVX2. Each IQ format decodes a sub-block of 32 into magnitudes |w| (grid entries put together from scalar
// loads: vpgather is slower on Zen 4/5), a sign operand s with sign(s) = sign(w) (from sign bytes computed
// once per super-block) and int16 scales (one per 16 elements, a 128-bit lane each); every format then
// shares one loop: maddubs(|w|, sign(a, s)) times the scales, int32 sums per super-block, scaled by
// d_w * d_a in f32, and the format's unit (1/8, 1/4, 1) at the end. IQ1 weights enter unsigned (u = w + c)
// with no sign operand, and the c * sum(a) excess leaves through the activation's bsums.
// The prompt GEMM (iq_avx2_gemm, mxfp4_avx2_gemm) decodes each block once for up to 64 tokens and applies
// the same operations per token, so its results are bitwise the dot kernel's.
#include <bit>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"
#include "formats/iq_grids.hpp"
#include "cpu/iq/gemm_rows.hpp"
#include "cpu/iq/tables.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

// Per super-block state of the decoders below that precompute their signs and scales for all 8 sub-blocks
// at once (sign bytes, scale words, grid indices), read back per sub-block by broadcasts from memory.
// Formats without it use `none`.
struct none {};

// 32 sign codes of 7 bits (one byte each, bit 7 ignored) with the bit 7 that makes each byte's count of
// set bits even (the IQ2_XXS / IQ2_XS / IQ3_XXS sign rule): the parity of the low and high nibble's xor.
static inline __m256i even_parity_codes(__m256i c) {
    const __m256i parity = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
                                            0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
    c = _mm256_and_si256(c, _mm256_set1_epi8(0x7f));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi8(0x0f));
    return _mm256_or_si256(c, _mm256_shuffle_epi8(parity, _mm256_xor_si256(c, hi)));
}
// Four 7-bit codes per dword (bits 0-27) to one byte each.
static inline __m256i split_codes(__m256i m) {
    const __m256i mask = _mm256_set1_epi32(0x7f);
    __m256i c = _mm256_and_si256(m, mask);
    c = _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi32(m, 1), _mm256_slli_epi32(mask, 8)));
    c = _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi32(m, 2), _mm256_slli_epi32(mask, 16)));
    return _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi32(m, 3), _mm256_slli_epi32(mask, 24)));
}
// The sign operand of 4 groups of 8 from 4 sign bytes (group k: byte k; bit j set: weight j negative).
static inline __m256i signs_from_bytes(const uint8_t* s4) {
    uint32_t v;
    std::memcpy(&v, s4, 4);
    const __m256i bits = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(v)),
                                               _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll));
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits), _mm256_set1_epi8(1));
}
static inline __m256i bcast16(const int16_t* p) { return _mm256_set1_epi16(*p); }
// Sub-block order of a dword vector put together by shuffle_ps(lo, hi, 0xDD) or packus from two halves
// (0, 1, 4, 5 | 2, 3, 6, 7) back to 0..7.
static inline __m256i dword_order(__m256i v) { return _mm256_permute4x64_epi64(v, 0xD8); }
// Scalar grid entries of four indices.
template <class T>
static inline __m256i grid4(const uint64_t* grid, const T* ix) {
    return _mm256_setr_epi64x(static_cast<int64_t>(grid[ix[0]]), static_cast<int64_t>(grid[ix[1]]),
                              static_cast<int64_t>(grid[ix[2]]), static_cast<int64_t>(grid[ix[3]]));
}

// The same for eight 32-bit entries.
template <class T>
static inline __m256i grid8(const uint32_t* grid, const T* ix) {
    return _mm256_setr_epi32(static_cast<int>(grid[ix[0]]), static_cast<int>(grid[ix[1]]), static_cast<int>(grid[ix[2]]),
                             static_cast<int>(grid[ix[3]]), static_cast<int>(grid[ix[4]]), static_cast<int>(grid[ix[5]]),
                             static_cast<int>(grid[ix[6]]), static_cast<int>(grid[ix[7]]));
}

// 8 bytes of 4-bit scales (low nibble: the first 16 of a sub-block) as words 2 s + 1, two per sub-block.
static inline void nibble_scales(const uint8_t* scales, int16_t* out) {
    const __m128i s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales));
    const __m128i lohi = _mm_unpacklo_epi8(_mm_and_si128(s, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15)));
    const __m256i w = _mm256_cvtepu8_epi16(lohi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(_mm256_add_epi16(w, w), _mm256_set1_epi16(1)));
}
// Words p[0] (low 128-bit lane) and p[1] (high lane), each 8 times.
static inline __m256i scale_halves(const int16_t* p) {
    uint32_t pair;
    std::memcpy(&pair, p, 4);
    return _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(pair)),
                               _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}

struct iq2_xxs_dec {
    using block = block_iq2_xxs;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = false;
    struct pre {
        alignas(32) uint8_t sign[32];
        alignas(32) int16_t sc[16];  // word 2 ib
    };
    static float d(const block& b) { return half_to_float(b.d); }
    static void prep(const block& b, pre& p) {
        // dwords of qs: index bytes of sub-block k, then its sign codes and scale
        const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
        const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16));
        const __m256i m = dword_order(_mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(q0), _mm256_castsi256_ps(q1), 0xDD)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.sign), even_parity_codes(split_codes(m)));
        const __m256i s = _mm256_srli_epi32(m, 28);
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc), _mm256_or_si256(_mm256_add_epi32(s, s), _mm256_set1_epi32(1)));
    }
    static void sub(const block& b, const pre& p, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        mag = grid4(iq2xxs_grid, reinterpret_cast<const uint8_t*>(b.qs + 4 * ib));
        sgn = signs_from_bytes(p.sign + 4 * ib);
        sc = bcast16(p.sc + 2 * ib);
    }
};

struct iq2_xs_dec {
    using block = block_iq2_xs;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = false;
    struct pre {
        alignas(32) uint8_t sign[32];
        alignas(32) uint16_t ix[32];
        alignas(32) int16_t sc[16];  // words 2 ib, 2 ib + 1: the scales of the sub-block's halves
    };
    static float d(const block& b) { return half_to_float(b.d); }
    static void prep(const block& b, pre& p) {
        const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
        const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16));
        const __m256i m511 = _mm256_set1_epi16(511);
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix), _mm256_and_si256(q0, m511));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix + 16), _mm256_and_si256(q1, m511));
        const __m256i codes = dword_order(_mm256_packus_epi16(_mm256_srli_epi16(q0, 9), _mm256_srli_epi16(q1, 9)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.sign), even_parity_codes(codes));
        nibble_scales(b.scales, p.sc);
    }
    static void sub(const block&, const pre& p, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        mag = grid4(iq2xs_grid, p.ix + 4 * ib);
        sgn = signs_from_bytes(p.sign + 4 * ib);
        sc = scale_halves(p.sc + 2 * ib);
    }
};

struct iq2_s_dec {
    using block = block_iq2_s;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = false;
    struct pre {
        alignas(32) uint16_t ix[32];
        alignas(32) int16_t sc[16];
    };
    static float d(const block& b) { return half_to_float(b.d); }
    static void prep(const block& b, pre& p) {
        // index 4 ib + k: qs byte | bits 2k, 2k + 1 of qh[ib] << 8 (a multiply moves them to bits 14-15)
        const __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qh)));
        const __m256i mul = _mm256_setr_epi16(16384, 4096, 1024, 256, 16384, 4096, 1024, 256, 16384, 4096, 1024, 256, 16384, 4096, 1024, 256);
        const __m128i h2 = _mm_unpacklo_epi16(h, h), h6 = _mm_unpackhi_epi16(h, h);
        const __m256i hA = _mm256_setr_m128i(_mm_unpacklo_epi32(h2, h2), _mm_unpackhi_epi32(h2, h2));
        const __m256i hB = _mm256_setr_m128i(_mm_unpacklo_epi32(h6, h6), _mm_unpackhi_epi32(h6, h6));
        const __m256i m3 = _mm256_set1_epi16(0x0300);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
        const __m256i lo0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), lo1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix), _mm256_or_si256(lo0, _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(hA, mul), 6), m3)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix + 16), _mm256_or_si256(lo1, _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(hB, mul), 6), m3)));
        nibble_scales(b.scales, p.sc);
    }
    static void sub(const block& b, const pre& p, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        mag = grid4(iq2s_grid, p.ix + 4 * ib);
        sgn = signs_from_bytes(b.qs + QK_K / 8 + 4 * ib);
        sc = scale_halves(p.sc + 2 * ib);
    }
};

struct iq3_xxs_dec {
    using block = block_iq3_xxs;
    static constexpr float unit = 0.25f;
    static constexpr bool bsum_term = false;
    struct pre {
        alignas(32) uint8_t sign[32];
        alignas(32) int16_t sc[16];  // word 2 ib
    };
    static float d(const block& b) { return half_to_float(b.d); }
    static void prep(const block& b, pre& p) {
        const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + QK_K / 4));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.sign), even_parity_codes(split_codes(m)));
        const __m256i s = _mm256_srli_epi32(m, 28);
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc), _mm256_or_si256(_mm256_add_epi32(s, s), _mm256_set1_epi32(1)));
    }
    static void sub(const block& b, const pre& p, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        mag = grid8(iq3xxs_grid, b.qs + 8 * ib);
        sgn = signs_from_bytes(p.sign + 4 * ib);
        sc = bcast16(p.sc + 2 * ib);
    }
};

struct iq3_s_dec {
    using block = block_iq3_s;
    static constexpr float unit = 1.0f;
    static constexpr bool bsum_term = false;
    struct pre {
        alignas(32) uint16_t ix[64];
        alignas(16) int16_t sc[8];
    };
    static float d(const block& b) { return half_to_float(b.d); }
    static void prep(const block& b, pre& p) {
        // index 8 ib + k: qs byte | bit k of qh[ib] << 8 (a multiply moves it to bit 15)
        uint64_t hv;
        std::memcpy(&hv, b.qh, 8);
        const __m256i h = _mm256_set1_epi64x(static_cast<int64_t>(hv));
        const __m256i mul = _mm256_setr_epi16(-32768, 16384, 8192, 4096, 2048, 1024, 512, 256, -32768, 16384, 8192, 4096, 2048, 1024, 512, 256);
        for (int j = 0; j < 4; ++j) {
            // words: qh[2j] for the low lane, qh[2j + 1] for the high lane
            const __m256i spread = _mm256_shuffle_epi8(h, _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(2 * j | 0x8000)),
                                                                            _mm_set1_epi16(static_cast<short>((2 * j + 1) | 0x8000))));
            const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * j)));
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(spread, mul), 7), _mm256_set1_epi16(0x0100));
            _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix + 16 * j), _mm256_or_si256(lo, hi));
        }
        uint32_t sv;
        std::memcpy(&sv, b.scales, 4);
        const __m128i s = _mm_cvtsi32_si128(static_cast<int>(sv));
        const __m128i w = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(s, _mm_set1_epi8(15)), _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15))));
        _mm_store_si128(reinterpret_cast<__m128i*>(p.sc), _mm_or_si128(_mm_add_epi16(w, w), _mm_set1_epi16(1)));
    }
    static void sub(const block& b, const pre& p, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        mag = grid8(iq3s_grid, p.ix + 8 * ib);
        sgn = signs_from_bytes(b.signs + 4 * ib);
        sc = bcast16(p.sc + ib);
    }
};

// IQ1_S enters as u = 8 (g + 1) (0, 8, 16) per weight (iq1_u_grid(), iq/tables.cpp), w = 8 g + delta =
// u + (delta - 8): the maddubs takes u unsigned (no sign operand), and sum (delta - 8) (2 s + 1) a per 32
// comes in from the activation's 16-element sums (bsums).
struct iq1_s_dec {
    using block = block_iq1_s;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = true;
    struct pre {
        alignas(32) uint16_t ix[32];
        alignas(32) int16_t sc[16];  // word 2 ib: 2 s + 1
        __m256i coef;                // word j: (delta - 8) (2 s + 1) of sub-block j / 2
    };
    static float d(const block& b) { return half_to_float(b.d); }
    static void prep(const block& b, pre& p) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
        // index 4 ib + k: qs byte | bits 3k .. 3k + 2 of qh[ib] << 8 (a multiply moves them to bits 13-15)
        const __m256i mul = _mm256_setr_epi16(8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16);
        const __m128i h2 = _mm_unpacklo_epi16(h, h), h6 = _mm_unpackhi_epi16(h, h);
        const __m256i hA = _mm256_setr_m128i(_mm_unpacklo_epi32(h2, h2), _mm_unpackhi_epi32(h2, h2));
        const __m256i hB = _mm256_setr_m128i(_mm_unpacklo_epi32(h6, h6), _mm_unpackhi_epi32(h6, h6));
        const __m256i m7 = _mm256_set1_epi16(0x0700);
        const __m256i q16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
        const __m256i lo0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q16)), lo1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q16, 1));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix), _mm256_or_si256(lo0, _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(hA, mul), 5), m7)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix + 16), _mm256_or_si256(lo1, _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(hB, mul), 5), m7)));
        const __m128i s = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 12), _mm_set1_epi16(7)), 1), _mm_set1_epi16(1));
        // delta - 8: -9 where bit 15 is set, else -7
        const __m128i dm8 = _mm_sub_epi16(_mm_set1_epi16(-7), _mm_and_si128(_mm_srai_epi16(h, 15), _mm_set1_epi16(2)));
        const __m128i c = _mm_mullo_epi16(s, dm8);
        p.coef = _mm256_setr_m128i(_mm_unpacklo_epi16(c, c), _mm_unpackhi_epi16(c, c));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc), _mm256_setr_m128i(_mm_unpacklo_epi16(s, s), _mm_unpackhi_epi16(s, s)));
    }
    static void sub(const block&, const pre& p, int ib, __m256i& mag, __m256i&, __m256i& sc) {
        mag = grid4(iq1_u_grid(), p.ix + 4 * ib);
        sc = bcast16(p.sc + 2 * ib);
    }
};

// IQ1_M enters as u = 8 (g + 1) + (delta + 1) (0 .. 18) per weight, w = u - 9: no sign operand, and
// -9 (2 s + 1) times the activation's 16-element sums (bsums) per scale.
struct iq1_m_dec {
    using block = block_iq1_m;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = true;
    struct pre {
        alignas(32) uint16_t ix[32];
        alignas(32) uint8_t dp[32];  // delta + 1 (0 or 2) of each group of 8
        alignas(32) int16_t sc[16];  // 2 s + 1 per 16
        __m256i coef;                // -9 (2 s + 1) per 16
    };
    static float d(const block& b) {
        uint16_t sc[4];
        std::memcpy(sc, b.scales, sizeof sc);
        return half_to_float(static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                                   (sc[3] & 0xf000)));
    }
    static void prep(const block& b, pre& p) {
        // word ib of qh: a nibble per group k of sub-block ib (3 high index bits, delta sign at bit 3);
        // a multiply moves the nibble's top to bit 15
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
        const __m128i h2 = _mm_unpacklo_epi16(h, h), h6 = _mm_unpackhi_epi16(h, h);
        const __m256i hA = _mm256_setr_m128i(_mm_unpacklo_epi32(h2, h2), _mm_unpackhi_epi32(h2, h2));
        const __m256i hB = _mm256_setr_m128i(_mm_unpacklo_epi32(h6, h6), _mm_unpackhi_epi32(h6, h6));
        const __m256i mul = _mm256_setr_epi16(4096, 256, 16, 1, 4096, 256, 16, 1, 4096, 256, 16, 1, 4096, 256, 16, 1);
        const __m256i tA = _mm256_mullo_epi16(hA, mul), tB = _mm256_mullo_epi16(hB, mul);  // nibble k at bits 12-15
        const __m256i m7 = _mm256_set1_epi16(0x0700);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
        const __m256i lo0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), lo1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix), _mm256_or_si256(lo0, _mm256_and_si256(_mm256_srli_epi16(tA, 4), m7)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.ix + 16), _mm256_or_si256(lo1, _mm256_and_si256(_mm256_srli_epi16(tB, 4), m7)));
        // delta + 1 = 2 where the sign bit (now bit 15) is clear
        const __m256i neg = dword_order(_mm256_packs_epi16(_mm256_srai_epi16(tA, 15), _mm256_srai_epi16(tB, 15)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.dp), _mm256_andnot_si256(neg, _mm256_set1_epi8(2)));
        // scale j: bits 3 (j % 4) .. + 2 of word j / 4 of scales, moved to bits 13-15
        uint64_t sv;
        std::memcpy(&sv, b.scales, 8);
        const __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi64x(static_cast<int64_t>(sv)),
                                              _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
        const __m256i s = _mm256_srli_epi16(_mm256_mullo_epi16(w, _mm256_setr_epi16(8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16)), 13);
        const __m256i sc = _mm256_or_si256(_mm256_add_epi16(s, s), _mm256_set1_epi16(1));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc), sc);
        p.coef = _mm256_mullo_epi16(sc, _mm256_set1_epi16(-9));
    }
    static void sub(const block&, const pre& p, int ib, __m256i& mag, __m256i&, __m256i& sc) {
        uint32_t dv;
        std::memcpy(&dv, p.dp + 4 * ib, 4);
        const __m256i dp = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(dv)),
                                               _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll));
        mag = _mm256_add_epi8(grid4(iq1_u_grid(), p.ix + 4 * ib), dp);
        sc = scale_halves(p.sc + 2 * ib);
    }
};

// A super-block's int32 sums start at 0, or for a format with a bsums term at the activation's 16-element
// sums times the format's coefficients.
template <class F>
static inline __m256i iq_sumi_start(const typename F::pre& p, const block_q8_K& y) {
    if constexpr (F::bsum_term)
        return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)), p.coef);
    else
        return _mm256_setzero_si256();
}
// One sub-block of 32 for one token: maddubs(|w|, sign(a, s)) (a alone for the bsums formats) times the scales.
template <class F>
static inline __m256i iq_step(__m256i mag, __m256i sgn, __m256i sc, const int8_t* q, __m256i sumi) {
    __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    if constexpr (!F::bsum_term) q8 = _mm256_sign_epi8(q8, sgn);
    return _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q8), sc));
}

template <class F>
struct iq_avx2 {
    template <int NT>
    struct kernel {
        static void run(int64_t n, const void* w, const void* const* a, float* out) {
            const auto* x = static_cast<const typename F::block*>(w);
            const block_q8_K* y[NT];
            for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
            __m256 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) {
                prefetch_weights<sizeof(typename F::block)>(x + i);
                typename F::pre p;
                F::prep(x[i], p);
                __m256i sumi[NT];
                for (int t = 0; t < NT; ++t) sumi[t] = iq_sumi_start<F>(p, y[t][i]);
                for (int ib = 0; ib < QK_K / 32; ++ib) {
                    __m256i mag, sgn, sc;
                    F::sub(x[i], p, ib, mag, sgn, sc);
                    for (int t = 0; t < NT; ++t) sumi[t] = iq_step<F>(mag, sgn, sc, y[t][i].qs + 32 * ib, sumi[t]);
                }
                const float d = F::d(x[i]);
                for (int t = 0; t < NT; ++t)
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
            for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]) * F::unit;
        }
    };
};

// MXFP4 x Q8_0: nibbles through the 16-entry doubled E2M1 table (pshufb), one block of 32 per step;
// block i goes to accumulator i % 2 (two FMA chains), summed at the end.
// 2^(e - 128) as a float for every E8M0 byte: e >= 2 is a normal exponent field of e - 1; e < 2 a subnormal.
struct mxfp4_scale_table {
    float v[256];
    constexpr mxfp4_scale_table() : v{} {
        for (uint32_t e = 0; e < 256; ++e) v[e] = std::bit_cast<float>(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    }
};
alignas(64) constexpr mxfp4_scale_table mxfp4_scales;

static inline void mxfp4_avx2_decode(const block_mxfp4& x, __m256i& aw, __m256i& wv, float& d) {
    const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_mxfp4));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i q4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs));
    wv = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q4, 4), low4)),
                          _mm_shuffle_epi8(values, _mm_and_si128(q4, low4)));
    aw = _mm256_sign_epi8(wv, wv);
    d = mxfp4_scales.v[x.e];
}

static inline __m256 mxfp4_avx2_step(__m256i aw, __m256i wv, float d, const block_q8_0& y, __m256 acc) {
    const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
    const __m256i sumi = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(q8, wv)), _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y.d)), _mm256_cvtepi32_ps(sumi), acc);
}

template <int NT>
struct mxfp4_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_mxfp4*>(w);
        const block_q8_0* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_0*>(a[t]);
        __m256 acc0[NT], acc1[NT];
        for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
        const int64_t nb = n / QK_MXFP4;
        const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_mxfp4)));
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        int64_t i = 0;
        for (; i + 1 < nb; i += 2) {
            prefetch_weights<2 * sizeof(block_mxfp4)>(x + i);
            // Both blocks' nibbles in one register (block i low lane), looked up at once: the same bytes as
            // mxfp4_avx2_decode gives per block.
            const __m256i q4 = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(x[i + 1].qs),
                                                   reinterpret_cast<const __m128i*>(x[i].qs));
            const __m256i vl = _mm256_shuffle_epi8(values, _mm256_and_si256(q4, low4));
            const __m256i vh = _mm256_shuffle_epi8(values, _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4));
            const __m256i wv0 = _mm256_permute2x128_si256(vl, vh, 0x20), wv1 = _mm256_permute2x128_si256(vl, vh, 0x31);
            const __m256i aw0 = _mm256_sign_epi8(wv0, wv0), aw1 = _mm256_sign_epi8(wv1, wv1);
            const float d0 = mxfp4_scales.v[x[i].e], d1 = mxfp4_scales.v[x[i + 1].e];
            for (int t = 0; t < NT; ++t) {
                acc0[t] = mxfp4_avx2_step(aw0, wv0, d0, y[t][i], acc0[t]);
                acc1[t] = mxfp4_avx2_step(aw1, wv1, d1, y[t][i + 1], acc1[t]);
            }
        }
        if (i < nb) {
            __m256i aw0, wv0;
            float d0;
            mxfp4_avx2_decode(x[i], aw0, wv0, d0);
            for (int t = 0; t < NT; ++t) acc0[t] = mxfp4_avx2_step(aw0, wv0, d0, y[t][i], acc0[t]);
        }
        for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc0[t], acc1[t]));
    }
};

// The prompt GEMM's parts of format F (iq/gemm_rows.hpp): the dot kernel's operations per token, each
// block decoded once for many tokens.
template <class F>
struct iq_avx2_gemm {
    using block = typename F::block;
    using act_block = block_q8_K;
    static constexpr int block_elems = QK_K, group = 4, rows = 4, chunk = 8;
    struct dec {
        __m256i mag[8], sgn[8], sc[8];
        typename F::pre p;
        float d;
    };
    using acc_t = __m256;
    static __m256 zero() { return _mm256_setzero_ps(); }
    static void decode(const block* x, int64_t i, dec& b) {
        F::prep(x[i], b.p);
        for (int ib = 0; ib < QK_K / 32; ++ib) F::sub(x[i], b.p, ib, b.mag[ib], b.sgn[ib], b.sc[ib]);
        b.d = F::d(x[i]);
    }
    template <int NT>
    static void apply(const dec& b, const block_q8_K* const* y, int64_t i, __m256 acc[4]) {
        __m256i sumi[NT];
        for (int t = 0; t < NT; ++t) sumi[t] = iq_sumi_start<F>(b.p, y[t][i]);
        for (int ib = 0; ib < QK_K / 32; ++ib)
            for (int t = 0; t < NT; ++t) sumi[t] = iq_step<F>(b.mag[ib], b.sgn[ib], b.sc[ib], y[t][i].qs + 32 * ib, sumi[t]);
        for (int t = 0; t < NT; ++t)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
    template <int NT>
    static void finish(const __m256 acc[4], float* out) {
        for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]) * F::unit;
    }
};

// The same for MXFP4 (two accumulators per token, block i into i % 2, as the dot kernel).
struct mxfp4_avx2_gemm {
    using block = block_mxfp4;
    using act_block = block_q8_0;
    static constexpr int block_elems = QK_MXFP4, group = 4, rows = 4, chunk = 64;
    struct dec {
        __m256i aw, wv;  // |w| and w
        float d;
    };
    struct acc_t {
        __m256 v[2];
    };
    static acc_t zero() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
    static void decode(const block* x, int64_t i, dec& b) { mxfp4_avx2_decode(x[i], b.aw, b.wv, b.d); }
    template <int NT>
    static void apply(const dec& b, const block_q8_0* const* y, int64_t i, acc_t acc[4]) {
        if (i & 1) {
            for (int t = 0; t < NT; ++t) acc[t].v[1] = mxfp4_avx2_step(b.aw, b.wv, b.d, y[t][i], acc[t].v[1]);
        } else {
            for (int t = 0; t < NT; ++t) acc[t].v[0] = mxfp4_avx2_step(b.aw, b.wv, b.d, y[t][i], acc[t].v[0]);
        }
    }
    template <int NT>
    static void finish(const acc_t acc[4], float* out) {
        for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc[t].v[0], acc[t].v[1]));
    }
};

}  // namespace

void dot_iq2_xxs_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq2_xxs_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_xxs_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq2_xxs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq2_xs_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq2_xs_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_xs_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq2_xs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq2_s_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq2_s_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_s_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq2_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq3_xxs_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq3_xxs_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq3_xxs_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq3_xxs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq3_s_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq3_s_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq3_s_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq3_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq1_s_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq1_s_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq1_s_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq1_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq1_m_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq1_m_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq1_m_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq1_m_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_mxfp4_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<mxfp4_avx2>(n, w, a, n_tok, out);
}
void gemm_rows_mxfp4_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<mxfp4_avx2_gemm>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
