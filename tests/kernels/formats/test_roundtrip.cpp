// quantize -> dequantize over random data: the RMS error relative to the RMS of the data stays within
// the range usual for each format. Bounds are the measured figure (printed) plus a little margin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "formats/quant.hpp"

namespace strata::formats {
namespace {

struct bound {
    ggml_type type;
    double max_rel_rms;
};

std::vector<float> gaussian(int64_t n, uint32_t seed, float mean = 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(mean, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = dist(rng);
    return x;
}

double relative_rms_error(ggml_type type, const std::vector<float>& x) {
    const auto n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(row_size(type, n));
    std::vector<float> y(x.size());
    quantize_row(type, x.data(), q.data(), n);
    dequantize_row(type, q.data(), y.data(), n);
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        err += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
        ref += static_cast<double>(x[i]) * x[i];
    }
    return std::sqrt(err / ref);
}

constexpr int64_t kN = 256 * 64;

class RoundTrip : public ::testing::TestWithParam<bound> {};

TEST_P(RoundTrip, RelativeRmsErrorWithinBound) {
    const bound b = GetParam();
    ASSERT_TRUE(can_quantize(b.type));
    const double centred = relative_rms_error(b.type, gaussian(kN, 42));
    const double shifted = relative_rms_error(b.type, gaussian(kN, 43, 0.5f));  // mean != 0
    auto small = gaussian(kN, 44);  // the scale of real weights: block scales near half's subnormals
    for (auto& v : small) v *= 0.02f;
    const double weights = relative_rms_error(b.type, small);
    std::printf("[ measured ] %-6s relative RMS error: %.4f%% (N(0,1)), %.4f%% (N(0.5,1)), %.4f%% (0.02 N(0,1));"
                " bound %.2f%%\n",
                std::string(info(b.type).name).c_str(), 100 * centred, 100 * shifted, 100 * weights,
                100 * b.max_rel_rms);
    EXPECT_LT(centred, b.max_rel_rms);
    EXPECT_LT(shifted, b.max_rel_rms);
    EXPECT_LT(weights, b.max_rel_rms);
}

// Measured on this data (g++ 12, x86-64): F16 0.021%, BF16 0.167%, Q8_0 / Q8_1 0.54% (max-abs / 127 over
// 32 elements: the quantization step alone gives ~0.5%), Q8_K 0.68% (one scale per 256), Q6_K 1.72%,
// Q5_0 4.01%, Q5_1 3.34%, Q5_K 3.55%, Q4_0 8.04%, Q4_1 6.92%, Q4_K 7.07%, IQ4_NL 7.42%, IQ4_XS 7.49%,
// Q3_K 14.4%, Q2_K 26.6%, MXFP4 11.1%, IQ3_S 13.0%, IQ3_XXS 17.9%, IQ2_S 24.1%, IQ2_XS 28.7%,
// IQ2_XXS 33.7%, IQ1_M 41.8%, IQ1_S 45.5% (the IQ quantizers search without importance weights).
INSTANTIATE_TEST_SUITE_P(Formats, RoundTrip,
                         ::testing::Values(bound{ggml_type::F32, 1e-9}, bound{ggml_type::F16, 0.0003},
                                           bound{ggml_type::BF16, 0.002}, bound{ggml_type::Q8_0, 0.006},
                                           bound{ggml_type::Q8_1, 0.006}, bound{ggml_type::Q8_K, 0.0075},
                                           bound{ggml_type::Q6_K, 0.019}, bound{ggml_type::Q5_0, 0.044},
                                           bound{ggml_type::Q5_1, 0.037}, bound{ggml_type::Q5_K, 0.039},
                                           bound{ggml_type::Q4_0, 0.088}, bound{ggml_type::Q4_1, 0.076},
                                           bound{ggml_type::Q4_K, 0.078}, bound{ggml_type::IQ4_NL, 0.082},
                                           bound{ggml_type::IQ4_XS, 0.082}, bound{ggml_type::Q3_K, 0.16},
                                           bound{ggml_type::Q2_K, 0.29}, bound{ggml_type::MXFP4, 0.123},
                                           bound{ggml_type::IQ3_S, 0.143}, bound{ggml_type::IQ3_XXS, 0.197},
                                           bound{ggml_type::IQ2_S, 0.263}, bound{ggml_type::IQ2_XS, 0.315},
                                           bound{ggml_type::IQ2_XXS, 0.365}, bound{ggml_type::IQ1_M, 0.455},
                                           bound{ggml_type::IQ1_S, 0.495}),
                         [](const auto& p) { return std::string(formats::info(p.param.type).name); });

TEST(RoundTrip, ZeroAndConstantBlocks) {
    for (ggml_type t : {ggml_type::Q4_0, ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::Q8_0,
                        ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K,
                        ggml_type::Q8_K, ggml_type::IQ4_NL, ggml_type::IQ4_XS, ggml_type::MXFP4}) {
        std::vector<float> zero(512, 0.0f), y(512, 1.0f);
        std::vector<uint8_t> q(row_size(t, 512));
        quantize_row(t, zero.data(), q.data(), 512);
        dequantize_row(t, q.data(), y.data(), 512);
        for (float v : y) ASSERT_EQ(v, 0.0f) << info(t).name;
        for (float c : {-3.0f, 3.0f}) {
            std::vector<float> constant(512, c);
            quantize_row(t, constant.data(), q.data(), 512);
            dequantize_row(t, q.data(), y.data(), 512);
            for (float v : y) ASSERT_NEAR(v, c, 0.05f) << info(t).name;
        }
    }
}

// The code book formats: an all-zero block comes back zero, a constant one within a few percent.
TEST(RoundTrip, CodeBookFormatsZeroAndConstantBlocks) {
    for (ggml_type t : {ggml_type::IQ2_XXS, ggml_type::IQ2_XS, ggml_type::IQ2_S, ggml_type::IQ3_XXS, ggml_type::IQ3_S,
                        ggml_type::IQ1_S, ggml_type::IQ1_M}) {
        std::vector<float> zero(512, 0.0f), y(512, 1.0f);
        std::vector<uint8_t> q(row_size(t, 512));
        quantize_row(t, zero.data(), q.data(), 512);
        dequantize_row(t, q.data(), y.data(), 512);
        for (float v : y) ASSERT_EQ(v, 0.0f) << info(t).name;
        for (float c : {-3.0f, 3.0f}) {
            std::vector<float> constant(512, c);
            quantize_row(t, constant.data(), q.data(), 512);
            dequantize_row(t, q.data(), y.data(), 512);
            for (float v : y) ASSERT_NEAR(v, c, 0.1f) << info(t).name;
        }
    }
}

TEST(RoundTrip, ActivationSums) {
    const auto x = gaussian(512, 5);
    std::vector<block_q8_1> q1(512 / 32);
    quantize_row(ggml_type::Q8_1, x.data(), q1.data(), 512);
    for (const auto& b : q1) {
        int sum = 0;
        for (int8_t v : b.qs) sum += v;
        EXPECT_EQ(b.s, fp32_to_fp16(fp16_to_fp32(b.d) * static_cast<float>(sum)));
    }
    std::vector<block_q8_K> qk(512 / 256);
    quantize_row(ggml_type::Q8_K, x.data(), qk.data(), 512);
    for (const auto& b : qk)
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int i = 16 * j; i < 16 * j + 16; ++i) sum += b.qs[i];
            EXPECT_EQ(b.bsums[j], sum);
        }
}

}  // namespace
}  // namespace strata::formats
