// IQ4_XS x Q8_K on the rows16 layout, AVX2 (avx2_gemm.cpp) and AVX2 with AVX-VNNI (avxvnni_gemm.cpp):
// 8 rows (one half of a group) x NT tokens per pass, 4 columns of 8 rows per 32 bytes of a qs line in
// both nibble halves (block_iq4_xsx16). The codes go through the
// 16-entry non-linear table with vpshufb. Plain AVX2: |w| x (a with w's sign) in vpmaddubsw (at most
// 2 * 127 * 127 per pair, so no int16 sums across column sets), vpmaddwd by the row's signed sub-block
// scale. AVX-VNNI: vpdpbusd on w + 128 (unsigned), less 128 * the token's sub-block sum, times the scale.
// Both give the same int32 total; one float step per superblock, so the two forms give the same bits.
// Included by one source file per ISA: everything here is internal to it.
#pragma once

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_K;
using formats::QK_K;

template <int NT, bool Vnni>
struct iq4_xs_gemm16 {
    // The table values of rows 8h..8h+7 in dword line q (GGUF's qs bytes 4q..4q+3: sub-block q / 4,
    // elements 4 (q % 4) + i in the low nibbles, 16 + 4 (q % 4) + i in the high ones); with Vnni the
    // values + 128 (table: kvalues_iq4nl ^ 0x80).
    static inline void values(const block_iq4_xsx16& x, __m256i table, int h, int q, __m256i& lo, __m256i& hi) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs[q][8 * h]));
        lo = _mm256_shuffle_epi8(table, _mm256_and_si256(b, low4));
        hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(b, 4), low4));
    }

    static inline __m256i broadcast_dword(const void* p) {
        int32_t v;
        std::memcpy(&v, p, sizeof(v));
        return _mm256_set1_epi32(v);
    }

    // acc[t] (lane r: row 8h + r) += y.d * (d * sum_j(sc_j * w_j . a_j)) for superblock i.
    static inline void superblock(const block_iq4_xsx16& x, __m256i table, int h, const block_q8_K* const y[NT], int64_t i,
                                  __m256 acc[NT]) {
        __m256i total[NT];
        for (auto& t : total) t = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
            const __m128i sc8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.sc[j] + 8 * h));
            if constexpr (Vnni) {
                __m256i isum[NT];
                for (auto& t : isum) t = _mm256_setzero_si256();
                for (int v = 0; v < 4; ++v) {
                    __m256i u[2];
                    values(x, table, h, 4 * j + v, u[0], u[1]);
                    for (int half = 0; half < 2; ++half)
                        for (int t = 0; t < NT; ++t)
                            isum[t] = _mm256_dpbusd_avx_epi32(isum[t], u[half],
                                                              broadcast_dword(y[t][i].qs + 32 * j + 16 * half + 4 * v));
                }
                const __m256i sc = _mm256_cvtepi8_epi32(sc8);
                for (int t = 0; t < NT; ++t) {
                    const int32_t sum_a = y[t][i].bsums[2 * j] + y[t][i].bsums[2 * j + 1];
                    const __m256i s = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(128 * sum_a));
                    total[t] = _mm256_add_epi32(total[t], _mm256_mullo_epi32(s, sc));
                }
                continue;
            }
            const __m256i sc = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc8, sc8));  // dword r: row r's scale twice
            for (int v = 0; v < 4; ++v) {
                __m256i w[2];
                values(x, table, h, 4 * j + v, w[0], w[1]);
                for (int half = 0; half < 2; ++half) {
                    const __m256i aw = _mm256_abs_epi8(w[half]);
                    for (int t = 0; t < NT; ++t) {
                        const __m256i a = _mm256_sign_epi8(broadcast_dword(y[t][i].qs + 32 * j + 16 * half + 4 * v), w[half]);
                        total[t] = _mm256_add_epi32(total[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, a), sc));
                    }
                }
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.d + 8 * h)));
        for (int t = 0; t < NT; ++t)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d), _mm256_mul_ps(d, _mm256_cvtepi32_ps(total[t])), acc[t]);
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        const __m128i kv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(formats::kvalues_iq4nl));
        const __m256i table = _mm256_broadcastsi128_si256(Vnni ? _mm_xor_si128(kv, _mm_set1_epi8(static_cast<char>(0x80))) : kv);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const block_iq4_xsx16*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            if constexpr (NT == 1) {
                // One token: both halves per superblock (the second reads the lines from L1), the
                // prefetches spread over the two; the same operations per row, so the same bits.
                __m256 acc[2][1] = {{_mm256_setzero_ps()}, {_mm256_setzero_ps()}};
                for (int64_t i = 0; i < n / QK_K; ++i)
                    for (int h = 0; h < 2; ++h) {
                        prefetch_weights_part<sizeof(block_iq4_xsx16)>(x + i, h, 2);
                        superblock(x[i], table, h, act, i, acc[h]);
                    }
                for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + g * 16 + 8 * h, acc[h][0]);
                continue;
            }
            for (int h = 0; h < 2; ++h) {
                __m256 acc[NT];
                for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t i = 0; i < n / QK_K; ++i) {
                    if (h == 0) prefetch_weights<sizeof(block_iq4_xsx16)>(x + i);
                    superblock(x[i], table, h, act, i, acc);
                }
                for (int t = 0; t < NT; ++t) _mm256_storeu_ps(y + t * y_stride + g * 16 + 8 * h, acc[t]);
            }
        }
    }
};

template <bool Vnni>
static void gemm16_iq4_xs(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    with_tokens<Vnni ? 4 : 8>(n_tok, [&]<int NT>() {
        iq4_xs_gemm16<NT, Vnni>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
