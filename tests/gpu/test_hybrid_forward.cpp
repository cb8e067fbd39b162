// The hybrid forward pass against the CPU engine on generated models of each architecture (glm4moe
// with and without QK norm, with one or two leading dense layers, with and without its ungated shared
// expert; qwen3moe with group-limited routing): logits within a stated tolerance, the same experts
// chosen and the same greedy tokens (where routing agrees: see expect_same), with
// all, about half and none of the routed experts resident, with prompt batches large enough for the
// cuBLAS path, and (on one quantised and one F32 model) with adaptive swaps running every decode step
// (they must never change results) and the int8 KV cache.
// The VRAM KV cache grows as a session fills, and running out of VRAM leaves the session intact.
// Label gpu: skips without a device (and runs on the CPU emulator under STRATA_CUDA=EMU).
//
// Tolerance: the CPU engine multiplies 8-bit-quantised activations, the GPU f32 ones; on these models
// that moves logits by about 1 % of the largest logit. The tests allow 4 %. Models with F32 weights
// (the CPU multiplies f32 activations too) must match to 0.2 % (1 % through cuBLAS's f16 GEMM) and
// route every token to exactly the CPU's experts.
//
// glm4moe runs on F32 weights here: its sigmoid scores with the correction bias sit close together and
// its weights are scaled by 2.5, so on the quantised tiny models 8-bit activations move a few routing
// decisions in a prompt, and attention carries such a move to every later position, past what the
// 4 % rule below allows for.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "expert_pool.hpp"
#include "expert_store.hpp"
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
constexpr double kExactTolerance = 0.002, kExactGemmTolerance = 0.01;  // F32 weights
constexpr int kCtx = 128;

struct loaded {
    gguf::reader file;
    hparams hp;
    model_weights w;
    std::vector<arenas::moe_layer> layers;
    std::unique_ptr<arenas::mapped_expert_rows> rows;
    std::unique_ptr<arenas::expert_pool> pool;
};

// The tiny preset of `a`, changed by `edit` (glm4moe's layout), with every weight in F32 or as the
// preset quantises it, with `groups` expert groups of which half are used (0: no group-limited routing).
struct model_variant {
    std::function<void(make_model::model_spec&)> edit;
    bool f32 = false;
    int groups = 0;
};

std::unique_ptr<loaded> load(arch a, const model_variant& v = {}) {
    make_model::model_spec spec = make_model::preset("tiny", a);
    if (v.edit) v.edit(spec);
    if (v.f32)
        spec.type_experts = spec.type_shexp = spec.type_attn = spec.type_embd = spec.type_out = formats::ggml_type::F32;
    gguf::writer w = make_model::build_model(spec);
    if (v.groups > 0) {
        const std::string p = make_model::gguf_architecture(a);
        w.set(p + ".expert_group_count", gguf::value::u32(static_cast<uint32_t>(v.groups)));
        w.set(p + ".expert_group_used_count", gguf::value::u32(static_cast<uint32_t>(v.groups / 2)));
    }
    auto m = std::make_unique<loaded>(loaded{gguf::reader::from_bytes(w.write_to_memory()), {}, {}, {}, {}, {}});
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

// One run over a prompt and n_gen decode steps. Decode is teacher-forced: every run is fed the same
// tokens (the CPU engine's greedy choices), so steps stay comparable after a difference.
struct run_result {
    std::vector<float> prompt_logits;             // [n_prompt][n_vocab]
    std::vector<uint64_t> prompt_routing;         // routed counts of the prompt, [n_layer][n_expert]
    std::vector<std::vector<float>> step_logits;  // per decode step, [n_vocab]
    std::vector<std::vector<uint64_t>> step_routing;  // per decode step, routed counts of that step
};

int32_t argmax(const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

std::vector<uint64_t> minus(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
    std::vector<uint64_t> d(a.size());
    for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
    return d;
}

// feed: the decode tokens (empty: greedy, the tokens chosen are appended to it).
template <class Eval, class Routing>
run_result generate(const hparams& hp, const std::vector<int32_t>& p, int n_gen, int n_batch, kv_type kv_t,
                    std::vector<int32_t>& feed, Eval&& eval, Routing&& routing) {
    kv_cache kv(hp.n_layer, kCtx, hp.n_head_kv, hp.head_dim, kv_t);
    run_result r;
    const bool greedy = feed.empty();
    r.prompt_logits.resize(p.size() * static_cast<size_t>(hp.n_vocab));
    std::vector<uint64_t> before = routing();
    eval(std::span<const int32_t>(p), 0, kv, r.prompt_logits.data(), true, n_batch);
    r.prompt_routing = minus(routing(), before);
    std::vector<float> last(r.prompt_logits.end() - hp.n_vocab, r.prompt_logits.end());
    for (int i = 0; i < n_gen; ++i) {
        if (greedy) feed.push_back(argmax(last));
        const int32_t t = feed[static_cast<size_t>(i)];
        before = routing();
        eval(std::span<const int32_t>(&t, 1), static_cast<int>(p.size()) + i, kv, last.data(), false, n_batch);
        r.step_logits.push_back(last);
        r.step_routing.push_back(minus(routing(), before));
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

// Routing decisions that differ between two count arrays (each moved decision shows twice).
uint64_t routing_differences(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
    uint64_t d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
    return d / 2;
}

// Top-1 minus top-2 logit over the largest |logit|: how far the greedy choice is from a tie.
double greedy_margin(const std::vector<float>& v) {
    std::vector<float> s(v);
    std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<>());
    double den = 0;
    for (float x : v) den = std::max(den, std::abs(double(x)));
    return (double(s[0]) - s[1]) / den;
}

// The hybrid pass against the CPU engine. The two multiply different activations (8-bit on the CPU,
// f32 on the GPU), so where a router sees two experts nearly tied, the two may route a token to
// different experts, and that token's logits legitimately differ by more than the tolerance. Both
// engines count routed experts, so such a step is detected exactly rather than guessed:
// - a decode step whose routing is the same must be within the tolerance, and its greedy token must
//   match the CPU's wherever the CPU's choice is not itself a near tie (margin above 2 x tolerance);
// - a decode step whose routing differs is counted, and at most one step in four may be one;
// - prompt positions must all be within the tolerance when the prompt's routing is the same, else at
//   most one position per moved routing decision may exceed it.
void expect_same(const run_result& gpu, const run_result& cpu, size_t n_vocab, const std::string& what,
                 double tolerance = kTolerance) {
    ASSERT_EQ(gpu.prompt_logits.size(), cpu.prompt_logits.size());
    const size_t n_prompt = cpu.prompt_logits.size() / n_vocab;
    const uint64_t prompt_moved = routing_differences(gpu.prompt_routing, cpu.prompt_routing);
    uint64_t over = 0;
    double worst = 0;
    for (size_t t = 0; t < n_prompt; ++t) {
        const double e = rel_err(&gpu.prompt_logits[t * n_vocab], &cpu.prompt_logits[t * n_vocab], n_vocab);
        worst = std::max(worst, e);
        if (e >= tolerance) {
            ++over;
            EXPECT_GT(prompt_moved, 0u) << what << ": prompt position " << t << " is off by " << e
                                        << " of the largest logit with the same routing as the CPU";
        }
    }
    EXPECT_LE(over, prompt_moved) << what << ": " << over << " prompt positions beyond the tolerance (worst " << worst
                                  << ") for " << prompt_moved << " routing decisions that differ from the CPU's";
    int tie_steps = 0;
    for (size_t i = 0; i < cpu.step_logits.size(); ++i) {
        if (gpu.step_routing[i] != cpu.step_routing[i]) {
            ++tie_steps;
            continue;
        }
        EXPECT_LT(rel_err(gpu.step_logits[i].data(), cpu.step_logits[i].data(), n_vocab), tolerance)
            << what << ": decode step " << i << " (same routing as the CPU)";
        if (greedy_margin(cpu.step_logits[i]) > 2 * tolerance) {
            EXPECT_EQ(argmax(gpu.step_logits[i]), argmax(cpu.step_logits[i])) << what << ": greedy token at step " << i;
        }
    }
    std::printf("%s: prompt worst %.4f of the largest logit (%llu routing decisions moved), %d of %zu decode steps "
                "routed differently\n",
                what.c_str(), worst, static_cast<unsigned long long>(prompt_moved), tie_steps, cpu.step_logits.size());
    EXPECT_LE(tie_steps * 4, static_cast<int>(cpu.step_logits.size()))
        << what << ": " << tie_steps << " of " << cpu.step_logits.size() << " decode steps routed differently";
}

struct hybrid_case {
    arch a;
    int n_prompt;   // >= 16 reaches the cuBLAS path
    const char* variant = "";  // name suffix of the test
    model_variant model = {};
    bool every_option = false;  // also adaptive swaps, decode timing and the int8 KV cache (else residencies only)
};

// The routing decisions (token, layer, expert) that differ from the CPU's, over every step.
uint64_t routing_moved(const run_result& gpu, const run_result& cpu) {
    uint64_t d = routing_differences(gpu.prompt_routing, cpu.prompt_routing);
    for (size_t i = 0; i < cpu.step_routing.size(); ++i) d += routing_differences(gpu.step_routing[i], cpu.step_routing[i]);
    return d;
}

class HybridForward : public ::testing::TestWithParam<hybrid_case> {};

TEST_P(HybridForward, MatchesCpuAtEveryResidency) {
    STRATA_REQUIRE_GPU();
    const hybrid_case c = GetParam();
    auto m = load(c.a, c.model);
    const hparams& hp = m->hp;
    const std::vector<int32_t> p = prompt(hp.n_vocab, c.n_prompt);
    const int n_gen = 8, n_batch = 32;
    forward_pass cpu(*m->pool, hp, m->w, *m->rows);
    // Per KV cache type: the CPU's greedy tokens (fed to every hybrid run) and its results.
    std::vector<int32_t> tokens[2];
    run_result want[2];
    for (const kv_type t : {kv_type::f16, kv_type::int8}) {
        if (t == kv_type::int8 && !c.every_option) continue;
        const int i = static_cast<int>(t);
        want[i] = generate(hp, p, n_gen, n_batch, t, tokens[i], [&](auto&&... a) { cpu.eval(a...); },
                           [&] { return cpu.routing().counts; });
    }

    // Slot size as the backend computes it: gate + up + down of one expert, 256-byte aligned.
    const auto& l0 = m->layers[0];
    const uint64_t slot = (formats::row_size(l0.gate.type, l0.gate.n_cols) * l0.gate.n_rows +
                           formats::row_size(l0.up.type, l0.up.n_cols) * l0.up.n_rows +
                           formats::row_size(l0.down.type, l0.down.n_cols) * l0.down.n_rows + 255) / 256 * 256;
    const int total = hp.n_moe_layer() * hp.n_expert;  // leading dense layers have no experts
    struct variant {
        const char* name;
        std::optional<double> gib;
        adapt_options adapt;
        int expect_slots;
        bool timing = false;  // STRATA_DECODE_TIMING's event timing on every decode step
        kv_type kv = kv_type::f16;
    };
    const double half = double(slot * (total / 2)) / double(1 << 30);
    std::vector<variant> variants{
        {"all resident", std::nullopt, {}, total},
        {"half resident, decode timing", half, {}, total / 2, true},
        {"none resident", 0.0, {}, 0},
    };
    if (c.every_option) {
        variants.insert(variants.end(), {
            {"half, adaptive", half, {.every = 1, .swaps = 3, .async = false}, total / 2},
            {"half, adaptive async", half, {.every = 1, .swaps = 3, .async = true}, total / 2},
            {"half resident, int8 KV cache", half, {}, total / 2, false, kv_type::int8},
        });
    }
    for (const variant& v : variants) {
        hybrid_options o;
        o.expert_cache_gib = v.gib;
        o.adapt = v.adapt;
        o.n_ctx = kCtx;
        o.n_batch = n_batch;
        o.gpu_sessions = 1;
        o.decode_timing = v.timing;
        o.kv = v.kv;
        const int ki = static_cast<int>(v.kv);
        std::string why;
        auto h = hybrid_forward::create(*m->pool, hp, m->w, m->layers, *m->rows, o, &why);
        ASSERT_TRUE(h) << why;
        const run_result got = generate(
            hp, p, n_gen, n_batch, v.kv, tokens[ki], [&](auto&&... a) { h->eval(a...); },
            [&] { return h->routing().counts; });
        if (c.model.f32) {
            expect_same(got, want[ki], static_cast<size_t>(hp.n_vocab), v.name,
                        c.n_prompt >= 16 ? kExactGemmTolerance : kExactTolerance);
            EXPECT_EQ(routing_moved(got, want[ki]), 0u) << v.name << ": routed to other experts than the CPU";
        } else {
            expect_same(got, want[ki], static_cast<size_t>(hp.n_vocab), v.name);
        }
        for (int il = 0; il < hp.n_layer_dense_lead; ++il)
            for (int e = 0; e < hp.n_expert; ++e)
                EXPECT_EQ(got.prompt_routing[static_cast<size_t>(il * hp.n_expert + e)], 0u) << "dense layer " << il;
        const cache_stats s = h->expert_cache_stats();
        EXPECT_EQ(s.n_slots, v.expect_slots) << v.name;
        const uint64_t lookups = uint64_t(p.size() + n_gen) * hp.n_moe_layer() * hp.n_expert_used;
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

// glm4moe's tiny preset: q/k/v biases, QK norm, one leading dense layer, one shared expert, sigmoid
// routing with the correction bias, renormalised and scaled by 2.5, partial RoPE (half the head).
const model_variant glm{{}, true};
const model_variant glm_air{[](make_model::model_spec& s) { s.qk_norm = false; }, true};
const model_variant glm_two_dense_unshared{[](make_model::model_spec& s) {
                                               s.n_layer = 4;
                                               s.n_layer_dense_lead = 2;
                                               s.n_expert_shared = 0;
                                           },
                                           true};

INSTANTIATE_TEST_SUITE_P(Archs, HybridForward,
                         ::testing::Values(hybrid_case{arch::qwen3moe, 12, "", {}, true}, hybrid_case{arch::qwen2moe, 12},
                                           hybrid_case{arch::mixtral, 12}, hybrid_case{arch::qwen3moe, 40},
                                           hybrid_case{arch::qwen2moe, 40},
                                           hybrid_case{arch::glm4moe, 12, "_f32", glm, true},
                                           hybrid_case{arch::glm4moe, 40, "_f32", glm},
                                           hybrid_case{arch::glm4moe, 12, "_f32_no_qk_norm", glm_air},
                                           hybrid_case{arch::glm4moe, 12, "_f32_two_dense_no_shared", glm_two_dense_unshared},
                                           hybrid_case{arch::qwen3moe, 12, "_groups", {{}, false, 4}},
                                           hybrid_case{arch::qwen3moe, 12, "_f32_groups", {{}, true, 4}}),
                         [](const auto& info) {
                             return make_model::arch_name(info.param.a) + "_prompt" + std::to_string(info.param.n_prompt) +
                                    info.param.variant;
                         });

// Each code-book format (IQ1 / IQ2 / IQ3) and MXFP4 as the type of the routed and shared experts of
// qwen2moe's tiny preset, with about half of the routed experts resident (GPU matvec over those, the
// CPU pool over the rest) and a 16-token prompt (the shared expert through dequantise-to-f16 and
// cuBLAS): within the quantised models' tolerance of the CPU engine, by expect_same's rules.
class HybridCodeBookFormats : public ::testing::TestWithParam<formats::ggml_type> {};

TEST_P(HybridCodeBookFormats, HalfResidentMatchesCpu) {
    STRATA_REQUIRE_GPU();
    const formats::ggml_type type = GetParam();
    auto m = load(arch::qwen2moe, {[type](make_model::model_spec& s) { s.type_experts = s.type_shexp = type; }});
    const hparams& hp = m->hp;
    ASSERT_EQ(m->layers[0].gate.type, type);
    const std::vector<int32_t> p = prompt(hp.n_vocab, 16);
    const int n_gen = 4, n_batch = 32;
    forward_pass cpu(*m->pool, hp, m->w, *m->rows);
    std::vector<int32_t> tokens;
    const run_result want = generate(hp, p, n_gen, n_batch, kv_type::f16, tokens, [&](auto&&... a) { cpu.eval(a...); },
                                     [&] { return cpu.routing().counts; });
    const auto& l0 = m->layers[0];
    const uint64_t slot = (formats::row_size(l0.gate.type, l0.gate.n_cols) * l0.gate.n_rows +
                           formats::row_size(l0.up.type, l0.up.n_cols) * l0.up.n_rows +
                           formats::row_size(l0.down.type, l0.down.n_cols) * l0.down.n_rows + 255) / 256 * 256;
    const int total = hp.n_moe_layer() * hp.n_expert;
    hybrid_options o;
    o.expert_cache_gib = double(slot * (total / 2)) / double(1 << 30);
    o.n_ctx = kCtx;
    o.n_batch = n_batch;
    std::string why;
    auto h = hybrid_forward::create(*m->pool, hp, m->w, m->layers, *m->rows, o, &why);
    ASSERT_TRUE(h) << why;
    const run_result got = generate(hp, p, n_gen, n_batch, kv_type::f16, tokens, [&](auto&&... a) { h->eval(a...); },
                                    [&] { return h->routing().counts; });
    expect_same(got, want, static_cast<size_t>(hp.n_vocab), std::string(formats::info(type).name) + " half resident");
    const cache_stats st = h->expert_cache_stats();
    EXPECT_EQ(st.n_slots, total / 2);
    EXPECT_GT(st.hits, 0u);
    EXPECT_LT(st.hits, st.lookups);  // both the GPU and the CPU computed routed experts
}

INSTANTIATE_TEST_SUITE_P(Formats, HybridCodeBookFormats,
                         ::testing::Values(formats::ggml_type::IQ1_S, formats::ggml_type::IQ1_M,
                                           formats::ggml_type::IQ2_XXS, formats::ggml_type::IQ2_XS,
                                           formats::ggml_type::IQ2_S, formats::ggml_type::IQ3_XXS,
                                           formats::ggml_type::IQ3_S, formats::ggml_type::MXFP4),
                         [](const auto& info) { return std::string(formats::info(info.param).name); });

// The VRAM slots are filled and swapped from the CPU pool's copy of the experts (the expert store),
// not from the model file: with the file's expert bytes overwritten after the copy, the hybrid pass
// must still match the CPU pass over the store, fully resident and with adaptive swaps.
TEST(HybridForwardSlots, FilledFromTheExpertStoreNotTheFile) {
    STRATA_REQUIRE_GPU();
    auto m = load(arch::qwen3moe);
    const hparams& hp = m->hp;
    const arenas::expert_store store(*m->pool, {hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used}, m->layers);
    for (const arenas::moe_layer& l : m->layers)
        for (const arenas::expert_tensor* t : {&l.gate, &l.up, &l.down})
            for (const uint8_t* e : t->experts)
                std::memset(const_cast<uint8_t*>(e), 0xff, t->row_stride * static_cast<size_t>(t->n_rows));
    const std::vector<int32_t> p = prompt(hp.n_vocab, 12);
    const int n_gen = 8, n_batch = 32;
    forward_pass cpu(*m->pool, hp, m->w, store);
    std::vector<int32_t> tokens;
    const run_result want = generate(hp, p, n_gen, n_batch, kv_type::f16, tokens, [&](auto&&... a) { cpu.eval(a...); },
                                     [&] { return cpu.routing().counts; });
    for (const adapt_options adapt : {adapt_options{}, adapt_options{.every = 1, .swaps = 3, .async = true}}) {
        hybrid_options o;
        o.n_ctx = kCtx;
        o.n_batch = n_batch;
        o.adapt = adapt;
        if (adapt.every > 0) {  // about half of the experts resident, so the adaptive tier swaps
            const auto& l0 = m->layers[0];
            const uint64_t slot = formats::row_size(l0.gate.type, l0.gate.n_cols) * l0.gate.n_rows +
                                  formats::row_size(l0.up.type, l0.up.n_cols) * l0.up.n_rows +
                                  formats::row_size(l0.down.type, l0.down.n_cols) * l0.down.n_rows + 256;
            o.expert_cache_gib = double(slot * static_cast<uint64_t>(hp.n_layer * hp.n_expert / 2)) / double(1 << 30);
        }
        std::string why;
        auto h = hybrid_forward::create(*m->pool, hp, m->w, m->layers, store, o, &why);
        ASSERT_TRUE(h) << why;
        const run_result got = generate(hp, p, n_gen, n_batch, kv_type::f16, tokens, [&](auto&&... a) { h->eval(a...); },
                                        [&] { return h->routing().counts; });
        expect_same(got, want, static_cast<size_t>(hp.n_vocab), adapt.every ? "adaptive swaps" : "all resident");
        if (adapt.every > 0) {
            EXPECT_GT(h->expert_cache_stats().swaps_started, 0u);
        }
    }
}

// A hybrid pass whose VRAM KV cache starts empty and grows by steps of 16 positions (none of the routed
// experts resident, so VRAM has room to spare).
std::unique_ptr<hybrid_forward> growing_hybrid(loaded& m, kv_type kv) {
    hybrid_options o;
    o.expert_cache_gib = 0.0;
    o.n_ctx = kCtx;
    o.n_batch = 32;
    o.kv = kv;
    o.kv_reserved_ctx = 16;
    o.kv_grow_tokens = 16;
    std::string why;
    auto h = hybrid_forward::create(*m.pool, m.hp, m.w, m.layers, *m.rows, o, &why);
    EXPECT_TRUE(h) << why;
    return h;
}

// The cache is allocated as the session fills, in steps, and moved into a larger buffer when a decode
// step passes its capacity (position 16 here): the results stay the CPU's, and the bytes it reports
// follow the positions held.
TEST(HybridForwardKv, GrowsAsTheSessionFillsAndMovesWhatItHolds) {
    STRATA_REQUIRE_GPU();
    auto m = load(arch::qwen3moe);
    const hparams& hp = m->hp;
    const std::vector<int32_t> p = prompt(hp.n_vocab, 12);
    const int n_gen = 10, n_batch = 32;
    forward_pass cpu(*m->pool, hp, m->w, *m->rows);
    for (const kv_type t : {kv_type::f16, kv_type::int8}) {
        std::vector<int32_t> tokens;
        const run_result want = generate(hp, p, n_gen, n_batch, t, tokens, [&](auto&&... a) { cpu.eval(a...); },
                                         [&] { return cpu.routing().counts; });
        auto h = growing_hybrid(*m, t);
        ASSERT_TRUE(h);
        const uint64_t full = h->kv_bytes_max();
        std::vector<uint64_t> bytes;  // after each evaluation
        const run_result got = generate(
            hp, p, n_gen, n_batch, t, tokens,
            [&](std::span<const int32_t> tok, int pos0, kv_cache& kv, float* logits, bool all, int nb) {
                EXPECT_EQ(h->kv_bytes(kv), bytes.empty() ? 0 : bytes.back());
                h->eval(tok, pos0, kv, logits, all, nb);
                bytes.push_back(h->kv_bytes(kv));
            },
            [&] { return h->routing().counts; });
        expect_same(got, want, static_cast<size_t>(hp.n_vocab), kv_type_name(t));
        // Prompt (12 positions): one step of 16. Decode reaches position 21: two steps, 32 positions.
        ASSERT_EQ(bytes.size(), size_t{1 + n_gen});
        EXPECT_EQ(bytes.front(), full * 16 / kCtx) << kv_type_name(t);
        EXPECT_EQ(bytes.back(), full * 32 / kCtx) << kv_type_name(t);
    }
}

// Every byte of free VRAM taken by somebody else, so the cache cannot grow.
struct vram_hog {
    std::vector<void*> blocks;
    vram_hog() {
        for (size_t chunk = size_t{1} << 30; chunk > 0;) {
            void* b = nullptr;
            if (cudaMalloc(&b, chunk) == cudaSuccess) {
                blocks.push_back(b);
            } else {
                cudaGetLastError();
                chunk /= 2;
            }
        }
    }
    ~vram_hog() {
        for (void* b : blocks) cudaFree(b);
    }
};

// When VRAM has no room to grow the cache, eval throws kv_cache_full naming the positions, and the
// session keeps everything it held: once VRAM is free again it continues where it stopped, with the
// results of a run that never ran out.
TEST(HybridForwardKv, OutOfVramIsKvCacheFullAndTheSessionContinuesLater) {
    STRATA_REQUIRE_GPU();
    auto m = load(arch::qwen3moe);
    const hparams& hp = m->hp;
    const std::vector<int32_t> p = prompt(hp.n_vocab, 16);  // fills the first step exactly
    const auto n_vocab = static_cast<size_t>(hp.n_vocab);
    const int32_t next = 5;
    std::vector<float> want(n_vocab), got(n_vocab), prompt_logits(n_vocab);
    {
        auto h = growing_hybrid(*m, kv_type::f16);
        ASSERT_TRUE(h);
        kv_cache kv(hp.n_layer, kCtx, hp.n_head_kv, hp.head_dim, kv_type::f16);
        h->eval(p, 0, kv, prompt_logits.data(), false, 32);
        h->eval(std::span(&next, 1), 16, kv, want.data(), false, 32);
    }
    auto h = growing_hybrid(*m, kv_type::f16);
    ASSERT_TRUE(h);
    kv_cache kv(hp.n_layer, kCtx, hp.n_head_kv, hp.head_dim, kv_type::f16);
    h->eval(p, 0, kv, got.data(), false, 32);
    EXPECT_EQ(got, prompt_logits);
    const uint64_t held = h->kv_bytes(kv);
    {
        const vram_hog hog;
        try {
            h->eval(std::span(&next, 1), 16, kv, got.data(), false, 32);
            ADD_FAILURE() << "the cache grew into VRAM that was all taken";
        } catch (const kv_cache_full& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("17 positions"), std::string::npos) << what;
            EXPECT_NE(what.find("holds 16 positions"), std::string::npos) << what;
            EXPECT_NE(what.find("--ctx"), std::string::npos) << what;
        }
        EXPECT_EQ(h->kv_bytes(kv), held);
    }
    h->eval(std::span(&next, 1), 16, kv, got.data(), false, 32);
    EXPECT_EQ(got, want);
    EXPECT_GT(h->kv_bytes(kv), held);
}

// Experts of a type without a CUDA kernel (Q3_K): no hybrid pass, and the reason names the tensor's type
// and the types the CUDA kernels take.
TEST(HybridForwardDevice, ExpertTypeWithoutCudaKernelSaysWhy) {
    STRATA_REQUIRE_GPU();
    auto m = load(arch::qwen3moe, {[](make_model::model_spec& s) { s.type_experts = formats::ggml_type::Q3_K; }});
    hybrid_options o;
    o.n_ctx = kCtx;
    std::string why;
    EXPECT_FALSE(hybrid_forward::create(*m->pool, m->hp, m->w, m->layers, *m->rows, o, &why));
    EXPECT_NE(why.find("is Q3_K, which has no CUDA kernel"), std::string::npos) << why;
    EXPECT_NE(why.find("IQ2_XXS"), std::string::npos) << why;
    EXPECT_NE(why.find("MXFP4"), std::string::npos) << why;
}

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
