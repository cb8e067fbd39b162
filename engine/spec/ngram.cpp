#include "spec/ngram.hpp"

#include <algorithm>

namespace strata::engine::spec {

std::vector<int32_t> ngram_draft(std::span<const int32_t> ctx, int k, const ngram_params& p) {
    std::vector<int32_t> draft;
    const int len = static_cast<int>(ctx.size());
    if (k <= 0) return draft;
    for (int n = std::min(p.n_max, len - 1); n >= std::max(1, p.n_min); --n) {
        const auto suffix = ctx.subspan(static_cast<size_t>(len - n));
        // Latest occurrence first. Past the context's end the continuation repeats itself: a run with
        // period len - from goes on as it went.
        for (int start = len - n - 1; start >= 0; --start) {
            if (!std::equal(suffix.begin(), suffix.end(), ctx.begin() + start)) continue;
            const int from = start + n;
            for (int j = 0; j < k; ++j) {
                const int at = from + j;
                draft.push_back(at < len ? ctx[static_cast<size_t>(at)] : draft[static_cast<size_t>(at - len)]);
            }
            return draft;
        }
    }
    return draft;
}

}  // namespace strata::engine::spec
