// The step batcher through the public API: sessions generating at once advance in shared steps and
// each produces exactly what it produces alone (tokens, log-probabilities, text), in every pool mode.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "generate.hpp"
#include "strata/engine.hpp"

namespace strata {
namespace {

std::string model_path(make_model::arch a = make_model::arch::qwen3moe) {
    const auto path =
        std::filesystem::temp_directory_path() / ("strata_batching_" + make_model::arch_name(a) + ".gguf");
    if (!std::filesystem::exists(path)) make_model::build_model(make_model::preset("tiny", a)).write_file(path.string());
    return path.string();
}

std::shared_ptr<model> load(const std::string& pool, int workers, int n_batch,
                            make_model::arch a = make_model::arch::qwen3moe) {
    model_options o;
    o.path = model_path(a);
    o.numa_pool = pool;
    o.pool_workers = workers;
    o.n_ctx = 512;
    o.n_batch = n_batch;
    return model::load(o);
}

generation_options sampled(int n, uint64_t seed) {
    generation_options g;
    g.max_tokens = n;
    g.sampling.seed = seed;
    g.sampling.temperature = 1.0f;
    g.ignore_eos = true;
    g.top_logprobs = 2;
    return g;
}

std::vector<std::vector<int32_t>> prompts(const model& m) {
    std::vector<std::vector<int32_t>> p;
    for (int i = 0; i < 4; ++i) {
        std::string text = "Conversation " + std::to_string(i) + ":";
        for (int r = 0; r < 2 + 3 * i; ++r) text += " the quick brown fox " + std::to_string(r * (i + 1));
        p.push_back(m.tokenize(text));
    }
    return p;
}

void expect_same(const generation_result& a, const generation_result& b, const std::string& what) {
    ASSERT_EQ(a.tokens.size(), b.tokens.size()) << what;
    for (size_t t = 0; t < a.tokens.size(); ++t) {
        ASSERT_EQ(a.tokens[t].id, b.tokens[t].id) << what << " token " << t;
        ASSERT_EQ(a.tokens[t].logprob, b.tokens[t].logprob) << what << " token " << t;  // bitwise logits
    }
    EXPECT_EQ(a.text, b.text) << what;
    EXPECT_EQ(a.reason, b.reason) << what;
}

// Generations started at once on m (a budget of 16 tokens per step) equal their solo runs and share steps.
void check_concurrent_equals_solo(const std::shared_ptr<model>& m, const std::string& mode) {
    const auto p = prompts(*m);
    std::vector<generation_result> solo;
    for (size_t i = 0; i < p.size(); ++i) {
        session s(m);
        solo.push_back(s.generate(p[i], sampled(12 + 3 * static_cast<int>(i), 7 + i)));
    }
    const batch_stats before = m->batching();
    std::vector<std::unique_ptr<session>> sessions;
    std::vector<std::future<generation_result>> futures;
    std::vector<std::string> streamed(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
        sessions.push_back(std::make_unique<session>(m));
        futures.push_back(sessions.back()->start(p[i], sampled(12 + 3 * static_cast<int>(i), 7 + i),
                                                 [&streamed, i](const token_event& e) {
                                                     streamed[i] += e.text;
                                                     return true;
                                                 }));
    }
    for (size_t i = 0; i < p.size(); ++i) {
        const generation_result r = futures[i].get();
        expect_same(r, solo[i], mode + " conversation " + std::to_string(i));
        EXPECT_EQ(streamed[i], r.text);
    }
    const batch_stats after = m->batching();
    EXPECT_TRUE(after.sequences_in_one_pass);
    EXPECT_GT(after.max_step_rows, 1) << "the generations never shared a step";
    EXPECT_LE(after.max_step_rows, 16) << "a step went past the token budget";
    EXPECT_LT(after.steps - before.steps, after.rows - before.rows);
}

TEST(Batching, ConcurrentGenerationsEqualTheirSoloRuns) {
    for (const auto& [mode, workers] : {std::pair{std::string("off"), 1}, std::pair{std::string("test:2"), 2},
                                        std::pair{std::string("test:3"), 3}})
        // A budget of 16 tokens: long prompts arrive in chunks while the others decode.
        check_concurrent_equals_solo(load(mode, workers, 16), mode);
}

// The other families' slots share passes too: the hybrids' each with its own recurrent state (qwen4exp's
// with its wide residual, PLE window and indexer keys), deepseek2's with its latent cache.
TEST(Batching, OtherFamiliesConcurrentGenerationsEqualTheirSoloRuns) {
    for (const make_model::arch a : {make_model::arch::qwen35moe, make_model::arch::qwen3next, make_model::arch::qwen4exp,
                                     make_model::arch::deepseek2})
        check_concurrent_equals_solo(load("test:2", 2, 16, a), make_model::arch_name(a));
}

// A generation whose reader is behind (ready() false) waits; the others finish meanwhile.
TEST(Batching, AHeldBackGenerationDoesNotStallTheOthers) {
    const auto m = load("off", 1, 64);
    const auto p = prompts(*m);
    std::atomic<bool> open{false};
    session slow(m), fast(m);
    auto held = slow.start(p[0], sampled(8, 1), {}, [&open] { return open.load(); });
    const generation_result quick = fast.generate(p[1], sampled(20, 2));
    EXPECT_EQ(quick.tokens.size(), 20u);
    EXPECT_EQ(held.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout) << "it should still wait";
    open = true;
    EXPECT_EQ(held.get().tokens.size(), 8u);
}

// A cancelled generation that is held back still ends.
TEST(Batching, CancelEndsAHeldBackGeneration) {
    const auto m = load("off", 1, 64);
    session s(m);
    auto f = s.start(prompts(*m)[0], sampled(50, 3), {}, [] { return false; });
    s.cancel();
    const generation_result r = f.get();
    EXPECT_EQ(r.reason, stop_reason::cancelled);
    EXPECT_LE(r.tokens.size(), 1u);
}

TEST(Batching, ASecondGenerationOnABusySessionIsRefused) {
    const auto m = load("off", 1, 64);
    session s(m);
    std::atomic<bool> open{false};
    auto f = s.start(prompts(*m)[0], sampled(4, 3), {}, [&open] { return open.load(); });
    EXPECT_THROW(s.start(prompts(*m)[1], sampled(4, 3)), std::logic_error);
    open = true;
    EXPECT_EQ(f.get().tokens.size(), 4u);
}

}  // namespace
}  // namespace strata
