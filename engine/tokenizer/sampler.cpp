#include "tokenizer/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_set>

#include <spdlog/fmt/fmt.h>

namespace strata::tok {

namespace {

using candidate = sampler::candidate;

// Most likely first; the lower id first among equals, so every step is deterministic.
bool more_likely(const candidate& a, const candidate& b) { return a.logit != b.logit ? a.logit > b.logit : a.id < b.id; }

void check(bool ok, const char* name, double value, const char* range) {
    if (!ok) throw std::invalid_argument(fmt::format("sampler: {} is {}, outside {}", name, value, range));
}

// Uniform in [0, 1) from the top 53 bits, the same on every platform (unlike the std distributions).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// log(sum(exp(x / t))) over the finite logits, stable.
double log_sum_exp(std::span<const float> logits, double t, double max_logit) {
    double sum = 0;
    for (float l : logits)
        if (std::isfinite(l)) sum += std::exp((l - max_logit) / t);
    return max_logit / t + std::log(sum);
}

void keep_top_k(std::vector<candidate>& c, int32_t k) {
    if (k <= 0 || static_cast<size_t>(k) >= c.size()) {
        std::sort(c.begin(), c.end(), more_likely);
        return;
    }
    std::partial_sort(c.begin(), c.begin() + k, c.end(), more_likely);
    c.resize(static_cast<size_t>(k));
}

// c sorted most likely first. Keeps the shortest prefix whose probability (at temperature 1) reaches p.
void keep_top_p(std::vector<candidate>& c, float p) {
    if (p >= 1.0f || c.size() <= 1) return;
    const double max_logit = c.front().logit;
    double total = 0;
    for (const candidate& x : c) total += std::exp(static_cast<double>(x.logit) - max_logit);
    double cum = 0;
    for (size_t i = 0; i < c.size(); ++i) {
        cum += std::exp(static_cast<double>(c[i].logit) - max_logit) / total;
        if (cum >= p) {
            c.resize(i + 1);
            return;
        }
    }
}

// c sorted most likely first. p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p).
void keep_min_p(std::vector<candidate>& c, float min_p) {
    if (min_p <= 0.0f || c.empty()) return;
    const double threshold = static_cast<double>(c.front().logit) + std::log(static_cast<double>(min_p));
    size_t n = 1;
    while (n < c.size() && c[n].logit >= threshold) ++n;
    c.resize(n);
}

}  // namespace

sampler::sampler(sampler_params p) : params_(p) {
    check(std::isfinite(p.temperature), "temperature", p.temperature, "finite values");
    check(p.top_p >= 0.0f && p.top_p <= 1.0f, "top_p", p.top_p, "[0, 1]");
    check(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p", p.min_p, "[0, 1]");
    check(p.repeat_penalty > 0.0f && std::isfinite(p.repeat_penalty), "repeat_penalty", p.repeat_penalty, "(0, inf)");
    check(p.repeat_last_n >= -1, "repeat_last_n", p.repeat_last_n, "-1 (all) or >= 0");
    check(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f, "presence_penalty", p.presence_penalty, "[-2, 2]");
    check(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f, "frequency_penalty", p.frequency_penalty,
          "[-2, 2]");
    for (const auto& [id, bias] : p.logit_bias)
        if (!(bias >= -100.0f && bias <= 100.0f))
            throw std::invalid_argument(fmt::format("sampler: logit_bias for token {} is {}, outside [-100, 100]", id, bias));
    seed_ = p.seed ? *p.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    rng_.seed(seed_);
}

void sampler::reset() {
    history_.clear();
    generated_.clear();
    rng_.seed(seed_);
}

void sampler::accept_prompt(std::span<const int32_t> ids) { history_.insert(history_.end(), ids.begin(), ids.end()); }

void sampler::accept(int32_t id) {
    history_.push_back(id);
    ++generated_[id];
}

void sampler::apply_penalties(std::span<float> logits) const {
    const auto n = static_cast<int64_t>(logits.size());
    for (const auto& [id, bias] : params_.logit_bias)
        if (id >= 0 && id < n) logits[static_cast<size_t>(id)] += bias;
    if (params_.repeat_penalty != 1.0f && params_.repeat_last_n != 0) {
        const size_t window = params_.repeat_last_n < 0
                                  ? history_.size()
                                  : std::min(history_.size(), static_cast<size_t>(params_.repeat_last_n));
        std::unordered_set<int32_t> seen(history_.end() - static_cast<std::ptrdiff_t>(window), history_.end());
        for (int32_t id : seen) {
            if (id < 0 || id >= n) continue;
            float& l = logits[static_cast<size_t>(id)];
            l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
        }
    }
    if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
        for (const auto& [id, count] : generated_) {
            if (id < 0 || id >= n) continue;
            logits[static_cast<size_t>(id)] -=
                static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
        }
    }
}

int32_t sampler::draw(std::span<const float> logits) {
    std::vector<candidate>& c = candidates_;
    c.clear();
    for (size_t i = 0; i < logits.size(); ++i)
        if (std::isfinite(logits[i])) c.push_back({logits[i], static_cast<int32_t>(i)});
    keep_top_k(c, params_.top_k);
    keep_top_p(c, params_.top_p);
    keep_min_p(c, params_.min_p);
    // Temperature last (llama.cpp's order): it reshapes the survivors, it does not decide who survives.
    const double t = params_.temperature, max_logit = c.front().logit;
    std::vector<double>& weight = weights_;
    weight.resize(c.size());
    double total = 0;
    for (size_t i = 0; i < c.size(); ++i) total += weight[i] = std::exp((c[i].logit - max_logit) / t);
    double u = uniform01(rng_) * total;
    for (size_t i = 0; i < c.size(); ++i) {
        if (u < weight[i]) return c[i].id;
        u -= weight[i];
    }
    return c.back().id;  // rounding left u a hair above the last weight
}

bool sampler::penalizes() const {
    return !params_.logit_bias.empty() || (params_.repeat_penalty != 1.0f && params_.repeat_last_n != 0) ||
           params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
}

sample_result sampler::sample(std::span<const float> logits, int n_top_logprobs) {
    std::span<const float> l = logits;
    if (penalizes()) {
        penalized_.assign(logits.begin(), logits.end());
        apply_penalties(penalized_);
        l = penalized_;
    }
    float max_logit = -std::numeric_limits<float>::infinity();
    int32_t argmax = -1;
    for (size_t i = 0; i < l.size(); ++i)
        if (std::isfinite(l[i]) && (argmax < 0 || l[i] > max_logit)) {
            max_logit = l[i];
            argmax = static_cast<int32_t>(i);
        }
    if (argmax < 0)
        throw std::invalid_argument(fmt::format("sampler: none of the {} logits is finite", logits.size()));

    sample_result r;
    r.id = params_.temperature <= 0.0f ? argmax : draw(l);
    r.logprob = 0.0f;
    if (n_top_logprobs < 0) {
        accept(r.id);
        return r;
    }

    const double t = params_.temperature > 0.0f ? params_.temperature : 1.0;
    const double lse = log_sum_exp(l, t, max_logit);
    const auto logprob = [&](int32_t id) { return static_cast<float>(l[static_cast<size_t>(id)] / t - lse); };
    r.logprob = logprob(r.id);
    if (n_top_logprobs > 0) {
        std::vector<candidate>& c = candidates_;
        c.clear();
        for (size_t i = 0; i < l.size(); ++i)
            if (std::isfinite(l[i])) c.push_back({l[i], static_cast<int32_t>(i)});
        const size_t n = std::min(c.size(), static_cast<size_t>(n_top_logprobs));
        std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(n), c.end(), more_likely);
        for (size_t i = 0; i < n; ++i) r.top_logprobs.push_back({c[i].id, logprob(c[i].id)});
    }
    accept(r.id);
    return r;
}

}  // namespace strata::tok
