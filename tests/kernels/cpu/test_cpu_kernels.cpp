// CPU kernels: every ISA path, the scalar one included, against a double-precision dot product of the
// dequantized weight and activation rows over ragged shapes; multi-token and matmul bitwise against
// single-token calls, activation quantizers bitwise against formats::quantize_row, vector ops against
// plain loops, and the STRATA_FORCE_ISA parsing.
//
// Tolerances against the double sum (integer block sums are exact, so only the f32 block terms and
// their f32 accumulation round):
//   quantized formats: |y - y_exact| <= 4 * (n_blocks + 16) * FLT_EPSILON * sum_i |w_i * a_i|
//   F32 / F16 / BF16:  |y - y_exact| <= (n / 16 + 16) * FLT_EPSILON * sum_i |w_i * a_i|
// Both catch a single wrong element (which moves y by ~ sum|w a| / n).
#include <bit>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/kernels.hpp"
#include "formats/quant.hpp"

namespace {

using namespace strata::kernels::cpu;
using strata::formats::ggml_type;
namespace formats = strata::formats;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// Encodes rows x n_cols floats into `type` rows of row_stride bytes (stride padded past the row).
std::vector<uint8_t> encode_rows(ggml_type type, const std::vector<float>& src, int64_t n_rows, int64_t n_cols,
                                 size_t row_stride) {
    std::vector<uint8_t> out(row_stride * n_rows, 0xAB);
    for (int64_t r = 0; r < n_rows; ++r) {
        const float* x = src.data() + r * n_cols;
        uint8_t* dst = out.data() + r * row_stride;
        if (type == ggml_type::F32) {
            std::memcpy(dst, x, n_cols * sizeof(float));
        } else if (type == ggml_type::F16 || type == ggml_type::BF16) {
            auto* h = reinterpret_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n_cols; ++i)
                h[i] = type == ggml_type::F16 ? formats::fp32_to_fp16(x[i]) : formats::fp32_to_bf16(x[i]);
        } else {
            formats::quantize_row(type, x, dst, n_cols);
        }
    }
    return out;
}

std::vector<float> decode_row(ggml_type type, const void* src, int64_t n) {
    std::vector<float> out(n);
    formats::dequantize_row(type, src, out.data(), n);
    return out;
}

bool is_float(ggml_type t) { return t == ggml_type::F32 || t == ggml_type::F16 || t == ggml_type::BF16; }

// The dot product of a weight row and an activation row, both dequantized, summed in double, and
// sum_i |w_i * a_i| (the scale of the kernels' rounding). Q4_1 and Q5_1 weights (x = d * q + m) take
// the m term from the activation's stored s = d * sum(q), a half (as ggml's Q8_1), so this does too.
struct exact_dot {
    double value = 0, mag = 0;
};

exact_dot dot_exact(ggml_type type, const uint8_t* w, const uint8_t* a, int64_t n) {
    const auto wd = decode_row(type, w, n);
    const auto ad = decode_row(activation_type(type), a, n);
    const bool offset = type == ggml_type::Q4_1 || type == ggml_type::Q5_1;
    constexpr int64_t qk = 32;  // block size of Q4_1, Q5_1 and Q8_1
    const size_t w_block = offset ? formats::row_size(type, qk) : 0, a_block = formats::row_size(ggml_type::Q8_1, qk);
    exact_dot r;
    for (int64_t b = 0; b < (offset ? n / qk : 1); ++b) {
        double m = 0;
        if (offset) {
            uint16_t m_half, s_half;  // m follows d in the weight block, s follows d in the activation's
            std::memcpy(&m_half, w + b * w_block + 2, 2);
            std::memcpy(&s_half, a + b * a_block + 2, 2);
            m = formats::fp16_to_fp32(m_half);
            const double ms = m * formats::fp16_to_fp32(s_half);
            r.value += ms;
            r.mag += std::fabs(ms);
        }
        const int64_t i0 = offset ? b * qk : 0, i1 = offset ? i0 + qk : n;
        for (int64_t i = i0; i < i1; ++i) {
            r.value += (double(wd[i]) - m) * ad[i];
            r.mag += std::fabs(double(wd[i]) * ad[i]);
        }
    }
    return r;
}

std::string isa_label(isa i) { return std::string(isa_name(i)); }

// GTEST_SKIP() only leaves the function it is written in, so this skips from the test body itself.
#define SKIP_UNLESS_SUPPORTED(i) \
    if (!cpu_supports(i)) GTEST_SKIP() << "this CPU lacks the " << isa_name(i) << " path"

// ---- matvec per (format, ISA) ----

struct matvec_case {
    ggml_type type;
    isa path;
};

class MatvecTest : public ::testing::TestWithParam<matvec_case> {};

TEST_P(MatvecTest, MatchesReferenceOverRaggedShapes) {
    const auto [type, path] = GetParam();
    SKIP_UNLESS_SUPPORTED(path);
    const auto& table = detail::table_for(path);
    const int64_t block = formats::info(type).block_size;
    const std::vector<int64_t> widths =
        is_float(type) ? std::vector<int64_t>{1, 7, 33, 100, 4096}
                       : (block == 256 ? std::vector<int64_t>{256, 512, 2816, 4096} : std::vector<int64_t>{32, 96, 544, 4096});
    const ggml_type act_type = activation_type(type);
    constexpr int64_t n_rows = 37;
    constexpr int n_tok = 3;

    for (const int64_t n_cols : widths) {
        SCOPED_TRACE("n_cols " + std::to_string(n_cols));
        const size_t row_stride = formats::row_size(type, n_cols) + 64;  // padded rows
        const auto w_f = random_floats(n_rows * n_cols, 1000 + static_cast<uint32_t>(n_cols));
        const auto w = encode_rows(type, w_f, n_rows, n_cols, row_stride);
        const size_t act_stride = activation_row_size(type, n_cols);
        const auto a_f = random_floats(n_tok * n_cols, 7 + static_cast<uint32_t>(n_cols), 2.0f);
        std::vector<uint8_t> act(act_stride * n_tok);
        for (int t = 0; t < n_tok; ++t)
            formats::quantize_row(act_type, a_f.data() + t * n_cols, act.data() + t * act_stride, n_cols);
        const matrix m{type, w.data(), n_cols, row_stride};

        for (const auto& [rb, re] : {std::pair<int64_t, int64_t>{0, n_rows}, {5, 29}, {36, 37}, {13, 14}}) {
            std::vector<float> y(re - rb);
            for (int t = 0; t < n_tok; ++t) {
                const uint8_t* a_t = act.data() + t * act_stride;
                detail::run_rows(table, m, rb, re, a_t, 0, 1, y.data(), 0);
                for (int64_t r = rb; r < re; ++r) {
                    const exact_dot want = dot_exact(type, w.data() + r * row_stride, a_t, n_cols);
                    const double tol = is_float(type) ? (n_cols / 16 + 16) * double(FLT_EPSILON) * want.mag
                                                      : 4.0 * (n_cols / block + 16) * double(FLT_EPSILON) * want.mag;
                    ASSERT_NEAR(y[r - rb], want.value, tol) << "row " << r << " token " << t;
                }
            }
        }
    }
}

// Rows [rb, re) of m for n_tok tokens (act: [n_tok][act_stride]) one token at a time, then 1 ..
// max_matvec_tokens tokens per call, then all at once: the results must be bitwise the same. single:
// the one-token results, [n_tok][re - rb].
void expect_batches_match_single_tokens(const detail::isa_table& table, const matrix& m, int64_t rb, int64_t re,
                                        const std::vector<uint8_t>& act, size_t act_stride, int64_t n_tok,
                                        std::vector<float>& single) {
    const int64_t n_out = re - rb;
    single.assign(n_tok * n_out, 0.0f);
    for (int64_t t = 0; t < n_tok; ++t)
        detail::run_rows(table, m, rb, re, act.data() + t * act_stride, 0, 1, single.data() + t * n_out, 0);

    for (int n_multi = 1; n_multi <= max_matvec_tokens; ++n_multi) {
        std::vector<float> multi(n_multi * n_out);
        detail::run_rows(table, m, rb, re, act.data(), act_stride, n_multi, multi.data(), n_out);
        ASSERT_EQ(0, std::memcmp(multi.data(), single.data(), multi.size() * sizeof(float))) << n_multi << " tokens";
    }
    std::vector<float> batched(n_tok * n_out);
    detail::run_rows(table, m, rb, re, act.data(), act_stride, n_tok, batched.data(), n_out);
    ASSERT_EQ(0, std::memcmp(batched.data(), single.data(), batched.size() * sizeof(float)));
}

TEST_P(MatvecTest, MultiTokenAndMatmulAreBitwiseSingleToken) {
    const auto [type, path] = GetParam();
    SKIP_UNLESS_SUPPORTED(path);
    const auto& table = detail::table_for(path);
    const int64_t n_cols = is_float(type) ? 300 : 4 * 256;
    constexpr int64_t n_rows = 19;
    constexpr int64_t n_tok = 70;  // crosses the 64-token matmul tile and every group remainder
    const size_t row_stride = formats::row_size(type, n_cols);
    const auto w = encode_rows(type, random_floats(n_rows * n_cols, 42), n_rows, n_cols, row_stride);
    const size_t act_stride = activation_row_size(type, n_cols) + 16;
    const auto a_f = random_floats(n_tok * n_cols, 43);
    std::vector<uint8_t> act(act_stride * n_tok);
    for (int64_t t = 0; t < n_tok; ++t)
        formats::quantize_row(activation_type(type), a_f.data() + t * n_cols, act.data() + t * act_stride, n_cols);
    const matrix m{type, w.data(), n_cols, row_stride};
    std::vector<float> single;
    ASSERT_NO_FATAL_FAILURE(expect_batches_match_single_tokens(table, m, 3, 17, act, act_stride, n_tok, single));
}

// The prompt GEMM on the GGUF layout (the code book formats, the float ones), called directly for 1 .. 64
// tokens: bitwise the dot kernel's one-token results, over rows wider than a decode chunk (17 super-blocks,
// 136 MXFP4 blocks; float rows 13 elements past a whole vector step, so the scalar tail runs too) and a
// row count that leaves a partial row tile.
class GemmRowsTest : public ::testing::TestWithParam<matvec_case> {};

TEST_P(GemmRowsTest, BitwiseTheDotKernelPerToken) {
    const auto [type, path] = GetParam();
    SKIP_UNLESS_SUPPORTED(path);
    const auto& table = detail::table_for(path);
    const auto id = static_cast<size_t>(type);
    ASSERT_NE(table.gemm_rows[id], nullptr);
    const bool is_float = type == ggml_type::F32 || type == ggml_type::F16 || type == ggml_type::BF16;
    const int64_t n_cols = 17 * 256 + (is_float ? 13 : 0);
    constexpr int64_t n_rows = 5, n_tok = 64;
    const size_t row_stride = formats::row_size(type, n_cols) + 32;
    const auto w = encode_rows(type, random_floats(n_rows * n_cols, 91), n_rows, n_cols, row_stride);
    const size_t act_stride = activation_row_size(type, n_cols) + 16;
    const auto a_f = random_floats(n_tok * n_cols, 92, 3.0f);
    std::vector<uint8_t> act(act_stride * n_tok);
    std::vector<const void*> rows(n_tok);
    for (int64_t t = 0; t < n_tok; ++t) {
        formats::quantize_row(activation_type(type), a_f.data() + t * n_cols, act.data() + t * act_stride, n_cols);
        rows[t] = act.data() + t * act_stride;
    }
    std::vector<float> want(n_tok * n_rows);
    for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t r = 0; r < n_rows; ++r) table.dot[id](n_cols, w.data() + r * row_stride, &rows[t], 1, &want[t * n_rows + r]);
    for (const int k : {1, 2, 3, 8, 17, 64}) {
        std::vector<float> got(k * n_rows, -1.0f);
        table.gemm_rows[id](n_cols, w.data(), row_stride, n_rows, rows.data(), k, got.data(), n_rows);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << k << " tokens";
    }
}

std::vector<matvec_case> gemm_rows_cases() {
    std::vector<matvec_case> cases;
    for (ggml_type t : {ggml_type::IQ2_XXS, ggml_type::IQ2_XS, ggml_type::IQ2_S, ggml_type::IQ3_XXS, ggml_type::IQ3_S,
                        ggml_type::IQ1_S, ggml_type::IQ1_M, ggml_type::MXFP4})
        for (isa i : {isa::avx2, isa::avx512}) cases.push_back({t, i});
    for (ggml_type t : {ggml_type::F32, ggml_type::F16, ggml_type::BF16}) cases.push_back({t, isa::avx512});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(FormatsByIsa, GemmRowsTest, ::testing::ValuesIn(gemm_rows_cases()),
                         [](const auto& info) {
                             return std::string(formats::info(info.param.type).name) + "_" + isa_label(info.param.path);
                         });

std::vector<matvec_case> all_matvec_cases() {
    std::vector<matvec_case> cases;
    for (ggml_type t : {ggml_type::Q4_K, ggml_type::Q6_K, ggml_type::Q8_0, ggml_type::IQ4_XS, ggml_type::Q5_K,
                        ggml_type::Q4_0, ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::Q2_K,
                        ggml_type::Q3_K, ggml_type::IQ4_NL, ggml_type::F32, ggml_type::F16, ggml_type::BF16,
                        ggml_type::IQ2_XXS, ggml_type::IQ2_XS, ggml_type::IQ2_S, ggml_type::IQ3_XXS, ggml_type::IQ3_S,
                        ggml_type::IQ1_S, ggml_type::IQ1_M, ggml_type::MXFP4})
        for (isa i : {isa::scalar, isa::avx2, isa::avx512}) cases.push_back({t, i});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(FormatsByIsa, MatvecTest, ::testing::ValuesIn(all_matvec_cases()),
                         [](const auto& info) {
                             return std::string(formats::info(info.param.type).name) + "_" + isa_label(info.param.path);
                         });

// ---- activation quantizers ----

class QuantizerTest : public ::testing::TestWithParam<isa> {};

TEST_P(QuantizerTest, BitwiseEqualToFormatsQuantizeRow) {
    SKIP_UNLESS_SUPPORTED(GetParam());
    const auto& table = detail::table_for(GetParam());
    constexpr int64_t n = 4096;
    auto x = random_floats(n, 5, 3.0f);
    std::fill(x.begin() + 256, x.begin() + 512, 0.0f);                        // an all-zero super-block
    for (int64_t i = 512; i < 768; ++i) x[i] = static_cast<float>(i % 7) * 0.5f;  // exact ties after scaling
    x[1000] = 1e4f;
    x[2000] = -3e-6f;
    for (const auto& [type, fn] : {std::pair{ggml_type::Q8_0, table.quantize_q8_0},
                                  std::pair{ggml_type::Q8_1, table.quantize_q8_1},
                                  std::pair{ggml_type::Q8_K, table.quantize_q8_K}}) {
        const size_t bytes = formats::row_size(type, n);
        std::vector<uint8_t> got(bytes), want(bytes);
        fn(x.data(), got.data(), n);
        formats::quantize_row(type, x.data(), want.data(), n);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), bytes)) << formats::info(type).name;
    }
}

// ---- vector ops ----

TEST_P(QuantizerTest, VectorOpsMatchPlainLoops) {
    SKIP_UNLESS_SUPPORTED(GetParam());
    const auto& table = detail::table_for(GetParam());
    for (const int64_t n : {1, 7, 64, 1000, 4096}) {
        SCOPED_TRACE("n " + std::to_string(n));
        const auto x = random_floats(n, 11, 4.0f), w = random_floats(n, 12), up = random_floats(n, 13);
        std::vector<float> out(n);

        table.rms_norm(x.data(), w.data(), 1e-6f, n, out.data());
        double ss = 0.0;
        for (float v : x) ss += double(v) * v;
        const double scale = 1.0 / std::sqrt(ss / n + 1e-6);
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(out[i], x[i] * scale * w[i], 1e-5 * std::fabs(x[i] * scale * w[i]) + 1e-6);

        table.silu_mul(x.data(), up.data(), n, out.data());
        for (int64_t i = 0; i < n; ++i) {
            const double want = x[i] / (1.0 + std::exp(-double(x[i]))) * up[i];
            ASSERT_NEAR(out[i], want, 4e-6 * std::fabs(want) + 1e-30) << i;
        }

        std::vector<float> s = x;
        table.softmax(s.data(), n);
        double mx = -INFINITY, sum = 0.0;
        for (float v : x) mx = std::max(mx, double(v));
        for (float v : x) sum += std::exp(v - mx);
        for (int64_t i = 0; i < n; ++i) {
            const double want = std::exp(x[i] - mx) / sum;
            ASSERT_NEAR(s[i], want, 1e-5 * want + 1e-30) << i;
        }
    }
}

TEST_P(QuantizerTest, Fp16RowsMatchTheSoftwareConversion) {
    SKIP_UNLESS_SUPPORTED(GetParam());
    const auto& table = detail::table_for(GetParam());
    // Ties at every exponent, overflow to inf, subnormal halves, NaN payloads, signed zeros.
    std::vector<float> x = random_floats(1000, 31, 70000.0f);
    for (const uint32_t bits : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa12345u, 0x7f800001u,
                                0x477ff000u, 0x477fefffu, 0x47800000u, 0x387fc000u, 0x33800000u, 0x33000001u, 0x33000000u,
                                0x3f801000u, 0x3f803000u, 0x00000001u, 0x80400000u})
        x.push_back(std::bit_cast<float>(bits));
    for (int e = -30; e <= 16; ++e)
        for (const float m : {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1.5f + 1.0f / 4096}) x.push_back(std::ldexp(m, e));
    for (const int64_t n : {int64_t{1}, int64_t{7}, static_cast<int64_t>(x.size())}) {
        std::vector<uint16_t> got(static_cast<size_t>(n));
        table.to_fp16(x.data(), got.data(), n);
        for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(got[static_cast<size_t>(i)], formats::fp32_to_fp16(x[static_cast<size_t>(i)]))
                << "x = " << x[static_cast<size_t>(i)] << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(x[static_cast<size_t>(i)]) << ")";
    }
}

// The QSA block scores: bitwise the plain loop the kernel's contract states (one FMA chain per dot,
// relu'd heads added in order), hence the same on every ISA, and within f32 rounding of double dots.
TEST_P(QuantizerTest, QsaScoresAreTheStatedFmaChains) {
    SKIP_UNLESS_SUPPORTED(GetParam());
    const auto& table = detail::table_for(GetParam());
    constexpr int G = qsa_group;
    for (const int n_head : {1, 2, 3, 4, 5, 7, 16})
        for (const int dim : {8, 64, 128}) {
            SCOPED_TRACE("heads " + std::to_string(n_head) + " dim " + std::to_string(dim));
            const int64_t n_groups = 3;
            const auto q = random_floats(int64_t{n_head} * dim, 41, 1.0f);
            auto keys = random_floats(n_groups * G * dim, 42, 1.0f);
            for (int i = 0; i < dim; ++i) keys[static_cast<size_t>(i * G + 5)] = 0.0f;  // a block of zero dots
            const float scale = 0.125f;
            std::vector<float> got(static_cast<size_t>(n_groups * G));
            table.qsa_scores(q.data(), n_head, dim, keys.data(), n_groups, scale, got.data());
            for (int64_t b = 0; b < n_groups * G; ++b) {
                const float* k = keys.data() + static_cast<size_t>(b / G) * G * dim + b % G;
                float total = 0.0f;
                double ref = 0.0;
                for (int h = 0; h < n_head; ++h) {
                    float acc = 0.0f;
                    double dot = 0.0;
                    for (int i = 0; i < dim; ++i) {
                        acc = std::fma(q[static_cast<size_t>(h * dim + i)], k[i * G], acc);
                        dot += double(q[static_cast<size_t>(h * dim + i)]) * k[i * G];
                    }
                    total += acc > 0.0f ? acc : 0.0f;
                    ref += std::max(dot, 0.0);
                }
                ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(b)]), std::bit_cast<uint32_t>(total * scale)) << b;
                ASSERT_NEAR(got[static_cast<size_t>(b)], ref * scale, 1e-5 * (1.0 + std::fabs(ref))) << b;
            }
            EXPECT_EQ(got[5], 0.0f);
        }
}

TEST_P(QuantizerTest, Fp16ToFloatIsExact) {
    SKIP_UNLESS_SUPPORTED(GetParam());
    const auto& table = detail::table_for(GetParam());
    std::vector<uint16_t> h;  // every half but the NaNs (payloads aside, the conversions agree on them too)
    for (uint32_t b = 0; b < 0x10000u; ++b)
        if ((b & 0x7c00u) != 0x7c00u || (b & 0x3ffu) == 0) h.push_back(static_cast<uint16_t>(b));
    for (const size_t n : {size_t{1}, size_t{13}, h.size()}) {
        std::vector<float> got(n);
        table.from_fp16(h.data(), got.data(), static_cast<int64_t>(n));
        for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(formats::fp16_to_fp32(h[i]))) << h[i];
    }
}

INSTANTIATE_TEST_SUITE_P(ByIsa, QuantizerTest, ::testing::Values(isa::scalar, isa::avx2, isa::avx512),
                         [](const auto& info) { return isa_label(info.param); });

TEST(Rope, NormalAndNeoxMatchNaiveRotation) {
    constexpr int64_t n_head = 3, head_dim = 64, n_rot = 32, pos = 17;
    const auto x = random_floats(n_head * head_dim, 21);
    for (const auto style : {rope_style::normal, rope_style::neox}) {
        auto y = x;
        rope(y.data(), n_head, head_dim, n_rot, pos, strata::kernels::rope_params{}, style);
        for (int64_t h = 0; h < n_head; ++h) {
            const float* v = x.data() + h * head_dim;
            for (int64_t i = 0; i < n_rot / 2; ++i) {
                const double theta = pos * std::pow(10000.0, -2.0 * i / n_rot);
                const int64_t i0 = style == rope_style::neox ? i : 2 * i;
                const int64_t i1 = style == rope_style::neox ? i + n_rot / 2 : 2 * i + 1;
                EXPECT_NEAR(y[h * head_dim + i0], v[i0] * std::cos(theta) - v[i1] * std::sin(theta), 1e-4);
                EXPECT_NEAR(y[h * head_dim + i1], v[i0] * std::sin(theta) + v[i1] * std::cos(theta), 1e-4);
            }
            for (int64_t i = n_rot; i < head_dim; ++i) EXPECT_EQ(y[h * head_dim + i], v[i]);  // unrotated tail
        }
    }
}

// ---- ISA choice ----

TEST(IsaChoice, ForcedNamesAndErrors) {
    EXPECT_EQ(detail::choose_isa("scalar"), isa::scalar);
    const isa best = cpu_supports(isa::avx512) ? isa::avx512 : cpu_supports(isa::avx2) ? isa::avx2 : isa::scalar;
    EXPECT_EQ(detail::choose_isa(nullptr), best);
    EXPECT_EQ(detail::choose_isa(""), best);
    for (isa i : {isa::avx2, isa::avx512}) {
        if (cpu_supports(i)) {
            EXPECT_EQ(detail::choose_isa(std::string(isa_name(i)).c_str()), i);
            EXPECT_EQ(detail::table_for(i).id, i);
        } else {
            EXPECT_THROW(detail::choose_isa(std::string(isa_name(i)).c_str()), std::runtime_error);
            EXPECT_THROW(detail::table_for(i), std::runtime_error);
        }
    }
    try {
        detail::choose_isa("sse9");
        FAIL() << "an unknown ISA name must throw";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("scalar, avx2, avx512"), std::string::npos) << e.what();
    }
}

// The process-wide choice reads STRATA_FORCE_ISA once; each statement runs in a fresh child process
// (threadsafe death-test style re-executes the binary), so the choice is made there from scratch.
TEST(IsaChoiceDeathTest, EnvironmentForcesThePath) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            setenv("STRATA_FORCE_ISA", "scalar", 1);
            std::exit(active_isa() == isa::scalar ? 0 : 3);
        },
        ::testing::ExitedWithCode(0), "");
    EXPECT_EXIT(
        {
            setenv("STRATA_FORCE_ISA", "avx9000", 1);
            try {
                active_isa();
            } catch (const std::runtime_error&) {
                std::exit(0);
            }
            std::exit(3);
        },
        ::testing::ExitedWithCode(0), "");
}

TEST(PublicApi, MatvecUsesTheActiveIsa) {
    constexpr int64_t n_cols = 512, n_rows = 9;
    const auto type = ggml_type::Q4_K;
    const size_t stride = formats::row_size(type, n_cols);
    const auto w = encode_rows(type, random_floats(n_rows * n_cols, 3), n_rows, n_cols, stride);
    const auto x = random_floats(n_cols, 4);
    std::vector<uint8_t> act(activation_row_size(type, n_cols));
    quantize_activation(type, x.data(), act.data(), n_cols);
    const matrix m{type, w.data(), n_cols, stride};
    std::vector<float> y(n_rows), want(n_rows);
    matvec(m, 0, n_rows, act.data(), y.data());
    detail::run_rows(detail::table_for(active_isa()), m, 0, n_rows, act.data(), 0, 1, want.data(), 0);
    EXPECT_EQ(0, std::memcmp(y.data(), want.data(), sizeof(float) * n_rows));
    // matvec_multi and matmul through the public entry points: bitwise the single-token results.
    std::vector<uint8_t> acts(act.size() * 20);
    for (int t = 0; t < 20; ++t) {
        const auto xt = random_floats(n_cols, 100 + t);
        quantize_activation(type, xt.data(), acts.data() + t * act.size(), n_cols);
    }
    std::vector<float> multi(16 * n_rows), batched(20 * n_rows), single(n_rows);
    matvec_multi(m, 0, n_rows, acts.data(), act.size(), 16, multi.data(), n_rows);
    matmul(m, 0, n_rows, acts.data(), act.size(), 20, batched.data(), n_rows);
    for (int t = 0; t < 20; ++t) {
        matvec(m, 0, n_rows, acts.data() + t * act.size(), single.data());
        EXPECT_EQ(0, std::memcmp(single.data(), batched.data() + t * n_rows, sizeof(float) * n_rows)) << t;
        if (t < 16) {
            EXPECT_EQ(0, std::memcmp(single.data(), multi.data() + t * n_rows, sizeof(float) * n_rows)) << t;
        }
    }
    EXPECT_THROW(matvec_multi(m, 0, n_rows, act.data(), 0, 17, y.data(), 0), std::invalid_argument);
    EXPECT_THROW(matvec(m, 5, 4, act.data(), y.data()), std::invalid_argument);
    // Float weights take the f32 row itself as the activation.
    EXPECT_EQ(activation_type(ggml_type::F16), ggml_type::F32);
    std::vector<float> copy(n_cols);
    quantize_activation(ggml_type::BF16, x.data(), copy.data(), n_cols);
    EXPECT_EQ(0, std::memcmp(copy.data(), x.data(), sizeof(float) * n_cols));
    EXPECT_THROW(matvec(matrix{ggml_type::Q8_K, w.data(), n_cols, stride}, 0, 1, act.data(), y.data()),
                 std::invalid_argument);
}

// ---- the rows16 layout of the prompt GEMM kernels ----

class RepackTest : public ::testing::TestWithParam<matvec_case> {};

struct repacked {
    std::vector<uint8_t> rows;    // GGUF layout, row_stride bytes apart
    std::vector<uint8_t> packed;  // rows16 layout
    size_t row_stride = 0;
};

repacked make_repacked(ggml_type type, int64_t n_rows, int64_t n_cols, uint32_t seed) {
    repacked r;
    r.row_stride = formats::row_size(type, n_cols) + 32;  // padded rows: repacking reads only the blocks
    r.rows = encode_rows(type, random_floats(n_rows * n_cols, seed), n_rows, n_cols, r.row_stride);
    r.packed.assign(repacked_row_stride(type, n_cols) * n_rows, 0);
    repack_rows(type, r.rows.data(), r.row_stride, n_rows, n_cols, r.packed.data());
    return r;
}

std::vector<uint8_t> quantize_tokens(ggml_type type, int64_t n_tok, int64_t n_cols, size_t act_stride, uint32_t seed) {
    const auto a_f = random_floats(n_tok * n_cols, seed, 2.0f);
    std::vector<uint8_t> act(act_stride * n_tok);
    for (int64_t t = 0; t < n_tok; ++t)
        formats::quantize_row(activation_type(type), a_f.data() + t * n_cols, act.data() + t * act_stride, n_cols);
    return act;
}

TEST_P(RepackTest, UnpackGivesBackTheGgufRows) {
    const auto [type, path] = GetParam();
    constexpr int64_t n_rows = 48, n_cols = 1024;
    const repacked r = make_repacked(type, n_rows, n_cols, 3);
    const size_t row_bytes = formats::row_size(type, n_cols);
    std::vector<uint8_t> back(n_rows * row_bytes);
    unpack_rows(type, r.packed.data(), n_rows, n_cols, back.data(), row_bytes);
    for (int64_t row = 0; row < n_rows; ++row)
        ASSERT_EQ(0, std::memcmp(back.data() + row * row_bytes, r.rows.data() + row * r.row_stride, row_bytes)) << "row " << row;
}

TEST_P(RepackTest, GemmMatchesReferenceOverShapes) {
    const auto [type, path] = GetParam();
    SKIP_UNLESS_SUPPORTED(path);
    const auto& table = detail::table_for(path);
    const int64_t block = formats::info(type).block_size;
    constexpr int64_t n_rows = 64;
    constexpr int n_tok = 11;  // a full token group of the AVX-512 kernels and a remainder
    for (const int64_t n_cols : {block, 3 * block, int64_t{2816}, int64_t{4096}}) {
        SCOPED_TRACE("n_cols " + std::to_string(n_cols));
        const repacked r = make_repacked(type, n_rows, n_cols, 500 + static_cast<uint32_t>(n_cols));
        const size_t act_stride = activation_row_size(type, n_cols);
        const auto act = quantize_tokens(type, n_tok, n_cols, act_stride, 9 + static_cast<uint32_t>(n_cols));
        const matrix m{type, r.packed.data(), n_cols, repacked_row_stride(type, n_cols), weight_layout::rows16};
        for (const auto& [rb, re] : {std::pair<int64_t, int64_t>{0, n_rows}, {16, 48}, {48, 64}}) {
            std::vector<float> y((re - rb) * n_tok);
            detail::run_rows(table, m, rb, re, act.data(), act_stride, n_tok, y.data(), re - rb);
            for (int t = 0; t < n_tok; ++t)
                for (int64_t row = rb; row < re; ++row) {
                    const exact_dot want = dot_exact(type, r.rows.data() + row * r.row_stride, act.data() + t * act_stride, n_cols);
                    const double tol = 4.0 * (n_cols / block + 16) * double(FLT_EPSILON) * want.mag;
                    ASSERT_NEAR(y[t * (re - rb) + row - rb], want.value, tol) << "row " << row << " token " << t;
                }
        }
    }
}

TEST_P(RepackTest, MultiTokenAndMatmulAreBitwiseSingleToken) {
    const auto [type, path] = GetParam();
    SKIP_UNLESS_SUPPORTED(path);
    const auto& table = detail::table_for(path);
    constexpr int64_t n_cols = 1024, n_rows = 48, n_tok = 70;
    const repacked r = make_repacked(type, n_rows, n_cols, 77);
    const size_t act_stride = activation_row_size(type, n_cols) + 16;
    const auto act = quantize_tokens(type, n_tok, n_cols, act_stride, 78);
    const matrix m{type, r.packed.data(), n_cols, repacked_row_stride(type, n_cols), weight_layout::rows16};
    const int64_t rb = 16, re = 48, n_out = re - rb;
    std::vector<float> single;
    ASSERT_NO_FATAL_FAILURE(expect_batches_match_single_tokens(table, m, rb, re, act, act_stride, n_tok, single));
    // one row range split in two gives the same bits
    std::vector<float> halves(n_tok * n_out);
    detail::run_rows(table, m, rb, rb + 16, act.data(), act_stride, n_tok, halves.data(), n_out);
    detail::run_rows(table, m, rb + 16, re, act.data(), act_stride, n_tok, halves.data() + 16, n_out);
    ASSERT_EQ(0, std::memcmp(halves.data(), single.data(), halves.size() * sizeof(float)));
}

TEST_P(RepackTest, RowRangesOffGroupsAreRefused) {
    const auto [type, path] = GetParam();
    SKIP_UNLESS_SUPPORTED(path);
    const repacked r = make_repacked(type, 32, 256, 5);
    const matrix m{type, r.packed.data(), 256, repacked_row_stride(type, 256), weight_layout::rows16};
    const auto act = quantize_tokens(type, 1, 256, activation_row_size(type, 256), 6);
    std::vector<float> y(32);
    EXPECT_THROW(detail::run_rows(detail::table_for(path), m, 8, 32, act.data(), 0, 1, y.data(), 0), std::invalid_argument);
    EXPECT_THROW(detail::run_rows(detail::table_for(path), m, 0, 20, act.data(), 0, 1, y.data(), 0), std::invalid_argument);
    EXPECT_THROW(repack_rows(type, r.rows.data(), r.row_stride, 20, 256, y.data()), std::invalid_argument);
}

// MXFP4's scale 2^(e - 128) for every exponent byte (e < 2: subnormal floats) through the rows16 GEMM of each
// ISA: row 16g + r holds one block with e = 16g + r and the single value 1 against an activation of 1.0 * 1.
TEST(Repack, Mxfp4ScalesCoverEveryExponent) {
    constexpr int64_t n_rows = 256, n_cols = formats::QK_MXFP4;
    std::vector<formats::block_mxfp4> rows(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) {
        rows[r] = {};
        rows[r].e = static_cast<uint8_t>(r);
        rows[r].qs[0] = 1;  // element 0: code 1, kvalues_mxfp4[1] = 1
    }
    formats::block_q8_0 act{};
    act.d = formats::fp32_to_fp16(1.0f);
    act.qs[0] = 1;
    const size_t stride = repacked_row_stride(ggml_type::MXFP4, n_cols);
    ASSERT_EQ(sizeof(formats::block_mxfp4), stride);
    std::vector<uint8_t> packed(stride * n_rows);
    repack_rows(ggml_type::MXFP4, rows.data(), sizeof(formats::block_mxfp4), n_rows, n_cols, packed.data());
    const matrix m{ggml_type::MXFP4, packed.data(), n_cols, stride, weight_layout::rows16};
    for (isa path : {isa::scalar, isa::avx2, isa::avx512}) {
        if (!cpu_supports(path)) continue;
        SCOPED_TRACE(isa_label(path));
        std::vector<float> y(n_rows, -1.0f);
        detail::run_rows(detail::table_for(path), m, 0, n_rows, &act, 0, 1, y.data(), 0);
        for (int64_t r = 0; r < n_rows; ++r) {
            const float want = std::ldexp(1.0f, static_cast<int>(r) - 128);
            ASSERT_EQ(std::bit_cast<uint32_t>(want), std::bit_cast<uint32_t>(y[r])) << "e " << r;
        }
    }
}

std::vector<matvec_case> repack_cases() {
    std::vector<matvec_case> cases;
    for (ggml_type t : {ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K, ggml_type::Q8_0, ggml_type::Q4_0,
                        ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::IQ4_NL, ggml_type::IQ4_XS,
                        ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::MXFP4})
        for (isa i : {isa::scalar, isa::avx2, isa::avx512}) cases.push_back({t, i});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(FormatsByIsa, RepackTest, ::testing::ValuesIn(repack_cases()), [](const auto& info) {
    return std::string(formats::info(info.param.type).name) + "_" + isa_label(info.param.path);
});

TEST(Repack, OnlyWhereTheActiveIsaHasAGemmKernel) {
    const bool fast = active_isa() != isa::scalar;  // AVX2 and AVX-512 have the GEMM kernels
    EXPECT_EQ(fast, can_repack(ggml_type::Q4_K, 768));
    EXPECT_EQ(fast, can_repack(ggml_type::Q8_0, 2048));
    for (ggml_type t : {ggml_type::Q4_0, ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::IQ4_NL,
                        ggml_type::MXFP4}) {
        EXPECT_EQ(fast, can_repack(t, 2048)) << formats::info(t).name;
        EXPECT_EQ(formats::row_size(t, 2048), repacked_row_stride(t, 2048)) << formats::info(t).name;  // same bytes
    }
    EXPECT_FALSE(can_repack(ggml_type::Q4_K, 760));  // not whole groups of 16
    EXPECT_EQ(fast, can_repack(ggml_type::Q5_K, 768));
    EXPECT_EQ(fast, can_repack(ggml_type::IQ4_XS, 768));
    EXPECT_EQ(138u * 8, repacked_row_stride(ggml_type::IQ4_XS, 2048));
    EXPECT_EQ(fast, can_repack(ggml_type::Q6_K, 768));
    EXPECT_EQ(fast, can_repack(ggml_type::Q2_K, 768));
    EXPECT_EQ(fast, can_repack(ggml_type::Q3_K, 768));
    EXPECT_EQ(formats::row_size(ggml_type::Q2_K, 2048), repacked_row_stride(ggml_type::Q2_K, 2048));
    EXPECT_EQ(114u * 8, repacked_row_stride(ggml_type::Q3_K, 2048));  // scales unpacked to bytes
    EXPECT_EQ(180u * 8, repacked_row_stride(ggml_type::Q5_K, 2048));
    EXPECT_EQ(formats::row_size(ggml_type::Q6_K, 2048), repacked_row_stride(ggml_type::Q6_K, 2048));
    EXPECT_EQ(148u * 8, repacked_row_stride(ggml_type::Q4_K, 2048));
    EXPECT_EQ(formats::row_size(ggml_type::Q8_0, 2048), repacked_row_stride(ggml_type::Q8_0, 2048));
    EXPECT_THROW(repacked_row_stride(ggml_type::Q8_K, 256), std::invalid_argument);
}

// The AVX2 path runs prompts through GEMM kernels on repacked weights (not the matvec ones) for every
// format with one, with or without AVX-VNNI; the same bits as AVX-512.
TEST(Repack, Avx2PromptPathIsTheGemmOne) {
    SKIP_UNLESS_SUPPORTED(isa::avx2);
    const auto& t = detail::table_for(isa::avx2);
    for (ggml_type type : {ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K, ggml_type::Q8_0, ggml_type::Q4_0,
                           ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::IQ4_NL, ggml_type::IQ4_XS,
                           ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::MXFP4}) {
        const auto id = static_cast<size_t>(type);
        EXPECT_TRUE(t.gemm16_fast[id]) << formats::info(type).name;
        EXPECT_NE(t.gemm16[id], detail::table_for(isa::scalar).gemm16[id]) << formats::info(type).name;
    }
}

// Both AVX2 forms of a kernel (plain, and AVX-VNNI where the CPU has it) against the AVX-512 one
// (or, without AVX-512, against each other).
TEST(Repack, Avx2GemmIsBitwiseTheAvx512One) {
    SKIP_UNLESS_SUPPORTED(isa::avx2);
    const auto& t2 = detail::table_for(isa::avx2);
    detail::isa_table plain = t2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q4_K)] = detail::gemm16_q4_k_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q5_K)] = detail::gemm16_q5_k_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q6_K)] = detail::gemm16_q6_k_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q8_0)] = detail::gemm16_q8_0_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::IQ4_XS)] = detail::gemm16_iq4_xs_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q2_K)] = detail::gemm16_q2_k_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q3_K)] = detail::gemm16_q3_k_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q4_0)] = detail::gemm16_q4_0_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q4_1)] = detail::gemm16_q4_1_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q5_0)] = detail::gemm16_q5_0_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::Q5_1)] = detail::gemm16_q5_1_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::IQ4_NL)] = detail::gemm16_iq4_nl_avx2;
    plain.gemm16[static_cast<size_t>(ggml_type::MXFP4)] = detail::gemm16_mxfp4_avx2;
    const auto& ref = cpu_supports(isa::avx512) ? detail::table_for(isa::avx512) : plain;
    constexpr int64_t n_cols = 2048, n_rows = 32, n_tok = 13;
    for (ggml_type type : {ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K, ggml_type::Q8_0, ggml_type::Q4_0,
                           ggml_type::Q4_1, ggml_type::Q5_0, ggml_type::Q5_1, ggml_type::IQ4_NL, ggml_type::IQ4_XS,
                           ggml_type::Q2_K, ggml_type::Q3_K, ggml_type::MXFP4}) {
        SCOPED_TRACE(formats::info(type).name);
        const repacked r = make_repacked(type, n_rows, n_cols, 91);
        const size_t act_stride = activation_row_size(type, n_cols);
        const auto act = quantize_tokens(type, n_tok, n_cols, act_stride, 92);
        const matrix m{type, r.packed.data(), n_cols, repacked_row_stride(type, n_cols), weight_layout::rows16};
        std::vector<float> want(n_rows * n_tok);
        detail::run_rows(ref, m, 0, n_rows, act.data(), act_stride, n_tok, want.data(), n_rows);
        for (const detail::isa_table* t : {&t2, static_cast<const detail::isa_table*>(&plain)}) {
            std::vector<float> y(n_rows * n_tok);
            detail::run_rows(*t, m, 0, n_rows, act.data(), act_stride, n_tok, y.data(), n_rows);
            EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float))) << (t == &t2 ? "table" : "plain AVX2");
        }
    }
}

// The AVX2 table's Q6_K dot kernel (the AVX-VNNI form where the CPU has it) gives the plain AVX2 one's
// bits for every token count, over a row whose sub-block scales differ widely (a few large values).
TEST(Avx2Dot, Q6KFormsAgreeBitwise) {
    SKIP_UNLESS_SUPPORTED(isa::avx2);
    const auto& t2 = detail::table_for(isa::avx2);
    constexpr int64_t n_cols = 8 * 256, n_tok = 4;
    const size_t row_stride = formats::row_size(ggml_type::Q6_K, n_cols);
    auto f = random_floats(n_cols, 71, 4.0f);
    for (int64_t i = 0; i < n_cols; i += 97) f[static_cast<size_t>(i)] = i % 2 ? 60.0f : -64.0f;
    const auto w = encode_rows(ggml_type::Q6_K, f, 1, n_cols, row_stride);
    const size_t act_stride = activation_row_size(ggml_type::Q6_K, n_cols);
    const auto act = quantize_tokens(ggml_type::Q6_K, n_tok, n_cols, act_stride, 72);
    for (int nt = 1; nt <= n_tok; ++nt) {
        const void* a[n_tok];
        for (int t = 0; t < nt; ++t) a[t] = act.data() + static_cast<size_t>(t) * act_stride;
        float want[n_tok], got[n_tok];
        detail::dot_q6_k_avx2(n_cols, w.data(), a, nt, want);
        t2.dot[static_cast<size_t>(ggml_type::Q6_K)](n_cols, w.data(), a, nt, got);
        EXPECT_EQ(0, std::memcmp(got, want, sizeof(float) * static_cast<size_t>(nt))) << nt << " tokens";
    }
}

}  // namespace
