// The GPU path's pinned host pools (engine/gpu/host_pool.hpp): page-locked through cudaHostRegister,
// listed in the region map while they live, unregistered before they are unmapped, bound to the hot
// node under --numa-hot-node and, when it is off, allocated without one NUMA system call. Runs on a
// GPU or on the CUDA emulator; the pages' node on a multi-node machine is the numa-vm lane's check.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <span>

#include "gpu/cuda_raii.hpp"
#include "gpu/host_pool.hpp"
#include "gpu_available.hpp"
#include "hot_node.hpp"
#include "numa_policy.hpp"
#include "region_map.hpp"
#include "topology.hpp"

namespace strata::engine::gpu {
namespace {

// Registered: a second cudaHostRegister of its first byte is refused as CUDA refuses it.
bool registered(const host_pool& pool) {
    const cudaError_t e = cudaHostRegister(pool.data(), 1, cudaHostRegisterDefault);
    cudaGetLastError();
    if (e == cudaSuccess) cudaHostUnregister(pool.data());
    return e == cudaErrorHostMemoryAlreadyRegistered;
}

TEST(HostPool, OffIsRegisteredListedAndMakesNoNumaSystemCall) {
    STRATA_REQUIRE_GPU();
    arenas::region_map regions(::testing::TempDir() + "/host-pool-regions.json");
    const auto before = arenas::numa_calls().total();
    std::byte* address = nullptr;
    {
        const arenas::hot_node hot(std::nullopt, arenas::load_machine_topology(), &regions);
        std::span<float> xn;
        std::span<int32_t> ids;
        host_pool pool = host_arrays().add(xn, 1000).add(ids, 3).allocate(&hot, "test staging");
        EXPECT_EQ(pool.node(), -1);
        EXPECT_FALSE(pool.bound());
        EXPECT_EQ(reinterpret_cast<std::byte*>(xn.data()), pool.data());
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ids.data()) % 256, 0u);
        EXPECT_GE(pool.size(), 4000u + 3 * sizeof(int32_t));
        EXPECT_TRUE(registered(pool));
        ASSERT_EQ(regions.regions().size(), 1u);
        EXPECT_EQ(regions.regions()[0].name, "test staging");
        EXPECT_EQ(regions.regions()[0].node, -1);

        // Copies through it round-trip.
        device_buffer<float> d(1000);
        for (size_t i = 0; i < xn.size(); ++i) xn[i] = static_cast<float>(i);
        const stream s = stream::create();
        copy_to_device(d.data(), xn.data(), xn.size(), s);
        s.synchronize();
        std::memset(xn.data(), 0, xn.size_bytes());
        copy_to_host(xn.data(), d.data(), xn.size(), s);
        s.synchronize();
        EXPECT_EQ(xn[999], 999.0f);

        host_pool moved = std::move(pool);  // still registered, once
        EXPECT_TRUE(registered(moved));
        address = moved.data();
        EXPECT_EQ(hot.describe_placed(), "");
    }
    EXPECT_EQ(arenas::numa_calls().total(), before) << "--numa-hot-node off must not issue a NUMA system call";
    EXPECT_TRUE(regions.regions().empty());
    EXPECT_EQ(cudaHostUnregister(address), cudaErrorHostMemoryNotRegistered) << "unregistered when it was freed";
    cudaGetLastError();
}

TEST(HostPool, OnTheHotNodeIsBoundAndNamedInTheLoadLine) {
    STRATA_REQUIRE_GPU();
    if (!arenas::numa_policy_available()) GTEST_SKIP() << "no NUMA system calls in this build";
    const auto topo = arenas::load_machine_topology();
    const int node = topo.nodes.front().os_index;
    arenas::region_map regions(::testing::TempDir() + "/host-pool-hot-regions.json");
    const arenas::hot_node hot(node, topo, &regions);
    std::span<uint8_t> a, b;
    host_pool pool = host_arrays().add(a, 3 << 20).add(b, 1 << 20).allocate(&hot, "test staging");
    EXPECT_TRUE(pool.bound());
    EXPECT_EQ(pool.node(), node);
    EXPECT_TRUE(registered(pool));
    ASSERT_EQ(regions.regions().size(), 1u);
    EXPECT_EQ(regions.regions()[0].node, node);
    const auto placement = arenas::sample_page_placement(pool.data(), pool.size(), 64);
    EXPECT_GE(placement.share_on(node), 0.99);
    EXPECT_NE(hot.describe_placed().find("1 pinned host pool (4.0 MiB) is bound to node " + std::to_string(node)),
              std::string::npos)
        << hot.describe_placed();
    pool = host_pool();
    EXPECT_TRUE(regions.regions().empty());
    EXPECT_NE(hot.describe_placed().find("nothing is bound to node"), std::string::npos) << hot.describe_placed();
}

}  // namespace
}  // namespace strata::engine::gpu
