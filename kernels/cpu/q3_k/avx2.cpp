// Q3_K x Q8_K, AVX2 (as ggml's AVX2 kernel): code = low2 | hbit << 2, value = code - 4, computed as
// maddubs(low2, a) - maddubs(4 * !hbit, a); 6-bit signed sub-block scales (bias 32) through madd.
#include <cstring>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q3_K;
using formats::block_q8_K;
using formats::QK_K;

static inline __m256i scale_pair_shuffle(int k) {
    const short lo = static_cast<short>((4 * k + 1) << 8 | (4 * k)), hi = static_cast<short>((4 * k + 3) << 8 | (4 * k + 2));
    return _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi));
}

// The 16 signed scales (6 bits, bias 32) of a super-block as int8 bytes 0..15.
static inline __m128i q3_k_scales(const uint8_t* packed) {
    constexpr uint32_t low4 = 0x0f0f0f0f, low2 = 0x03030303;
    uint32_t aux[3];
    std::memcpy(aux, packed, 12);
    const __m128i scales = _mm_set_epi32(static_cast<int>(((aux[1] >> 4) & low4) | (((aux[2] >> 6) & low2) << 4)),
                                         static_cast<int>(((aux[0] >> 4) & low4) | (((aux[2] >> 4) & low2) << 4)),
                                         static_cast<int>((aux[1] & low4) | (((aux[2] >> 2) & low2) << 4)),
                                         static_cast<int>((aux[0] & low4) | ((aux[2] & low2) << 4)));
    return _mm_sub_epi8(scales, _mm_set1_epi8(32));
}

template <int NT>
struct q3_k_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q3_K*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m256i low2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_q3_K)>(x + i);
            const float d = half_to_float(x[i].d);
            const __m256i all_scales = _mm256_cvtepi8_epi16(q3_k_scales(x[i].scales));
            const __m256i scales[2] = {_mm256_permute2x128_si256(all_scales, all_scales, 0x00),
                                       _mm256_permute2x128_si256(all_scales, all_scales, 0x11)};
            __m256i hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].hmask));  // shifted 1 bit per k
            __m256i sumi[NT];
            for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
            // j: 128 elements; code 32k + l: bits 2k..2k+1 of qs[32j + l], high bit 4j + k of hmask[l].
            for (int j = 0; j < QK_K / 128; ++j) {
                const __m256i q3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * j));
                for (int k = 0; k < 4; ++k) {
                    const __m256i ql = _mm256_and_si256(k == 0 ? q3 : _mm256_srl_epi16(q3, _mm_cvtsi32_si128(2 * k)), low2);
                    const __m256i qh = _mm256_slli_epi16(_mm256_andnot_si256(hbits, one), 2);  // 4 where the bit is clear
                    hbits = _mm256_srli_epi16(hbits, 1);
                    const __m256i scale = _mm256_shuffle_epi8(scales[j], scale_pair_shuffle(k));
                    for (int t = 0; t < NT; ++t) {
                        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs + 128 * j + 32 * k));
                        const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, q8), _mm256_maddubs_epi16(qh, q8));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(scale, p16));
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

void dot_q3_k_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q3_k_avx2>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
