// Hyper-parameters read from the file with llama.cpp's defaults or load errors naming the key, the
// RoPE settings and their overrides (model_options -> rope_overrides) applied over the file's values.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include <spdlog/fmt/fmt.h>

#include "generate.hpp"
#include "gguf/gguf_writer.hpp"
#include "loaded_model.hpp"
#include "model/hparams.hpp"
#include "model/weights.hpp"
#include "model_info.hpp"
#include "strata/engine.hpp"

namespace strata::engine {
namespace {

using make_model::rope_scaling_type;

gguf::reader file_with(make_model::model_spec spec, const std::vector<std::pair<std::string, gguf::value>>& keys = {}) {
    gguf::writer w = make_model::build_model(spec);
    for (const auto& [k, v] : keys) w.set(k, v);
    return gguf::reader::from_bytes(w.write_to_memory(), "rope.gguf");
}

make_model::model_spec tiny() {
    make_model::model_spec s = make_model::preset("tiny");
    s.n_layer = 1;
    return s;
}

TEST(RopeHparams, AbsentKeysGiveLlamaCppDefaults) {
    const hparams hp = read_hparams(file_with(tiny()));
    EXPECT_EQ(hp.rope.freq_base, 1e6f);  // the file's rope.freq_base
    EXPECT_EQ(hp.rope.scaling, rope_scaling::linear);
    EXPECT_EQ(hp.rope.freq_scale, 1.0f);
    EXPECT_EQ(hp.rope.n_ctx_orig, hp.n_ctx_train);
    EXPECT_EQ(hp.rope.ext_factor, 0.0f);
    EXPECT_EQ(hp.rope.attn_factor, 1.0f);
    EXPECT_EQ(hp.rope.beta_fast, 32.0f);
    EXPECT_EQ(hp.rope.beta_slow, 1.0f);
    EXPECT_EQ(describe_rope(hp.rope), "none");
}

TEST(RopeHparams, YarnFileAndItsDefaults) {
    make_model::model_spec s = tiny();
    s.rope_scaling = rope_scaling_type::yarn;
    s.rope_factor = 4.0f;
    s.n_ctx = 64;
    hparams hp = read_hparams(file_with(s));
    EXPECT_EQ(hp.rope.scaling, rope_scaling::yarn);
    EXPECT_EQ(hp.rope.freq_scale, 0.25f);
    EXPECT_EQ(hp.rope.n_ctx_orig, 16);
    EXPECT_EQ(hp.rope.ext_factor, 1.0f);  // -1 ("not set") becomes 1 under yarn
    EXPECT_EQ(hp.rope.attn_factor, 1.0f);
    EXPECT_EQ(describe_rope(hp.rope), "yarn x4, original context 16");

    // No original_context_length: the training context, as llama.cpp. The YaRN keys llama.cpp reads.
    const gguf::reader f = file_with(tiny(), {{"qwen3moe.rope.scaling.type", gguf::value::str("yarn")},
                                              {"qwen3moe.rope.scaling.factor", gguf::value::f32(8)},
                                              {"qwen3moe.rope.scaling.attn_factor", gguf::value::f32(0.5f)},
                                              {"qwen3moe.rope.scaling.yarn_attn_factor", gguf::value::f32(3)},
                                              {"qwen3moe.rope.scaling.yarn_ext_factor", gguf::value::f32(0.25f)},
                                              {"qwen3moe.rope.scaling.yarn_beta_fast", gguf::value::f32(16)},
                                              {"qwen3moe.rope.scaling.yarn_beta_slow", gguf::value::f32(2)}});
    hp = read_hparams(f);
    EXPECT_EQ(hp.rope.n_ctx_orig, hp.n_ctx_train);
    EXPECT_EQ(hp.rope.freq_scale, 0.125f);
    EXPECT_EQ(hp.rope.attn_factor, 1.5f);
    EXPECT_EQ(hp.rope.ext_factor, 0.25f);
    EXPECT_EQ(hp.rope.beta_fast, 16.0f);
    EXPECT_EQ(hp.rope.beta_slow, 2.0f);
}

TEST(RopeHparams, LinearLegacyKeyAndNone) {
    hparams hp = read_hparams(file_with(tiny(), {{"qwen3moe.rope.scale_linear", gguf::value::f32(2)}}));
    EXPECT_EQ(hp.rope.scaling, rope_scaling::linear);
    EXPECT_EQ(hp.rope.freq_scale, 0.5f);
    EXPECT_EQ(hp.rope.ext_factor, 0.0f);
    EXPECT_EQ(describe_rope(hp.rope), "linear x2");
    hp = read_hparams(file_with(tiny(), {{"qwen3moe.rope.scaling.type", gguf::value::str("none")},
                                         {"qwen3moe.rope.scaling.factor", gguf::value::f32(4)}}));
    EXPECT_EQ(hp.rope.scaling, rope_scaling::none);
    EXPECT_EQ(hp.rope.freq_scale, 1.0f);  // none never scales
}

TEST(RopeHparams, UnknownTypeNamesItAndTheValidOnes) {
    try {
        read_hparams(file_with(tiny(), {{"qwen3moe.rope.scaling.type", gguf::value::str("longrope")}}));
        FAIL() << "an unknown scaling type must not load";
    } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("'longrope'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("qwen3moe.rope.scaling.type"), std::string::npos) << msg;
        EXPECT_NE(msg.find("none, linear, yarn"), std::string::npos) << msg;
    }
    EXPECT_THROW(read_hparams(file_with(tiny(), {{"qwen3moe.rope.scaling.factor", gguf::value::f32(-2)}})),
                 std::runtime_error);
}

TEST(RopeHparams, OverridesReplaceTheFilesValues) {
    model_options o;
    EXPECT_EQ(describe_rope(read_hparams(file_with(tiny()), rope_overrides_from(o)).rope), "none");
    o.rope_scaling = "yarn";
    o.rope_scale = 8;
    o.yarn_orig_ctx = 100;
    o.rope_freq_base = 5e5f;
    o.yarn_beta_fast = 20;
    hparams hp = read_hparams(file_with(tiny()), rope_overrides_from(o));
    EXPECT_EQ(hp.rope.scaling, rope_scaling::yarn);
    EXPECT_EQ(hp.rope.freq_scale, 0.125f);
    EXPECT_EQ(hp.rope.n_ctx_orig, 100);
    EXPECT_EQ(hp.rope.freq_base, 5e5f);
    EXPECT_EQ(hp.rope.ext_factor, 1.0f);
    EXPECT_EQ(hp.rope.beta_fast, 20.0f);
    EXPECT_EQ(hp.rope.beta_slow, 1.0f);

    // --rope-scaling none over a YaRN file: plain RoPE.
    make_model::model_spec s = tiny();
    s.rope_scaling = rope_scaling_type::yarn;
    s.rope_factor = 4.0f;
    model_options none;
    none.rope_scaling = "none";
    hp = read_hparams(file_with(s), rope_overrides_from(none));
    EXPECT_EQ(hp.rope.freq_scale, 1.0f);
    EXPECT_EQ(hp.rope.ext_factor, 0.0f);
    EXPECT_EQ(hp.rope.attn_factor, 1.0f);
}

TEST(RopeHparams, BadOverridesNameTheFlagAndTheValue) {
    const auto message = [](model_options o) {
        try {
            rope_overrides_from(o);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    model_options o;
    o.rope_scaling = "ntk";
    EXPECT_NE(message(o).find("--rope-scaling: RoPE scaling type 'ntk'"), std::string::npos) << message(o);
    o = {};
    o.rope_scale = -2;
    EXPECT_NE(message(o).find("--rope-scale must be positive (0: the model's), got -2"), std::string::npos);
    o = {};
    o.yarn_orig_ctx = -5;
    EXPECT_NE(message(o).find("--yarn-orig-ctx must be positive (0: the model's), got -5"), std::string::npos);
    o = {};
    o.yarn_beta_slow = 0;
    EXPECT_NE(message(o).find("--yarn-beta-slow must be positive"), std::string::npos);
    o = {};
    o.yarn_ext_factor = 0;  // allowed: no extrapolation
    EXPECT_EQ(message(o), "accepted");
}

TEST(RopeHparams, InfoSummaryShowsTheScaling) {
    make_model::model_spec s = tiny();
    EXPECT_EQ(summarize(file_with(s)).rope_scaling, "none");
    s.rope_scaling = rope_scaling_type::yarn;
    s.rope_factor = 4.0f;
    s.n_ctx = 131072;
    EXPECT_EQ(summarize(file_with(s)).rope_scaling, "yarn x4, original context 32768");
    const std::string bad =
        summarize(file_with(tiny(), {{"qwen3moe.rope.scaling.type", gguf::value::str("su")}})).rope_scaling;
    EXPECT_NE(bad.find("'su' is not supported"), std::string::npos) << bad;
}

}  // namespace
}  // namespace strata::engine

namespace strata::engine {
namespace {

// qwen2moe without expert_shared_feed_forward_length: llama.cpp's fallback to feed_forward_length,
// and the shared-expert tensors required at that width.
gguf::reader qwen2moe_without_shexp_key(int n_ff_shexp) {
    make_model::model_spec s = make_model::preset("tiny");
    s.architecture = make_model::arch::qwen2moe;
    s.n_layer = 1;
    s.n_ff_shexp = n_ff_shexp;
    gguf::writer w = make_model::build_model(s);
    EXPECT_TRUE(w.erase("qwen2moe.expert_shared_feed_forward_length"));
    return gguf::reader::from_bytes(w.write_to_memory(), "shexp.gguf");
}

TEST(SharedExpertHparams, WidthFallsBackToTheFeedForwardLength) {
    // The generator writes feed_forward_length = n_ff_exp * n_expert_used = 512 for the tiny preset.
    const gguf::reader f = qwen2moe_without_shexp_key(512);
    const hparams hp = read_hparams(f);
    EXPECT_EQ(hp.n_ff_shexp, 512);
    const model_weights w = bind_weights(f, hp);
    EXPECT_TRUE(w.layers[0].shexp_gate.present());
}

TEST(SharedExpertHparams, TensorsOfAnotherWidthAreALoadErrorNamingThem) {
    const gguf::reader f = qwen2moe_without_shexp_key(256);
    const hparams hp = read_hparams(f);
    try {
        bind_weights(f, hp);
        FAIL() << "shared-expert tensors 256 wide were accepted for a width of 512";
    } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("blk.0.ffn_gate_shexp.weight"), std::string::npos) << msg;
        EXPECT_NE(msg.find("expected [256, 512]"), std::string::npos) << msg;
    }
}


// ---- every key read: llama.cpp's default when absent, else a load error naming the key ----

using make_model::arch;

struct arch_case {
    arch a;
    const char* prefix;  // general.architecture + "."
};

const arch_case kArchCases[] = {{arch::qwen3moe, "qwen3moe."}, {arch::qwen2moe, "qwen2moe."}, {arch::mixtral, "llama."},
                                {arch::glm4moe, "glm4moe."}};

gguf::reader without(arch a, const std::vector<std::string>& keys,
                     const std::vector<std::pair<std::string, gguf::value>>& set = {}) {
    static std::map<arch, gguf::writer> built;  // baked once: generating the tensors is the slow part
    if (!built.contains(a)) {
        make_model::model_spec s = tiny();
        s.architecture = a;
        if (a == arch::glm4moe) s.n_layer = 2;  // its leading dense layer, then one with experts
        built.emplace(a, test::baked(make_model::build_model(s)));
    }
    gguf::writer w = built.at(a);
    for (const auto& k : keys) w.erase(k);
    for (const auto& [k, v] : set) w.set(k, v);
    return gguf::reader::from_bytes(w.write_to_memory(), "hparams.gguf");
}

std::string load_error(const gguf::reader& f) {
    try {
        const hparams hp = read_hparams(f);
        bind_weights(f, hp);
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "accepted";
}

TEST(Hparams, AbsentOptionalKeysTakeLlamaCppDefaults) {
    for (const auto& c : kArchCases) {
        SCOPED_TRACE(c.prefix);
        const std::string p = c.prefix;
        // The tiny preset: n_embd 256, 4 heads of 64, 2 kv heads, rope.freq_base 1e6.
        const hparams base = read_hparams(without(c.a, {}));
        EXPECT_EQ(base.n_head_kv, 2);
        EXPECT_EQ(base.rope.freq_base, 1e6f);
        const hparams hp = read_hparams(without(
            c.a, {p + "attention.head_count_kv", p + "attention.key_length", p + "attention.value_length",
                  p + "rope.dimension_count", p + "rope.freq_base"}));
        EXPECT_EQ(hp.n_head_kv, hp.n_head);  // head_count_kv: head_count
        EXPECT_EQ(hp.head_dim, 256 / 4);      // key_length, value_length: n_embd / n_head
        EXPECT_EQ(hp.n_rot, hp.head_dim);     // rope.dimension_count: the key length
        EXPECT_EQ(hp.rope.freq_base, 10000.0f);
    }
}

TEST(Hparams, ExpertWidthWithoutItsKeyIsTheDenseWidthOverTheExpertsUsed) {
    // qwen: feed_forward_length 512 = 256 * 2 used, as the generator writes it; llama.cpp divides.
    for (arch a : {arch::qwen3moe, arch::qwen2moe}) {
        const std::string p = a == arch::qwen3moe ? "qwen3moe." : "qwen2moe.";
        const gguf::reader f = without(a, {p + "expert_feed_forward_length"});
        const hparams hp = read_hparams(f);
        EXPECT_EQ(hp.n_ff_exp, 256) << p;
        EXPECT_EQ(load_error(f), "accepted") << p;
        const std::string msg = load_error(without(a, {p + "expert_feed_forward_length", p + "feed_forward_length"}));
        EXPECT_NE(msg.find(p + "expert_feed_forward_length"), std::string::npos) << msg;
        EXPECT_NE(msg.find(p + "feed_forward_length"), std::string::npos) << msg;
    }
}

TEST(Hparams, LlamaStyleExpertsAreFeedForwardLengthWide) {
    // llama.cpp reads no expert_feed_forward_length for llama: a different one would change nothing
    // there, so here it is an error rather than a silent second width.
    EXPECT_EQ(load_error(without(arch::mixtral, {}, {{"llama.expert_feed_forward_length", gguf::value::u32(256)}})),
              "accepted");
    const std::string msg =
        load_error(without(arch::mixtral, {}, {{"llama.expert_feed_forward_length", gguf::value::u32(128)}}));
    EXPECT_NE(msg.find("llama.expert_feed_forward_length is 128 but llama.feed_forward_length is 256"),
              std::string::npos)
        << msg;
    EXPECT_NE(load_error(without(arch::mixtral, {"llama.feed_forward_length"})).find("'llama.feed_forward_length'"),
              std::string::npos);
}

TEST(Hparams, RequiredKeysAreLoadErrorsNamingThem) {
    for (const auto& c : kArchCases) {
        SCOPED_TRACE(c.prefix);
        const std::string p = c.prefix;
        for (const char* key : {"block_count", "embedding_length", "attention.head_count", "context_length",
                                "attention.layer_norm_rms_epsilon"}) {
            const std::string msg = load_error(without(c.a, {p + key}));
            EXPECT_NE(msg.find("'" + p + key + "' is missing"), std::string::npos) << msg;
        }
        EXPECT_NE(load_error(without(c.a, {p + "expert_count"})).find(p + "expert_count is missing"), std::string::npos);
        EXPECT_NE(load_error(without(c.a, {p + "expert_used_count"})).find(p + "expert_used_count is 0"),
                  std::string::npos);
    }
}

TEST(Hparams, ValueLengthDefaultsToTheHeadWidthNotTheKeyLength) {
    // key_length 128 with n_embd / n_head = 64: llama.cpp's value length stays 64, so the file is refused.
    const std::string msg = load_error(
        without(arch::qwen3moe, {"qwen3moe.attention.value_length"}, {{"qwen3moe.attention.key_length", gguf::value::u32(128)}}));
    EXPECT_NE(msg.find("key length 128 and value length 64 differ"), std::string::npos) << msg;
    EXPECT_NE(msg.find("qwen3moe.attention.value_length"), std::string::npos) << msg;
}

TEST(Hparams, RmsEpsilonIsReadNotDefaulted) {
    const hparams hp = read_hparams(without(arch::qwen3moe, {}, {{"qwen3moe.attention.layer_norm_rms_epsilon", gguf::value::f32(1e-5f)}}));
    EXPECT_EQ(hp.rms_eps, 1e-5f);
    const std::string msg = load_error(
        without(arch::qwen3moe, {}, {{"qwen3moe.attention.layer_norm_rms_epsilon", gguf::value::f32(-1.0f)}}));
    EXPECT_NE(msg.find("qwen3moe.attention.layer_norm_rms_epsilon is -1"), std::string::npos) << msg;
}

// ---- glm4moe: the routing and layer-layout keys, llama.cpp's defaults, its next-token-prediction layers ----

TEST(Glm4moeHparams, RoutingKeysAsWrittenAndTheirDefaults) {
    const hparams hp = read_hparams(without(arch::glm4moe, {}));
    EXPECT_EQ(hp.gating, gating_func::sigmoid);
    EXPECT_TRUE(hp.expert_weights_norm);
    EXPECT_EQ(hp.expert_weights_scale, 2.5f);
    EXPECT_EQ(hp.n_layer_dense_lead, 1);
    EXPECT_EQ(hp.n_ff, 512);
    EXPECT_EQ(hp.n_expert_shared, 1);
    EXPECT_EQ(hp.n_ff_shexp, hp.n_ff_exp);
    EXPECT_EQ(hp.n_rot, hp.head_dim / 2);
    const std::string p = "glm4moe.";
    const hparams d = read_hparams(without(arch::glm4moe, {p + "expert_gating_func", p + "expert_weights_norm",
                                                           p + "expert_weights_scale", p + "leading_dense_block_count",
                                                           p + "nextn_predict_layers"}));
    EXPECT_EQ(d.gating, gating_func::sigmoid);  // llama.cpp: sigmoid when unset
    EXPECT_FALSE(d.expert_weights_norm);
    EXPECT_EQ(d.expert_weights_scale, 0.0f);
    EXPECT_EQ(d.n_layer_dense_lead, 0);
    EXPECT_EQ(d.n_layer_nextn, 0);
    EXPECT_EQ(read_hparams(without(arch::glm4moe, {}, {{p + "expert_gating_func", gguf::value::u32(1)}})).gating,
              gating_func::softmax);
    // Without the dense layer count, layer 0 must have experts: its dense tensors alone are a load error.
    EXPECT_NE(load_error(without(arch::glm4moe, {p + "leading_dense_block_count"})).find("blk.0.ffn_gate_inp.weight"),
              std::string::npos);
}

TEST(Glm4moeHparams, BadOrMissingKeysNameTheKey) {
    const std::string p = "glm4moe.";
    const auto has = [](const std::string& msg, const std::string& what) {
        EXPECT_NE(msg.find(what), std::string::npos) << msg;
    };
    has(load_error(without(arch::glm4moe, {p + "expert_shared_count"})), "'glm4moe.expert_shared_count' is missing");
    has(load_error(without(arch::glm4moe, {p + "expert_feed_forward_length"})),
        "'glm4moe.expert_feed_forward_length' is missing");
    has(load_error(without(arch::glm4moe, {p + "feed_forward_length"})), "'glm4moe.feed_forward_length' is missing");
    has(load_error(without(arch::glm4moe, {}, {{p + "expert_gating_func", gguf::value::u32(3)}})),
        "glm4moe.expert_gating_func is 3");
    has(load_error(without(arch::glm4moe, {}, {{p + "leading_dense_block_count", gguf::value::u32(2)}})),
        "glm4moe.leading_dense_block_count is 2, but only 2 layers are evaluated");
    has(load_error(without(arch::glm4moe, {}, {{p + "nextn_predict_layers", gguf::value::u32(2)}})),
        "glm4moe.nextn_predict_layers is 2, must be below glm4moe.block_count (2)");
    has(load_error(without(arch::glm4moe, {}, {{p + "expert_weights_scale", gguf::value::f32(-1)}})),
        "glm4moe.expert_weights_scale is -1");
    has(load_error(without(arch::glm4moe, {},
                           {{p + "rope.dimension_sections", gguf::value::i32_array({8, 8, 16, 0})}})),
        "glm4moe.rope.dimension_sections");
}

// The MTP layer is counted out of the trunk's layers and bound as the drafting block.
TEST(Glm4moeHparams, NextTokenPredictionLayersAreCountedOutAndBoundForDrafting) {
    make_model::model_spec s = make_model::preset("tiny", arch::glm4moe);
    s.n_layer_nextn = 1;
    const gguf::reader f = file_with(s);
    EXPECT_EQ(f.get_u64("glm4moe.block_count", 0), 4u);
    ASSERT_NE(f.find_tensor("blk.3.nextn.eh_proj.weight"), nullptr);
    const hparams hp = read_hparams(f);
    EXPECT_EQ(hp.n_layer, 3);
    EXPECT_EQ(hp.n_layer_nextn, 1);
    const model_weights w = bind_weights(f, hp);
    EXPECT_EQ(w.layers.size(), 3u);
    ASSERT_EQ(w.nextn.size(), 1u) << w.nextn_error;
    EXPECT_TRUE(w.nextn[0].eh_proj.present());
    EXPECT_TRUE(w.nextn[0].layer.router.present());
    EXPECT_NE(w.nextn[0].shared_head_norm, nullptr);
    EXPECT_FALSE(w.nextn[0].shared_head_head.present());
    // A block that cannot be bound leaves the trunk loadable, the reason kept.
    gguf::writer broken = make_model::build_model(s);
    ASSERT_TRUE(broken.erase_tensor("blk.3.nextn.hnorm.weight"));
    const gguf::reader g = gguf::reader::from_bytes(broken.write_to_memory(), "glm.gguf");
    const model_weights wb = bind_weights(g, read_hparams(g));
    EXPECT_TRUE(wb.nextn.empty());
    EXPECT_NE(wb.nextn_error.find("blk.3.nextn.hnorm.weight"), std::string::npos) << wb.nextn_error;
}

TEST(Glm4moeHparams, QkNormAndBiasesAreOptionalButQkNormComesInPairs) {
    make_model::model_spec s = make_model::preset("tiny", arch::glm4moe);
    s.qk_norm = false;
    gguf::writer w = make_model::build_model(s);
    for (int il = 0; il < s.n_layer; ++il) EXPECT_TRUE(w.erase_tensor(fmt::format("blk.{}.attn_k.bias", il)));
    const gguf::reader f = gguf::reader::from_bytes(w.write_to_memory(), "glm.gguf");
    const hparams hp = read_hparams(f);
    const model_weights mw = bind_weights(f, hp);
    EXPECT_EQ(mw.layers[1].q_norm, nullptr);
    EXPECT_NE(mw.layers[1].bq, nullptr);
    EXPECT_EQ(mw.layers[1].bk, nullptr);
    EXPECT_NE(mw.layers[1].exp_probs_b, nullptr);
    EXPECT_TRUE(mw.layers[0].ffn_gate.present());
    EXPECT_FALSE(mw.layers[0].router.present());

    gguf::writer half = make_model::build_model(make_model::preset("tiny", arch::glm4moe));
    EXPECT_TRUE(half.erase_tensor("blk.1.attn_k_norm.weight"));
    EXPECT_NE(load_error(gguf::reader::from_bytes(half.write_to_memory(), "glm.gguf")).find("only one of attn_q_norm"),
              std::string::npos);
    gguf::writer no_bias = make_model::build_model(make_model::preset("tiny", arch::glm4moe));
    EXPECT_TRUE(no_bias.erase_tensor("blk.2.exp_probs_b.bias"));
    EXPECT_NE(load_error(gguf::reader::from_bytes(no_bias.write_to_memory(), "glm.gguf")).find("'blk.2.exp_probs_b.bias' is missing"),
              std::string::npos);
}

TEST(Glm4moeHparams, InfoSummaryShowsTheKeysAndTensorClasses) {
    make_model::model_spec s = make_model::preset("tiny", arch::glm4moe);
    s.n_layer_nextn = 1;
    const model_summary m = summarize(file_with(s));
    std::map<std::string, std::string> keys(m.hparams.begin(), m.hparams.end());
    EXPECT_EQ(keys["leading_dense_block_count"], "1");
    EXPECT_EQ(keys["expert_gating_func"], "2");
    EXPECT_EQ(keys["expert_weights_norm"], "true");
    EXPECT_EQ(keys["expert_shared_count"], "1");
    EXPECT_EQ(keys["nextn_predict_layers"], "1");
    EXPECT_TRUE(keys.contains("expert_weights_scale"));
    EXPECT_EQ(m.bytes_by_class.at("nextn").n_tensors, 4);        // eh_proj, enorm, hnorm, shared_head_norm
    EXPECT_EQ(m.bytes_by_class.at("router").n_tensors, 3 * 2);   // ffn_gate_inp and exp_probs_b, 3 MoE blocks
    EXPECT_EQ(m.bytes_by_class.at("ffn").n_tensors, 3);          // the dense layer's gate, up, down
    EXPECT_FALSE(m.bytes_by_class.contains("other"));
}

// ---- deepseek2: latent attention keys, both KV up-projection layouts, group-limited routing ----

gguf::reader edited(gguf::writer w, const std::vector<std::string>& erase = {},
                    const std::vector<std::pair<std::string, gguf::value>>& set = {}) {
    for (const auto& k : erase) w.erase(k);
    for (const auto& [k, v] : set) w.set(k, v);
    return gguf::reader::from_bytes(w.write_to_memory(), "ds2.gguf");
}

gguf::reader deepseek2_file(const make_model::model_spec& s, const std::vector<std::string>& erase = {},
                            const std::vector<std::pair<std::string, gguf::value>>& set = {}) {
    return edited(make_model::build_model(s), erase, set);
}

TEST(Deepseek2Hparams, KeysAsWrittenAndBothKvLayouts) {
    make_model::model_spec s = make_model::preset("tiny", arch::deepseek2);
    const gguf::reader f = deepseek2_file(s);
    const hparams hp = read_hparams(f);
    EXPECT_EQ(hp.n_lora_q, 64);
    EXPECT_EQ(hp.n_lora_kv, 64);
    EXPECT_TRUE(hp.kv_b_split);
    EXPECT_EQ(hp.head_dim, 64);  // key_length_mla, not key_length (kv_lora_rank + n_rot = 96)
    EXPECT_EQ(hp.head_dim_v, 32);
    EXPECT_EQ(hp.n_rot, 32);
    EXPECT_EQ(hp.kv_heads(), 1);
    EXPECT_EQ(hp.kv_head_dim(), 96);
    EXPECT_EQ(hp.n_layer_dense_lead, 1);
    EXPECT_EQ(hp.n_expert_shared, 1);
    EXPECT_EQ(hp.n_ff_shexp, s.n_ff_exp);
    EXPECT_EQ(hp.n_expert_groups, 4);
    EXPECT_EQ(hp.n_group_used, 2);
    EXPECT_EQ(hp.gating, gating_func::sigmoid);
    EXPECT_FLOAT_EQ(hp.kq_scale, 1.0f / std::sqrt(64.0f));
    const model_weights w = bind_weights(f, hp);
    EXPECT_TRUE(w.layers[1].wq_a.present());
    EXPECT_FALSE(w.layers[1].wq.present());
    EXPECT_EQ(w.layers[1].wk_b.n_rows, 4 * 64);
    EXPECT_NE(w.layers[1].exp_probs_b, nullptr);

    // The Lite form: no q_lora_rank (absent or 0: a plain attn_q), one attn_kv_b whose per-head sizes
    // are key_length / value_length, every head a kv head; softmax when expert_gating_func is absent.
    s.n_lora_q = 0;
    s.kv_b_split = false;
    s.exp_probs_b = false;
    const gguf::reader lite = deepseek2_file(s, {"deepseek2.attention.q_lora_rank", "deepseek2.expert_gating_func"});
    const hparams lh = read_hparams(lite);
    EXPECT_EQ(lh.n_lora_q, 0);
    EXPECT_FALSE(lh.kv_b_split);
    EXPECT_EQ(lh.head_dim, 64);
    EXPECT_EQ(lh.head_dim_v, 32);
    EXPECT_EQ(lh.n_head_kv, 4);
    EXPECT_EQ(lh.gating, gating_func::softmax);
    const model_weights lw = bind_weights(lite, lh);
    EXPECT_TRUE(lw.layers[1].wq.present());
    EXPECT_EQ(lw.layers[1].exp_probs_b, nullptr);
    EXPECT_EQ(lw.layers[1].v_b_step, 32 + 32);  // per head: 32 key rows, then 32 value rows
    EXPECT_EQ(lw.layers[1].v_b_row0, 32);
    EXPECT_EQ(lw.layers[1].wk_b.m.type, formats::ggml_type::F32);  // the key rows, transposed at load
}

TEST(Deepseek2Hparams, YarnLogMultiplierScalesTheAttention) {
    make_model::model_spec s = make_model::preset("tiny", arch::deepseek2);
    s.rope_scaling = make_model::rope_scaling_type::yarn;
    s.rope_factor = 4.0f;
    s.rope_yarn_log_mul = 0.1f * 0.707f;  // files carry 0.1 * mscale_all_dim
    const hparams hp = read_hparams(deepseek2_file(s));
    const float ln4 = std::log(4.0f);
    const float mscale = 1.0f + 0.1f * 0.707f * ln4;
    EXPECT_NEAR(hp.rope_yarn_log_mul, 0.707f, 1e-6f);
    EXPECT_NEAR(hp.kq_scale, mscale * mscale / std::sqrt(64.0f), 1e-6f);
    EXPECT_NEAR(kernels::rope_mscale(hp.rope), 1.0f, 1e-6f);  // YaRN's own cos/sin factor cancelled
    // Without the multiplier the rotation keeps YaRN's factor and the scale carries its square.
    s.rope_yarn_log_mul = 0.0f;
    const hparams plain = read_hparams(deepseek2_file(s));
    EXPECT_NEAR(kernels::rope_mscale(plain.rope), 1.0f + 0.1f * ln4, 1e-6f);
    EXPECT_NEAR(plain.kq_scale, (1.0f + 0.1f * ln4) * (1.0f + 0.1f * ln4) / std::sqrt(64.0f), 1e-6f);
}

TEST(Deepseek2Hparams, BadOrMissingKeysNameTheKey) {
    const gguf::writer base = test::baked(make_model::build_model(make_model::preset("tiny", arch::deepseek2)));
    const std::string p = "deepseek2.";
    auto has = [](const std::string& msg, const std::string& part) {
        EXPECT_NE(msg.find(part), std::string::npos) << msg;
    };
    has(load_error(edited(base, {p + "attention.kv_lora_rank"})), "'deepseek2.attention.kv_lora_rank' is missing");
    has(load_error(edited(base, {p + "expert_shared_count"})), "'deepseek2.expert_shared_count' is missing");
    has(load_error(edited(base, {p + "attention.value_length_mla"})), "only one of deepseek2.attention.key_length_mla");
    has(load_error(edited(base, {}, {{p + "attention.key_length", gguf::value::u32(64)}})),
        "deepseek2.attention.key_length 64 and value_length 64 must be kv_lora_rank + rope.dimension_count = 96");
    has(load_error(edited(base, {}, {{p + "rope.dimension_count", gguf::value::u32(64)}})),
        "rope.dimension_count 64 must be even and below the query/key head size 64");
    has(load_error(edited(base, {}, {{p + "expert_group_count", gguf::value::u32(3)}})),
        "deepseek2.expert_group_count is 3, which must split the 16 experts");
    has(load_error(edited(base, {}, {{p + "expert_group_used_count", gguf::value::u32(4)}})),
        "deepseek2.expert_group_used_count is 4");
    // 4 experts used out of one group of 4 fit; out of one group of 2 (8 groups) they do not.
    has(load_error(edited(base, {}, {{p + "expert_group_count", gguf::value::u32(8)},
                                          {p + "expert_group_used_count", gguf::value::u32(1)}})),
        "hold the experts used");
    // A layout's tensors follow the keys: attn_k_b files without the *_mla keys look for attn_kv_b.
    has(load_error(edited(base, {p + "attention.key_length_mla", p + "attention.value_length_mla"},
                                  {{p + "attention.key_length", gguf::value::u32(64)},
                                   {p + "attention.value_length", gguf::value::u32(32)}})),
        "'blk.0.attn_kv_b.weight' is missing");
}

TEST(Deepseek2Hparams, InfoSummaryShowsTheKeys) {
    const model_summary m = summarize(file_with(make_model::preset("tiny", arch::deepseek2)));
    std::map<std::string, std::string> keys(m.hparams.begin(), m.hparams.end());
    EXPECT_EQ(keys["attention.q_lora_rank"], "64");
    EXPECT_EQ(keys["attention.kv_lora_rank"], "64");
    EXPECT_EQ(keys["attention.key_length_mla"], "64");
    EXPECT_EQ(keys["expert_group_count"], "4");
    EXPECT_EQ(keys["expert_group_used_count"], "2");
    EXPECT_EQ(keys["rope.dimension_count"], "32");
    EXPECT_FALSE(m.bytes_by_class.contains("other"));
}

}  // namespace
}  // namespace strata::engine
