// placement-report: what the CPU expert pool would do on a machine (--plan) or with a model
// (--model FILE --dry-run: bytes per node), or where a running strata process's regions really live
// (--pid, from its published region map and /proc/PID/numa_maps).
//
//   placement-report --plan [--topology machine|DESC|FILE.xml] [--numa-pool MODE] [--pool-workers N] [--json]
//   placement-report --pid PID [--map PATH] [--threshold 95] [--json]
//   placement-report --model FILE --dry-run [--topology ...] [--numa-pool MODE] [--pool-workers N]
//                    [--numa-hot-node N|off] [--mmap-experts] [--json]
// Exit: 0; 1 when a region is under the threshold; 2 on bad usage or unreadable input.
#include <cstdio>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <vector>
#include <iostream>
#include <string>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "expert_store.hpp"
#include "gguf/gguf_reader.hpp"
#include "hot_node.hpp"
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

// The routed experts of every MoE layer of a GGUF file, from tensor infos alone (no data is read):
// blk.N.ffn_{gate,up,down}_exps.weight (gate and up may be one ffn_gate_up_exps), or older per-expert
// blk.N.ffn_{gate,up,down}.E.weight.
struct model_experts {
    moe_shape shape;
    std::vector<moe_layer> layers;
    std::uint64_t expert_bytes = 0;  // as stored in the file
};

model_experts read_model_experts(const strata::gguf::reader& f) {
    model_experts out;
    const char* parts[3] = {"gate", "up", "down"};
    // glm4moe's next-token-prediction layers (the last nextn_predict_layers blocks) are not loaded.
    const std::string arch = f.get_string("general.architecture", "");
    const uint64_t n_block = f.get_u64(arch + ".block_count", 0), n_nextn = f.get_u64(arch + ".nextn_predict_layers", 0);
    for (int il = 0;; ++il) {
        if (n_nextn > 0 && static_cast<uint64_t>(il) + n_nextn >= n_block) break;
        const std::string prefix = "blk." + std::to_string(il) + ".";
        bool any = false;
        for (const auto& t : f.tensors()) any |= t.name.rfind(prefix, 0) == 0;
        if (!any) break;
        moe_layer layer;
        bool have = true;
        for (int p = 0; p < 3 && have; ++p) {
            expert_tensor& et = p == 0 ? layer.gate : p == 1 ? layer.up : layer.down;
            int n_expert = 0;
            const strata::gguf::tensor_info* t = f.find_tensor(prefix + "ffn_" + parts[p] + "_exps.weight");
            const strata::gguf::tensor_info* fused = p < 2 ? f.find_tensor(prefix + "ffn_gate_up_exps.weight") : nullptr;
            if (fused && fused->ne.size() == 3) {  // each expert's gate rows, then its up rows
                et.name = fused->name;
                et.type = fused->type;
                et.n_cols = fused->ne[0];
                et.n_rows = fused->ne[1] / 2;
                et.row_stride = strata::formats::row_size(fused->type, fused->ne[0]);
                et.experts.assign(static_cast<std::size_t>(fused->ne[2]), nullptr);
                if (p == 0) out.expert_bytes += fused->n_bytes;
                continue;
            }
            if (t && t->ne.size() == 3) {
                n_expert = static_cast<int>(t->ne[2]);
                out.expert_bytes += t->n_bytes;
            } else {
                t = f.find_tensor(prefix + "ffn_" + parts[p] + ".0.weight");
                while (f.find_tensor(prefix + "ffn_" + parts[p] + "." + std::to_string(n_expert) + ".weight")) {
                    out.expert_bytes += f.find_tensor(prefix + "ffn_" + parts[p] + "." + std::to_string(n_expert) + ".weight")->n_bytes;
                    ++n_expert;
                }
            }
            if (!t || t->ne.size() < 2) { have = false; break; }
            et.name = t->name;
            et.type = t->type;
            et.n_cols = t->ne[0];
            et.n_rows = t->ne[1];
            et.row_stride = strata::formats::row_size(t->type, t->ne[0]);
            et.experts.assign(static_cast<std::size_t>(n_expert), nullptr);
        }
        if (!have) continue;  // a dense layer
        out.shape.n_embd = static_cast<int>(layer.gate.n_cols);
        out.shape.n_ff = static_cast<int>(layer.gate.n_rows);
        out.shape.n_expert = static_cast<int>(layer.gate.experts.size());
        out.layers.push_back(std::move(layer));
    }
    if (out.layers.empty()) throw std::runtime_error(f.path() + " has no routed expert tensors (blk.N.ffn_gate_exps.weight)");
    out.shape.n_expert_used = static_cast<int>(f.get_u64(arch + ".expert_used_count", 0));
    return out;
}

std::string human_bytes(std::uint64_t bytes) {
    char buf[32];
    if (bytes >= (std::uint64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / double(1 << 30));
    else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / double(1 << 20));
    return buf;
}

int report_model(const cxxopts::ParseResult& args) {
    if (!args.count("dry-run"))
        throw std::invalid_argument("--model needs --dry-run (placing a model happens when the engine loads it)");
    const auto topo = load_topology(args["topology"].as<std::string>());
    pool_flags flags;
    if (args.count("numa-pool")) flags.numa_pool = args["numa-pool"].as<std::string>();
    if (args.count("pool-workers")) flags.pool_workers = args["pool-workers"].as<int>();
    const auto plan = plan_pool(topo, read_pool_requests(process_environment(), flags));
    const auto hot = parse_hot_node(args.count("numa-hot-node") ? args["numa-hot-node"].as<std::string>() : "off");
    const bool mmap_experts = args.count("mmap-experts") > 0;
    const auto f = strata::gguf::reader::open(args["model"].as<std::string>());
    const auto experts = read_model_experts(f);
    // As the engine stores them: repacked for the prompt GEMM kernels where this CPU's kernels repack
    // the type, unless --no-repack keeps the file's layout.
    const bool repack = args.count("no-repack") == 0;
    const auto per_slice = expert_store::bytes_per_slice(plan, experts.shape, experts.layers, repack);
    constexpr std::uint64_t headroom = std::uint64_t{2} << 30;

    // One row per slice that gets a copy, with the node it would be placed on (-1: not placed).
    struct row { int slice; int node; std::uint64_t bytes; std::uint64_t node_free; bool room_ok; };
    std::vector<row> rows;
    std::string mode;
    if (plan.split) mode = "split: each slice's rows copied to its node";
    else if (plan.test_mode) mode = "test mode: one copy per slice, no placement";
    else if (mmap_experts) mode = "split off, --mmap-experts: rows read in place, nothing copied";
    else if (hot) mode = "split off, one copy claimed on hot node " + std::to_string(*hot);
    else mode = "split off: one copy in anonymous memory, no placement";
    if (!(mmap_experts && !plan.split && !plan.test_mode))
        for (std::size_t s = 0; s < per_slice.size(); ++s) {
            const int node = plan.split ? plan.slices[s].node : (!plan.test_mode && hot) ? *hot : -1;
            const auto* n = node >= 0 ? topo.find_node(node) : nullptr;
            if (node >= 0 && !n) throw std::invalid_argument("--numa-hot-node " + std::to_string(node) + ": the topology has no such node");
            const std::uint64_t free = n ? n->memory_free : 0;
            rows.push_back({static_cast<int>(s), node, per_slice[s], free, !n || free >= per_slice[s] + headroom});
        }
    std::uint64_t total = 0;
    for (const auto& r : rows) total += r.bytes;

    if (args.count("json")) {
        json doc{{"model", f.path()}, {"topology", topo.describe()}, {"mode", mode}, {"split", plan.split},
                 {"test_mode", plan.test_mode}, {"layers", experts.layers.size()}, {"n_embd", experts.shape.n_embd},
                 {"n_ff", experts.shape.n_ff}, {"n_expert", experts.shape.n_expert},
                 {"expert_bytes_in_file", experts.expert_bytes}, {"repack", repack}, {"bytes_placed", total},
                 {"slices", json::array()}};
        for (const auto& r : rows)
            doc["slices"].push_back({{"slice", r.slice}, {"node", r.node}, {"bytes", r.bytes}, {"node_free", r.node_free},
                                     {"room_ok", r.room_ok}});
        std::cout << doc.dump(2) << "\n";
        return 0;
    }
    std::printf("%s\n%s\n", f.path().c_str(), topo.describe().c_str());
    std::printf("routed experts: %zu MoE layers, n_embd %d, n_ff %d, %d experts (%d used), %s in the file\n",
                experts.layers.size(), experts.shape.n_embd, experts.shape.n_ff, experts.shape.n_expert,
                experts.shape.n_expert_used, human_bytes(experts.expert_bytes).c_str());
    std::printf("plan: %s; %s\n", plan.describe().c_str(), mode.c_str());
    std::printf("%-6s %-6s %12s %12s  %s\n", "slice", "node", "bytes", "node avail", "room (share + 2 GiB)");
    for (const auto& r : rows)
        std::printf("%-6d %-6s %12s %12s  %s\n", r.slice, r.node >= 0 ? std::to_string(r.node).c_str() : "-",
                    human_bytes(r.bytes).c_str(), r.node >= 0 ? human_bytes(r.node_free).c_str() : "-",
                    r.node < 0 ? "not placed" : r.room_ok ? "OK" : "NO ROOM (the engine refuses it)");
    std::printf("%s of expert rows would be copied, in %zu buffer(s)%s (dry run: nothing was loaded).\n",
                human_bytes(total).c_str(), rows.size(),
                repack ? ", repacked where this CPU's prompt GEMM kernels take the type (--no-repack: as in the file)"
                       : ", in the file's layout (--no-repack)");
    return 0;
}

std::string fmt_resident(std::size_t bytes) {
    char text[64];
    std::snprintf(text, sizeof text, "%.1f MiB in page cache", static_cast<double>(bytes) / (1 << 20));
    return text;
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
        for (const auto& a : audits) {
            doc["regions"].push_back({{"name", a.where.name}, {"address", a.where.address}, {"bytes", a.where.bytes},
                                      {"node", a.where.node}, {"pages_per_node", a.pages_per_node},
                                      {"local_percent", 100.0 * a.local_share}, {"ok", a.ok}});
            if (!a.file.empty())  // a cold file-backed region: its page-cache residency, no placement
                doc["regions"].back().update(json{{"file", a.file}, {"bytes_resident", a.file_resident_bytes}});
        }
        std::cout << doc.dump(2) << "\n";
    } else {
        std::printf("%-32s %6s %12s %10s  %-24s %s\n", "region", "node", "MiB", "% local", "pages per node", "verdict");
        for (const auto& a : audits) {
            std::string per_node;
            for (std::size_t n = 0; n < a.pages_per_node.size(); ++n)
                per_node += (n ? " N" : "N") + std::to_string(n) + "=" + std::to_string(a.pages_per_node[n]);
            if (!a.file.empty()) {  // the pages per node would be the whole file mapping's
                std::printf("%-32s %6s %12.1f %10s  %-24s cold, file-backed (%s)\n", a.where.name.c_str(), "-",
                            static_cast<double>(a.where.bytes) / (1 << 20), "-",
                            fmt_resident(a.file_resident_bytes).c_str(), a.file.c_str());
                continue;
            }
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
        ("model", "a GGUF model: bytes per node its routed experts would take (with --dry-run)", cxxopts::value<std::string>())
        ("dry-run", "with --model: plan only, load nothing")
        ("numa-hot-node", "with --model: N|off, where the split-off copy would be claimed", cxxopts::value<std::string>())
        ("mmap-experts", "with --model: the split-off pool reads the rows in place")
        ("no-repack", "with --model: the rows in the file's layout, as strata --no-repack keeps them")
        ("map", "region map path (default /dev/shm/strata-regions-PID.json)", cxxopts::value<std::string>())
        ("threshold", "minimum % of a region's pages on its node", cxxopts::value<double>()->default_value("95"))
        ("json", "print JSON")
        ("h,help", "show this help");
    try {
        const auto args = options.parse(argc, argv);
        if (args.count("help") || (!args.count("plan") && !args.count("pid") && !args.count("model"))) {
            std::cout << options.help() << "\n";
            return args.count("help") ? 0 : 2;
        }
        if (args.count("model")) return report_model(args);
        return args.count("pid") ? report_pid(args) : report_plan(args);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "placement-report: %s\n", e.what());
        return 2;
    }
}
