// Q4_K x Q8_K, AVX-512 (BW, VNNI). 128 elements per step: 64 bytes of nibbles give four sub-blocks; the
// low and high nibbles are regrouped by 128-bit lanes so each 64-byte vector covers 64 consecutive
// elements and the activation is read with plain loads (the unpacking is shared by all tokens).
// Sub-block scales multiply the maddubs pair sums inside vpdpwssd; the mins go through the bsums.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q4_K;
using formats::block_q8_K;
using formats::QK_K;

// Word index vector broadcasting scale s (lanes 0..15) and s + 1 (lanes 16..31).
static inline __m512i scale_pair_index(int s) {
    return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s)), _mm256_set1_epi16(static_cast<short>(s + 1)), 1);
}

template <int NT>
struct q4_k_avx512 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q4_K*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        const __m512i pair_index[4] = {scale_pair_index(0), scale_pair_index(2), scale_pair_index(4), scale_pair_index(6)};
        const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);

        __m512 acc[8];  // y.d * (d * sum(sc * q . a) - dmin * sum(m * bsum)) (the mins in lanes 0..7); tokens >= NT stay 0
        for (auto& v : acc) v = _mm512_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_q4_K)>(x + i);
            const float d = half_to_float(x[i].d), dmin = half_to_float(x[i].dmin);
            const __m128i scales_mins = unpack_k4_scales(x[i].scales);
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scales_mins, dup_mins));  // m[j] in words 2j, 2j+1
            const __m512i scales = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(scales_mins));  // words 0..7

            __m512i sumi[NT];
            for (int k = 0; k < 2; ++k) {
                // 64 bytes: low nibbles = sub-blocks 4k, 4k+2 (lanes 0-1, 2-3), high = 4k+1, 4k+3.
                const __m512i q4 = _mm512_loadu_si512(x[i].qs + 64 * k);
                const __m512i lo = _mm512_and_si512(q4, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), low4);
                const __m512i w0 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));  // elements 128k + 0..63
                const __m512i w1 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));  // elements 128k + 64..127
                const __m512i s0 = _mm512_permutexvar_epi16(pair_index[2 * k], scales);
                const __m512i s1 = _mm512_permutexvar_epi16(pair_index[2 * k + 1], scales);
                for (int t = 0; t < NT; ++t) {
                    const int8_t* q8 = y[t][i].qs + 128 * k;
                    const __m512i p0 = _mm512_madd_epi16(_mm512_maddubs_epi16(w0, _mm512_loadu_si512(q8)), s0);
                    sumi[t] = k == 0 ? p0 : _mm512_add_epi32(sumi[t], p0);
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(w1, _mm512_loadu_si512(q8 + 64)), s1);
                }
            }
            add_k4_superblock<NT>(acc, y, i, d, dmin, mins, sumi);
        }
        store_lane_sums<NT>(acc, out);
    }
};

}  // namespace

void dot_q4_k_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q4_k_avx512, 8>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
