// cpu::rope with scaling: none bitwise as the unscaled kernel always was, linear and YaRN against a
// plain double-precision reading of ggml_rope_ext (corr dims, ramp, mscale) written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.hpp"

namespace {

using namespace strata::kernels::cpu;
using strata::kernels::rope_params;
using strata::kernels::rope_scaling;

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// The kernel before scaling existed, as it computed in float: the "none" path must equal it bitwise.
void rope_unscaled(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos, float base, bool neox) {
    const int64_t half = n_rot / 2;
    for (int64_t h = 0; h < n_head; ++h)
        for (int64_t i = 0; i < half; ++i) {
            const float theta = static_cast<float>(pos) *
                                std::pow(base, -2.0f * static_cast<float>(i) / static_cast<float>(n_rot));
            const float c = std::cos(theta), s = std::sin(theta);
            float* v = x + h * head_dim;
            const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
}

// YaRN's correction range, in double: the pair index whose wavelength fits `beta` times into n_ctx_orig.
double corr_dim(int n_rot, int n_ctx_orig, double beta, double base) {
    return n_rot * std::log(n_ctx_orig / (beta * 2.0 * M_PI)) / (2.0 * std::log(base));
}

// Angle and magnitude of pair i at position pos, as ggml_rope_ext defines them.
struct rotation {
    double theta, mscale;
};

rotation reference_rotation(const rope_params& p, int n_rot, int64_t pos, int i) {
    const double extrap = double(pos) * std::pow(double(p.freq_base), -2.0 * i / n_rot);
    const double interp = extrap * p.freq_scale;
    if (p.ext_factor == 0.0f) return {interp, p.attn_factor};
    const double low = std::max(0.0, std::floor(corr_dim(n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    const double high = std::min(double(n_rot - 1), std::ceil(corr_dim(n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base)));
    const double ramp = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
    const double mix = ramp * p.ext_factor;
    return {interp * (1 - mix) + extrap * mix, p.attn_factor * (1.0 + 0.1 * std::log(1.0 / p.freq_scale))};
}

void expect_matches_reference(const rope_params& p, int64_t pos) {
    constexpr int64_t n_head = 3, head_dim = 64, n_rot = 64;
    const auto x = random_floats(n_head * head_dim, 7);
    for (const auto style : {rope_style::normal, rope_style::neox}) {
        auto y = x;
        rope(y.data(), n_head, head_dim, n_rot, pos, p, style);
        for (int64_t h = 0; h < n_head; ++h)
            for (int i = 0; i < n_rot / 2; ++i) {
                const rotation r = reference_rotation(p, n_rot, pos, i);
                const double c = std::cos(r.theta) * r.mscale, s = std::sin(r.theta) * r.mscale;
                const int64_t a = h * head_dim + (style == rope_style::neox ? i : 2 * i);
                const int64_t b = h * head_dim + (style == rope_style::neox ? i + n_rot / 2 : 2 * i + 1);
                // The kernel's float angle is off by a few ulp of the unscaled angle (up to 16000 rad here).
                const double extrap = double(pos) * std::pow(double(p.freq_base), -2.0 * i / n_rot);
                const double tol = (2e-6 * (1.0 + extrap) + 1e-5) * (std::abs(x[a]) + std::abs(x[b])) * r.mscale;
                EXPECT_NEAR(y[a], x[a] * c - x[b] * s, tol) << "pair " << i << " pos " << pos;
                EXPECT_NEAR(y[b], x[a] * s + x[b] * c, tol) << "pair " << i << " pos " << pos;
            }
    }
}

TEST(RopeScaling, NoneIsBitwiseTheUnscaledKernel) {
    constexpr int64_t n_head = 4, head_dim = 64, n_rot = 48;
    const auto x = random_floats(n_head * head_dim, 3);
    rope_params none;
    none.freq_base = 1e6f;
    rope_params typed_none = none;
    typed_none.scaling = rope_scaling::none;
    typed_none.n_ctx_orig = 4096;  // read but unused without ext_factor
    for (const bool neox : {false, true})
        for (const int64_t pos : {0, 1, 17, 4095, 100000})
            for (const rope_params& p : {none, typed_none}) {
                auto want = x, got = x;
                rope_unscaled(want.data(), n_head, head_dim, n_rot, pos, 1e6f, neox);
                rope(got.data(), n_head, head_dim, n_rot, pos, p, neox ? rope_style::neox : rope_style::normal);
                ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                    << "neox " << neox << " pos " << pos;
            }
}

TEST(RopeScaling, LinearMatchesReferenceAndDividesPositions) {
    rope_params p;
    p.scaling = rope_scaling::linear;
    p.freq_scale = 0.25f;
    for (const int64_t pos : {1, 33, 1000}) expect_matches_reference(p, pos);
    // Factor 4 at position 4n turns as far as no scaling at position n.
    const auto x = random_floats(64, 5);
    auto scaled = x, plain = x;
    rope(scaled.data(), 1, 64, 64, 4 * 25, p, rope_style::neox);
    rope(plain.data(), 1, 64, 64, 25, rope_params{}, rope_style::neox);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(scaled[i], plain[i], 1e-5) << i;
}

TEST(RopeScaling, YarnMatchesReference) {
    rope_params p;
    p.scaling = rope_scaling::yarn;
    p.freq_scale = 0.25f;
    p.n_ctx_orig = 4096;
    p.ext_factor = 1.0f;
    // By hand, n_rot 64, base 10000: beta_fast 32 -> 64 ln(4096 / 64 pi) / 2 ln 1e4 = 10.47, beta_slow 1 -> 22.51.
    EXPECT_NEAR(corr_dim(64, 4096, 32, 10000), 10.47, 0.01);
    EXPECT_NEAR(corr_dim(64, 4096, 1, 10000), 22.51, 0.01);
    const auto corr = strata::kernels::rope_yarn_corr_dims(p, 64);
    EXPECT_EQ(corr.low, 10.0f);
    EXPECT_EQ(corr.high, 23.0f);
    for (const int64_t pos : {0, 5, 4095, 5000, 16000}) expect_matches_reference(p, pos);
    // Half extrapolation, another magnitude and betas, a small original context (all dims ramp).
    p.ext_factor = 0.5f;
    p.attn_factor = 0.8f;
    p.beta_fast = 16.0f;
    p.beta_slow = 2.0f;
    p.n_ctx_orig = 64;
    for (const int64_t pos : {3, 63, 200}) expect_matches_reference(p, pos);
}

TEST(RopeScaling, YarnExtrapolatesFastDimsAndInterpolatesSlowOnes) {
    rope_params p;
    p.scaling = rope_scaling::yarn;
    p.freq_scale = 0.25f;
    p.n_ctx_orig = 4096;
    p.ext_factor = 1.0f;
    const double mscale = 1.0 + 0.1 * std::log(4.0);
    constexpr int64_t pos = 3000;
    std::vector<float> x(64, 0.0f);
    for (int i = 0; i < 32; ++i) x[i] = 1.0f;  // neox: (x[i], x[i + 32]) = (1, 0) -> (cos, sin) * mscale
    rope(x.data(), 1, 64, 64, pos, p, rope_style::neox);
    for (int i : {0, 5, 10}) {  // below corr.low: the unscaled angle
        const double theta = pos * std::pow(10000.0, -2.0 * i / 64);
        EXPECT_NEAR(x[i], std::cos(theta) * mscale, 2e-6 * theta) << i;
    }
    for (int i : {23, 28, 31}) {  // above corr.high: the angle divided by the factor
        const double theta = pos / 4.0 * std::pow(10000.0, -2.0 * i / 64);
        EXPECT_NEAR(x[i], std::cos(theta) * mscale, 1e-5) << i;
        EXPECT_NEAR(x[i + 32], std::sin(theta) * mscale, 1e-5) << i;
    }
}

}  // namespace
