#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <unistd.h>

#include "numa_policy.hpp"
#include "region_map.hpp"
#include "topology.hpp"

using namespace strata::arenas;

TEST(NumaPolicy, UnboundBufferIssuesNoNumaCall) {
    const auto before = numa_calls().total();
    node_buffer buf(3 << 20, -1, {});
    EXPECT_EQ(numa_calls().total(), before);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf.data()) % huge_page_bytes, 0u);
    EXPECT_EQ(buf.mapped(), 4u << 20);  // rounded to whole huge pages
    EXPECT_EQ(buf.size(), 3u << 20);
    EXPECT_FALSE(buf.bound());
}

TEST(NumaPolicy, BoundBufferLandsOnItsNode) {
    if (!numa_policy_available()) GTEST_SKIP() << "no NUMA system calls on this platform";
    const auto topo = load_machine_topology();
    const auto& node = topo.nodes.front();
    std::vector<int> cpus;
    for (const auto& c : node.cores) cpus.push_back(c.cpu);
    const auto before = numa_calls();
    node_buffer buf(8 << 20, node.os_index, cpus);
    EXPECT_TRUE(buf.bound());
    EXPECT_EQ(numa_calls().mbind, before.mbind + 1);
    auto placement = sample_page_placement(buf.data(), buf.mapped(), 512);
    EXPECT_EQ(numa_calls().move_pages, before.move_pages + 1);
    EXPECT_EQ(placement.error, 0);
    EXPECT_EQ(placement.sampled, 512u);
    EXPECT_EQ(placement.absent, 0u);
    EXPECT_GE(placement.share_on(node.os_index), 0.99);
    EXPECT_EQ(node_of_address(buf.data()), node.os_index);
    EXPECT_EQ(numa_calls().get_mempolicy, before.get_mempolicy + 1);
}

TEST(NumaPolicy, BadNodeDegradesWithoutThrowing) {
    if (!numa_policy_available()) GTEST_SKIP();
    node_buffer buf(1 << 20, 77, {});
    EXPECT_FALSE(buf.bound());
    EXPECT_NE(buf.data(), nullptr);
    buf.data()[0] = std::byte{1};
}

TEST(NumaPolicy, MovedBufferOwnsTheMapping) {
    node_buffer a(1 << 20, -1, {});
    auto* p = a.data();
    node_buffer b(std::move(a));
    EXPECT_EQ(b.data(), p);
    EXPECT_EQ(a.data(), nullptr);
    node_buffer c;
    c = std::move(b);
    EXPECT_EQ(c.data(), p);
}

TEST(NumaPolicy, UntouchedPagesAreAbsent) {
    if (!numa_policy_available()) GTEST_SKIP();
    std::vector<std::byte> touched(1 << 16, std::byte{1});
    auto p = sample_page_placement(touched.data(), touched.size());
    EXPECT_EQ(p.error, 0);
    EXPECT_GT(p.present(), 0u);
    EXPECT_DOUBLE_EQ(p.share_on(0) + (p.pages_per_node.size() > 1 ? p.share_on(1) : 0.0), 1.0);
}

TEST(RegionMap, PublishesAndRemovesItsFile) {
    const std::string path = (std::filesystem::temp_directory_path() / ("strata-rm-" + std::to_string(getpid()) + ".json")).string();
    {
        region_map map(path);
        map.add({"experts slice 0", 0x1000, 4096, 0});
        map.add({"experts slice 1", 0x200000, 8192, 1});
        auto read = region_map::read(path);
        ASSERT_EQ(read.size(), 2u);
        EXPECT_EQ(read[1].name, "experts slice 1");
        EXPECT_EQ(read[1].address, 0x200000u);
        EXPECT_EQ(read[1].bytes, 8192u);
        EXPECT_EQ(read[1].node, 1);
        map.remove(0x1000);
        EXPECT_EQ(region_map::read(path).size(), 1u);
    }
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_THROW(region_map::read(path), std::runtime_error);
    EXPECT_NE(region_map::default_path(42).find("strata-regions-42.json"), std::string::npos);
}
