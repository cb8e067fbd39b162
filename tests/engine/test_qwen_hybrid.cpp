// The hybrid families (qwen35moe, qwen3next): loading as llama.cpp reads their files, the forward pass
// against the naive reference of reference_hybrid.cpp, bitwise determinism across pool configurations
// and batch splits, and the recurrent state's checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "generate.hpp"
#include "gguf/gguf_writer.hpp"
#include "loaded_model.hpp"
#include "model/forward.hpp"
#include "reference_hybrid.hpp"

namespace strata::engine {
namespace {

using formats::ggml_type;
using make_model::arch;

make_model::model_spec all_f32(make_model::model_spec s) {
    for (ggml_type* t : {&s.type_experts, &s.type_shexp, &s.type_attn, &s.type_embd, &s.type_out, &s.type_router})
        *t = ggml_type::F32;
    return s;
}

std::vector<int32_t> some_tokens(int n_vocab, int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 7919 + 13) % (n_vocab - 3));
    return t;
}

// Logits of every position, the tokens evaluated in batches of the given sizes (the last repeated).
std::vector<float> run(test::loaded& m, arenas::expert_pool& pool, const std::vector<int32_t>& tokens,
                       std::vector<int> batches) {
    forward_pass fwd(pool, m.hp, m.w, *m.rows);
    kv_cache state = make_sequence_state(m.hp, std::max<int>(64, static_cast<int>(tokens.size())), kv_type::f16);
    std::vector<float> logits(tokens.size() * static_cast<size_t>(m.hp.n_vocab), NAN);
    const std::span<const int32_t> all(tokens);
    size_t done = 0;
    for (size_t i = 0; done < tokens.size(); ++i) {
        const size_t n = std::min(tokens.size() - done, static_cast<size_t>(batches[std::min(i, batches.size() - 1)]));
        fwd.eval(all.subspan(done, n), static_cast<int>(done), state, logits.data() + done * m.hp.n_vocab, true, 512);
        done += n;
    }
    return logits;
}

double rel_err(const float* a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        num = std::max(num, std::abs(double(a[i]) - b[i]));
        den = std::max(den, std::abs(double(b[i])));
    }
    return num / den;
}

struct variant {
    const char* name;
    make_model::model_spec spec;
};

std::vector<variant> variants() {
    make_model::model_spec legacy = make_model::preset("tiny", arch::qwen3next);
    legacy.ssm_in = true;
    return {{"qwen35moe", make_model::preset("tiny", arch::qwen35moe)},
            {"qwen3next", make_model::preset("tiny", arch::qwen3next)},
            {"qwen3next_ssm_in", legacy}};
}

TEST(HybridLoad, ReadsTheLayerLayoutAndStateSizes) {
    auto m = test::load(make_model::build_model(make_model::preset("tiny", arch::qwen35moe)));
    const hparams& hp = m->hp;
    EXPECT_TRUE(hp.hybrid());
    EXPECT_EQ(hp.n_layer, 4);
    EXPECT_EQ(hp.n_kv_layer(), 1);  // layers 0-2 DeltaNet, 3 attention
    EXPECT_TRUE(hp.is_recurrent(0) && hp.is_recurrent(2) && !hp.is_recurrent(3));
    EXPECT_EQ(hp.kv_layer(3), 0);
    EXPECT_EQ(hp.ssm_conv_dim(), 2 * 2 * 32 + 4 * 32);
    EXPECT_TRUE(hp.ssm_v_tiled);
    // 3 layers x (3 conv rows x conv_dim + 4 heads x 32 x 32) floats
    EXPECT_EQ(recurrent_state_bytes(hp), size_t{3} * (3 * 256 + 4 * 32 * 32) * 4);
    EXPECT_EQ(m->w.layers[0].ssm_alpha.n_rows, 4);
    EXPECT_EQ(m->w.layers[3].wq.n_rows, 2 * hp.n_q());
}

TEST(HybridLoad, MtpBlockIsBoundButNotRun) {
    make_model::model_spec spec = make_model::preset("tiny", arch::qwen35moe);
    auto plain = test::load(make_model::build_model(spec));
    spec.n_layer_nextn = 1;
    auto mtp = test::load(make_model::build_model(spec));
    ASSERT_EQ(mtp->hp.n_layer, plain->hp.n_layer);
    ASSERT_EQ(mtp->w.nextn.size(), 1u);
    EXPECT_TRUE(mtp->w.nextn[0].eh_proj.present());
    EXPECT_EQ(mtp->w.nextn[0].eh_proj.m.n_cols, 2 * mtp->hp.n_embd);
    auto pool = test::make_pool("off", 2);
    const auto tokens = some_tokens(plain->hp.n_vocab, 8);
    const std::vector<float> a = run(*plain, *pool, tokens, {8}), b = run(*mtp, *pool, tokens, {8});
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// The MTP block's draft logits against the naive reference: the trunk's residual rows captured by the
// pass, each position's entry from its token and the residual before it, the block's own KV cache filled
// by a batch and then one position at a time.
TEST(HybridMtp, DraftLogitsMatchNaiveReference) {
    make_model::model_spec spec = all_f32(make_model::preset("tiny", arch::qwen35moe));
    spec.n_layer_nextn = 1;
    auto m = test::load(make_model::build_model(spec));
    auto pool = test::make_pool("off", 2);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    ASSERT_TRUE(fwd.has_mtp());
    const int n = 24;
    const size_t n_embd = static_cast<size_t>(m->hp.n_embd), n_vocab = static_cast<size_t>(m->hp.n_vocab);
    const auto tokens = some_tokens(m->hp.n_vocab, n);
    kv_cache state = make_sequence_state(m->hp, 64, kv_type::f16);
    std::vector<float> logits(n_vocab), hidden(static_cast<size_t>(n) * n_embd);
    fwd.eval(tokens, 0, state, logits.data(), false, 512, hidden.data());
    // Row p's hidden input: the residual at p - 1 (zeros at 0).
    std::vector<float> h(static_cast<size_t>(n) * n_embd, 0.0f);
    std::copy(hidden.begin(), hidden.end() - static_cast<std::ptrdiff_t>(n_embd), h.begin() + static_cast<std::ptrdiff_t>(n_embd));
    kv_cache mkv(1, 64, m->hp.kv_heads(), m->hp.kv_head_dim(), kv_type::f16);
    std::vector<float> got(static_cast<size_t>(n) * n_vocab, NAN);
    const int first = n - 4;
    fwd.mtp(tokens.data(), h.data(), first, 0, mkv, nullptr, got.data(), true);
    for (int p = first; p < n; ++p)
        fwd.mtp(tokens.data() + p, h.data() + static_cast<size_t>(p) * n_embd, 1, p, mkv, nullptr,
                got.data() + static_cast<size_t>(p) * n_vocab);
    testing::hybrid_reference ref(m->file);
    const auto want = ref.mtp_logits(tokens);
    double worst = 0;
    for (int p = 0; p < n; ++p) worst = std::max(worst, rel_err(got.data() + static_cast<size_t>(p) * n_vocab, want[size_t(p)]));
    std::printf("  MTP all-F32: worst relative draft logit error %.2e (least routing margin %.2e)\n", worst,
                ref.min_route_margin());
    EXPECT_LT(worst, 1e-3);
    // The draft of the last position (argmax) is the reference's.
    const float* last = got.data() + static_cast<size_t>(n - 1) * n_vocab;
    EXPECT_EQ(std::max_element(last, last + n_vocab) - last,
              std::max_element(want.back().begin(), want.back().end()) - want.back().begin());
}

// llama.cpp's fused ffn_gate_up_exps holds the gate rows then the up rows of each expert; a file with it
// computes what the same values in ffn_gate_exps + ffn_up_exps compute, bit for bit.
TEST(HybridLoad, FusedGateUpExpertsComputeTheSameModel) {
    gguf::writer w = make_model::build_model(make_model::preset("tiny", arch::qwen35moe));
    auto split = test::load(w);
    const hparams& hp = split->hp;
    for (int il = 0; il < hp.n_layer; ++il) {
        const layer_weights& l = split->w.layers[static_cast<size_t>(il)];
        ASSERT_TRUE(w.erase_tensor(l.gate.name) && w.erase_tensor(l.up.name));
        w.add_tensor(fmt::format("blk.{}.ffn_gate_up_exps.weight", il), l.gate.type, {hp.n_embd, 2 * hp.n_ff_exp, hp.n_expert},
                     [&l, n_expert = hp.n_expert](std::span<uint8_t> out) {
                         const size_t part = l.gate.row_stride * static_cast<size_t>(l.gate.n_rows);
                         for (size_t e = 0; e < static_cast<size_t>(n_expert); ++e) {
                             std::memcpy(out.data() + 2 * e * part, l.gate.experts[e], part);
                             std::memcpy(out.data() + (2 * e + 1) * part, l.up.experts[e], part);
                         }
                     });
    }
    auto fused = test::load(w);
    const layer_weights& l = fused->w.layers[0];
    EXPECT_EQ(l.gate.name, "blk.0.ffn_gate_up_exps.weight");
    EXPECT_EQ(l.up.experts[0] - l.gate.experts[0], static_cast<ptrdiff_t>(l.gate.row_stride) * hp.n_ff_exp);
    auto pool = test::make_pool("test:2", 2);
    const auto tokens = some_tokens(hp.n_vocab, 9);
    const std::vector<float> want = run(*split, *pool, tokens, {8, 1}), got = run(*fused, *pool, tokens, {8, 1});
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    // Without it, the separate tensors are required and named.
    w.erase_tensor("blk.1.ffn_gate_up_exps.weight");
    try {
        test::load(w);
        ADD_FAILURE() << "no error without blk.1.ffn_gate_up_exps";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("blk.1.ffn_gate_exps.weight"), std::string::npos) << e.what();
    }
}

TEST(HybridLoad, ErrorsNameTheKeyAndNumbers) {
    const auto expect_error = [](const char* key, gguf::value v, const char* needle) {
        gguf::writer w = make_model::build_model(make_model::preset("tiny", arch::qwen35moe));
        w.set(std::string("qwen35moe.") + key, std::move(v));
        try {
            test::load(w);
            ADD_FAILURE() << key << ": no error";
        } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error("ssm.inner_size", gguf::value::u32(100), "ssm.inner_size is 100, expected");
    expect_error("ssm.time_step_rank", gguf::value::u32(3), "ssm.time_step_rank (value heads) is 3");
    expect_error("ssm.conv_kernel", gguf::value::u32(1), "ssm.conv_kernel is 1");
    expect_error("full_attention_interval", gguf::value::u32(0), "full_attention_interval is 0");
    gguf::writer w = make_model::build_model(make_model::preset("tiny", arch::qwen35moe));
    w.erase("qwen35moe.ssm.state_size");
    try {
        test::load(w);
        ADD_FAILURE() << "no error without ssm.state_size";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("'qwen35moe.ssm.state_size' is missing"), std::string::npos) << e.what();
    }
}

// All-F32 files: what remains between the engine and the reference is summation order.
TEST(HybridForward, AllF32MatchesNaiveReference) {
    for (const variant& v : variants()) {
        auto m = test::load(make_model::build_model(all_f32(v.spec)));
        const auto tokens = some_tokens(m->hp.n_vocab, 40);
        auto pool = test::make_pool("off", 2);
        const std::vector<float> got = run(*m, *pool, tokens, {512});
        testing::hybrid_reference ref(m->file);
        const auto want = ref.logits(tokens);
        double worst = 0;
        for (size_t p = 0; p < tokens.size(); ++p)
            worst = std::max(worst, rel_err(got.data() + p * static_cast<size_t>(m->hp.n_vocab), want[p]));
        std::printf("  %s all-F32: worst relative logit error %.2e (least routing margin %.2e)\n", v.name, worst,
                    ref.min_route_margin());
        EXPECT_LT(worst, 1e-3) << v.name;
    }
}

// Q8_0 weights (the engine quantizes activations to 8 bits as well): within quantization error. Every
// expert is used, so that no routing near-tie can send the two to different experts.
TEST(HybridForward, QuantizedIsCloseToReference) {
    for (variant v : variants()) {
        v.spec = all_f32(v.spec);
        v.spec.n_expert = v.spec.n_expert_used = 4;
        for (ggml_type* t : {&v.spec.type_experts, &v.spec.type_shexp, &v.spec.type_attn, &v.spec.type_embd})
            *t = ggml_type::Q8_0;
        auto m = test::load(make_model::build_model(v.spec));
        const auto tokens = some_tokens(m->hp.n_vocab, 16);
        auto pool = test::make_pool("off", 2);
        const std::vector<float> got = run(*m, *pool, tokens, {512});
        testing::hybrid_reference ref(m->file);
        const auto want = ref.logits(tokens);
        double worst = 0;
        for (size_t p = 0; p < tokens.size(); ++p)
            worst = std::max(worst, rel_err(got.data() + p * static_cast<size_t>(m->hp.n_vocab), want[p]));
        std::printf("  %s quantized: worst relative logit error %.2e (first position %.2e, last %.2e)\n", v.name, worst,
                    rel_err(got.data(), want[0]),
                    rel_err(got.data() + (tokens.size() - 1) * static_cast<size_t>(m->hp.n_vocab), want.back()));
        EXPECT_LT(worst, 0.08) << v.name;
    }
}

// The same logits, bit for bit, for any pool mode, worker count and split of the tokens into batches
// at multiples of the prompt kernel's chunk (one-token decode included).
TEST(HybridForward, BitwiseAcrossPoolsWorkersAndBatches) {
    for (const variant& v : variants()) {
        auto m = test::load(make_model::build_model(v.spec));
        const auto tokens = some_tokens(m->hp.n_vocab, 200);
        auto base_pool = test::make_pool("off", 1);
        const std::vector<float> base = run(*m, *base_pool, tokens, {512});
        for (const auto& [mode, workers] : {std::pair{"off", 2}, std::pair{"test:2", 2}, std::pair{"test:3", 3}}) {
            auto pool = test::make_pool(mode, workers);
            for (const std::vector<int>& batches : {std::vector<int>{512}, {64, 1}, {128, 64, 1}}) {
                const std::vector<float> got = run(*m, *pool, tokens, batches);
                EXPECT_EQ(0, std::memcmp(got.data(), base.data(), got.size() * sizeof(float)))
                    << v.name << " pool " << mode << " x" << workers << " first batch " << batches[0];
            }
        }
    }
}

// Checkpoints: a state cut back to a checkpoint and run forward again gives the logits of the first
// run bit for bit; past the last checkpoint it goes back to it, and with none to position 0.
TEST(HybridForward, CheckpointsRestoreTheStateExactly) {
    auto m = test::load(make_model::build_model(make_model::preset("tiny", arch::qwen35moe)));
    auto pool = test::make_pool("off", 2);
    const auto tokens = some_tokens(m->hp.n_vocab, 150);
    const std::span<const int32_t> all(tokens);
    const size_t nv = static_cast<size_t>(m->hp.n_vocab);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    fwd.set_checkpoint_interval(64);
    kv_cache state = make_sequence_state(m->hp, 256, kv_type::f16);
    std::vector<float> first(tokens.size() * nv), again(tokens.size() * nv);
    fwd.eval(all, 0, state, first.data(), true, 512);
    ASSERT_EQ(state.state<recurrent_state>().pos(), 150);
    ASSERT_EQ(state.state<recurrent_state>().checkpoints().size(), 2u);  // at 64 and 128
    EXPECT_EQ(state.state<recurrent_state>().checkpoint_bytes(), 2 * recurrent_state_bytes(m->hp));
    EXPECT_EQ(state.state<recurrent_state>().cut_back(100), 64);
    EXPECT_EQ(state.state<recurrent_state>().checkpoints().size(), 1u);
    fwd.eval(all.subspan(64), 64, state, again.data() + 64 * nv, true, 512);
    EXPECT_EQ(0, std::memcmp(first.data() + 64 * nv, again.data() + 64 * nv, (150 - 64) * nv * sizeof(float)));
    EXPECT_EQ(state.state<recurrent_state>().cut_back(30), 0);
    fwd.eval(all, 0, state, again.data(), true, 7);
    EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)));
    EXPECT_THROW(fwd.eval(all.first(1), 3, state, again.data(), false, 512), std::logic_error);
}

// A sequence's state beside the rows: one part per mixer kind that keeps one (the DeltaNet layers'
// recurrent state here, nothing for a pure-attention family), parked and restored through kv_cache.
TEST(HybridState, OnePartPerMixerKindThatKeepsOne) {
    auto m = test::load(make_model::build_model(make_model::preset("tiny", arch::qwen35moe)));
    kv_cache state = make_sequence_state(m->hp, 64, kv_type::f16);
    ASSERT_EQ(state.states().size(), 1u);
    EXPECT_STREQ(state.states()[0]->kind(), "gated DeltaNet recurrent state");
    EXPECT_EQ(&state.state<recurrent_state>(), state.states()[0].get());
    EXPECT_EQ(mixer_kind_of(m->hp, 0).state_bytes(m->hp), recurrent_state_bytes(m->hp));
    EXPECT_EQ(mixer_kind_of(m->hp, 3).state_bytes(m->hp), 0u);  // the attention layer
    EXPECT_STREQ(mixer_kind_of(m->hp, 3).name(), "attention");
    state.state<recurrent_state>().set_pos(5);
    const parked_state p = state.park_state(5);
    EXPECT_EQ(p.n_states(), 1u);
    EXPECT_EQ(p.bytes(), recurrent_state_bytes(m->hp));
    EXPECT_THROW(state.restore_state(p, 3), std::logic_error);  // nothing parked at 3
    kv_cache plain = make_sequence_state(test::load(make_model::build_model(make_model::preset("tiny", arch::qwen3moe)))->hp,
                                         64, kv_type::f16);
    EXPECT_TRUE(plain.states().empty());
    EXPECT_EQ(plain.state_pos(), -1);
    EXPECT_THROW(plain.restore_state(p, 5), std::logic_error);  // parts of another model
    EXPECT_THROW(plain.state<recurrent_state>(), std::logic_error);
}

// What the session and the engine's accounting ask of the layer kinds instead of the architecture.
TEST(HybridState, TheLayerKindsAnswerForTheModel) {
    auto m = test::load(make_model::build_model(make_model::preset("tiny", arch::qwen35moe)));
    const hparams& hp = m->hp;
    EXPECT_EQ(n_recurrent_layers(hp), 3);
    EXPECT_EQ(sequence_state_bytes(hp), recurrent_state_bytes(hp));
    const kv_rows rows = sequence_rows(hp);
    EXPECT_EQ(rows.n_head_kv, hp.n_head_kv);
    EXPECT_EQ(rows.head_dim, hp.head_dim);
    EXPECT_FALSE(rows.latent);
    EXPECT_NE(gpu_unsupported(hp).find("gated DeltaNet"), std::string::npos);
    const kv_cache mtp = make_mtp_state(hp, 64, kv_type::f16);
    EXPECT_EQ(mtp.n_layer(), 1);
    EXPECT_TRUE(mtp.states().empty());
    auto pool = test::make_pool("off", 1);
    forward_pass fwd(*pool, hp, m->w, *m->rows);
    EXPECT_FALSE(fwd.has_mtp());
    EXPECT_EQ(fwd.mtp_refusal(), "not implemented for qwen35moe");

    auto d = test::load(make_model::build_model(make_model::preset("tiny", arch::deepseek2)));
    const kv_rows latent = sequence_rows(d->hp);
    EXPECT_TRUE(latent.latent);
    EXPECT_EQ(latent.n_head_kv, 1);
    EXPECT_EQ(latent.head_dim, d->hp.n_lora_kv + d->hp.n_rot);
    EXPECT_EQ(n_recurrent_layers(d->hp), 0);
    EXPECT_EQ(sequence_state_bytes(d->hp), 0u);
    EXPECT_NE(gpu_unsupported(d->hp).find("multi-head latent attention"), std::string::npos);
    EXPECT_TRUE(make_mtp_state(d->hp, 64, kv_type::f16).latent());
    EXPECT_EQ(gpu_unsupported(test::load(make_model::build_model(make_model::preset("tiny", arch::qwen3moe)))->hp), "");
}

}  // namespace
}  // namespace strata::engine
