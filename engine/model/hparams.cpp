#include "model/hparams.hpp"
#include "model/qwen4exp_keys.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::engine {

namespace {

constexpr presence no = presence::absent, may = presence::optional, must = presence::required;
constexpr arch_traits kArchs[] = {
    {arch::qwen3moe, "qwen3moe", must, no, false, true, gating_func::softmax, no, "ffn_norm",
     kernels::cpu::rope_style::neox},
    {arch::qwen2moe, "qwen2moe", no, must, true, false, gating_func::softmax, no, "ffn_norm",
     kernels::cpu::rope_style::neox},
    {arch::mixtral, "mixtral", no, no, false, true, gating_func::softmax, no, "ffn_norm",
     kernels::cpu::rope_style::normal},
    {arch::glm4moe, "glm4moe", may, may, true, false, gating_func::sigmoid, must, "post_attention_norm",
     kernels::cpu::rope_style::neox},
    // deepseek2's attention is its own (weights.cpp, mla.cpp): neither QK norm nor biases.
    {arch::deepseek2, "deepseek2", no, no, true, false, gating_func::softmax, may, "ffn_norm",
     kernels::cpu::rope_style::normal},
    // Gated attention layers and gated DeltaNet layers (weights.cpp, delta_net.cpp); qwen35moe's IMRoPE
    // turns every rotated pair by the text position, which is NeoX RoPE on the first n_rot dims.
    {arch::qwen35moe, "qwen35moe", must, no, true, true, gating_func::softmax, no, "post_attention_norm",
     kernels::cpu::rope_style::neox},
    {arch::qwen3next, "qwen3next", must, no, true, true, gating_func::softmax, no, "post_attention_norm",
     kernels::cpu::rope_style::neox},
    // qwen35moe's layers with hyper-connection mixers in place of the pre-norms (model/hyper_conn.hpp).
    {arch::qwen4exp, "qwen4exp", must, no, true, true, gating_func::softmax, no, "post_attention_norm",
     kernels::cpu::rope_style::neox},
};

int read_int(const gguf::reader& f, const std::string& key, std::optional<int> fallback = std::nullopt) {
    const gguf::value* v = f.find(key);
    if (!v) {
        if (fallback) return *fallback;
        throw std::runtime_error(fmt::format("{}: required metadata key '{}' is missing", f.path(), key));
    }
    const uint64_t u = v->as_u64(key);
    if (u > 1u << 30)
        throw std::runtime_error(fmt::format("{}: metadata key '{}' is {}, beyond any sensible size", f.path(), key, u));
    return static_cast<int>(u);
}

// The routing and layer-layout keys of the DeepSeek-style MoE families (glm4moe), llama.cpp's
// defaults when absent: no leading dense layers, the architecture's gating, no renormalisation, no
// scale, no next-token-prediction layers. block_count counts those last layers; hp.n_layer excludes them.
void read_routing_keys(const gguf::reader& f, const std::string& p, hparams& hp) {
    const std::string gating_key = p + "expert_gating_func";
    switch (read_int(f, gating_key, 0)) {
        case 0: break;  // unset: the architecture's own
        case 1: hp.gating = gating_func::softmax; break;
        case 2: hp.gating = gating_func::sigmoid; break;
        default:
            throw std::runtime_error(fmt::format("{}: {} is {}; strata runs softmax (1) and sigmoid (2) gating",
                                                 f.path(), gating_key, read_int(f, gating_key)));
    }
    const std::string norm_key = p + "expert_weights_norm";
    if (const gguf::value* v = f.find(norm_key)) hp.expert_weights_norm = v->as_bool(norm_key);
    const std::string scale_key = p + "expert_weights_scale";
    hp.expert_weights_scale = static_cast<float>(f.get_f64(scale_key, 0.0));
    if (!std::isfinite(hp.expert_weights_scale) || hp.expert_weights_scale < 0.0f)
        throw std::runtime_error(fmt::format("{}: {} is {}, must be 0 or more", f.path(), scale_key,
                                             hp.expert_weights_scale));
    const std::string nextn_key = p + "nextn_predict_layers";
    hp.n_layer_nextn = read_int(f, nextn_key, 0);
    if (hp.n_layer_nextn >= hp.n_layer)
        throw std::runtime_error(fmt::format("{}: {} is {}, must be below {}block_count ({})", f.path(), nextn_key,
                                             hp.n_layer_nextn, p, hp.n_layer));
    hp.n_layer -= hp.n_layer_nextn;
    const std::string dense_key = p + "leading_dense_block_count";
    hp.n_layer_dense_lead = read_int(f, dense_key, 0);
    if (hp.n_layer_dense_lead >= hp.n_layer)
        throw std::runtime_error(fmt::format("{}: {} is {}, but only {} layers are evaluated; at least one must "
                                             "have experts",
                                             f.path(), dense_key, hp.n_layer_dense_lead, hp.n_layer));
    if (hp.n_layer_dense_lead > 0) {
        hp.n_ff = read_int(f, p + "feed_forward_length");
        if (hp.n_ff < 1)
            throw std::runtime_error(fmt::format("{}: {}feed_forward_length is {}; the {} leading dense layers need "
                                                 "a positive width",
                                                 f.path(), p, hp.n_ff, hp.n_layer_dense_lead));
    }
    // Multimodal rotary sections (M-RoPE) exist only in the vision-capable conversions.
    const std::string sections_key = p + "rope.dimension_sections";
    if (const gguf::value* v = f.find(sections_key)) {
        const auto& a = v->as_array(sections_key);
        if (a.size() >= 2 && a[0].as_u64(sections_key) > 0 && a[1].as_u64(sections_key) > 0)
            throw std::runtime_error(fmt::format("{}: {} asks for multimodal RoPE sections, which strata does not run",
                                                 f.path(), sections_key));
    }
}

// Group-limited routing (expert_group_count, expert_group_used_count), as llama.cpp checks it.
void read_expert_groups(const gguf::reader& f, const std::string& p, hparams& hp) {
    hp.n_expert_groups = read_int(f, p + "expert_group_count", 0);
    hp.n_group_used = read_int(f, p + "expert_group_used_count", 0);
    if (hp.n_expert_groups <= 1) return;
    const int per_group = hp.n_expert / hp.n_expert_groups;
    if (hp.n_expert_groups >= hp.n_expert || hp.n_expert % hp.n_expert_groups != 0 || per_group < 2)
        throw std::runtime_error(fmt::format("{}: {}expert_group_count is {}, which must split the {} experts into equal "
                                             "groups of at least 2",
                                             f.path(), p, hp.n_expert_groups, hp.n_expert));
    if (hp.n_group_used < 1 || hp.n_group_used >= hp.n_expert_groups ||
        hp.n_expert_used > hp.n_group_used * per_group)
        throw std::runtime_error(fmt::format("{}: {}expert_group_used_count is {}; with {} groups of {} experts and {} "
                                             "experts used per token it must be 1..{} and hold the experts used",
                                             f.path(), p, hp.n_group_used, hp.n_expert_groups, per_group,
                                             hp.n_expert_used, hp.n_expert_groups - 1));
}

// deepseek2's latent attention keys. With attention.key_length_mla / value_length_mla (attn_k_b +
// attn_v_b files) those are the per-head sizes and key_length / value_length describe llama.cpp's
// cache (kv_lora_rank + n_rot, kv_lora_rank); without them (one attn_kv_b) key_length and
// value_length are the per-head sizes. q_lora_rank absent or 0: a plain attn_q, as the Lite models.
void read_mla_keys(const gguf::reader& f, const std::string& p, hparams& hp) {
    hp.n_lora_q = read_int(f, p + "attention.q_lora_rank", 0);
    hp.n_lora_kv = read_int(f, p + "attention.kv_lora_rank");
    if (hp.n_lora_kv < 1)
        throw std::runtime_error(fmt::format("{}: {}attention.kv_lora_rank is {}, must be positive", f.path(), p,
                                             hp.n_lora_kv));
    const int per_head = hp.n_embd / hp.n_head;
    const int key_len = read_int(f, p + "attention.key_length", per_head);
    const int value_len = read_int(f, p + "attention.value_length", per_head);
    const bool k_mla = f.find(p + "attention.key_length_mla") != nullptr;
    const bool v_mla = f.find(p + "attention.value_length_mla") != nullptr;
    if (k_mla != v_mla)
        throw std::runtime_error(fmt::format("{}: only one of {}attention.key_length_mla and {}attention.value_length_mla "
                                             "is set; llama.cpp needs both or neither",
                                             f.path(), p, p));
    hp.kv_b_split = k_mla;
    hp.head_dim = k_mla ? read_int(f, p + "attention.key_length_mla") : key_len;
    hp.head_dim_v = v_mla ? read_int(f, p + "attention.value_length_mla") : value_len;
    hp.n_rot = read_int(f, p + "rope.dimension_count", hp.head_dim);
    if (hp.n_rot <= 0 || hp.n_rot >= hp.head_dim || hp.n_rot % 2 != 0 || hp.head_dim_v < 1)
        throw std::runtime_error(fmt::format("{}: rope.dimension_count {} must be even and below the query/key head "
                                             "size {} (the head's part without RoPE), and the value head size {} "
                                             "positive",
                                             f.path(), hp.n_rot, hp.head_dim, hp.head_dim_v));
    if (k_mla && (key_len != hp.n_lora_kv + hp.n_rot || value_len != hp.n_lora_kv))
        throw std::runtime_error(fmt::format("{}: {}attention.key_length {} and value_length {} must be kv_lora_rank + "
                                             "rope.dimension_count = {} and kv_lora_rank = {} in a file with the "
                                             "*_mla keys",
                                             f.path(), p, key_len, value_len, hp.n_lora_kv + hp.n_rot, hp.n_lora_kv));
    hp.rope_yarn_log_mul = static_cast<float>(f.get_f64(p + "rope.scaling.yarn_log_multiplier", 0.0)) / 0.1f;
}

// DeepSeek's YaRN correction, as llama_context and llm_build_deepseek2 apply it: under YaRN the
// rotation's own 1 + 0.1 ln(factor) is cancelled (unless no yarn_log_multiplier is set), and the
// attention scale carries mscale^2 with mscale = (1 + 0.1 ln factor)(1 + 0.1 log_mul ln factor).
void apply_mla_rope_scale(hparams& hp, float file_attn_factor) {
    rope_params& r = hp.rope;
    const float ln_factor = std::log(1.0f / r.freq_scale);
    if (r.ext_factor != 0.0f) {
        const float factor = 1.0f / r.freq_scale;
        const float plain = factor <= 1.0f ? 1.0f : 0.1f * ln_factor + 1.0f;
        r.attn_factor = (hp.rope_yarn_log_mul != 0.0f ? 1.0f : plain) / (1.0f + 0.1f * ln_factor) * file_attn_factor;
    }
    const float attn_factor_org = r.attn_factor * (1.0f + 0.1f * ln_factor);
    const float mscale = attn_factor_org * (1.0f + 0.1f * hp.rope_yarn_log_mul * ln_factor);
    hp.kq_scale = mscale * mscale / std::sqrt(static_cast<float>(hp.head_dim));
}

// The gated DeltaNet keys (ssm.*) and which layers are recurrent: the array attention.recurrent_layers,
// else every layer but each full_attention_interval-th (default 4), as llama.cpp reads them.
void read_hybrid_keys(const gguf::reader& f, const std::string& p, hparams& hp) {
    if (hp.arch.id == arch::qwen35moe || hp.arch.id == arch::qwen4exp) {
        const std::string nextn_key = p + "nextn_predict_layers";
        hp.n_layer_nextn = read_int(f, nextn_key, 0);
        if (hp.n_layer_nextn >= hp.n_layer)
            throw std::runtime_error(fmt::format("{}: {} is {}, must be below {}block_count ({})", f.path(), nextn_key,
                                                 hp.n_layer_nextn, p, hp.n_layer));
        // IMRoPE's sections: required as llama.cpp requires them; text positions make them plain NeoX.
        if (!f.find(p + "rope.dimension_sections"))
            throw std::runtime_error(fmt::format("{}: required metadata key '{}rope.dimension_sections' is missing",
                                                 f.path(), p));
    }
    const int n_all = hp.n_layer;
    hp.n_layer -= hp.n_layer_nextn;
    hp.ssm_conv_kernel = read_int(f, p + "ssm.conv_kernel");
    hp.ssm_d_state = read_int(f, p + "ssm.state_size");
    hp.ssm_n_k_head = read_int(f, p + "ssm.group_count");
    hp.ssm_n_v_head = read_int(f, p + "ssm.time_step_rank");
    const int inner = read_int(f, p + "ssm.inner_size");
    hp.ssm_v_tiled = hp.arch.id == arch::qwen35moe || hp.arch.id == arch::qwen4exp;
    hp.ssm_gate_sigmoid = hp.arch.id == arch::qwen4exp;
    if (hp.ssm_d_state < 1 || hp.ssm_n_k_head < 1 || hp.ssm_n_v_head % hp.ssm_n_k_head != 0 || hp.ssm_n_v_head < 1)
        throw std::runtime_error(fmt::format("{}: {}ssm.time_step_rank (value heads) is {} and {}ssm.group_count (key "
                                             "heads) {}: the value heads must be a positive multiple of the key heads, "
                                             "and {}ssm.state_size ({}) positive",
                                             f.path(), p, hp.ssm_n_v_head, p, hp.ssm_n_k_head, p, hp.ssm_d_state));
    if (inner != hp.ssm_n_v_head * hp.ssm_d_state)
        throw std::runtime_error(fmt::format("{}: {}ssm.inner_size is {}, expected ssm.time_step_rank x ssm.state_size "
                                             "= {} x {} = {} (value heads as wide as key heads)",
                                             f.path(), p, inner, hp.ssm_n_v_head, hp.ssm_d_state,
                                             hp.ssm_n_v_head * hp.ssm_d_state));
    if (hp.ssm_conv_kernel < 2 || hp.ssm_conv_kernel > 16)
        throw std::runtime_error(fmt::format("{}: {}ssm.conv_kernel is {}, must be 2..16", f.path(), p,
                                             hp.ssm_conv_kernel));
    std::vector<bool> recurrent(static_cast<size_t>(hp.n_layer));
    const std::string rec_key = p + "attention.recurrent_layers";
    if (const gguf::value* v = f.find(rec_key)) {
        const auto& a = v->as_array(rec_key);
        if (static_cast<int>(a.size()) != n_all)
            throw std::runtime_error(fmt::format("{}: {} has {} entries, expected one per block ({})", f.path(), rec_key,
                                                 a.size(), n_all));
        for (int il = 0; il < hp.n_layer; ++il) {
            const gguf::value& e = a[static_cast<size_t>(il)];
            recurrent[static_cast<size_t>(il)] = e.type() == gguf::value_type::BOOL ? e.as_bool(rec_key) : e.as_u64(rec_key) != 0;
        }
    } else {
        const std::string key = p + "full_attention_interval";
        const int interval = read_int(f, key, 4);
        if (interval < 1)
            throw std::runtime_error(fmt::format("{}: {} is {}, must be positive", f.path(), key, interval));
        for (int il = 0; il < hp.n_layer; ++il) recurrent[static_cast<size_t>(il)] = (il + 1) % interval != 0;
    }
    int slot = 0;
    for (int il = 0; il < hp.n_layer; ++il) hp.kv_slot.push_back(recurrent[static_cast<size_t>(il)] ? -1 : slot++);
    if (slot == 0)
        throw std::runtime_error(fmt::format("{}: every one of the {} layers is recurrent; strata needs at least one "
                                             "attention layer ({} or {}full_attention_interval)",
                                             f.path(), hp.n_layer, rec_key, p));
    hp.expert_weights_scale = static_cast<float>(f.get_f64(p + "expert_weights_scale", 0.0));
}

}  // namespace

int64_t hparams::ple_rows() const {
    int64_t rows = 0;
    for (size_t h = 0; h < ple_offset.size(); ++h)
        rows = std::max<int64_t>(rows, static_cast<int64_t>(ple_offset[h] + ple_vocab[h]));
    return rows;
}

int hparams::n_kv_layer() const {
    if (!hybrid()) return n_layer;
    int n = 0;
    for (int s : kv_slot) n += s >= 0;
    return n;
}

const arch_traits& traits(arch a) {
    for (const auto& t : kArchs)
        if (t.id == a) return t;
    throw std::logic_error("unknown architecture id");
}

hparams read_hparams(const gguf::reader& f, const rope_overrides& rope) {
    hparams hp;
    hp.gguf_arch = f.get_string("general.architecture", "");
    const std::string& g = hp.gguf_arch;
    if (g == "qwen3moe") {
        hp.arch = traits(arch::qwen3moe);
    } else if (g == "qwen2moe") {
        hp.arch = traits(arch::qwen2moe);
    } else if (g == "llama" || g == "mixtral") {
        hp.arch = traits(arch::mixtral);
    } else if (g == "glm4moe") {
        hp.arch = traits(arch::glm4moe);
    } else if (g == "deepseek2") {
        hp.arch = traits(arch::deepseek2);
    } else if (g == "qwen35moe") {
        hp.arch = traits(arch::qwen35moe);
    } else if (g == "qwen3next") {
        hp.arch = traits(arch::qwen3next);
    } else if (g == "qwen4exp") {
        hp.arch = traits(arch::qwen4exp);
    } else {
        throw std::runtime_error(fmt::format("{}: architecture '{}' is not supported (strata runs qwen3moe, qwen2moe, "
                                             "glm4moe, deepseek2, qwen35moe, qwen3next, qwen4exp and llama-style MoE such as "
                                             "Mixtral)",
                                             f.path(), g.empty() ? "(none)" : g));
    }
    // Absent keys take llama.cpp's defaults (llama-model.cpp and src/models/*.cpp); the keys it requires
    // are load errors here too. docs/DETAILS.md lists every key.
    const std::string p = g + ".";
    hp.n_layer = read_int(f, p + "block_count");
    hp.n_embd = read_int(f, p + "embedding_length");
    hp.n_head = read_int(f, p + "attention.head_count");
    hp.n_head_kv = read_int(f, p + "attention.head_count_kv", hp.n_head);
    hp.n_expert = read_int(f, p + "expert_count", 0);
    hp.n_expert_used = read_int(f, p + "expert_used_count", 0);
    if (hp.n_layer < 1 || hp.n_embd < 1)
        throw std::runtime_error(fmt::format("{}: {}block_count is {} and {}embedding_length is {}; both must be positive",
                                             f.path(), p, hp.n_layer, p, hp.n_embd));
    if (hp.n_expert == 0)
        throw std::runtime_error(fmt::format("{}: '{}' has no experts ({}expert_count is missing or 0); strata runs "
                                             "Mixture-of-Experts models only",
                                             f.path(), g, p));
    if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
        throw std::runtime_error(fmt::format("{}: {} attention heads cannot be grouped over {} kv heads", f.path(),
                                             hp.n_head, hp.n_head_kv));
    if (hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert)
        throw std::runtime_error(fmt::format("{}: {}expert_used_count is {}, must be 1..{} (the expert count)",
                                             f.path(), p, hp.n_expert_used, hp.n_expert));
    hp.gating = hp.arch.gating;
    hp.expert_weights_norm = hp.arch.norm_topk;
    const bool ds = hp.arch.id == arch::deepseek2;
    if (hp.arch.id == arch::glm4moe || ds) read_routing_keys(f, p, hp);
    if (hp.arch.id == arch::qwen35moe || hp.arch.id == arch::qwen3next || hp.arch.id == arch::qwen4exp)
        read_hybrid_keys(f, p, hp);
    read_expert_groups(f, p, hp);
    if (ds) {
        read_mla_keys(f, p, hp);
    } else {
        hp.head_dim = read_int(f, p + "attention.key_length", hp.n_embd / hp.n_head);
        const int v_len = read_int(f, p + "attention.value_length", hp.n_embd / hp.n_head);
        if (v_len != hp.head_dim)
            throw std::runtime_error(fmt::format("{}: key length {} and value length {} differ ({}attention.key_length, "
                                                 "{}attention.value_length, each n_embd / n_head = {} when absent); "
                                                 "strata needs them equal",
                                                 f.path(), hp.head_dim, v_len, p, p, hp.n_embd / hp.n_head));
        hp.n_rot = read_int(f, p + "rope.dimension_count", hp.head_dim);
        if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
            throw std::runtime_error(fmt::format("{}: rope.dimension_count {} must be even and at most the head size {}",
                                                 f.path(), hp.n_rot, hp.head_dim));
        hp.head_dim_v = hp.head_dim;
    }
    const std::string ff_key = p + "feed_forward_length", ff_exp_key = p + "expert_feed_forward_length";
    if (hp.arch.id == arch::mixtral) {
        // llama.cpp's llama architecture sizes its experts by feed_forward_length alone.
        hp.n_ff_exp = read_int(f, ff_key);
        if (f.find(ff_exp_key) && read_int(f, ff_exp_key) != hp.n_ff_exp)
            throw std::runtime_error(fmt::format("{}: {} is {} but {} is {}; llama-style MoE experts are "
                                                 "feed_forward_length wide",
                                                 f.path(), ff_exp_key, read_int(f, ff_exp_key), ff_key, hp.n_ff_exp));
    } else if (f.find(ff_exp_key) || hp.arch.id == arch::glm4moe || ds) {  // glm4moe, deepseek2: required, as in llama.cpp
        hp.n_ff_exp = read_int(f, ff_exp_key);
    } else if (f.find(ff_key)) {
        hp.n_ff_exp = read_int(f, ff_key) / hp.n_expert_used;  // as llama.cpp: the dense width over the experts used
    } else {
        throw std::runtime_error(fmt::format("{}: the experts' width is unknown: neither {} nor {} (divided by the "
                                             "experts used) is in the file",
                                             f.path(), ff_exp_key, ff_key));
    }
    if (hp.n_ff_exp < 1)
        throw std::runtime_error(fmt::format("{}: the experts' width ({} or {} / {}expert_used_count) is {}", f.path(),
                                             ff_exp_key, ff_key, p, hp.n_ff_exp));
    // As llama.cpp: without its own key the shared expert is feed_forward_length wide, and its tensors
    // are required either way (weights.cpp checks their shapes).
    if (hp.arch.id == arch::glm4moe || ds) {
        // llama.cpp requires the count; the shared experts act as one of count times the expert width.
        hp.n_expert_shared = read_int(f, p + "expert_shared_count");
        hp.n_ff_shexp = hp.n_expert_shared * hp.n_ff_exp;
    } else if (hp.arch.shared_expert) {
        const std::string key = p + "expert_shared_feed_forward_length";
        hp.n_ff_shexp = f.find(key) ? read_int(f, key) : read_int(f, ff_key);
        if (hp.n_ff_shexp < 1)
            throw std::runtime_error(fmt::format("{}: the shared expert's width ({} or {}) is {}", f.path(), key,
                                                 ff_key, hp.n_ff_shexp));
    }
    hp.n_ctx_train = read_int(f, p + "context_length");
    const std::string eps_key = p + "attention.layer_norm_rms_epsilon";
    if (!f.find(eps_key))
        throw std::runtime_error(fmt::format("{}: required metadata key '{}' is missing", f.path(), eps_key));
    hp.rms_eps = static_cast<float>(f.get_f64(eps_key, 0.0));
    if (!std::isfinite(hp.rms_eps) || hp.rms_eps < 0.0f)
        throw std::runtime_error(fmt::format("{}: {} is {}, must be 0 or more", f.path(), eps_key, hp.rms_eps));
    hp.rope = read_rope(f, g, hp.n_ctx_train, rope);
    if (ds) apply_mla_rope_scale(hp, static_cast<float>(f.get_f64(p + "rope.scaling.attn_factor", 1.0)));
    if (const gguf::value* tokens = f.find("tokenizer.ggml.tokens"))
        hp.n_vocab = static_cast<int>(tokens->as_array("tokenizer.ggml.tokens").size());
    if (hp.arch.id == arch::qwen4exp) read_qwen4exp_keys(f, p, hp);
    return hp;
}

}  // namespace strata::engine
