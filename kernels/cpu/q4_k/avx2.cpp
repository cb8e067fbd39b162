// Q4_K x Q8_K, AVX2. Per super-block: sum over 8 sub-blocks of sc * (q . a) in int32, minus
// dmin * sum(m * bsum) through the activation's bsums, as ggml's AVX2 kernel.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q4_K;
using formats::block_q8_K;
using formats::QK_K;

template <int NT>
struct q4_k_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q4_K*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m256i low4 = _mm256_set1_epi8(0x0F);

        const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
        __m256 acc[NT];    // d * sum(sc * q . a)
        __m256 acc_m[NT];  // -dmin * sum(m * bsum)
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps(), acc_m[t] = _mm256_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_q4_K)>(x + i);
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
            // j: 64 elements = sub-blocks 2j (low nibbles of 32 bytes) and 2j + 1 (high nibbles).
            for (int j = 0; j < QK_K / 64; ++j) {
                const __m256i scale_l = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 1) << 8 | 4 * j)));
                const __m256i scale_h = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 3) << 8 | (4 * j + 2))));
                const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * j));
                const __m256i q4l = _mm256_and_si256(q4, low4);
                const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
                for (int t = 0; t < NT; ++t) {
                    const int8_t* q8 = y[t][i].qs + 64 * j;
                    const __m256i q8l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8));
                    const __m256i q8h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32));
                    const __m256i pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
                    const __m256i ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
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

void dot_q4_k_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q4_k_avx2>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
