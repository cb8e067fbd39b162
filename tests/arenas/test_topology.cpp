#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "topology.hpp"

using namespace strata::arenas;

TEST(Topology, TwoPackagesWithSmtKeepOnePuPerCore) {
    auto topo = load_synthetic_topology("pack:2 numa:1 core:4 pu:2");
    ASSERT_EQ(topo.nodes.size(), 2u);
    EXPECT_EQ(topo.n_cpu_nodes(), 2);
    ASSERT_EQ(topo.nodes[0].cores.size(), 4u);
    EXPECT_EQ(topo.nodes[0].cores[1].cpu, 2);  // PU 3 is PU 2's SMT sibling
    EXPECT_EQ(topo.nodes[0].cores[1].pus, (std::vector<int>{2, 3}));
    EXPECT_EQ(topo.nodes[1].cores[0].cpu, 8);
    EXPECT_GT(topo.nodes[0].memory_total, 0u);
    EXPECT_EQ(topo.nodes[0].memory_free, topo.nodes[0].memory_total);
    EXPECT_EQ(topo.node_of_cpu(9)->os_index, 1);
    EXPECT_EQ(topo.core_of_cpu(9)->cpu, 8);
}

TEST(Topology, FourNodes) {
    auto topo = load_synthetic_topology("pack:2 numa:2 core:2 pu:1");
    ASSERT_EQ(topo.nodes.size(), 4u);
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(topo.nodes[i].os_index, i);
        EXPECT_EQ(topo.nodes[i].cores.size(), 2u);
        EXPECT_EQ(topo.nodes[i].cores[0].cpu, 2 * i);
    }
}

TEST(Topology, MemoryOnlyNodeHasNoCores) {
    auto topo = load_synthetic_topology("[numa(memory=1GB)] pack:2 [numa(memory=2GB)] core:2 pu:1");
    ASSERT_EQ(topo.nodes.size(), 3u);
    EXPECT_EQ(topo.n_cpu_nodes(), 2);
    EXPECT_EQ(topo.nodes[0].cores.size(), 2u);
    EXPECT_EQ(topo.nodes[1].cores.size(), 2u);
    EXPECT_FALSE(topo.nodes[2].has_cpus());
    EXPECT_EQ(topo.nodes[2].memory_total, 1000000000u);
}

TEST(Topology, RestrictedAffinityDropsCoresAndNodes) {
    // Only PU 1 (sibling of PU 0) and PU 5 of node 0 allowed; node 1 entirely masked out.
    auto topo = load_synthetic_topology("pack:2 numa:1 core:4 pu:2", std::vector<int>{1, 5});
    EXPECT_EQ(topo.n_cpu_nodes(), 1);
    ASSERT_EQ(topo.nodes[0].cores.size(), 2u);
    EXPECT_EQ(topo.nodes[0].cores[0].cpu, 1);
    EXPECT_EQ(topo.nodes[0].cores[1].cpu, 5);
    EXPECT_FALSE(topo.nodes[1].has_cpus());
}

TEST(Topology, XmlRoundTrip) {
    auto path = std::filesystem::temp_directory_path() / ("strata-topo-" + std::to_string(getpid()) + ".xml");
    export_synthetic_as_xml("pack:2 numa:1 core:3 pu:2", path.string());
    auto topo = load_topology(path.string());
    std::filesystem::remove(path);
    ASSERT_EQ(topo.nodes.size(), 2u);
    EXPECT_EQ(topo.nodes[1].cores.size(), 3u);
    EXPECT_EQ(topo.nodes[1].cores[0].cpu, 6);
}

TEST(Topology, BadSyntheticThrows) {
    EXPECT_THROW(load_synthetic_topology("banana:7"), std::invalid_argument);
    EXPECT_THROW(load_xml_topology("/nonexistent/strata.xml"), std::runtime_error);
}

TEST(Topology, ThisMachineHasAllowedCores) {
    auto topo = load_machine_topology();
    EXPECT_GE(topo.n_cpu_nodes(), 1);
    std::size_t n_cores = 0;
    for (const auto& n : topo.nodes) n_cores += n.cores.size();
    EXPECT_GE(n_cores, 1u);
    EXPECT_LE(n_cores, allowed_cpus().size());
    EXPECT_GT(topo.nodes[0].memory_total, 0u);
}

TEST(Topology, CpuListFormat) {
    EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
    EXPECT_EQ(format_cpu_list({}), "");
}
