#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <cstring>
#include <map>
#include <stdexcept>
#include <random>
#include <thread>
#include <vector>

#include <oneapi/tbb/global_control.h>

#include "expert_pool.hpp"
#include "numa_policy.hpp"

using namespace strata::arenas;

namespace {

pool_plan test_plan(int n_slices, std::optional<int> workers = std::nullopt) {
    pool_requests req;
    req.mode = numa_pool_mode::test;
    req.test_slices = n_slices;
    req.pool_workers = workers;
    return plan_pool(load_synthetic_topology("pack:1 numa:1 core:4 pu:1"), req);
}

pool_plan off_plan(int workers) {
    pool_requests req;
    req.pool_workers = workers;
    return plan_pool(load_synthetic_topology("pack:1 numa:1 core:4 pu:1"), req);
}

// Every item of every slice written exactly once, whatever the slicing.
void expect_every_item_once(expert_pool& pool, std::size_t n_items) {
    std::vector<std::vector<std::atomic<int>>> hits(static_cast<std::size_t>(pool.n_slices()));
    for (auto& h : hits) h = std::vector<std::atomic<int>>(n_items);
    pool.run_phase(n_items, [&](int s, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) hits[static_cast<std::size_t>(s)][i].fetch_add(1);
    });
    for (auto& h : hits)
        for (auto& x : h) ASSERT_EQ(x.load(), 1);
}

}  // namespace

// Results identical across slicings and worker counts are tested on the real expert phases
// (MoePhases.BitwiseIdenticalAcrossSlicingsWorkersTokensFormatsAndRepeats); here, the pool's part:
// every item of every slice runs exactly once, whatever the slices and workers.
TEST(ExpertPool, RunsEveryItemOnceInEverySlice) {
    for (int slices : {1, 2, 4})
        for (int workers : {1, 2, 3, 4}) {
            expert_pool pool(test_plan(slices, workers));
            EXPECT_EQ(pool.n_slices(), slices);
            for (int rep = 0; rep < 20; ++rep) expect_every_item_once(pool, 37);
            EXPECT_EQ(pool.phases_run(), 20u);
        }
    expert_pool single(off_plan(2));
    expect_every_item_once(single, 100);
}

TEST(ExpertPool, DifferentItemCountsAndEmptySlices) {
    expert_pool pool(test_plan(3));
    std::vector<std::size_t> n{5, 0, 9};
    std::vector<std::atomic<std::size_t>> sum(3);
    pool.run_phase(n, [&](int s, std::size_t b, std::size_t e) { sum[static_cast<std::size_t>(s)] += e - b; });
    EXPECT_EQ(sum[0].load(), 5u);
    EXPECT_EQ(sum[1].load(), 0u);
    EXPECT_EQ(sum[2].load(), 9u);
    std::vector<std::size_t> wrong{1, 2};
    EXPECT_THROW(pool.run_phase(wrong, [](int, std::size_t, std::size_t) {}), std::invalid_argument);
}

TEST(ExpertPool, WorkerExceptionIsRethrownOnTheCaller) {
    expert_pool pool(test_plan(2));
    for (int bad_slice : {0, 1}) {
        try {
            pool.run_phase(64, [&](int s, std::size_t b, std::size_t e) {
                if (s == bad_slice && b <= 10 && 10 < e) throw std::runtime_error("item 10 failed in slice " + std::to_string(s));
            });
            FAIL() << "no exception";
        } catch (const std::runtime_error& e) {
            EXPECT_EQ(std::string(e.what()), "item 10 failed in slice " + std::to_string(bad_slice));
        }
        expect_every_item_once(pool, 16);  // the pool still works afterwards
    }
}

TEST(ExpertPool, StressPhasesWithIdleGapsLongerThanTheSpin) {
    pool_options options;
    options.spin = std::chrono::microseconds(20);
    expert_pool pool(test_plan(2), options);
    std::atomic<std::size_t> total{0};
    for (int phase = 0; phase < 1000; ++phase) {
        pool.run_phase(8, [&](int, std::size_t b, std::size_t e) { total += e - b; });
        if (phase % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    EXPECT_EQ(total.load(), 1000u * 8 * 2);
    EXPECT_EQ(pool.stalls_reported(), 0u);
}

// Members retire when no phase opens within the spin and the host enqueues them again: gaps around
// the spin time hit the window where a member retires just as a phase opens. No phase may lose an
// item, run one twice or wait for a member that is gone.
TEST(ExpertPool, PhasesOpeningAsMembersRetire) {
    pool_options options;
    options.spin = std::chrono::microseconds(5);
    expert_pool pool(test_plan(2, 3), options);
    std::mt19937 rng(7);
    for (int phase = 0; phase < 3000; ++phase) {
        expect_every_item_once(pool, 1 + phase % 23);
        const auto gap = std::chrono::nanoseconds(rng() % 10000);
        for (const auto until = std::chrono::steady_clock::now() + gap; std::chrono::steady_clock::now() < until;) {
        }
    }
    EXPECT_EQ(pool.phases_run(), 3000u);
}

// A participant held up by a slow item does not hold up the rest of its share: the others take it.
TEST(ExpertPool, OthersTakeTheRestOfASlowParticipantsShare) {
    expert_pool pool(off_plan(2));  // the host and 2 workers, 10 items each
    std::vector<std::thread::id> ran(30);
    pool.run_phase(30, [&](int, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) {
            ran[i] = std::this_thread::get_id();
            if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    });
    // Item 0's chunk is the front half of the host's share; the back half went to the others.
    for (std::size_t i = 5; i < 10; ++i) EXPECT_NE(ran[i], ran[0]) << "item " << i;
}

TEST(ExpertPool, StalledPhaseIsReportedWithSliceAndItems) {
    pool_options options;
    options.stall_after = std::chrono::milliseconds(100);
    std::atomic<bool> release{false};
    std::vector<stall_report> reports;
    std::mutex m;
    options.on_stall = [&](const stall_report& r) {
        std::lock_guard lock(m);
        reports.push_back(r);
        release = true;
    };
    expert_pool pool(test_plan(2), options);
    pool.run_phase(8, [&](int s, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i)
            if (s == 1 && i == 5)
                while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }, 1);
    ASSERT_GE(reports.size(), 1u);
    EXPECT_EQ(reports[0].slice, 1);
    EXPECT_EQ(reports[0].items_total, 8u);
    EXPECT_LT(reports[0].items_done, 8u);
    EXPECT_GE(reports[0].seconds, 0.1);
    EXPECT_GE(pool.stalls_reported(), 1u);
}

TEST(ExpertPool, PoolIssuesNoNumaSystemCall) {
    const auto before = numa_calls().total();
    {
        expert_pool pool(test_plan(2));
        expect_every_item_once(pool, 64);
        auto pool2 = expert_pool::create(load_machine_topology(), pool_requests{});
        expect_every_item_once(*pool2, 64);
    }
    EXPECT_EQ(numa_calls().total(), before);
}

TEST(ExpertPool, SplitOnSyntheticTwoNodesPinsWithinEachNode) {
    // A 2-node plan over this machine's real CPUs: with one real CPU per "node" we can check pinning.
    const auto cpus = allowed_cpus();
    if (cpus.size() < 2) GTEST_SKIP() << "needs 2 allowed CPUs";
    pool_plan plan;
    plan.split = true;
    plan.host_cpu = cpus[0];
    plan.host_slice = 0;
    plan.slices = {pool_slice{0, {cpus[0]}, 0, true, true}, pool_slice{1, {cpus[1]}, 1, false, true}};
    expert_pool pool(plan);
    for (int rep = 0; rep < 50; ++rep) expect_every_item_once(pool, 32);
    std::string why;
    EXPECT_TRUE(pool.affinity_ok(&why)) << why;
    EXPECT_EQ(pool.pin_failures(), 0u);
    const auto seen = pool.cpus_seen();
    EXPECT_EQ(seen[0], (std::vector<int>{cpus[0]}));
    EXPECT_EQ(seen[1], (std::vector<int>{cpus[1]}));
}

TEST(ExpertPool, OptionsFromEnvironment) {
    std::map<std::string, std::string> vars{{"STRATA_POOL_SPIN_US", "250"}, {"STRATA_POOL_STALL_MS", "1500"}};
    auto env = [&](std::string_view n) -> std::optional<std::string> {
        auto it = vars.find(std::string(n));
        return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
    auto o = read_pool_options(env);
    EXPECT_EQ(o.spin, std::chrono::microseconds(250));
    EXPECT_EQ(o.stall_after, std::chrono::milliseconds(1500));
    vars["STRATA_POOL_SPIN_US"] = "fast";
    EXPECT_THROW(read_pool_options(env), std::invalid_argument);
}

// An application's own TBB limit: the pool raises it only while it lives, or (raise_tbb_limit off,
// STRATA_POOL_TBB_LIMIT=keep) leaves it alone and says why it cannot run.
TEST(ExpertPool, TbbThreadLimitIsRaisedOnlyWhileThePoolLivesOrLeftToTheApplication) {
    using tbb_limit = oneapi::tbb::global_control;
    const tbb_limit application(tbb_limit::max_allowed_parallelism, 2);
    ASSERT_EQ(tbb_limit::active_value(tbb_limit::max_allowed_parallelism), 2u);
    const pool_plan plan = test_plan(2, 4);
    ASSERT_GT(plan.total_threads(), 2);
    pool_options keep;
    keep.raise_tbb_limit = false;
    try {
        expert_pool pool(plan, keep);
        FAIL() << "a pool that needs more threads than the application allows was built";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(plan.total_threads()) + " TBB threads but "
                                             "tbb::global_control allows 2"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_EQ(tbb_limit::active_value(tbb_limit::max_allowed_parallelism), 2u);
    // Raising cannot override the application's lower limit (the smallest wins): refused, not starved.
    EXPECT_THROW(expert_pool(plan, pool_options{}), std::invalid_argument);
    EXPECT_EQ(tbb_limit::active_value(tbb_limit::max_allowed_parallelism), 2u);
    const auto env = [](std::string_view name) -> std::optional<std::string> {
        return name == "STRATA_POOL_TBB_LIMIT" ? std::optional<std::string>("keep") : std::nullopt;
    };
    EXPECT_FALSE(read_pool_options(env).raise_tbb_limit);
    EXPECT_THROW(read_pool_options([](std::string_view name) -> std::optional<std::string> {
                     return name == "STRATA_POOL_TBB_LIMIT" ? std::optional<std::string>("off") : std::nullopt;
                 }),
                 std::invalid_argument);
}
