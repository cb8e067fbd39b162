// Q5_K x Q8_K, AVX2: the Q4_K kernel with the fifth bit of each code taken from qh (bit 2j of qh[l]
// for element 64j + l, bit 2j + 1 for element 64j + 32 + l).
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q5_K;
using formats::block_q8_K;
using formats::QK_K;

template <int NT>
struct q5_k_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q5_K*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);

        const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
        __m256 acc[NT];
        __m256 acc_m[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps(), acc_m[t] = _mm256_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_q5_K)>(x + i);
            const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
            const __m128i scales_mins = unpack_k4_scales(x[i].scales);
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scales_mins, dup_mins));  // m[j] in words 2j, 2j+1
            const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales_mins));  // words 0..7, twice

            __m256i sumi[NT];
            for (int t = 0; t < NT; ++t) {
                const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums));
                acc_m[t] = _mm256_fmadd_ps(_mm256_set1_ps(-y[t][i].d * dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bsums)),
                                           acc_m[t]);
                sumi[t] = _mm256_setzero_si256();
            }
            __m256i hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh));  // shifted 2 bits per j
            for (int j = 0; j < QK_K / 64; ++j) {
                const __m256i scale_l = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 1) << 8 | 4 * j)));
                const __m256i scale_h = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 3) << 8 | (4 * j + 2))));
                const __m256i q5 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * j));
                const __m256i q5l = _mm256_or_si256(_mm256_and_si256(q5, low4),
                                                    _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
                const __m256i q5h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q5, 4), low4),
                                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4));
                hbits = _mm256_srli_epi16(hbits, 2);
                for (int t = 0; t < NT; ++t) {
                    const int8_t* q8 = y[t][i].qs + 64 * j;
                    const __m256i q8l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8));
                    const __m256i q8h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32));
                    const __m256i pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q5l, q8l));
                    const __m256i ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q5h, q8h));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
                }
            }
            for (int t = 0; t < NT; ++t)
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
        for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]) + hsum(acc_m[t]);
    }
};

}  // namespace

void dot_q5_k_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q5_k_avx2>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
