// Q4_K and Q5_K x Q8_K on the rows16 layout, AVX2 (avx2_gemm.cpp) and AVX2 with AVX-VNNI
// (avxvnni_gemm.cpp): 8 rows (one half of a group) x NT tokens per pass. Each 32-byte half of a 64-byte
// qs line holds 4 columns of 8 rows in both nibble halves, multiplied by the token's 4 activation bytes
// broadcast to every row. Plain AVX2: vpmaddubsw gives each row two int16 pair sums per dword; they add
// up in int16 over a sub-block (Q4_K: 8 column sets, at most 8 * 2 * 15 * 128 = 30720; Q5_K: 4 sets of
// codes up to 31) and vpmaddwd by the row's sub-block scale widens them to int32. AVX-VNNI: vpdpbusd
// sums a sub-block in int32, times the scale. The mins go through the activation's sub-block sums with
// vpmaddwd; one float step per superblock, the same as the AVX-512 kernel's, so all give the same bits.
// Included by one source file per ISA: everything here is internal to it.
#pragma once

#include <memory>

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

// 8 bytes (rows 8h..8h+7 of a byte-per-row table) -> dword r = the byte in both words.
static inline __m256i row_words_twice(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b));
}

// 8 bytes of rows from each of two tables -> dword r = (a[r], b[r]) as words.
static inline __m256i row_word_pairs(const uint8_t* a, const uint8_t* b) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
    const __m128i y = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(x, y));
}

// Packed: block_q4_Kx16 or block_q5_Kx16 (the same fields plus qh).
template <class Packed, int NT, bool Vnni>
struct k4_gemm16 {
    static constexpr bool fifth_bit = requires(const Packed& x) { x.qh; };
    // Column sets summed in int16 before the scale widens them (see the file comment).
    static constexpr int int16_sets = fifth_bit ? 4 : 8;

    // The codes of rows 8h..8h+7, column set v of sub-block 2k + half.
    static inline __m256i codes(const Packed& x, int h, int k, int half, int v) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs[8 * k + v][8 * h]));
        const __m256i w = half ? _mm256_and_si256(_mm256_srli_epi16(q, 4), low4) : _mm256_and_si256(q, low4);
        if constexpr (fifth_bit) {
            const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (2 * k + half)));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh[v][8 * h]));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
            return _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
        } else {
            return w;
        }
    }

    // acc[t] (lane r: row 8h + r) += superblock i of the group's rows times token t's activations:
    // y.d * (d * sum_j(sc_j * q_j . a_j) - dmin * sum_j(m_j * S_j)), S_j the token's sub-block sums.
    static inline void superblock(const Packed& x, int h, const block_q8_K* const y[NT], int64_t i, const int32_t* pairs,
                                  __m256 acc[NT]) {
        __m256i total[NT];
        for (auto& t : total) t = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const int k = j / 2, half = j % 2;
            if constexpr (Vnni) {
                __m256i isum[NT];
                for (auto& t : isum) t = _mm256_setzero_si256();
                for (int v = 0; v < 8; ++v) {
                    const __m256i w = codes(x, h, k, half, v);
                    for (int t = 0; t < NT; ++t)
                        isum[t] = _mm256_dpbusd_avx_epi32(isum[t], w, broadcast_dword(y[t][i].qs + 32 * j + 4 * v));
                }
                const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.sc[j] + 8 * h)));
                for (int t = 0; t < NT; ++t) total[t] = _mm256_add_epi32(total[t], _mm256_mullo_epi32(isum[t], sc));
                continue;
            }
            // The sub-block's codes are decoded once and held while every token passes over them.
            __m256i w[8];
            for (int v = 0; v < 8; ++v) w[v] = codes(x, h, k, half, v);
            const __m256i sc = row_words_twice(x.sc[j] + 8 * h);
            for (int t = 0; t < NT; ++t) {
                const int8_t* q8 = y[t][i].qs + 32 * j;
                for (int v0 = 0; v0 < 8; v0 += int16_sets) {
                    __m256i s16 = _mm256_maddubs_epi16(w[v0], broadcast_dword(q8 + 4 * v0));
                    for (int v = v0 + 1; v < v0 + int16_sets; ++v)
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[v], broadcast_dword(q8 + 4 * v)));
                    total[t] = _mm256_add_epi32(total[t], _mm256_madd_epi16(s16, sc));
                }
            }
        }
        finish(x, h, y, i, pairs, total, acc);
    }

    // Token t's sub-block sums of superblock i, S_j = bsums[2j] + bsums[2j + 1], as the int16 pairs
    // (S0, S1), (S2, S3), (S4, S5), (S6, S7): pairs[4 (NT i + t) + p]. Made once per call for every row.
    static inline void make_pairs(const block_q8_K* const y[NT], int64_t n_super, int32_t* pairs) {
        const __m256i ones = _mm256_set1_epi16(1);
        for (int64_t i = 0; i < n_super; ++i)
            for (int t = 0; t < NT; ++t) {
                const __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums)), ones);
                const __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + 4 * (NT * i + t)), p);
            }
    }

    // acc[t] += y.d * (d * total[t] - dmin * sum_j(m_j * S_j)) for rows 8h..8h+7 (pairs: superblock i's
    // make_pairs entries).
    static inline void finish(const Packed& x, int h, const block_q8_K* const y[NT], int64_t i, const int32_t* pairs,
                              const __m256i total[NT], __m256 acc[NT]) {
        // mins: dword r of pair p holds m[2p][r], m[2p + 1][r], times the token's sums of sub-blocks 2p, 2p + 1.
        __m256i mins[4];
        for (int p = 0; p < 4; ++p) mins[p] = row_word_pairs(x.m[2 * p] + 8 * h, x.m[2 * p + 1] + 8 * h);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.d + 8 * h)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.dmin + 8 * h)));
        for (int t = 0; t < NT; ++t) {
            const int32_t* s = pairs + 4 * t;
            __m256i msum = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(s[0]));
            for (int p = 1; p < 4; ++p) msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(s[p])));
            const __m256 z = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(msum), _mm256_mul_ps(d, _mm256_cvtepi32_ps(total[t])));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d), z, acc[t]);
        }
    }

    // One token (with or without AVX-VNNI: vpdpbusd's form measured slower here): both halves of the group
    // per superblock, so each activation broadcast serves 16 rows and each qs line is loaded once for the
    // two sub-blocks it holds (the integer sums are the same). The prefetches spread over the superblock.
    static inline void superblock_one(const Packed& x, const block_q8_K* const y[1], int64_t i, const int32_t* pairs,
                                      __m256 acc[2][1]) {
        __m256i total[2][1] = {{_mm256_setzero_si256()}, {_mm256_setzero_si256()}};
        for (int k = 0; k < 4; ++k) {
            prefetch_weights_part<sizeof(Packed)>(&x, k, 4);
            __m256i sc[2][2];  // [half][h]
            for (int half = 0; half < 2; ++half)
                for (int h = 0; h < 2; ++h) sc[half][h] = row_words_twice(x.sc[2 * k + half] + 8 * h);
            for (int v0 = 0; v0 < 8; v0 += int16_sets) {
                __m256i s16[2][2];
                for (auto& row : s16)
                    for (auto& v : row) v = _mm256_setzero_si256();
                for (int v = v0; v < v0 + int16_sets; ++v) {
                    const __m256i a[2] = {broadcast_dword(y[0][i].qs + 64 * k + 4 * v), broadcast_dword(y[0][i].qs + 64 * k + 32 + 4 * v)};
                    for (int h = 0; h < 2; ++h)
                        for (int half = 0; half < 2; ++half)
                            s16[half][h] = _mm256_add_epi16(s16[half][h], _mm256_maddubs_epi16(codes(x, h, k, half, v), a[half]));
                }
                for (int h = 0; h < 2; ++h)
                    for (int half = 0; half < 2; ++half)
                        total[h][0] = _mm256_add_epi32(total[h][0], _mm256_madd_epi16(s16[half][h], sc[half][h]));
            }
        }
        for (int h = 0; h < 2; ++h) finish(x, h, y, i, pairs, total[h], acc[h]);
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        const int64_t n_super = n / QK_K;
        constexpr int64_t stack_entries = 4 * 8 * 128;
        int32_t stack_pairs[stack_entries];
        std::unique_ptr<int32_t[]> heap_pairs;
        int32_t* pairs = stack_pairs;
        if (4 * NT * n_super > stack_entries)
            pairs = (heap_pairs = std::make_unique<int32_t[]>(static_cast<size_t>(4 * NT * n_super))).get();
        make_pairs(act, n_super, pairs);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const Packed*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            if constexpr (NT == 1) {
                __m256 acc[2][1] = {{_mm256_setzero_ps()}, {_mm256_setzero_ps()}};
                for (int64_t i = 0; i < n_super; ++i) superblock_one(x[i], act, i, pairs + 4 * i, acc);
                for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + g * 16 + 8 * h, acc[h][0]);
                continue;
            }
            for (int h = 0; h < 2; ++h) {
                __m256 acc[NT];
                for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t i = 0; i < n_super; ++i) {
                    if (h == 0) prefetch_weights<sizeof(Packed)>(x + i);
                    superblock(x[i], h, act, i, pairs + 4 * NT * i, acc);
                }
                for (int t = 0; t < NT; ++t) _mm256_storeu_ps(y + t * y_stride + g * 16 + 8 * h, acc[t]);
            }
        }
    }
};

template <class Packed, bool Vnni>
static void gemm16(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                   float* y, int64_t y_stride) {
    with_tokens<Vnni ? 4 : 8>(n_tok, [&]<int NT>() {
        k4_gemm16<Packed, NT, Vnni>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
