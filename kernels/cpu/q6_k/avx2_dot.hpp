// Q6_K x Q8_K on the GGUF layout, AVX2 (avx2.cpp) and AVX2 with AVX-VNNI (avxvnni.cpp). Codes are
// unpacked unsigned (0..63); the -32 bias is applied once per super-block through the activation's
// bsums: sum(sc * (q - 32) . a) = sum(sc * q . a) - 32 * sum(sc * bsum). Each pair of sub-blocks takes
// vpmaddubsw, then its two int16 scales by vpmaddwd (AVX-VNNI: vpdpwssd, the same int32 sum in one step),
// so both forms give the same bits.
// Included by one source file per ISA: everything here is internal to it.
#pragma once

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q6_K;
using formats::block_q8_K;
using formats::QK_K;

template <int NT, bool Vnni>
struct q6_k_dot_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q6_K*>(w);
        const block_q8_K* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
        const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03), bits45 = _mm256_set1_epi8(0x30);
        // Byte shuffles (within each 128-bit half) picking int16 scale 2k in the low half and 2k + 1 in
        // the high one, out of 8 scales repeated in both halves.
        __m256i pick[4];
        for (int k = 0; k < 4; ++k)
            pick[k] = _mm256_setr_epi64x(0x0100010001000100LL + 0x0404040404040404LL * k,
                                         0x0100010001000100LL + 0x0404040404040404LL * k,
                                         0x0302030203020302LL + 0x0404040404040404LL * k,
                                         0x0302030203020302LL + 0x0404040404040404LL * k);

        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

        for (int64_t i = 0; i < n / QK_K; ++i) {
            prefetch_weights<sizeof(block_q6_K)>(x + i);
            const float d = half_to_float(x[i].d);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
            const __m256i sc_half[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),  // scales 0..7, twice
                                        _mm256_permute2x128_si256(sc16, sc16, 0x11)};  // 8..15, twice

            __m256i sumi[NT], bias[NT];  // bias: sum(sc * bsum) per pair of sub-blocks
            for (int t = 0; t < NT; ++t) {
                const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums));
                bias[t] = _mm256_madd_epi16(sc16, bsums);
                sumi[t] = _mm256_setzero_si256();
            }
            // j: 128 elements from ql[64j .. 64j+63] (low / high nibbles) and qh[32j .. 32j+31] (2 bits each).
            for (int j = 0; j < QK_K / 128; ++j) {
                const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh + 32 * j));
                const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].ql + 64 * j));
                const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].ql + 64 * j + 32));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4));
                q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
                for (int k = 0; k < 4; ++k) {
                    const __m256i scale = _mm256_shuffle_epi8(sc_half[j], pick[k]);  // 8j + 2k low, 8j + 2k + 1 high
                    for (int t = 0; t < NT; ++t) {
                        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs + 128 * j + 32 * k));
                        sumi[t] = madd_add_epi16<Vnni>(sumi[t], scale, _mm256_maddubs_epi16(q[k], q8));
                    }
                }
            }
            for (int t = 0; t < NT; ++t) {
                const __m256i total = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(bias[t], 5));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d * d), _mm256_cvtepi32_ps(total), acc[t]);
            }
        }
        for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
    }
};

}  // namespace
}  // namespace strata::kernels::cpu::detail
