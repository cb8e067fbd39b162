#include "model/hparams.hpp"

#include <optional>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::engine {

namespace {

constexpr arch_traits kArchs[] = {
    {arch::qwen3moe, "qwen3moe", true, false, false, true, kernels::cpu::rope_style::neox},
    {arch::qwen2moe, "qwen2moe", false, true, true, false, kernels::cpu::rope_style::neox},
    {arch::mixtral, "mixtral", false, false, false, true, kernels::cpu::rope_style::normal},
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
    } else {
        throw std::runtime_error(fmt::format("{}: architecture '{}' is not supported (strata runs qwen3moe, qwen2moe "
                                             "and llama-style MoE such as Mixtral)",
                                             f.path(), g.empty() ? "(none)" : g));
    }
    const std::string p = g + ".";
    hp.n_layer = read_int(f, p + "block_count");
    hp.n_embd = read_int(f, p + "embedding_length");
    hp.n_head = read_int(f, p + "attention.head_count");
    hp.n_head_kv = read_int(f, p + "attention.head_count_kv", hp.n_head);
    hp.n_expert = read_int(f, p + "expert_count", 0);
    hp.n_expert_used = read_int(f, p + "expert_used_count", 0);
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
    hp.head_dim = read_int(f, p + "attention.key_length", hp.n_embd / hp.n_head);
    const int v_len = read_int(f, p + "attention.value_length", hp.head_dim);
    if (v_len != hp.head_dim)
        throw std::runtime_error(fmt::format("{}: key length {} and value length {} differ; strata needs them equal",
                                             f.path(), hp.head_dim, v_len));
    hp.n_rot = read_int(f, p + "rope.dimension_count", hp.head_dim);
    if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
        throw std::runtime_error(fmt::format("{}: rope.dimension_count {} must be even and at most the head size {}",
                                             f.path(), hp.n_rot, hp.head_dim));
    if (hp.arch.id == arch::mixtral)
        hp.n_ff_exp = read_int(f, p + "expert_feed_forward_length", read_int(f, p + "feed_forward_length"));
    else
        hp.n_ff_exp = read_int(f, p + "expert_feed_forward_length");
    // As llama.cpp: without its own key the shared expert is feed_forward_length wide, and its tensors
    // are required either way (weights.cpp checks their shapes).
    if (hp.arch.shared_expert) {
        const std::string key = p + "expert_shared_feed_forward_length";
        hp.n_ff_shexp = f.find(key) ? read_int(f, key) : read_int(f, p + "feed_forward_length");
        if (hp.n_ff_shexp < 1)
            throw std::runtime_error(fmt::format("{}: the shared expert's width ({} or {}feed_forward_length) is {}",
                                                 f.path(), key, p, hp.n_ff_shexp));
    }
    hp.n_ctx_train = read_int(f, p + "context_length");
    hp.rms_eps = static_cast<float>(f.get_f64(p + "attention.layer_norm_rms_epsilon", 1e-6));
    hp.rope = read_rope(f, g, hp.n_ctx_train, rope);
    if (const gguf::value* tokens = f.find("tokenizer.ggml.tokens"))
        hp.n_vocab = static_cast<int>(tokens->as_array("tokenizer.ggml.tokens").size());
    return hp;
}

}  // namespace strata::engine
