// Runs inside a VM with several NUMA nodes (tests/numa-vm/strata-vm.sh): checks that the machine's
// topology, the pool plan, the arenas' pinning and node-bound buffers behave on real NUMA nodes.
// Usage: strata_numa_vm_check EXPECTED_NODES. Prints one PASS/FAIL line per check; exit 0 when all pass.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "expert_pool.hpp"
#include "numa_policy.hpp"
#include "pool_plan.hpp"
#include "topology.hpp"

using namespace strata::arenas;

namespace {

int n_failed = 0;

void check(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    std::fflush(stdout);
    if (!ok) ++n_failed;
}

}  // namespace

int main(int argc, char** argv) {
    const int want_nodes = argc > 1 ? std::stoi(argv[1]) : 2;
    const auto topo = load_machine_topology();
    std::printf("%s\n", topo.describe().c_str());
    check(topo.n_cpu_nodes() == want_nodes,
          "topology: " + std::to_string(topo.n_cpu_nodes()) + " nodes with CPUs, expected " + std::to_string(want_nodes));

    const auto requests = read_pool_requests(process_environment());
    const auto calls_before = numa_calls().total();
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
              " NUMA system calls while planning and running the pool without a hot node");

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
    std::printf("numa_vm_check: %d failed\n", n_failed);
    return n_failed == 0 ? 0 : 1;
}
