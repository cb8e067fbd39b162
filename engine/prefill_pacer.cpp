#include "prefill_pacer.hpp"

#include <algorithm>
#include <cmath>

namespace strata {

namespace {

constexpr int first_chunk = 8;          // prompt tokens of the first mixed step, before token_ms is known
constexpr double decode_weight = 0.25;  // moving-average weight of the newest decode-only step
constexpr double token_weight = 0.5;    // of the newest mixed step (the chunk it sets changes with it)

double average(double old, double now, double weight) { return old == 0 ? now : old + weight * (now - old); }

}  // namespace

int prefill_pacer::prompt_tokens(int n_decode, int budget) const {
    const int left = std::max(0, budget - n_decode);
    if (factor_ <= 1 || n_decode == 0) return left;
    if (decode_ms_ == 0) return 0;
    if (token_ms_ == 0) return std::min(left, first_chunk);
    const double n = (factor_ - 1) * decode_ms_ / token_ms_;
    return std::min(left, std::max(1, static_cast<int>(std::min(n, 1e9))));
}

void prefill_pacer::observe(int n_decode, int n_prompt, double ms) {
    if (n_decode == 0 || !(ms >= 0)) return;
    if (n_prompt == 0) {
        decode_ms_ = average(decode_ms_, ms, decode_weight);
        return;
    }
    if (decode_ms_ == 0) return;
    // What the prompt tokens added to a decode step; a step faster than the average still cost something.
    const double added = std::max(ms - decode_ms_, 0.01 * decode_ms_);
    token_ms_ = average(token_ms_, added / n_prompt, token_weight);
}

}  // namespace strata
