#include "model/rope.hpp"

#include <cmath>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "strata/engine.hpp"

namespace strata::engine {

namespace {

// Flags where 0 means "the model's" (llama.cpp's --rope-scale, --rope-freq-base): else finite and > 0.
std::optional<float> zero_means_model(const char* flag, float v) {
    if (v == 0.0f) return std::nullopt;
    if (!std::isfinite(v) || v < 0.0f)
        throw std::invalid_argument(fmt::format("{} must be positive (0: the model's), got {}", flag, v));
    return v;
}

// Flags where a negative value means "the model's" (llama.cpp's --yarn-*): else finite, and > 0 unless
// zero_ok.
std::optional<float> negative_means_model(const char* flag, float v, bool zero_ok) {
    if (!std::isfinite(v) || (v == 0.0f && !zero_ok))
        throw std::invalid_argument(fmt::format("{} must be {} (negative: the model's), got {}", flag,
                                                zero_ok ? "0 or more" : "positive", v));
    if (v < 0.0f) return std::nullopt;
    return v;
}

}  // namespace

rope_scaling parse_rope_scaling(std::string_view name, std::string_view what) {
    if (name == "none") return rope_scaling::none;
    if (name == "linear") return rope_scaling::linear;
    if (name == "yarn") return rope_scaling::yarn;
    throw std::invalid_argument(
        fmt::format("{}: RoPE scaling type '{}' is not supported (valid: none, linear, yarn)", what, name));
}

std::string_view rope_scaling_name(rope_scaling s) {
    switch (s) {
        case rope_scaling::none: return "none";
        case rope_scaling::linear: return "linear";
        case rope_scaling::yarn: return "yarn";
    }
    return "?";
}

rope_overrides rope_overrides_from(const model_options& o) {
    rope_overrides r;
    if (!o.rope_scaling.empty()) r.scaling = parse_rope_scaling(o.rope_scaling, "--rope-scaling");
    r.factor = zero_means_model("--rope-scale", o.rope_scale);
    r.freq_base = zero_means_model("--rope-freq-base", o.rope_freq_base);
    if (o.yarn_orig_ctx < 0)
        throw std::invalid_argument(
            fmt::format("--yarn-orig-ctx must be positive (0: the model's), got {}", o.yarn_orig_ctx));
    if (o.yarn_orig_ctx > 0) r.n_ctx_orig = o.yarn_orig_ctx;
    r.ext_factor = negative_means_model("--yarn-ext-factor", o.yarn_ext_factor, true);
    r.attn_factor = negative_means_model("--yarn-attn-factor", o.yarn_attn_factor, false);
    r.beta_fast = negative_means_model("--yarn-beta-fast", o.yarn_beta_fast, false);
    r.beta_slow = negative_means_model("--yarn-beta-slow", o.yarn_beta_slow, false);
    return r;
}

rope_params read_rope(const gguf::reader& f, const std::string& arch, int n_ctx_train, const rope_overrides& o) {
    const std::string p = arch + ".rope.";
    const auto number = [&](const std::string& key, float fallback) {
        return static_cast<float>(f.get_f64(p + key, fallback));
    };
    rope_params r;
    r.freq_base = o.freq_base.value_or(number("freq_base", 10000.0f));
    if (!std::isfinite(r.freq_base) || r.freq_base <= 0.0f)
        throw std::runtime_error(fmt::format("{}: {}freq_base is {}, must be positive", f.path(), p, r.freq_base));

    // llama.cpp's default type is linear: without a factor that is plain RoPE.
    r.scaling = rope_scaling::linear;
    const std::string type_key = p + "scaling.type";
    if (const gguf::value* v = f.find(type_key)) {
        try {
            r.scaling = parse_rope_scaling(v->as_string(type_key), fmt::format("{}: {}", f.path(), type_key));
        } catch (const std::invalid_argument& e) {
            throw std::runtime_error(e.what());
        }
    }
    if (o.scaling) r.scaling = *o.scaling;

    // The factor; the legacy key rope.scale_linear where rope.scaling.factor is absent; 0: none.
    const bool has_factor = f.find(p + "scaling.factor") != nullptr;
    const float factor = o.factor.value_or(number(has_factor ? "scaling.factor" : "scale_linear", 0.0f));
    if (!std::isfinite(factor) || factor < 0.0f)
        throw std::runtime_error(fmt::format("{}: {}{} is {}, must be positive (0: no scaling)", f.path(), p,
                                             has_factor ? "scaling.factor" : "scale_linear", factor));
    r.freq_scale = factor == 0.0f || r.scaling == rope_scaling::none ? 1.0f : 1.0f / factor;

    const uint64_t orig = f.get_u64(p + "scaling.original_context_length", 0);
    if (orig > (1u << 30))
        throw std::runtime_error(fmt::format("{}: {}scaling.original_context_length is {}, beyond any sensible size",
                                             f.path(), p, orig));
    r.n_ctx_orig = o.n_ctx_orig.value_or(orig != 0 ? static_cast<int>(orig) : n_ctx_train);

    // YaRN: a negative ext_factor means "1 under yarn, else 0"; attn_factor multiplies the file's
    // rope.scaling.attn_factor, as llama_context does.
    const float ext = o.ext_factor.value_or(number("scaling.yarn_ext_factor", -1.0f));
    r.ext_factor = ext >= 0.0f ? ext : r.scaling == rope_scaling::yarn ? 1.0f : 0.0f;
    r.attn_factor = o.attn_factor.value_or(number("scaling.yarn_attn_factor", 1.0f)) * number("scaling.attn_factor", 1.0f);
    r.beta_fast = o.beta_fast.value_or(number("scaling.yarn_beta_fast", 32.0f));
    r.beta_slow = o.beta_slow.value_or(number("scaling.yarn_beta_slow", 1.0f));
    if (r.ext_factor != 0.0f && r.n_ctx_orig <= 0)
        throw std::runtime_error(fmt::format("{}: YaRN needs the original context length, but {}"
                                             "scaling.original_context_length and the context length are both 0",
                                             f.path(), p));
    return r;
}

std::string describe_rope(const rope_params& p) {
    const float factor = 1.0f / p.freq_scale;
    if (p.scaling == rope_scaling::yarn)
        return fmt::format("yarn x{:g}, original context {}", factor, p.n_ctx_orig);
    if (p.freq_scale != 1.0f) return fmt::format("linear x{:g}", factor);
    return "none";
}

}  // namespace strata::engine
