// Q6_K x Q8_K on the rows16 layout, AVX2: 8 rows (one half of a group) x NT tokens per pass. Each
// 32-byte half of a ql line holds 4 columns of 8 rows in two nibble halves, one of a qh line the top 2
// bits of 4 such column sets; vpmaddubsw multiplies the unsigned 6-bit codes by the token's 4
// activation bytes broadcast to every row. Two column sets add up in int16 (at most 2 * 2 * 63 * 128 =
// 32256), vpmaddwd by the row's int8 sub-block scale widens them; the code offset 32 * sum(sc * bsums)
// comes out in int32 and one float step per superblock is the AVX-512 kernel's, so both give the same bits.
// With AVX-VNNI (avxvnni_gemm.cpp), vpdpwssd does each vpmaddwd and the add after it in one step: the
// same int32 sums. Plain AVX2 in avx2_gemm.cpp. Included by one source file per ISA.
#pragma once

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

// 8 int8 (rows 8h..8h+7) -> dword r = the value in both words.
static inline __m256i row_words_twice(const int8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b, b));
}

// 8 int8 of rows from each of two tables -> dword r = (a[r], b[r]) as words.
static inline __m256i row_word_pairs(const int8_t* a, const int8_t* b) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
    const __m128i y = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, y));
}

template <int NT, bool Vnni>
struct q6_k_gemm16 {

    // Codes of quarter k (elements 128c + 32k + 4v + i) of rows 8h..8h+7.
    static inline __m256i codes(const block_q6_Kx16& x, int h, int c, int k, int v) {
        const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.ql[16 * c + 8 * (k % 2) + v][8 * h]));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh[8 * c + v][8 * h]));
        const __m256i lo = k < 2 ? _mm256_and_si256(q, low4) : _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        __m256i hi;  // bits 2k, 2k + 1 of hb moved to bits 4, 5
        switch (k) {
            case 0: hi = _mm256_slli_epi16(hb, 4); break;
            case 1: hi = _mm256_slli_epi16(hb, 2); break;
            case 2: hi = hb; break;
            default: hi = _mm256_srli_epi16(hb, 2); break;
        }
        return _mm256_or_si256(lo, _mm256_and_si256(hi, top2));
    }

    // The int sums for one or two tokens: each (ql, ql, qh) load triple gives the codes of all four
    // quarters (shared shifts), so four sub-blocks' sums run side by side. Same int32 total, exactly.
    static inline void sums_few(const block_q6_Kx16& x, int h, const block_q8_K* const y[NT], int64_t i, __m256i total[NT]) {
        const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
        for (int c = 0; c < 2; ++c)
            for (int v0 = 0; v0 < 8; v0 += 2) {
                const int s = v0 / 4;  // sub-blocks 8c + 2k + s
                __m256i s16[4][NT];
                for (auto& k : s16)
                    for (auto& t : k) t = _mm256_setzero_si256();
                for (int v = v0; v < v0 + 2; ++v) {
                    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.ql[16 * c + v][8 * h]));
                    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.ql[16 * c + 8 + v][8 * h]));
                    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh[8 * c + v][8 * h]));
                    const __m256i w[4] = {
                        _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), top2)),
                        _mm256_or_si256(_mm256_and_si256(b, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), top2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(hb, top2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), top2)),
                    };
                    for (int k = 0; k < 4; ++k)
                        for (int t = 0; t < NT; ++t)
                            s16[k][t] = _mm256_add_epi16(
                                s16[k][t], _mm256_maddubs_epi16(w[k], broadcast_dword(y[t][i].qs + 128 * c + 32 * k + 4 * v)));
                }
                for (int k = 0; k < 4; ++k) {
                    const __m256i sc = row_words_twice(x.sc[8 * c + 2 * k + s] + 8 * h);
                    for (int t = 0; t < NT; ++t) total[t] = madd_add_epi16<Vnni>(total[t], s16[k][t], sc);
                }
            }
    }

    // The int sums for more tokens: one quarter's codes at a time (registers).
    static inline void sums(const block_q6_Kx16& x, int h, const block_q8_K* const y[NT], int64_t i, __m256i total[NT]) {
        for (int c = 0; c < 2; ++c)
            for (int k = 0; k < 4; ++k)
                for (int s = 0; s < 2; ++s) {
                    const __m256i sc = row_words_twice(x.sc[8 * c + 2 * k + s] + 8 * h);
                    for (int v0 = 4 * s; v0 < 4 * s + 4; v0 += 2) {
                        __m256i s16[NT];
                        for (int t = 0; t < NT; ++t) s16[t] = _mm256_setzero_si256();
                        for (int v = v0; v < v0 + 2; ++v) {
                            const __m256i w = codes(x, h, c, k, v);
                            for (int t = 0; t < NT; ++t)
                                s16[t] = _mm256_add_epi16(
                                    s16[t], _mm256_maddubs_epi16(w, broadcast_dword(y[t][i].qs + 128 * c + 32 * k + 4 * v)));
                        }
                        for (int t = 0; t < NT; ++t) total[t] = madd_add_epi16<Vnni>(total[t], s16[t], sc);
                    }
                }
    }

    // acc[t] (lane r: row 8h + r) += superblock i of the group's rows times token t's activations.
    static inline void superblock(const block_q6_Kx16& x, int h, const block_q8_K* const y[NT], int64_t i, __m256 acc[NT]) {
        __m256i total[NT];  // sum over sub-blocks of sc * (q . a)
        for (int t = 0; t < NT; ++t) total[t] = _mm256_setzero_si256();
        if constexpr (NT <= 2)
            sums_few(x, h, y, i, total);
        else
            sums(x, h, y, i, total);
        // The code offset: dword r of pair p holds sc[2p][r], sc[2p + 1][r], times bsums 2p and 2p + 1.
        __m256i pairs[8];
        for (int p = 0; p < 8; ++p) pairs[p] = row_word_pairs(x.sc[2 * p] + 8 * h, x.sc[2 * p + 1] + 8 * h);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.d + 8 * h)));
        for (int t = 0; t < NT; ++t) {
            __m256i offset = _mm256_setzero_si256();
            for (int p = 0; p < 8; ++p)
                offset = madd_add_epi16<Vnni>(offset, pairs[p], broadcast_dword(y[t][i].bsums + 2 * p));
            const __m256i isum = _mm256_sub_epi32(total[t], _mm256_slli_epi32(offset, 5));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(y[t][i].d)), _mm256_cvtepi32_ps(isum), acc[t]);
        }
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const block_q6_Kx16*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            if constexpr (NT == 1) {
                // One token: both halves per superblock, so the second reads the lines from L1, and the
                // prefetches spread over the two (the same operations per row, so the same bits).
                __m256 acc[2][1] = {{_mm256_setzero_ps()}, {_mm256_setzero_ps()}};
                for (int64_t i = 0; i < n / QK_K; ++i)
                    for (int h = 0; h < 2; ++h) {
                        prefetch_weights_part<sizeof(block_q6_Kx16)>(x + i, h, 2);
                        superblock(x[i], h, act, i, acc[h]);
                    }
                for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + g * 16 + 8 * h, acc[h][0]);
                continue;
            }
            for (int h = 0; h < 2; ++h) {
                __m256 acc[NT];
                for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t i = 0; i < n / QK_K; ++i) {
                    if (h == 0) prefetch_weights<sizeof(block_q6_Kx16)>(x + i);
                    superblock(x[i], h, act, i, acc);
                }
                for (int t = 0; t < NT; ++t) _mm256_storeu_ps(y + t * y_stride + g * 16 + 8 * h, acc[t]);
            }
        }
    }
};

template <bool Vnni>
void gemm16_q6_k(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok, float* y,
                 int64_t y_stride) {
    with_tokens<4>(n_tok, [&]<int NT>() {
        q6_k_gemm16<NT, Vnni>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
