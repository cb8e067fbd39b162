#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "cpu/kernels.hpp"
#include "generate.hpp"
#include "model_spec.hpp"
#include "numa_policy.hpp"
#include "placement_audit.hpp"
#include "region_map.hpp"
#include "topology.hpp"

using namespace strata::arenas;

TEST(PlacementAudit, ParsesNumaMaps) {
    const auto entries = parse_numa_maps(
        "7f0000000000 bind:1 anon=512 dirty=512 N1=500 N0=12 kernelpagesize_kB=4\n"
        "7f0000200000 default\n"
        "5638a42da000 default heap anon=4 dirty=4 active=0 N0=4 kernelpagesize_kB=4\n");
    ASSERT_EQ(entries.size(), 3u);
    EXPECT_EQ(entries[0].start, 0x7f0000000000u);
    EXPECT_EQ(entries[0].pages_per_node, (std::vector<std::size_t>{12, 500}));
    EXPECT_TRUE(entries[1].pages_per_node.empty());
    EXPECT_EQ(entries[2].pages_per_node, (std::vector<std::size_t>{4}));
}

// A region inside a file mapping (the PLE table's case) reports the file and how much of the region the
// page cache holds: after dropping the file's pages and reading 16 of 1024 pages without readahead,
// at least those 16 pages and far fewer than all.
TEST(PlacementAudit, AFileBackedRegionReportsItsPageCacheResidency) {
    const std::string path = ::testing::TempDir() + "strata_cold_region.bin";
    const long page = sysconf(_SC_PAGESIZE);
    const std::size_t bytes = 1024 * static_cast<std::size_t>(page);
    {
        std::FILE* f = std::fopen(path.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        std::vector<char> data(bytes, 7);
        ASSERT_EQ(std::fwrite(data.data(), 1, bytes, f), bytes);
        std::fclose(f);
    }
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    auto* p = static_cast<volatile char*>(mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0));
    ASSERT_NE(static_cast<void*>(const_cast<char*>(p)), MAP_FAILED);
    madvise(const_cast<char*>(p), bytes, MADV_RANDOM);
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += p[static_cast<std::size_t>(i) * static_cast<std::size_t>(page)];
    EXPECT_EQ(sum, 16 * 7);
    const region r{"cold table", reinterpret_cast<std::uintptr_t>(const_cast<char*>(p)) + static_cast<std::uintptr_t>(page), bytes - static_cast<std::size_t>(page), -1};
    const auto audits = audit_regions(getpid(), {r}, 0.95);
    ASSERT_EQ(audits.size(), 1u);
    EXPECT_EQ(audits[0].file, path);
    EXPECT_TRUE(audits[0].ok);
    EXPECT_GE(audits[0].file_resident_bytes, 15u * static_cast<std::size_t>(page));  // pages 1..15 of the region's
    EXPECT_LT(audits[0].file_resident_bytes, bytes / 2);
    munmap(const_cast<char*>(p), bytes);
    ::close(fd);
    std::remove(path.c_str());
}

namespace {

int run_report(const std::string& args) {
    const std::string cmd = std::string(PLACEMENT_REPORT) + " " + args + " > /dev/null";
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(PlacementAudit, ReportAgreesAndFailsOnAMisplacedRegion) {
    if (!numa_policy_available()) GTEST_SKIP();
    const int node = load_machine_topology().nodes.front().os_index;
    region_map map(region_map::default_path(getpid()));
    node_buffer local(4 << 20, node, {});
    map.add({"local buffer", reinterpret_cast<std::uintptr_t>(local.data()), local.mapped(), local.node()});
    auto audits = audit_regions(getpid(), map.regions(), 0.95);
    ASSERT_EQ(audits.size(), 1u);
    EXPECT_TRUE(audits[0].ok);
    EXPECT_GE(audits[0].local_share, 0.99);
    EXPECT_GE(audits[0].pages, (4u << 20) / 4096);
    const std::string pid = std::to_string(getpid());
    EXPECT_EQ(run_report("--pid " + pid), 0);
    EXPECT_EQ(run_report("--pid " + pid + " --json"), 0);

    // Deliberately misplaced: memory on our node, intended for a node it is not on.
    node_buffer elsewhere(2 << 20, -1, {});
    map.add({"misplaced buffer", reinterpret_cast<std::uintptr_t>(elsewhere.data()), elsewhere.mapped(), 63});
    audits = audit_regions(getpid(), map.regions(), 0.95);
    EXPECT_FALSE(audits[1].ok);
    EXPECT_EQ(run_report("--pid " + pid), 1);
    EXPECT_EQ(run_report("--pid 999999999"), 2);
}

TEST(PlacementAudit, PlanDryRun) {
    EXPECT_EQ(run_report("--plan --topology 'pack:2 numa:1 core:4 pu:2'"), 0);
    EXPECT_EQ(run_report("--plan --topology 'pack:2 numa:1 core:4 pu:2' --json --numa-pool test:3"), 0);
    EXPECT_EQ(run_report("--plan --topology 'nonsense:3'"), 2);
}

namespace {

std::string capture_report(const std::string& args) {
    const std::string cmd = std::string(PLACEMENT_REPORT) + " " + args;
    std::string out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
        char buf[4096];
        while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
        pclose(p);
    }
    return out;
}

}  // namespace

TEST(PlacementAudit, ModelDryRunBytesPerNode) {
    strata::make_model::model_spec spec = strata::make_model::preset("tiny");
    spec.n_layer = 3;
    const std::string path = ::testing::TempDir() + "/dry-run.gguf";
    strata::make_model::build_model(spec).write_file(path);
    const std::string topo = " --topology 'pack:2 numa:1 core:4 pu:1'";

    const auto split =
        nlohmann::json::parse(capture_report("--model " + path + " --dry-run --json --no-repack --numa-pool on" + topo));
    EXPECT_TRUE(split["split"].get<bool>());
    EXPECT_FALSE(split["repack"].get<bool>());
    EXPECT_EQ(split["layers"].get<int>(), 3);
    ASSERT_EQ(split["slices"].size(), 2u);
    std::uint64_t total = 0;
    for (std::size_t s = 0; s < 2; ++s) {
        EXPECT_EQ(split["slices"][s]["node"].get<int>(), static_cast<int>(s));
        EXPECT_GT(split["slices"][s]["bytes"].get<std::uint64_t>(), 0u);
        total += split["slices"][s]["bytes"].get<std::uint64_t>();
    }
    // Every expert row once, each (layer, part) block page-aligned in its slice's buffer.
    const auto in_file = split["expert_bytes_in_file"].get<std::uint64_t>();
    EXPECT_GE(total, in_file);
    EXPECT_LE(total, in_file + 3 * 3 * 2 * 4096);
    EXPECT_EQ(split["bytes_placed"].get<std::uint64_t>(), total);

    // By default the bytes the engine stores: Q4_K experts repacked where this CPU's kernels take them
    // (148 bytes per 256 weights instead of 144), the file's layout elsewhere.
    const auto repacked = nlohmann::json::parse(capture_report("--model " + path + " --dry-run --json --numa-pool on" + topo));
    EXPECT_TRUE(repacked["repack"].get<bool>());
    ASSERT_EQ(spec.type_experts, strata::formats::ggml_type::Q4_K);
    const bool repacks = strata::kernels::cpu::can_repack(spec.type_experts, spec.n_ff / 2) &&
                         strata::kernels::cpu::can_repack(spec.type_experts, spec.n_embd / 2);
    const std::uint64_t grown = repacks ? in_file / 144 * 148 : in_file;
    std::printf("  experts in the file %llu bytes; placed: %llu in the file's layout, %llu as stored (repacked: %s)\n",
                static_cast<unsigned long long>(in_file), static_cast<unsigned long long>(total),
                static_cast<unsigned long long>(repacked["bytes_placed"].get<std::uint64_t>()), repacks ? "yes" : "no");
    EXPECT_GE(repacked["bytes_placed"].get<std::uint64_t>(), grown);
    EXPECT_LE(repacked["bytes_placed"].get<std::uint64_t>(), grown + 3 * 3 * 2 * 4096);
    if (repacks) {
        EXPECT_GT(repacked["bytes_placed"].get<std::uint64_t>(), total);
    }

    const auto test = nlohmann::json::parse(capture_report("--model " + path + " --dry-run --json --numa-pool test:3" + topo));
    EXPECT_EQ(test["slices"].size(), 3u);
    for (const auto& s : test["slices"]) EXPECT_EQ(s["node"].get<int>(), -1);

    const auto hot = nlohmann::json::parse(capture_report("--model " + path + " --dry-run --json --numa-pool off --numa-hot-node 1" + topo));
    ASSERT_EQ(hot["slices"].size(), 1u);
    EXPECT_EQ(hot["slices"][0]["node"].get<int>(), 1);
    const auto mapped = nlohmann::json::parse(capture_report("--model " + path + " --dry-run --json --numa-pool off --mmap-experts" + topo));
    EXPECT_EQ(mapped["bytes_placed"].get<std::uint64_t>(), 0u);

    EXPECT_EQ(run_report("--model " + path + " --dry-run" + topo), 0);
    EXPECT_EQ(run_report("--model " + path), 2);  // --dry-run is required
    EXPECT_EQ(run_report("--model /nonexistent.gguf --dry-run"), 2);
}

// glm4moe: the leading dense layer has no experts and the next-token-prediction layer is not loaded,
// so only the two MoE layers between them count, as the engine's expert store places them.
TEST(PlacementAudit, ModelDryRunSkipsDenseAndNextTokenPredictionLayers) {
    strata::make_model::model_spec spec = strata::make_model::preset("tiny", strata::make_model::arch::glm4moe);
    spec.n_layer_nextn = 1;
    const std::string path = ::testing::TempDir() + "/dry-run-glm.gguf";
    strata::make_model::build_model(spec).write_file(path);
    const auto r = nlohmann::json::parse(
        capture_report("--model " + path + " --dry-run --json --numa-pool off --topology 'pack:1 numa:1 core:2 pu:1'"));
    EXPECT_EQ(r["layers"].get<int>(), 2);
    EXPECT_EQ(r["n_expert"].get<int>(), 8);
}
