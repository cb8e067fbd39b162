// Q2_K and Q3_K x Q8_K on the rows16 layout, AVX-512 VNNI (q2_k/avx512_gemm.cpp, q3_k/avx512_gemm.cpp): a
// 64-byte qs line holds 4 columns of all 16 rows of a group (and an hmask line their third bits), so one
// register covers the group. vpdpbusd sums a sub-block's codes times the token's broadcast activation bytes
// in int32, times the row's scale; Q2_K's mins and Q3_K's code offset go through the activation's
// sub-block sums as in the AVX2 kernel (q2_k/avx2_gemm.hpp), and the float step per superblock is that
// kernel's, lane for lane, so both give the same bits. Up to 8 tokens per call (32 registers).
// Included by one source file per format: everything here is internal to it.
#pragma once

#include <cstring>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86_512.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_K;
using formats::QK_K;

// 16 bytes of rows from each of two tables -> dword r = (a[r], b[r]) as words, unsigned or signed.
static inline __m512i word_pairs16(__m128i a, __m128i b, bool is_signed) {
    const __m256i both = _mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b));
    return is_signed ? _mm512_cvtepi8_epi16(both) : _mm512_cvtepu8_epi16(both);
}

static inline __m512i shift_right512(__m512i x, int n) {
    return n >= 0 ? _mm512_srl_epi16(x, _mm_cvtsi32_si128(n)) : _mm512_sll_epi16(x, _mm_cvtsi32_si128(-n));
}

template <class Packed>
struct lowk512 {
    static constexpr bool third_bit = requires(const Packed& x) { x.hmask; };

    static inline __m512i codes(__m512i q, __m512i hm, int j, int k) {
        const __m512i low2 = _mm512_and_si512(k == 0 ? q : shift_right512(q, 2 * k), _mm512_set1_epi8(3));
        if constexpr (third_bit)
            return _mm512_or_si512(low2, _mm512_and_si512(shift_right512(hm, 4 * j + k - 2), _mm512_set1_epi8(4)));
        else
            return low2;
    }

    // Sub-block s's scale of the 16 rows as dwords.
    static inline __m512i scale(const Packed& x, int s) {
        if constexpr (third_bit)
            return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sc[s])));
        else
            return _mm512_cvtepu8_epi32(
                _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales[s])), _mm_set1_epi8(0x0F)));
    }

    template <int NT>
    static inline void superblock(const Packed& x, const block_q8_K* const y[NT], int64_t i, __m512 acc[NT]) {
        constexpr int KC = NT <= 2 ? 4 : (NT <= 4 ? 2 : 1);  // quarters per pass over a qs line
        __m512i total[NT];
        for (auto& t : total) t = _mm512_setzero_si512();
        for (int j = 0; j < 2; ++j)
            for (int s = 0; s < 2; ++s) {
                prefetch_weights_part<sizeof(Packed)>(&x, 2 * j + s, 4);
                for (int k0 = 0; k0 < 4; k0 += KC) {
                    __m512i isum[KC][NT];
                    for (auto& a : isum)
                        for (auto& b : a) b = _mm512_setzero_si512();
                    for (int v = 4 * s; v < 4 * s + 4; ++v) {
                        const __m512i q = _mm512_loadu_si512(x.qs[8 * j + v]);
                        __m512i hm = _mm512_setzero_si512();
                        if constexpr (third_bit) hm = _mm512_loadu_si512(x.hmask[v]);
                        for (int kk = 0; kk < KC; ++kk) {
                            const int k = k0 + kk;
                            const __m512i w = codes(q, hm, j, k);
                            for (int t = 0; t < NT; ++t)
                                isum[kk][t] = dpbusd_bcast(isum[kk][t], w, y[t][i].qs + 128 * j + 32 * k + 4 * v);
                        }
                    }
                    for (int kk = 0; kk < KC; ++kk) {
                        const __m512i sc = scale(x, 8 * j + 2 * (k0 + kk) + s);
                        for (int t = 0; t < NT; ++t) total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(isum[kk][t], sc));
                    }
                }
            }
        __m512i pairs[8];
        for (int p = 0; p < 8; ++p) {
            if constexpr (third_bit) {
                pairs[p] = word_pairs16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sc[2 * p])),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sc[2 * p + 1])), true);
            } else {
                const __m128i m = _mm_set1_epi8(0x0F);
                pairs[p] = word_pairs16(
                    _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales[2 * p])), 4), m),
                    _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales[2 * p + 1])), 4), m),
                    false);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d)));
        for (int t = 0; t < NT; ++t) {
            __m512i bias = _mm512_setzero_si512();
            for (int p = 0; p < 8; ++p) bias = _mm512_add_epi32(bias, _mm512_madd_epi16(pairs[p], broadcast_dword(y[t][i].bsums + 2 * p)));
            if constexpr (third_bit) {
                const __m512i isum = _mm512_sub_epi32(total[t], _mm512_slli_epi32(bias, 2));
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(y[t][i].d)), _mm512_cvtepi32_ps(isum), acc[t]);
            } else {
                const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.dmin)));
                const __m512 z = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(bias), _mm512_mul_ps(d, _mm512_cvtepi32_ps(total[t])));
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d), z, acc[t]);
            }
        }
    }

    template <int NT>
    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const Packed*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            __m512 acc[NT];
            for (auto& v : acc) v = _mm512_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) superblock<NT>(x[i], act, i, acc);
            for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * y_stride + g * 16, acc[t]);
        }
    }
};

template <class Packed>
static void lowk_gemm16_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a,
                               int n_tok, float* y, int64_t y_stride) {
    switch (n_tok) {
        case 1: lowk512<Packed>::template run<1>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 2: lowk512<Packed>::template run<2>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 3: lowk512<Packed>::template run<3>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 4: lowk512<Packed>::template run<4>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 5: lowk512<Packed>::template run<5>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 6: lowk512<Packed>::template run<6>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 7: lowk512<Packed>::template run<7>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 8: lowk512<Packed>::template run<8>(n, w, group_bytes, n_groups, a, y, y_stride); return;
    }
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
