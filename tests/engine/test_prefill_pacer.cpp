// The prefill pacer on synthetic step times: how many prompt tokens a step may carry beside decode rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "prefill_pacer.hpp"

namespace strata {
namespace {

// Runs steps of 4 decode rows plus what the pacer allows, timed by step_ms(prompt tokens), after three
// decode-only steps; returns the chunk the pacer settles on (its last step with prompt tokens).
int settle(prefill_pacer& p, const std::function<double(int)>& step_ms, int budget = 512) {
    for (int i = 0; i < 3; ++i) p.observe(4, 0, step_ms(0));
    int chunk = 0;
    for (int i = 0; i < 40; ++i) {
        const int n = p.prompt_tokens(4, budget);
        p.observe(4, n, step_ms(n));
        if (n > 0) chunk = n;
    }
    return chunk;
}

TEST(PrefillPacer, WithoutDecodeRowsAStepTakesTheWholeBudget) {
    const prefill_pacer p(2.0);
    EXPECT_EQ(p.prompt_tokens(0, 512), 512);
    const prefill_pacer off(0);
    EXPECT_EQ(off.prompt_tokens(3, 512), 509) << "pacing off: the budget less the decode rows";
}

TEST(PrefillPacer, TheFirstStepBesideDecodeRowsMeasuresThemAlone) {
    prefill_pacer p(2.0);
    EXPECT_EQ(p.prompt_tokens(4, 512), 0);
    p.observe(4, 0, 100);
    EXPECT_DOUBLE_EQ(p.decode_ms(), 100);
    EXPECT_EQ(p.prompt_tokens(4, 512), 8) << "a small first chunk until a token's cost is known";
}

TEST(PrefillPacer, ALinearCostSettlesOnTheChunkThatDoublesTheStep) {
    prefill_pacer p(2.0);
    const int chunk = settle(p, [](int n) { return 100.0 + 5.0 * n; });
    EXPECT_EQ(chunk, 20) << "100 ms of decode + 20 tokens of 5 ms";
    prefill_pacer wide(3.0);
    EXPECT_EQ(settle(wide, [](int n) { return 100.0 + 5.0 * n; }), 40);
}

TEST(PrefillPacer, ACostThatFlattensWithTheChunkStillKeepsTheStepWithinTheFactor) {
    // Expert reads: the first tokens of a chunk touch new experts, later ones mostly share them.
    const auto step_ms = [](int n) { return 100.0 + 400.0 * (1 - std::exp(-n / 64.0)); };
    prefill_pacer p(2.0);
    const int chunk = settle(p, step_ms);
    EXPECT_LE(step_ms(chunk), 2.0 * 100 * 1.02) << chunk;
    EXPECT_GE(step_ms(chunk), 2.0 * 100 * 0.9) << chunk << ": the chunk should grow to the bound";
}

TEST(PrefillPacer, TheChunkStaysWithinTheBudgetAndAtLeastOneToken) {
    prefill_pacer cheap(2.0);
    EXPECT_EQ(settle(cheap, [](int n) { return 100.0 + 0.001 * n; }, 64), 60) << "64 less 4 decode rows";
    prefill_pacer dear(2.0);
    EXPECT_EQ(settle(dear, [](int n) { return 100.0 + 1000.0 * n; }), 1);
}

TEST(PrefillPacer, EveryNinthStepBesideAPromptRetimesTheDecodeRows) {
    prefill_pacer p(2.0);
    settle(p, [](int n) { return 100.0 + 5.0 * n; });
    int decode_only = 0;
    for (int i = 0; i < 9 * prefill_pacer::refresh_every; ++i) {
        const int n = p.prompt_tokens(4, 512);
        decode_only += n == 0;
        p.observe(4, n, 100.0 + 5.0 * n);
    }
    EXPECT_EQ(decode_only, 8) << "one step in " << prefill_pacer::refresh_every + 1;
}

TEST(PrefillPacer, ADecodeTimeMeasuredUnderLoadDoesNotInflateTheStepsAfterTheLoadEnds) {
    // Decode-only steps timed while the machine was twice as slow; then the prompt arrives and the load
    // goes. Every mixed step must come back within the factor of the decode step of that moment.
    prefill_pacer p(2.0);
    for (int i = 0; i < 3; ++i) p.observe(4, 0, 200);
    double worst = 0;
    for (int i = 0; i < 60; ++i) {
        const int n = p.prompt_tokens(4, 512);
        const double ms = 100.0 + 5.0 * n;
        p.observe(4, n, ms);
        worst = std::max(worst, ms);
    }
    EXPECT_LE(worst, 2.0 * 100 * 1.05) << "decode " << p.decode_ms() << " ms, token " << p.token_ms() << " ms";
    EXPECT_DOUBLE_EQ(p.decode_ms(), 100);
}

TEST(PrefillPacer, OneStepThatRanFastDoesNotDoubleTheNextChunk) {
    prefill_pacer p(2.0);
    const int chunk = settle(p, [](int n) { return 100.0 + 5.0 * n; });
    ASSERT_EQ(chunk, 20);
    int n = p.prompt_tokens(4, 512);
    ASSERT_GT(n, 0);
    p.observe(4, n, 100.0);  // the prompt tokens seemed free (the machine sped up for one step)
    n = p.prompt_tokens(4, 512);
    EXPECT_GT(n, chunk);
    EXPECT_LE(n, chunk * 4 / 3 + 1) << "the per-token cost moves by at most a factor 2 per step";
}

}  // namespace
}  // namespace strata
