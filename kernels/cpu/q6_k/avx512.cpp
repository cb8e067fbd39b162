// Q6_K x Q8_K, AVX-512 (BW, VNNI: vpdpwssd applies the sub-block scales). 128 elements per step as two 64-byte vectors of consecutive codes:
// ql's low nibbles with qh bits 0-1 / 2-3 give elements 0..63, its high nibbles with bits 4-5 / 6-7
// give 64..127. The -32 bias goes through the bsums as in the AVX2 kernel.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q6_K;
using formats::block_q8_K;
using formats::QK_K;

// Word index vector: lane l -> scale s + l / 8 (each 16-element sub-block is 8 words after maddubs).
static inline __m512i scale_quad_index(int s) {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) idx[l] = static_cast<int16_t>(s + l / 8);
    return _mm512_load_si512(idx);
}

template <int NT>
struct q6_k_avx512 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q6_K*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
        const __m512i quad_index[4] = {scale_quad_index(0), scale_quad_index(4), scale_quad_index(8), scale_quad_index(12)};

        __m512 acc[8];  // tokens >= NT stay 0
        for (auto& v : acc) v = _mm512_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_q6_K)>(x + i);
            const float d = half_to_float(x[i].d);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
            const __m512i scales = _mm512_castsi256_si512(sc16);

            __m512i sumi[NT];
            for (int j = 0; j < QK_K / 128; ++j) {
                const __m512i ql = _mm512_loadu_si512(x[i].ql + 64 * j);
                const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh + 32 * j));
                const __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
                const __m512i w0 = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_slli_epi16(_mm512_and_si512(hh, low2), 4));
                const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                                   _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hh, 4), low2), 4));
                const __m512i s0 = _mm512_permutexvar_epi16(quad_index[2 * j], scales);
                const __m512i s1 = _mm512_permutexvar_epi16(quad_index[2 * j + 1], scales);
                for (int t = 0; t < NT; ++t) {
                    const int8_t* q8 = y[t][i].qs + 128 * j;
                    const __m512i p0 = _mm512_madd_epi16(_mm512_maddubs_epi16(w0, _mm512_loadu_si512(q8)), s0);
                    sumi[t] = j == 0 ? p0 : _mm512_add_epi32(sumi[t], p0);
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(w1, _mm512_loadu_si512(q8 + 64)), s1);
                }
            }
            for (int t = 0; t < NT; ++t) {
                // sum(sc * bsum) per pair of sub-blocks: the -32 offset of the 6-bit values
                const __m256i bias = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums)));
                const __m512i total =
                    _mm512_sub_epi32(sumi[t], _mm512_zextsi256_si512(_mm256_slli_epi32(bias, 5)));
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d * d), _mm512_cvtepi32_ps(total), acc[t]);
            }
        }
        store_lane_sums<NT>(acc, out);
    }
};

}  // namespace

void dot_q6_k_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q6_k_avx512, 8>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
