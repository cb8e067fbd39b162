// Runs inside a VM with several NUMA nodes (tests/numa-vm/strata-vm.sh): checks that the machine's
// topology, the pool plan, the arenas' pinning, node-bound buffers, the expert store's placement, the
// hot node (the complement, conversation snapshots and the GPU path's pinned host pools) and
// placement-report --pid behave on real NUMA nodes. In a STRATA_CUDA=EMU build the pinned pool is
// engine/gpu's host_pool, page-locked by the CUDA emulator's cudaHostRegister (there is no GPU in the
// VM); otherwise the check covers its NUMA half, hot_node::allocate_hot.
// Usage: strata_numa_vm_check EXPECTED_NODES [PLACEMENT_REPORT]. Prints one PASS/FAIL line per check;
// exit 0 when all pass.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "arenas/moe_fixture.hpp"
#include "conversation_cache.hpp"
#include "expert_pool.hpp"
#include "expert_store.hpp"
#include "hot_node.hpp"
#include "moe_phases.hpp"
#include "numa_policy.hpp"
#include "pool_plan.hpp"
#include "region_map.hpp"
#include "topology.hpp"

#ifdef STRATA_VM_HOST_POOL
#include <cuda_runtime_api.h>

#include "gpu/host_pool.hpp"
#endif

using namespace strata::arenas;
namespace testing = strata::arenas::testing;

namespace {

int n_failed = 0;

void check(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    std::fflush(stdout);
    if (!ok) ++n_failed;
}

std::string percent(double share) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * share);
    return buf;
}

// Runs placement-report --pid (this process) and returns its exit status.
int run_report(const std::string& report, const std::string& map_path) {
    std::fflush(stdout);
    const pid_t self = getpid(), child = fork();
    if (child == 0) {
        const std::string pid = std::to_string(self);
        execl(report.c_str(), report.c_str(), "--pid", pid.c_str(), "--map", map_path.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Outputs of one layer for a few routings through `rows` (small shapes: TCG runs the scalar kernels).
std::vector<float> moe_outputs(expert_pool& pool, const testing::synthetic_moe& m, const expert_rows& rows) {
    moe_runner runner(pool, m.shape, m.layers, rows);
    std::vector<float> all;
    for (int n_tok : {1, 3}) {
        std::mt19937 rng(static_cast<uint32_t>(n_tok));
        const auto r = testing::make_routing(m.shape, n_tok, rng);
        std::vector<float> out(r.x.size(), std::numeric_limits<float>::quiet_NaN());
        runner.run(n_tok % 2, n_tok, r.x.data(), r.ids.data(), r.weights.data(), out.data());
        all.insert(all.end(), out.begin(), out.end());
    }
    return all;
}

// A pinned host pool of the GPU path on `hot`'s node (anonymous memory when off), as engine/gpu
// allocates it; *how says whether cudaHostRegister took it.
#ifdef STRATA_VM_HOST_POOL
strata::engine::gpu::host_pool allocate_pinned_pool(const hot_node& hot, std::size_t bytes, std::string* how) {
    strata::engine::gpu::host_pool pool(&hot, bytes, "GPU MoE staging (pinned)");
    const cudaError_t again = cudaHostRegister(pool.data(), 1, cudaHostRegisterDefault);
    cudaGetLastError();
    *how = again == cudaErrorHostMemoryAlreadyRegistered ? "registered with the CUDA emulator's cudaHostRegister"
                                                         : "NOT registered";
    return pool;
}
#else
placed_buffer allocate_pinned_pool(const hot_node& hot, std::size_t bytes, std::string* how) {
    *how = "its NUMA half only (no CUDA emulator in this build)";
    return hot.allocate_hot(bytes, "GPU MoE staging (pinned)");
}
#endif

// The expert store under the split, the hot node and placement-report --pid.
void check_store_hot_node_and_report(const topology& topo, expert_pool& pool, const std::string& report) {
    using strata::formats::ggml_type;
    const auto m = testing::make_synthetic_moe({512, 512, 8, 2}, {{ggml_type::Q8_0, ggml_type::Q8_0, ggml_type::Q8_0},
                                                                  {ggml_type::Q8_0, ggml_type::Q8_0, ggml_type::Q8_0}}, 5);
    region_map regions(region_map::default_path(static_cast<int>(getpid())));
    store_options options;
    options.regions = &regions;
    options.headroom_bytes = std::uint64_t{32} << 20;  // the guest's nodes have a few hundred MiB
    int layers_copied = 0;
    options.on_layer_copied = [&](int) { ++layers_copied; };
    expert_store store(pool, m.shape, m.layers, std::move(options));
    const auto& placed = store.placement();
    bool all_placed = placed.mode == store_mode::split && placed.nodes.size() == pool.plan().slices.size();
    std::string shares;
    for (const auto& n : placed.nodes) {
        all_placed = all_placed && n.share >= 0.99 && n.pages_sampled > 0;
        shares += (shares.empty() ? "" : ", ") + ("node " + std::to_string(n.node) + " " + percent(n.share) + " of " +
                                                  std::to_string(n.pages_sampled) + " pages");
    }
    check(all_placed && layers_copied == 2, "expert store: split copies placed " + shares);

    const auto mapped = moe_outputs(pool, m, mapped_expert_rows(m.layers));
    const auto from_store = moe_outputs(pool, m, store);
    pool_requests off_req;
    off_req.mode = numa_pool_mode::off;
    off_req.pool_workers = 1;
    expert_pool off(plan_pool(topo, off_req));
    const auto from_off = moe_outputs(off, m, mapped_expert_rows(m.layers));
    check(std::memcmp(mapped.data(), from_store.data(), mapped.size() * sizeof(float)) == 0 &&
              std::memcmp(mapped.data(), from_off.data(), mapped.size() * sizeof(float)) == 0,
          "moe_runner: split with the store, split with the mapped rows and the split-off pool agree bitwise (" +
              std::to_string(mapped.size()) + " floats)");

    // --numa-hot-node 1: the split-off pool's single copy is claimed on node 1; snapshots go to node 0.
    const hot_node hot(1, topo, &regions);
    store_options hot_options;
    hot_options.claimed = hot.claim_complement(expert_store::bytes_per_slice(off.plan(), m.shape, m.layers)[0],
                                               std::uint64_t{32} << 20);
    hot_options.regions = &regions;
    expert_store hot_store(off, m.shape, m.layers, std::move(hot_options));
    const auto& hp = hot_store.placement();
    check(hp.nodes.size() == 1 && hp.nodes[0].node == 1 && hp.nodes[0].share >= 0.99,
          "hot node: the resident complement is on node 1 (" + (hp.nodes.empty() ? std::string("not sampled") : percent(hp.nodes[0].share)) + ")");
    auto snapshot = hot.allocate_cold(std::size_t{4} << 20, "conversation snapshot");
    std::memset(snapshot.data(), 1, snapshot.size());
    const auto cold = sample_page_placement(snapshot.data(), snapshot.size(), 256);
    check(hot.cold_node() == 0 && cold.share_on(0) >= 0.99,
          "hot node: conversation snapshots on cold node " + std::to_string(hot.cold_node()) + " (" + percent(cold.share_on(0)) + ")");

    // The GPU path's pinned host pool: bound to node 1 and touched there before it is page-locked;
    // it stays alive through placement-report --pid below, which audits it with the rest.
    std::string how;
    const auto pinned = allocate_pinned_pool(hot, std::size_t{6} << 20, &how);
    const auto pages = sample_page_placement(pinned.data(), pinned.size(), 1024);
    bool listed = false;
    for (const auto& r : regions.regions())
        listed = listed || (r.address == reinterpret_cast<std::uintptr_t>(pinned.data()) && r.node == 1);
    check(pinned.bound() && pages.error == 0 && pages.share_on(1) >= 0.99 && listed && how.find("NOT") == std::string::npos,
          "hot node: a 6 MiB pinned host pool is on node 1 (" + percent(pages.share_on(1)) + " of " +
              std::to_string(pages.present()) + " pages), " + (listed ? "listed" : "NOT listed") +
              " in the region map, " + how);
    check(hot.describe_placed().find("and 1 pinned host pool (6.0 MiB) are bound to node 1") != std::string::npos,
          "hot node: the load line names what moved: " + hot.describe_placed());
    // A node too small for its share: refused with the figures before anything is bound or touched
    // (bound strictly and touched, it would end in an out-of-memory kill of this process).
    const auto node1_available = node_memory_available(1);
    const std::uint64_t too_much = node1_available.value_or(0) + (std::uint64_t{64} << 20);
    const auto calls_before_claim = numa_calls().total();
    std::string refusal = "accepted";
    try {
        (void)hot.claim_complement(too_much, 0);
    } catch (const node_room_error& e) {
        refusal = e.what();
    }
    check(node1_available && refusal.find("NUMA node 1 has ") != std::string::npos && numa_calls().total() == calls_before_claim,
          "hot node: a " + std::to_string(too_much >> 20) + " MiB complement on node 1 (" +
              std::to_string(node1_available.value_or(0) >> 20) + " MiB available) is refused before binding: " + refusal);
    store_options full;
    full.headroom_bytes = topo.find_node(1)->memory_total;  // no node can keep its whole size free
    refusal = "accepted";
    try {
        expert_store refused(pool, m.shape, m.layers, std::move(full));
    } catch (const node_room_error& e) {
        refusal = e.what();
    }
    check(refusal.find("--numa-pool off") != std::string::npos && numa_calls().total() == calls_before_claim,
          "expert store: a split whose node lacks room for its share is refused before binding: " + refusal);

    // The conversation cache parks a session's KV rows in segments from the cold allocator.
    strata::engine::kv_cache kv(10, 2048, 4, 64, strata::engine::kv_type::f16);  // 20 MB of rows: two segments
    kv.reserve(2000);
    const std::vector<float> row(4 * 64, 0.5f);
    for (int l = 0; l < kv.n_layer(); ++l)
        for (int pos = 0; pos < 2000; ++pos) kv.store(l, pos, row.data(), row.data());
    strata::engine::conversation_cache conversations(std::uint64_t{64} << 20, hot);
    const std::vector<int32_t> tokens(2000, 7);
    const std::uint64_t parked = conversations.park(tokens, kv);
    const auto cs = conversations.stats();
    int listed_segments = 0;
    for (const auto& r : regions.regions()) listed_segments += r.name.starts_with("conversation snapshot 1 segment") ? 1 : 0;
    check(parked != 0 && cs.node == 0 && cs.node_share >= 0.95 && listed_segments == static_cast<int>(cs.segments),
          "conversation cache: " + std::to_string(cs.segments) + " parked segments (" + std::to_string(cs.bytes >> 20) +
              " MiB, listed in the region map: " + std::to_string(listed_segments) + ") on cold node " + std::to_string(cs.node) +
              " (" + percent(cs.node_share) + ")");

    if (report.empty()) return;
    const int agrees = run_report(report, regions.path());
    check(agrees == 0, "placement-report --pid agrees with the process: exit " + std::to_string(agrees) + " over " +
                           std::to_string(regions.regions().size()) + " regions");
    node_buffer wrong(std::size_t{4} << 20, 0, {});
    regions.add({"deliberately misplaced", reinterpret_cast<std::uintptr_t>(wrong.data()), wrong.size(), 1});
    const int misplaced = run_report(report, regions.path());
    check(misplaced == 1, "placement-report --pid exits 1 on a region bound to node 0 but meant for node 1 (exit " +
                              std::to_string(misplaced) + ")");
}

// --gpu with the GPU on node 1 (pool_requests::host_node = 1): the pool pins the thread that builds it,
// the host thread, to node 1's first core, and the host's share of every phase runs on that CPU.
void check_host_node(const topology& topo, pool_requests requests) {
    requests.host_node = 1;
    std::thread host([&] {
        auto pool = expert_pool::create(topo, requests);
        const pool_plan& plan = pool->plan();
        const numa_node* node1 = topo.find_node(1);
        const bool planned = node1 && node1->has_cpus() && plan.host_cpu == node1->cores.front().cpu &&
                             plan.slices[static_cast<std::size_t>(plan.host_slice)].node == 1;
        cpu_set_t mask;
        CPU_ZERO(&mask);
        sched_getaffinity(0, sizeof mask, &mask);
        const bool pinned = CPU_COUNT(&mask) == 1 && CPU_ISSET(plan.host_cpu, &mask);
        const auto self = std::this_thread::get_id();
        std::mutex mutex;
        std::set<int> host_cpus;
        for (int rep = 0; rep < 10; ++rep)
            pool->run_phase(64, [&](int, std::size_t, std::size_t) {
                if (std::this_thread::get_id() == self) {
                    std::lock_guard lock(mutex);
                    host_cpus.insert(sched_getcpu());
                }
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            });
        std::string ran_on;
        bool on_node1 = !host_cpus.empty();
        for (int cpu : host_cpus) {
            ran_on += (ran_on.empty() ? "" : ",") + std::to_string(cpu);
            on_node1 = on_node1 && cpu == plan.host_cpu && topo.node_of_cpu(cpu) == node1;
        }
        check(planned && pinned && on_node1,
              "host node 1: the host thread is pinned to CPU " + std::to_string(plan.host_cpu) + " (slice " +
                  std::to_string(plan.host_slice) + " = node " +
                  std::to_string(plan.slices[static_cast<std::size_t>(plan.host_slice)].node) + ", affinity " +
                  std::to_string(CPU_COUNT(&mask)) + " CPU(s)) and its share of the phases ran on CPU(s) " +
                  (ran_on.empty() ? "none" : ran_on));
    });
    host.join();
}

}  // namespace

int main(int argc, char** argv) {
    const int want_nodes = argc > 1 ? std::stoi(argv[1]) : 2;
    const std::string report = argc > 2 ? argv[2] : "";
    const auto topo = load_machine_topology();
    std::printf("%s\n", topo.describe().c_str());
    check(topo.n_cpu_nodes() == want_nodes,
          "topology: " + std::to_string(topo.n_cpu_nodes()) + " nodes with CPUs, expected " + std::to_string(want_nodes));

    const auto requests = read_pool_requests(process_environment());
    const auto calls_before = numa_calls().total();
    {
        std::string how;
        const hot_node off(std::nullopt, topo);
        const auto pinned = allocate_pinned_pool(off, std::size_t{2} << 20, &how);
        check(!pinned.bound() && how.find("NOT") == std::string::npos,
              "hot node off: a pinned host pool in anonymous memory, " + how);
    }
    auto pool = expert_pool::create(topo, requests);
    const auto& plan = pool->plan();
    check(plan.split && static_cast<int>(plan.slices.size()) == want_nodes,
          "plan: split " + std::string(plan.split ? "on" : "off") + " with " + std::to_string(plan.slices.size()) +
              " slice(s): " + plan.describe());

    // Enough work, slow enough, that every worker of every arena takes part.
    for (int rep = 0; rep < 20; ++rep)
        pool->run_phase(64, [](int, std::size_t, std::size_t) { std::this_thread::sleep_for(std::chrono::microseconds(300)); });
    std::string why;
    const auto seen = pool->cpus_seen();
    bool on_node = true;
    for (std::size_t s = 0; s < seen.size(); ++s) {
        const auto* node = topo.find_node(plan.slices[s].node);
        for (int cpu : seen[s])
            if (!node || topo.node_of_cpu(cpu) != node) on_node = false;
        std::printf("slice %zu (node %d, %d threads) ran on CPUs %s\n", s, plan.slices[s].node, plan.slices[s].threads(),
                    format_cpu_list(seen[s]).c_str());
    }
    check(pool->affinity_ok(&why) && on_node && pool->pin_failures() == 0,
          "arenas: every slice ran only on its node's CPUs" + (why.empty() ? "" : " (" + why + ")"));
    check(numa_calls().total() == calls_before,
          "numa_policy: " + std::to_string(numa_calls().total() - calls_before) +
              " NUMA system calls while allocating a pinned host pool, planning and running the pool without a hot node");

    for (const auto& node : topo.nodes) {
        std::vector<int> cpus;
        for (const auto& c : node.cores) cpus.push_back(c.cpu);
        node_buffer buf(std::size_t{32} << 20, node.os_index, cpus);
        const auto placement = sample_page_placement(buf.data(), buf.mapped(), 4096);
        const double share = placement.share_on(node.os_index);
        check(buf.bound() && placement.error == 0 && share >= 0.99,
              "placement: 32 MiB buffer bound to node " + std::to_string(node.os_index) + " has " +
                  std::to_string(100.0 * share).substr(0, 5) + " % of " + std::to_string(placement.present()) +
                  " sampled pages on it" + (node.has_cpus() ? "" : " (memory-only node)"));
    }
    check_store_hot_node_and_report(topo, *pool, report);
    check_host_node(topo, requests);
    std::printf("numa_vm_check: %d failed\n", n_failed);
    return n_failed == 0 ? 0 : 1;
}
