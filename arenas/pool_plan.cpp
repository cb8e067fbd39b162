// Pool plan rules (docs/NUMA.md). Pure: no logging, no environment, no syscalls.
#include "pool_plan.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace strata::arenas {

namespace {

std::vector<int> core_cpus(const numa_node& node) {
    std::vector<int> cpus;
    for (const auto& c : node.cores) cpus.push_back(c.cpu);
    return cpus;
}

std::string threads_text(int n) { return std::to_string(n) + (n == 1 ? " thread" : " threads"); }

void add_line(pool_plan& plan, log_level level, std::string text) { plan.log.push_back({level, std::move(text)}); }

// Hands out `n_workers` one at a time to the slice with the fewest threads (host counted) that still
// has a free core, ties to the host's slice, then the lowest: an explicit count alternates nodes, and
// the host's node ends up with at most one thread more than the others (the spare core lies elsewhere).
void distribute(std::vector<pool_slice>& slices, int n_workers, bool respect_capacity) {
    for (int w = 0; w < n_workers; ++w) {
        pool_slice* best = nullptr;
        for (auto& s : slices) {
            const int capacity = static_cast<int>(s.cores.size()) - (s.has_host ? 1 : 0);
            if (respect_capacity && s.workers >= capacity) continue;
            if (!best || s.threads() < best->threads() ||
                (s.threads() == best->threads() && s.has_host && !best->has_host))
                best = &s;
        }
        if (!best) return;
        ++best->workers;
    }
}

int capacity_of(const pool_slice& s) { return std::max(0, static_cast<int>(s.cores.size()) - (s.has_host ? 1 : 0)); }

// Split off: one unpinned slice. The default stays on the host's node (physical cores minus the host
// core); an explicit count larger than that node spreads over every allowed core.
void plan_single_slice(pool_plan& plan, const topology& topo, const numa_node& host_node, const pool_requests& req) {
    pool_slice s;
    s.node = host_node.os_index;
    s.cores = core_cpus(host_node);
    s.has_host = true;
    const int node_capacity = capacity_of(s);
    s.workers = req.pool_workers ? *req.pool_workers : node_capacity;
    if (s.workers > node_capacity) {
        s.node = -1;
        s.cores.clear();
        for (const auto& n : topo.nodes)
            for (int cpu : core_cpus(n)) s.cores.push_back(cpu);
        std::sort(s.cores.begin(), s.cores.end());
    }
    plan.slices = {s};
    plan.host_slice = 0;
    if (!req.arena_workers.empty())
        add_line(plan, log_level::warn,
                 "STRATA_ARENA_WORKERS lists " + std::to_string(req.arena_workers.size()) +
                     " count(s) but the NUMA split is off, so it is ignored.");
}

void refuse(pool_plan& plan, const topology& topo, const numa_node& host_node, const pool_requests& req,
            std::string reason, bool log) {
    plan.split = false;
    plan.reason = std::move(reason);
    if (log) add_line(plan, log_level::warn, "NUMA split off: " + plan.reason);
    plan_single_slice(plan, topo, host_node, req);
}

// Explicit per-slice or total counts, else the default: every core minus the host core and one spare,
// capped at max_workers. Returns false (with a line) when STRATA_ARENA_WORKERS had to be ignored.
void assign_workers(pool_plan& plan, std::vector<pool_slice>& slices, const pool_requests& req, bool test) {
    int total_capacity = 0;
    for (const auto& s : slices) total_capacity += capacity_of(s);
    if (!req.arena_workers.empty() && req.arena_workers.size() != slices.size()) {
        add_line(plan, log_level::warn,
                 "STRATA_ARENA_WORKERS lists " + std::to_string(req.arena_workers.size()) + " count(s) for " +
                     std::to_string(slices.size()) + " slice(s), so it is ignored.");
    } else if (!req.arena_workers.empty()) {
        for (std::size_t i = 0; i < slices.size(); ++i) {
            int want = req.arena_workers[i];
            if (!test && want > capacity_of(slices[i])) {
                add_line(plan, log_level::warn,
                         "STRATA_ARENA_WORKERS asks " + std::to_string(want) + " worker(s) for slice " +
                             std::to_string(i) + " but node " + std::to_string(slices[i].node) + " has " +
                             std::to_string(capacity_of(slices[i])) + " free core(s); using " +
                             std::to_string(capacity_of(slices[i])) + ".");
                want = capacity_of(slices[i]);
            }
            slices[i].workers = want;
        }
        return;
    }
    int n_workers = 0;
    if (req.pool_workers) {
        n_workers = *req.pool_workers;
        if (!test && n_workers > total_capacity) {
            add_line(plan, log_level::warn,
                     "The pool was asked for " + std::to_string(n_workers) + " workers but its NUMA nodes have " +
                         std::to_string(total_capacity) + " free cores besides the host core; using " +
                         std::to_string(total_capacity) + ".");
            n_workers = total_capacity;
        }
    } else {
        n_workers = std::clamp(total_capacity - 1, 0, std::max(0, req.max_workers));
    }
    distribute(slices, n_workers, !test);
}

void plan_test(pool_plan& plan, const topology& topo, int host_core, const pool_requests& req) {
    const int n = std::max(1, req.test_slices);
    std::vector<int> cores;
    for (const auto& node : topo.nodes)
        for (int cpu : core_cpus(node)) cores.push_back(cpu);
    std::vector<pool_slice> slices(static_cast<std::size_t>(n));
    // Contiguous groups of cores; with fewer cores than slices the groups wrap around.
    const std::size_t per = std::max<std::size_t>(1, cores.size() / static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < slices.size(); ++i) {
        slices[i].node = static_cast<int>(i);
        const std::size_t begin = i * per, end = (i + 1 == slices.size()) ? std::max(cores.size(), begin + 1) : begin + per;
        for (std::size_t c = begin; c < end; ++c) slices[i].cores.push_back(cores[c % cores.size()]);
    }
    for (std::size_t i = 0; i < slices.size(); ++i) {
        if (std::find(slices[i].cores.begin(), slices[i].cores.end(), host_core) != slices[i].cores.end()) {
            slices[i].has_host = true;
            plan.host_slice = static_cast<int>(i);
            break;
        }
    }
    assign_workers(plan, slices, req, true);
    // Every slice must be able to run its share: a slice without a thread gets one worker.
    for (auto& s : slices)
        if (s.threads() == 0) s.workers = 1;
    plan.slices = std::move(slices);
    plan.split = false;
    plan.test_mode = true;
    plan.reason = "test mode (" + req.mode_source + ") builds " + std::to_string(n) +
                  " slices without pinning or placement";
    add_line(plan, log_level::info, "NUMA split test mode: " + std::to_string(n) +
                                        " slices without pinning or placement: " + plan.describe());
}

// Returns the lopsided complaint, or "" when every slice has at least half the threads of every other.
std::string lopsided(const std::vector<pool_slice>& slices) {
    auto [lo, hi] = std::minmax_element(slices.begin(), slices.end(),
                                        [](const pool_slice& a, const pool_slice& b) { return a.threads() < b.threads(); });
    if (2 * lo->threads() >= hi->threads()) return "";
    return "the layout is lopsided: slice " + std::to_string(lo - slices.begin()) + " = node " +
           std::to_string(lo->node) + " would get " + threads_text(lo->threads()) + ", less than half of the " +
           std::to_string(hi->threads()) + " on node " + std::to_string(hi->node) + "; the pool runs without the split";
}

const core* first_allowed_core(const topology& topo) {
    for (const auto& n : topo.nodes)
        if (n.has_cpus()) return &n.cores.front();
    return nullptr;
}

std::string node_list(const topology& topo) {
    std::string out;
    for (const auto& n : topo.nodes) out += (out.empty() ? "" : ", ") + std::to_string(n.os_index);
    return out;
}

// The host core for requests.host_node: the node's first allowed core, or nullptr (default choice) with
// a line naming the node and why it cannot take the host thread.
const core* first_core_of_node(pool_plan& plan, const topology& topo, int os_index) {
    const numa_node* node = topo.find_node(os_index);
    if (node && node->has_cpus()) return &node->cores.front();
    const core* fallback = first_allowed_core(topo);
    const std::string why = node ? " has no CPU the pool may use (a memory-only node, or outside the process's "
                                   "CPU affinity)"
                                 : " is not among this machine's NUMA nodes (" + node_list(topo) + ")";
    add_line(plan, log_level::warn,
             "The host thread was asked for NUMA node " + std::to_string(os_index) + ", which" + why +
                 "; it runs on CPU " + std::to_string(fallback->cpu) + " of node " +
                 std::to_string(topo.node_of_cpu(fallback->cpu)->os_index) + " instead.");
    return nullptr;
}

}  // namespace

int pool_plan::total_workers() const {
    return std::accumulate(slices.begin(), slices.end(), 0, [](int a, const pool_slice& s) { return a + s.workers; });
}

int pool_plan::total_threads() const {
    return std::accumulate(slices.begin(), slices.end(), 0, [](int a, const pool_slice& s) { return a + s.threads(); });
}

std::string pool_plan::describe() const {
    std::ostringstream out;
    for (std::size_t i = 0; i < slices.size(); ++i) {
        out << (i ? ", " : "") << "slice " << i << " = ";
        if (slices[i].node >= 0) out << "node " << slices[i].node;
        else out << "all nodes";
        out << " (" << threads_text(slices[i].threads()) << ")";
    }
    return out.str();
}

pool_plan plan_pool(const topology& topo, const pool_requests& req) {
    if (topo.n_cpu_nodes() == 0)
        throw std::invalid_argument("the topology (" + topo.source + ") has no allowed CPU for the pool");
    pool_plan plan;

    const core* host = req.host_cpu ? topo.core_of_cpu(*req.host_cpu) : nullptr;
    if (req.host_cpu && !host)
        add_line(plan, log_level::warn,
                 "The host CPU " + std::to_string(*req.host_cpu) +
                     " is not among the pool's allowed CPUs; the first allowed core stands in for it.");
    if (!req.host_cpu && req.host_node) host = first_core_of_node(plan, topo, *req.host_node);
    if (!host) host = first_allowed_core(topo);
    plan.host_cpu = host->cpu;
    const numa_node& host_node = *topo.node_of_cpu(host->cpu);

    if (req.mode == numa_pool_mode::test) {
        plan_test(plan, topo, host->cpu, req);
        return plan;
    }
    if (req.mode == numa_pool_mode::off) {
        refuse(plan, topo, host_node, req,
               req.mode_source + " turns it off; the pool stays on the host's node " + std::to_string(host_node.os_index),
               true);
        return plan;
    }
    const int n_nodes = topo.n_cpu_nodes();
    if (n_nodes < 2) {
        refuse(plan, topo, host_node, req, "the pool's CPUs span " + std::to_string(n_nodes) + " NUMA node(s)",
               req.mode == numa_pool_mode::on);
        return plan;
    }
    if (!req.is_linux) {
        refuse(plan, topo, host_node, req,
               "the pool's CPUs span " + std::to_string(n_nodes) +
                   " NUMA nodes but the split needs Linux (sched_setaffinity, mbind, move_pages)",
               true);
        return plan;
    }
    if (req.pinning_failed) {
        refuse(plan, topo, host_node, req,
               "pinning a worker thread to its node's cores failed; the pool runs without the split", true);
        return plan;
    }

    std::vector<pool_slice> slices;
    for (const auto& n : topo.nodes) {
        if (!n.has_cpus()) continue;  // memory-only nodes never get a slice
        pool_slice s;
        s.node = n.os_index;
        s.cores = core_cpus(n);
        s.has_host = (&n == &host_node);
        s.pinned = true;
        if (s.has_host) plan.host_slice = static_cast<int>(slices.size());
        slices.push_back(std::move(s));
    }
    pool_plan trial = plan;
    assign_workers(trial, slices, req, false);
    if (std::string why = lopsided(slices); !why.empty()) {
        plan.log = trial.log;
        refuse(plan, topo, host_node, req, why, true);
        return plan;
    }
    plan = std::move(trial);
    plan.slices = std::move(slices);
    plan.split = true;
    plan.reason = "the pool's CPUs span " + std::to_string(n_nodes) + " NUMA nodes";
    add_line(plan, log_level::info, "NUMA split on: " + plan.describe());
    return plan;
}

// ---- requests from flags and the environment ----

namespace {

int parse_int(std::string_view name, const std::string& value, int min_value) {
    int out = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
    if (ec != std::errc() || ptr != value.data() + value.size() || out < min_value)
        throw std::invalid_argument(std::string(name) + "='" + value + "' is not an integer >= " +
                                    std::to_string(min_value));
    return out;
}

void parse_mode(pool_requests& req, std::string_view name, const std::string& value, std::string source) {
    req.mode_source = std::move(source);
    if (value.empty() || value == "auto") req.mode = numa_pool_mode::automatic;
    else if (value == "0" || value == "off") req.mode = numa_pool_mode::off;
    else if (value == "1" || value == "on") req.mode = numa_pool_mode::on;
    else if (value == "test") { req.mode = numa_pool_mode::test; req.test_slices = 2; }
    else if (value.starts_with("test:")) {
        req.mode = numa_pool_mode::test;
        req.test_slices = parse_int(name, value.substr(5), 1);
    } else {
        throw std::invalid_argument(std::string(name) + "='" + value + "' must be one of 0, 1, auto, off, on, test, test:N");
    }
}

}  // namespace

env_lookup process_environment() {
    return [](std::string_view name) -> std::optional<std::string> {
        const char* v = std::getenv(std::string(name).c_str());
        if (!v) return std::nullopt;
        return std::string(v);
    };
}

pool_requests read_pool_requests(const env_lookup& env, const pool_flags& flags) {
    pool_requests req;
#ifndef __linux__
    req.is_linux = false;
#endif
    if (flags.numa_pool) parse_mode(req, "--numa-pool", *flags.numa_pool, "--numa-pool " + *flags.numa_pool);
    else if (auto v = env("STRATA_NUMA_POOL")) parse_mode(req, "STRATA_NUMA_POOL", *v, "STRATA_NUMA_POOL=" + *v);

    if (flags.pool_workers) {
        if (*flags.pool_workers < 0)
            throw std::invalid_argument("--pool-workers " + std::to_string(*flags.pool_workers) + " must be >= 0");
        req.pool_workers = flags.pool_workers;
    } else if (auto v = env("TBB_NUM_THREADS"); v && !v->empty()) {
        req.pool_workers = parse_int("TBB_NUM_THREADS", *v, 0);
    }

    if (auto v = env("STRATA_ARENA_WORKERS"); v && !v->empty()) {
        std::string item;
        std::istringstream list(*v);
        while (std::getline(list, item, ',')) req.arena_workers.push_back(parse_int("STRATA_ARENA_WORKERS", item, 0));
    }
    if (auto v = env("STRATA_POOL_MAX_WORKERS"); v && !v->empty())
        req.max_workers = parse_int("STRATA_POOL_MAX_WORKERS", *v, 1);
    return req;
}

}  // namespace strata::arenas
