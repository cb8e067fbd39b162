// Row-parallel loops on the CPU expert pool: rows are cut into one contiguous range per slice
// (arenas::split_rows), then into blocks of `grain` rows that the slice's threads claim.
#pragma once

#include <cstdint>
#include <vector>

#include "expert_pool.hpp"
#include "function_ref.hpp"
#include "moe_phases.hpp"

namespace strata::engine {

// Runs fn(row_begin, row_end) over [0, n_rows) in blocks of at most `grain` rows, on every slice; every
// block but the last starts and ends on a multiple of `grain` (whole groups of a repacked matrix).
// Allocates nothing once the calling thread has run one: the decode loop calls it many times a token.
void parallel_rows(arenas::expert_pool& pool, int64_t n_rows, int64_t grain,
                   arenas::function_ref<void(int64_t row_begin, int64_t row_end)> fn);

}  // namespace strata::engine
