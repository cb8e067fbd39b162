// Activation quantizers, AVX2: Q8_0, Q8_1, Q8_K, bitwise equal to formats::quantize_row. The scale is
// max|x| / 127 (for Q8_0 / Q8_1 stored as half and used rounded), codes are round-to-nearest-even of
// x / d (cvtps uses MXCSR's default rounding, as lrintf does) clamped to [-127, 127].
#include <algorithm>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// max|x| over 32 floats.
static inline float max_abs_32(const float* x) {
    const __m256 m01 = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x)), abs_ps(_mm256_loadu_ps(x + 8)));
    const __m256 m23 = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + 16)), abs_ps(_mm256_loadu_ps(x + 24)));
    return hmax(_mm256_max_ps(m01, m23));
}

// 32 floats * id -> 32 int8 codes in element order, clamped to [-127, 127].
static inline __m256i round_32(const float* x, float id) {
    const __m256 s = _mm256_set1_ps(id);
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), s));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), s));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), s));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    // packs works per 128-bit lane: dwords hold elements 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, ...
    const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return _mm256_max_epi8(ordered, _mm256_set1_epi8(-127));
}

static inline float half_round_trip(float f, uint16_t* half) {
    *half = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    return half_to_float(*half);
}

// Sum of 32 int8 codes.
static inline int sum_codes_32(__m256i q) {
    const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

}  // namespace

void quantize_q8_0_avx2(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<block_q8_0*>(dst);
    for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
        const float d = half_round_trip(max_abs_32(x) / 127.0f, &y[i].d);
        const __m256i q = round_32(x, d != 0.0f ? 1.0f / d : 0.0f);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), q);
    }
}

void quantize_q8_1_avx2(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<block_q8_1*>(dst);
    for (int64_t i = 0; i < n / QK8_1; ++i, x += QK8_1) {
        const float d = half_round_trip(max_abs_32(x) / 127.0f, &y[i].d);
        const __m256i q = round_32(x, d != 0.0f ? 1.0f / d : 0.0f);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), q);
        half_round_trip(d * static_cast<float>(sum_codes_32(q)), &y[i].s);
    }
}

void quantize_q8_K_avx2(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<block_q8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        float amax = 0.0f;
        for (int k = 0; k < QK_K / 32; ++k) amax = std::max(amax, max_abs_32(x + 32 * k));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = d;
        for (int k = 0; k < QK_K / 32; ++k) {
            const __m256i q = round_32(x + 32 * k, id);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + 32 * k), q);
            // bsums of the two 16-code halves.
            const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
            __m256i s = _mm256_hadd_epi32(s32, s32);
            s = _mm256_hadd_epi32(s, s);
            y[i].bsums[2 * k] = static_cast<int16_t>(_mm256_extract_epi32(s, 0));
            y[i].bsums[2 * k + 1] = static_cast<int16_t>(_mm256_extract_epi32(s, 4));
        }
    }
}

}  // namespace strata::kernels::cpu::detail
