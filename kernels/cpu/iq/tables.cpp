// The code book kernels' derived tables (iq/tables.hpp), computed at compile time from the grid data.
#include "cpu/iq/tables.hpp"

#include <array>
#include <cstddef>

namespace strata::kernels::cpu::detail {
namespace {

// The grids as constants this file can compute with (formats/iq_grids.cpp holds the ones kernels read).
namespace grids {
#define STRATA_IQ_GRID(type, name, size) constexpr type name[size] =
#include "formats/iq_grids.inc"
#undef STRATA_IQ_GRID
}  // namespace grids

constexpr std::array<uint64_t, 2048> make_iq1_u_grid() {
    std::array<uint64_t, 2048> g{};
    for (std::size_t e = 0; e < g.size(); ++e)
        for (int j = 0; j < 8; ++j) {
            const auto v = static_cast<int8_t>((grids::iq1s_grid[e] >> (8 * j)) & 0xff);
            g[e] |= uint64_t{static_cast<uint8_t>(8 * (v + 1))} << (8 * j);
        }
    return g;
}

}  // namespace

alignas(64) constexpr std::array<uint64_t, 2048> iq1_u_grid_data = make_iq1_u_grid();

}  // namespace strata::kernels::cpu::detail
