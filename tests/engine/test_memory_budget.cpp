// The memory budget (--mem-budget) that sessions' KV caches, recurrent-state checkpoints and
// conversation snapshots share: its counters, and through the engine API on a generated model with a
// budget of a few MiB: growth past it evicts snapshots first, then is refused with the numbers, the
// session stays usable, and every byte drawn is given back.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <random>

#include "generate.hpp"
#include "memory_budget.hpp"
#include "strata/engine.hpp"

namespace strata {
namespace {

using engine::memory_budget;
constexpr uint64_t mib = uint64_t{1} << 20;

TEST(MemoryBudget, CountsEachUseAndItsReturn) {
    memory_budget b(10 * mib);
    b.change(memory_budget::use::kv, 0, 4 * mib);
    b.change(memory_budget::use::snapshots, 0, 2 * mib);
    b.change(memory_budget::use::checkpoints, 0, 1 * mib);
    EXPECT_EQ(b.used(), 7 * mib);
    EXPECT_TRUE(b.fits(3 * mib));
    EXPECT_FALSE(b.fits(3 * mib + 1));
    EXPECT_EQ(b.over_by(5 * mib), 2 * mib);
    b.change(memory_budget::use::kv, 4 * mib, 1 * mib);  // a cache shrinks
    EXPECT_EQ(b.of(memory_budget::use::kv), 1 * mib);
    EXPECT_EQ(b.used(), 4 * mib);
    const std::string text = b.describe();
    EXPECT_NE(text.find("10.0 MiB"), std::string::npos) << text;
    EXPECT_NE(text.find("KV caches 1.0 MiB"), std::string::npos) << text;
    EXPECT_NE(text.find("conversation snapshots 2.0 MiB"), std::string::npos) << text;
    memory_budget none(0);
    none.change(memory_budget::use::kv, 0, uint64_t{1} << 40);
    EXPECT_TRUE(none.fits(uint64_t{1} << 40));
}

TEST(MemoryBudget, DefaultIsBelowWhatCanBeCommitted) {
    EXPECT_EQ(engine::memory_budget_bytes(0), 0u);
    EXPECT_EQ(engine::memory_budget_bytes(3), 3 * mib);
    const uint64_t room = engine::committable_memory();
    ASSERT_GT(room, 0u);
    EXPECT_LE(engine::memory_budget_bytes(-1), room);
    EXPECT_GE(engine::memory_budget_bytes(-1), room / 10 * 8);
}

std::string model_path(make_model::arch a) {
    const auto path = std::filesystem::temp_directory_path() / ("strata_budget_" + make_model::arch_name(a) + ".gguf");
    if (!std::filesystem::exists(path)) make_model::build_model(make_model::preset("tiny", a)).write_file(path.string());
    return path.string();
}

std::shared_ptr<model> load(int mem_budget_mib, int cache_ram_mib, make_model::arch a = make_model::arch::mixtral) {
    model_options o;
    o.path = model_path(a);
    o.state_checkpoint_interval = 64;
    o.numa_pool = "off";
    o.n_ctx = 4096;
    o.mem_budget_mib = mem_budget_mib;
    o.cache_ram_mib = cache_ram_mib;
    return model::load(o);
}

std::vector<int32_t> tokens(size_t n, uint32_t seed, int n_vocab) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(3, n_vocab - 1);
    std::vector<int32_t> out(n);
    for (auto& t : out) t = id(rng);
    return out;
}

generation_options greedy(int n) {
    generation_options g;
    g.max_tokens = n;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    return g;
}

// Prompt tokens whose keys and values take about `bytes` (whole chunks, at least one).
size_t tokens_for(const model_info& i, uint64_t bytes) {
    const uint64_t chunk = i.kv_bytes_per_token * static_cast<uint64_t>(i.kv_chunk_tokens);
    return static_cast<size_t>(std::max<uint64_t>(1, bytes / chunk) * static_cast<uint64_t>(i.kv_chunk_tokens)) - 8;
}

TEST(MemoryBudget, GrowthPastTheBudgetIsRefusedAndTheSessionStaysUsable) {
    const auto m = load(1, 0);
    const model_info& i = m->info();
    const size_t too_many = tokens_for(i, 2 * mib);
    ASSERT_LT(too_many + 8, static_cast<size_t>(i.n_ctx)) << "the tiny model's KV cache is too small for the test";
    session s(m);
    try {
        s.generate(tokens(too_many, 1, i.n_vocab), greedy(2));
        FAIL() << "a prompt needing 2 MiB of KV cache ran under a 1 MiB budget";
    } catch (const request_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("memory budget of 1.0 MiB"), std::string::npos) << what;
        EXPECT_NE(what.find("MiB more"), std::string::npos) << what;
    }
    memory_budget_stats st = m->memory_statistics();
    EXPECT_EQ(st.budget_bytes, mib);
    EXPECT_EQ(st.refusals, 1u);
    EXPECT_LE(st.used(), mib);
    EXPECT_EQ(st.kv_bytes, s.kv_bytes());

    const auto after = s.generate(tokens(20, 2, i.n_vocab), greedy(4));
    EXPECT_EQ(after.tokens.size(), 4u);
    session cold(m);
    const auto reference = cold.generate(tokens(20, 2, i.n_vocab), greedy(4));
    EXPECT_EQ(after.text, reference.text);
    st = m->memory_statistics();
    EXPECT_EQ(st.kv_bytes, s.kv_bytes() + cold.kv_bytes());
}

TEST(MemoryBudget, SessionsShareOneBudget) {
    const auto m = load(1, 0);
    const model_info& i = m->info();
    const auto first = tokens(tokens_for(i, 3 * mib / 4), 7, i.n_vocab), second = tokens(first.size(), 8, i.n_vocab);
    auto one = std::make_unique<session>(m);
    one->generate(first, greedy(2));  // its conversation's chunks stay for its next turn
    session two(m);
    EXPECT_THROW(two.generate(second, greedy(2)), request_error);
    EXPECT_EQ(m->memory_statistics().refusals, 1u);
    EXPECT_EQ(m->memory_statistics().kv_bytes, one->kv_bytes() + two.kv_bytes());
    one.reset();
    EXPECT_EQ(two.generate(second, greedy(2)).tokens.size(), 2u);
    EXPECT_EQ(m->memory_statistics().kv_bytes, two.kv_bytes());
}

TEST(MemoryBudget, SnapshotsAreEvictedBeforeGrowthIsRefused) {
    const auto m = load(3, 64);
    const model_info& i = m->info();
    std::vector<int32_t> first = tokens(tokens_for(i, mib / 2), 3, i.n_vocab);
    uint64_t parked = 0;
    {
        session s(m);
        s.generate(first, greedy(2));
        parked = s.park();
    }
    ASSERT_NE(parked, 0u);
    memory_budget_stats st = m->memory_statistics();
    EXPECT_EQ(st.kv_bytes, 0u) << "a closed session's KV cache still counts";
    EXPECT_EQ(st.snapshot_bytes, m->conversation_statistics().bytes);
    ASSERT_GT(st.snapshot_bytes, 0u);
    ASSERT_LE(st.snapshot_bytes, 2 * mib) << "the snapshot leaves no room for the test's growth";

    // An unrelated prompt needing more than the budget has left beside the snapshot, but less than
    // the budget: the snapshot goes.
    const size_t n = tokens_for(i, 3 * mib - st.snapshot_bytes + mib / 2);
    ASSERT_LT(n + 8, static_cast<size_t>(i.n_ctx));
    session other(m);
    const auto r = other.generate(tokens(n, 4, i.n_vocab), greedy(2));
    EXPECT_EQ(r.tokens.size(), 2u);
    st = m->memory_statistics();
    EXPECT_EQ(st.evictions, 1u);
    EXPECT_EQ(st.snapshot_bytes, 0u);
    EXPECT_TRUE(m->conversation_statistics().entries.empty());
    EXPECT_EQ(st.refusals, 0u);
    EXPECT_LE(st.used(), 3 * mib);

    // Past the whole budget (within the context), with nothing left to evict: refused.
    const size_t past = tokens_for(i, 3 * mib + mib / 2);
    ASSERT_LT(past + 8, static_cast<size_t>(i.n_ctx));
    EXPECT_THROW(other.generate(tokens(past, 5, i.n_vocab), greedy(2)), request_error);
    EXPECT_EQ(m->memory_statistics().refusals, 1u);
}

TEST(MemoryBudget, RecurrentStateCheckpointsCount) {
    const auto m = load(64, 0, make_model::arch::qwen35moe);
    const model_info& i = m->info();
    session s(m);
    s.generate(tokens(300, 9, i.n_vocab), greedy(2));
    ASSERT_GT(s.state_checkpoints(), 1u);
    memory_budget_stats st = m->memory_statistics();
    EXPECT_EQ(st.checkpoint_bytes, s.state_checkpoint_bytes());
    EXPECT_EQ(st.kv_bytes, s.kv_bytes());
    session other(m);
    other.generate(tokens(100, 10, i.n_vocab), greedy(2));
    EXPECT_EQ(m->memory_statistics().checkpoint_bytes, s.state_checkpoint_bytes() + other.state_checkpoint_bytes());
}

TEST(MemoryBudget, ASnapshotTheBudgetCannotHoldIsNotParked) {
    const auto m = load(1, 64);
    const model_info& i = m->info();
    session s(m);
    s.generate(tokens(tokens_for(i, mib / 2), 6, i.n_vocab), greedy(2));
    EXPECT_EQ(s.park(), 0u);  // a snapshot maps 2 MiB granules: more than the budget
    const memory_budget_stats st = m->memory_statistics();
    EXPECT_EQ(st.snapshot_bytes, 0u);
    EXPECT_EQ(st.kv_bytes, s.kv_bytes());
}

}  // namespace
}  // namespace strata
