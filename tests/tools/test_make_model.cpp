// strata-make-model: round trips per architecture, determinism, tokenizer and shape errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include <tbb/global_control.h>

#include "formats/quant.hpp"
#include "generate.hpp"
#include "gguf/gguf_reader.hpp"
#include "model_spec.hpp"

namespace strata::make_model {
namespace {

using formats::ggml_type;

gguf::reader generate(const model_spec& s) { return gguf::reader::from_bytes(build_model(s).write_to_memory()); }

model_spec tiny(arch a) {
    model_spec s = preset("tiny");
    s.architecture = a;
    return s;
}

void expect_tensor(const gguf::reader& r, const std::string& name, std::vector<int64_t> ne, ggml_type type) {
    const gguf::tensor_info* t = r.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->ne, ne) << name;
    EXPECT_EQ(t->type, type) << name;
}

TEST(MakeModel, Qwen3MoeHasLlamaCppNamesAndShapes) {
    const model_spec s = tiny(arch::qwen3moe);
    const gguf::reader r = generate(s);
    EXPECT_EQ(r.at("general.architecture").as_string(), "qwen3moe");
    EXPECT_EQ(r.at("qwen3moe.block_count").as_u64(), 2u);
    EXPECT_EQ(r.at("qwen3moe.embedding_length").as_u64(), 256u);
    EXPECT_EQ(r.at("qwen3moe.expert_count").as_u64(), 8u);
    EXPECT_EQ(r.at("qwen3moe.expert_used_count").as_u64(), 2u);
    EXPECT_EQ(r.at("qwen3moe.expert_feed_forward_length").as_u64(), 256u);
    EXPECT_EQ(r.at("qwen3moe.attention.key_length").as_u64(), 64u);
    expect_tensor(r, "token_embd.weight", {256, 512}, ggml_type::Q8_0);
    expect_tensor(r, "blk.1.attn_q.weight", {256, 256}, ggml_type::Q8_0);
    expect_tensor(r, "blk.1.attn_k.weight", {256, 128}, ggml_type::Q8_0);
    expect_tensor(r, "blk.1.attn_q_norm.weight", {64}, ggml_type::F32);
    expect_tensor(r, "blk.0.ffn_gate_inp.weight", {256, 8}, ggml_type::F32);
    expect_tensor(r, "blk.0.ffn_gate_exps.weight", {256, 256, 8}, ggml_type::Q4_K);
    expect_tensor(r, "blk.0.ffn_down_exps.weight", {256, 256, 8}, ggml_type::Q4_K);
    expect_tensor(r, "output.weight", {256, 512}, ggml_type::Q6_K);
    EXPECT_EQ(r.find_tensor("blk.0.attn_q.bias"), nullptr);
    EXPECT_EQ(r.tensors().size(), 1u + 2u * 12u + 2u);
}

TEST(MakeModel, Qwen2MoeHasBiasesAndSharedExpert) {
    const gguf::reader r = generate(tiny(arch::qwen2moe));
    EXPECT_EQ(r.at("general.architecture").as_string(), "qwen2moe");
    EXPECT_EQ(r.at("qwen2moe.expert_shared_feed_forward_length").as_u64(), 256u);
    expect_tensor(r, "blk.0.attn_q.bias", {256}, ggml_type::F32);
    expect_tensor(r, "blk.0.attn_v.bias", {128}, ggml_type::F32);
    expect_tensor(r, "blk.0.ffn_gate_inp_shexp.weight", {256}, ggml_type::F32);
    expect_tensor(r, "blk.0.ffn_down_shexp.weight", {256, 256}, ggml_type::Q8_0);
    EXPECT_EQ(r.find_tensor("blk.0.attn_q_norm.weight"), nullptr);
}

TEST(MakeModel, Glm4MoeHasLlamaCppKeysNamesAndShapes) {
    model_spec s = preset("tiny", arch::glm4moe);
    s.n_layer_nextn = 1;
    const gguf::reader r = generate(s);
    const std::string p = "glm4moe.";
    EXPECT_EQ(r.at("general.architecture").as_string(), "glm4moe");
    EXPECT_EQ(r.at(p + "block_count").as_u64(), 4u);  // 3 evaluated + 1 next-token-prediction layer
    EXPECT_EQ(r.at(p + "nextn_predict_layers").as_u64(), 1u);
    EXPECT_EQ(r.at(p + "leading_dense_block_count").as_u64(), 1u);
    EXPECT_EQ(r.at(p + "feed_forward_length").as_u64(), 512u);
    EXPECT_EQ(r.at(p + "expert_feed_forward_length").as_u64(), 256u);
    EXPECT_EQ(r.at(p + "expert_shared_count").as_u64(), 1u);
    EXPECT_EQ(r.at(p + "expert_gating_func").as_u64(), 2u);
    EXPECT_TRUE(r.at(p + "expert_weights_norm").as_bool());
    EXPECT_EQ(r.at(p + "expert_weights_scale").as_f64(), 2.5);
    EXPECT_EQ(r.at(p + "rope.dimension_count").as_u64(), 32u);  // half of the 64-wide heads
    expect_tensor(r, "blk.0.post_attention_norm.weight", {256}, ggml_type::F32);
    expect_tensor(r, "blk.0.ffn_gate.weight", {256, 512}, ggml_type::Q8_0);
    expect_tensor(r, "blk.0.ffn_down.weight", {512, 256}, ggml_type::Q8_0);
    EXPECT_EQ(r.find_tensor("blk.0.ffn_gate_inp.weight"), nullptr);
    expect_tensor(r, "blk.1.attn_q.bias", {256}, ggml_type::F32);
    expect_tensor(r, "blk.1.attn_k_norm.weight", {64}, ggml_type::F32);
    expect_tensor(r, "blk.1.ffn_gate_inp.weight", {256, 8}, ggml_type::F32);
    expect_tensor(r, "blk.1.exp_probs_b.bias", {8}, ggml_type::F32);
    expect_tensor(r, "blk.2.ffn_up_exps.weight", {256, 256, 8}, ggml_type::Q4_K);
    expect_tensor(r, "blk.2.ffn_down_shexp.weight", {256, 256}, ggml_type::Q8_0);
    EXPECT_EQ(r.find_tensor("blk.2.ffn_gate_inp_shexp.weight"), nullptr);  // no sigmoid gate, unlike qwen2moe
    expect_tensor(r, "blk.3.nextn.eh_proj.weight", {512, 256}, ggml_type::Q8_0);
    expect_tensor(r, "blk.3.nextn.shared_head_norm.weight", {256}, ggml_type::F32);

    // bench: GLM-4.5 at half width, its expert count and expert-to-embedding ratio kept.
    const model_spec b = preset("bench", arch::glm4moe);
    EXPECT_EQ(b.n_expert, 160);
    EXPECT_EQ(b.n_ff_exp * 5120, 1536 * b.n_embd);
    EXPECT_THROW(build_model([] {
                     model_spec d = preset("tiny", arch::glm4moe);
                     d.n_layer_dense_lead = 3;
                     return d;
                 }()),
                 std::invalid_argument);
}

TEST(MakeModel, Deepseek2HasLlamaCppKeysNamesAndShapesInBothLayouts) {
    const model_spec s = preset("tiny", arch::deepseek2);
    const gguf::reader r = generate(s);
    const std::string p = "deepseek2.";
    EXPECT_EQ(r.at("general.architecture").as_string(), "deepseek2");
    EXPECT_EQ(r.at(p + "attention.q_lora_rank").as_u64(), 64u);
    EXPECT_EQ(r.at(p + "attention.kv_lora_rank").as_u64(), 64u);
    EXPECT_EQ(r.at(p + "attention.head_count_kv").as_u64(), 1u);
    EXPECT_EQ(r.at(p + "attention.key_length").as_u64(), 96u);  // llama.cpp's cache row: latent + RoPE key
    EXPECT_EQ(r.at(p + "attention.value_length").as_u64(), 64u);
    EXPECT_EQ(r.at(p + "attention.key_length_mla").as_u64(), 64u);
    EXPECT_EQ(r.at(p + "attention.value_length_mla").as_u64(), 32u);
    EXPECT_EQ(r.at(p + "rope.dimension_count").as_u64(), 32u);
    EXPECT_EQ(r.at(p + "expert_group_count").as_u64(), 4u);
    EXPECT_EQ(r.at(p + "expert_group_used_count").as_u64(), 2u);
    EXPECT_EQ(r.at(p + "expert_gating_func").as_u64(), 2u);
    EXPECT_EQ(r.at(p + "leading_dense_block_count").as_u64(), 1u);
    EXPECT_EQ(r.at(p + "expert_shared_count").as_u64(), 1u);
    expect_tensor(r, "blk.0.attn_q_a.weight", {256, 64}, ggml_type::Q8_0);
    expect_tensor(r, "blk.0.attn_q_a_norm.weight", {64}, ggml_type::F32);
    expect_tensor(r, "blk.0.attn_q_b.weight", {64, 4 * 64}, ggml_type::Q8_0);
    expect_tensor(r, "blk.0.attn_kv_a_mqa.weight", {256, 64 + 32}, ggml_type::Q8_0);
    expect_tensor(r, "blk.0.attn_kv_a_norm.weight", {64}, ggml_type::F32);
    expect_tensor(r, "blk.0.attn_k_b.weight", {32, 64, 4}, ggml_type::Q8_0);
    expect_tensor(r, "blk.0.attn_v_b.weight", {64, 32, 4}, ggml_type::Q8_0);
    expect_tensor(r, "blk.0.attn_output.weight", {4 * 32, 256}, ggml_type::Q8_0);
    expect_tensor(r, "blk.0.ffn_norm.weight", {256}, ggml_type::F32);
    expect_tensor(r, "blk.0.ffn_gate.weight", {256, 512}, ggml_type::Q8_0);
    expect_tensor(r, "blk.1.exp_probs_b.bias", {16}, ggml_type::F32);
    expect_tensor(r, "blk.1.ffn_gate_exps.weight", {256, 256, 16}, ggml_type::Q4_K);
    expect_tensor(r, "blk.1.ffn_up_shexp.weight", {256, 256}, ggml_type::Q8_0);
    EXPECT_EQ(r.find_tensor("blk.0.attn_q.weight"), nullptr);
    EXPECT_EQ(r.find_tensor("blk.0.attn_kv_b.weight"), nullptr);

    // The Lite form and the older layout: a plain attn_q, one attn_kv_b, per-head key/value lengths.
    model_spec lite = s;
    lite.n_lora_q = 0;
    lite.kv_b_split = false;
    lite.exp_probs_b = false;
    const gguf::reader l = generate(lite);
    EXPECT_EQ(l.at(p + "attention.q_lora_rank").as_u64(), 0u);
    EXPECT_EQ(l.at(p + "attention.head_count_kv").as_u64(), 4u);
    EXPECT_EQ(l.at(p + "attention.key_length").as_u64(), 64u);
    EXPECT_EQ(l.at(p + "attention.value_length").as_u64(), 32u);
    EXPECT_EQ(l.find(p + "attention.key_length_mla"), nullptr);
    expect_tensor(l, "blk.0.attn_q.weight", {256, 4 * 64}, ggml_type::Q8_0);
    expect_tensor(l, "blk.0.attn_kv_b.weight", {64, 4 * (32 + 32)}, ggml_type::Q8_0);
    EXPECT_EQ(l.find_tensor("blk.0.attn_q_a.weight"), nullptr);
    EXPECT_EQ(l.find_tensor("blk.0.attn_k_b.weight"), nullptr);
    EXPECT_EQ(l.find_tensor("blk.1.exp_probs_b.bias"), nullptr);
    EXPECT_EQ(l.find(p + "nextn_predict_layers"), nullptr);

    // An MTP block after the trunk: counted in block_count, a latent-attention MoE layer with the nextn tensors.
    model_spec mtp = s;
    mtp.n_layer_nextn = 1;
    const gguf::reader m = generate(mtp);
    EXPECT_EQ(m.at(p + "block_count").as_u64(), 4u);
    EXPECT_EQ(m.at(p + "nextn_predict_layers").as_u64(), 1u);
    expect_tensor(m, "blk.3.attn_kv_a_mqa.weight", {256, 64 + 32}, ggml_type::Q8_0);
    expect_tensor(m, "blk.3.ffn_gate_exps.weight", {256, 256, 16}, ggml_type::Q4_K);
    expect_tensor(m, "blk.3.nextn.eh_proj.weight", {512, 256}, ggml_type::Q8_0);
    expect_tensor(m, "blk.3.nextn.hnorm.weight", {256}, ggml_type::F32);

    // bench: DeepSeek-V3's head and latent sizes.
    const model_spec b = preset("bench", arch::deepseek2);
    EXPECT_EQ(b.n_lora_kv, 512);
    EXPECT_EQ(b.head_dim - b.n_rot, 128);
    EXPECT_EQ(b.n_rot, 64);
    EXPECT_THROW(build_model([&] {
                     model_spec d = s;
                     d.n_group_used = 4;  // all 4 groups
                     return d;
                 }()),
                 std::invalid_argument);
    EXPECT_THROW(build_model([&] {
                     model_spec d = s;
                     d.n_rot = 64;  // no part of the head left without RoPE
                     return d;
                 }()),
                 std::invalid_argument);
}

TEST(MakeModel, MixtralIsLlamaArchitectureWithBothExpertNamings) {
    model_spec s = tiny(arch::mixtral);
    gguf::reader merged = generate(s);
    EXPECT_EQ(merged.at("general.architecture").as_string(), "llama");
    EXPECT_EQ(merged.at("llama.expert_count").as_u64(), 8u);
    EXPECT_EQ(merged.at("llama.feed_forward_length").as_u64(), 256u);
    EXPECT_EQ(merged.at("llama.rope.dimension_count").as_u64(), 64u);
    expect_tensor(merged, "blk.0.ffn_up_exps.weight", {256, 256, 8}, ggml_type::Q4_K);
    s.split_experts = true;
    gguf::reader split = generate(s);
    expect_tensor(split, "blk.1.ffn_gate.7.weight", {256, 256}, ggml_type::Q4_K);
    expect_tensor(split, "blk.0.ffn_down.0.weight", {256, 256}, ggml_type::Q4_K);
    EXPECT_EQ(split.find_tensor("blk.0.ffn_up_exps.weight"), nullptr);
    s.architecture = arch::qwen3moe;
    EXPECT_THROW(build_model(s), std::invalid_argument);
}

// --fused-gate-up: one ffn_gate_up_exps per layer holding, per expert, the bytes ffn_gate_exps and then
// ffn_up_exps hold in the file without it.
TEST(MakeModel, FusedGateUpHoldsTheSeparateTensorsValues) {
    model_spec s = tiny(arch::qwen3moe);
    s.n_layer = 1;
    const gguf::reader split = generate(s);
    s.fused_gate_up = true;
    const gguf::reader fused = generate(s);
    EXPECT_EQ(fused.find_tensor("blk.0.ffn_gate_exps.weight"), nullptr);
    const gguf::tensor_info* gate = split.find_tensor("blk.0.ffn_gate_exps.weight");
    const gguf::tensor_info* up = split.find_tensor("blk.0.ffn_up_exps.weight");
    ASSERT_TRUE(gate && up);
    expect_tensor(fused, "blk.0.ffn_gate_up_exps.weight", {gate->ne[0], 2 * gate->ne[1], gate->ne[2]}, gate->type);
    const auto g = split.tensor_data(*gate), u = split.tensor_data(*up);
    const auto f = fused.tensor_data(*fused.find_tensor("blk.0.ffn_gate_up_exps.weight"));
    const size_t part = g.size() / static_cast<size_t>(gate->ne[2]);
    ASSERT_EQ(f.size(), 2 * g.size());
    for (size_t e = 0; e < static_cast<size_t>(gate->ne[2]); ++e) {
        EXPECT_TRUE(std::equal(g.begin() + e * part, g.begin() + (e + 1) * part, f.begin() + 2 * e * part)) << e;
        EXPECT_TRUE(std::equal(u.begin() + e * part, u.begin() + (e + 1) * part, f.begin() + (2 * e + 1) * part)) << e;
    }
}

TEST(MakeModel, SameSeedSameBytesWhateverTheThreads) {
    const model_spec s = tiny(arch::qwen3moe);
    const std::vector<uint8_t> a = build_model(s).write_to_memory();
    std::vector<uint8_t> b;
    {
        tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
        b = build_model(s).write_to_memory();
    }
    EXPECT_TRUE(a == b);
    model_spec other = s;
    other.seed = s.seed + 1;
    EXPECT_FALSE(a == build_model(other).write_to_memory());
}

TEST(MakeModel, WeightsAreFiniteAndScaled) {
    const gguf::reader r = generate(tiny(arch::qwen3moe));
    for (const auto& t : r.tensors()) {
        std::vector<float> v(static_cast<size_t>(t.n_elements));
        formats::dequantize_row(t.type, r.tensor_data(t).data(), v.data(), t.n_elements);
        double sum2 = 0;
        for (float x : v) {
            ASSERT_TRUE(std::isfinite(x)) << t.name;
            sum2 += double(x) * x;
        }
        const double rms = std::sqrt(sum2 / double(v.size()));
        if (t.name.find("_norm") != std::string::npos) {
            EXPECT_NEAR(rms, 1.0, 0.1) << t.name;
        } else if (t.name.find("exps") != std::string::npos || t.name.find("attn_q.weight") != std::string::npos) {
            EXPECT_NEAR(rms, 1.0 / std::sqrt(double(t.ne[0])), 0.25 / std::sqrt(double(t.ne[0]))) << t.name;
        }
    }
}

TEST(MakeModel, TokenizerIsAConsistentByteLevelBpe) {
    model_spec s = tiny(arch::qwen3moe);
    s.n_vocab = 4096;  // the demo's vocabulary on tiny weights
    const gguf::reader r = generate(s);
    EXPECT_EQ(r.at("tokenizer.ggml.model").as_string(), "gpt2");
    EXPECT_EQ(r.at("tokenizer.ggml.pre").as_string(), "qwen2");
    const auto& tokens = r.at("tokenizer.ggml.tokens").as_array();
    const auto& types = r.at("tokenizer.ggml.token_type").as_array();
    const auto& merges = r.at("tokenizer.ggml.merges").as_array();
    ASSERT_EQ(tokens.size(), 4096u);
    ASSERT_EQ(types.size(), tokens.size());
    std::set<std::string> vocab;
    for (const auto& t : tokens) EXPECT_TRUE(vocab.insert(t.as_string()).second) << "duplicate " << t.as_string();
    EXPECT_GT(merges.size(), 500u);
    for (const auto& m : merges) {
        const std::string s = m.as_string();
        const size_t sp = s.find(' ');
        ASSERT_NE(sp, std::string::npos) << s;
        const std::string left = s.substr(0, sp), right = s.substr(sp + 1);
        EXPECT_TRUE(vocab.count(left) && vocab.count(right) && vocab.count(left + right)) << s;
    }
    EXPECT_TRUE(vocab.count("Ġthe")) << "a common word with its leading space should be one token";
    EXPECT_TRUE(vocab.count("Hello"));
    const auto eos = r.at("tokenizer.ggml.eos_token_id").as_u64();
    EXPECT_EQ(tokens[eos].as_string(), "<|im_end|>");
    EXPECT_EQ(tokens[eos - 1].as_string(), "<|im_start|>");
    EXPECT_EQ(types[eos].as_i64(), 3);
    EXPECT_NE(r.at("tokenizer.chat_template").as_string().find("<|im_start|>"), std::string::npos);
}

TEST(MakeModel, AddedTokensAreUserDefinedAfterTheSpecials) {
    model_spec s = tiny(arch::qwen3moe);
    s.added_tokens = {"<tool_call>\n{\"name\": \"f\", ", "It is sunny."};
    const gguf::reader r = generate(s);
    const auto& tokens = r.at("tokenizer.ggml.tokens").as_array();
    const auto& types = r.at("tokenizer.ggml.token_type").as_array();
    ASSERT_EQ(tokens.size(), 512u);  // the learned tokens make room
    EXPECT_EQ(tokens[510].as_string(), s.added_tokens[0]);
    EXPECT_EQ(tokens[511].as_string(), "It is sunny.");
    EXPECT_EQ(types[510].as_i64(), 4);  // user-defined
    EXPECT_EQ(types[511].as_i64(), 4);
    EXPECT_EQ(tokens[r.at("tokenizer.ggml.eos_token_id").as_u64()].as_string(), "<|im_end|>");
    s.added_tokens = {"It is sunny.", "It is sunny."};
    EXPECT_THROW(build_model(s), std::invalid_argument);
    s.added_tokens = {""};
    EXPECT_THROW(build_model(s), std::invalid_argument);
    s.added_tokens = {"x y"};
    s.tokenizer = tokenizer_kind::llama;
    EXPECT_THROW(build_model(s), std::invalid_argument);
}

TEST(MakeModel, LlamaTokenizerIsSentencePieceStyle) {
    model_spec s = tiny(arch::qwen3moe);
    s.tokenizer = tokenizer_kind::llama;
    const gguf::reader r = generate(s);
    EXPECT_EQ(r.at("tokenizer.ggml.model").as_string(), "llama");
    EXPECT_EQ(r.find("tokenizer.ggml.merges"), nullptr);
    const auto& tokens = r.at("tokenizer.ggml.tokens").as_array();
    const auto& types = r.at("tokenizer.ggml.token_type").as_array();
    const auto& scores = r.at("tokenizer.ggml.scores").as_array();
    ASSERT_EQ(tokens.size(), 512u);
    ASSERT_EQ(types.size(), tokens.size());
    ASSERT_EQ(scores.size(), tokens.size());
    EXPECT_EQ(tokens[0].as_string(), "<unk>");
    EXPECT_EQ(tokens[1].as_string(), "<s>");
    EXPECT_EQ(tokens[2].as_string(), "</s>");
    EXPECT_EQ(types[1].as_i64(), 3);
    EXPECT_EQ(tokens[3 + 0x0A].as_string(), "<0x0A>");
    EXPECT_EQ(types[3 + 0x0A].as_i64(), 6);
    EXPECT_EQ(r.at("tokenizer.ggml.bos_token_id").as_u64(), 1u);
    EXPECT_EQ(r.at("tokenizer.ggml.eos_token_id").as_u64(), 2u);
    EXPECT_TRUE(r.at("tokenizer.ggml.add_bos_token").as_bool());
    std::set<std::string> vocab;
    for (const auto& t : tokens) EXPECT_TRUE(vocab.insert(t.as_string()).second) << "duplicate " << t.as_string();
    EXPECT_TRUE(vocab.count("\xE2\x96\x81the")) << "a common word with its leading space (U+2581) is one piece";
    // Earlier pieces score higher (merge order).
    EXPECT_GT(scores[300].as_f64(), scores[301].as_f64());
    EXPECT_NE(r.at("tokenizer.chat_template").as_string().find("[INST]"), std::string::npos);
}

TEST(MakeModel, MixtralDefaultsToTheLlamaTokenizer) {
    EXPECT_EQ(generate(tiny(arch::mixtral)).at("tokenizer.ggml.model").as_string(), "llama");
    model_spec s = tiny(arch::mixtral);
    s.tokenizer = tokenizer_kind::gpt2;
    EXPECT_EQ(generate(s).at("tokenizer.ggml.model").as_string(), "gpt2");
    EXPECT_EQ(parse_tokenizer("llama"), tokenizer_kind::llama);
    EXPECT_THROW(parse_tokenizer("wordpiece"), std::invalid_argument);
}

TEST(MakeModel, ShapeThatDoesNotFitTheTypeNamesTheTensor) {
    model_spec s = tiny(arch::qwen3moe);
    s.n_embd = 320;  // not a multiple of Q4_K's 256
    try {
        build_model(s);
        FAIL();
    } catch (const std::invalid_argument& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("320"), std::string::npos) << msg;
        EXPECT_NE(msg.find("Q4_K"), std::string::npos) << msg;
        EXPECT_NE(msg.find("ffn_gate_exps"), std::string::npos) << msg;
    }
    s = tiny(arch::qwen3moe);
    s.n_head_kv = 3;
    EXPECT_THROW(build_model(s), std::invalid_argument);
    EXPECT_THROW(preset("huge"), std::invalid_argument);
    EXPECT_THROW(parse_arch("gpt2"), std::invalid_argument);
}

TEST(MakeModel, RopeScalingKeysAsLlamaCppsConverterWrites) {
    model_spec s = tiny(arch::qwen3moe);
    EXPECT_EQ(generate(s).find("qwen3moe.rope.scaling.type"), nullptr);  // no scaling: no keys
    s.rope_scaling = parse_rope_scaling("yarn");
    s.rope_factor = 4.0f;
    s.n_ctx = 131072;
    gguf::reader r = generate(s);
    EXPECT_EQ(r.at("qwen3moe.rope.scaling.type").as_string(), "yarn");
    EXPECT_EQ(r.at("qwen3moe.rope.scaling.factor").as_f64(), 4.0);
    EXPECT_EQ(r.at("qwen3moe.rope.scaling.original_context_length").as_u64(), 32768u);  // ctx / factor
    EXPECT_EQ(r.at("qwen3moe.context_length").as_u64(), 131072u);
    s.rope_orig_ctx = 40000;
    EXPECT_EQ(generate(s).at("qwen3moe.rope.scaling.original_context_length").as_u64(), 40000u);

    s = tiny(arch::mixtral);
    s.rope_scaling = rope_scaling_type::linear;
    s.rope_factor = 2.0f;
    r = generate(s);
    EXPECT_EQ(r.at("llama.rope.scaling.type").as_string(), "linear");
    EXPECT_EQ(r.at("llama.rope.scaling.factor").as_f64(), 2.0);
    EXPECT_EQ(r.find("llama.rope.scaling.original_context_length"), nullptr);
    s.rope_factor = 0.0f;
    EXPECT_THROW(build_model(s), std::invalid_argument);
    EXPECT_THROW(parse_rope_scaling("longrope"), std::invalid_argument);
}

TEST(MakeModel, FileTypeIsLlamaCppsValueForTheDominantWeightType) {
    // llama.cpp's enum llama_ftype: Q4_K files are MOSTLY_Q4_K_M (15), Q8_0 7, BF16 32, IQ4_XS 30, Q5_0 8.
    model_spec s = tiny(arch::qwen3moe);
    EXPECT_EQ(generate(s).at("general.file_type").as_u64(), 15u);
    const std::pair<ggml_type, uint64_t> cases[] = {
        {ggml_type::Q8_0, 7}, {ggml_type::BF16, 32}, {ggml_type::IQ4_XS, 30}};
    for (const auto& [type, ftype] : cases) {
        s.type_experts = type;
        EXPECT_EQ(generate(s).at("general.file_type").as_u64(), ftype) << formats::info(type).name;
    }
    s = tiny(arch::mixtral);
    s.type_experts = ggml_type::Q5_0;
    EXPECT_EQ(generate(s).at("general.file_type").as_u64(), 8u);
}

TEST(MakeModel, DominantTypeCountsBytesOfMatricesOnly) {
    const std::vector<tensor_spec> t = {
        {"norm", ggml_type::F32, {1 << 20}, init::norm, 1.0f},           // a vector: not counted
        {"small", ggml_type::F16, {256, 64}, init::matrix, 1.0f},        // 32 KiB
        {"large", ggml_type::Q4_0, {256, 256, 2}, init::matrix, 1.0f}};  // 72 KiB
    EXPECT_EQ(dominant_type(t), ggml_type::Q4_0);
    EXPECT_EQ(dominant_type({t[0], t[1]}), ggml_type::F16);
    try {
        llama_file_type(ggml_type::Q8_K);
        FAIL() << "Q8_K has no llama.cpp file type";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("Q8_K"), std::string::npos) << e.what();
    }
}

TEST(MakeModel, DemoVocabularyIsMostlyLearnedTokens) {
    // Placeholders (unused type, <|reserved_N|>) are tokens a random model can still emit: the demo's
    // vocabulary size is one the built-in corpus fills, for both tokenizers.
    for (const tokenizer_kind kind : {tokenizer_kind::gpt2, tokenizer_kind::llama}) {
        model_spec s = preset("tiny");  // the demo's vocabulary on the tiny model's tensors
        s.n_vocab = preset("demo").n_vocab;
        s.tokenizer = kind;
        const gguf::reader r = generate(s);
        const auto& types = r.at("tokenizer.ggml.token_type").as_array();
        ASSERT_EQ(types.size(), static_cast<size_t>(s.n_vocab));
        const auto unused = std::count_if(types.begin(), types.end(), [](const gguf::value& t) { return t.as_i64() == 5; });
        EXPECT_LT(static_cast<double>(unused) / static_cast<double>(types.size()), 0.10)
            << unused << " of " << types.size() << " tokens are placeholders (tokenizer " << static_cast<int>(kind) << ")";
    }
}

}  // namespace
}  // namespace strata::make_model
