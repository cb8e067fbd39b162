// The code book formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) x Q8_K, AVX-512 (BW, VL,
// BMI2). Two sub-blocks (64 weights) per step: each format gives unsigned int8 magnitudes u, a 64-bit mask
// of the weights whose sign moves onto the activation (masked subtract: no vpsignb here) and the int16
// scale of each 16 weights (one vpermw from a per-super-block scale vector). The shared loop is then
// maddubs(u, +-a) times the scales (vpdpwssd), int32 sums per super-block, scaled by d_w * d_a in f32.
// IQ1 weights w = 8 g + delta are signed; they enter as u = w + 9 (0..18) and the 9 * sum(a) excess leaves
// through the activation's 16-element sums (bsums) times the scales.
// The prompt GEMM (iq_avx512_gemm) decodes each block once for up to 64 tokens and computes the same
// integer lanes (vpdpwssd for madd + add) and float steps, so its results are bitwise the dot kernel's.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"
#include "formats/iq_grids.hpp"
#include "cpu/iq/gemm_rows.hpp"
#include "cpu/iq/tables.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

// Eight bytes of 7-bit sign codes to the 64 sign bits they stand for: bit 7 of each byte becomes the
// parity that makes the byte's count of minus signs even.
static inline uint64_t with_parity(uint64_t x) {
    uint64_t p = x ^ (x >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return x | ((p & 0x0101010101010101ull) << 7);
}
// The same from two sign words (4 codes of 7 bits each in their low 28 bits).
static inline uint64_t even_sign_mask(uint32_t m0, uint32_t m1) {
    return with_parity(_pdep_u64((m0 & 0x0FFFFFFFu) | (uint64_t{m1 & 0x0FFFFFFFu} << 28), 0x7F7F7F7F7F7F7F7Full));
}

// Word index vectors for the scale vpermw: scales per 32 weights (word s for 16 words, then word s2 for
// 16), or per 16 weights (words 4p .. 4p + 3, 8 each).
static inline __m512i index32(int s, int s2) {
    return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s)), _mm256_set1_epi16(static_cast<short>(s2)), 1);
}
static inline __m512i index16(int p) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(4 * p)),
                                                                        _mm_set1_epi16(static_cast<short>(4 * p + 1)))),
                              _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(4 * p + 2)), _mm_set1_epi16(static_cast<short>(4 * p + 3))), 1);
}

static inline __m256i odd(__m256i s) { return _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1)); }

// 8 bytes of 4-bit scales (one per 16 weights, low nibble first) as 16 words 2 s + 1.
static inline __m512i nibble_scales16(const uint8_t* scales) {
    uint64_t v;
    std::memcpy(&v, scales, 8);
    const __m128i b = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(v)));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi16(15)), hi = _mm_srli_epi16(b, 4);
    return _mm512_zextsi256_si512(odd(_mm256_setr_m128i(_mm_unpacklo_epi16(lo, hi), _mm_unpackhi_epi16(lo, hi))));
}

// Grid entries of 8 (64-bit) or 16 (32-bit) indices by scalar loads (vpgather is slower on some CPUs,
// Zen 4 and 5 among them).
template <class T>
static inline __m256i grid4(const uint64_t* grid, const T* ix) {
    return _mm256_setr_epi64x(static_cast<int64_t>(grid[ix[0]]), static_cast<int64_t>(grid[ix[1]]),
                              static_cast<int64_t>(grid[ix[2]]), static_cast<int64_t>(grid[ix[3]]));
}
template <class T>
static inline __m512i grid8x64(const uint64_t* grid, const T* ix0, const T* ix1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(grid4(grid, ix0)), grid4(grid, ix1), 1);
}
// The same from 8 indices in a vector.
static inline __m512i grid8x64(const uint64_t* grid, __m256i ix) {
    alignas(32) uint32_t k[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(k), ix);
    return grid8x64(grid, k, k + 4);
}
template <class T>
static inline __m256i grid8(const uint32_t* grid, const T* ix) {
    return _mm256_setr_epi32(static_cast<int>(grid[ix[0]]), static_cast<int>(grid[ix[1]]), static_cast<int>(grid[ix[2]]),
                             static_cast<int>(grid[ix[3]]), static_cast<int>(grid[ix[4]]), static_cast<int>(grid[ix[5]]),
                             static_cast<int>(grid[ix[6]]), static_cast<int>(grid[ix[7]]));
}
template <class T>
static inline __m512i grid16x32(const uint32_t* grid, const T* ix) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(grid8(grid, ix)), grid8(grid, ix + 8), 1);
}

struct iq2_xxs_dec {
    using block = block_iq2_xxs;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = false;
    static float d(const block& b) { return half_to_float(b.d); }
    // Sub-block s's scale sits in the top nibble of dword 2 s + 1 of qs, i.e. word 4 s + 2.
    static __m512i scales(const block& b) {
        const __m512i v = _mm512_srli_epi32(_mm512_loadu_si512(b.qs), 28);
        return _mm512_add_epi32(_mm512_add_epi32(v, v), _mm512_set1_epi32(1));
    }
    static __m512i index(int p) { return index32(8 * p + 2, 8 * p + 6); }
    static void pair(const block& b, int p, __m512i& u, __mmask64& neg) {
        uint32_t meta0, meta1;
        std::memcpy(&meta0, b.qs + 8 * p + 2, 4);
        std::memcpy(&meta1, b.qs + 8 * p + 6, 4);
        u = grid8x64(iq2xxs_grid, reinterpret_cast<const uint8_t*>(b.qs + 8 * p), reinterpret_cast<const uint8_t*>(b.qs + 8 * p + 4));
        neg = even_sign_mask(meta0, meta1);
    }
};

struct iq2_xs_dec {
    using block = block_iq2_xs;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = false;
    static float d(const block& b) { return half_to_float(b.d); }
    static __m512i scales(const block& b) { return nibble_scales16(b.scales); }
    static __m512i index(int p) { return index16(p); }
    static void pair(const block& b, int p, __m512i& u, __mmask64& neg) {
        const uint16_t* q = b.qs + 8 * p;
        const __m128i qv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
        alignas(16) uint16_t ix[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(ix), _mm_and_si128(qv, _mm_set1_epi16(511)));
        u = grid8x64(iq2xs_grid, ix, ix + 4);
        const __m128i codes = _mm_srli_epi16(qv, 9);
        const uint64_t bytes = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_packus_epi16(codes, codes)));
        neg = with_parity(bytes);
    }
};

struct iq2_s_dec {
    using block = block_iq2_s;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = false;
    static float d(const block& b) { return half_to_float(b.d); }
    static __m512i scales(const block& b) { return nibble_scales16(b.scales); }
    static __m512i index(int p) { return index16(p); }
    static void pair(const block& b, int p, __m512i& u, __mmask64& neg) {
        const uint8_t* q = b.qs + 8 * p;
        uint16_t h;  // 2 high index bits per group of 8
        std::memcpy(&h, b.qh + 2 * p, 2);
        const __m256i high = _mm256_srlv_epi32(_mm256_set1_epi32(h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        const __m256i ix = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))),
                                           _mm256_slli_epi32(_mm256_and_si256(high, _mm256_set1_epi32(3)), 8));
        u = grid8x64(iq2s_grid, ix);
        uint64_t s;
        std::memcpy(&s, b.qs + QK_K / 8 + 8 * p, 8);
        neg = s;
    }
};

struct iq3_xxs_dec {
    using block = block_iq3_xxs;
    static constexpr float unit = 0.25f;
    static constexpr bool bsum_term = false;
    static float d(const block& b) { return half_to_float(b.d); }
    // Sub-block s's scale: the top nibble of dword s of the sign words, i.e. word 2 s.
    static __m512i scales(const block& b) {
        const __m256i v = _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + QK_K / 4)), 28);
        return _mm512_zextsi256_si512(_mm256_add_epi32(_mm256_add_epi32(v, v), _mm256_set1_epi32(1)));
    }
    static __m512i index(int p) { return index32(4 * p, 4 * p + 2); }
    static void pair(const block& b, int p, __m512i& u, __mmask64& neg) {
        u = grid16x32(iq3xxs_grid, b.qs + 16 * p);
        uint32_t meta[2];
        std::memcpy(meta, b.qs + QK_K / 4 + 8 * p, 8);
        neg = even_sign_mask(meta[0], meta[1]);
    }
};

struct iq3_s_dec {
    using block = block_iq3_s;
    static constexpr float unit = 1.0f;
    static constexpr bool bsum_term = false;
    static float d(const block& b) { return half_to_float(b.d); }
    // Sub-block s's scale as word s (nibble s % 2 of byte s / 2).
    static __m512i scales(const block& b) {
        uint32_t v;
        std::memcpy(&v, b.scales, 4);
        const __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(static_cast<int>(v)));
        const __m128i s = _mm_unpacklo_epi16(_mm_and_si128(w, _mm_set1_epi16(15)), _mm_srli_epi16(w, 4));
        return _mm512_zextsi256_si512(odd(_mm256_zextsi128_si256(s)));
    }
    static __m512i index(int p) { return index32(2 * p, 2 * p + 1); }
    static void pair(const block& b, int p, __m512i& u, __mmask64& neg) {
        const __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * p)));
        uint16_t high;
        std::memcpy(&high, b.qh + 2 * p, 2);
        alignas(64) uint32_t ixs[16];
        _mm512_store_si512(ixs, _mm512_mask_or_epi32(ix, high, ix, _mm512_set1_epi32(256)));
        u = grid16x32(iq3s_grid, ixs);
        uint64_t s;
        std::memcpy(&s, b.signs + 8 * p, 8);
        neg = s;
    }
};

// IQ1: u = w + 9 = 8 (g + 1) + (delta + 1), g in -1..1 (a grid byte), delta +-1 per 32 (IQ1_S) or 8 (IQ1_M).
// iq1_u_grid() (iq/tables.cpp) holds 8 (g + 1) per byte, so a gathered entry needs only the delta step.
static inline __m512i iq1_u(__m512i g8, __mmask64 delta_plus) {
    return _mm512_mask_add_epi8(g8, delta_plus, g8, _mm512_set1_epi8(2));
}

struct iq1_s_dec {
    using block = block_iq1_s;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = true;
    static float d(const block& b) { return half_to_float(b.d); }
    // Sub-block s's scale as word s.
    static __m512i scales(const block& b) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
        return _mm512_zextsi256_si512(odd(_mm256_zextsi128_si256(_mm_and_si128(_mm_srli_epi16(h, 12), _mm_set1_epi16(7)))));
    }
    static __m512i index(int p) { return index32(2 * p, 2 * p + 1); }
    // -9 * the scale of each 16 weights (for the bsums).
    static __m256i bsum_coef(__m512i sc) {
        const __m256i s16 = _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), _mm512_castsi512_si256(sc));
        return _mm256_mullo_epi16(s16, _mm256_set1_epi16(-9));
    }
    static void pair(const block& b, int p, __m512i& u, __mmask64&) {
        uint32_t h;
        std::memcpy(&h, b.qh + 2 * p, 4);
        const __m256i high = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(h)), _mm256_setr_epi32(0, 3, 6, 9, 16, 19, 22, 25));
        const __m256i ix = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * p))),
                                           _mm256_slli_epi32(_mm256_and_si256(high, _mm256_set1_epi32(7)), 8));
        const __m512i g = grid8x64(iq1_u_grid(), ix);
        const uint64_t plus = (h & 0x8000 ? 0 : 0xFFFFFFFFull) | (h & 0x80000000u ? 0 : 0xFFFFFFFF00000000ull);
        u = iq1_u(g, plus);
    }
};

struct iq1_m_dec {
    using block = block_iq1_m;
    static constexpr float unit = 0.125f;
    static constexpr bool bsum_term = true;
    static float d(const block& b) {
        uint16_t sc[4];
        std::memcpy(sc, b.scales, sizeof sc);
        return half_to_float(static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                                   (sc[3] & 0xf000)));
    }
    // The 3-bit scale of each 16 weights j: bits 3 (j % 4) of word j / 4, as word j.
    static __m512i scales(const block& b) {
        uint64_t v;
        std::memcpy(&v, b.scales, 8);
        const __m256i w = _mm256_permutexvar_epi16(_mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                                   _mm256_zextsi128_si256(_mm_cvtsi64_si128(static_cast<int64_t>(v))));
        const __m256i s = _mm256_srlv_epi16(w, _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9));
        return _mm512_zextsi256_si512(odd(_mm256_and_si256(s, _mm256_set1_epi16(7))));
    }
    static __m512i index(int p) { return index16(p); }
    static __m256i bsum_coef(__m512i sc) { return _mm256_mullo_epi16(_mm512_castsi512_si256(sc), _mm256_set1_epi16(-9)); }
    static void pair(const block& b, int p, __m512i& u, __mmask64&) {
        const uint8_t* q = b.qs + 8 * p;
        uint32_t h;
        std::memcpy(&h, b.qh + 4 * p, 4);
        const __m256i high = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(h)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        const __m256i ix = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))),
                                           _mm256_slli_epi32(_mm256_and_si256(high, _mm256_set1_epi32(7)), 8));
        u = grid8x64(iq1_u_grid(), ix);
        // delta = +1 where bit 3 of the group's nibble is clear
        const uint64_t plus = _pdep_u64(_pext_u32(~h, 0x88888888u), 0x0101010101010101ull) * 0xFF;
        u = iq1_u(u, plus);
    }
};

template <class F>
struct iq_avx512 {
    // Pair p (64 weights) of a super-block into the int32 sums of tokens t < NT.
    template <int NT>
    [[gnu::always_inline]] static inline void pair_step(const typename F::block& b, int p, __m512i index,
                                                        __m512i sc_all, const block_q8_K* const y[NT], int64_t i,
                                                        __m512i sumi[NT]) {
        __m512i u;
        __mmask64 neg = 0;
        F::pair(b, p, u, neg);
        const __m512i sc = _mm512_permutexvar_epi16(index, sc_all);
        for (int t = 0; t < NT; ++t) {
            __m512i q8 = _mm512_loadu_si512(y[t][i].qs + 64 * p);
            if constexpr (!F::bsum_term) q8 = _mm512_mask_sub_epi8(q8, neg, _mm512_setzero_si512(), q8);
            sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(u, q8), sc);
        }
    }
    template <int NT>
    struct kernel {
        static void run(int64_t n, const void* w, const void* const* a, float* out) {
            const auto* x = static_cast<const typename F::block*>(w);
            const block_q8_K* y[NT];
            for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
            const __m512i index[4] = {F::index(0), F::index(1), F::index(2), F::index(3)};
            __m512 acc[8];  // tokens >= NT stay 0
            for (auto& v : acc) v = _mm512_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) {
                prefetch_weights<sizeof(typename F::block)>(x + i);
                const __m512i sc_all = F::scales(x[i]);
                __m512i sumi[NT];
                if constexpr (F::bsum_term) {
                    const __m256i coef = F::bsum_coef(sc_all);
                    for (int t = 0; t < NT; ++t)
                        sumi[t] = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums)), coef));
                } else {
                    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
                }
                // Unrolled: GCC then keeps the sums and masks in registers.
                _Pragma("GCC unroll 4") for (int p = 0; p < QK_K / 64; ++p)
                    pair_step<NT>(x[i], p, index[p], sc_all, y, i, sumi);
                const float d = F::d(x[i]);
                for (int t = 0; t < NT; ++t)
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * y[t][i].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
            }
            store_lane_sums<NT>(acc, out);
            for (int t = 0; t < NT; ++t) out[t] *= F::unit;
        }
    };
};


// The prompt GEMM's parts of format F (iq/gemm_rows.hpp): the dot kernel's integer lanes and float steps,
// each block decoded once for many tokens.
template <class F>
struct iq_avx512_gemm {
    using block = typename F::block;
    using act_block = block_q8_K;
    static constexpr int block_elems = QK_K, group = 8, rows = 4, chunk = 8;
    struct dec {
        __m512i u[4], sc[4];
        __m256i coef;  // IQ1's bsums coefficients
        __mmask64 neg[4];
        float d;
    };
    using acc_t = __m512;
    static __m512 zero() { return _mm512_setzero_ps(); }
    static void decode(const block* x, int64_t i, dec& b) {
        const __m512i sc_all = F::scales(x[i]);
        if constexpr (F::bsum_term) b.coef = F::bsum_coef(sc_all);
        for (int p = 0; p < QK_K / 64; ++p) {
            b.neg[p] = 0;
            F::pair(x[i], p, b.u[p], b.neg[p]);
            b.sc[p] = _mm512_permutexvar_epi16(F::index(p), sc_all);
        }
        b.d = F::d(x[i]);
    }
    template <int NT>
    static void apply(const dec& b, const block_q8_K* const* y, int64_t i, __m512 acc[8]) {
        __m512i sumi[NT];
        if constexpr (F::bsum_term) {
            for (int t = 0; t < NT; ++t)
                sumi[t] = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums)), b.coef));
        } else {
            for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
        }
        for (int p = 0; p < QK_K / 64; ++p) {
            for (int t = 0; t < NT; ++t) {
                __m512i q8 = _mm512_loadu_si512(y[t][i].qs + 64 * p);
                if constexpr (!F::bsum_term) q8 = _mm512_mask_sub_epi8(q8, b.neg[p], _mm512_setzero_si512(), q8);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(b.u[p], q8), b.sc[p]);
            }
        }
        for (int t = 0; t < NT; ++t)
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(b.d * y[t][i].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
    }
    template <int NT>
    static void finish(const __m512 acc[8], float* out) {
        store_lane_sums<NT>(acc, out);
        for (int t = 0; t < NT; ++t) out[t] *= F::unit;
    }
};

}  // namespace

void dot_iq2_xxs_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx512<iq2_xxs_dec>::kernel, 8>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_xxs_avx512(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm_rows<iq_avx512_gemm<iq2_xxs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq2_xs_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx512<iq2_xs_dec>::kernel, 8>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_xs_avx512(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm_rows<iq_avx512_gemm<iq2_xs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq2_s_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx512<iq2_s_dec>::kernel, 8>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_s_avx512(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm_rows<iq_avx512_gemm<iq2_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq3_xxs_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx512<iq3_xxs_dec>::kernel, 8>(n, w, a, n_tok, out);
}
void gemm_rows_iq3_xxs_avx512(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm_rows<iq_avx512_gemm<iq3_xxs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq3_s_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx512<iq3_s_dec>::kernel, 8>(n, w, a, n_tok, out);
}
void gemm_rows_iq3_s_avx512(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm_rows<iq_avx512_gemm<iq3_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq1_s_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx512<iq1_s_dec>::kernel, 8>(n, w, a, n_tok, out);
}
void gemm_rows_iq1_s_avx512(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm_rows<iq_avx512_gemm<iq1_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq1_m_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx512<iq1_m_dec>::kernel, 8>(n, w, a, n_tok, out);
}
void gemm_rows_iq1_m_avx512(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm_rows<iq_avx512_gemm<iq1_m_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
