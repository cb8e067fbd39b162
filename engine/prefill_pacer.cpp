#include "prefill_pacer.hpp"

#include <algorithm>
#include <cmath>

namespace strata {

namespace {

constexpr int first_chunk = 8;          // prompt tokens of the first mixed step, before token_ms is known
constexpr double decode_weight = 0.5;   // moving-average weight of the newest decode-only step
constexpr double token_weight = 0.5;    // of the newest mixed step (the chunk it sets changes with it)

// The average moved toward `now`, which counts as lying within [lo, hi] times the average: limits on
// the side that would make the next chunk larger.
double average(double old, double now, double weight, double lo, double hi) {
    if (old == 0) return now;
    return old + weight * (std::clamp(now, lo * old, hi * old) - old);
}

}  // namespace

int prefill_pacer::prompt_tokens(int n_decode, int budget) const {
    const int left = std::max(0, budget - n_decode);
    if (factor_ <= 1 || n_decode == 0) return left;
    if (decode_ms_ == 0 || mixed_run_ >= refresh_every) return 0;
    if (token_ms_ == 0) return std::min(left, first_chunk);
    const double n = (factor_ - 1) * decode_ms_ / token_ms_;
    return std::min(left, std::max(1, static_cast<int>(std::min(n, 1e9))));
}

void prefill_pacer::observe(int n_decode, int n_prompt, double ms) {
    if (n_decode == 0 || !(ms >= 0)) return;
    if (n_prompt == 0) {
        // Other work on the machine only adds time, so a faster step is taken at once; a slower one
        // (it allows larger chunks) moves the average and counts as twice it at most.
        decode_ms_ = ms < decode_ms_ ? ms : average(decode_ms_, ms, decode_weight, 0, 2);
        mixed_run_ = 0;
        return;
    }
    if (decode_ms_ == 0) return;
    ++mixed_run_;
    // The decode rows alone take no longer than the step that also carried prompt tokens.
    const bool below = ms <= decode_ms_;
    if (below) decode_ms_ = ms;
    // Without a cost per token yet, a step that cost nothing beyond the decode rows tells none.
    if (below && token_ms_ == 0) return;
    // What the prompt tokens added to a decode step; a step faster than the average still cost something.
    // A cheaper token allows a larger chunk: such a sample counts as half the average at least.
    const double added = std::max(ms - decode_ms_, 0.01 * decode_ms_);
    token_ms_ = average(token_ms_, added / n_prompt, token_weight, 0.5, 1e9);
}

}  // namespace strata
