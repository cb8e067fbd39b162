// IQ4_XS x Q8_K, AVX-512 (BW, VNNI: vpdpwssd applies the sub-block scales). Four sub-blocks (64 bytes of codes) per step: table lookups on the low
// and high nibbles are regrouped by 128-bit lanes into two vectors of 64 consecutive codes, looked up in
// a table of |value|, and the signs (code < 8) move onto the activation with a mask (no vpsignb here).
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

// The 8 signed sub-block scales of a super-block as int16 words 0..7:
// ((scales_l nibble) | (2 bits of scales_h) << 4) - 32.
static inline __m128i iq4_xs_scales(const block_iq4_xs& b) {
    uint32_t low;
    std::memcpy(&low, b.scales_l, sizeof(low));
    const __m128i nibbles = _mm_srlv_epi16(_mm_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(low)),
                                                                              _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0))),
                                           _mm_setr_epi16(0, 4, 0, 4, 0, 4, 0, 4));
    const __m128i high = _mm_srlv_epi16(_mm_set1_epi16(static_cast<short>(b.scales_h)), _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14));
    const __m128i ls = _mm_or_si128(_mm_and_si128(nibbles, _mm_set1_epi16(0xF)),
                                    _mm_slli_epi16(_mm_and_si128(high, _mm_set1_epi16(3)), 4));
    return _mm_sub_epi16(ls, _mm_set1_epi16(32));
}

template <int NT>
struct iq4_xs_avx512 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_iq4_xs*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        // |kvalues_iq4nl|: codes 0..7 are the negative entries, so the sign is "bit 3 clear".
        const __m512i abs_values = _mm512_broadcast_i32x4(
            _mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
        const __m512i low4 = _mm512_set1_epi8(0x0F), bit3 = _mm512_set1_epi8(0x08);
        // qword indices: lanes (lo0, hi0, lo1, hi1) and (lo2, hi2, lo3, hi3) of (lo, hi).
        const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        const __m512i second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
        const __m512i pair_index[4] = {scale_pair_index(0), scale_pair_index(2), scale_pair_index(4), scale_pair_index(6)};
        __m512 acc[8];  // tokens >= NT stay 0
        for (auto& v : acc) v = _mm512_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_iq4_xs)>(x + i);
            const __m512i scales = _mm512_castsi128_si512(iq4_xs_scales(x[i]));
            __m512i sumi[NT];
            for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
            for (int k = 0; k < 2; ++k) {
                // 64 bytes = sub-blocks 4k..4k+3 of 16 bytes: low nibbles are elements 0..15, high 16..31.
                const __m512i q4 = _mm512_loadu_si512(x[i].qs + 64 * k);
                const __m512i lo = _mm512_and_si512(q4, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), low4);
                const __m512i codes[2] = {_mm512_permutex2var_epi64(lo, first, hi), _mm512_permutex2var_epi64(lo, second, hi)};
                for (int h = 0; h < 2; ++h) {
                    const __m512i aw = _mm512_shuffle_epi8(abs_values, codes[h]);
                    const __mmask64 negative = _mm512_testn_epi8_mask(codes[h], bit3);
                    const __m512i scale = _mm512_permutexvar_epi16(pair_index[2 * k + h], scales);
                    for (int t = 0; t < NT; ++t) {
                        const __m512i q8 = _mm512_loadu_si512(y[t][i].qs + 128 * k + 64 * h);
                        const __m512i sq8 = _mm512_mask_sub_epi8(q8, negative, _mm512_setzero_si512(), q8);
                        sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(aw, sq8), scale);
                    }
                }
            }
            const float d = half_to_float(x[i].d);
            for (int t = 0; t < NT; ++t)
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * y[t][i].d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
        }
        store_lane_sums<NT>(acc, out);
    }
};

}  // namespace

void dot_iq4_xs_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq4_xs_avx512, 8>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
