// Each CUDA kernel against the CPU reference (kernels/formats, kernels/cpu, engine::route_token),
// per weight format. Label gpu: skips without a device.
//
// Tolerances: the GPU multiplies dequantised weights by f32 activations with f32 accumulation in a
// different order than the reference, so a dot product may differ by about 1e-5 of sum |w||x|; the
// tests allow 1e-4 of it. f16 outputs (dequantise-to-f16) allow one half ulp. The code-book formats
// (IQ1 / IQ2 / IQ3) and MXFP4 dequantise with the reference's operations, so their values must be the
// reference's bits (read back through the matvec with one-hot activations).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "cuda_kernels.hpp"
#include "formats/quant.hpp"
#include "formats/types.hpp"
#include "gpu/cuda_raii.hpp"
#include "gpu_available.hpp"
#include "model/forward.hpp"

namespace strata::kernels::cuda {
namespace {

using engine::gpu::device_buffer;
using formats::ggml_type;

template <class T>
device_buffer<T> upload(const std::vector<T>& v) {
    device_buffer<T> d(v.size());
    engine::gpu::check(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return d;
}

template <class T>
std::vector<T> download(const device_buffer<T>& d) {
    std::vector<T> v(d.size());
    engine::gpu::check(cudaDeviceSynchronize(), "sync");
    engine::gpu::check(cudaMemcpy(v.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost), "download");
    return v;
}

std::vector<float> random_floats(size_t n, float scale, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

struct quantized {
    std::vector<uint8_t> bytes;   // [n_rows][row_size]
    std::vector<float> values;    // [n_rows][n_cols] dequantised by the reference
    size_t row_size = 0;
};

quantized make_weights(ggml_type type, int64_t n_rows, int64_t n_cols, uint32_t seed) {
    const std::vector<float> src = random_floats(static_cast<size_t>(n_rows * n_cols), 0.05f, seed);
    quantized q;
    q.row_size = formats::row_size(type, n_cols);
    q.bytes.resize(q.row_size * static_cast<size_t>(n_rows));
    q.values.resize(src.size());
    for (int64_t r = 0; r < n_rows; ++r) {
        formats::quantize_row(type, src.data() + r * n_cols, q.bytes.data() + r * q.row_size, n_cols);
        formats::dequantize_row(type, q.bytes.data() + r * q.row_size, q.values.data() + r * n_cols, n_cols);
    }
    return q;
}

class MatvecFormat : public ::testing::TestWithParam<ggml_type> {};

TEST_P(MatvecFormat, MatchesReferenceForSeveralTokenCounts) {
    STRATA_REQUIRE_GPU();
    const ggml_type type = GetParam();
    const int64_t n_rows = 70, n_cols = 512;
    const quantized w = make_weights(type, n_rows, n_cols, 7);
    const auto dw = upload(w.bytes);
    for (int n_tok : {1, 3, 8, 11}) {
        const std::vector<float> x = random_floats(static_cast<size_t>(n_tok * n_cols), 1.0f, 11 + n_tok);
        const auto dx = upload(x);
        device_buffer<float> dy(static_cast<size_t>(n_tok * n_rows));
        matvec({type, dw.data(), n_rows, n_cols, w.row_size}, dx.data(), n_cols, n_tok, dy.data(), n_rows, nullptr);
        const std::vector<float> y = download(dy);
        for (int t = 0; t < n_tok; ++t)
            for (int64_t r = 0; r < n_rows; ++r) {
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < n_cols; ++c) {
                    ref += double(w.values[r * n_cols + c]) * x[t * n_cols + c];
                    mag += std::abs(double(w.values[r * n_cols + c]) * x[t * n_cols + c]);
                }
                ASSERT_NEAR(y[t * n_rows + r], ref, 1e-4 * mag + 1e-6)
                    << formats::info(type).name << " token " << t << " row " << r;
            }
    }
}

// Three blocks per row (a warp pass that covers 8 blocks of the 32-element formats is left partly idle)
// and activations that are not 16-byte aligned (the kernel's element-wise loads).
TEST_P(MatvecFormat, PartialPassesAndUnalignedActivations) {
    STRATA_REQUIRE_GPU();
    const ggml_type type = GetParam();
    const int64_t n_rows = 9, n_cols = 3 * std::max<int64_t>(32, formats::info(type).block_size);
    const int64_t x_stride = n_cols + 1;
    const int n_tok = 3;
    const quantized w = make_weights(type, n_rows, n_cols, 5);
    const auto dw = upload(w.bytes);
    const std::vector<float> x = random_floats(static_cast<size_t>(n_tok * x_stride + 1), 1.0f, 6);
    const auto dx = upload(x);
    device_buffer<float> dy(static_cast<size_t>(n_tok * n_rows));
    matvec({type, dw.data(), n_rows, n_cols, w.row_size}, dx.data() + 1, x_stride, n_tok, dy.data(), n_rows, nullptr);
    const std::vector<float> y = download(dy);
    for (int t = 0; t < n_tok; ++t)
        for (int64_t r = 0; r < n_rows; ++r) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < n_cols; ++c) {
                const double p = double(w.values[r * n_cols + c]) * x[1 + t * x_stride + c];
                ref += p;
                mag += std::abs(p);
            }
            ASSERT_NEAR(y[t * n_rows + r], ref, 1e-4 * mag + 1e-6) << "token " << t << " row " << r;
        }
}

TEST_P(MatvecFormat, BatchedJobsAndDequantiseToF16) {
    STRATA_REQUIRE_GPU();
    const ggml_type type = GetParam();
    const int64_t n_rows = 33, n_cols = 256;
    const quantized a = make_weights(type, n_rows, n_cols, 1), b = make_weights(type, n_rows, n_cols, 2);
    const auto da = upload(a.bytes), db = upload(b.bytes);
    const std::vector<float> x = random_floats(static_cast<size_t>(2 * n_cols), 1.0f, 3);
    const auto dx = upload(x);
    device_buffer<float> dy(static_cast<size_t>(3 * n_rows));
    const std::vector<matvec_job> jobs{{da.data(), dx.data(), dy.data()},
                                       {db.data(), dx.data() + n_cols, dy.data() + n_rows},
                                       {da.data(), dx.data() + n_cols, dy.data() + 2 * n_rows}};
    const auto djobs = upload(jobs);
    matvec_batched(type, n_rows, n_cols, a.row_size, djobs.data(), 3, nullptr);
    const std::vector<float> y = download(dy);
    const std::vector<const quantized*> w{&a, &b, &a};
    const std::vector<int> tok{0, 1, 1};
    for (int j = 0; j < 3; ++j)
        for (int64_t r = 0; r < n_rows; ++r) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < n_cols; ++c) {
                const double p = double(w[j]->values[r * n_cols + c]) * x[tok[j] * n_cols + c];
                ref += p;
                mag += std::abs(p);
            }
            ASSERT_NEAR(y[j * n_rows + r], ref, 1e-4 * mag + 1e-6) << "job " << j << " row " << r;
        }
    device_buffer<uint16_t> h(static_cast<size_t>(n_rows * n_cols));
    dequantize_f16({type, da.data(), n_rows, n_cols, a.row_size}, h.data(), nullptr);
    const std::vector<uint16_t> hv = download(h);
    for (size_t i = 0; i < hv.size(); ++i)  // one half ulp: the GPU may fuse the scale multiply-add
        ASSERT_NEAR(formats::fp16_to_fp32(hv[i]), a.values[i], std::abs(a.values[i]) / 1024 + 1e-7f) << "element " << i;
}

// The gathered jobs (tokens of one expert together, at most 8 per job) give every token's sums bit for
// bit as one-token batched jobs do, whatever rows they gather and scatter.
TEST_P(MatvecFormat, GatheredJobsAreBitwiseTheBatchedOnes) {
    STRATA_REQUIRE_GPU();
    const ggml_type type = GetParam();
    const int64_t n_rows = 33, n_cols = 256;
    const int n_tok = 11, n_expert = 3;
    std::vector<quantized> experts;
    for (int e = 0; e < n_expert; ++e) experts.push_back(make_weights(type, n_rows, n_cols, 40 + e));
    std::vector<device_buffer<uint8_t>> dw;
    for (const quantized& q : experts) dw.push_back(upload(q.bytes));
    const std::vector<float> x = random_floats(static_cast<size_t>(n_tok * n_cols), 1.0f, 9);
    const auto dx = upload(x);
    // Pairs (token, expert): expert 0 takes every token (two jobs), 1 the even ones, 2 tokens 3 and 7.
    std::vector<std::pair<int, int>> pairs;
    for (int t = 0; t < n_tok; ++t) {
        pairs.push_back({t, 0});
        if (t % 2 == 0) pairs.push_back({t, 1});
        if (t == 3 || t == 7) pairs.push_back({t, 2});
    }
    const size_t n_pairs = pairs.size();
    device_buffer<float> y_batched(n_pairs * n_rows), y_gathered(n_pairs * n_rows);
    std::vector<matvec_job> one;
    for (size_t p = 0; p < n_pairs; ++p)
        one.push_back({dw[static_cast<size_t>(pairs[p].second)].data(), dx.data() + pairs[p].first * n_cols,
                       y_batched.data() + p * n_rows});
    const auto d_one = upload(one);
    matvec_batched(type, n_rows, n_cols, experts[0].row_size, d_one.data(), static_cast<int>(n_pairs), nullptr);
    std::vector<matvec_gather_job> gathered;
    for (int e = 0; e < n_expert; ++e) {
        matvec_gather_job job{dw[static_cast<size_t>(e)].data(), dx.data(), y_gathered.data(), {}, {}, 0};
        for (size_t p = 0; p < n_pairs; ++p) {
            if (pairs[p].second != e) continue;
            job.x_row[job.n_tok] = pairs[p].first;
            job.y_row[job.n_tok] = static_cast<int32_t>(p);
            if (++job.n_tok == kGatherTokens) {
                gathered.push_back(job);
                job.n_tok = 0;
            }
        }
        if (job.n_tok > 0) gathered.push_back(job);
    }
    ASSERT_EQ(gathered.size(), 4u);  // 11 tokens of expert 0 need two jobs
    const auto d_gathered = upload(gathered);
    matvec_gathered(type, n_rows, n_cols, experts[0].row_size, n_cols, n_rows, d_gathered.data(),
                    static_cast<int>(gathered.size()), nullptr);
    const std::vector<float> a = download(y_batched), b = download(y_gathered);
    for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(a[i], b[i]) << "pair " << i / n_rows << " (token " << pairs[i / n_rows].first << ", expert "
                              << pairs[i / n_rows].second << ") row " << i % n_rows;
}

INSTANTIATE_TEST_SUITE_P(Formats, MatvecFormat,
                         ::testing::Values(ggml_type::F32, ggml_type::F16, ggml_type::BF16, ggml_type::Q4_0,
                                           ggml_type::Q8_0, ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K,
                                           ggml_type::IQ4_XS, ggml_type::IQ1_S, ggml_type::IQ1_M,
                                           ggml_type::IQ2_XXS, ggml_type::IQ2_XS, ggml_type::IQ2_S,
                                           ggml_type::IQ3_XXS, ggml_type::IQ3_S, ggml_type::MXFP4),
                         [](const auto& info) { return std::string(formats::info(info.param).name); });

// The weights as the GPU dequantises them, read through the matvec: token t's activations are the unit
// vector e_t, so y[t][r] = w[r][t] + zeros, the dequantised value itself.
std::vector<float> gpu_values(ggml_type type, const std::vector<uint8_t>& bytes, int64_t n_rows, int64_t n_cols) {
    std::vector<float> x(static_cast<size_t>(n_cols * n_cols), 0.0f);
    for (int64_t t = 0; t < n_cols; ++t) x[static_cast<size_t>(t * n_cols + t)] = 1.0f;
    const auto dw = upload(bytes);
    const auto dx = upload(x);
    device_buffer<float> dy(static_cast<size_t>(n_cols * n_rows));
    matvec({type, dw.data(), n_rows, n_cols, formats::row_size(type, n_cols)}, dx.data(), n_cols,
           static_cast<int>(n_cols), dy.data(), n_rows, nullptr);
    const std::vector<float> y = download(dy);
    std::vector<float> w(y.size());
    for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t c = 0; c < n_cols; ++c) w[static_cast<size_t>(r * n_cols + c)] = y[static_cast<size_t>(c * n_rows + r)];
    return w;
}

// The code-book formats and MXFP4 dequantise with the reference's operations: the same bits.
class CodeBookValues : public ::testing::TestWithParam<ggml_type> {};

TEST_P(CodeBookValues, AreTheReferenceBits) {
    STRATA_REQUIRE_GPU();
    const ggml_type type = GetParam();
    const int64_t n_rows = 6, n_cols = 512;
    const quantized w = make_weights(type, n_rows, n_cols, 21);
    const std::vector<float> got = gpu_values(type, w.bytes, n_rows, n_cols);
    int nonzero = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        nonzero += w.values[i] != 0.0f;
        ASSERT_EQ(got[i], w.values[i]) << formats::info(type).name << " row " << i / n_cols << " col " << i % n_cols;
    }
    EXPECT_GT(nonzero, n_rows * n_cols / 2) << "the weights are mostly zeros: the test would prove little";
}

// MXFP4's exponent byte over its range (2^-128 and 2^-127 are subnormal floats), every code. From 253
// up the larger codes are infinite, which the one-hot read cannot carry (inf * 0).
TEST(CodeBookValues, Mxfp4EveryExponentAndCode) {
    STRATA_REQUIRE_GPU();
    const int64_t n_rows = 253, n_cols = formats::QK_MXFP4;
    std::vector<uint8_t> bytes(static_cast<size_t>(n_rows) * sizeof(formats::block_mxfp4));
    auto* b = reinterpret_cast<formats::block_mxfp4*>(bytes.data());
    for (int e = 0; e < n_rows; ++e) {
        b[e].e = static_cast<uint8_t>(e);
        for (int j = 0; j < 16; ++j) b[e].qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    }
    std::vector<float> want(static_cast<size_t>(n_rows * n_cols));
    formats::dequantize_row(ggml_type::MXFP4, bytes.data(), want.data(), n_rows * n_cols);
    const std::vector<float> got = gpu_values(ggml_type::MXFP4, bytes, n_rows, n_cols);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "exponent " << i / n_cols << " element " << i % n_cols;
    EXPECT_EQ(want[1], std::ldexp(1.0f, -128));  // e = 0, code 1 (E2M1 0.5): 0.5 * 2^(0 - 127)
}

INSTANTIATE_TEST_SUITE_P(Formats, CodeBookValues,
                         ::testing::Values(ggml_type::IQ1_S, ggml_type::IQ1_M, ggml_type::IQ2_XXS, ggml_type::IQ2_XS,
                                           ggml_type::IQ2_S, ggml_type::IQ3_XXS, ggml_type::IQ3_S, ggml_type::MXFP4),
                         [](const auto& info) { return std::string(formats::info(info.param).name); });

// Every format the CPU reads and the CUDA path takes: has_matvec, matvec_types and the dispatch agree.
TEST(CudaKernels, HasMatvecMatchesTheTypeList) {
    const std::string list = matvec_types();
    int listed_count = 0;
    for (uint32_t id = 0; id < 64; ++id) {
        const formats::type_info* t = formats::find_type(id);
        if (!t) continue;
        const ggml_type type = t->type;
        const std::string name(t->name);
        const bool listed = (", " + list + ",").find(", " + name + ",") != std::string::npos;
        EXPECT_EQ(has_matvec(type), listed) << name;
        listed_count += listed;
    }
    EXPECT_EQ(listed_count, 17) << list;
}

TEST(CudaKernels, RmsNormAndRopeMatchTheCpu) {
    STRATA_REQUIRE_GPU();
    const int n_tok = 3, n_head = 4, hd = 64, n = n_head * hd;
    const std::vector<float> x = random_floats(static_cast<size_t>(n_tok * n), 1.0f, 5);
    const std::vector<float> w = random_floats(static_cast<size_t>(n), 1.0f, 6);
    auto dx = upload(x);
    const auto dw = upload(w);
    device_buffer<float> dy(x.size());
    rms_norm(dx.data(), dw.data(), 1e-6f, n, n_tok, dy.data(), nullptr);
    const std::vector<float> y = download(dy);
    for (int t = 0; t < n_tok; ++t) {
        std::vector<float> ref(static_cast<size_t>(n));
        cpu::rms_norm(x.data() + t * n, w.data(), 1e-6f, n, ref.data());
        for (int i = 0; i < n; ++i) ASSERT_NEAR(y[t * n + i], ref[i], 1e-5f * (1 + std::abs(ref[i])));
    }
    // Plain, linear x4, and YaRN x4 over an original context of 64 at positions past it (n_rot < hd).
    kernels::rope_params linear;
    linear.scaling = kernels::rope_scaling::linear;
    linear.freq_scale = 0.25f;
    kernels::rope_params yarn = linear;
    yarn.scaling = kernels::rope_scaling::yarn;
    yarn.n_ctx_orig = 64;
    yarn.ext_factor = 1.0f;
    yarn.attn_factor = 0.9f;
    const struct {
        const char* name;
        kernels::rope_params p;
        int pos0, n_rot;
    } cases[] = {{"none", {}, 17, hd}, {"linear", linear, 17, hd}, {"yarn", yarn, 200, hd}, {"yarn n_rot 32", yarn, 90, 32}};
    for (const auto& c : cases)
        for (bool neox : {false, true}) {
            auto dq = upload(x);
            rope(dq.data(), n_tok, n_head, hd, c.n_rot, c.pos0, c.p, neox, nullptr);
            const std::vector<float> q = download(dq);
            for (int t = 0; t < n_tok; ++t) {
                std::vector<float> ref(x.begin() + t * n, x.begin() + (t + 1) * n);
                cpu::rope(ref.data(), n_head, hd, c.n_rot, c.pos0 + t, c.p,
                          neox ? cpu::rope_style::neox : cpu::rope_style::normal);
                for (int i = 0; i < n; ++i)
                    ASSERT_NEAR(q[t * n + i], ref[i], 1e-4f) << c.name << " neox " << neox << " t " << t << " i " << i;
            }
        }
}

// Both cache formats: the stored rows byte for byte as the CPU cache's (formats::quantize_row F16 /
// Q8_0), and the attention against a naive double-precision one over the stored values.
TEST(CudaKernels, AttentionOverTheCacheMatchesNaive) {
    STRATA_REQUIRE_GPU();
    const int n_head = 4, n_head_kv = 2, hd = 64, n_kv = n_head_kv * hd, n_ctx = 40, pos0 = 20, n_tok = 5;
    const int n_pos = pos0 + n_tok;
    const std::vector<float> k = random_floats(static_cast<size_t>(n_pos * n_kv), 1.0f, 8);
    const std::vector<float> v = random_floats(static_cast<size_t>(n_pos * n_kv), 1.0f, 9);
    const std::vector<float> q = random_floats(static_cast<size_t>(n_tok * n_head * hd), 1.0f, 10);
    const auto dk = upload(k), dv = upload(v), dq = upload(q);
    for (const kv_format f : {kv_format::f16, kv_format::q8_0}) {
        const ggml_type type = f == kv_format::f16 ? ggml_type::F16 : ggml_type::Q8_0;
        const size_t row = kv_row_bytes(f, n_kv);
        ASSERT_EQ(row, formats::row_size(type, n_kv));
        device_buffer<uint8_t> kc(row * n_ctx), vc(row * n_ctx);
        // Positions [0, pos0) in one call, the rest in a second (a prompt, then its continuation).
        kv_store(f, dk.data(), dv.data(), pos0, n_kv, 0, kc.data(), vc.data(), nullptr);
        kv_store(f, dk.data() + pos0 * n_kv, dv.data() + pos0 * n_kv, n_tok, n_kv, pos0, kc.data(), vc.data(), nullptr);
        const std::vector<uint8_t> k_rows = download(kc), v_rows = download(vc);
        std::vector<float> kd(k.size()), vd(v.size());  // the stored values, dequantised by the reference
        for (int s = 0; s < n_pos; ++s) {
            std::vector<uint8_t> want(row);
            formats::quantize_row(type, &k[s * n_kv], want.data(), n_kv);
            ASSERT_TRUE(std::equal(want.begin(), want.end(), k_rows.begin() + s * row))
                << "K row " << s << " type " << int(f);
            formats::quantize_row(type, &v[s * n_kv], want.data(), n_kv);
            ASSERT_TRUE(std::equal(want.begin(), want.end(), v_rows.begin() + s * row))
                << "V row " << s << " type " << int(f);
            formats::dequantize_row(type, k_rows.data() + s * row, &kd[s * n_kv], n_kv);
            formats::dequantize_row(type, v_rows.data() + s * row, &vd[s * n_kv], n_kv);
        }
        device_buffer<float> scratch(static_cast<size_t>(n_tok * n_head * n_pos)), out(q.size());
        const float scale = 1.0f / std::sqrt(float(hd));
        attention(f, dq.data(), kc.data(), vc.data(), n_tok, pos0, n_head, n_head_kv, hd, scale, scratch.data(),
                  out.data(), nullptr);
        const std::vector<float> o = download(out);
        // Against Q8_0 keys the query is quantized to Q8_0 too (the CPU's int8 scores, cpu/attention.hpp).
        std::vector<float> qr(q);
        if (f == kv_format::q8_0) {
            std::vector<uint8_t> blocks(formats::row_size(type, hd));
            for (size_t r = 0; r < q.size() / hd; ++r) {
                formats::quantize_row(type, &q[r * hd], blocks.data(), hd);
                formats::dequantize_row(type, blocks.data(), &qr[r * hd], hd);
            }
        }
        for (int t = 0; t < n_tok; ++t)
            for (int head = 0; head < n_head; ++head) {
                const int g = head / (n_head / n_head_kv), len = pos0 + t + 1;
                std::vector<double> p(static_cast<size_t>(len));
                double m = -1e30, sum = 0;
                for (int s = 0; s < len; ++s) {
                    double d = 0;
                    for (int i = 0; i < hd; ++i) d += qr[(t * n_head + head) * hd + i] * kd[s * n_kv + g * hd + i];
                    p[s] = d * scale;
                    m = std::max(m, p[s]);
                }
                for (double& x : p) sum += (x = std::exp(x - m));
                for (int i = 0; i < hd; ++i) {
                    double ref = 0;
                    for (int s = 0; s < len; ++s) ref += p[s] / sum * vd[s * n_kv + g * hd + i];
                    ASSERT_NEAR(o[(t * n_head + head) * hd + i], ref, 1e-4)
                        << "t " << t << " head " << head << " type " << int(f);
                }
            }
    }
    EXPECT_THROW(kv_row_bytes(kv_format::q8_0, 48), std::invalid_argument);
}

TEST(CudaKernels, RoutingMatchesRouteToken) {
    STRATA_REQUIRE_GPU();
    const int n_tok = 6, n_expert = 64, k = 8;
    const std::vector<float> logits = random_floats(static_cast<size_t>(n_tok * n_expert), 2.0f, 12);
    const auto dl = upload(logits);
    for (bool normalize : {false, true}) {
        device_buffer<int32_t> ids(static_cast<size_t>(n_tok * k));
        device_buffer<float> w(static_cast<size_t>(n_tok * k));
        route_topk(dl.data(), n_tok, n_expert, k, normalize, ids.data(), w.data(), nullptr);
        const std::vector<int32_t> gi = download(ids);
        const std::vector<float> gw = download(w);
        for (int t = 0; t < n_tok; ++t) {
            int32_t ri[k];
            float rw[k];
            engine::route_token(logits.data() + t * n_expert, n_expert, k, normalize, ri, rw);
            for (int j = 0; j < k; ++j) {
                EXPECT_EQ(gi[t * k + j], ri[j]) << "token " << t << " slot " << j;
                EXPECT_NEAR(gw[t * k + j], rw[j], 1e-5f);
            }
        }
    }
}

// glm4moe's and DeepSeek-V3's routing: sigmoid or softmax scores, a selection bias as large as the
// gaps between scores (so it changes the choice), groups, renormalisation and scale. The same experts
// as the CPU in the same order, and the same weights.
TEST(CudaKernels, RoutingWithBiasGroupsAndScaleMatchesRouteToken) {
    STRATA_REQUIRE_GPU();
    const int n_tok = 7, n_expert = 64, k = 6;
    const std::vector<float> logits = random_floats(static_cast<size_t>(n_tok * n_expert), 2.0f, 13);
    const std::vector<float> bias = random_floats(static_cast<size_t>(n_expert), 0.1f, 14);
    const auto dl = upload(logits), db = upload(bias);
    struct routing_case {
        const char* name;
        engine::routing_options o;
        bool with_bias;
    };
    using engine::gating_func;
    const routing_case cases[] = {
        {"sigmoid, bias, norm, scale 2.5", {gating_func::sigmoid, true, 2.5f, 0, 0}, true},
        {"sigmoid, bias, unnormalised", {gating_func::sigmoid, false, 0.0f, 0, 0}, true},
        {"sigmoid, no bias, scale 1", {gating_func::sigmoid, true, 1.0f, 0, 0}, false},
        {"softmax, bias, scale 16", {gating_func::softmax, false, 16.0f, 0, 0}, true},
        {"sigmoid, bias, 8 groups of which 3", {gating_func::sigmoid, true, 2.5f, 8, 3}, true},
        {"softmax, 4 groups of which 2", {gating_func::softmax, true, 0.0f, 4, 2}, false},
    };
    for (const routing_case& c : cases) {
        route_params p;
        p.sigmoid = c.o.gating == gating_func::sigmoid;
        p.bias = c.with_bias ? db.data() : nullptr;
        p.normalize = c.o.normalize;
        p.scale = c.o.scale;
        p.n_group = c.o.n_group;
        p.n_group_used = c.o.n_group_used;
        device_buffer<int32_t> ids(static_cast<size_t>(n_tok * k));
        device_buffer<float> w(static_cast<size_t>(n_tok * k));
        route_topk(dl.data(), n_tok, n_expert, k, p, ids.data(), w.data(), nullptr);
        const std::vector<int32_t> gi = download(ids);
        const std::vector<float> gw = download(w);
        int changed_by_bias = 0;
        for (int t = 0; t < n_tok; ++t) {
            int32_t ri[k], unbiased[k];
            float rw[k], uw[k];
            const float* lt = logits.data() + t * n_expert;
            engine::route_token(lt, c.with_bias ? bias.data() : nullptr, n_expert, k, c.o, ri, rw);
            engine::route_token(lt, nullptr, n_expert, k, c.o, unbiased, uw);
            changed_by_bias += !std::equal(ri, ri + k, unbiased);
            for (int j = 0; j < k; ++j) {
                EXPECT_EQ(gi[t * k + j], ri[j]) << c.name << ": token " << t << " slot " << j;
                EXPECT_NEAR(gw[t * k + j], rw[j], 1e-5f * std::max(1.0f, std::abs(rw[j]))) << c.name;
            }
        }
        if (c.with_bias) {
            EXPECT_GT(changed_by_bias, 0) << c.name << ": the bias never changed a choice, so it is not tested";
        }
    }
    route_params bad;
    bad.n_group = 5;  // 64 experts are not 5 equal groups
    bad.n_group_used = 2;
    device_buffer<int32_t> ids(static_cast<size_t>(k));
    device_buffer<float> w(static_cast<size_t>(k));
    EXPECT_THROW(route_topk(dl.data(), 1, n_expert, k, bad, ids.data(), w.data(), nullptr), std::invalid_argument);
}

TEST(CudaKernels, ElementwiseAndWeightedSum) {
    STRATA_REQUIRE_GPU();
    const int n = 300;
    const std::vector<float> a = random_floats(n, 1.0f, 20), b = random_floats(n, 1.0f, 21);
    const auto da = upload(a), db = upload(b);
    device_buffer<float> out(n);
    silu_mul(da.data(), db.data(), n, out.data(), nullptr);
    std::vector<float> ref(n);
    cpu::silu_mul(a.data(), b.data(), n, ref.data());
    const std::vector<float> o = download(out);
    for (int i = 0; i < n; ++i) ASSERT_NEAR(o[i], ref[i], 1e-5f * (1 + std::abs(ref[i])));

    // 3 tokens of 100: token 0 has jobs 0, 1; token 1 none; token 2 job 2 (y rows are a's thirds).
    const std::vector<float> wts{0.5f, 0.25f, 2.0f};
    const std::vector<int32_t> begin{0, 2, 2, 3};
    const auto dwts = upload(wts);
    const auto dbegin = upload(begin);
    device_buffer<float> sum(300);
    weighted_sum(da.data(), dwts.data(), dbegin.data(), 3, 100, sum.data(), nullptr);
    const std::vector<float> s = download(sum);
    for (int i = 0; i < 100; ++i) {
        EXPECT_FLOAT_EQ(s[i], 0.5f * a[i] + 0.25f * a[100 + i]);
        EXPECT_EQ(s[100 + i], 0.0f);
        EXPECT_FLOAT_EQ(s[200 + i], 2.0f * a[200 + i]);
    }
}

}  // namespace
}  // namespace strata::kernels::cuda
