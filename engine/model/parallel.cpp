#include "model/parallel.hpp"

#include <algorithm>

namespace strata::engine {

void parallel_rows(arenas::expert_pool& pool, int64_t n_rows, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn) {
    const std::vector<arenas::row_range> ranges = arenas::split_rows(pool.plan(), n_rows, grain);
    std::vector<size_t> n_items;
    for (const auto& r : ranges) n_items.push_back(static_cast<size_t>((r.end - r.begin + grain - 1) / grain));
    pool.run_phase(n_items, [&](int slice, size_t item_begin, size_t item_end) {
        const arenas::row_range& r = ranges[static_cast<size_t>(slice)];
        const int64_t begin = r.begin + static_cast<int64_t>(item_begin) * grain;
        const int64_t end = std::min(r.end, r.begin + static_cast<int64_t>(item_end) * grain);
        fn(begin, end);
    });
}

}  // namespace strata::engine
