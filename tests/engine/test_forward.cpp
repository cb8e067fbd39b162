// The engine's CPU forward pass against the naive reference, per architecture and weight format, and
// bitwise identical across pool configurations, batch sizes and KV layouts where the algorithm says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "expert_pool.hpp"
#include "expert_store.hpp"
#include "generate.hpp"
#include "gguf/gguf_writer.hpp"
#include "model/forward.hpp"
#include "model/hparams.hpp"
#include "model/weights.hpp"
#include "loaded_model.hpp"
#include "reference_forward.hpp"
#include "topology.hpp"

namespace strata::engine {
namespace {

using make_model::arch;
using formats::ggml_type;

using test::loaded;
using test::make_pool;

// n_rot: rope.dimension_count written over the generator's (0: none written, the head width).
std::unique_ptr<loaded> load(const make_model::model_spec& spec, int n_rot = 0) {
    gguf::writer w = make_model::build_model(spec);
    if (n_rot > 0) w.set(make_model::gguf_architecture(spec.architecture) + ".rope.dimension_count", gguf::value::u32(n_rot));
    return test::load(w);
}

// The cache the model's attention keeps: kv heads, or one latent row per position (deepseek2).
kv_cache make_cache(const hparams& hp, int n_ctx, kv_type kv) {
    return make_sequence_state(hp, n_ctx, kv);
}

// Logits of every position: the first n_head tokens in batches of 512, the rest in batches of n_batch.
// rows: where the experts are read (null: the mapped file).
std::vector<float> run(loaded& m, arenas::expert_pool& pool, const std::vector<int32_t>& tokens, kv_type kv,
                       int n_batch, size_t n_head = 0, const arenas::expert_rows* rows = nullptr) {
    forward_pass fwd(pool, m.hp, m.w, rows ? *rows : *m.rows);
    kv_cache cache = make_cache(m.hp, std::max<int>(64, static_cast<int>(tokens.size())), kv);
    std::vector<float> logits(tokens.size() * static_cast<size_t>(m.hp.n_vocab), NAN);
    const std::span<const int32_t> all(tokens);
    if (n_head > 0) fwd.eval(all.first(n_head), 0, cache, logits.data(), true, 512);
    fwd.eval(all.subspan(n_head), static_cast<int>(n_head), cache, logits.data() + n_head * m.hp.n_vocab, true,
             n_batch);
    return logits;
}

std::vector<int32_t> some_tokens(int n_vocab, int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 7919 + 13) % (n_vocab - 3));
    return t;
}

// max |a - b| / max |b| over one position's logits.
double rel_err(const float* a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        num = std::max(num, std::abs(double(a[i]) - b[i]));
        den = std::max(den, std::abs(double(b[i])));
    }
    return num / den;
}

// Router-logit gap below which the engine (8-bit activations) and the f32 reference may pick
// different experts: the hidden state differs by ~1-2 %, router logits are a few units large.
constexpr float kTieMargin = 0.15f;

// Model shapes: the tiny preset, and two with what real models have and the tiny one lacks.
enum class shape {
    tiny,
    many_experts,  // 128 experts with 8 used, GQA ratio 8, n_rot < head_dim; narrow experts (n_ff 64)
    wide_ff,       // experts 1,536 wide, GQA ratio 8, n_rot < head_dim
    lite,          // deepseek2 as DeepSeek-V2(-Lite): a plain attn_q, one attn_kv_b, softmax gating, no bias
};

// deepseek2's Lite form: no query bottleneck, the older merged attn_kv_b, V2's softmax routing.
make_model::model_spec deepseek2_lite(make_model::model_spec s) {
    s.n_lora_q = 0;
    s.kv_b_split = false;
    s.expert_gating_func = 1;
    s.exp_probs_b = false;
    s.expert_weights_norm = false;
    s.expert_weights_scale = 1.0f;
    return s;
}

struct parity_case {
    arch a;
    ggml_type experts;
    ggml_type attn;
    double tolerance;  // relative to the largest reference logit
    shape sh = shape::tiny;
    kv_type kv = kv_type::f16;
};

struct shaped_spec {
    make_model::model_spec spec;
    int n_rot = 0;  // 0: the head width
};

shaped_spec spec_for(const parity_case& c) {
    shaped_spec s{make_model::preset("tiny", c.a)};
    if (c.sh == shape::lite) s.spec = deepseek2_lite(s.spec);
    if (c.sh == shape::many_experts || c.sh == shape::wide_ff) {
        s.spec.n_head = 8;
        s.spec.n_head_kv = 1;
        s.spec.head_dim = 32;  // n_head * head_dim = n_embd, as qwen2moe and llama require
        s.n_rot = 16;
    }
    if (c.sh == shape::many_experts) {
        s.spec.n_expert = 128;
        s.spec.n_expert_used = 8;
        s.spec.n_ff_exp = s.spec.n_ff_shexp = 64;
    } else if (c.sh == shape::wide_ff) {
        s.spec.n_ff_exp = s.spec.n_ff_shexp = 1536;
    }
    s.spec.type_experts = c.experts;
    s.spec.type_shexp = c.experts;
    s.spec.type_attn = c.attn;
    return s;
}

class ForwardParity : public ::testing::TestWithParam<parity_case> {};

TEST_P(ForwardParity, MatchesNaiveReference) {
    const parity_case& c = GetParam();
    const shaped_spec s = spec_for(c);
    auto m = load(s.spec, s.n_rot);
    const bool glm = c.a == arch::glm4moe;  // half the head turns unless overridden
    const bool ds = c.a == arch::deepseek2;
    ASSERT_EQ(m->hp.n_rot, s.n_rot > 0 ? s.n_rot : ds ? s.spec.n_rot : glm ? s.spec.head_dim / 2 : s.spec.head_dim);
    ASSERT_EQ(m->hp.n_expert_used, s.spec.n_expert_used);
    // With 128 experts the gap between the 8th and 9th is often below kTieMargin: more positions keep
    // enough layer choices compared.
    const bool many = c.sh == shape::many_experts;
    const float tie_margin = kTieMargin;
    const auto tokens = some_tokens(m->hp.n_vocab, many ? 24 : 12);
    auto pool = make_pool("off", 2);
    const std::vector<float> got = run(*m, *pool, tokens, c.kv, 512);

    // Decode token by token: the same bits as the batch, and the experts chosen per layer.
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    kv_cache cache = make_cache(m->hp, 64, c.kv);
    std::vector<float> last(static_cast<size_t>(m->hp.n_vocab));
    std::vector<uint64_t> before = fwd.routing().counts;
    testing::reference_model::routes engine_routes{{}, tie_margin};
    for (size_t p = 0; p < tokens.size(); ++p) {
        fwd.eval(std::span(tokens).subspan(p, 1), static_cast<int>(p), cache, last.data());
        auto& layers = engine_routes.ids.emplace_back(static_cast<size_t>(m->hp.n_layer));
        for (int il = 0; il < m->hp.n_layer; ++il)
            for (int e = 0; e < m->hp.n_expert; ++e) {
                const size_t i = static_cast<size_t>(il) * m->hp.n_expert + e;
                if (fwd.routing().counts[i] != before[i]) layers[static_cast<size_t>(il)].push_back(e);
            }
        before = fwd.routing().counts;
        EXPECT_EQ(std::memcmp(last.data(), got.data() + p * last.size(), last.size() * sizeof(float)), 0)
            << "decode one token at a time differs from the batch at position " << p;
    }
    // The reference settles near-ties (router gaps within tie_margin, where the engine's 8-bit
    // activations may legitimately pick the other expert) as the engine did; elsewhere its own choice
    // must be the engine's.
    testing::reference_model ref(m->file);
    const auto want = ref.logits(tokens, &engine_routes);
    int argmax_differ = 0, compared = 0, near_ties = 0, biased = 0, grouped = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
        for (int il = 0; il < m->hp.n_layer; ++il) {
            if (!m->hp.is_moe_layer(il)) continue;
            const size_t l = static_cast<size_t>(il);
            if (ref.route_layer_margins()[p][l] <= tie_margin) {
                ++near_ties;
                continue;
            }
            std::vector<int> own = ref.route_ids()[p][l];
            std::sort(own.begin(), own.end());
            EXPECT_EQ(engine_routes.ids[p][l], own) << "position " << p << " layer " << il;
            ++compared;
            biased += ref.route_bias_changed()[p][l];
            grouped += ref.route_group_changed()[p][l];
        }
        const float* g = got.data() + p * static_cast<size_t>(m->hp.n_vocab);
        const double err = rel_err(g, want[p]);
        EXPECT_LT(err, c.tolerance) << "position " << p;
        const auto gi = std::max_element(g, g + m->hp.n_vocab) - g;
        const auto wi = std::max_element(want[p].begin(), want[p].end()) - want[p].begin();
        std::vector<float> top(want[p]);
        std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
        const double top_gap = (top[0] - top[1]) / std::max(std::abs(top[0]), 1e-9f);
        // Where the reference's two best logits are closer than twice the error, either may win;
        // elsewhere the engine's argmax must be the reference's.
        if (gi != wi) {
            ++argmax_differ;
            EXPECT_LT(top_gap, 2 * err) << "position " << p << ": argmax " << gi << " vs " << wi;
        }
        std::printf("  position %zu: relative error %.4f, argmax %td vs %td (reference top-2 gap %.4f), routing margin "
                    "%.3f\n",
                    p, err, gi, wi, top_gap, ref.route_margins()[p]);
    }
    std::printf("  %d layer choices compared, %d near-ties (the reference took the engine's side in %d)\n", compared,
                near_ties, ref.followed());
    EXPECT_GE(compared, near_ties) << "too few layer choices test the routing itself";
    // Near-flat logits of these small random models excuse a few differing argmaxes, not many.
    std::printf("  %d positions where the argmax differs (each at a near-tie)\n", argmax_differ);
    EXPECT_LE(argmax_differ, 3);
    if (glm || (ds && s.spec.exp_probs_b)) {
        // The routing compared above must include choices that the correction bias changed.
        std::printf("  %d of them changed by exp_probs_b\n", biased);
        EXPECT_GT(biased, 0);
    }
    if (ds) {
        // ... and choices that group-limited routing changed.
        std::printf("  %d of them changed by the group limit\n", grouped);
        EXPECT_GT(grouped, 0);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Archs, ForwardParity,
    ::testing::Values(parity_case{arch::qwen3moe, ggml_type::Q4_K, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen3moe, ggml_type::Q8_0, ggml_type::F16, 0.03},
                      parity_case{arch::qwen3moe, ggml_type::IQ4_XS, ggml_type::Q6_K, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::Q6_K, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen3moe, ggml_type::Q6_K, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::Q8_0, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::Q5_K, ggml_type::Q4_0, 0.03},
                      parity_case{arch::mixtral, ggml_type::Q4_K, ggml_type::Q8_0, 0.03},
                      parity_case{arch::mixtral, ggml_type::Q4_0, ggml_type::BF16, 0.03},
                      parity_case{arch::qwen3moe, ggml_type::Q8_0, ggml_type::Q8_0, 0.03, shape::many_experts},
                      parity_case{arch::qwen2moe, ggml_type::Q4_0, ggml_type::Q8_0, 0.03, shape::many_experts},
                      parity_case{arch::mixtral, ggml_type::IQ4_NL, ggml_type::F16, 0.03, shape::many_experts},
                      parity_case{arch::qwen3moe, ggml_type::Q4_K, ggml_type::Q6_K, 0.03, shape::wide_ff},
                      parity_case{arch::qwen2moe, ggml_type::Q6_K, ggml_type::Q8_0, 0.03, shape::wide_ff},
                      parity_case{arch::mixtral, ggml_type::Q5_K, ggml_type::Q8_0, 0.03, shape::wide_ff},
                      // glm4moe: three layers, routed weights scaled by 2.5 and an unscaled shared
                      // expert carry more of the weights' rounding to the logits.
                      parity_case{arch::glm4moe, ggml_type::Q4_K, ggml_type::Q8_0, 0.045},
                      parity_case{arch::glm4moe, ggml_type::Q8_0, ggml_type::F16, 0.03},
                      parity_case{arch::glm4moe, ggml_type::Q6_K, ggml_type::Q8_0, 0.05, shape::tiny, kv_type::int8},
                      parity_case{arch::glm4moe, ggml_type::Q8_0, ggml_type::Q8_0, 0.03, shape::many_experts},
                      parity_case{arch::glm4moe, ggml_type::Q5_K, ggml_type::Q8_0, 0.045, shape::wide_ff},
                      // deepseek2: latent attention (q_lora_rank, attn_k_b + attn_v_b), grouped sigmoid
                      // routing with a bias, scaled by 2.5; and the Lite form.
                      parity_case{arch::deepseek2, ggml_type::Q8_0, ggml_type::Q8_0, 0.045},
                      parity_case{arch::deepseek2, ggml_type::Q4_K, ggml_type::F16, 0.045},
                      parity_case{arch::deepseek2, ggml_type::Q6_K, ggml_type::Q8_0, 0.05, shape::tiny, kv_type::int8},
                      parity_case{arch::deepseek2, ggml_type::Q8_0, ggml_type::Q8_0, 0.045, shape::lite},
                      parity_case{arch::deepseek2, ggml_type::Q5_K, ggml_type::Q8_0, 0.05, shape::lite, kv_type::int8},
                      // The code book formats (routed and shared experts): the same file's weights in the
                      // reference, so only the activations' 8-bit rounding separates the two.
                      parity_case{arch::qwen2moe, ggml_type::IQ2_XXS, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::IQ2_XS, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::IQ2_S, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::IQ3_XXS, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::IQ3_S, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::IQ1_S, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::IQ1_M, ggml_type::Q8_0, 0.03},
                      parity_case{arch::qwen2moe, ggml_type::MXFP4, ggml_type::Q8_0, 0.03}),
    [](const auto& info) {
        const parity_case& c = info.param;
        const char* sh = c.sh == shape::tiny           ? "tiny"
                         : c.sh == shape::many_experts ? "many_experts"
                         : c.sh == shape::lite         ? "lite"
                                                       : "wide_ff";
        return make_model::arch_name(c.a) + "_" + std::string(formats::info(c.experts).name) + "_" +
               std::string(formats::info(c.attn).name) + "_" + sh + (c.kv == kv_type::int8 ? "_int8kv" : "");
    });

// With every weight F32 the engine keeps its activations in f32 too: what remains against the
// reference is summation order, so any departure from the architecture's definition shows.
TEST(Forward, AllF32MatchesNaiveReferenceClosely) {
    std::vector<make_model::model_spec> specs;
    for (arch a : {arch::qwen3moe, arch::qwen2moe, arch::mixtral, arch::glm4moe, arch::deepseek2})
        specs.push_back(make_model::preset("tiny", a));
    specs.push_back(deepseek2_lite(specs.back()));
    for (make_model::model_spec spec : specs) {
        const arch a = spec.architecture;
        for (ggml_type* t : {&spec.type_experts, &spec.type_shexp, &spec.type_attn, &spec.type_embd, &spec.type_out})
            *t = ggml_type::F32;
        auto m = load(spec);
        const auto tokens = some_tokens(m->hp.n_vocab, 12);
        auto pool = make_pool("off", 2);
        const std::vector<float> got = run(*m, *pool, tokens, kv_type::f16, 512);
        testing::reference_model ref(m->file);
        const auto want = ref.logits(tokens);
        double worst = 0;
        for (size_t p = 0; p < tokens.size(); ++p)
            worst = std::max(worst, rel_err(got.data() + p * static_cast<size_t>(m->hp.n_vocab), want[p]));
        std::printf("  %s all-F32: worst relative logit error %.2e\n", make_model::arch_name(a).c_str(), worst);
        EXPECT_LT(worst, 2e-3) << make_model::arch_name(a);
    }
}

// A glm4moe or deepseek2 file with a next-token-prediction layer runs the layers before it and nothing else: the
// same logits, bit for bit, as the file without it (tensors are drawn by name, so the rest is equal).
TEST(Forward, NextTokenPredictionLayersAreNotEvaluated) {
    for (arch a : {arch::glm4moe, arch::deepseek2}) {
        make_model::model_spec spec = make_model::preset("tiny", a);
        auto plain = load(spec);
        spec.n_layer_nextn = 1;
        auto with_nextn = load(spec);
        ASSERT_EQ(with_nextn->hp.n_layer, plain->hp.n_layer);
        ASSERT_EQ(with_nextn->w.nextn.size(), 1u) << with_nextn->w.nextn_error;
        const auto tokens = some_tokens(plain->hp.n_vocab, 10);
        auto pool = make_pool("off", 2);
        const std::vector<float> x = run(*plain, *pool, tokens, kv_type::f16, 512);
        const std::vector<float> y = run(*with_nextn, *pool, tokens, kv_type::f16, 512);
        EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << make_model::arch_name(a);
    }
}

// The MTP block of glm4moe and deepseek2 files against the naive reference (llama.cpp's MTP graph): each
// position fed its token and the trunk's residual before it (the engine norms it with the output norm), the
// block's own one-layer cache (deepseek2: latent) filled by a batch and then a position at a time, and one
// chained draft fed the block's own output residual (normed with the head norm).
TEST(Forward, MtpDraftLogitsMatchNaiveReference) {
    for (arch a : {arch::glm4moe, arch::deepseek2}) {
        make_model::model_spec spec = make_model::preset("tiny", a);
        spec.n_layer_nextn = 1;
        for (ggml_type* t : {&spec.type_experts, &spec.type_shexp, &spec.type_attn, &spec.type_embd, &spec.type_out})
            *t = ggml_type::F32;
        auto m = load(spec);
        auto pool = make_pool("off", 2);
        forward_pass fwd(*pool, m->hp, m->w, *m->rows);
        ASSERT_TRUE(fwd.has_mtp()) << make_model::arch_name(a);
        const int n = 16;
        const size_t n_embd = static_cast<size_t>(m->hp.n_embd), n_vocab = static_cast<size_t>(m->hp.n_vocab);
        const auto tokens = some_tokens(m->hp.n_vocab, n);
        kv_cache state = make_cache(m->hp, 64, kv_type::f16);
        std::vector<float> logits(n_vocab), hidden(static_cast<size_t>(n) * n_embd);
        fwd.eval(tokens, 0, state, logits.data(), false, 512, hidden.data());
        std::vector<float> h(static_cast<size_t>(n) * n_embd, 0.0f);  // row p: the residual at p - 1
        std::copy(hidden.begin(), hidden.end() - static_cast<std::ptrdiff_t>(n_embd), h.begin() + static_cast<std::ptrdiff_t>(n_embd));
        kv_cache mkv(1, 64, m->hp.kv_heads(), m->hp.kv_head_dim(), kv_type::f16, m->hp.mla());
        std::vector<float> got(static_cast<size_t>(n + 1) * n_vocab, NAN), h_out(n_embd), h_last(n_embd);
        const int first = n - 4;
        fwd.mtp(tokens.data(), h.data(), first, 0, mkv, nullptr, got.data(), true);
        for (int p = first; p < n; ++p)
            fwd.mtp(tokens.data() + p, h.data() + static_cast<size_t>(p) * n_embd, 1, p, mkv, h_last.data(),
                    got.data() + static_cast<size_t>(p) * n_vocab);
        const int32_t draft = tokens[3];
        fwd.mtp(&draft, h_last.data(), 1, n, mkv, h_out.data(), got.data() + static_cast<size_t>(n) * n_vocab, false, true);
        testing::reference_model ref(m->file);
        auto want = ref.mtp_logits(tokens);
        want.push_back(ref.mtp_chain(draft, static_cast<size_t>(n)));
        double worst = 0;
        for (int p = 0; p <= n; ++p) worst = std::max(worst, rel_err(got.data() + static_cast<size_t>(p) * n_vocab, want[size_t(p)]));
        std::printf("  %s MTP all-F32: worst relative draft logit error %.2e\n", make_model::arch_name(a).c_str(), worst);
        EXPECT_LT(worst, 2e-3) << make_model::arch_name(a);
        // The chained draft differs from one fed the same residual as a trunk row: the norms differ.
        std::vector<float> unchained(n_vocab);
        kv_cache mkv2(1, 64, m->hp.kv_heads(), m->hp.kv_head_dim(), kv_type::f16, m->hp.mla());
        fwd.mtp(tokens.data(), h.data(), n, 0, mkv2, nullptr, nullptr);
        fwd.mtp(&draft, h_last.data(), 1, n, mkv2, nullptr, unchained.data());
        EXPECT_GT(rel_err(unchained.data(), want.back()), 1e-3) << make_model::arch_name(a);
    }
}

TEST(Forward, BitwiseAcrossPoolModesWorkersAndBatches) {
    // glm4moe adds a leading dense layer, sigmoid routing with a correction bias and an ungated shared expert.
    // deepseek2 adds latent attention over a latent cache and group-limited routing, in both forms.
    const auto ds = make_model::preset("tiny", arch::deepseek2);
    for (const auto& [spec, kv] :
         {std::pair{make_model::preset("tiny", arch::qwen2moe), kv_type::f16},
          std::pair{make_model::preset("tiny", arch::glm4moe), kv_type::f16},
          std::pair{make_model::preset("tiny", arch::glm4moe), kv_type::int8}, std::pair{ds, kv_type::f16},
          std::pair{ds, kv_type::int8}, std::pair{deepseek2_lite(ds), kv_type::f16}}) {
        const arch a = spec.architecture;
        auto m = load(spec);
        // 40 tokens: a batch of 512 takes the pool for the per-row work (norms, RoPE, cache writes), 1 and
        // 7 keep it on the host.
        const auto tokens = some_tokens(m->hp.n_vocab, 40);
        auto base_pool = make_pool("off", 1);
        const std::vector<float> base = run(*m, *base_pool, tokens, kv, 512);
        int compared = 0;
        // A Latin square over mode x workers x batch: every pair of two settings' values occurs once.
        const std::string modes[] = {"off", "test:2", "test:3"};
        const int batches[] = {1, 7, 512};
        for (int i = 0; i < 3; ++i)
            for (int workers : {1, 2, 3}) {
                const std::string& mode = modes[i];
                const int n_batch = batches[(i + workers) % 3];
                auto pool = make_pool(mode, workers);
                const std::vector<float> got = run(*m, *pool, tokens, kv, n_batch);
                ASSERT_EQ(std::memcmp(got.data(), base.data(), base.size() * sizeof(float)), 0)
                    << make_model::arch_name(a) << " " << kv_type_name(kv) << " " << mode << " workers " << workers
                    << " batch " << n_batch;
                ++compared;
            }
        std::printf("  %s, %s KV: %d configurations bitwise identical\n", make_model::arch_name(a).c_str(),
                    kv_type_name(kv), compared);
    }
}

// Each code book format as the experts' type: logits bitwise the same across pool modes, workers and
// batch sizes, and greedy decoding token by token picks the batch's argmax at every step.
class ForwardCodeBookFormats : public ::testing::TestWithParam<ggml_type> {};

TEST_P(ForwardCodeBookFormats, BitwiseAcrossPoolModesAndGreedyStable) {
    make_model::model_spec spec = make_model::preset("tiny", arch::qwen2moe);
    spec.type_experts = spec.type_shexp = GetParam();
    auto m = load(spec);
    const auto tokens = some_tokens(m->hp.n_vocab, 16);
    auto base_pool = make_pool("off", 1);
    const std::vector<float> base = run(*m, *base_pool, tokens, kv_type::f16, 512);
    ASSERT_TRUE(std::all_of(base.begin(), base.end(), [](float x) { return std::isfinite(x); }));
    for (const std::string mode : {"off", "test:2", "test:3"})
        for (int workers : {1, 3})
            for (int n_batch : {1, 7, 512}) {
                auto pool = make_pool(mode, workers);
                const std::vector<float> got = run(*m, *pool, tokens, kv_type::f16, n_batch);
                ASSERT_EQ(std::memcmp(got.data(), base.data(), base.size() * sizeof(float)), 0)
                    << mode << " workers " << workers << " batch " << n_batch;
            }
    // Greedy: feed each step's argmax; every pool mode produces the same token sequence.
    std::vector<std::vector<int32_t>> greedy;
    for (const std::string mode : {"off", "test:3"}) {
        auto pool = make_pool(mode, 2);
        forward_pass fwd(*pool, m->hp, m->w, *m->rows);
        kv_cache cache = make_cache(m->hp, 64, kv_type::f16);
        std::vector<float> logits(static_cast<size_t>(m->hp.n_vocab));
        std::vector<int32_t> seq{tokens[0]};
        for (int p = 0; p < 24; ++p) {
            fwd.eval(std::span(seq).subspan(static_cast<size_t>(p), 1), p, cache, logits.data());
            seq.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
        }
        greedy.push_back(seq);
    }
    EXPECT_EQ(greedy[0], greedy[1]);
}

INSTANTIATE_TEST_SUITE_P(Types, ForwardCodeBookFormats,
                         ::testing::Values(ggml_type::IQ2_XXS, ggml_type::IQ2_XS, ggml_type::IQ2_S, ggml_type::IQ3_XXS,
                                           ggml_type::IQ3_S, ggml_type::IQ1_S, ggml_type::IQ1_M, ggml_type::MXFP4),
                         [](const auto& info) { return std::string(formats::info(info.param).name); });

// Weights repacked for the prompt GEMM kernels (dense matrices by repack_dense, experts by the expert
// store), where the ISA has them: bitwise identical across pool modes, workers and batch sizes (single
// tokens included), and close to the GGUF layout (only the order of float sums inside a dot differs).
// "Close" is the parity tests' 3 %: a rounding-level change that moves one key across an f16 rounding
// step in the KV cache (or a routing near-tie) reaches ~1 % of the logits at later positions; the GGUF
// layout's own AVX2, AVX-512 and scalar paths differ from each other that much on some of these files.
// Experts and dense matrices of one type each, over the formats with a GEMM kernel.
struct repack_types {
    ggml_type experts, dense;
};

class ForwardRepack : public ::testing::TestWithParam<repack_types> {};

TEST_P(ForwardRepack, RepackedWeightsAreBitwiseAcrossPoolsAndBatchesAndNearTheGgufLayout) {
    make_model::model_spec spec = make_model::preset("tiny");
    spec.architecture = arch::qwen2moe;  // with a shared expert
    spec.type_experts = GetParam().experts;
    spec.type_attn = spec.type_shexp = GetParam().dense;
    auto m = load(spec);
    const auto tokens = some_tokens(m->hp.n_vocab, 20);
    auto gguf_pool = make_pool("off", 1);
    const std::vector<float> gguf_layout = run(*m, *gguf_pool, tokens, kv_type::f16, 512);
    const repack_summary packed = repack_dense(m->w);
    EXPECT_EQ(kernels::cpu::can_repack(GetParam().dense, m->hp.n_embd), !packed.names.empty());
    const arenas::moe_shape shape{m->hp.n_embd, m->hp.n_ff_exp, m->hp.n_expert, m->hp.n_expert_used};
    std::vector<float> first;
    for (const std::string mode : {"off", "test:2", "test:3"})
        for (int workers : {1, 3}) {
            auto pool = make_pool(mode, workers);
            arenas::store_options options;
            options.repack = true;
            const arenas::expert_store store(*pool, shape, m->layers, std::move(options));
            for (int n_batch : {1, 7, 512}) {
                const std::vector<float> got = run(*m, *pool, tokens, kv_type::f16, n_batch, 0, &store);
                if (first.empty()) first = got;
                ASSERT_EQ(std::memcmp(got.data(), first.data(), first.size() * sizeof(float)), 0)
                    << mode << " workers " << workers << " batch " << n_batch;
            }
        }
    const size_t n_vocab = static_cast<size_t>(m->hp.n_vocab);
    for (size_t t = 0; t < tokens.size(); ++t) {
        const std::vector<float> want(gguf_layout.begin() + t * n_vocab, gguf_layout.begin() + (t + 1) * n_vocab);
        EXPECT_LT(rel_err(first.data() + t * n_vocab, want), 0.03) << "position " << t;
    }
}

INSTANTIATE_TEST_SUITE_P(Types, ForwardRepack,
                         ::testing::Values(repack_types{ggml_type::Q4_K, ggml_type::Q8_0},
                                           repack_types{ggml_type::Q4_0, ggml_type::Q4_0},
                                           repack_types{ggml_type::IQ4_NL, ggml_type::Q5_0},
                                           repack_types{ggml_type::Q5_1, ggml_type::Q4_1},
                                           repack_types{ggml_type::Q5_K, ggml_type::IQ4_NL},
                                           repack_types{ggml_type::Q2_K, ggml_type::Q3_K},
                                           repack_types{ggml_type::MXFP4, ggml_type::MXFP4}),
                         [](const auto& info) {
                             return std::string(formats::info(info.param.experts).name) + "_" +
                                    std::string(formats::info(info.param.dense).name);
                         });

// Past several KV chunks (256 positions each): prompt batches fold the chunks per query tile, single
// tokens split them over work items and merge afterwards; both must give the same bits. deepseek2's
// latent attention lays each chunk's keys out per work item and splits a decode batch's rows into
// groups while there are fewer chunks than threads (the 7-token batches from position 0).
TEST(Forward, BitwiseAtLongContextAcrossBatchesAndPools) {
    for (const auto& spec : {make_model::preset("tiny"), make_model::preset("tiny", arch::deepseek2)}) {
        auto m = load(spec);
        const auto tokens = some_tokens(m->hp.n_vocab, 2100);
        for (kv_type kv : {kv_type::f16, kv_type::int8}) {
            auto base_pool = make_pool("off", 1);
            const std::vector<float> base = run(*m, *base_pool, tokens, kv, 512);
            struct config {
                const char* mode;
                int workers, n_batch;
                size_t n_head;  // tokens evaluated in batches of 512 first
            };
            // Single tokens from position 1900 on cross the chunk boundary at 2048.
            std::vector<config> configs{{"test:2", 2, 1, 1900}, {"test:3", 3, 7, 1500}, {"off", 2, 300, 0}};
            if (m->hp.mla()) configs.push_back({"test:3", 3, 7, 0});
            for (const config& c : configs) {
                auto pool = make_pool(c.mode, c.workers);
                const std::vector<float> got = run(*m, *pool, tokens, kv, c.n_batch, c.n_head);
                ASSERT_EQ(std::memcmp(got.data(), base.data(), base.size() * sizeof(float)), 0)
                    << make_model::arch_name(spec.architecture) << " " << kv_type_name(kv) << " " << c.mode
                    << " workers " << c.workers << " batch " << c.n_batch << " after " << c.n_head;
            }
            const float* last = base.data() + (tokens.size() - 1) * static_cast<size_t>(m->hp.n_vocab);
            EXPECT_TRUE(std::all_of(last, last + m->hp.n_vocab, [](float x) { return std::isfinite(x); }));
        }
    }
}

// deepseek2's decode computes 32 chunks' states at a time (8192 positions) and folds them before the
// next window: single tokens across that boundary give the prompt's bits.
TEST(Forward, Deepseek2DecodeAcrossChunkWindowsIsBitwiseThePrompt) {
    auto m = load(make_model::preset("tiny", arch::deepseek2));
    const auto tokens = some_tokens(m->hp.n_vocab, 8200);
    auto base_pool = make_pool("off", 1);
    const std::vector<float> base = run(*m, *base_pool, tokens, kv_type::f16, 512);
    auto pool = make_pool("test:2", 2);
    const std::vector<float> got = run(*m, *pool, tokens, kv_type::f16, 1, 8188);
    const size_t from = 8188 * static_cast<size_t>(m->hp.n_vocab);
    EXPECT_EQ(std::memcmp(got.data() + from, base.data() + from, (base.size() - from) * sizeof(float)), 0);
}

TEST(Forward, PositionsPastTheContextAreRefusedBeforeAnyWrite) {
    auto m = load(make_model::preset("tiny"));
    auto pool = make_pool("off", 1);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    kv_cache cache(m->hp.n_layer, 40, m->hp.n_head_kv, m->hp.head_dim, kv_type::f16);
    const auto tokens = some_tokens(m->hp.n_vocab, 41);
    std::vector<float> logits(static_cast<size_t>(m->hp.n_vocab));
    try {
        fwd.eval(tokens, 0, cache, logits.data());
        FAIL() << "41 tokens were accepted by a context of 40";
    } catch (const kv_cache_full& e) {
        EXPECT_NE(std::string(e.what()).find("positions 0..40 do not fit the context of 40"), std::string::npos)
            << e.what();
    }
    EXPECT_EQ(cache.bytes(), 0u) << "nothing may be allocated or written for a refused batch";
    fwd.eval(std::span(tokens).first(40), 0, cache, logits.data());
    EXPECT_THROW(fwd.eval(std::span(tokens).subspan(40, 1), 40, cache, logits.data()), kv_cache_full);
}

TEST(Forward, Int8KvIsCloseToF16) {
    auto m = load(make_model::preset("tiny"));
    const auto tokens = some_tokens(m->hp.n_vocab, 24);
    auto pool = make_pool("off", 2);
    const std::vector<float> f16 = run(*m, *pool, tokens, kv_type::f16, 512);
    const std::vector<float> i8 = run(*m, *pool, tokens, kv_type::int8, 512);
    const size_t nv = static_cast<size_t>(m->hp.n_vocab);
    std::vector<double> errs;
    for (size_t p = 0; p < tokens.size(); ++p) {
        std::vector<float> want(f16.begin() + std::ptrdiff_t(p * nv), f16.begin() + std::ptrdiff_t((p + 1) * nv));
        errs.push_back(rel_err(i8.data() + p * nv, want));
    }
    std::sort(errs.begin(), errs.end());
    const double median = errs[errs.size() / 2], worst = errs.back();
    std::printf("  int8 KV vs f16 KV: relative logit error median %.4f, worst %.4f\n", median, worst);
    // Q8_0 keys and values, and the query quantized to Q8_0 for the int8 dot products (0.5 % per element
    // each), move these small random models' logits by ~2 %; a rare routing flip costs more.
    EXPECT_LT(median, 0.03);
    EXPECT_LT(worst, 0.06);
    EXPECT_GT(worst, 0.0) << "int8 should not be bitwise f16";
}

// YaRN (original context 16, factor 4, context 64) and linear scaling against the reference's own
// reading of the keys, at positions past the original context, where scaling moves the logits.
TEST(Forward, RopeScalingMatchesNaiveReference) {
    using make_model::rope_scaling_type;
    auto pool = make_pool("off", 2);
    make_model::model_spec spec = make_model::preset("tiny");
    spec.n_ctx = 64;
    auto plain = load(spec);
    const auto tokens = some_tokens(plain->hp.n_vocab, 36);
    const std::vector<float> unscaled = run(*plain, *pool, tokens, kv_type::f16, 512);
    const size_t nv = static_cast<size_t>(plain->hp.n_vocab);
    for (const rope_scaling_type type : {rope_scaling_type::yarn, rope_scaling_type::linear}) {
        spec.rope_scaling = type;
        spec.rope_factor = 4.0f;
        auto m = load(spec);
        ASSERT_EQ(m->hp.rope.freq_scale, 0.25f);
        const std::vector<float> got = run(*m, *pool, tokens, kv_type::f16, 7);
        testing::reference_model ref(m->file);
        const auto want = ref.logits(tokens);
        int checked = 0;
        double moved = 0;  // how far unscaled RoPE is from the reference: the test must see the scaling
        for (size_t p = 16; p < tokens.size(); ++p) {
            if (ref.route_margins()[p] <= kTieMargin) continue;
            const double err = rel_err(got.data() + p * nv, want[p]);
            EXPECT_LT(err, 0.03) << (type == rope_scaling_type::yarn ? "yarn" : "linear") << " position " << p;
            moved = std::max(moved, rel_err(unscaled.data() + p * nv, want[p]));
            ++checked;
        }
        std::printf("  %s: %d positions past the original context compared; unscaled RoPE is off by up to %.3f\n",
                    type == rope_scaling_type::yarn ? "yarn" : "linear", checked, moved);
        EXPECT_GE(checked, 10);
        EXPECT_GT(moved, 0.03);
    }
}

// deepseek2 under YaRN with DeepSeek's yarn_log_multiplier: the attention scale mscale^2 / sqrt(head)
// and the rotation's own factor cancelled, against the reference's reading of the keys, all-F32 so
// that a wrong factor shows (the scale moves every score by ~27 % at factor 4).
TEST(Forward, Deepseek2YarnScaleMatchesNaiveReference) {
    using make_model::rope_scaling_type;
    auto pool = make_pool("off", 2);
    make_model::model_spec spec = make_model::preset("tiny", arch::deepseek2);
    for (ggml_type* t : {&spec.type_experts, &spec.type_shexp, &spec.type_attn, &spec.type_embd, &spec.type_out})
        *t = ggml_type::F32;
    spec.n_ctx = 64;
    spec.rope_scaling = rope_scaling_type::yarn;
    spec.rope_factor = 4.0f;
    spec.rope_yarn_log_mul = 0.0707f;
    auto m = load(spec);
    ASSERT_GT(m->hp.kq_scale, 1.2f / std::sqrt(64.0f));
    const auto tokens = some_tokens(m->hp.n_vocab, 36);
    const std::vector<float> got = run(*m, *pool, tokens, kv_type::f16, 7);
    spec.rope_yarn_log_mul = 0.0f;  // the same weights without the multiplier: the scale the test must see
    auto plain = load(spec);
    const std::vector<float> without = run(*plain, *pool, tokens, kv_type::f16, 7);
    testing::reference_model ref(m->file);
    const auto want = ref.logits(tokens);
    const size_t nv = static_cast<size_t>(m->hp.n_vocab);
    double worst = 0, moved = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
        worst = std::max(worst, rel_err(got.data() + p * nv, want[p]));
        moved = std::max(moved, rel_err(without.data() + p * nv, want[p]));
    }
    std::printf("  deepseek2 yarn x4, log multiplier 0.707: worst relative logit error %.2e; without the multiplier "
                "%.3f\n",
                worst, moved);
    EXPECT_LT(worst, 2e-3);
    EXPECT_GT(moved, 0.01);
}

TEST(Forward, RouteTokenSigmoidBiasSelectsButDoesNotWeigh) {
    const float logits[4] = {0.0f, 1.0f, 2.0f, 0.5f};
    const float bias[4] = {0.5f, 0.0f, 0.0f, 0.0f};
    const auto sig = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
    int32_t ids[2];
    float w[2];
    route_token(logits, nullptr, 4, 2, {gating_func::sigmoid, false, 0.0f}, ids, w);
    EXPECT_EQ(ids[0], 2);
    EXPECT_EQ(ids[1], 1);
    // Expert 0's score 0.5 + bias 0.5 beats expert 1's 0.73; its weight stays the unbiased 0.5.
    route_token(logits, bias, 4, 2, {gating_func::sigmoid, false, 0.0f}, ids, w);
    EXPECT_EQ(ids[0], 0);
    EXPECT_EQ(ids[1], 2);
    EXPECT_FLOAT_EQ(w[0], 0.5f);
    EXPECT_FLOAT_EQ(w[1], sig(2.0f));
    route_token(logits, bias, 4, 2, {gating_func::sigmoid, true, 2.5f}, ids, w);
    EXPECT_FLOAT_EQ(w[0], 2.5f * 0.5f / (0.5f + sig(2.0f)));
    EXPECT_FLOAT_EQ(w[1], 2.5f * sig(2.0f) / (0.5f + sig(2.0f)));
    // A scale of 1 (or 0, unset) leaves the weights as they are.
    route_token(logits, bias, 4, 2, {gating_func::sigmoid, false, 1.0f}, ids, w);
    EXPECT_FLOAT_EQ(w[0], 0.5f);
}

// Group-limited routing keeps the groups whose two best scores sum highest, even against the single
// best expert, and leaves the rest of the routing as it was.
// One scratch reused over tokens of different shapes (as the forward pass reuses its own) routes each
// exactly as fresh buffers do, and keeps its capacity once grown.
TEST(Forward, RouteTokenWithReusedScratchMatchesFreshBuffers) {
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.5f);
    routing_scratch scratch;
    const float* data_before = nullptr;
    for (int round = 0; round < 2; ++round)
        for (const int n_expert : {16, 8, 12}) {
            std::vector<float> logits(static_cast<size_t>(n_expert)), bias(logits.size());
            for (auto* v : {&logits, &bias})
                for (float& x : *v) x = dist(rng);
            routing_options o{gating_func::sigmoid, true, 2.5f, 4, 2};
            int32_t ids_a[3], ids_b[3];
            float w_a[3], w_b[3];
            route_token(logits.data(), bias.data(), n_expert, 3, o, ids_a, w_a);
            route_token(logits.data(), bias.data(), n_expert, 3, o, ids_b, w_b, scratch);
            EXPECT_EQ(0, std::memcmp(ids_a, ids_b, sizeof(ids_a))) << n_expert << " experts";
            EXPECT_EQ(0, std::memcmp(w_a, w_b, sizeof(w_a))) << n_expert << " experts";
            if (round == 1) {
                EXPECT_EQ(scratch.p.data(), data_before) << "the scratch was reallocated";
            }
            data_before = scratch.p.data();
        }
}

TEST(Forward, RouteTokenKeepsTheBestGroups) {
    // 8 experts in 4 groups of 2. Expert 0 scores best, but its group's pair sums less than groups 1 and 2.
    const float logits[8] = {3.0f, -5.0f, 2.9f, 2.8f, 2.5f, 2.4f, -5.0f, -5.0f};
    int32_t ids[2];
    float w[2];
    routing_options o{gating_func::sigmoid, false, 0.0f};
    route_token(logits, nullptr, 8, 2, o, ids, w);
    EXPECT_EQ(ids[0], 0);
    EXPECT_EQ(ids[1], 2);
    o.n_group = 4;
    o.n_group_used = 2;
    route_token(logits, nullptr, 8, 2, o, ids, w);
    EXPECT_EQ(ids[0], 2);
    EXPECT_EQ(ids[1], 3);
    EXPECT_FLOAT_EQ(w[0], 1.0f / (1.0f + std::exp(-2.9f)));
    // Three used groups take group 0 back: expert 0 wins again.
    o.n_group_used = 3;
    route_token(logits, nullptr, 8, 2, o, ids, w);
    EXPECT_EQ(ids[0], 0);
    EXPECT_EQ(ids[1], 2);
    // The bias takes part in the groups' scores: lifting expert 1 lifts group 0 over group 2.
    const float bias[8] = {0.0f, 1.0f, 0, 0, 0, 0, 0, 0};
    o.n_group_used = 2;
    route_token(logits, bias, 8, 2, o, ids, w);
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(ids[1], 0);
}

TEST(Forward, RouteTokenNormalisesTopK) {
    const float logits[4] = {1.0f, 3.0f, 2.0f, 3.0f};
    int32_t ids[2];
    float w[2];
    route_token(logits, 4, 2, true, ids, w);
    EXPECT_EQ(ids[0], 1);  // tie with expert 3 goes to the lower id
    EXPECT_EQ(ids[1], 3);
    EXPECT_FLOAT_EQ(w[0] + w[1], 1.0f);
    route_token(logits, 4, 2, false, ids, w);
    EXPECT_NEAR(w[0], std::exp(3.0) / (std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0)), 1e-6);
}

}  // namespace
}  // namespace strata::engine

namespace strata::engine {
namespace {

gguf::reader with_metadata(const std::string& key, gguf::value v) {
    gguf::writer w = make_model::build_model(make_model::preset("tiny"));
    w.set(key, std::move(v));
    return gguf::reader::from_bytes(w.write_to_memory(), "bad.gguf");
}

TEST(ModelLoad, WrongShapeNamesTensorExpectedAndFound) {
    // The file says 4 kv heads, but attn_k holds 2 heads of 64.
    const gguf::reader f = with_metadata("qwen3moe.attention.head_count_kv", gguf::value::u32(4));
    const hparams hp = read_hparams(f);
    try {
        bind_weights(f, hp);
        FAIL();
    } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("blk.0.attn_k.weight"), std::string::npos) << msg;
        EXPECT_NE(msg.find("[256, 128]"), std::string::npos) << msg;
        EXPECT_NE(msg.find("expected [256, 256]"), std::string::npos) << msg;
    }
}

TEST(ModelLoad, HyperParameterErrorsNameTheKey) {
    auto message = [](const gguf::reader& f) {
        try {
            read_hparams(f);
        } catch (const std::runtime_error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_NE(message(with_metadata("general.architecture", gguf::value::str("gpt2"))).find("'gpt2' is not supported"),
              std::string::npos);
    EXPECT_NE(message(with_metadata("qwen3moe.expert_used_count", gguf::value::u32(9))).find("must be 1..8"),
              std::string::npos);
    EXPECT_NE(message(with_metadata("qwen3moe.attention.head_count", gguf::value::u32(3))).find("3 attention heads"),
              std::string::npos);
    EXPECT_NE(message(with_metadata("qwen3moe.expert_count", gguf::value::u32(0))).find("no experts"),
              std::string::npos);
}

}  // namespace
}  // namespace strata::engine
