// moe_runner: bitwise identical outputs across split / off / test:N, worker counts, token counts, weight
// formats and repeats (memcmp against NaN-prefilled outputs), agreement with a float reference within a
// stated tolerance, and a stress run of 1,000+ phases with idle gaps longer than the spin.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <thread>

#include "expert_pool.hpp"
#include "expert_store.hpp"
#include "moe_fixture.hpp"

using namespace strata::arenas;
using namespace strata::arenas::testing;
using strata::formats::ggml_type;

namespace {

// n_embd and n_ff are multiples of 256 (the k-quant block); 8 experts, 4 used, like a small qwen3moe.
constexpr moe_shape test_shape{512, 256, 8, 4};

// One layer per format, plus a mixed layer (gate and up of different types: separate activations).
const std::vector<layer_types> test_types{
    {ggml_type::Q4_K, ggml_type::Q4_K, ggml_type::Q4_K},
    {ggml_type::Q6_K, ggml_type::Q6_K, ggml_type::Q6_K},
    {ggml_type::Q8_0, ggml_type::Q8_0, ggml_type::Q8_0},
    {ggml_type::IQ4_XS, ggml_type::IQ4_XS, ggml_type::IQ4_XS},
    {ggml_type::Q4_K, ggml_type::IQ4_XS, ggml_type::Q6_K},
    {ggml_type::Q4_0, ggml_type::IQ4_NL, ggml_type::Q5_1},
};

const synthetic_moe& model() {
    static const synthetic_moe m = make_synthetic_moe(test_shape, test_types, 1234);
    return m;
}

// ThreadSanitizer runs the same matrix once instead of twice per case (every kernel load is
// instrumented there; the race coverage comes from the arms and phases, not the repeats).
#if defined(__SANITIZE_THREAD__)
constexpr int repeats = 1;
#else
constexpr int repeats = 2;
#endif

topology eight_cores() { return load_synthetic_topology("pack:1 numa:1 core:8 pu:1"); }

pool_plan off_plan(int workers) {
    pool_requests req;
    req.pool_workers = workers;
    return plan_pool(eight_cores(), req);
}

pool_plan test_plan(int n_slices, int workers_per_slice) {
    pool_requests req;
    req.mode = numa_pool_mode::test;
    req.test_slices = n_slices;
    req.arena_workers.assign(static_cast<size_t>(n_slices), workers_per_slice);
    return plan_pool(eight_cores(), req);
}

// A pinned split over this machine's first two CPUs, standing for two nodes.
std::optional<pool_plan> split_plan() {
    const auto cpus = allowed_cpus();
    if (cpus.size() < 2) return std::nullopt;
    pool_plan plan;
    plan.split = true;
    plan.host_cpu = cpus[0];
    plan.slices = {pool_slice{0, {cpus[0]}, 0, true, true}, pool_slice{1, {cpus[1]}, 1, false, true}};
    return plan;
}

struct arm {
    std::string name;
    pool_plan plan;
};

std::vector<arm> all_arms() {
    std::vector<arm> arms;
    for (int w = 1; w <= 4; ++w) arms.push_back({"off, " + std::to_string(w) + " workers", off_plan(w)});
    for (int n : {2, 3, 4})
        for (int w = 1; w <= 4; ++w)
            arms.push_back({"test:" + std::to_string(n) + ", " + std::to_string(w) + " workers per slice", test_plan(n, w)});
    if (auto p = split_plan()) arms.push_back({"split over 2 CPUs", *p});
    return arms;
}

std::vector<float> run_layer(moe_runner& runner, int layer, const routing& r) {
    std::vector<float> out(r.x.size(), std::numeric_limits<float>::quiet_NaN());
    runner.run(layer, r.n_tok, r.x.data(), r.ids.data(), r.weights.data(), out.data());
    return out;
}

routing case_routing(int layer, int n_tok) {
    std::mt19937 rng(static_cast<uint32_t>(1000 * layer + n_tok));
    return make_routing(test_shape, n_tok, rng);
}

}  // namespace

TEST(MoePhases, SplitRowsCoversTheRowsOnBlockBoundaries) {
    for (int n : {1, 2, 3, 4})
        for (int64_t rows : {int64_t{32}, int64_t{100}, int64_t{768}, int64_t{2048}}) {
            const auto ranges = split_rows(test_plan(n, 1 + n % 2), rows, 32);
            ASSERT_EQ(ranges.size(), static_cast<size_t>(n));
            EXPECT_EQ(ranges.front().begin, 0);
            EXPECT_EQ(ranges.back().end, rows);
            for (size_t s = 0; s + 1 < ranges.size(); ++s) {
                EXPECT_EQ(ranges[s].end, ranges[s + 1].begin);
                EXPECT_EQ(ranges[s].end % 32, 0) << rows << " rows, " << n << " slices";
                EXPECT_LE(ranges[s].begin, ranges[s].end);
            }
        }
}

TEST(MoePhases, BitwiseIdenticalAcrossSlicingsWorkersTokensFormatsAndRepeats) {
    const synthetic_moe& m = model();
    const mapped_expert_rows rows(m.layers);
    const std::vector<int> token_counts{1, 4, 16, 40};
    std::map<std::pair<int, int>, std::vector<float>> expected;  // (layer, n_tok) -> first arm's output
    int comparisons = 0, mismatches = 0;
    for (const arm& a : all_arms()) {
        expert_pool pool(a.plan);
        moe_runner runner(pool, m.shape, m.layers, rows);
        EXPECT_EQ(runner.ff_ranges().size(), a.plan.slices.size());
        for (int layer = 0; layer < static_cast<int>(m.layers.size()); ++layer)
            for (int n_tok : token_counts) {
                const routing r = case_routing(layer, n_tok);
                for (int rep = 0; rep < repeats; ++rep) {
                    const auto out = run_layer(runner, layer, r);
                    auto [it, first] = expected.try_emplace({layer, n_tok}, out);
                    ++comparisons;
                    if (std::memcmp(out.data(), it->second.data(), out.size() * sizeof(float)) != 0) {
                        ++mismatches;
                        ADD_FAILURE() << a.name << ": layer " << layer << ", " << n_tok << " token(s), repeat " << rep
                                      << " differs from the first arm";
                    }
                }
            }
    }
    std::printf("moe_runner bitwise comparisons: %d, mismatches: %d\n", comparisons, mismatches);
    EXPECT_GE(comparisons, 300 * repeats);

    // The same outputs against two scalar references (moe_fixture.hpp), with stated tolerances:
    //  - "exact": vec_dot_ref on activations quantized as the kernels quantize them; only the order of
    //    the float sums inside a dot product differs, so every element is within 1e-3 of the output RMS;
    //  - "float": dequantized weights times unquantized x and h. The kernels' 8-bit activations (x, and
    //    the heavy-tailed h) cost up to a few percent: relative L2 error under 5 %.
    struct worst {
        double l2 = 0, elem = 0;
    } exact, plain;
    auto compare = [](const std::vector<float>& got, const std::vector<float>& want, worst& w) {
        double err2 = 0, ref2 = 0, max_err = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            const double d = double(got[i]) - want[i];
            err2 += d * d;
            ref2 += double(want[i]) * want[i];
            max_err = std::max(max_err, std::abs(d));
        }
        const double rms = std::sqrt(ref2 / static_cast<double>(want.size()));
        const double l2 = std::sqrt(err2 / std::max(ref2, 1e-30)), elem = max_err / std::max(rms, 1e-30);
        w.l2 = std::max(w.l2, l2);
        w.elem = std::max(w.elem, elem);
        return std::pair{l2, elem};
    };
    for (const auto& [key, out] : expected) {
        const auto [layer, n_tok] = key;
        const auto& types = test_types[static_cast<size_t>(layer)];
        const std::string what = "layer " + std::to_string(layer) + " (" + std::string(strata::formats::info(types[0]).name) + "/" +
                                 std::string(strata::formats::info(types[2]).name) + "), " + std::to_string(n_tok) + " token(s)";
        for (float v : out) ASSERT_FALSE(std::isnan(v)) << what << ": an output element was never written";
        const routing r = case_routing(layer, n_tok);
        const auto [exact_l2, exact_elem] = compare(out, reference_moe(m, layer, r, true), exact);
        EXPECT_LT(exact_elem, 1e-3) << what;
        const auto [plain_l2, plain_elem] = compare(out, reference_moe(m, layer, r, false), plain);
        EXPECT_LT(plain_l2, 0.05) << what;
    }
    std::printf("moe_runner against the scalar references over %zu cases: exact-activation reference: worst element "
                "error %.2e of the output RMS; float reference: worst relative L2 error %.2f %%, worst element %.1f %% "
                "of the RMS\n", expected.size(), exact.elem, 100 * plain.l2, 100 * plain.elem);
}

// The expert store's repacked copy (the prompt GEMM layout where the ISA has its kernels, the GGUF rows
// elsewhere): bitwise identical across pool arms and token counts' repeats, and within the same
// tolerance of the exact-activation reference as the GGUF layout.
TEST(MoePhases, RepackedStoreIsBitwiseAcrossArmsAndNearTheReference) {
    const synthetic_moe& m = model();
    using strata::kernels::cpu::can_repack;
    const bool repacks = can_repack(ggml_type::Q4_K, test_shape.n_ff);
    const bool repacks_q6_k = can_repack(ggml_type::Q6_K, test_shape.n_embd);
    const bool repacks_iq4_nl = can_repack(ggml_type::IQ4_NL, test_shape.n_ff);
    const bool repacks_iq4_xs = can_repack(ggml_type::IQ4_XS, test_shape.n_embd);
    std::map<std::pair<int, int>, std::vector<float>> expected;
    int comparisons = 0;
    for (const arm& a : all_arms()) {
        if (a.plan.split) continue;  // the split binds memory to nodes this machine may lack
        expert_pool pool(a.plan);
        store_options options;
        options.repack = true;
        const expert_store store(pool, m.shape, m.layers, std::move(options));
        EXPECT_EQ(repacks, store.rows(0, expert_part::gate, 0, 0, 0).layout == strata::kernels::cpu::weight_layout::rows16);
        EXPECT_EQ(repacks_q6_k, store.rows(1, expert_part::down, 0, 0, 0).layout ==
                                    strata::kernels::cpu::weight_layout::rows16);  // Q6_K
        EXPECT_EQ(repacks_iq4_nl, store.rows(5, expert_part::up, 0, 0, 0).layout ==
                                      strata::kernels::cpu::weight_layout::rows16);  // IQ4_NL
        EXPECT_EQ(repacks_iq4_xs, store.rows(3, expert_part::down, 0, 0, 0).layout ==
                                      strata::kernels::cpu::weight_layout::rows16);  // IQ4_XS
        moe_runner runner(pool, m.shape, m.layers, store);
        for (int layer = 0; layer < static_cast<int>(m.layers.size()); ++layer)
            for (int n_tok : {1, 16, 40}) {
                const auto out = run_layer(runner, layer, case_routing(layer, n_tok));
                auto [it, first] = expected.try_emplace({layer, n_tok}, out);
                ++comparisons;
                EXPECT_EQ(0, std::memcmp(out.data(), it->second.data(), out.size() * sizeof(float)))
                    << a.name << ": layer " << layer << ", " << n_tok << " token(s) differs from the first arm";
            }
    }
    EXPECT_GE(comparisons, 150);
    for (const auto& [key, out] : expected) {
        const auto [layer, n_tok] = key;
        const auto want = reference_moe(m, layer, case_routing(layer, n_tok), true);
        double ref2 = 0, max_err = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            ref2 += double(want[i]) * want[i];
            max_err = std::max(max_err, std::abs(double(out[i]) - want[i]));
        }
        EXPECT_LT(max_err / std::sqrt(ref2 / static_cast<double>(want.size())), 1e-3)
            << "layer " << layer << ", " << n_tok << " token(s)";
    }
}

TEST(MoePhases, SkippedSlotsAndEmptyRouting) {
    const synthetic_moe& m = model();
    const mapped_expert_rows rows(m.layers);
    expert_pool pool(test_plan(2, 1));
    moe_runner runner(pool, m.shape, m.layers, rows);
    std::mt19937 rng(7);
    routing r = make_routing(test_shape, 3, rng, 0.0);
    std::fill(r.ids.begin(), r.ids.begin() + test_shape.n_expert_used, -1);  // token 0: all on the GPU
    const auto out = run_layer(runner, 0, r);
    for (int c = 0; c < test_shape.n_embd; ++c) ASSERT_EQ(out[static_cast<size_t>(c)], 0.0f);
    for (size_t i = static_cast<size_t>(test_shape.n_embd); i < out.size(); ++i) ASSERT_FALSE(std::isnan(out[i]));

    std::fill(r.ids.begin(), r.ids.end(), -1);
    const auto none = run_layer(runner, 0, r);
    for (float v : none) ASSERT_EQ(v, 0.0f);

    r.ids[1] = test_shape.n_expert;
    EXPECT_THROW(run_layer(runner, 0, r), std::out_of_range);
}

TEST(MoePhases, StressPhasesWithIdleGapsLongerThanTheSpin) {
    const synthetic_moe& m = model();
    const mapped_expert_rows rows(m.layers);
    pool_options options;
    options.spin = std::chrono::microseconds(20);
    expert_pool reference_pool(off_plan(1));
    moe_runner reference(reference_pool, m.shape, m.layers, rows);
    expert_pool pool(test_plan(2, 2), options);
    moe_runner runner(pool, m.shape, m.layers, rows);

    std::vector<routing> cases;
    std::vector<std::vector<float>> want;
    for (int i = 0; i < 8; ++i) {
        cases.push_back(case_routing(i % 5, 1 + (i % 3)));
        want.push_back(run_layer(reference, i % 5, cases.back()));
    }
    const auto phases_before = pool.phases_run();
    int runs = 0, mismatches = 0;
    while (pool.phases_run() - phases_before < 1200) {
        const size_t i = static_cast<size_t>(runs++) % cases.size();
        const auto out = run_layer(runner, static_cast<int>(i % 5), cases[i]);
        if (std::memcmp(out.data(), want[i].data(), out.size() * sizeof(float)) != 0) ++mismatches;
        if (runs % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(150));  // idle gap > spin
    }
    std::printf("moe_runner stress: %d layers, %llu phases, %d mismatches\n", runs,
                static_cast<unsigned long long>(pool.phases_run() - phases_before), mismatches);
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(pool.stalls_reported(), 0u);
}
