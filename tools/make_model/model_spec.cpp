#include "model_spec.hpp"
#include "qwen4exp_spec.hpp"

#include <cmath>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::make_model {

using formats::ggml_type;

std::string arch_name(arch a) {
    switch (a) {
        case arch::qwen3moe: return "qwen3moe";
        case arch::qwen2moe: return "qwen2moe";
        case arch::mixtral: return "mixtral";
        case arch::glm4moe: return "glm4moe";
        case arch::deepseek2: return "deepseek2";
        case arch::qwen35moe: return "qwen35moe";
        case arch::qwen3next: return "qwen3next";
        case arch::qwen4exp: return "qwen4exp";
    }
    return "?";
}

std::string gguf_architecture(arch a) { return a == arch::mixtral ? "llama" : arch_name(a); }

arch parse_arch(const std::string& name) {
    for (arch a : {arch::qwen3moe, arch::qwen2moe, arch::mixtral, arch::glm4moe, arch::deepseek2, arch::qwen35moe,
                   arch::qwen3next, arch::qwen4exp})
        if (arch_name(a) == name) return a;
    throw std::invalid_argument("unknown architecture '" + name +
                                "' (valid: qwen3moe, qwen2moe, mixtral, glm4moe, deepseek2, qwen35moe, qwen3next, qwen4exp)");
}

tokenizer_kind parse_tokenizer(const std::string& name) {
    if (name == "gpt2") return tokenizer_kind::gpt2;
    if (name == "llama") return tokenizer_kind::llama;
    throw std::invalid_argument("unknown tokenizer '" + name + "' (valid: gpt2, llama)");
}

rope_scaling_type parse_rope_scaling(const std::string& name) {
    if (name == "none") return rope_scaling_type::none;
    if (name == "linear") return rope_scaling_type::linear;
    if (name == "yarn") return rope_scaling_type::yarn;
    throw std::invalid_argument("unknown RoPE scaling '" + name + "' (valid: none, linear, yarn)");
}

tokenizer_kind resolve_tokenizer(const model_spec& spec) {
    if (spec.tokenizer != tokenizer_kind::arch_default) return spec.tokenizer;
    return spec.architecture == arch::mixtral ? tokenizer_kind::llama : tokenizer_kind::gpt2;
}

namespace {

// DeepSeek's layout on top of the generic preset: a leading dense layer, latent attention, grouped
// sigmoid routing with a correction bias, one shared expert (the fields' defaults are tiny's).
model_spec deepseek2_preset(const std::string& name, model_spec s) {
    s.n_head_kv = 1;  // as llama.cpp's MLA conversions write it: the cache holds one latent per position
    s.expert_weights_scale = 2.5f;
    if (name == "tiny") {
        s.n_layer = 3;
        s.n_expert = 16;
        s.n_expert_used = 4;
        s.n_rot = 32;
    } else if (name == "demo") {
        s.n_layer = 5;
        s.n_head = 8;
        s.head_dim = 96;
        s.n_rot = 32;
        s.head_dim_v = 64;
        s.n_lora_q = 128;
        s.n_lora_kv = 128;
        s.n_expert = 32;
        s.n_ff = 1024;
        s.n_expert_groups = 8;
        s.n_group_used = 4;
    } else {
        s.n_layer = 8;
        s.n_head = 16;
        s.head_dim = 192;
        s.n_rot = 64;
        s.head_dim_v = 128;
        s.n_lora_q = 512;
        s.n_lora_kv = 512;
        s.n_expert = 64;
        s.n_ff_exp = 512;
        s.n_ff = 5632;
        s.n_expert_groups = 8;
        s.n_group_used = 4;
        s.type_shexp = ggml_type::Q4_K;
        s.type_attn = ggml_type::Q8_0;  // attn_k_b rows are 128 wide, narrower than a K-quant block
    }
    return s;
}

// The hybrid Qwen families: three gated DeltaNet layers, then one gated attention layer whose heads
// rotate a quarter of their dims; bench is Qwen3.5-35B-A3B per layer (its published widths, head
// and expert counts) with 8 of its 40 layers.
model_spec hybrid_preset(const std::string& name, model_spec s) {
    s.rope_freq_base = 10000000.0f;
    if (name == "tiny") {
        s.n_layer = 4;
        s.n_rot = 16;
    } else if (name == "demo") {
        s.n_layer = 8;
        s.n_head = 8;
        s.n_head_kv = 2;
        s.head_dim = 128;
        s.n_rot = 32;
        s.ssm_d_state = 64;
        s.ssm_n_group = 4;
        s.ssm_dt_rank = 8;
        s.n_ff_exp = 256;
        s.n_ff_shexp = 256;
    } else {
        s.n_layer = 8;
        s.n_head = 16;
        s.n_head_kv = 2;
        s.head_dim = 256;
        s.n_rot = 64;
        s.ssm_d_state = 128;
        s.ssm_n_group = 16;
        s.ssm_dt_rank = 32;
        s.n_expert = 256;
        s.n_expert_used = 8;
        s.n_ff_exp = 512;
        s.n_ff_shexp = 512;
        s.n_ctx = 262144;
        s.type_attn = ggml_type::Q8_0;
        s.type_shexp = ggml_type::Q8_0;
    }
    return s;
}

}  // namespace

model_spec preset(const std::string& name, arch a) {
    model_spec s;
    s.architecture = a;
    if (name == "tiny") {
        s.name = "strata tiny";  // the defaults above
    } else if (name == "demo") {
        s.name = "strata demo";
        s.n_layer = 4;
        s.n_embd = 512;
        s.n_head = 8;
        s.n_head_kv = 4;
        s.head_dim = 64;
        s.n_expert = 16;
        s.n_expert_used = 4;
        s.n_ff_exp = 512;
        s.n_ff_shexp = 512;
        s.n_vocab = 2048;  // what the built-in corpus fills with learned tokens (no placeholders)
        s.n_ctx = 4096;
    } else if (name == "bench") {
        s.name = "strata bench";
        s.n_layer = 8;
        s.n_embd = 2048;
        s.n_head = 32;
        s.n_head_kv = 4;
        s.head_dim = 128;
        s.n_expert = 64;
        s.n_expert_used = 8;
        s.n_ff_exp = 768;
        s.n_ff_shexp = 2048;
        s.n_vocab = 32000;
        s.n_ctx = 4096;
        s.type_attn = ggml_type::Q4_K;
        s.type_shexp = ggml_type::Q4_K;
        s.type_embd = ggml_type::Q4_K;
    } else {
        throw std::invalid_argument("unknown preset '" + name + "' (valid: tiny, demo, bench)");
    }
    if (a == arch::deepseek2) return deepseek2_preset(name, s);
    if (a == arch::qwen35moe || a == arch::qwen3next) return hybrid_preset(name, s);
    if (a == arch::qwen4exp) return qwen4exp_preset(name, hybrid_preset(name, s));
    if (a != arch::glm4moe) return s;
    // One dense layer before the MoE ones, as GLM-4.5-Air; bench is GLM-4.5 at half its width, its
    // expert count and expert-to-embedding ratio (1536 / 5120) kept.
    if (name == "tiny") {
        s.n_layer = 3;
    } else if (name == "demo") {
        s.n_layer = 5;
        s.n_ff = 1024;
    } else {
        s.n_layer = 4;
        s.n_embd = 2560;
        s.n_head = 48;
        s.n_head_kv = 4;
        s.n_expert = 160;
        s.n_ff_exp = 768;
        s.n_ff = 6144;
        s.type_shexp = ggml_type::Q4_K;
    }
    return s;
}

namespace {

float matrix_scale(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

// A deepseek2 block's attention tensors, named and shaped as llama.cpp's loader expects them: the
// query through q_lora_rank (or a plain attn_q), the latent and the rotated key from attn_kv_a_mqa,
// and the per-head up-projection of the latent as attn_k_b + attn_v_b or as one attn_kv_b.
template <class Vec, class Matrix>
void mla_tensors(const model_spec& s, const std::string& b, Vec& vec, Matrix& matrix) {
    const int64_t n_embd = s.n_embd, n_head = s.n_head, hd = s.head_dim, nope = s.head_dim - s.n_rot;
    const int64_t lora_kv = s.n_lora_kv, hd_v = s.head_dim_v;
    if (s.n_lora_q > 0) {
        vec(b + "attn_q_a_norm.weight", s.n_lora_q, init::norm);
        matrix(b + "attn_q_a.weight", s.type_attn, {n_embd, int64_t{s.n_lora_q}});
        matrix(b + "attn_q_b.weight", s.type_attn, {int64_t{s.n_lora_q}, n_head * hd});
    } else {
        matrix(b + "attn_q.weight", s.type_attn, {n_embd, n_head * hd});
    }
    vec(b + "attn_kv_a_norm.weight", lora_kv, init::norm);
    matrix(b + "attn_kv_a_mqa.weight", s.type_attn, {n_embd, lora_kv + s.n_rot});
    if (s.kv_b_split) {
        matrix(b + "attn_k_b.weight", s.type_attn, {nope, lora_kv, n_head}, matrix_scale(lora_kv));
        matrix(b + "attn_v_b.weight", s.type_attn, {lora_kv, hd_v, n_head});
    } else {
        matrix(b + "attn_kv_b.weight", s.type_attn, {lora_kv, n_head * (nope + hd_v)});
    }
    matrix(b + "attn_output.weight", s.type_attn, {n_head * hd_v, n_embd});
}

// A gated DeltaNet layer's token mixer (llama.cpp's names and shapes): q, k, v through one attn_qkv and
// the output gate z through attn_gate (or qwen3next's older ssm_in holding per key head q, k, its value
// heads and their z), the depthwise conv over q|k|v, the decay and update-rate projections (ssm_alpha +
// ssm_beta, or qwen3next's ssm_ba holding per key head its value heads' beta then alpha), A as -exp(A_log).
template <class Vec, class Matrix>
void delta_net_tensors(const model_spec& s, const std::string& b, Vec& vec, Matrix& matrix) {
    const int64_t n_embd = s.n_embd, key_dim = int64_t{s.ssm_n_group} * s.ssm_d_state;
    const int64_t value_dim = int64_t{s.ssm_dt_rank} * s.ssm_d_state, conv_dim = 2 * key_dim + value_dim;
    if (s.ssm_in) {
        matrix(b + "ssm_in.weight", s.type_attn, {n_embd, conv_dim + value_dim});
    } else {
        matrix(b + "attn_qkv.weight", s.type_attn, {n_embd, conv_dim});
        matrix(b + "attn_gate.weight", s.type_attn, {n_embd, value_dim});
    }
    matrix(b + "ssm_conv1d.weight", formats::ggml_type::F32, {int64_t{s.ssm_conv_kernel}, conv_dim}, 0.5f);
    vec(b + "ssm_dt.bias", s.ssm_dt_rank, init::bias);
    vec(b + "ssm_a", s.ssm_dt_rank, init::decay);
    if (s.architecture == arch::qwen3next) {
        matrix(b + "ssm_ba.weight", s.type_attn, {n_embd, 2 * int64_t{s.ssm_dt_rank}});
    } else {
        matrix(b + "ssm_beta.weight", s.type_attn, {n_embd, int64_t{s.ssm_dt_rank}});
        matrix(b + "ssm_alpha.weight", s.type_attn, {n_embd, int64_t{s.ssm_dt_rank}});
    }
    vec(b + "ssm_norm.weight", s.ssm_d_state, init::norm);
    matrix(b + "ssm_out.weight", s.type_attn, {value_dim, n_embd});
}

}  // namespace

bool hybrid(arch a) { return a == arch::qwen35moe || a == arch::qwen3next || a == arch::qwen4exp; }

bool recurrent_layer(const model_spec& s, int il) {
    return hybrid(s.architecture) && il < s.n_layer && (il + 1) % s.full_attention_interval != 0;
}

std::vector<tensor_spec> tensor_specs(const model_spec& s) {
    const int64_t n_embd = s.n_embd, hd = s.head_dim, n_q = int64_t{s.n_head} * hd, n_kv = int64_t{s.n_head_kv} * hd;
    std::vector<tensor_spec> t;
    auto matrix = [&](std::string name, ggml_type type, std::vector<int64_t> ne, float scale = 0) {
        const float sc = scale > 0 ? scale : matrix_scale(ne[0]);
        t.push_back({std::move(name), type, std::move(ne), init::matrix, sc});
    };
    auto vec = [&](std::string name, int64_t n, init kind) {
        t.push_back({std::move(name), ggml_type::F32, {n}, kind, kind == init::norm ? 0.1f : 0.02f});
    };

    const bool glm = s.architecture == arch::glm4moe, ds = s.architecture == arch::deepseek2;
    const bool hy = hybrid(s.architecture);
    const int n_blocks = s.n_layer + (glm || ds || hy ? s.n_layer_nextn : 0);
    t.push_back({"token_embd.weight", s.type_embd, {n_embd, s.n_vocab}, init::embedding, 1.0f});
    for (int i = 0; i < n_blocks; ++i) {
        const std::string b = fmt::format("blk.{}.", i);
        const bool q4 = s.architecture == arch::qwen4exp;
        if (q4)
            qwen4exp_block_tensors(s, i, matrix, vec);
        else
            vec(b + "attn_norm.weight", n_embd, init::norm);
        if (ds) {
            mla_tensors(s, b, vec, matrix);
        } else if (recurrent_layer(s, i)) {
            delta_net_tensors(s, b, vec, matrix);
        } else if (hy) {  // gated attention: attn_q holds each head's query, then its output gate
            matrix(b + "attn_q.weight", s.type_attn, {n_embd, 2 * n_q});
            matrix(b + "attn_k.weight", s.type_attn, {n_embd, n_kv});
            matrix(b + "attn_v.weight", s.type_attn, {n_embd, n_kv});
            matrix(b + "attn_output.weight", s.type_attn, {n_q, n_embd});
            vec(b + "attn_q_norm.weight", hd, init::norm);
            vec(b + "attn_k_norm.weight", hd, init::norm);
        } else {
            matrix(b + "attn_q.weight", s.type_attn, {n_embd, n_q});
            matrix(b + "attn_k.weight", s.type_attn, {n_embd, n_kv});
            matrix(b + "attn_v.weight", s.type_attn, {n_embd, n_kv});
            matrix(b + "attn_output.weight", s.type_attn, {n_q, n_embd});
            if (s.architecture == arch::qwen3moe || (glm && s.qk_norm)) {
                vec(b + "attn_q_norm.weight", hd, init::norm);
                vec(b + "attn_k_norm.weight", hd, init::norm);
            }
            if (s.architecture == arch::qwen2moe || glm) {
                vec(b + "attn_q.bias", n_q, init::bias);
                vec(b + "attn_k.bias", n_kv, init::bias);
                vec(b + "attn_v.bias", n_kv, init::bias);
            }
        }
        if (!q4) vec(b + (glm || hy ? "post_attention_norm.weight" : "ffn_norm.weight"), n_embd, init::norm);
        if ((glm || ds) && i < s.n_layer_dense_lead) {
            matrix(b + "ffn_gate.weight", s.type_shexp, {n_embd, s.n_ff});
            matrix(b + "ffn_down.weight", s.type_shexp, {s.n_ff, n_embd});
            matrix(b + "ffn_up.weight", s.type_shexp, {n_embd, s.n_ff});
            continue;
        }
        // A wider router spread makes routing decisions clear rather than near-uniform.
        matrix(b + "ffn_gate_inp.weight", s.type_router, {n_embd, s.n_expert}, 4.0f * matrix_scale(n_embd));
        // A correction bias as large as the gaps between the top sigmoid scores, so that it changes selections.
        if (glm || (ds && s.exp_probs_b))
            t.push_back({b + "exp_probs_b.bias", ggml_type::F32, {s.n_expert}, init::bias, 0.1f});
        if (s.architecture == arch::mixtral && s.split_experts) {
            for (int e = 0; e < s.n_expert; ++e) {
                matrix(fmt::format("{}ffn_gate.{}.weight", b, e), s.type_experts, {n_embd, s.n_ff_exp});
                matrix(fmt::format("{}ffn_down.{}.weight", b, e), s.type_experts, {s.n_ff_exp, n_embd});
                matrix(fmt::format("{}ffn_up.{}.weight", b, e), s.type_experts, {n_embd, s.n_ff_exp});
            }
        } else if (s.fused_gate_up) {  // generate.cpp fills it with ffn_gate_exps' and ffn_up_exps' values
            matrix(b + "ffn_gate_up_exps.weight", s.type_experts, {n_embd, 2 * int64_t{s.n_ff_exp}, s.n_expert});
            matrix(b + "ffn_down_exps.weight", s.type_experts, {s.n_ff_exp, n_embd, s.n_expert});
        } else {
            matrix(b + "ffn_gate_exps.weight", s.type_experts, {n_embd, s.n_ff_exp, s.n_expert});
            matrix(b + "ffn_down_exps.weight", s.type_experts, {s.n_ff_exp, n_embd, s.n_expert});
            matrix(b + "ffn_up_exps.weight", s.type_experts, {n_embd, s.n_ff_exp, s.n_expert});
        }
        if (s.architecture == arch::qwen2moe || hy)
            matrix(b + "ffn_gate_inp_shexp.weight", ggml_type::F32, {n_embd});
        if (s.architecture == arch::qwen2moe || hy || ((glm || ds) && s.n_expert_shared > 0)) {
            const int64_t n_sh = glm || ds ? int64_t{s.n_ff_exp} * s.n_expert_shared : s.n_ff_shexp;
            matrix(b + "ffn_gate_shexp.weight", s.type_shexp, {n_embd, n_sh});
            matrix(b + "ffn_down_shexp.weight", s.type_shexp, {n_sh, n_embd});
            matrix(b + "ffn_up_shexp.weight", s.type_shexp, {n_embd, n_sh});
        }
        if (i >= s.n_layer && q4) {
            qwen4exp_nextn_tensors(s, i, matrix, vec);
        } else if (i >= s.n_layer) {  // what llama.cpp's loader expects of a next-token-prediction layer
            matrix(b + "nextn.eh_proj.weight", s.type_attn, {2 * n_embd, n_embd});
            vec(b + "nextn.enorm.weight", n_embd, init::norm);
            vec(b + "nextn.hnorm.weight", n_embd, init::norm);
            vec(b + "nextn.shared_head_norm.weight", n_embd, init::norm);
        }
    }
    if (s.architecture == arch::qwen4exp)
        qwen4exp_global_tensors(s, matrix, vec);
    else
        vec("output_norm.weight", n_embd, init::norm);
    if (!s.tie_embeddings) matrix("output.weight", s.type_out, {n_embd, s.n_vocab});

    for (const auto& ts : t) {
        const auto& ti = formats::info(ts.type);
        if (ts.ne[0] % ti.block_size != 0)
            throw std::invalid_argument(fmt::format(
                "tensor {} has rows of {} elements, which {} cannot hold (its blocks are {} elements); pick "
                "dimensions that are multiples of {} or another --type for that class",
                ts.name, ts.ne[0], ti.name, ti.block_size, ti.block_size));
    }
    return t;
}

}  // namespace strata::make_model
