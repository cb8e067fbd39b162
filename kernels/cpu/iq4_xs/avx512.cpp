// IQ4_XS x Q8_K, AVX-512 (BW). Four sub-blocks (64 bytes of codes) per step: table lookups on the low
// and high nibbles, regrouped by 128-bit lanes into two vectors of 64 consecutive elements; signs move
// from the weights onto the activation with a mask (AVX-512 has no vpsignb).
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_iq4_xs;
using formats::block_q8_K;
using formats::QK_K;

// Word index vector broadcasting scale s (lanes 0..15) and s + 1 (lanes 16..31).
static inline __m512i scale_pair_index(int s) {
    return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s)), _mm256_set1_epi16(static_cast<short>(s + 1)), 1);
}

template <int NT>
struct iq4_xs_avx512 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_iq4_xs*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m512i values =
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(formats::kvalues_iq4nl)));
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        // qword indices: lanes (lo0, hi0, lo1, hi1) and (lo2, hi2, lo3, hi3) of (lo, hi).
        const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        const __m512i second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
        const __m512i pair_index[4] = {scale_pair_index(0), scale_pair_index(2), scale_pair_index(4), scale_pair_index(6)};
        __m512 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_iq4_xs)>(x + i);
            alignas(16) int16_t ls[8];
            for (int ib = 0; ib < 8; ++ib) {
                const int low = (x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
                const int high = (x[i].scales_h >> (2 * ib)) & 3;
                ls[ib] = static_cast<int16_t>((low | (high << 4)) - 32);
            }
            const __m512i scales = _mm512_castsi128_si512(_mm_load_si128(reinterpret_cast<const __m128i*>(ls)));
            __m512i sumi[NT];
            for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
            for (int k = 0; k < 2; ++k) {
                const __m512i q4 = _mm512_loadu_si512(x[i].qs + 64 * k);
                const __m512i lo = _mm512_shuffle_epi8(values, _mm512_and_si512(q4, low4));
                const __m512i hi = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(q4, 4), low4));
                const __m512i w[2] = {_mm512_permutex2var_epi64(lo, first, hi), _mm512_permutex2var_epi64(lo, second, hi)};
                for (int h = 0; h < 2; ++h) {
                    const __m512i aw = _mm512_abs_epi8(w[h]);
                    const __mmask64 negative = _mm512_movepi8_mask(w[h]);
                    const __m512i scale = _mm512_permutexvar_epi16(pair_index[2 * k + h], scales);
                    for (int t = 0; t < NT; ++t) {
                        const __m512i q8 = _mm512_loadu_si512(y[t][i].qs + 128 * k + 64 * h);
                        const __m512i sq8 = _mm512_mask_sub_epi8(q8, negative, _mm512_setzero_si512(), q8);
                        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sq8), scale));
                    }
                }
            }
            const float d = half_to_float(x[i].d);
            for (int t = 0; t < NT; ++t)
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * y[t][i].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
        }
        for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
    }
};

}  // namespace

void dot_iq4_xs_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq4_xs_avx512>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
