// RoPE with position scaling as llama.cpp applies it (ggml_rope_ext): none, linear interpolation or
// YaRN. Shared by the CPU and CUDA rope kernels; plain C++17 so nvcc can include it.
#pragma once

#include <algorithm>
#include <cmath>

namespace strata::kernels {

enum class rope_scaling { none, linear, yarn };

// Resolved settings (file keys, defaults and overrides already applied; see engine/model/rope.hpp).
// With the defaults below the rotation is plain RoPE, bitwise.
struct rope_params {
    float freq_base = 10000.0f;
    rope_scaling scaling = rope_scaling::none;  // what was asked for; the numbers below carry its effect
    float freq_scale = 1.0f;   // 1 / factor: every angle is multiplied by this (interpolation)
    int n_ctx_orig = 0;        // YaRN: the context the model was trained on before scaling
    float ext_factor = 0.0f;   // YaRN: weight of extrapolation on the high-frequency dims (0: off)
    float attn_factor = 1.0f;  // multiplies cos and sin
    float beta_fast = 32.0f;   // YaRN: dims with more rotations than this over n_ctx_orig extrapolate
    float beta_slow = 1.0f;    // YaRN: dims with fewer rotations than this interpolate
};

// The pair indices [low, high] over which YaRN ramps from extrapolation to interpolation
// (ggml_rope_yarn_corr_dims): the dim whose wavelength fits `beta` times into n_ctx_orig.
struct rope_yarn_range {
    float low = 0.0f, high = 0.0f;
};

inline rope_yarn_range rope_yarn_corr_dims(const rope_params& p, int n_rot) {
    const auto dim = [&](float beta) {
        return static_cast<float>(n_rot) *
               std::log(static_cast<float>(p.n_ctx_orig) / (beta * 2.0f * 3.14159265358979f)) /
               (2.0f * std::log(p.freq_base));
    };
    return {std::max(0.0f, std::floor(dim(p.beta_fast))),
            std::min(static_cast<float>(n_rot - 1), std::ceil(dim(p.beta_slow)))};
}

// The factor on cos and sin: attn_factor, times YaRN's 1 + 0.1 ln(factor) when it extrapolates.
inline float rope_mscale(const rope_params& p) {
    if (p.ext_factor == 0.0f) return p.attn_factor;
    return p.attn_factor * (1.0f + 0.1f * std::log(1.0f / p.freq_scale));
}

}  // namespace strata::kernels
