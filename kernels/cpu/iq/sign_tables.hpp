// Internal: sign bytes for the code book kernels. sign_pm1[s] holds 8 bytes, byte j = -1 where bit j of s
// is set and +1 elsewhere (a _mm256_sign_epi8 operand); sign_even[c] = sign_pm1[even_signs(c)] for the
// 7-bit sign codes of IQ2_XXS, IQ2_XS and IQ3_XXS.
#pragma once

#include <array>
#include <cstdint>

#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {

constexpr uint64_t sign_bytes(unsigned s) {
    uint64_t v = 0;
    for (int j = 0; j < 8; ++j) v |= uint64_t{(s >> j) & 1 ? 0xffu : 0x01u} << (8 * j);
    return v;
}

inline constexpr std::array<uint64_t, 256> sign_pm1 = [] {
    std::array<uint64_t, 256> t{};
    for (unsigned s = 0; s < 256; ++s) t[s] = sign_bytes(s);
    return t;
}();

inline constexpr std::array<uint64_t, 128> sign_even = [] {
    std::array<uint64_t, 128> t{};
    for (unsigned c = 0; c < 128; ++c) t[c] = sign_bytes(formats::even_signs(c));
    return t;
}();

}  // namespace strata::kernels::cpu::detail
