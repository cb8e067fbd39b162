// The lattice code books of the IQ1 / IQ2 / IQ3 formats. Entry i packs 8 (IQ2, IQ1) or 4 (IQ3) values,
// value j in byte j counted from the least significant (ggml reads the entries as byte arrays on
// little-endian machines). IQ2 values are 8, 25 or 43; IQ3_XXS's 4 .. 62 and IQ3_S's 1 .. 15 (odd);
// IQ1's are signed bytes -1, 0, 1. The data is in iq_grids.inc, which the CUDA kernels include too.
#pragma once

#include <cstdint>

namespace strata::formats {

extern const uint64_t iq2xxs_grid[256];
extern const uint64_t iq2xs_grid[512];
extern const uint64_t iq2s_grid[1024];
extern const uint32_t iq3xxs_grid[256];
extern const uint32_t iq3s_grid[512];
extern const uint64_t iq1s_grid[2048];

// Value j of an entry: unsigned for the IQ2 / IQ3 grids, signed for iq1s_grid.
constexpr int grid_value(uint64_t entry, int j) { return static_cast<int>((entry >> (8 * j)) & 0xff); }
constexpr int grid_value_signed(uint64_t entry, int j) { return static_cast<int8_t>((entry >> (8 * j)) & 0xff); }

}  // namespace strata::formats
