// Q4_K and Q5_K x Q8_K on the rows16 layout, AVX-512 VNNI: 16 rows x NT tokens per pass. Each 64-byte
// load holds 4 columns of 16 rows in both nibble halves (sub-blocks 2k and 2k + 1); vpdpbusd multiplies
// one half by the token's 4 activation bytes broadcast to every row, so one instruction does 64 products
// and the unpacking is shared by all NT tokens. Q5_K adds 16 where bit j of the matching qh bytes is set
// (sub-block j). Sub-block sums are scaled by their int scales and added in int32; the mins go through
// the activation's sub-block sums with vpdpwssd; one float step per superblock.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86_512.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_K;
using formats::QK_K;

// Packed: block_q4_Kx16 or block_q5_Kx16 (the same fields plus qh).
template <class Packed, int NT>
struct k4_gemm16 {
    static constexpr bool fifth_bit = requires(const Packed& x) { x.qh; };
    static constexpr int kLines = (sizeof(Packed) + 63) / 64;

    // The 16 rows' codes of column set v of sub-block 2k + half (Q4_K's high half: 16 times the code).
    static inline __m512i codes(const Packed& x, int k, int half, int v) {
        const __m512i q = _mm512_loadu_si512(x.qs[8 * k + v]);
        if constexpr (fifth_bit) {
            const __m512i low4 = _mm512_set1_epi8(0x0F);
            const __m512i w = half ? _mm512_and_si512(_mm512_srli_epi16(q, 4), low4) : _mm512_and_si512(q, low4);
            const __mmask64 bit = _mm512_test_epi8_mask(_mm512_loadu_si512(x.qh[v]), _mm512_set1_epi8(static_cast<char>(1 << (2 * k + half))));
            return _mm512_mask_add_epi8(w, bit, w, _mm512_set1_epi8(16));
        } else {
            return _mm512_and_si512(q, _mm512_set1_epi8(static_cast<char>(half ? 0xF0 : 0x0F)));
        }
    }

    // acc[t] (lane r: row r) += superblock i of the group times token t's activations. Everything stays
    // in int32 until one float step per superblock: d * sum_j(sc_j * q_j . a_j) - dmin * sum_j(m_j * S_j)
    // (S_j: the token's sum over sub-block j). Q4_K keeps high nibbles in place (16 times the code) and
    // its low sub-blocks' scales times 16, so its int sum is 16 times the true one and d / 16 scales it.
    // With few tokens one 64-byte load feeds both sub-blocks of its column set; with more, the halves
    // go one after the other (registers). Integer sums are exact in any order, so every NT gives the
    // same bits.
    static inline void superblock(const Packed& x, const block_q8_K* const y[NT], int64_t i, __m512 acc[NT]) {
        constexpr bool both_halves = NT <= 4;
        __m512i total[NT];
        for (auto& t : total) t = _mm512_setzero_si512();
        const auto fold = [&](const __m512i* isum, int j) {
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sc[j])));
            if (!fifth_bit && j % 2 == 0) sc = _mm512_slli_epi32(sc, 4);
            for (int t = 0; t < NT; ++t) total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(isum[t], sc));
        };
        for (int k = 0; k < 4; ++k) {
            if constexpr (both_halves) {
                __m512i isum[2][NT];
                for (auto& h : isum)
                    for (auto& t : h) t = _mm512_setzero_si512();
                const auto step = [&](int v) {
                    const __m512i w[2] = {codes(x, k, 0, v), codes(x, k, 1, v)};
                    for (int half = 0; half < 2; ++half)
                        for (int t = 0; t < NT; ++t)
                            isum[half][t] = dpbusd_bcast(isum[half][t], w[half], y[t][i].qs + 32 * (2 * k + half) + 4 * v);
                };
                if constexpr (NT <= spread_prefetch_tokens) {
#pragma GCC unroll 1
                    for (int v = 0; v < 8; ++v) {
                        // The superblock's lines a step at a time (32 steps): line 8k + v, and line
                        // 32 + 8k + v while there is one.
                        prefetch_weight_line(&x, 8 * k + v);
                        if (32 + 8 * k + v < kLines) prefetch_weight_line(&x, 32 + 8 * k + v);
                        step(v);
                    }
                } else {
                    for (int v = 0; v < 8; ++v) step(v);
                }
                fold(isum[0], 2 * k);
                fold(isum[1], 2 * k + 1);
            } else {
                for (int half = 0; half < 2; ++half) {
                    __m512i isum[NT];
                    for (auto& t : isum) t = _mm512_setzero_si512();
                    for (int v = 0; v < 8; ++v) {
                        const __m512i w = codes(x, k, half, v);
                        for (int t = 0; t < NT; ++t)
                            isum[t] = dpbusd_bcast(isum[t], w, y[t][i].qs + 32 * (2 * k + half) + 4 * v);
                    }
                    fold(isum, 2 * k + half);
                }
            }
        }
        // mins: dword lane r of pair p holds m[2p][r], m[2p + 1][r] (int16), times the token's sums of
        // sub-blocks 2p and 2p + 1.
        __m512i mins[4];
        for (int p = 0; p < 4; ++p)
            mins[p] = row_pairs_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.m[2 * p]))));
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d)));
        if constexpr (!fifth_bit) d = _mm512_mul_ps(d, _mm512_set1_ps(1.0f / 16));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.dmin)));
        for (int t = 0; t < NT; ++t) {
            const __m512i msum = sub_block_dot(mins, y[t][i].bsums);
            const __m512 z = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(msum), _mm512_mul_ps(d, _mm512_cvtepi32_ps(total[t])));
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d), z, acc[t]);
        }
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const Packed*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            __m512 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) {
                if constexpr (NT > spread_prefetch_tokens) prefetch_weights<sizeof(Packed)>(x + i);
                superblock(x[i], act, i, acc);
            }
            for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * y_stride + g * 16, acc[t]);
        }
    }
};

template <class Packed>
static void gemm16(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                   float* y, int64_t y_stride) {
    with_tokens<8>(n_tok, [&]<int NT>() {
        k4_gemm16<Packed, NT>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace

void gemm16_q4_k_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<block_q4_Kx16>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_k_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<block_q5_Kx16>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
