// IQ4_XS x Q8_K, AVX2: codes through the 16-entry non-linear table (pshufb), then signed x signed
// maddubs and the 6-bit sub-block scales (bias -32) as int16 multipliers. Two sub-blocks per step:
// 256-bit lookups, then a lane swap puts each sub-block's 32 codes in element order.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_iq4_xs;
using formats::block_q8_K;
using formats::QK_K;

// The 8 signed sub-block scales ((scales_l nibble | 2 bits of scales_h << 4) - 32), each as an int16
// repeated in both halves of dword ib, so a vpermd with index ib broadcasts it to all 16 words.
static inline __m256i iq4_xs_scales(const block_iq4_xs& b) {
    uint32_t low;
    std::memcpy(&low, b.scales_l, sizeof(low));
    const __m256i nibbles = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(low)),
                                                               _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                             _mm256_set1_epi32(0xF));
    const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                          _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(nibbles, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
    return _mm256_or_si256(_mm256_and_si256(ls, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(ls, 16));
}

template <int NT>
struct iq4_xs_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_iq4_xs*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(formats::kvalues_iq4nl)));
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_iq4_xs)>(x + i);
            const __m256i scales = iq4_xs_scales(x[i]);
            __m256i sumi[NT];
            for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
            for (int p = 0; p < QK_K / 64; ++p) {
                // 32 bytes = sub-blocks 2p (lane 0) and 2p + 1 (lane 1); low nibbles are elements 0..15.
                const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * p));
                const __m256i lo = _mm256_shuffle_epi8(values, _mm256_and_si256(q4, low4));
                const __m256i hi = _mm256_shuffle_epi8(values, _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4));
                const __m256i w0 = _mm256_permute2x128_si256(lo, hi, 0x20);  // sub-block 2p in element order
                const __m256i w1 = _mm256_permute2x128_si256(lo, hi, 0x31);  // sub-block 2p + 1
                const __m256i aw0 = _mm256_sign_epi8(w0, w0), aw1 = _mm256_sign_epi8(w1, w1);
                const __m256i s0 = _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(2 * p));
                const __m256i s1 = _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(2 * p + 1));
                for (int t = 0; t < NT; ++t) {
                    const int8_t* q8 = y[t][i].qs + 64 * p;
                    const __m256i q8a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8));
                    const __m256i q8b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32));
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw0, _mm256_sign_epi8(q8a, w0)), s0);
                    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw1, _mm256_sign_epi8(q8b, w1)), s1);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
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
