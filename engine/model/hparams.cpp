#include "model/hparams.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::engine {

namespace {

constexpr presence no = presence::absent, may = presence::optional, must = presence::required;
constexpr arch_traits kArchs[] = {
    {arch::qwen3moe, "qwen3moe", must, no, false, true, gating_func::softmax, false, "ffn_norm",
     kernels::cpu::rope_style::neox},
    {arch::qwen2moe, "qwen2moe", no, must, true, false, gating_func::softmax, false, "ffn_norm",
     kernels::cpu::rope_style::neox},
    {arch::mixtral, "mixtral", no, no, false, true, gating_func::softmax, false, "ffn_norm",
     kernels::cpu::rope_style::normal},
    {arch::glm4moe, "glm4moe", may, may, true, false, gating_func::sigmoid, true, "post_attention_norm",
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

}  // namespace

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
    } else {
        throw std::runtime_error(fmt::format("{}: architecture '{}' is not supported (strata runs qwen3moe, qwen2moe, "
                                             "glm4moe and llama-style MoE such as Mixtral)",
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
    if (hp.arch.id == arch::glm4moe) read_routing_keys(f, p, hp);
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
    const std::string ff_key = p + "feed_forward_length", ff_exp_key = p + "expert_feed_forward_length";
    if (hp.arch.id == arch::mixtral) {
        // llama.cpp's llama architecture sizes its experts by feed_forward_length alone.
        hp.n_ff_exp = read_int(f, ff_key);
        if (f.find(ff_exp_key) && read_int(f, ff_exp_key) != hp.n_ff_exp)
            throw std::runtime_error(fmt::format("{}: {} is {} but {} is {}; llama-style MoE experts are "
                                                 "feed_forward_length wide",
                                                 f.path(), ff_exp_key, read_int(f, ff_exp_key), ff_key, hp.n_ff_exp));
    } else if (f.find(ff_exp_key) || hp.arch.id == arch::glm4moe) {  // glm4moe: required, as in llama.cpp
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
    if (hp.arch.id == arch::glm4moe) {
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
    if (const gguf::value* tokens = f.find("tokenizer.ggml.tokens"))
        hp.n_vocab = static_cast<int>(tokens->as_array("tokenizer.ggml.tokens").size());
    return hp;
}

}  // namespace strata::engine
