// Sampler: greedy, seeded reproducibility, what top-k/top-p/min-p must exclude (frequencies over many
// draws with a fixed seed), penalties exactly as defined, log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "tokenizer/sampler.hpp"

namespace strata::tok {
namespace {

// Logits whose softmax at temperature 1 is exactly `probs`.
std::vector<float> logits_of(std::vector<double> probs) {
    std::vector<float> l;
    for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
    return l;
}

sampler_params plain(float temperature, uint64_t seed = 1234) {
    sampler_params p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

// Draws n tokens from one sampler whose penalties are off, so the history does not matter.
std::vector<int> draw_counts(sampler_params p, const std::vector<float>& logits, int n_draws) {
    sampler s(p);
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < n_draws; ++i) ++counts[static_cast<size_t>(s.sample(logits).id)];
    return counts;
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
    sampler s(plain(0.0f));
    EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 2.9f}).id, 1);
    EXPECT_EQ(s.sample(std::vector<float>{1.0f, 5.0f, 5.0f}).id, 1);
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(s.sample(std::vector<float>{-inf, -3.0f, -inf}).id, 1);
    EXPECT_THROW(s.sample(std::vector<float>{-inf, -inf}), std::invalid_argument);
}

TEST(Sampler, SameSeedSameTokens) {
    const std::vector<float> logits = logits_of({0.2, 0.2, 0.2, 0.2, 0.2});
    sampler a(plain(1.0f, 7)), b(plain(1.0f, 7)), c(plain(1.0f, 8));
    std::vector<int32_t> ta, tb, tc;
    for (int i = 0; i < 200; ++i) {
        ta.push_back(a.sample(logits).id);
        tb.push_back(b.sample(logits).id);
        tc.push_back(c.sample(logits).id);
    }
    EXPECT_EQ(ta, tb);
    EXPECT_NE(ta, tc);
    a.reset();
    std::vector<int32_t> again;
    for (int i = 0; i < 200; ++i) again.push_back(a.sample(logits).id);
    EXPECT_EQ(again, ta) << "reset() restarts the sequence from the seed";
}

TEST(Sampler, TopKOneIsGreedy) {
    sampler_params p = plain(1.5f);
    p.top_k = 1;
    sampler s(p);
    const std::vector<float> logits = {0.5f, 0.7f, 0.69f, -2.0f};
    for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(logits).id, 1);
}

TEST(Sampler, TemperatureOneFollowsTheDistribution) {
    const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
    const int n = 20000;
    const std::vector<int> c = draw_counts(plain(1.0f), logits_of(probs), n);
    for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(double(c[i]) / n, probs[i], 0.015) << "token " << i;
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
    sampler_params p = plain(1.0f);
    p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.5 + 0.3: tokens 0 and 1 only
    const int n = 10000;
    const std::vector<int> c = draw_counts(p, logits_of({0.5, 0.3, 0.15, 0.05}), n);
    EXPECT_EQ(c[2], 0);
    EXPECT_EQ(c[3], 0);
    EXPECT_NEAR(double(c[0]) / n, 0.5 / 0.8, 0.02);  // renormalised over the nucleus
}

TEST(Sampler, MinPDropsTokensBelowTheFractionOfTheBest) {
    sampler_params p = plain(1.0f);
    p.min_p = 0.2f;  // threshold 0.2 * 0.5 = 0.1: token 3 (0.05) goes, token 2 (0.15) stays
    const int n = 10000;
    const std::vector<int> c = draw_counts(p, logits_of({0.5, 0.3, 0.15, 0.05}), n);
    EXPECT_EQ(c[3], 0);
    EXPECT_NEAR(double(c[2]) / n, 0.15 / 0.95, 0.02);
}

TEST(Sampler, TopKExcludesTheRest) {
    sampler_params p = plain(1.0f);
    p.top_k = 2;
    const std::vector<int> c = draw_counts(p, logits_of({0.1, 0.4, 0.2, 0.3}), 5000);
    EXPECT_EQ(c[0], 0);
    EXPECT_EQ(c[2], 0);
    EXPECT_GT(c[1], c[3]);
}

TEST(Sampler, LowTemperatureSharpens) {
    const std::vector<float> logits = logits_of({0.4, 0.35, 0.25});
    const int n = 5000;
    const std::vector<int> hot = draw_counts(plain(1.0f), logits, n);
    const std::vector<int> cold = draw_counts(plain(0.25f), logits, n);
    EXPECT_GT(cold[0], hot[0]);
    EXPECT_LT(cold[2], hot[2]);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
    sampler_params p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    sampler s(p);
    s.accept_prompt(std::vector<int32_t>{3, 0, 1, 1});  // the window holds the last two: 1, 1
    std::vector<float> l = {2.0f, -2.0f, 1.0f, 4.0f};
    s.apply_penalties(l);
    EXPECT_EQ(l, (std::vector<float>{2.0f, -4.0f, 1.0f, 4.0f}));  // once per distinct token
    p.repeat_last_n = -1;
    sampler all(p);
    all.accept_prompt(std::vector<int32_t>{3, 0, 1});
    l = {2.0f, -2.0f, 1.0f, 4.0f};
    all.apply_penalties(l);
    EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 1.0f, 2.0f}));
}

TEST(Sampler, PresenceAndFrequencyCountGeneratedTokensOnly) {
    sampler_params p = plain(0.0f);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    sampler s(p);
    s.accept_prompt(std::vector<int32_t>{0, 0, 0});  // prompt: no effect on these penalties
    s.accept(2);
    s.accept(2);
    s.accept(2);
    s.accept(1);
    std::vector<float> l = {1.0f, 1.0f, 1.0f};
    s.apply_penalties(l);
    EXPECT_FLOAT_EQ(l[0], 1.0f);
    EXPECT_FLOAT_EQ(l[1], 1.0f - 0.25f - 0.5f);
    EXPECT_FLOAT_EQ(l[2], 1.0f - 3 * 0.25f - 0.5f);
}

TEST(Sampler, PenaltiesSteerGreedy) {
    sampler_params p = plain(0.0f);
    p.frequency_penalty = 1.0f;
    sampler s(p);
    const std::vector<float> logits = {1.5f, 1.0f};
    EXPECT_EQ(s.sample(logits).id, 0);  // recorded: token 0 now costs 1
    EXPECT_EQ(s.sample(logits).id, 1);
}

TEST(Sampler, LogProbabilitiesAfterPenaltiesAndTemperature) {
    const std::vector<double> probs = {0.1, 0.6, 0.3};
    sampler greedy(plain(0.0f));
    const sample_result r = greedy.sample(logits_of(probs), 2);
    EXPECT_EQ(r.id, 1);
    EXPECT_NEAR(r.logprob, std::log(0.6), 1e-5);
    ASSERT_EQ(r.top_logprobs.size(), 2u);
    EXPECT_EQ(r.top_logprobs[0].id, 1);
    EXPECT_EQ(r.top_logprobs[1].id, 2);
    EXPECT_NEAR(r.top_logprobs[1].logprob, std::log(0.3), 1e-5);

    // Temperature 2: log_softmax(log(p) / 2), i.e. proportional to sqrt(p).
    sampler warm(plain(2.0f));
    const sample_result w = warm.sample(logits_of(probs), 3);
    const double z = std::sqrt(0.1) + std::sqrt(0.6) + std::sqrt(0.3);
    ASSERT_EQ(w.top_logprobs.size(), 3u);
    for (const token_logprob& t : w.top_logprobs)
        EXPECT_NEAR(t.logprob, std::log(std::sqrt(probs[static_cast<size_t>(t.id)]) / z), 1e-5);
    EXPECT_NEAR(w.logprob, std::log(std::sqrt(probs[static_cast<size_t>(w.id)]) / z), 1e-5);
}

TEST(Sampler, WithoutLogProbabilitiesTheSameTokensAreDrawn) {
    // n_top_logprobs < 0 skips the log-probabilities only: the same seed gives the same tokens, with
    // and without penalties (which then apply to a copy, never to the caller's logits).
    for (const float penalty : {0.0f, 0.7f}) {
        sampler_params p = plain(0.9f);
        p.seed = 7;
        p.presence_penalty = penalty;
        sampler with(p), without(p);
        const std::vector<float> logits = {0.3f, 1.1f, 0.9f, -0.4f, 1.0f};
        for (int i = 0; i < 50; ++i) {
            const sample_result a = with.sample(logits, 0), b = without.sample(logits, -1);
            ASSERT_EQ(a.id, b.id) << "draw " << i << ", presence penalty " << penalty;
            EXPECT_NE(a.logprob, 0.0f);
            EXPECT_EQ(b.logprob, 0.0f);
            EXPECT_TRUE(b.top_logprobs.empty());
        }
        EXPECT_EQ(logits[1], 1.1f);
    }
}

TEST(Sampler, LogitBiasSteersGreedyAndBansOrForces) {
    const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
    sampler_params p = plain(0.0f);
    p.logit_bias = {{0, -1.5f}};  // 0.5 < 1.0: token 1 wins
    EXPECT_EQ(sampler(p).sample(logits).id, 1);
    p.logit_bias = {{3, 100.0f}, {0, -100.0f}, {99, 50.0f}};  // an id past the logits is ignored
    sampler forced(p);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(forced.sample(logits).id, 3);
    EXPECT_EQ(logits[3], -1.0f);  // the caller's logits are untouched
}

TEST(Sampler, LogitBiasShiftsTheDistributionAndTheLogProbabilities) {
    // +log(3) on token 1 of a uniform pair: p = (1/4, 3/4).
    sampler_params p = plain(1.0f, 11);
    p.logit_bias = {{1, static_cast<float>(std::log(3.0))}};
    const std::vector<float> logits = {0.0f, 0.0f};
    const std::vector<int> counts = draw_counts(p, logits, 4000);
    EXPECT_NEAR(counts[1] / 4000.0, 0.75, 0.03);
    const sample_result r = sampler(p).sample(logits, 2);
    ASSERT_EQ(r.top_logprobs.size(), 2u);
    EXPECT_EQ(r.top_logprobs[0].id, 1);
    EXPECT_NEAR(r.top_logprobs[0].logprob, std::log(0.75), 1e-5);
    EXPECT_NEAR(r.top_logprobs[1].logprob, std::log(0.25), 1e-5);

    // -100 bans for practical purposes: 4000 draws at temperature 1 never pick it.
    p.logit_bias = {{0, -100.0f}};
    EXPECT_EQ(draw_counts(p, logits, 4000)[0], 0);
}

TEST(Sampler, ParametersOutsideTheirRangeAreNamed) {
    sampler_params p;
    p.top_p = 1.5f;
    try {
        sampler s(p);
        FAIL();
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos) << e.what();
    }
    p = {};
    p.repeat_penalty = 0.0f;
    EXPECT_THROW(sampler{p}, std::invalid_argument);
    p = {};
    p.frequency_penalty = 3.0f;
    EXPECT_THROW(sampler{p}, std::invalid_argument);
    for (const float bad : {100.5f, -101.0f, std::nanf("")}) {
        p = {};
        p.logit_bias = {{5, bad}};
        try {
            sampler s(p);
            FAIL() << bad;
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("logit_bias for token 5"), std::string::npos) << e.what();
        }
    }
}

}  // namespace
}  // namespace strata::tok
