// IQ4_XS x Q8_K on the rows16 layout, AVX-512 VNNI: 16 rows x NT tokens per pass. A qs line (64 bytes)
// holds 4 columns of 16 rows in both nibble halves (block_iq4_xsx16); vpshufb maps the codes through the
// non-linear table + 128 (unsigned), and vpdpbusd multiplies them by the token's 4 activation bytes
// broadcast to every row. Per sub-block: the int32 sum times the row's signed scale; the 128 offset comes
// back out once per superblock as 128 * sum_j(sc_j * S_j) (S_j: the token's sum over sub-block j) with
// vpdpwssd. The int32 total is the AVX2 kernels' exactly and the float step is theirs, so every form and
// every NT give the same bits.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86_512.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_K;
using formats::QK_K;

template <int NT>
struct iq4_xs_gemm16 {
    static constexpr int kLines = (sizeof(block_iq4_xsx16) + 63) / 64;

    // acc[t] (lane r: row r) += y.d * (d * sum_j(sc_j * w_j . a_j)) for superblock i, w_j the table values.
    static inline void superblock(const block_iq4_xsx16& x, __m512i table, const block_q8_K* const y[NT], int64_t i,
                                  __m512 acc[NT]) {
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        __m512i total[NT];
        for (auto& t : total) t = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int j = 0; j < 8; ++j) {
            __m512i isum[NT];
            for (auto& t : isum) t = _mm512_setzero_si512();
            for (int v = 0; v < 4; ++v) {
                if constexpr (NT <= spread_prefetch_tokens) {
                    // The superblock's lines a step at a time (32 steps): line 4j + v, and line 32 + 4j + v
                    // while there is one.
                    prefetch_weight_line(&x, 4 * j + v);
                    if (32 + 4 * j + v < kLines) prefetch_weight_line(&x, 32 + 4 * j + v);
                }
                const __m512i b = _mm512_loadu_si512(x.qs[4 * j + v]);
                const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(b, low4));
                const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(b, 4), low4));
                for (int t = 0; t < NT; ++t) {
                    isum[t] = dpbusd_bcast(isum[t], lo, y[t][i].qs + 32 * j + 4 * v);
                    isum[t] = dpbusd_bcast(isum[t], hi, y[t][i].qs + 32 * j + 16 + 4 * v);
                }
            }
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sc[j])));
            for (int t = 0; t < NT; ++t) total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(isum[t], sc));
        }
        // The offset: dword lane r of pair p holds sc[2p][r], sc[2p + 1][r] (int16), times the token's sums
        // of sub-blocks 2p and 2p + 1.
        __m512i scales[4];
        for (int p = 0; p < 4; ++p)
            scales[p] = row_pairs_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sc[2 * p]))));
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d)));
        for (int t = 0; t < NT; ++t) {
            const __m512i off = sub_block_dot(scales, y[t][i].bsums);
            const __m512i sumi = _mm512_sub_epi32(total[t], _mm512_slli_epi32(off, 7));
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi)), acc[t]);
        }
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        const __m128i kv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(formats::kvalues_iq4nl));
        const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(kv, _mm_set1_epi8(static_cast<char>(0x80))));
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const block_iq4_xsx16*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            __m512 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) {
                if constexpr (NT > spread_prefetch_tokens) prefetch_weights<sizeof(block_iq4_xsx16)>(x + i);
                superblock(x[i], table, act, i, acc);
            }
            for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * y_stride + g * 16, acc[t]);
        }
    }
};

}  // namespace

void gemm16_iq4_xs_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    with_tokens<8>(n_tok, [&]<int NT>() {
        iq4_xs_gemm16<NT>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace strata::kernels::cpu::detail
