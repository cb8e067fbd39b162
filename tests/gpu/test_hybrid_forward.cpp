// The hybrid forward pass against the CPU engine on generated models of each architecture: logits
// within a stated tolerance and the same greedy tokens, with all, about half and none of the routed
// experts resident, with prompt batches large enough for the cuBLAS path, and with adaptive swaps
// running every decode step (they must never change results). Label gpu: skips without a device.
//
// Tolerance: the CPU engine multiplies 8-bit-quantised activations, the GPU f32 ones; on these models
// that moves logits by about 1 % of the largest logit. The tests allow 4 %.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "expert_pool.hpp"
#include "generate.hpp"
#include "gpu/hybrid_forward.hpp"
#include "gpu_available.hpp"
#include "model/forward.hpp"
#include "model/weights.hpp"
#include "topology.hpp"

namespace strata::engine::gpu {
namespace {

using make_model::arch;

constexpr double kTolerance = 0.04;  // of the largest CPU logit
constexpr int kCtx = 128;

struct loaded {
    gguf::reader file;
    hparams hp;
    model_weights w;
    std::vector<arenas::moe_layer> layers;
    std::unique_ptr<arenas::mapped_expert_rows> rows;
    std::unique_ptr<arenas::expert_pool> pool;
};

std::unique_ptr<loaded> load(arch a) {
    make_model::model_spec spec = make_model::preset("tiny");
    spec.architecture = a;
    auto m = std::make_unique<loaded>(loaded{gguf::reader::from_bytes(make_model::build_model(spec).write_to_memory()),
                                             {}, {}, {}, {}, {}});
    m->hp = read_hparams(m->file);
    m->w = bind_weights(m->file, m->hp);
    m->layers = moe_layers(m->w);
    m->rows = std::make_unique<arenas::mapped_expert_rows>(m->layers);
    arenas::pool_flags flags;
    flags.numa_pool = "off";
    flags.pool_workers = 2;
    const auto env = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
    m->pool = arenas::expert_pool::create(arenas::load_machine_topology(), arenas::read_pool_requests(env, flags));
    return m;
}

std::vector<int32_t> prompt(int n_vocab, int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 7919 + 13) % (n_vocab - 3));
    return t;
}

struct run_result {
    std::vector<float> prompt_logits;             // [n_prompt][n_vocab]
    std::vector<std::vector<float>> step_logits;  // per decode step, [n_vocab]
    std::vector<int32_t> tokens;                  // greedy continuation
};

int32_t argmax(const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

template <class Eval>
run_result generate(const hparams& hp, const std::vector<int32_t>& p, int n_gen, int n_batch, Eval&& eval) {
    kv_cache kv(hp.n_layer, kCtx, hp.n_head_kv, hp.head_dim, kv_type::f16);
    run_result r;
    r.prompt_logits.resize(p.size() * static_cast<size_t>(hp.n_vocab));
    eval(std::span<const int32_t>(p), 0, kv, r.prompt_logits.data(), true, n_batch);
    std::vector<float> last(r.prompt_logits.end() - hp.n_vocab, r.prompt_logits.end());
    for (int i = 0; i < n_gen; ++i) {
        const int32_t t = argmax(last);
        r.tokens.push_back(t);
        eval(std::span<const int32_t>(&t, 1), static_cast<int>(p.size()) + i, kv, last.data(), false, n_batch);
        r.step_logits.push_back(last);
    }
    return r;
}

double rel_err(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num = std::max(num, std::abs(double(a[i]) - b[i]));
        den = std::max(den, std::abs(double(b[i])));
    }
    return num / den;
}

void expect_same(const run_result& gpu, const run_result& cpu, size_t n_vocab, const std::string& what) {
    ASSERT_EQ(gpu.prompt_logits.size(), cpu.prompt_logits.size());
    for (size_t t = 0; t < cpu.prompt_logits.size() / n_vocab; ++t)
        EXPECT_LT(rel_err(&gpu.prompt_logits[t * n_vocab], &cpu.prompt_logits[t * n_vocab], n_vocab), kTolerance)
            << what << ": prompt position " << t;
    EXPECT_EQ(gpu.tokens, cpu.tokens) << what << ": greedy tokens";
    for (size_t i = 0; i < cpu.step_logits.size(); ++i)
        EXPECT_LT(rel_err(gpu.step_logits[i].data(), cpu.step_logits[i].data(), n_vocab), kTolerance)
            << what << ": decode step " << i;
}

struct hybrid_case {
    arch a;
    int n_prompt;   // >= 16 reaches the cuBLAS path
};

class HybridForward : public ::testing::TestWithParam<hybrid_case> {};

TEST_P(HybridForward, MatchesCpuAtEveryResidency) {
    STRATA_REQUIRE_GPU();
    const hybrid_case c = GetParam();
    auto m = load(c.a);
    const hparams& hp = m->hp;
    const std::vector<int32_t> p = prompt(hp.n_vocab, c.n_prompt);
    const int n_gen = 8, n_batch = 32;
    forward_pass cpu(*m->pool, hp, m->w, *m->rows);
    const run_result want = generate(hp, p, n_gen, n_batch, [&](auto&&... a) { cpu.eval(a...); });

    // Slot size as the backend computes it: gate + up + down of one expert, 256-byte aligned.
    const auto& l0 = m->layers[0];
    const uint64_t slot = (formats::row_size(l0.gate.type, l0.gate.n_cols) * l0.gate.n_rows +
                           formats::row_size(l0.up.type, l0.up.n_cols) * l0.up.n_rows +
                           formats::row_size(l0.down.type, l0.down.n_cols) * l0.down.n_rows + 255) / 256 * 256;
    const int total = hp.n_layer * hp.n_expert;
    struct variant {
        const char* name;
        std::optional<double> gib;
        adapt_options adapt;
        int expect_slots;
    };
    const std::vector<variant> variants{
        {"all resident", std::nullopt, {}, total},
        {"half resident", double(slot * (total / 2)) / double(1 << 30), {}, total / 2},
        {"none resident", 0.0, {}, 0},
        {"half, adaptive", double(slot * (total / 2)) / double(1 << 30), {.every = 1, .swaps = 3, .async = false}, total / 2},
        {"half, adaptive async", double(slot * (total / 2)) / double(1 << 30), {.every = 1, .swaps = 3, .async = true},
         total / 2},
    };
    for (const variant& v : variants) {
        hybrid_options o;
        o.expert_cache_gib = v.gib;
        o.adapt = v.adapt;
        o.n_ctx = kCtx;
        o.n_batch = n_batch;
        o.gpu_sessions = 1;
        std::string why;
        auto h = hybrid_forward::create(*m->pool, hp, m->w, m->layers, *m->rows, o, &why);
        ASSERT_TRUE(h) << why;
        const run_result got = generate(hp, p, n_gen, n_batch, [&](auto&&... a) { h->eval(a...); });
        expect_same(got, want, static_cast<size_t>(hp.n_vocab), v.name);
        const cache_stats s = h->expert_cache_stats();
        EXPECT_EQ(s.n_slots, v.expect_slots) << v.name;
        const uint64_t lookups = uint64_t(p.size() + n_gen) * hp.n_layer * hp.n_expert_used;
        EXPECT_EQ(s.lookups, lookups) << v.name;
        if (v.expect_slots == total) {
            EXPECT_EQ(s.hits, lookups) << v.name;
        }
        if (v.expect_slots == 0) {
            EXPECT_EQ(s.hits, 0u) << v.name;
        }
        if (v.adapt.every > 0) {
            EXPECT_GT(s.swaps_started, 0u) << v.name << ": the adaptive tier never swapped";
        }
        if (::testing::Test::HasFailure()) break;
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, HybridForward,
                         ::testing::Values(hybrid_case{arch::qwen3moe, 12}, hybrid_case{arch::qwen2moe, 12},
                                           hybrid_case{arch::mixtral, 12}, hybrid_case{arch::qwen3moe, 40},
                                           hybrid_case{arch::qwen2moe, 40}),
                         [](const auto& info) {
                             return make_model::arch_name(info.param.a) + "_prompt" + std::to_string(info.param.n_prompt);
                         });

TEST(HybridForwardDevice, OutOfRangeDeviceSaysWhy) {
    auto m = load(arch::qwen3moe);
    hybrid_options o;
    o.gpu = 999;
    o.n_ctx = kCtx;
    std::string why;
    EXPECT_FALSE(hybrid_forward::create(*m->pool, m->hp, m->w, m->layers, *m->rows, o, &why));
    EXPECT_FALSE(why.empty());
}

}  // namespace
}  // namespace strata::engine::gpu
