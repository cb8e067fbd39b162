// Internal: small SIMD helpers for the AVX2 / AVX-512 kernel files. Every helper is `static` so each
// translation unit keeps its own copy compiled with its own ISA flags (no ODR mixing of AVX2 and
// AVX-512 code). Include only from files compiled with at least -mavx2 -mfma -mf16c.
#pragma once

// GCC 12 warns about the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics when they
// are inlined; the pragma covers the intrinsic headers' lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "cpu/kernels.hpp"

namespace strata::kernels::cpu::detail {

// Software prefetch of the weight stream, prefetch_distance bytes ahead of the block being read, one
// prefetch per cache line of the block.
inline constexpr int prefetch_distance = weight_prefetch_bytes;

template <int Bytes>
static inline void prefetch_weights(const void* block) {
    const char* p = static_cast<const char*>(block) + prefetch_distance;
    for (int offset = 0; offset < Bytes; offset += 64) _mm_prefetch(p + offset, _MM_HINT_T0);
}

// Part `part` of `parts` of the prefetches of prefetch_weights<Bytes>(block), Distance bytes ahead: spread
// over a block's work, a large block does not fill the line fill buffers with one burst of prefetches.
template <int Bytes, int Distance = prefetch_distance>
static inline void prefetch_weights_part(const void* block, int part, int parts) {
    constexpr int lines = (Bytes + 63) / 64;
    const char* p = static_cast<const char*>(block) + Distance;
    for (int l = part * lines / parts; l < (part + 1) * lines / parts; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

// One line of a block's prefetches, Distance bytes ahead, for a loop that reads the block a line per
// iteration. Keep that loop rolled (#pragma GCC unroll 1): unrolled, the compiler schedules a block's
// prefetches together again, and the burst fills the line fill buffers ahead of the block's loads.
// Locality 3 is prefetcht0; 2 (prefetch_weight_line_l2) is prefetcht1, the line into L2 only, so a
// request waiting on memory holds no L1 miss buffer: the AVX2 Q8_0 decode loop reads faster so, the
// others do not.
template <int Distance = prefetch_distance, int Locality = 3>
static inline void prefetch_weight_line(const void* block, int line) {
    __builtin_prefetch(static_cast<const char*>(block) + Distance + 64 * line, 0, Locality);
}
static inline void prefetch_weight_line_l2(const void* block, int line) {
    prefetch_weight_line<prefetch_distance, 2>(block, line);
}

// The rows16 kernels prefetch a line per step up to this many tokens (the decode forms, where memory
// sets the pace); with more, the arithmetic sets it, the rolled loop is slower, and a block's lines are
// prefetched before it instead.
inline constexpr int spread_prefetch_tokens = 2;

// acc + the int16 pairs of a times those of b, in int32: vpmaddwd then an add, or AVX-VNNI's vpdpwssd
// (Vnni: only from files built with -mavxvnni), the same sums either way.
template <bool Vnni>
static inline __m256i madd_add_epi16(__m256i acc, __m256i a, __m256i b) {
    if constexpr (Vnni)
        return _mm256_dpwssd_avx_epi32(acc, a, b);
    else
        return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

static inline float hsum(__m256 v) {
    return hsum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

// Lane t (t < 8) = the sum of the 16 lanes of a[t], added in _mm512_reduce_add_ps's order (lanes l + l+8,
// then + 4, + 2, + 1), for 8 vectors at once: 24 instructions instead of 8 separate reductions.
static inline __m256 reduce_add_8x16(const __m512 a[8]) {
    __m512 s[4];
    for (int i = 0; i < 4; ++i)
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    // 128-bit chunk c of t0123 (t4567): vector c (4 + c) folded to 4 lanes
    const __m512 t0123 = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x88), _mm512_shuffle_f32x4(s[0], s[1], 0xDD));
    const __m512 t4567 = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], 0x88), _mm512_shuffle_f32x4(s[2], s[3], 0xDD));
    // chunk c: [c: x0+x2, x1+x3, 4+c: x0+x2, x1+x3], then lanes 0 and 2 hold the sums of c and 4 + c
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0123, t4567, 0x44), _mm512_shuffle_ps(t0123, t4567, 0xEE));
    const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0xB1));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, v));
}

// out[t] = the lane sum of acc[t], t < NT, in _mm512_reduce_add_ps's order whatever NT (so a token's
// result does not depend on how many tokens share the call); acc[t >= NT] must be zero.
template <int NT>
static inline void store_lane_sums(const __m512 acc[8], float* out) {
    if constexpr (NT < 4) {
        for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
    } else {
        alignas(32) float sums[8];
        _mm256_store_ps(sums, reduce_add_8x16(acc));
        for (int t = 0; t < NT; ++t) out[t] = sums[t];
    }
}

// Q4_K / Q5_K, AVX-512: superblock i of tokens t < NT is summed up (sumi[t]: sub-block scales times the
// quant . activation products): acc[t] += y.d * (d * sumi[t] - dmin * (mins . bsums)), the mins term in
// lanes 0..7 (mins: m[j] in words 2j and 2j + 1).
template <int NT, class BlockQ8K>
static inline void add_k4_superblock(__m512 acc[8], const BlockQ8K* const y[NT], int64_t i, float d, float dmin,
                                     __m256i mins, const __m512i sumi[NT]) {
    const __m512 dv = _mm512_set1_ps(d);
    const __m256 dminv = _mm256_set1_ps(dmin);
    for (int t = 0; t < NT; ++t) {
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums));
        const __m256 m = _mm256_mul_ps(dminv, _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bsums)));
        const __m512 z = _mm512_fmsub_ps(dv, _mm512_cvtepi32_ps(sumi[t]), _mm512_zextps256_ps512(m));
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d), z, acc[t]);
    }
}

// The packed 6-bit scales and mins of Q4_K / Q5_K (12 bytes at `packed`; reads 16, the block goes on)
// -> bytes 0..7 = the 8 sub-block scales, bytes 8..15 = the 8 mins:
//   sc[0..3] = p[0..3] & 63,                 m[0..3] = p[4..7] & 63,
//   sc[4..7] = (p[8..11] & 15) | (p[0..3] >> 6) << 4,   m[4..7] = (p[8..11] >> 4) | (p[4..7] >> 6) << 4.
static inline __m128i unpack_k4_scales(const uint8_t* packed) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
    const __m128i a = _mm_shuffle_epi8(p, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i b = _mm_shuffle_epi8(p, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i low = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i top_nibble = _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i high_bits = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30));  // b's bits 6-7 -> 4-5
    return _mm_or_si128(_mm_or_si128(low, top_nibble), high_bits);
}

// 16 int16 -> 8 f32 sums of adjacent pairs.
static inline __m256 sum_pairs_i16_f32(__m256i p16) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// 16 bytes of nibbles -> 32 bytes: low nibbles in bytes 0..15, high nibbles in bytes 16..31
// (the element order of the 32-element formats).
static inline __m256i unpack_nibbles_32(const uint8_t* qs) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, 0xFF where the bit is set (bit i -> byte i).
static inline __m256i expand_bits_32(const uint8_t* bits) {
    uint32_t x32;
    std::memcpy(&x32, bits, sizeof(x32));
    const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x32)), shuffle);
    const __m256i bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    return _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1));
}

}  // namespace strata::kernels::cpu::detail
