// Internal: unpacking of the 12-byte 6-bit scale/min field of Q4_K and Q5_K (no intrinsics).
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::kernels::cpu::detail {

// packed: block_q4_K::scales -> out bytes 0..7 = the 8 sub-block scales, bytes 8..15 = the 8 mins.
static inline void unpack_k4_scales(const uint8_t* packed, uint32_t out[4]) {
    constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    uint32_t u[3];
    std::memcpy(u, packed, 12);
    out[0] = u[0] & low6;                                         // scales 0..3
    out[1] = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);         // scales 4..7
    out[2] = u[1] & low6;                                         // mins 0..3
    out[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);  // mins 4..7
}

}  // namespace strata::kernels::cpu::detail
