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

// Two rows of 16 int16 words (words 0-15 and 16-31) as 16 dword lanes, lane r the pair (word r, word 16 + r):
// the per-row int16 pairs that vpdpwssd multiplies by a broadcast pair.
static inline __m512i row_pairs_epi16(__m512i words) {
    alignas(64) static constexpr int16_t index[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512(index), words);
}

}  // namespace strata::kernels::cpu::detail
