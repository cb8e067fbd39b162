// vec_dot_ref equals the dot product of the dequantized weight row with the dequantized activation
// row (within f32 rounding), for every weight format and several row lengths.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/quant.hpp"

namespace strata::formats {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float mean) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(mean, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = dist(rng);
    return x;
}

struct quantized {
    std::vector<uint8_t> bytes;
    std::vector<float> values;  // dequantized
};

quantized quantize(ggml_type type, const std::vector<float>& x) {
    const auto n = static_cast<int64_t>(x.size());
    quantized q{std::vector<uint8_t>(row_size(type, n)), std::vector<float>(x.size())};
    quantize_row(type, x.data(), q.bytes.data(), n);
    dequantize_row(type, q.bytes.data(), q.values.data(), n);
    return q;
}

class VecDot : public ::testing::TestWithParam<ggml_type> {};

TEST_P(VecDot, MatchesDotOfDequantizedRows) {
    const ggml_type wt = GetParam();
    const ggml_type at = vec_dot_type(wt);
    const int64_t block = info(wt).block_size == 1 ? 32 : info(wt).block_size;
    for (int64_t blocks : {1, 2, 3, 7, 16}) {
        const int64_t n = block * blocks;
        const auto w = quantize(wt, gaussian(n, static_cast<uint32_t>(n), 0.3f));
        const auto a = quantize(at, gaussian(n, static_cast<uint32_t>(n + 1), 0.2f));
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
            ref += static_cast<double>(w.values[i]) * a.values[i];
            mag += std::fabs(static_cast<double>(w.values[i]) * a.values[i]);
        }
        // f32 accumulation: a few ulps of the magnitude. Q8_1 stores s = d * sum(qs) as a half, so the
        // min term of the _1 formats carries half's rounding (2^-11 relative).
        const double tol = (at == ggml_type::Q8_1 ? 2e-3 : 1e-5) * mag + 1e-6;
        const float got = vec_dot_ref(wt, n, w.bytes.data(), a.bytes.data());
        EXPECT_NEAR(got, ref, tol) << info(wt).name << " n=" << n;
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, VecDot,
                         ::testing::Values(ggml_type::F32, ggml_type::F16, ggml_type::BF16, ggml_type::Q4_0,
                                           ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::Q8_0,
                                           ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::Q4_K, ggml_type::Q5_K,
                                           ggml_type::Q6_K, ggml_type::Q8_K, ggml_type::IQ4_NL,
                                           ggml_type::IQ4_XS, ggml_type::IQ2_XXS, ggml_type::IQ2_XS,
                                           ggml_type::IQ2_S, ggml_type::IQ3_XXS, ggml_type::IQ3_S, ggml_type::IQ1_S,
                                           ggml_type::IQ1_M, ggml_type::MXFP4),
                         [](const auto& p) { return std::string(formats::info(p.param).name); });

TEST(VecDotType, PerFormat) {
    EXPECT_EQ(vec_dot_type(ggml_type::F32), ggml_type::F32);
    EXPECT_EQ(vec_dot_type(ggml_type::F16), ggml_type::F32);
    EXPECT_EQ(vec_dot_type(ggml_type::BF16), ggml_type::F32);
    for (ggml_type t : {ggml_type::Q4_0, ggml_type::Q5_0, ggml_type::Q8_0, ggml_type::IQ4_NL, ggml_type::MXFP4})
        EXPECT_EQ(vec_dot_type(t), ggml_type::Q8_0) << info(t).name;
    for (ggml_type t : {ggml_type::Q4_1, ggml_type::Q5_1}) EXPECT_EQ(vec_dot_type(t), ggml_type::Q8_1);
    for (ggml_type t : {ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K,
                        ggml_type::Q8_K, ggml_type::IQ4_XS, ggml_type::IQ2_XXS, ggml_type::IQ2_XS, ggml_type::IQ2_S,
                        ggml_type::IQ3_XXS, ggml_type::IQ3_S, ggml_type::IQ1_S, ggml_type::IQ1_M})
        EXPECT_EQ(vec_dot_type(t), ggml_type::Q8_K) << info(t).name;
}

// The min terms really come from the activation's s / bsums: with all weight codes 0 the product is
// exactly m * s (Q4_1) or -dmin * m * bsum (Q4_K).
TEST(VecDot, MinTermsUseActivationSums) {
    block_q4_1 w{};
    w.d = 0x3c00;
    w.m = 0x4000;  // 2
    block_q8_1 a{};
    a.d = 0x3c00;
    a.s = 0x4500;  // 5, independent of qs on purpose
    EXPECT_EQ(vec_dot_ref(ggml_type::Q4_1, 32, &w, &a), 10.0f);

    block_q4_K wk{};
    wk.d = 0x3c00;
    wk.dmin = 0x3c00;
    wk.scales[4] = 3;  // m of sub-block 0
    block_q8_K ak{};
    ak.d = 0.5f;
    ak.bsums[0] = 7;
    ak.bsums[1] = 1;
    EXPECT_EQ(vec_dot_ref(ggml_type::Q4_K, 256, &wk, &ak), -0.5f * 3 * 8);
}

}  // namespace
}  // namespace strata::formats
