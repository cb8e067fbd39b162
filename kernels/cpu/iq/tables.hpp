// Internal: tables the code book kernels derive from the format grids (formats/iq_grids.inc), defined once
// in iq/tables.cpp (constant-initialized, in a file built without ISA flags) for the AVX2 and AVX-512 files.
#pragma once

#include <array>
#include <cstdint>

namespace strata::kernels::cpu::detail {

// IQ1 grid entries as 8 (g + 1) per byte (0, 8, 16) for g in -1..1 of iq1s_grid: 2048 entries.
extern const std::array<uint64_t, 2048> iq1_u_grid_data;
inline const uint64_t* iq1_u_grid() { return iq1_u_grid_data.data(); }

}  // namespace strata::kernels::cpu::detail
