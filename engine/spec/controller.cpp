#include "spec/controller.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/fmt/fmt.h>

namespace strata::engine::spec {

void cost_table::record(int n, double ms) {
    if (n < 1 || n > max_tokens || !(ms > 0)) return;
    const auto i = static_cast<size_t>(n);
    // The first passes set the figure; later ones move it a fifth of the way (other load comes and goes).
    ms_[i] = count_[i] == 0 ? ms : ms_[i] + 0.2 * (ms - ms_[i]);
    ++count_[i];
}

double cost_table::relative(int n) const {
    if (n <= 1 || !measured(1)) return 1.0 + prior_slope * (n - 1);
    if (measured(n)) return ms(n) / ms(1);
    int m = 1;
    for (int j = std::min(n, max_tokens); j > 1; --j)
        if (measured(j)) {
            m = j;
            break;
        }
    const double at_m = ms(m) / ms(1);
    const double slope = m > 1 ? std::max(prior_slope, (at_m - 1.0) / (m - 1)) : prior_slope;
    return at_m + slope * (n - m);
}

double expected_tokens(double alpha, int k) {
    double sum = 0, term = 1;
    for (int i = 0; i <= k; ++i, term *= alpha) sum += term;
    return sum;
}

controller::controller(bool adaptive, int n_max, const cost_table& costs)
    : adaptive_(adaptive), n_max_(n_max), costs_(costs) {}

int controller::draft_length() {
    turned_off_.clear();
    if (!adaptive_) return n_max_;
    const double alpha = acceptance();
    int best = 0;
    double best_rate = min_gain;
    for (int k = 1; k <= n_max_; ++k) {
        const double rate = expected_tokens(alpha, k) / (costs_.relative(k + 1) + k * draft_cost_);
        if (rate > best_rate) best = k, best_rate = rate;
    }
    if (best > 0) {
        on_ = true;
        return best;
    }
    if (on_) {
        on_ = false;
        // Turned off on the prior alone (nothing verified yet): probe at once rather than after
        // probe_every steps, so a text that repeats from its start is not decoded plainly for that long.
        off_steps_ = verified_ ? 0 : probe_every - 1;
        turned_off_ = fmt::format("acceptance {:.0f} % does not pay for a verification of 2 tokens costing {:.2f} "
                                  "decode steps{}",
                                  100 * alpha, costs_.relative(2),
                                  draft_cost_ > 0 ? fmt::format(" and a draft costing {:.2f}", draft_cost_) : "");
    }
    // Off: now and then one draft, so a text that turns repetitive turns speculation back on.
    return ++off_steps_ % probe_every == 0 ? 1 : 0;
}

void controller::record(int drafted, int accepted) {
    if (drafted <= 0) return;
    verified_ = true;
    accepted_ = decay * accepted_ + accepted;
    rejected_ = decay * rejected_ + (accepted < drafted ? 1 : 0);
    // Keep both counts off zero so one side never locks the estimate.
    accepted_ = std::max(accepted_, 0.05);
    rejected_ = std::max(rejected_, 0.05);
}

}  // namespace strata::engine::spec
