#include <gtest/gtest.h>

#include <map>

#include "pool_plan.hpp"

using namespace strata::arenas;

namespace {

env_lookup fake_env(std::map<std::string, std::string> vars) {
    return [vars](std::string_view name) -> std::optional<std::string> {
        auto it = vars.find(std::string(name));
        if (it == vars.end()) return std::nullopt;
        return it->second;
    };
}

pool_plan plan_for(const std::string& desc, std::map<std::string, std::string> env, pool_flags flags = {},
                   std::optional<std::vector<int>> allowed = std::nullopt) {
    return plan_pool(load_synthetic_topology(desc, allowed), read_pool_requests(fake_env(std::move(env)), flags));
}

std::vector<int> threads_of(const pool_plan& p) {
    std::vector<int> t;
    for (const auto& s : p.slices) t.push_back(s.threads());
    return t;
}

const std::string two_sockets_12 = "pack:2 numa:1 core:12 pu:2";  // 2x Xeon Gold 6226 shape

}  // namespace

TEST(PoolPlan, OneNodeUnsetIsTodaysPoolAndSilent) {
    auto p = plan_for("pack:1 numa:1 core:8 pu:2", {});
    EXPECT_FALSE(p.split);
    EXPECT_FALSE(p.test_mode);
    ASSERT_EQ(p.slices.size(), 1u);
    EXPECT_EQ(p.slices[0].workers, 7);  // physical cores minus the host core
    EXPECT_TRUE(p.slices[0].has_host);
    EXPECT_FALSE(p.slices[0].pinned);
    EXPECT_TRUE(p.log.empty());
}

TEST(PoolPlan, OneNodeForcedOnSaysWhyInOneLine) {
    auto p = plan_for("pack:1 numa:1 core:8 pu:2", {{"STRATA_NUMA_POOL", "1"}});
    EXPECT_FALSE(p.split);
    ASSERT_EQ(p.log.size(), 1u);
    EXPECT_EQ(p.log[0].text, "NUMA split off: the pool's CPUs span 1 NUMA node(s)");
    EXPECT_EQ(p.slices[0].workers, 7);
}

TEST(PoolPlan, TwoNodesSplitByDefault) {
    for (const char* mode : {"", "1"}) {
        std::map<std::string, std::string> env;
        if (*mode) env["STRATA_NUMA_POOL"] = mode;
        auto p = plan_for(two_sockets_12, env);
        EXPECT_TRUE(p.split) << mode;
        ASSERT_EQ(p.slices.size(), 2u);
        EXPECT_EQ(p.total_workers(), 22);  // 24 cores - host core - one spare
        EXPECT_EQ(threads_of(p), (std::vector<int>{12, 11}));
        EXPECT_EQ(p.slices[0].node, 0);
        EXPECT_EQ(p.slices[1].node, 1);
        EXPECT_TRUE(p.slices[0].has_host);
        EXPECT_TRUE(p.slices[1].pinned);
        EXPECT_EQ(p.slices[1].cores.front(), 24);  // one PU per core: 24, 26, ...
        EXPECT_EQ(p.slices[1].cores[1], 26);
        ASSERT_EQ(p.log.size(), 1u);
        EXPECT_EQ(p.log[0].text, "NUMA split on: slice 0 = node 0 (12 threads), slice 1 = node 1 (11 threads)");
    }
}

TEST(PoolPlan, FourNodes) {
    auto p = plan_for("pack:4 numa:1 core:4 pu:1", {});
    EXPECT_TRUE(p.split);
    EXPECT_EQ(p.slices.size(), 4u);
    EXPECT_EQ(p.total_workers(), 14);
    EXPECT_EQ(threads_of(p), (std::vector<int>{4, 4, 4, 3}));
    EXPECT_EQ(p.slices[2].cores, (std::vector<int>{8, 9, 10, 11}));
}

TEST(PoolPlan, DefaultCappedAt32AndByMaxWorkers) {
    auto p = plan_for("pack:2 numa:1 core:24 pu:2", {});
    EXPECT_TRUE(p.split);
    EXPECT_EQ(p.total_workers(), 32);
    EXPECT_EQ(threads_of(p), (std::vector<int>{17, 16}));
    auto q = plan_for("pack:2 numa:1 core:24 pu:2", {{"STRATA_POOL_MAX_WORKERS", "8"}});
    EXPECT_EQ(q.total_workers(), 8);
    EXPECT_EQ(threads_of(q), (std::vector<int>{5, 4}));
}

TEST(PoolPlan, ZeroKeepsTheDefaultOnTheHostsNode) {
    auto p = plan_for(two_sockets_12, {{"STRATA_NUMA_POOL", "0"}});
    EXPECT_FALSE(p.split);
    ASSERT_EQ(p.slices.size(), 1u);
    EXPECT_EQ(p.slices[0].node, 0);
    EXPECT_EQ(p.slices[0].workers, 11);
    ASSERT_EQ(p.log.size(), 1u);
    EXPECT_EQ(p.log[0].text.rfind("NUMA split off: STRATA_NUMA_POOL=0 turns it off", 0), 0u) << p.log[0].text;
}

TEST(PoolPlan, ZeroWithManyWorkersSpreadsUnpinned) {
    auto p = plan_for(two_sockets_12, {{"STRATA_NUMA_POOL", "0"}}, {.pool_workers = 20});
    ASSERT_EQ(p.slices.size(), 1u);
    EXPECT_EQ(p.slices[0].node, -1);
    EXPECT_EQ(p.slices[0].workers, 20);
    EXPECT_EQ(p.slices[0].cores.size(), 24u);
    EXPECT_FALSE(p.slices[0].pinned);
}

TEST(PoolPlan, ExplicitWorkersAlternateNodes) {
    auto p = plan_for(two_sockets_12, {}, {.pool_workers = 6});
    EXPECT_TRUE(p.split);
    EXPECT_EQ(p.total_workers(), 6);
    EXPECT_EQ(threads_of(p), (std::vector<int>{4, 3}));
    auto q = plan_for("pack:4 numa:1 core:4 pu:1", {}, {.pool_workers = 5});
    EXPECT_EQ(threads_of(q), (std::vector<int>{2, 2, 1, 1}));
}

TEST(PoolPlan, ExplicitWorkersBeyondCoresAreClamped) {
    auto p = plan_for("pack:2 numa:1 core:4 pu:1", {}, {.pool_workers = 40});
    EXPECT_TRUE(p.split);
    EXPECT_EQ(p.total_workers(), 7);
    ASSERT_EQ(p.log.size(), 2u);
    EXPECT_NE(p.log[0].text.find("asked for 40 workers"), std::string::npos);
}

TEST(PoolPlan, LopsidedLayoutIsRefused) {
    // Node 1 keeps one allowed core: 3 threads against 1.
    auto p = plan_for("pack:2 numa:1 core:4 pu:1", {}, {}, std::vector<int>{0, 1, 2, 3, 4});
    EXPECT_FALSE(p.split);
    ASSERT_EQ(p.log.size(), 1u);
    EXPECT_EQ(p.log[0].text.rfind("NUMA split off: the layout is lopsided", 0), 0u) << p.log[0].text;
    ASSERT_EQ(p.slices.size(), 1u);
    EXPECT_EQ(p.slices[0].node, 0);
    EXPECT_EQ(p.slices[0].workers, 3);
}

TEST(PoolPlan, ArenaWorkersOverrideAndCanBeLopsided) {
    auto ok = plan_for("pack:2 numa:1 core:8 pu:1", {{"STRATA_ARENA_WORKERS", "5,6"}, {"TBB_NUM_THREADS", "2"}});
    EXPECT_TRUE(ok.split);
    EXPECT_EQ(threads_of(ok), (std::vector<int>{6, 6}));
    auto bad = plan_for("pack:2 numa:1 core:8 pu:1", {{"STRATA_ARENA_WORKERS", "1,6"}});
    EXPECT_FALSE(bad.split);
    EXPECT_NE(bad.reason.find("lopsided"), std::string::npos);
    auto wrong_len = plan_for("pack:2 numa:1 core:8 pu:1", {{"STRATA_ARENA_WORKERS", "1,2,3"}});
    EXPECT_TRUE(wrong_len.split);
    EXPECT_EQ(wrong_len.total_workers(), 14);
    EXPECT_NE(wrong_len.log[0].text.find("so it is ignored"), std::string::npos);
}

TEST(PoolPlan, NotLinuxAndPinningFailureRefuse) {
    auto topo = load_synthetic_topology(two_sockets_12);
    pool_requests req;
    req.is_linux = false;
    auto p = plan_pool(topo, req);
    EXPECT_FALSE(p.split);
    EXPECT_NE(p.log.at(0).text.find("needs Linux"), std::string::npos);
    EXPECT_EQ(p.slices.at(0).workers, 11);
    req.is_linux = true;
    req.pinning_failed = true;
    auto q = plan_pool(topo, req);
    EXPECT_FALSE(q.split);
    EXPECT_NE(q.log.at(0).text.find("pinning a worker thread"), std::string::npos);
}

TEST(PoolPlan, TestModeOnAnyMachine) {
    auto p = plan_for("pack:1 numa:1 core:4 pu:1", {{"STRATA_NUMA_POOL", "test"}});
    EXPECT_TRUE(p.test_mode);
    EXPECT_FALSE(p.split);
    ASSERT_EQ(p.slices.size(), 2u);
    EXPECT_FALSE(p.slices[0].pinned);
    EXPECT_EQ(p.slices[0].cores, (std::vector<int>{0, 1}));
    EXPECT_EQ(p.total_workers(), 2);
    ASSERT_EQ(p.log.size(), 1u);
    EXPECT_EQ(p.log[0].text.rfind("NUMA split test mode: 2 slices", 0), 0u);
    auto q = plan_for("pack:1 numa:1 core:2 pu:1", {{"STRATA_NUMA_POOL", "test:4"}});
    ASSERT_EQ(q.slices.size(), 4u);
    for (const auto& s : q.slices) EXPECT_GE(s.threads(), 1);
    auto r = plan_for("pack:1 numa:1 core:2 pu:1", {{"STRATA_NUMA_POOL", "test:3"}}, {.pool_workers = 7});
    EXPECT_EQ(r.total_workers(), 7);  // no capacity clamp in test mode
}

TEST(PoolPlan, MemoryOnlyNodeNeverGetsASlice) {
    auto p = plan_for("[numa(memory=1GB)] pack:2 [numa(memory=2GB)] core:4 pu:1", {});
    EXPECT_TRUE(p.split);
    ASSERT_EQ(p.slices.size(), 2u);
    EXPECT_EQ(p.slices[0].node, 0);
    EXPECT_EQ(p.slices[1].node, 1);
    auto q = plan_for("[numa(memory=1GB)] pack:1 [numa(memory=2GB)] core:4 pu:1", {});
    EXPECT_FALSE(q.split);
    EXPECT_TRUE(q.log.empty());
}

TEST(PoolPlan, RestrictedAffinityToOneNodeIsSilentOneNode) {
    auto p = plan_for(two_sockets_12, {}, {}, std::vector<int>{24, 26, 28, 30});
    EXPECT_FALSE(p.split);
    EXPECT_TRUE(p.log.empty());
    EXPECT_EQ(p.slices[0].node, 1);
    EXPECT_EQ(p.slices[0].workers, 3);
    EXPECT_EQ(p.host_cpu, 24);
}

TEST(PoolPlan, HostCoreOnSecondNode) {
    auto topo = load_synthetic_topology(two_sockets_12);
    pool_requests req;
    req.host_cpu = 25;  // SMT sibling of core 24 on node 1
    auto p = plan_pool(topo, req);
    EXPECT_EQ(p.host_cpu, 24);
    EXPECT_EQ(p.host_slice, 1);
    EXPECT_TRUE(p.slices[1].has_host);
    EXPECT_EQ(threads_of(p), (std::vector<int>{11, 12}));
    req.host_cpu = 999;
    auto q = plan_pool(topo, req);
    EXPECT_EQ(q.host_cpu, 0);
    EXPECT_NE(q.log.at(0).text.find("not among the pool's allowed CPUs"), std::string::npos);
}

TEST(PoolPlan, HostNodePutsTheHostCoreOnThatNode) {
    auto topo = load_synthetic_topology(two_sockets_12);
    pool_requests req;
    req.host_node = 1;  // the GPU's node
    auto p = plan_pool(topo, req);
    EXPECT_TRUE(p.split);
    EXPECT_EQ(p.host_cpu, 24);  // node 1's first core
    EXPECT_EQ(p.host_slice, 1);
    EXPECT_EQ(p.slices[1].node, 1);
    EXPECT_TRUE(p.slices[1].has_host);
    EXPECT_FALSE(p.slices[0].has_host);
    EXPECT_EQ(threads_of(p), (std::vector<int>{11, 12}));
    ASSERT_EQ(p.log.size(), 1u);  // only "NUMA split on"
    EXPECT_EQ(p.log[0].text, "NUMA split on: slice 0 = node 0 (11 threads), slice 1 = node 1 (12 threads)");

    req.mode = numa_pool_mode::off;  // split off: the single slice follows the host to node 1
    auto q = plan_pool(topo, req);
    EXPECT_EQ(q.host_cpu, 24);
    ASSERT_EQ(q.slices.size(), 1u);
    EXPECT_EQ(q.slices[0].node, 1);
}

TEST(PoolPlan, ExplicitHostCpuWinsOverHostNode) {
    auto topo = load_synthetic_topology(two_sockets_12);
    pool_requests req;
    req.host_cpu = 2;  // core 2 on node 0
    req.host_node = 1;
    auto p = plan_pool(topo, req);
    EXPECT_EQ(p.host_cpu, 2);
    EXPECT_EQ(p.host_slice, 0);
    EXPECT_TRUE(p.slices[0].has_host);
    ASSERT_EQ(p.log.size(), 1u);
    EXPECT_EQ(p.log[0].text.rfind("NUMA split on", 0), 0u);
}

TEST(PoolPlan, HostNodeWithoutCpusFallsBackAndSaysWhich) {
    const std::string desc = "[numa(memory=1GB)] pack:2 [numa(memory=2GB)] core:4 pu:1";
    auto topo = load_synthetic_topology(desc);
    const numa_node* memory_only = nullptr;
    for (const auto& n : topo.nodes)
        if (!n.has_cpus()) memory_only = &n;
    ASSERT_NE(memory_only, nullptr) << topo.describe();
    pool_requests req;
    req.host_node = memory_only->os_index;
    auto p = plan_pool(topo, req);
    auto today = plan_pool(topo, pool_requests{});
    EXPECT_EQ(p.host_cpu, today.host_cpu);
    EXPECT_EQ(p.host_slice, today.host_slice);
    EXPECT_TRUE(p.split);
    ASSERT_EQ(p.log.size(), 2u);
    EXPECT_EQ(p.log[0].level, log_level::warn);
    EXPECT_EQ(p.log[0].text, "The host thread was asked for NUMA node " + std::to_string(memory_only->os_index) +
                                 ", which has no CPU the pool may use (a memory-only node, or outside the process's "
                                 "CPU affinity); it runs on CPU 0 of node " +
                                 std::to_string(topo.node_of_cpu(0)->os_index) + " instead.");
}

TEST(PoolPlan, HostNodeOutOfRangeFallsBackAndSaysWhich) {
    auto topo = load_synthetic_topology(two_sockets_12);
    for (int node : {2, -1}) {
        pool_requests req;
        req.host_node = node;
        auto p = plan_pool(topo, req);
        EXPECT_EQ(p.host_cpu, 0) << node;
        EXPECT_EQ(p.host_slice, 0) << node;
        ASSERT_EQ(p.log.size(), 2u) << node;
        EXPECT_EQ(p.log[0].text, "The host thread was asked for NUMA node " + std::to_string(node) +
                                     ", which is not among this machine's NUMA nodes (0, 1); it runs on CPU 0 of "
                                     "node 0 instead.");
    }
}

TEST(PoolRequests, PrecedenceOfFlagsOverEnvironment) {
    auto env = fake_env({{"STRATA_NUMA_POOL", "1"}, {"TBB_NUM_THREADS", "9"}});
    auto from_env = read_pool_requests(env);
    EXPECT_EQ(from_env.mode, numa_pool_mode::on);
    EXPECT_EQ(from_env.pool_workers, 9);
    EXPECT_EQ(from_env.mode_source, "STRATA_NUMA_POOL=1");
    auto from_flags = read_pool_requests(env, {.numa_pool = "off", .pool_workers = 3});
    EXPECT_EQ(from_flags.mode, numa_pool_mode::off);
    EXPECT_EQ(from_flags.pool_workers, 3);
    EXPECT_EQ(from_flags.mode_source, "--numa-pool off");
    auto none = read_pool_requests(fake_env({}));
    EXPECT_EQ(none.mode, numa_pool_mode::automatic);
    EXPECT_FALSE(none.pool_workers);
    EXPECT_EQ(none.max_workers, 32);
}

TEST(PoolRequests, ParsesEveryValue) {
    EXPECT_EQ(read_pool_requests(fake_env({{"STRATA_NUMA_POOL", "0"}})).mode, numa_pool_mode::off);
    EXPECT_EQ(read_pool_requests(fake_env({{"STRATA_NUMA_POOL", ""}})).mode, numa_pool_mode::automatic);
    auto t = read_pool_requests(fake_env({{"STRATA_NUMA_POOL", "test:3"}}));
    EXPECT_EQ(t.mode, numa_pool_mode::test);
    EXPECT_EQ(t.test_slices, 3);
    EXPECT_EQ(read_pool_requests(fake_env({}), {.numa_pool = "test"}).test_slices, 2);
    EXPECT_EQ(read_pool_requests(fake_env({}), {.numa_pool = "auto"}).mode, numa_pool_mode::automatic);
    EXPECT_EQ(read_pool_requests(fake_env({{"STRATA_ARENA_WORKERS", "3,0,2"}})).arena_workers,
              (std::vector<int>{3, 0, 2}));
    EXPECT_EQ(read_pool_requests(fake_env({{"STRATA_POOL_MAX_WORKERS", "4"}})).max_workers, 4);
    EXPECT_THROW(read_pool_requests(fake_env({{"STRATA_NUMA_POOL", "2"}})), std::invalid_argument);
    EXPECT_THROW(read_pool_requests(fake_env({{"STRATA_NUMA_POOL", "test:0"}})), std::invalid_argument);
    EXPECT_THROW(read_pool_requests(fake_env({{"TBB_NUM_THREADS", "-1"}})), std::invalid_argument);
    EXPECT_THROW(read_pool_requests(fake_env({{"STRATA_ARENA_WORKERS", "2,x"}})), std::invalid_argument);
    EXPECT_THROW(read_pool_requests(fake_env({{"STRATA_POOL_MAX_WORKERS", "0"}})), std::invalid_argument);
}
