// The CPU expert pool: one oneTBB task_arena per slice of the pool plan, threads pinned one per core
// of the slice's node (split on), the host thread taking part in its own node's slice. run_phase runs
// a parallel loop over each slice's items in every slice at once and joins. No TBB or hwloc types leak
// from this header.
//
// Thread-safety: one thread (the host) calls run_phase at a time; the accessors are safe from any
// thread between phases.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "function_ref.hpp"
#include "pool_plan.hpp"

namespace strata::arenas {

struct stall_report {
    int slice = 0;
    int node = -1;
    std::size_t items_done = 0;
    std::size_t items_total = 0;
    double seconds = 0;  // since the slice last made progress
};

struct pool_options {
    // How long an idle slice keeps a thread spinning for the next phase (and the host spins for the
    // join) before sleeping. STRATA_POOL_SPIN_US; default from strata-bench pool (see expert_pool.cpp).
    std::chrono::microseconds spin{default_spin()};
    // A slice without progress for this long is reported (STRATA_POOL_STALL_MS).
    std::chrono::milliseconds stall_after{10000};
    // Called from the pool's watchdog thread for a stalled slice; default: an error log line.
    std::function<void(const stall_report&)> on_stall;
    // Pin the constructing (host) thread to the plan's host core while the pool lives (split only).
    bool pin_host = true;
    // When the plan needs more TBB threads than tbb::global_control's max_allowed_parallelism allows
    // now (test mode or --pool-workers beyond the CPU count), raise that process-wide limit while the
    // pool lives (a global_control of the pool's own). false: leave TBB's limits to the application and
    // throw std::invalid_argument with both numbers instead (STRATA_POOL_TBB_LIMIT=keep).
    bool raise_tbb_limit = true;

    static std::chrono::microseconds default_spin();
};

// Reads STRATA_POOL_SPIN_US and STRATA_POOL_STALL_MS into options. Throws std::invalid_argument naming
// the variable on a malformed value.
pool_options read_pool_options(const env_lookup& env);

class expert_pool {
public:
    // fn(slice, item_begin, item_end): process items [item_begin, item_end) of `slice`'s work. A
    // reference to the caller's callable: running a phase allocates nothing.
    using phase_fn = function_ref<void(int slice, std::size_t item_begin, std::size_t item_end)>;

    explicit expert_pool(pool_plan plan, pool_options options = {});
    ~expert_pool();
    expert_pool(const expert_pool&) = delete;
    expert_pool& operator=(const expert_pool&) = delete;

    // Plans, logs the plan's lines, builds the pool and checks that every worker could be pinned; if
    // pinning failed, logs it and returns a pool planned without the split.
    static std::unique_ptr<expert_pool> create(const topology& topo, pool_requests requests, pool_options options = {});

    const pool_plan& plan() const;
    int n_slices() const;

    // Runs fn over n_items[s] items in every slice s concurrently, in chunks of at least `grain`
    // items, and returns when all slices are done. The first exception thrown in any slice (lowest
    // slice first) is rethrown here after every slice has finished.
    void run_phase(std::span<const std::size_t> n_items, const phase_fn& fn, std::size_t grain = 1);
    // The same number of items in every slice.
    void run_phase(std::size_t n_items_per_slice, const phase_fn& fn, std::size_t grain = 1);

    // CPUs (sched_getcpu) on which each slice's work ran since the pool was built, ascending.
    std::vector<std::vector<int>> cpus_seen() const;
    // True when every pinned slice's work ran only on its own cores; otherwise `why` names the slice.
    bool affinity_ok(std::string* why = nullptr) const;
    std::uint64_t pin_failures() const;
    std::uint64_t phases_run() const;
    std::uint64_t stalls_reported() const;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace strata::arenas
