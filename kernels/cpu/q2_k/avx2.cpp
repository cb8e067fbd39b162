// Q2_K x Q8_K, AVX2 (as ggml's AVX2 kernel): 2-bit codes times the 4-bit sub-block scales through
// maddubs / madd, and the 4-bit mins through the activation's bsums.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q2_K;
using formats::block_q8_K;
using formats::QK_K;

// Word shuffle: lane 0 gets word 2k of the source lane, lane 1 gets word 2k + 1 (the scales of the
// two 16-element sub-blocks a 32-byte vector of codes covers).
static inline __m256i scale_pair_shuffle(int k) {
    const short lo = static_cast<short>((4 * k + 1) << 8 | (4 * k)), hi = static_cast<short>((4 * k + 3) << 8 | (4 * k + 2));
    return _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi));
}

template <int NT>
struct q2_k_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q2_K*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m256i low2 = _mm256_set1_epi8(3);
        const __m128i low4 = _mm_set1_epi8(0xF);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_q2_K)>(x + i);
            const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
            const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
            const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
            const __m256i all_scales = _mm256_cvtepi8_epi16(_mm_and_si128(packed, low4));
            const __m256i scales[2] = {_mm256_permute2x128_si256(all_scales, all_scales, 0x00),
                                       _mm256_permute2x128_si256(all_scales, all_scales, 0x11)};
            __m256i sumi[NT];
            for (int t = 0; t < NT; ++t) {
                const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-y[t][i].d * dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bsums)), acc[t]);
                sumi[t] = _mm256_setzero_si256();
            }
            // j: 128 elements; code 32k + l is bits 2k..2k+1 of qs[32j + l].
            for (int j = 0; j < QK_K / 128; ++j) {
                const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * j));
                const __m256i q[4] = {_mm256_and_si256(q2, low2), _mm256_and_si256(_mm256_srli_epi16(q2, 2), low2),
                                      _mm256_and_si256(_mm256_srli_epi16(q2, 4), low2), _mm256_and_si256(_mm256_srli_epi16(q2, 6), low2)};
                for (int k = 0; k < 4; ++k) {
                    const __m256i scale = _mm256_shuffle_epi8(scales[j], scale_pair_shuffle(k));
                    for (int t = 0; t < NT; ++t) {
                        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs + 128 * j + 32 * k));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q[k], q8)));
                    }
                }
            }
            for (int t = 0; t < NT; ++t)
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
        for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
    }
};

}  // namespace

void dot_q2_k_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q2_k_avx2>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
