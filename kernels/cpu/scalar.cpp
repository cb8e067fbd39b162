// The scalar path: quantized dots call the formats' references (so the scalar path *is* the
// reference), float dots and vector ops are plain loops. Also RoPE, which is scalar on every ISA
// (it touches n_head * head_dim floats once per token and never shows in a profile).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/detail/kernel_table.hpp"
#include "formats/quant.hpp"

namespace strata::kernels::cpu {
namespace detail {

using formats::ggml_type;

template <ggml_type T>
static void dot_reference(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    for (int t = 0; t < n_tok; ++t) out[t] = formats::vec_dot_ref(T, n, w, a[t]);
}

template <typename Convert>
static void dot_float(int64_t n, const void* const* a, int n_tok, float* out, Convert weight) {
    for (int t = 0; t < n_tok; ++t) {
        const auto* x = static_cast<const float*>(a[t]);
        float sum = 0.0f;
        for (int64_t i = 0; i < n; ++i) sum += weight(i) * x[i];
        out[t] = sum;
    }
}

static void dot_f32_scalar(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    const auto* wf = static_cast<const float*>(w);
    dot_float(n, a, n_tok, out, [wf](int64_t i) { return wf[i]; });
}
static void dot_f16_scalar(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    const auto* wh = static_cast<const formats::fp16_t*>(w);
    dot_float(n, a, n_tok, out, [wh](int64_t i) { return formats::fp16_to_fp32(wh[i]); });
}
static void dot_bf16_scalar(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    const auto* wb = static_cast<const formats::bf16_t*>(w);
    dot_float(n, a, n_tok, out, [wb](int64_t i) { return formats::bf16_to_fp32(wb[i]); });
}

static void quantize_q8_0_scalar(const float* x, void* dst, int64_t n) {
    formats::quantize_row(ggml_type::Q8_0, x, dst, n);
}
static void quantize_q8_1_scalar(const float* x, void* dst, int64_t n) {
    formats::quantize_row(ggml_type::Q8_1, x, dst, n);
}
static void quantize_q8_K_scalar(const float* x, void* dst, int64_t n) {
    formats::quantize_row(ggml_type::Q8_K, x, dst, n);
}

static void rms_norm_scalar(const float* x, const float* weight, float eps, int64_t n, float* out) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * (weight ? weight[i] : 1.0f);
}

static void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

static void qsa_scores_scalar(const float* q, int n_head, int dim, const float* keys, int64_t n_groups, float scale,
                              float* scores) {
    for (int64_t g = 0; g < n_groups; ++g)
        for (int j = 0; j < qsa_group; ++j) {
            const float* k = keys + static_cast<size_t>(g) * dim * qsa_group + j;
            float total = 0.0f;
            for (int h = 0; h < n_head; ++h) {
                float acc = 0.0f;
                for (int i = 0; i < dim; ++i) acc = std::fma(q[h * dim + i], k[i * qsa_group], acc);
                total += acc > 0.0f ? acc : 0.0f;  // as maxps(acc, 0): NaN and -0 give +0
            }
            scores[g * qsa_group + j] = total * scale;
        }
}

static void softmax_scalar(float* x, int64_t n) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

static void to_fp16_scalar(const float* x, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = formats::fp32_to_fp16(x[i]);
}

static void from_fp16_scalar(const uint16_t* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = formats::fp16_to_fp32(x[i]);
}

static void set_scalar(isa_table& t, ggml_type type, dot_fn fn) {
    t.dot[static_cast<size_t>(type)] = fn;
    t.dot_tokens[static_cast<size_t>(type)] = 4;
}

void fill_scalar(isa_table& t) {
    set_scalar(t, ggml_type::Q4_0, dot_reference<ggml_type::Q4_0>);
    set_scalar(t, ggml_type::Q4_1, dot_reference<ggml_type::Q4_1>);
    set_scalar(t, ggml_type::Q5_0, dot_reference<ggml_type::Q5_0>);
    set_scalar(t, ggml_type::Q5_1, dot_reference<ggml_type::Q5_1>);
    set_scalar(t, ggml_type::Q8_0, dot_reference<ggml_type::Q8_0>);
    set_scalar(t, ggml_type::Q2_K, dot_reference<ggml_type::Q2_K>);
    set_scalar(t, ggml_type::Q3_K, dot_reference<ggml_type::Q3_K>);
    set_scalar(t, ggml_type::Q4_K, dot_reference<ggml_type::Q4_K>);
    set_scalar(t, ggml_type::Q5_K, dot_reference<ggml_type::Q5_K>);
    set_scalar(t, ggml_type::Q6_K, dot_reference<ggml_type::Q6_K>);
    set_scalar(t, ggml_type::IQ4_NL, dot_reference<ggml_type::IQ4_NL>);
    set_scalar(t, ggml_type::IQ4_XS, dot_reference<ggml_type::IQ4_XS>);
    set_scalar(t, ggml_type::IQ2_XXS, dot_reference<ggml_type::IQ2_XXS>);
    set_scalar(t, ggml_type::IQ2_XS, dot_reference<ggml_type::IQ2_XS>);
    set_scalar(t, ggml_type::IQ2_S, dot_reference<ggml_type::IQ2_S>);
    set_scalar(t, ggml_type::IQ3_XXS, dot_reference<ggml_type::IQ3_XXS>);
    set_scalar(t, ggml_type::IQ3_S, dot_reference<ggml_type::IQ3_S>);
    set_scalar(t, ggml_type::IQ1_S, dot_reference<ggml_type::IQ1_S>);
    set_scalar(t, ggml_type::IQ1_M, dot_reference<ggml_type::IQ1_M>);
    set_scalar(t, ggml_type::MXFP4, dot_reference<ggml_type::MXFP4>);
    set_scalar(t, ggml_type::F32, dot_f32_scalar);
    set_scalar(t, ggml_type::F16, dot_f16_scalar);
    set_scalar(t, ggml_type::BF16, dot_bf16_scalar);
    t.quantize_q8_0 = quantize_q8_0_scalar;
    t.quantize_q8_1 = quantize_q8_1_scalar;
    t.quantize_q8_K = quantize_q8_K_scalar;
    t.rms_norm = rms_norm_scalar;
    t.silu_mul = silu_mul_scalar;
    t.attn_tile = attn_tile_scalar;
    t.delta_seq = delta_seq_scalar;
    t.delta_chunk = delta_chunk_scalar;
    t.softmax = softmax_scalar;
    t.to_fp16 = to_fp16_scalar;
    t.from_fp16 = from_fp16_scalar;
    t.qsa_scores = qsa_scores_scalar;
}

}  // namespace detail

void rope_angles(int64_t n_rot, int64_t pos, const rope_params& p, float* cos_sin) {
    const int64_t half = n_rot / 2;
    const bool yarn = p.ext_factor != 0.0f;
    const rope_yarn_range corr = yarn ? rope_yarn_corr_dims(p, static_cast<int>(n_rot)) : rope_yarn_range{};
    const float mscale = rope_mscale(p);
    for (int64_t i = 0; i < half; ++i) {
        const float theta_extrap = static_cast<float>(pos) *
                                   std::pow(p.freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(n_rot));
        float theta = p.freq_scale * theta_extrap;
        if (yarn) {
            // 1 below corr.low (extrapolate), 0 above corr.high (interpolate), linear between.
            const float y = (static_cast<float>(i) - corr.low) / std::max(0.001f, corr.high - corr.low);
            const float mix = (1.0f - std::clamp(y, 0.0f, 1.0f)) * p.ext_factor;
            theta = theta * (1.0f - mix) + theta_extrap * mix;
        }
        cos_sin[i] = std::cos(theta) * mscale;
        cos_sin[half + i] = std::sin(theta) * mscale;
    }
}

void rope_apply(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, const float* cos_sin, rope_style style) {
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float c = cos_sin[i], s = cos_sin[half + i];
        const int64_t i0 = style == rope_style::neox ? i : 2 * i;
        const int64_t i1 = style == rope_style::neox ? i + half : 2 * i + 1;
        for (int64_t h = 0; h < n_head; ++h) {
            float* v = x + h * head_dim;
            const float x0 = v[i0], x1 = v[i1];
            v[i0] = x0 * c - x1 * s;
            v[i1] = x0 * s + x1 * c;
        }
    }
}

void rope(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos, const rope_params& p,
          rope_style style) {
    // One angle per pair, shared by every head.
    std::vector<float> cos_sin(static_cast<size_t>(n_rot));
    rope_angles(n_rot, pos, p, cos_sin.data());
    rope_apply(x, n_head, head_dim, n_rot, cos_sin.data(), style);
}

}  // namespace strata::kernels::cpu
