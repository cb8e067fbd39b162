// strata-bench pool: the expert pool's empty-phase round trip (dispatch + join) for 1, 2 and 4 slices,
// split vs off vs test, the idle-spin choice (STRATA_POOL_SPIN_US) with its CPU cost, and a
// decode-shaped MoE layer (bench-model sizes) in GB/s of expert weights read next to the read
// bandwidth of the same pool measured in the same run. Medians.
#include <sys/resource.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "expert_pool.hpp"
#include "expert_store.hpp"
#include "formats/quant.hpp"
#include "bandwidth.hpp"
#include "modes.hpp"
#include "moe_phases.hpp"
#include "numa_policy.hpp"
#include "pool_plan.hpp"
#include "topology.hpp"

namespace {

using namespace strata::arenas;
using clock_type = std::chrono::steady_clock;
using strata::bench::median;

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


// ---- decode-shaped MoE layer --------------------------------------------------------------------

// The bench model's routed experts (strata-make-model --preset bench): n_layer layers (170 MB each
// in Q4_K; several, so the layers cycled through exceed the last-level cache), all three parts of `type`, filled from a pool of randomly drawn quantized blocks (quantizing 300 M values would take
// minutes; the kernels' speed does not depend on the values).
struct bench_layer {
    moe_shape shape{2048, 768, 64, 8};
    std::vector<std::unique_ptr<node_buffer>> storage;
    std::vector<moe_layer> layers;
};

expert_tensor fill_experts(node_buffer& bytes, strata::formats::ggml_type type, int64_t n_cols, int64_t n_rows, int n_expert,
                           const std::vector<uint8_t>& blocks, std::mt19937_64& rng) {
    expert_tensor t;
    t.type = type;
    t.n_cols = n_cols;
    t.n_rows = n_rows;
    t.row_stride = strata::formats::row_size(type, n_cols);
    const size_t block_bytes = strata::formats::info(type).type_size;
    const size_t n_pool = blocks.size() / block_bytes;
    auto* out = reinterpret_cast<uint8_t*>(bytes.data());
    const size_t total_blocks = t.row_stride * static_cast<size_t>(n_rows) * static_cast<size_t>(n_expert) / block_bytes;
    for (size_t b = 0; b < total_blocks; ++b)
        std::memcpy(out + b * block_bytes, blocks.data() + (rng() % n_pool) * block_bytes, block_bytes);
    for (int e = 0; e < n_expert; ++e)
        t.experts.push_back(out + static_cast<size_t>(e) * t.row_stride * static_cast<size_t>(n_rows));
    return t;
}

bench_layer make_bench_layers(strata::formats::ggml_type type, int n_layer) {
    bench_layer b;
    const auto& s = b.shape;
    std::mt19937_64 rng(7);
    const int64_t block = strata::formats::info(type).block_size;
    const int64_t n_pool = 4096;
    std::normal_distribution<float> value(0.0f, 0.02f);
    std::vector<float> f(static_cast<size_t>(n_pool * block));
    for (auto& v : f) v = value(rng);
    std::vector<uint8_t> blocks(strata::formats::row_size(type, n_pool * block));
    strata::formats::quantize_row(type, f.data(), blocks.data(), n_pool * block);
    for (int il = 0; il < n_layer; ++il) {
        moe_layer l;
        const int64_t dims[3][2] = {{s.n_embd, s.n_ff}, {s.n_embd, s.n_ff}, {s.n_ff, s.n_embd}};
        expert_tensor* parts[3] = {&l.gate, &l.up, &l.down};
        for (int p = 0; p < 3; ++p) {
            const size_t bytes = strata::formats::row_size(type, dims[p][0]) * static_cast<size_t>(dims[p][1] * s.n_expert);
            b.storage.push_back(std::make_unique<node_buffer>(bytes, -1, std::vector<int>{}));
            *parts[p] = fill_experts(*b.storage.back(), type, dims[p][0], dims[p][1], s.n_expert, blocks, rng);
        }
        b.layers.push_back(std::move(l));
    }
    return b;
}

// Bytes of expert weights one token reads per layer: gate, up and down of n_expert_used experts.
double bytes_per_token(const bench_layer& b) {
    const auto& l = b.layers[0];
    const double per_expert = static_cast<double>(l.gate.row_stride * static_cast<size_t>(l.gate.n_rows) +
                                                  l.up.row_stride * static_cast<size_t>(l.up.n_rows) +
                                                  l.down.row_stride * static_cast<size_t>(l.down.n_rows));
    return per_expert * b.shape.n_expert_used;
}

// Read bandwidth of the pool itself: every slice sums its own buffer (bound to its node under the
// split), `total_bytes` in all, in 1 MiB items.
double read_bandwidth_gbs(expert_pool& pool, size_t total_bytes, int repeats) {
    const auto& plan = pool.plan();
    std::vector<std::unique_ptr<node_buffer>> bufs;
    std::vector<size_t> n_items;
    constexpr size_t item_bytes = size_t{1} << 20;
    for (const auto& s : plan.slices) {
        const size_t bytes = total_bytes / plan.slices.size() / item_bytes * item_bytes;
        std::vector<int> cpus = plan.split ? s.cores : std::vector<int>{};
        bufs.push_back(std::make_unique<node_buffer>(bytes, plan.split ? s.node : -1, cpus));
        std::memset(bufs.back()->data(), 1, bytes);
        n_items.push_back(bytes / item_bytes);
    }
    std::vector<std::uint64_t> sink(plan.slices.size() * 64);
    std::vector<double> t;
    for (int r = 0; r < repeats + 1; ++r) {
        const auto start = clock_type::now();
        pool.run_phase(n_items, [&](int s, size_t b, size_t e) {
            const auto* p = reinterpret_cast<const std::uint64_t*>(bufs[static_cast<size_t>(s)]->data() + b * item_bytes);
            const size_t n = (e - b) * item_bytes / sizeof(std::uint64_t);
            // 8 independent accumulators (vectorised) and the kernels' software prefetch distance.
            std::uint64_t acc[8] = {};
            for (size_t i = 0; i < n; i += 8) {
                _mm_prefetch(reinterpret_cast<const char*>(p + i) + strata::kernels::cpu::weight_prefetch_bytes, _MM_HINT_T0);
                for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
            }
            std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (int k = 0; k < 8; k += 4) a0 += acc[k], a1 += acc[k + 1], a2 += acc[k + 2], a3 += acc[k + 3];
            sink[static_cast<size_t>(s) * 64] += a0 + a1 + a2 + a3;
        });
        if (r > 0) t.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
    }
    size_t bytes = 0;
    for (const auto& b : bufs) bytes += b->size();
    return static_cast<double>(bytes) / median(t) / 1e9;
}

struct moe_figures {
    double median_us = 0;
    double gbs = 0;
    double bandwidth_gbs = 0;
};

// A layer call's inputs: n_tok random activations, equal routing weights, and 64 random routings
// (each token n_expert_used distinct experts) to cycle through.
struct moe_inputs {
    std::vector<float> x, out, w;
    std::vector<std::vector<int32_t>> routings;
};

moe_inputs make_moe_inputs(const moe_shape& s, int n_tok, std::mt19937& rng) {
    moe_inputs in;
    std::normal_distribution<float> value(0.0f, 1.0f);
    in.x.resize(static_cast<size_t>(n_tok) * s.n_embd);
    for (auto& v : in.x) v = value(rng);
    in.out.resize(in.x.size());
    in.w.assign(static_cast<size_t>(n_tok) * s.n_expert_used, 0.125f);
    in.routings.resize(64);
    std::vector<int32_t> order(static_cast<size_t>(s.n_expert));
    for (auto& ids : in.routings)
        for (int t = 0; t < n_tok; ++t) {
            for (int e = 0; e < s.n_expert; ++e) order[static_cast<size_t>(e)] = e;
            std::shuffle(order.begin(), order.end(), rng);
            ids.insert(ids.end(), order.begin(), order.begin() + s.n_expert_used);
        }
    return in;
}

// Median time of one MoE layer for n_tok tokens, cycling through the layers with fresh random routing
// each iteration (so the experts read change and come from memory, not the last-level cache).
moe_figures measure_moe(expert_pool& pool, const bench_layer& b, const expert_rows& rows, int n_tok, int iterations) {
    moe_runner runner(pool, b.shape, b.layers, rows);
    const auto& s = b.shape;
    std::mt19937 rng(11);
    auto [x, out, w, routings] = make_moe_inputs(s, n_tok, rng);
    std::vector<double> t;
    for (int i = 0; i < iterations + 10; ++i) {
        const auto& ids = routings[static_cast<size_t>(i) % routings.size()];
        const auto start = clock_type::now();
        runner.run(i % static_cast<int>(b.layers.size()), n_tok, x.data(), ids.data(), w.data(), out.data());
        if (i >= 10) t.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    moe_figures f;
    f.median_us = median(t);
    // Distinct experts per call: with 1 token exactly n_expert_used; more tokens share some.
    double distinct = 0;
    for (const auto& ids : routings) {
        std::vector<int32_t> u(ids);
        std::sort(u.begin(), u.end());
        distinct += static_cast<double>(std::unique(u.begin(), u.end()) - u.begin());
    }
    distinct /= static_cast<double>(routings.size());
    f.gbs = bytes_per_token(b) / s.n_expert_used * distinct / (f.median_us * 1e-6) / 1e9;
    return f;
}

// The decode-ratio diagnostic of the repacked layer, in turns of 4 calls so all three see the same
// minutes of a noisy machine: the MoE layer, the same kernel over as many weight bytes of contiguous
// rows (one stream per thread: what the layer's phases and item starts cost), and the pool's read of as
// many bytes (the better of a plain and a prefetching read). Medians in microseconds.
struct interleaved_figures {
    double layer_us = 0, stream_us = 0, read_us = 0;
};

interleaved_figures measure_interleaved(const pool_plan& plan, const bench_layer& b, int iterations) {
    const auto& s = b.shape;
    expert_pool pool(plan, pool_options{});
    store_options options;
    options.repack = true;
    const expert_store store(pool, s, b.layers, std::move(options));
    moe_runner runner(pool, s, b.layers, store);
    const auto n_layer = static_cast<int>(b.layers.size());
    std::mt19937 rng(13);
    auto [x, out, w, routings] = make_moe_inputs(s, 1, rng);
    // One token's experts read 3 n_expert_used n_ff rows of n_embd elements: as many gate rows in a row.
    const auto gate_type = b.layers[0].gate.type;
    std::vector<uint8_t> act(strata::kernels::cpu::activation_row_size(gate_type, s.n_embd));
    strata::kernels::cpu::quantize_activation(gate_type, x.data(), act.data(), s.n_embd);
    const int64_t group = strata::kernels::cpu::repack_group_rows;
    const int64_t stream_rows = int64_t{3} * s.n_expert_used * s.n_ff;
    std::vector<float> y(static_cast<size_t>(stream_rows));
    constexpr size_t item_words = 8192;
    const size_t read_words_per_call = static_cast<size_t>(bytes_per_token(b)) / 8 / item_words * item_words;
    std::vector<uint64_t> read_buf(read_words_per_call * static_cast<size_t>(n_layer), 1);
    std::atomic<uint64_t> sink{0};
    std::vector<double> t[4];  // layer, stream, plain read, prefetching read
    for (int i = 0; i < iterations; ++i) {
        const int arm = (i / 4) % 4, layer = i % n_layer;
        const auto start = clock_type::now();
        if (arm == 0) {
            runner.run(layer, 1, x.data(), routings[static_cast<size_t>(i) % routings.size()].data(), w.data(), out.data());
        } else if (arm == 1) {
            // A different window of the layer's gate rows each time, so no turn finds the last one's in cache.
            const strata::kernels::cpu::matrix m = store.rows(layer, expert_part::gate, 0, 0, 0);
            const int64_t spare = s.n_expert * s.n_ff - stream_rows;
            const int64_t first = spare > 0 ? (static_cast<int64_t>(i) * 97 * group) % spare / group * group : 0;
            constexpr int64_t item_rows = 128;
            pool.run_phase(static_cast<size_t>((stream_rows + item_rows - 1) / item_rows), [&](int, size_t begin, size_t end) {
                const int64_t r0 = static_cast<int64_t>(begin) * item_rows, r1 = std::min(stream_rows, static_cast<int64_t>(end) * item_rows);
                strata::kernels::cpu::matvec(m, first + r0, first + r1, act.data(), y.data() + r0);
            });
        } else {
            const uint64_t* base = read_buf.data() + static_cast<size_t>(layer) * read_words_per_call;
            pool.run_phase(read_words_per_call / item_words, [&](int, size_t begin, size_t end) {
                sink += strata::bench::read_words(base + begin * item_words, (end - begin) * item_words, arm == 3);
            });
        }
        if (i >= 16) t[arm].push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    return {median(t[0]), median(t[1]), std::min(median(t[2]), median(t[3]))};
}

void moe_section(const topology& topo, int iterations, int n_tok, int n_layer, strata::formats::ggml_type type) {
    const auto b = make_bench_layers(type, n_layer);
    std::printf("\ndecode-shaped MoE layer: n_embd %d, n_ff %d, %d experts, %d used, %s, %d token(s), %.1f MiB of\n"
                "weights per token and layer, %d layers of %.0f MiB cycled; median of %d layers with fresh routing;\n"
                "GB/s of expert weights read vs the same pool's read bandwidth (1 GiB sum, median of 5)\n",
                b.shape.n_embd, b.shape.n_ff, b.shape.n_expert, b.shape.n_expert_used,
                std::string(strata::formats::info(type).name).c_str(), n_tok, bytes_per_token(b) / (1 << 20), n_layer,
                bytes_per_token(b) / b.shape.n_expert_used * b.shape.n_expert / (1 << 20), iterations);
    std::printf("%-34s %8s %12s %10s %12s %8s\n", "arm", "threads", "layer", "GB/s", "read GB/s", "ratio");
    auto row = [&](const std::string& name, const pool_plan& plan, bool store, bool repack = false) {
        pool_options options;
        options.pin_host = plan.split;
        expert_pool pool(plan, options);
        std::unique_ptr<expert_rows> rows;
        store_options so;
        so.repack = repack;
        if (store) rows = std::make_unique<expert_store>(pool, b.shape, b.layers, std::move(so));
        else rows = std::make_unique<mapped_expert_rows>(b.layers);
        const auto f = measure_moe(pool, b, *rows, n_tok, iterations);
        const double bw = read_bandwidth_gbs(pool, size_t{1} << 30, 5);
        std::printf("%-34s %8d %9.1f us %10.2f %12.2f %7.0f %%\n", name.c_str(), plan.total_threads(), f.median_us, f.gbs, bw,
                    100.0 * f.gbs / bw);
    };
    const int n_threads = std::max(2, static_cast<int>(allowed_cpus().size()));
    pool_requests off_req;
    off_req.mode = numa_pool_mode::off;
    off_req.pool_workers = n_threads - 1;
    const auto off = plan_pool(topo, off_req);
    row("off, model rows in place", off, false);
    row("off, expert store (one copy)", off, true);
    // The rows16 layout, which the engine keeps its experts in (and decodes from) where the ISA repacks.
    const bool repacks = strata::kernels::cpu::can_repack(type, b.shape.n_ff);
    if (repacks) {
        row("off, expert store, repacked", off, true, true);
        const auto f = measure_interleaved(off, b, 4 * iterations);
        std::printf("interleaved, off, repacked, 1 token: layer %.1f us, the kernel over as many bytes of contiguous rows %.1f us,\n"
                    "  the pool's read of as many bytes %.1f us: layer at %.0f %% of the read, the contiguous rows at %.0f %%\n",
                    f.layer_us, f.stream_us, f.read_us, 100.0 * f.read_us / f.layer_us, 100.0 * f.read_us / f.stream_us);
    }
    pool_requests test_req;
    test_req.mode = numa_pool_mode::test;
    test_req.test_slices = 2;
    test_req.pool_workers = n_threads - 1;
    row("test:2, expert store (2 copies)", plan_pool(topo, test_req), true);
    if (topo.n_cpu_nodes() >= 2) {
        const auto split = plan_pool(topo, pool_requests{});
        if (split.split)
            row("split (" + std::to_string(split.slices.size()) + " nodes), expert store" + (repacks ? ", repacked" : ""), split,
                true, repacks);
    } else {
        std::printf("%-34s %8s   (this machine has 1 NUMA node)\n", "split", "n/a");
    }
}

int run(int argc, char** argv) {
    int iterations = 2000, moe_iterations = 400, moe_tokens = 1, moe_layers = 4;
    auto moe_type = strata::formats::ggml_type::Q4_K;
    bool moe_only = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--iterations" && i + 1 < argc) iterations = std::max(10, std::atoi(argv[++i]));
        else if (a == "--moe-iterations" && i + 1 < argc) moe_iterations = std::max(5, std::atoi(argv[++i]));
        else if (a == "--moe-tokens" && i + 1 < argc) moe_tokens = std::clamp(std::atoi(argv[++i]), 1, 64);
        else if (a == "--moe-layers" && i + 1 < argc) moe_layers = std::clamp(std::atoi(argv[++i]), 1, 64);
        else if (a == "--moe-type" && i + 1 < argc) {
            const auto t = strata::formats::type_from_name(argv[++i]);
            if (!t || !strata::formats::can_quantize(*t) || *t == strata::formats::ggml_type::F32) {
                std::fprintf(stderr, "strata-bench pool: --moe-type %s is not a type strata can quantize\n", argv[i]);
                return 2;
            }
            moe_type = *t;
        } else if (a == "--moe-only") moe_only = true;
        else if (a == "--help") {
            std::printf("strata-bench pool [--iterations N] [--moe-iterations N] [--moe-tokens N] [--moe-layers N] [--moe-type T] [--moe-only]:\n"
                        "  empty-phase round trip and spin cost, and a decode-shaped MoE layer in GB/s vs read bandwidth; medians\n");
            return 0;
        } else {
            std::fprintf(stderr, "strata-bench pool: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    const auto topo = load_machine_topology();
    std::printf("machine: %s\n", topo.describe().c_str());
    if (moe_only) {
        moe_section(topo, moe_iterations, moe_tokens, moe_layers, moe_type);
        return 0;
    }
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
    moe_section(topo, moe_iterations, moe_tokens, moe_layers, moe_type);
    return 0;
}

const strata::bench::register_mode registered{{"pool", "expert pool: empty-phase round trip, spin cost, MoE layer GB/s vs read bandwidth", run}};

}  // namespace
