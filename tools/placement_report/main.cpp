// placement-report: what the CPU expert pool would do on a machine (--plan), or where a running
// strata process's regions really live (--pid, from its published region map and /proc/PID/numa_maps).
//
//   placement-report --plan [--topology machine|DESC|FILE.xml] [--numa-pool MODE] [--pool-workers N] [--json]
//   placement-report --pid PID [--map PATH] [--threshold 95] [--json]
// Exit: 0; 1 when a region is under the threshold; 2 on bad usage or unreadable input.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "placement_audit.hpp"
#include "pool_plan.hpp"
#include "region_map.hpp"
#include "topology.hpp"

namespace {

using namespace strata::arenas;
using nlohmann::json;

int report_plan(const cxxopts::ParseResult& args) {
    const auto topo = load_topology(args["topology"].as<std::string>());
    pool_flags flags;
    if (args.count("numa-pool")) flags.numa_pool = args["numa-pool"].as<std::string>();
    if (args.count("pool-workers")) flags.pool_workers = args["pool-workers"].as<int>();
    const auto plan = plan_pool(topo, read_pool_requests(process_environment(), flags));
    if (args.count("json")) {
        json doc{{"topology", topo.describe()}, {"split", plan.split}, {"test_mode", plan.test_mode},
                 {"reason", plan.reason}, {"host_cpu", plan.host_cpu}, {"slices", json::array()}, {"log", json::array()}};
        for (const auto& s : plan.slices) {
            const auto* node = topo.find_node(s.node);
            doc["slices"].push_back({{"node", s.node}, {"threads", s.threads()}, {"workers", s.workers},
                                     {"host", s.has_host}, {"pinned", s.pinned}, {"cores", s.cores},
                                     {"memory_total", node ? node->memory_total : 0},
                                     {"memory_free", node ? node->memory_free : 0}});
        }
        for (const auto& l : plan.log) doc["log"].push_back(l.text);
        std::cout << doc.dump(2) << "\n";
        return 0;
    }
    std::printf("%s\n", topo.describe().c_str());
    std::printf("NUMA split %s: %s\n", plan.split ? "on" : (plan.test_mode ? "test mode" : "off"), plan.reason.c_str());
    std::printf("%-6s %-6s %8s %8s %-5s %-7s %12s %12s  %s\n", "slice", "node", "threads", "workers", "host", "pinned",
                "mem total", "mem free", "cores");
    for (std::size_t i = 0; i < plan.slices.size(); ++i) {
        const auto& s = plan.slices[i];
        const auto* node = topo.find_node(s.node);
        std::printf("%-6zu %-6s %8d %8d %-5s %-7s %8.1f GiB %8.1f GiB  %s\n", i,
                    s.node >= 0 ? std::to_string(s.node).c_str() : "all", s.threads(), s.workers, s.has_host ? "yes" : "no",
                    s.pinned ? "yes" : "no", node ? static_cast<double>(node->memory_total) / (1 << 30) : 0.0,
                    node ? static_cast<double>(node->memory_free) / (1 << 30) : 0.0, format_cpu_list(s.cores).c_str());
    }
    for (const auto& l : plan.log) std::printf("log: %s\n", l.text.c_str());
    return 0;
}

int report_pid(const cxxopts::ParseResult& args) {
    const int pid = args["pid"].as<int>();
    const std::string map_path = args.count("map") ? args["map"].as<std::string>() : region_map::default_path(pid);
    const double threshold = args["threshold"].as<double>();
    const auto audits = audit_regions(pid, region_map::read(map_path), threshold / 100.0);
    int n_low = 0;
    for (const auto& a : audits) n_low += a.ok ? 0 : 1;
    if (args.count("json")) {
        json doc{{"pid", pid}, {"threshold", threshold}, {"regions", json::array()}, {"failed", n_low}};
        for (const auto& a : audits)
            doc["regions"].push_back({{"name", a.where.name}, {"address", a.where.address}, {"bytes", a.where.bytes},
                                      {"node", a.where.node}, {"pages_per_node", a.pages_per_node},
                                      {"local_percent", 100.0 * a.local_share}, {"ok", a.ok}});
        std::cout << doc.dump(2) << "\n";
    } else {
        std::printf("%-32s %6s %12s %10s  %-24s %s\n", "region", "node", "MiB", "% local", "pages per node", "verdict");
        for (const auto& a : audits) {
            std::string per_node;
            for (std::size_t n = 0; n < a.pages_per_node.size(); ++n)
                per_node += (n ? " N" : "N") + std::to_string(n) + "=" + std::to_string(a.pages_per_node[n]);
            std::printf("%-32s %6d %12.1f %9.1f%%  %-24s %s\n", a.where.name.c_str(), a.where.node,
                        static_cast<double>(a.where.bytes) / (1 << 20), 100.0 * a.local_share, per_node.c_str(),
                        a.where.node < 0 ? "no intent" : (a.ok ? "OK" : "FAILED"));
        }
        std::printf("%zu region(s), %d under %.1f %% local.\n", audits.size(), n_low, threshold);
    }
    return n_low == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    cxxopts::Options options("placement-report", "Audit strata's NUMA placement, or print the pool plan.");
    options.add_options()
        ("plan", "print the pool plan for a topology without loading a model")
        ("topology", "machine, an hwloc synthetic description, or an XML file", cxxopts::value<std::string>()->default_value("machine"))
        ("numa-pool", "auto|off|on|test|test:N (overrides STRATA_NUMA_POOL)", cxxopts::value<std::string>())
        ("pool-workers", "pool workers (overrides TBB_NUM_THREADS)", cxxopts::value<int>())
        ("pid", "audit the running process PID", cxxopts::value<int>())
        ("map", "region map path (default /dev/shm/strata-regions-PID.json)", cxxopts::value<std::string>())
        ("threshold", "minimum % of a region's pages on its node", cxxopts::value<double>()->default_value("95"))
        ("json", "print JSON")
        ("h,help", "show this help");
    try {
        const auto args = options.parse(argc, argv);
        if (args.count("help") || (!args.count("plan") && !args.count("pid"))) {
            std::cout << options.help() << "\n";
            return args.count("help") ? 0 : 2;
        }
        return args.count("pid") ? report_pid(args) : report_plan(args);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "placement-report: %s\n", e.what());
        return 2;
    }
}
