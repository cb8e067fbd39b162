// expert_store and hot_node on this (one-node) machine: per-slice copies in test mode without any NUMA
// call, the single copy and --mmap-experts without the split, a split whose slices share node 0 (mbind
// and move_pages for real), the room check that refuses a full node before placing anything, claimed memory, the region map, and the hot node's
// "off means no NUMA system call".
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <limits>
#include <sstream>

#include <spdlog/fmt/fmt.h>
#include <spdlog/sinks/ostream_sink.h>

#include "expert_store.hpp"
#include "hot_node.hpp"
#include "log.hpp"
#include "moe_fixture.hpp"

using namespace strata::arenas;
using namespace strata::arenas::testing;
using strata::formats::ggml_type;

namespace {

constexpr moe_shape shape{512, 256, 8, 4};

const synthetic_moe& model() {
    static const synthetic_moe m = make_synthetic_moe(
        shape, {{ggml_type::Q4_K, ggml_type::Q4_K, ggml_type::Q6_K}, {ggml_type::Q8_0, ggml_type::IQ4_XS, ggml_type::Q8_0}}, 99);
    return m;
}

topology four_cores() { return load_synthetic_topology("pack:1 numa:1 core:4 pu:1"); }

pool_plan test_plan(int n) {
    pool_requests req;
    req.mode = numa_pool_mode::test;
    req.test_slices = n;
    req.pool_workers = n;
    return plan_pool(four_cores(), req);
}

pool_plan off_plan() {
    pool_requests req;
    req.pool_workers = 1;
    return plan_pool(four_cores(), req);
}

// A split whose two slices both live on this machine's node 0: real mbind, first touch and move_pages.
pool_plan split_on_node0() {
    const auto topo = load_machine_topology();
    const auto& node = topo.nodes.front();
    const int cpu = node.cores.front().cpu;
    pool_plan plan;
    plan.split = true;
    plan.host_cpu = cpu;
    plan.slices = {pool_slice{node.os_index, {cpu}, 0, true, true}, pool_slice{node.os_index, {cpu}, 1, false, true}};
    return plan;
}

// Outputs of every layer for a few routings, through `rows`.
std::vector<std::vector<float>> outputs(expert_pool& pool, const expert_rows& rows) {
    const synthetic_moe& m = model();
    moe_runner runner(pool, m.shape, m.layers, rows);
    std::vector<std::vector<float>> out;
    for (int layer = 0; layer < 2; ++layer)
        for (int n_tok : {1, 5}) {
            std::mt19937 rng(static_cast<uint32_t>(layer * 10 + n_tok));
            const routing r = make_routing(shape, n_tok, rng);
            out.emplace_back(r.x.size(), std::numeric_limits<float>::quiet_NaN());
            runner.run(layer, n_tok, r.x.data(), r.ids.data(), r.weights.data(), out.back().data());
        }
    return out;
}

const std::vector<std::vector<float>>& expected() {
    static const auto want = [] {
        expert_pool pool(off_plan());
        return outputs(pool, mapped_expert_rows(model().layers));
    }();
    return want;
}

void expect_same(const std::vector<std::vector<float>>& got, const std::string& what) {
    const auto& want = expected();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)), 0) << what << ", case " << i;
}

// Collects the "arenas" logger's lines while it lives.
struct log_capture {
    std::ostringstream text;
    std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
    log_capture() { strata::logger("arenas")->sinks().push_back(sink); }
    ~log_capture() {
        auto& sinks = strata::logger("arenas")->sinks();
        sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
    }
};

}  // namespace

TEST(ExpertStore, TestModeCopiesPerSliceWithoutNumaCalls) {
    const auto& m = model();
    for (int n : {2, 3}) {
        expert_pool pool(test_plan(n));
        region_map regions(::testing::TempDir() + "/store-regions.json");
        std::vector<int> copied;
        store_options options;
        options.regions = &regions;
        options.on_layer_copied = [&](int layer) { copied.push_back(layer); };
        const auto calls = numa_calls().total();
        expert_store store(pool, m.shape, m.layers, std::move(options));
        EXPECT_EQ(numa_calls().total(), calls) << "test mode must not issue a NUMA system call";
        EXPECT_EQ(copied, (std::vector<int>{0, 1}));
        EXPECT_EQ(store.placement().mode, store_mode::test);
        EXPECT_TRUE(store.placement().nodes.empty());
        const auto per_slice = expert_store::bytes_per_slice(pool.plan(), m.shape, m.layers);
        size_t total = 0;
        for (auto b : per_slice) total += b;
        EXPECT_EQ(store.placement().bytes, total);
        ASSERT_EQ(regions.regions().size(), static_cast<size_t>(n));
        for (const auto& r : regions.regions()) EXPECT_EQ(r.node, -1);
        // Slices read their own copies, not the model's rows.
        const auto ff = split_rows(pool.plan(), shape.n_ff, moe_runner::row_block);
        for (int s = 0; s < n; ++s) {
            const auto rows = store.rows(0, expert_part::gate, 3, s, ff[static_cast<size_t>(s)].begin);
            const auto* model_row = m.layers[0].gate.experts[3] + static_cast<size_t>(ff[static_cast<size_t>(s)].begin) * m.layers[0].gate.row_stride;
            EXPECT_NE(rows.data, model_row);
            EXPECT_EQ(std::memcmp(rows.data, model_row, m.layers[0].gate.row_stride), 0);
        }
        expect_same(outputs(pool, store), "test:" + std::to_string(n));
    }
}

TEST(ExpertStore, SplitOffOneCopyOrMappedRows) {
    const auto& m = model();
    expert_pool pool(off_plan());
    {
        expert_store store(pool, m.shape, m.layers);
        EXPECT_EQ(store.placement().mode, store_mode::copy);
        EXPECT_NE(store.rows(1, expert_part::down, 2, 0, 0).data, m.layers[1].down.experts[2]);
        expect_same(outputs(pool, store), "one copy");
    }
    store_options options;
    options.mmap_experts = true;
    int copied = 0;
    options.on_layer_copied = [&](int) { ++copied; };
    expert_store mapped(pool, m.shape, m.layers, std::move(options));
    EXPECT_EQ(mapped.placement().mode, store_mode::mapped);
    EXPECT_EQ(mapped.placement().bytes, 0u);
    EXPECT_EQ(copied, 0);
    EXPECT_EQ(mapped.rows(1, expert_part::down, 2, 0, 0).data, m.layers[1].down.experts[2]);
    expect_same(outputs(pool, mapped), "mmap experts");
}

TEST(ExpertStore, SplitBindsAndSamplesEverySlice) {
    if (!numa_policy_available()) GTEST_SKIP() << "no NUMA system calls on this platform";
    const auto& m = model();
    expert_pool pool(split_on_node0());
    log_capture log;
    const auto before = numa_calls();
    expert_store store(pool, m.shape, m.layers);
    EXPECT_EQ(numa_calls().mbind, before.mbind + 2);       // one buffer per slice
    EXPECT_EQ(numa_calls().move_pages, before.move_pages + 2);  // one sample per slice
    const auto& p = store.placement();
    EXPECT_EQ(p.mode, store_mode::split);
    ASSERT_EQ(p.nodes.size(), 2u);
    for (const auto& n : p.nodes) {
        EXPECT_GE(n.share, 0.99) << "slice " << n.slice;
        EXPECT_GT(n.pages_sampled, 0u);
    }
    EXPECT_TRUE(p.ok());
    const std::string text = log.text.str();
    EXPECT_NE(text.find("NUMA placement: node 0 100.0 %, node 0 100.0 %."), std::string::npos) << text;
    EXPECT_EQ(text.find("FAILED"), std::string::npos) << text;
    expect_same(outputs(pool, store), "split on node 0");
}

// A split over the two nodes of a synthetic topology, every slice on this machine's first CPU (the
// room check runs before any buffer is bound, so node 1 need not exist here).
pool_plan split_over(const topology& topo) {
    const int cpu = load_machine_topology().nodes.front().cores.front().cpu;
    pool_plan plan;
    plan.split = true;
    plan.host_cpu = cpu;
    for (std::size_t s = 0; s < topo.nodes.size(); ++s)
        plan.slices.push_back(pool_slice{topo.nodes[s].os_index, {cpu}, static_cast<int>(s), s == 0, true});
    return plan;
}

TEST(ExpertStore, SplitRefusesANodeWithoutRoomBeforePlacingAnything) {
    const auto& m = model();
    const auto topo = load_synthetic_topology("pack:2 numa:1 core:2 pu:1");
    ASSERT_EQ(topo.nodes.size(), 2u);
    expert_pool pool(split_over(topo));
    const auto share = expert_store::bytes_per_slice(pool.plan(), m.shape, m.layers);
    ASSERT_EQ(share.size(), 2u);
    constexpr std::uint64_t headroom = std::uint64_t{64} << 20;
    // Node 1 is one page short of its share plus the headroom.
    const std::uint64_t node1_available = share[1] + headroom - 4096;
    store_options options;
    options.headroom_bytes = headroom;
    options.node_available = [&](int node) {
        return std::optional<std::uint64_t>(node == 1 ? node1_available : std::uint64_t{64} << 30);
    };
    const auto before = numa_calls();
    try {
        expert_store store(pool, m.shape, m.layers, std::move(options));
        FAIL() << "a node without room for its share was accepted";
    } catch (const node_room_error& e) {
        const std::string what = e.what();
        const auto gib = [](std::uint64_t b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30)); };
        EXPECT_NE(what.find("NUMA node 1 has " + gib(node1_available) + " available"), std::string::npos) << what;
        EXPECT_NE(what.find("needs " + gib(share[1]) + " there plus 0.06 GiB kept free"), std::string::npos) << what;
        EXPECT_NE(what.find("--numa-pool off"), std::string::npos) << what;
    }
    EXPECT_EQ(numa_calls().total(), before.total()) << "nothing may be bound before the room check";

    // One page more and the check passes (the copy itself needs node 1, which this machine lacks).
    EXPECT_NO_THROW(require_node_room(1, share[1], node1_available + 4096, headroom, "a share", "a flag"));
}

TEST(ExpertStore, SlicesSharingANodeAreCheckedTogether) {
    if (!numa_policy_available()) GTEST_SKIP() << "no NUMA system calls on this platform";
    const auto& m = model();
    expert_pool pool(split_on_node0());
    const auto share = expert_store::bytes_per_slice(pool.plan(), m.shape, m.layers);
    ASSERT_EQ(share.size(), 2u);
    // Room for either slice alone, not for both.
    const std::uint64_t available = std::max(share[0], share[1]) + (std::uint64_t{1} << 20);
    store_options options;
    options.headroom_bytes = 0;
    options.node_available = [&](int) { return std::optional<std::uint64_t>(available); };
    const auto before = numa_calls();
    EXPECT_THROW(expert_store(pool, m.shape, m.layers, std::move(options)), node_room_error);
    EXPECT_EQ(numa_calls().total(), before.total());
}

// gather_expert (how the GPU's VRAM slots are filled) reads the store's copies, repacked for the prompt
// GEMM kernels or not: with the model's bytes overwritten after the copy, it still gives every row of
// the original expert in the GGUF layout.
TEST(ExpertStore, GatherReadsTheStoresCopiesNotTheModel) {
    for (const bool repack : {false, true}) {
        SCOPED_TRACE(repack ? "repacked store" : "GGUF-layout store");
        synthetic_moe m = make_synthetic_moe(
            shape, {{ggml_type::Q4_K, ggml_type::Q8_0, ggml_type::Q6_K}, {ggml_type::Q8_0, ggml_type::IQ4_XS, ggml_type::MXFP4}}, 7);
        const auto original = m.storage;
        expert_pool pool(test_plan(3));
        if (repack && strata::kernels::cpu::can_repack(ggml_type::Q4_K, m.shape.n_ff)) {  // Q4_K: 148 bytes per 256, not 144
            EXPECT_GT(expert_store::bytes_per_slice(pool.plan(), m.shape, m.layers, true)[0],
                      expert_store::bytes_per_slice(pool.plan(), m.shape, m.layers, false)[0]);
        }
        store_options options;
        options.repack = repack;
        const expert_store store(pool, m.shape, m.layers, std::move(options));
        for (auto& bytes : m.storage) std::memset(bytes.data(), 0xff, bytes.size());
        const mapped_expert_rows in_place(m.layers);
        for (int il = 0; il < 2; ++il)
            for (const expert_part part : {expert_part::gate, expert_part::up, expert_part::down})
                for (const int e : {0, 5}) {
                    const expert_tensor& t = m.layers[static_cast<std::size_t>(il)].part(part);
                    const std::size_t row_bytes = strata::formats::row_size(t.type, t.n_cols);
                    std::vector<std::uint8_t> want(row_bytes * static_cast<std::size_t>(t.n_rows));
                    const auto part_index = static_cast<std::size_t>(part);
                    const std::size_t expert_offset = static_cast<std::size_t>(t.experts[static_cast<std::size_t>(e)] -
                                                                               m.storage[static_cast<std::size_t>(il) * 3 + part_index].data());
                    for (int64_t r = 0; r < t.n_rows; ++r)
                        std::memcpy(want.data() + static_cast<std::size_t>(r) * row_bytes,
                                    original[static_cast<std::size_t>(il) * 3 + part_index].data() + expert_offset +
                                        static_cast<std::size_t>(r) * t.row_stride,
                                    row_bytes);
                    std::vector<std::uint8_t> got(want.size()), stale(want.size());
                    gather_expert(store, pool.plan(), m.shape, il, part, e, got.data(), row_bytes);
                    gather_expert(in_place, pool.plan(), m.shape, il, part, e, stale.data(), row_bytes);
                    EXPECT_EQ(got, want) << "layer " << il << " part " << part_index << " expert " << e;
                    EXPECT_NE(stale, want) << "the model's rows were not overwritten";
                }
    }
}

TEST(ExpertStore, RejectsMismatchedLayersAndMisusedClaims) {
    const auto& m = model();
    expert_pool pool(test_plan(2));
    moe_shape wrong = shape;
    wrong.n_ff = 512;
    EXPECT_THROW(expert_store(pool, wrong, m.layers), std::invalid_argument);
    store_options options;
    options.claimed = std::make_unique<node_buffer>(1 << 20, -1, std::vector<int>{});
    EXPECT_THROW(expert_store(pool, m.shape, m.layers, std::move(options)), std::invalid_argument);
    expert_pool off(off_plan());
    store_options small;
    small.claimed = std::make_unique<node_buffer>(1 << 20, -1, std::vector<int>{});
    EXPECT_THROW(expert_store(off, m.shape, m.layers, std::move(small)), std::invalid_argument);
}

TEST(HotNode, OffIssuesNoNumaSystemCall) {
    EXPECT_EQ(parse_hot_node("off"), std::nullopt);
    EXPECT_EQ(parse_hot_node(""), std::nullopt);
    EXPECT_EQ(parse_hot_node("1"), 1);
    EXPECT_THROW(parse_hot_node("one"), std::invalid_argument);
    EXPECT_THROW(parse_hot_node("-1"), std::invalid_argument);

    const auto& m = model();
    const auto before = numa_calls().total();
    {
        const hot_node hot(std::nullopt, load_machine_topology());
        EXPECT_FALSE(hot.active());
        EXPECT_EQ(hot.claim_complement(1 << 20), nullptr);
        auto pool_bytes = hot.allocate_hot(3 << 20, "pinned host pool");
        auto snapshot = hot.allocate_cold(1 << 20, "snapshot");
        EXPECT_FALSE(pool_bytes.bound());
        std::memset(pool_bytes.data(), 1, pool_bytes.size());
        expert_pool pool(off_plan());
        expert_store store(pool, m.shape, m.layers);
        expect_same(outputs(pool, store), "hot node off");
    }
    EXPECT_EQ(numa_calls().total(), before) << "--numa-hot-node off must not issue a NUMA system call";
    EXPECT_THROW(hot_node(7, four_cores()), std::invalid_argument);
}

TEST(HotNode, ClaimRefusesMoreThanTheNodeHas) {
    if (!numa_policy_available() || !node_memory_available(0)) GTEST_SKIP() << "no node meminfo on this machine";
    const auto topo = load_machine_topology();
    const int node = topo.nodes.front().os_index;
    const hot_node hot(node, topo);
    const std::uint64_t too_much = *node_memory_available(node) + (std::uint64_t{4} << 30);
    const auto before = numa_calls();
    try {
        (void)hot.claim_complement(too_much);
        FAIL() << "a claim larger than the node's memory was accepted";
    } catch (const node_room_error& e) {
        EXPECT_NE(std::string(e.what()).find("NUMA node " + std::to_string(node) + " has "), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("--numa-hot-node"), std::string::npos) << e.what();
    }
    EXPECT_EQ(numa_calls().total(), before.total());
}

TEST(NumaPolicy, NodeMemoryAvailableCountsFreeAndReclaimableMemory) {
    const auto available = node_memory_available(0);
    if (!available) GTEST_SKIP() << "no /sys/devices/system/node/node0/meminfo";
    // MemTotal bounds it from above; it is at least MemFree.
    std::ifstream in("/sys/devices/system/node/node0/meminfo");
    std::uint64_t total = 0, free = 0;
    for (std::string line; std::getline(in, line);) {
        const auto value = [&](const char* key) { return std::stoull(line.substr(line.find(key) + std::strlen(key))) * 1024; };
        if (line.find("MemTotal:") != std::string::npos) total = value("MemTotal:");
        if (line.find("MemFree:") != std::string::npos) free = value("MemFree:");
    }
    EXPECT_GT(*available, 0u);
    EXPECT_LE(*available, total);
    EXPECT_GE(*available + (std::uint64_t{256} << 20), free);  // MemFree may move between the two reads
    EXPECT_EQ(node_memory_available(100000), std::nullopt);
}

TEST(HotNode, ClaimedComplementLandsOnTheHotNode) {
    if (!numa_policy_available()) GTEST_SKIP();
    const auto& m = model();
    const auto topo = load_machine_topology();
    const int node = topo.nodes.front().os_index;
    region_map regions(::testing::TempDir() + "/hot-regions.json");
    const hot_node hot(node, topo, &regions);
    EXPECT_EQ(hot.cold_node(), topo.nodes.size() > 1 ? topo.nodes[1].os_index : -1);
    expert_pool pool(off_plan());
    store_options options;
    options.claimed = hot.claim_complement(expert_store::bytes_per_slice(pool.plan(), m.shape, m.layers)[0]);
    ASSERT_NE(options.claimed, nullptr);
    EXPECT_TRUE(options.claimed->bound());
    options.regions = &regions;
    expert_store store(pool, m.shape, m.layers, std::move(options));
    ASSERT_EQ(store.placement().nodes.size(), 1u);
    EXPECT_EQ(store.placement().nodes[0].node, node);
    EXPECT_GE(store.placement().nodes[0].share, 0.99);
    const std::string complement = "NUMA hot node " + std::to_string(node) + ": the resident complement (";
    {
        auto staging = hot.allocate_hot(2 << 20, "pinned host pool");
        EXPECT_TRUE(staging.bound());
        EXPECT_EQ(regions.regions().size(), 2u);  // the store's copy and the staging pool
        auto moved = std::move(staging);
        EXPECT_NE(hot.describe_placed().find(complement), std::string::npos) << hot.describe_placed();
        EXPECT_NE(hot.describe_placed().find(" and 1 pinned host pool (2.0 MiB) are bound to node " + std::to_string(node)),
                  std::string::npos)
            << hot.describe_placed();
    }
    EXPECT_EQ(regions.regions().size(), 1u);
    // Only what is there now: the pool is gone.
    EXPECT_NE(hot.describe_placed().find(complement), std::string::npos) << hot.describe_placed();
    EXPECT_EQ(hot.describe_placed().find("pinned"), std::string::npos) << hot.describe_placed();
    expect_same(outputs(pool, store), "hot node claim");
}
