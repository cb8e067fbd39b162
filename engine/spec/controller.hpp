// Speculative decoding's draft length: from what a verification batch of k + 1 tokens costs on this
// model and machine (measured) and the acceptance rate of this generation's drafts (tracked), the k
// that maximises expected tokens per second, or 0 (plain decoding) when no k beats one decode step.
#pragma once

#include <array>
#include <string>

namespace strata::engine::spec {

// Wall time of a forward pass of n tokens (n = 1..max_tokens), a moving average of the passes seen on
// this model; used from its engine thread only.
class cost_table {
public:
    static constexpr int max_tokens = 17;  // a verification batch: the last token and 16 drafts

    void record(int n, double ms);
    bool measured(int n) const { return n >= 1 && n <= max_tokens && count_[static_cast<size_t>(n)] > 0; }
    int passes(int n) const { return measured(n) ? count_[static_cast<size_t>(n)] : 0; }
    double ms(int n) const { return measured(n) ? ms_[static_cast<size_t>(n)] : 0; }
    // Cost of n tokens in decode steps (n = 1: 1). Unmeasured sizes extrapolate linearly from the
    // largest measured one below them, at no less than `prior_slope` steps per extra token.
    double relative(int n) const;
    static constexpr double prior_slope = 0.25;

private:
    std::array<double, max_tokens + 1> ms_{};
    std::array<int, max_tokens + 1> count_{};
};

// Expected tokens one verification of k drafts yields when each draft is accepted with probability
// alpha (given the ones before it were): 1 + alpha + ... + alpha^k.
double expected_tokens(double alpha, int k);

class controller {
public:
    // adaptive: choose k each step (auto); else always n_max.
    controller(bool adaptive, int n_max, const cost_table& costs);

    // Drafts to ask for this step (0..n_max).
    int draft_length();
    // What making one draft costs, in decode steps (MTP: a pass of the MTP block; n-gram: nothing).
    void set_draft_cost(double steps) { draft_cost_ = steps; }
    // The outcome of a verification of `drafted` drafts, `accepted` of them taken.
    void record(int drafted, int accepted);
    double acceptance() const { return accepted_ / (accepted_ + rejected_); }
    // Set when the last draft_length() turned speculation off after it was on: why, for the log.
    const std::string& turned_off() const { return turned_off_; }

    static constexpr double decay = 0.9;       // weight of the past per verification
    static constexpr int probe_every = 32;     // while off, a one-draft probe every this many steps
    static constexpr double min_gain = 1.02;   // speedup a draft length must promise over plain

private:
    bool adaptive_;
    int n_max_;
    const cost_table& costs_;
    double accepted_ = 0.5, rejected_ = 0.5;  // decayed counts: prior alpha 0.5, worth one verification
    bool on_ = true;
    bool verified_ = false;  // a verification has been recorded
    int off_steps_ = 0;
    double draft_cost_ = 0;
    std::string turned_off_;
};

}  // namespace strata::engine::spec
