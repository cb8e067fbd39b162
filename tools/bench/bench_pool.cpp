// strata-bench pool: the expert pool's empty-phase round trip (dispatch + join) for 1, 2 and 4 slices,
// split vs off vs test, and the idle-spin choice (STRATA_POOL_SPIN_US) with its CPU cost. Medians.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "expert_pool.hpp"
#include "modes.hpp"
#include "pool_plan.hpp"
#include "topology.hpp"

namespace {

using namespace strata::arenas;
using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct figures {
    double round_trip_us = 0;  // median, back to back
    double after_gap_us = 0;   // median, after an idle gap longer than any spin tried
    double cpu_us_per_gap = 0; // process CPU time per (phase + idle gap)
};

figures measure(expert_pool& pool, int iterations, std::chrono::microseconds gap) {
    auto empty = [](int, std::size_t, std::size_t) {};
    for (int i = 0; i < 50; ++i) pool.run_phase(1, empty);
    figures f;
    std::vector<double> t;
    for (int i = 0; i < iterations; ++i) {
        const auto start = clock_type::now();
        pool.run_phase(1, empty);
        t.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    f.round_trip_us = median(t);
    t.clear();
    const int n_gaps = std::max(20, iterations / 20);
    const double cpu_before = cpu_seconds();
    for (int i = 0; i < n_gaps; ++i) {
        std::this_thread::sleep_for(gap);
        const auto start = clock_type::now();
        pool.run_phase(1, empty);
        t.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    f.cpu_us_per_gap = 1e6 * (cpu_seconds() - cpu_before) / n_gaps;
    f.after_gap_us = median(t);
    return f;
}

pool_plan plan_for(numa_pool_mode mode, int n_slices, const topology& topo) {
    pool_requests req;
    req.mode = mode;
    req.test_slices = n_slices;
    if (mode == numa_pool_mode::test) req.pool_workers = n_slices;  // one thread per slice at least
    return plan_pool(topo, req);
}

int run(int argc, char** argv) {
    int iterations = 2000;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--iterations" && i + 1 < argc) iterations = std::max(10, std::atoi(argv[++i]));
        else if (a == "--help") {
            std::printf("strata-bench pool [--iterations N]: empty-phase round trip and spin cost, medians\n");
            return 0;
        } else {
            std::fprintf(stderr, "strata-bench pool: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    const auto topo = load_machine_topology();
    std::printf("machine: %s\n", topo.describe().c_str());
    std::printf("empty-phase round trip, median of %d (spin %lld us, the default)\n", iterations,
                static_cast<long long>(pool_options::default_spin().count()));
    std::printf("%-28s %8s %14s %14s\n", "arm", "threads", "back-to-back", "after 2 ms idle");
    const auto gap = std::chrono::microseconds(2000);
    auto row = [&](const std::string& name, const pool_plan& plan) {
        pool_options options;
        options.pin_host = plan.split;
        expert_pool pool(plan, options);
        const auto f = measure(pool, iterations, gap);
        std::printf("%-28s %8d %11.2f us %11.2f us\n", name.c_str(), plan.total_threads(), f.round_trip_us, f.after_gap_us);
    };
    row("off (1 slice)", plan_for(numa_pool_mode::off, 1, topo));
    for (int n : {1, 2, 4}) row("test:" + std::to_string(n) + " (" + std::to_string(n) + " slices)", plan_for(numa_pool_mode::test, n, topo));
    if (topo.n_cpu_nodes() >= 2) {
        auto plan = plan_for(numa_pool_mode::on, 0, topo);
        row("split (" + std::to_string(plan.slices.size()) + " slices)", plan);
    } else {
        std::printf("%-28s %8s   (this machine has 1 NUMA node; run under tests/numa-vm/strata-vm.sh)\n", "split", "n/a");
    }

    std::printf("\nidle spin (STRATA_POOL_SPIN_US) on test:2: round trip back-to-back, after a 2 ms idle gap,\n"
                "and process CPU time per phase + gap (the spin's cost while idle)\n");
    std::printf("%8s %14s %16s %16s\n", "spin us", "back-to-back", "after 2 ms idle", "CPU per gap");
    for (long spin : {0L, 10L, 50L, 200L, 1000L}) {
        pool_options options;
        options.spin = std::chrono::microseconds(spin);
        expert_pool pool(plan_for(numa_pool_mode::test, 2, topo), options);
        const auto f = measure(pool, iterations, gap);
        std::printf("%8ld %11.2f us %13.2f us %13.1f us\n", spin, f.round_trip_us, f.after_gap_us, f.cpu_us_per_gap);
    }
    return 0;
}

const strata::bench::register_mode registered{{"pool", "expert pool: empty-phase round trip, split/off/test, spin cost", run}};

}  // namespace
