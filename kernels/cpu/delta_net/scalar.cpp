// The delta rule in plain C++ (every ISA's fallback, and the reference the SIMD kernels follow).
//
// Sequential form, per token: sk = S^T k (sum over the key dim in order), delta = beta (v - exp(g) sk),
// then row by row S[i] = exp(g) S[i] + k[i] delta and o += q[i] S[i] (the new row). A token's operations
// do not depend on the other tokens of the call, so splitting a call changes no bit.
#include <cmath>
#include <cstring>

#include "cpu/delta_net.hpp"
#include "cpu/delta_net/layout.hpp"
#include "cpu/detail/kernel_table.hpp"

namespace strata::kernels::cpu::detail {

void delta_seq_scalar(float* S, const delta_io& io, int n_tok) {
    const int dk = io.d_k, dv = io.d_v;
    float sk[delta_rule_max_dim], delta[delta_rule_max_dim];
    for (int t = 0; t < n_tok; ++t) {
        const float* q = io.q + t * io.q_stride;
        const float* k = io.k + t * io.k_stride;
        const float* v = io.v + t * io.v_stride;
        float* o = io.o + t * io.o_stride;
        const float eg = std::exp(io.g[t * io.g_stride]);
        const float beta = io.beta[t * io.beta_stride];
        std::memset(sk, 0, sizeof(float) * static_cast<size_t>(dv));
        for (int i = 0; i < dk; ++i)
            for (int j = 0; j < dv; ++j) sk[j] += k[i] * S[i * dv + j];
        for (int j = 0; j < dv; ++j) delta[j] = beta * (v[j] - eg * sk[j]);
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(dv));
        for (int i = 0; i < dk; ++i) {
            float* row = S + i * dv;
            for (int j = 0; j < dv; ++j) {
                row[j] = eg * row[j] + k[i] * delta[j];
                o[j] += q[i] * row[j];
            }
        }
    }
}

// One chunk of n tokens, the formulas of delta_net.hpp written out loop by loop.
void delta_chunk_scalar(float* S, const delta_io& io, int n, int chunk, float* scratch) {
    const int dk = io.d_k, dv = io.d_v;
    const delta_chunk_layout L(dk, dv, chunk);
    const auto cp = static_cast<ptrdiff_t>(L.c_pad);
    float* G = scratch + L.G;
    float* A = scratch + L.A;
    float* P = scratch + L.P;
    float* U = scratch + L.U;
    float* W = scratch + L.W;
    auto q = [&](int t) { return io.q + t * io.q_stride; };
    auto k = [&](int t) { return io.k + t * io.k_stride; };
    auto dot = [&](const float* a, const float* b) {
        float s = 0;
        for (int i = 0; i < dk; ++i) s += a[i] * b[i];
        return s;
    };
    for (int t = 0; t < n; ++t) G[t] = (t > 0 ? G[t - 1] : 0.0f) + io.g[t * io.g_stride];
    // A[t][s] = beta_t exp(G_t - G_s) k_t.k_s (s < t), P[t][s] = exp(G_t - G_s) q_t.k_s (s <= t).
    for (int t = 0; t < n; ++t) {
        const float beta = io.beta[t * io.beta_stride];
        for (int s = 0; s <= t; ++s) {
            const float e = std::exp(G[t] - G[s]);
            A[t * cp + s] = s < t ? beta * e * dot(k(t), k(s)) : 0.0f;
            P[t * cp + s] = e * dot(q(t), k(s));
        }
    }
    // Forward substitution: (I + A) U = diag(beta) V, (I + A) W = diag(beta exp(G)) K.
    for (int t = 0; t < n; ++t) {
        const float beta = io.beta[t * io.beta_stride];
        const float bg = beta * std::exp(G[t]);
        const float* v = io.v + t * io.v_stride;
        for (int j = 0; j < dv; ++j) U[t * dv + j] = beta * v[j];
        for (int i = 0; i < dk; ++i) W[t * dk + i] = bg * k(t)[i];
        for (int s = 0; s < t; ++s) {
            const float a = A[t * cp + s];
            for (int j = 0; j < dv; ++j) U[t * dv + j] -= a * U[s * dv + j];
            for (int i = 0; i < dk; ++i) W[t * dk + i] -= a * W[s * dk + i];
        }
    }
    // D = U - W S0 (in U), then O from S0 and D.
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < dk; ++i)
            for (int j = 0; j < dv; ++j) U[t * dv + j] -= W[t * dk + i] * S[i * dv + j];
    for (int t = 0; t < n; ++t) {
        float* o = io.o + t * io.o_stride;
        const float eg = std::exp(G[t]);
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(dv));
        for (int i = 0; i < dk; ++i) {
            const float qi = eg * q(t)[i];
            for (int j = 0; j < dv; ++j) o[j] += qi * S[i * dv + j];
        }
        for (int s = 0; s <= t; ++s)
            for (int j = 0; j < dv; ++j) o[j] += P[t * cp + s] * U[s * dv + j];
    }
    // S = exp(G_last) S0 + sum_s exp(G_last - G_s) k_s D_s^T.
    const float e_last = std::exp(G[n - 1]);
    for (int i = 0; i < dk * dv; ++i) S[i] *= e_last;
    for (int s = 0; s < n; ++s) {
        const float e = std::exp(G[n - 1] - G[s]);
        for (int i = 0; i < dk; ++i) {
            const float ki = e * k(s)[i];
            for (int j = 0; j < dv; ++j) S[i * dv + j] += ki * U[s * dv + j];
        }
    }
}

}  // namespace strata::kernels::cpu::detail
