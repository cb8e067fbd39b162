// The pool plan: a pure function from (topology, requests) to the CPU expert pool's slices.
// Nothing here logs or touches the machine; the log lines to emit are returned with the plan.
//
// Vocabulary: a slice's `workers` are the pool threads it owns; its `threads` add the host thread
// when the host's core lies on the slice's node (the host takes part in its own node's slice).
// `--pool-workers N`, TBB_NUM_THREADS and STRATA_ARENA_WORKERS all count workers, never the host.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topology.hpp"

namespace strata::arenas {

enum class numa_pool_mode {
    automatic,  // STRATA_NUMA_POOL unset, --numa-pool auto: split when the CPUs span 2+ nodes, silent on one
    off,        // "0", --numa-pool off
    on,         // "1", --numa-pool on: like automatic, but says why when it cannot split
    test,       // "test" / "test:N": N slices on any machine, no placement, no pinning
};

struct pool_requests {
    numa_pool_mode mode = numa_pool_mode::automatic;
    int test_slices = 2;                 // N of "test:N"
    std::optional<int> pool_workers;     // --pool-workers N, else TBB_NUM_THREADS
    std::vector<int> arena_workers;      // STRATA_ARENA_WORKERS=a,b,...: workers per slice, in slice order
    int max_workers = 32;                // STRATA_POOL_MAX_WORKERS: cap on the default worker count
    std::optional<int> host_cpu;         // OS CPU of the host thread; default: the first allowed core
    // OS node for the host thread when host_cpu is not given (the GPU's node under --gpu): the host core
    // is that node's first allowed core, so the host takes part in that node's slice. A node without
    // allowed CPUs (memory-only) or unknown to the topology keeps the default, with a log line.
    std::optional<int> host_node;
    bool is_linux = true;                // false: split refused ("not Linux")
    bool pinning_failed = false;         // set on a re-plan after pinning a worker failed
    std::string mode_source = "default"; // "STRATA_NUMA_POOL=1", "--numa-pool on", ... for log lines
};

struct pool_slice {
    int node = -1;           // OS node index (test mode: the slice index), -1: no node (split off)
    std::vector<int> cores;  // OS CPUs the slice may pin to, one per physical core, ascending
    int workers = 0;         // pool threads of this slice (host excluded)
    bool has_host = false;   // the host thread takes part in this slice
    bool pinned = false;     // threads pinned one per core (split on); off and test modes do not pin

    int threads() const { return workers + (has_host ? 1 : 0); }
};

enum class log_level { info, warn };

struct plan_log_line {
    log_level level = log_level::info;
    std::string text;
};

struct pool_plan {
    bool split = false;               // one slice per NUMA node, pinned, with placement
    bool test_mode = false;           // slices without placement or pinning (STRATA_NUMA_POOL=test)
    std::string reason;               // why the split is on or off, one sentence
    std::vector<pool_slice> slices;   // at least one; the host's slice among them
    int host_cpu = -1;                // OS CPU of the host core
    int host_slice = 0;               // index of the slice the host thread takes part in
    std::vector<plan_log_line> log;   // lines the caller should log (none for one node with nothing set)

    int total_workers() const;
    int total_threads() const;
    std::string describe() const;     // "slice 0 = node 0 (12 threads), slice 1 = node 1 (11 threads)"
};

pool_plan plan_pool(const topology& topo, const pool_requests& requests);

// Environment lookup, injectable so tests can exercise precedence without touching the process.
using env_lookup = std::function<std::optional<std::string>(std::string_view name)>;
env_lookup process_environment();

// Command-line values that override the environment when present.
struct pool_flags {
    std::optional<std::string> numa_pool;  // --numa-pool auto|off|on|test|test:N
    std::optional<int> pool_workers;       // --pool-workers N
};

// Reads STRATA_NUMA_POOL, TBB_NUM_THREADS, STRATA_ARENA_WORKERS, STRATA_POOL_MAX_WORKERS. Precedence:
// --numa-pool over STRATA_NUMA_POOL; --pool-workers over TBB_NUM_THREADS. Throws std::invalid_argument
// with the variable's name and value when a value cannot be parsed.
pool_requests read_pool_requests(const env_lookup& env, const pool_flags& flags = {});

}  // namespace strata::arenas
