// Internal: SIMD helpers for the AVX-512 kernel files only (their vectors cross function boundaries, which
// files built without -mavx512f must not see). Every helper is `static`, as in x86.hpp.
#pragma once

#include "cpu/detail/x86.hpp"

namespace strata::kernels::cpu::detail {

// The 4 bytes at p in every dword lane (a token's 4 activation bytes for 16 rows).
static inline __m512i broadcast_dword(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi32(v);
}

// vpdpbusd(acc, w, the 4 bytes at p in every lane), with p as the instruction's {1to16} broadcast operand:
// GCC 12 loads the broadcast into a register of its own first (clang folds it), an extra instruction and
// register per product that left the many-token kernels spilling their accumulators. Same result.
static inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const void* p) {
#if defined(__clang__)
    return _mm512_dpbusd_epi32(acc, w, broadcast_dword(p));
#else
    struct dword {
        int32_t v;
    } __attribute__((may_alias));
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*static_cast<const dword*>(p)));
    return acc;
#endif
}

// Two rows of 16 int16 words (words 0-15 and 16-31) as 16 dword lanes, lane r the pair (word r, word 16 + r):
// the per-row int16 pairs that vpdpwssd multiplies by a broadcast pair.
static inline __m512i row_pairs_epi16(__m512i words) {
    alignas(64) static constexpr int16_t index[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512(index), words);
}

// Lane r: sum over the 8 sub-blocks j of a Q8_K block of v_j[r] * S_j (S_j = bsums[2j] + bsums[2j + 1]), where
// pairs[p] holds row r's (v_2p, v_2p+1) as int16 (row_pairs_epi16): four vpdpwssd on broadcast sum pairs.
static inline __m512i sub_block_dot(const __m512i pairs[4], const int16_t* bsums) {
    const __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)), _mm256_set1_epi16(1));
    alignas(32) int32_t packed[8];  // dwords 0, 1, 4, 5 hold (S0, S1), (S2, S3), (S4, S5), (S6, S7)
    _mm256_store_si256(reinterpret_cast<__m256i*>(packed), _mm256_packs_epi32(s32, s32));
    __m512i sum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), pairs[0], _mm512_set1_epi32(packed[0]));
    sum = _mm512_dpwssd_epi32(sum, pairs[1], _mm512_set1_epi32(packed[1]));
    sum = _mm512_dpwssd_epi32(sum, pairs[2], _mm512_set1_epi32(packed[4]));
    return _mm512_dpwssd_epi32(sum, pairs[3], _mm512_set1_epi32(packed[5]));
}

}  // namespace strata::kernels::cpu::detail
