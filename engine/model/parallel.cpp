#include "model/parallel.hpp"

#include <algorithm>

namespace strata::engine {

void parallel_rows(arenas::expert_pool& pool, int64_t n_rows, int64_t grain,
                   arenas::function_ref<void(int64_t, int64_t)> fn) {
    // Per thread, as the pool's host threads each run their own phases; reused so nothing is allocated.
    // The lambda below runs on the pool's threads too, so it must name this thread's vectors through
    // references, not by the thread_local names (which would be each worker's own).
    thread_local std::vector<arenas::row_range> ranges_scratch;
    thread_local std::vector<size_t> items_scratch;
    std::vector<arenas::row_range>& ranges = ranges_scratch;
    std::vector<size_t>& n_items = items_scratch;
    arenas::split_rows(pool.plan(), n_rows, grain, ranges);
    n_items.clear();
    for (const auto& r : ranges) n_items.push_back(static_cast<size_t>((r.end - r.begin + grain - 1) / grain));
    pool.run_phase(n_items, [&](int slice, size_t item_begin, size_t item_end) {
        const arenas::row_range& r = ranges[static_cast<size_t>(slice)];
        const int64_t begin = r.begin + static_cast<int64_t>(item_begin) * grain;
        const int64_t end = std::min(r.end, r.begin + static_cast<int64_t>(item_end) * grain);
        fn(begin, end);
    });
}

}  // namespace strata::engine
