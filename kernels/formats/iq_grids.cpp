// The IQ1 / IQ2 / IQ3 code books (declared in iq_grids.hpp; the data in iq_grids.inc).
#include "formats/iq_grids.hpp"

namespace strata::formats {

#define STRATA_IQ_GRID(type, name, size) const type name[size] =
#include "formats/iq_grids.inc"
#undef STRATA_IQ_GRID

}  // namespace strata::formats
