// Q2_K and Q3_K x Q8_K on the rows16 layout, AVX2 (q2_k/avx2_gemm.cpp, q3_k/avx2_gemm.cpp). A 32-byte half
// of a qs line holds 4 columns of 8 rows, each byte four 2-bit codes (the four 32-element quarters of a
// 128-element chunk); Q3_K adds the third bit from an hmask line. vpmaddubsw multiplies the unsigned codes
// (Q2_K 0..3, Q3_K 0..7: the value plus 4) by the token's 4 activation bytes broadcast to every row; the 4
// column sets of a 16-element sub-block add up in int16 (at most 4 * 2 * 7 * 128 = 7168) and vpmaddwd by the
// row's sub-block scale widens them; with AVX-VNNI (q2_k/avxvnni_gemm.cpp) vpdpbusd sums a sub-block in int32,
// times the scale. Q2_K's mins and Q3_K's code offset 4 * sum(sc * bsums) go through the
// activation's sub-block sums in int32. The integer totals are exact whatever the loop order, and the one
// float step per superblock and 8 rows is fixed here, so every token count gives the same bits.
// Included by one source file per format and ISA: everything here is internal to it.
#pragma once

#include <cstring>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_K;
using formats::QK_K;

static inline __m256i broadcast_dword(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi32(v);
}

// 8 bytes (rows 8h..8h+7) -> 8 dwords, each holding its byte as a word twice: unsigned low nibble (Q2_K
// scales) or signed byte (Q3_K scales).
static inline __m256i low_nibble_words_twice(const uint8_t* p) {
    const __m128i b = _mm_and_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), _mm_set1_epi8(0x0F));
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b));
}
static inline __m256i signed_words_twice(const int8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b, b));
}

// dword r = (a[r], b[r]) as words: Q2_K's high nibbles (the mins), Q3_K's signed scales.
static inline __m256i high_nibble_word_pairs(const uint8_t* a, const uint8_t* b) {
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i x = _mm_and_si128(_mm_srli_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)), 4), m);
    const __m128i y = _mm_and_si128(_mm_srli_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)), 4), m);
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(x, y));
}
static inline __m256i signed_word_pairs(const int8_t* a, const int8_t* b) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
    const __m128i y = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, y));
}

// x >> n (n >= 0) or x << -n, per 16-bit lane.
static inline __m256i shift_right(__m256i x, int n) {
    return n >= 0 ? _mm256_srl_epi16(x, _mm_cvtsi32_si128(n)) : _mm256_sll_epi16(x, _mm_cvtsi32_si128(-n));
}

// Packed: block_q2_Kx16 or block_q3_Kx16 (with hmask).
template <class Packed, bool Vnni>
struct lowk {
    static constexpr bool third_bit = requires(const Packed& x) { x.hmask; };

    // Codes of quarter k of chunk j (elements 128j + 32k + 4v + i) from the qs line (and hmask line) of v.
    static inline __m256i codes(__m256i q, __m256i hm, int j, int k) {
        const __m256i low2 = _mm256_and_si256(k == 0 ? q : shift_right(q, 2 * k), _mm256_set1_epi8(3));
        if constexpr (third_bit)  // bit 4j + k of hmask moved to bit 2
            return _mm256_or_si256(low2, _mm256_and_si256(shift_right(hm, 4 * j + k - 2), _mm256_set1_epi8(4)));
        else
            return low2;
    }

    // Sub-block s's scale of rows 8h..8h+7, as words twice per dword (AVX-VNNI: as dwords).
    static inline __m256i scale(const Packed& x, int s, int h) {
        if constexpr (Vnni && third_bit)
            return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.sc[s] + 8 * h)));
        else if constexpr (Vnni)
            return _mm256_cvtepu8_epi32(
                _mm_and_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.scales[s] + 8 * h)), _mm_set1_epi8(0x0F)));
        else if constexpr (third_bit)
            return signed_words_twice(x.sc[s] + 8 * h);
        else
            return low_nibble_words_twice(x.scales[s] + 8 * h);
    }

    // total[h][t] (lane r: row 8(h0 + h) + r) += sum over sub-blocks of sc * (codes . a) for superblock i.
    // NH halves side by side (one token: each broadcast serves 16 rows), KC quarters per pass over a qs line.
    template <int NH, int NT, int KC>
    static inline void sums(const Packed& x, int h0, const block_q8_K* const y[NT], int64_t i, __m256i total[NH][NT],
                            bool prefetch) {
        for (int j = 0; j < 2; ++j)
            for (int s = 0; s < 2; ++s) {
                if (prefetch) prefetch_weights_part<sizeof(Packed)>(&x, 2 * j + s, 4);
                if constexpr (!Vnni && NH == 1 && KC == 1) {
                    // Plain AVX2, several tokens: a sub-block's codes decoded once and held while every
                    // token runs its 4 products as one chain.
                    const int row = 8 * h0;
                    for (int k = 0; k < 4; ++k) {
                        __m256i w[4];
                        for (int v = 0; v < 4; ++v) {
                            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs[8 * j + 4 * s + v][row]));
                            __m256i hm = _mm256_setzero_si256();
                            if constexpr (third_bit)
                                hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.hmask[4 * s + v][row]));
                            w[v] = codes(q, hm, j, k);
                        }
                        const __m256i sc = scale(x, 8 * j + 2 * k + s, h0);
                        for (int t = 0; t < NT; ++t) {
                            const int8_t* q8 = y[t][i].qs + 128 * j + 32 * k + 16 * s;
                            __m256i s16 = _mm256_maddubs_epi16(w[0], broadcast_dword(q8));
                            for (int v = 1; v < 4; ++v) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[v], broadcast_dword(q8 + 4 * v)));
                            total[0][t] = _mm256_add_epi32(total[0][t], _mm256_madd_epi16(s16, sc));
                        }
                    }
                    continue;
                }
                for (int k0 = 0; k0 < 4; k0 += KC) {
                    __m256i s16[NH][KC][NT];  // int16 pair sums (AVX-VNNI: int32 sums) per row
                    for (auto& a : s16)
                        for (auto& b : a)
                            for (auto& c : b) c = _mm256_setzero_si256();
                    for (int v = 4 * s; v < 4 * s + 4; ++v)
                        for (int h = 0; h < NH; ++h) {
                            const int row = 8 * (h0 + h);
                            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs[8 * j + v][row]));
                            __m256i hm = _mm256_setzero_si256();
                            if constexpr (third_bit) hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.hmask[v][row]));
                            for (int kk = 0; kk < KC; ++kk) {
                                const int k = k0 + kk;
                                const __m256i w = codes(q, hm, j, k);
                                for (int t = 0; t < NT; ++t) {
                                    const __m256i a = broadcast_dword(y[t][i].qs + 128 * j + 32 * k + 4 * v);
                                    if constexpr (Vnni)
                                        s16[h][kk][t] = _mm256_dpbusd_avx_epi32(s16[h][kk][t], w, a);
                                    else
                                        s16[h][kk][t] = _mm256_add_epi16(s16[h][kk][t], _mm256_maddubs_epi16(w, a));
                                }
                            }
                        }
                    for (int h = 0; h < NH; ++h)
                        for (int kk = 0; kk < KC; ++kk) {
                            const __m256i sc = scale(x, 8 * j + 2 * (k0 + kk) + s, h0 + h);
                            for (int t = 0; t < NT; ++t)
                                if constexpr (Vnni)
                                    total[h][t] = _mm256_add_epi32(total[h][t], _mm256_mullo_epi32(s16[h][kk][t], sc));
                                else
                                    total[h][t] = _mm256_add_epi32(total[h][t], _mm256_madd_epi16(s16[h][kk][t], sc));
                        }
                }
            }
    }

    // acc[t] (rows 8h..8h+7) += superblock i's float step from the integer totals:
    //   Q2_K: y.d * (d * total - dmin * sum(m * bsums));  Q3_K: (d * y.d) * (total - 4 * sum(sc * bsums)).
    template <int NT>
    static inline void finish(const Packed& x, int h, const block_q8_K* const y[NT], int64_t i, const __m256i total[NT],
                              __m256 acc[NT]) {
        __m256i pairs[8];
        for (int p = 0; p < 8; ++p) {
            if constexpr (third_bit)
                pairs[p] = signed_word_pairs(x.sc[2 * p] + 8 * h, x.sc[2 * p + 1] + 8 * h);
            else
                pairs[p] = high_nibble_word_pairs(x.scales[2 * p] + 8 * h, x.scales[2 * p + 1] + 8 * h);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.d + 8 * h)));
        for (int t = 0; t < NT; ++t) {
            __m256i bias = _mm256_setzero_si256();
            for (int p = 0; p < 8; ++p) bias = _mm256_add_epi32(bias, _mm256_madd_epi16(pairs[p], broadcast_dword(y[t][i].bsums + 2 * p)));
            if constexpr (third_bit) {
                const __m256i isum = _mm256_sub_epi32(total[t], _mm256_slli_epi32(bias, 2));
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(y[t][i].d)), _mm256_cvtepi32_ps(isum), acc[t]);
            } else {
                const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.dmin + 8 * h)));
                const __m256 z = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(bias), _mm256_mul_ps(d, _mm256_cvtepi32_ps(total[t])));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d), z, acc[t]);
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
            if constexpr (NT == 1) {
                // One token: both halves per superblock, the prefetches spread over it.
                __m256 acc[2][1] = {{_mm256_setzero_ps()}, {_mm256_setzero_ps()}};
                for (int64_t i = 0; i < n / QK_K; ++i) {
                    __m256i total[2][1] = {{_mm256_setzero_si256()}, {_mm256_setzero_si256()}};
                    sums<2, 1, 4>(x[i], 0, act, i, total, true);
                    for (int h = 0; h < 2; ++h) finish<1>(x[i], h, act, i, total[h], acc[h]);
                }
                for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + g * 16 + 8 * h, acc[h][0]);
                continue;
            }
            for (int h = 0; h < 2; ++h) {
                __m256 acc[NT];
                for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t i = 0; i < n / QK_K; ++i) {
                    if (h == 0) prefetch_weights<sizeof(Packed)>(x + i);
                    __m256i total[1][NT];
                    for (int t = 0; t < NT; ++t) total[0][t] = _mm256_setzero_si256();
                    sums<1, NT, (NT <= 2 ? 4 : 1)>(x[i], h, act, i, total, false);
                    finish<NT>(x[i], h, act, i, total[0], acc);
                }
                for (int t = 0; t < NT; ++t) _mm256_storeu_ps(y + t * y_stride + g * 16 + 8 * h, acc[t]);
            }
        }
    }
};

template <class Packed, bool Vnni>
static void lowk_gemm16(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    switch (n_tok) {
        case 1: lowk<Packed, Vnni>::template run<1>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 2: lowk<Packed, Vnni>::template run<2>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 3: lowk<Packed, Vnni>::template run<3>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 4: lowk<Packed, Vnni>::template run<4>(n, w, group_bytes, n_groups, a, y, y_stride); return;
    }
    if constexpr (!Vnni) {
        switch (n_tok) {
            case 5: lowk<Packed, Vnni>::template run<5>(n, w, group_bytes, n_groups, a, y, y_stride); return;
            case 6: lowk<Packed, Vnni>::template run<6>(n, w, group_bytes, n_groups, a, y, y_stride); return;
            case 7: lowk<Packed, Vnni>::template run<7>(n, w, group_bytes, n_groups, a, y, y_stride); return;
            case 8: lowk<Packed, Vnni>::template run<8>(n, w, group_bytes, n_groups, a, y, y_stride); return;
        }
    }
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
