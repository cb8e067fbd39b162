#include "model/delta_net.hpp"

#include <cmath>
#include <cstring>

#include <algorithm>

#include "cpu/kernels.hpp"
#include "model/parallel.hpp"

#if __has_include("cpu/delta_net.hpp")
#include "cpu/delta_net.hpp"
#define STRATA_HAVE_DELTA_NET_KERNELS 1
#endif

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

#ifndef STRATA_HAVE_DELTA_NET_KERNELS
// Until kernels/cpu/delta_net.hpp lands: its contract in plain scalar code (token by token).
namespace fallback {
constexpr int delta_rule_default_chunk = 64;
size_t delta_rule_chunked_scratch(int, int, int) { return 16; }
void delta_rule_run(float* S, int64_t, int d_k, int d_v, int n_tok, const float* q, ptrdiff_t q_stride, const float* k,
                    ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, const float* g, ptrdiff_t g_stride,
                    const float* beta, ptrdiff_t beta_stride, float* o, ptrdiff_t o_stride, int, float*) {
    std::vector<float> delta(static_cast<size_t>(d_v));
    for (int t = 0; t < n_tok; ++t) {
        const float* qt = q + t * q_stride;
        const float* kt = k + t * k_stride;
        const float* vt = v + t * v_stride;
        const float decay = std::exp(g[t * g_stride]), b = beta[t * beta_stride];
        for (int i = 0; i < d_k * d_v; ++i) S[i] *= decay;
        for (int j = 0; j < d_v; ++j) {
            float sk = 0;
            for (int i = 0; i < d_k; ++i) sk += S[i * d_v + j] * kt[i];
            delta[static_cast<size_t>(j)] = b * (vt[j] - sk);
        }
        for (int i = 0; i < d_k; ++i)
            for (int j = 0; j < d_v; ++j) S[i * d_v + j] += kt[i] * delta[static_cast<size_t>(j)];
        float* ot = o + t * o_stride;
        for (int j = 0; j < d_v; ++j) {
            float acc = 0;
            for (int i = 0; i < d_k; ++i) acc += S[i * d_v + j] * qt[i];
            ot[j] = acc;
        }
    }
}
void causal_conv1d_silu(float* st, const float* x, ptrdiff_t x_stride, const float* w, int n_tok, int channels,
                        int kernel, float* y, ptrdiff_t y_stride) {
    const int km1 = kernel - 1;
    for (int t = 0; t < n_tok; ++t)
        for (int c = 0; c < channels; ++c) {
            float acc = 0;
            for (int j = 0; j < kernel; ++j) {
                const int src = t - km1 + j;  // token index; negative: the state's row km1 + src
                const float in = src >= 0 ? x[src * x_stride + c] : st[(km1 + src) * channels + c];
                acc += w[c * kernel + j] * in;
            }
            y[t * y_stride + c] = acc / (1.0f + std::exp(-acc));
        }
    std::vector<float> keep(static_cast<size_t>(km1) * channels);
    for (int r = 0; r < km1; ++r) {
        const int src = n_tok - km1 + r;
        for (int c = 0; c < channels; ++c)
            keep[static_cast<size_t>(r) * channels + c] = src >= 0 ? x[src * x_stride + c] : st[(km1 + src) * channels + c];
    }
    std::copy(keep.begin(), keep.end(), st);
}
}  // namespace fallback
using namespace fallback;
#else
using cpu::causal_conv1d_silu;
using cpu::delta_rule_chunked_scratch;
using cpu::delta_rule_default_chunk;
using cpu::delta_rule_run;
#endif

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // ggml's threshold
float silu(float x) { return x / (1.0f + std::exp(-x)); }

// x /= max(|x|, eps), as ggml_l2_norm.
void l2_normalize(float* x, int n, float eps, float scale) {
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += double{x[i]} * x[i];
    const float inv = scale / std::max(static_cast<float>(std::sqrt(sum)), eps);
    for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

delta_net_mixer::delta_net_mixer(arenas::expert_pool& pool, const hparams& hp) : pool_(pool), hp_(hp) {}

void delta_net_mixer::run(const layer_weights& l, int r, recurrent_state& state, int n_tok, float* qkv, const float* z,
                          const float* b, const float* a, float* out) {
    const int dk = hp_.ssm_d_state, n_k = hp_.ssm_n_k_head, n_v = hp_.ssm_n_v_head, conv_dim = hp_.ssm_conv_dim();
    const int key_dim = hp_.ssm_key_dim(), value_dim = hp_.ssm_value_dim();
    const size_t nt = static_cast<size_t>(n_tok);
    conv_out_.resize(nt * static_cast<size_t>(conv_dim));
    g_.resize(nt * static_cast<size_t>(n_v));
    beta_.resize(nt * static_cast<size_t>(n_v));
    causal_conv1d_silu(state.conv(r), qkv, conv_dim, l.ssm_conv1d, n_tok, conv_dim, hp_.ssm_conv_kernel,
                            conv_out_.data(), conv_dim);
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (size_t t = 0; t < nt; ++t) {
        float* row = conv_out_.data() + t * conv_dim;
        for (int h = 0; h < n_k; ++h) {
            l2_normalize(row + h * dk, dk, hp_.rms_eps, q_scale);
            l2_normalize(row + key_dim + h * dk, dk, hp_.rms_eps, 1.0f);
        }
        for (int h = 0; h < n_v; ++h) {
            const size_t i = t * n_v + static_cast<size_t>(h);
            beta_[i] = sigmoid(b[i]);
            g_[i] = l.ssm_a[h] * softplus(a[i] + l.ssm_dt_bias[h]);
        }
    }
    const int group = n_v / n_k;
    float* S0 = state.ssm(r);
    const size_t scratch_floats = (delta_rule_chunked_scratch(dk, dk, delta_rule_default_chunk) + 15) / 16 * 16;
    if (scratch_.size() < scratch_floats * n_v + 16) scratch_.resize(scratch_floats * n_v + 16);
    float* scratch0 = scratch_.data() + (16 - reinterpret_cast<uintptr_t>(scratch_.data()) / sizeof(float) % 16) % 16;
    const int64_t pos0 = state.pos();
    parallel_rows(pool_, n_v, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
            const int kh = hp_.ssm_v_tiled ? static_cast<int>(h % n_k) : static_cast<int>(h / group);
            const float* q = conv_out_.data() + static_cast<size_t>(kh) * dk;
            const float* k = q + key_dim;
            const float* v = conv_out_.data() + 2 * static_cast<size_t>(key_dim) + static_cast<size_t>(h) * dk;
            float* S = S0 + static_cast<size_t>(h) * dk * dk;
            float* o = out + static_cast<size_t>(h) * dk;
            delta_rule_run(S, pos0, dk, dk, n_tok, q, conv_dim, k, conv_dim, v, conv_dim, g_.data() + h, n_v,
                           beta_.data() + h, n_v, o, value_dim, delta_rule_default_chunk,
                           scratch0 + static_cast<size_t>(h) * scratch_floats);
            for (size_t t = 0; t < nt; ++t) {
                float* ot = o + t * value_dim;
                const float* zt = z + t * value_dim + static_cast<size_t>(h) * dk;
                cpu::rms_norm(ot, l.ssm_norm, hp_.rms_eps, dk, ot);
                for (int i = 0; i < dk; ++i) ot[i] *= silu(zt[i]);
            }
        }
    });
}

void delta_net_mixer::split_ssm_in(const hparams& hp, const float* in, int n_tok, float* qkv, float* z) {
    const size_t dk = static_cast<size_t>(hp.ssm_d_state), n_k = static_cast<size_t>(hp.ssm_n_k_head);
    const size_t per_k = static_cast<size_t>(hp.ssm_n_v_head) / n_k * dk;  // one key head's v (or z) width
    const size_t key_dim = n_k * dk, conv_dim = static_cast<size_t>(hp.ssm_conv_dim());
    const size_t value_dim = static_cast<size_t>(hp.ssm_value_dim()), in_row = conv_dim + value_dim;
    for (size_t t = 0; t < static_cast<size_t>(n_tok); ++t) {
        const float* src = in + t * in_row;
        float* dst = qkv + t * conv_dim;
        for (size_t h = 0; h < n_k; ++h) {
            const float* s = src + h * (2 * dk + 2 * per_k);
            std::memcpy(dst + h * dk, s, dk * sizeof(float));
            std::memcpy(dst + key_dim + h * dk, s + dk, dk * sizeof(float));
            std::memcpy(dst + 2 * key_dim + h * per_k, s + 2 * dk, per_k * sizeof(float));
            std::memcpy(z + t * value_dim + h * per_k, s + 2 * dk + per_k, per_k * sizeof(float));
        }
    }
}

void delta_net_mixer::split_ba(const hparams& hp, const float* ba, int n_tok, float* b, float* a) {
    const size_t n_v = static_cast<size_t>(hp.ssm_n_v_head), n_k = static_cast<size_t>(hp.ssm_n_k_head);
    const size_t group = n_v / n_k;
    for (size_t t = 0; t < static_cast<size_t>(n_tok); ++t)
        for (size_t h = 0; h < n_k; ++h)
            for (size_t j = 0; j < group; ++j) {
                b[t * n_v + h * group + j] = ba[t * 2 * n_v + h * 2 * group + j];
                a[t * n_v + h * group + j] = ba[t * 2 * n_v + h * 2 * group + group + j];
            }
}

}  // namespace strata::engine
