// IQ4_XS x Q8_K, AVX2: codes through the 16-entry non-linear table (pshufb), then signed x signed
// maddubs and the 6-bit sub-block scales (bias -32) as int16 multipliers.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_iq4_xs;
using formats::block_q8_K;
using formats::QK_K;

// Signed 6-bit scale of sub-block ib (0..7).
static inline int iq4_xs_scale(const block_iq4_xs& b, int ib) {
    const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    const int high = (b.scales_h >> (2 * ib)) & 3;
    return (low | (high << 4)) - 32;
}

template <int NT>
struct iq4_xs_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_iq4_xs*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(formats::kvalues_iq4nl));
        const __m128i low4 = _mm_set1_epi8(0x0F);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_iq4_xs)>(x + i);
            __m256i sumi[NT];
            for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
            for (int ib = 0; ib < QK_K / 32; ++ib) {
                const __m128i q4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16 * ib));
                const __m256i wq = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q4, 4), low4)),
                                                    _mm_shuffle_epi8(values, _mm_and_si128(q4, low4)));
                const __m256i aw = _mm256_sign_epi8(wq, wq);
                const __m256i scale = _mm256_set1_epi16(static_cast<short>(iq4_xs_scale(x[i], ib)));
                for (int t = 0; t < NT; ++t) {
                    const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs + 32 * ib));
                    const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(q8, wq));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p16, scale));
                }
            }
            const float d = half_to_float(x[i].d);
            for (int t = 0; t < NT; ++t)
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
        for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
    }
};

}  // namespace

void dot_iq4_xs_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq4_xs_avx2>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
