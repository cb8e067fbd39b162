// Internal: the delta rule's SIMD kernels, written once over a vector type V and included by
// delta_net/avx2.cpp and avx512.cpp (each compiled with its own flags; everything here has internal
// linkage so the two instantiations never meet at link time). V provides: type, width (floats), zero,
// set1, load, store, mul, fmadd (a*b+c), fnmadd (c-a*b), and the register blocking seq_nb (state vectors
// per column block of the sequential form), seq1_na / seq1_nb (the one-token form's read block and update
// sub-block) and gemm_nb (vectors per row of a GEMM tile).
//
// Lanes are always columns of the state (the value dim) or of a [chunk][chunk] matrix, so every sum runs
// over its index in order in one lane: no horizontal sums, and results independent of the blocking.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/delta_net.hpp"
#include "cpu/delta_net/layout.hpp"
#include "cpu/detail/exp_avx2.hpp"
#include "cpu/detail/kernel_table.hpp"

namespace strata::kernels::cpu::detail {
namespace {

// ---- Sequential form ---------------------------------------------------------------------------------
// NOTE: the scalar kernel's operations, reordered. A column block of NB vectors of S ([d_k][NB * width])
// is copied to a contiguous buffer that stays in L1 while every token of the call passes over it (in
// place, a block's rows 4 * NB * width bytes apart would map to a fraction of the L1 sets and evict each
// other); one pass per token updates the block (S[i] = e^g S[i] + k[i] delta), accumulates o = S^T q and
// the next token's S^T k; the last token's pass writes the block back to S. The first token's S^T k is
// summed while copying in, in the same order as the fused sums, so a call split anywhere gives the same bits.
template <class V, int NB>
void seq_block(float* S, const delta_io& io, int n_tok, int j0) {
    using vec = typename V::type;
    constexpr int W = V::width, BW = NB * W;
    const int dk = io.d_k;
    const ptrdiff_t dv = io.d_v;
    alignas(64) float blk[delta_rule_max_dim * BW];  // [d_k][BW]
    float* base = S + j0;
    vec sk[NB], delta[NB], o[NB];
    for (int b = 0; b < NB; ++b) sk[b] = V::zero();
    for (int i = 0; i < dk; ++i) {
        const vec ki = V::set1(io.k[i]);
        for (int b = 0; b < NB; ++b) {
            const vec s = V::load(base + i * dv + b * W);
            V::store(blk + i * BW + b * W, s);
            sk[b] = V::fmadd(ki, s, sk[b]);
        }
    }
    for (int t = 0; t < n_tok; ++t) {
        const float* q = io.q + t * io.q_stride;
        const float* k = io.k + t * io.k_stride;
        const float* v = io.v + t * io.v_stride + j0;
        const vec eg = V::set1(std::exp(io.g[t * io.g_stride]));
        const vec beta = V::set1(io.beta[t * io.beta_stride]);
        for (int b = 0; b < NB; ++b) {
            delta[b] = V::mul(beta, V::fnmadd(eg, sk[b], V::load(v + b * W)));
            o[b] = V::zero();
            sk[b] = V::zero();
        }
        if (t + 1 < n_tok) {
            const float* k_next = k + io.k_stride;
            for (int i = 0; i < dk; ++i) {
                const vec ki = V::set1(k[i]), qi = V::set1(q[i]), kn = V::set1(k_next[i]);
                for (int b = 0; b < NB; ++b) {
                    float* p = blk + i * BW + b * W;
                    const vec s = V::fmadd(ki, delta[b], V::mul(eg, V::load(p)));
                    V::store(p, s);
                    o[b] = V::fmadd(qi, s, o[b]);
                    sk[b] = V::fmadd(kn, s, sk[b]);
                }
            }
        } else {
            for (int i = 0; i < dk; ++i) {
                const vec ki = V::set1(k[i]), qi = V::set1(q[i]);
                for (int b = 0; b < NB; ++b) {
                    const vec s = V::fmadd(ki, delta[b], V::mul(eg, V::load(blk + i * BW + b * W)));
                    V::store(base + i * dv + b * W, s);
                    o[b] = V::fmadd(qi, s, o[b]);
                }
            }
        }
        float* out = io.o + t * io.o_stride + j0;
        for (int b = 0; b < NB; ++b) V::store(out + b * W, o[b]);
    }
}

// One token (decode), no copy to a buffer: a column block of NA vectors is read from memory once for
// S^T k, then updated in place from cache in sub-blocks of NB vectors. seq_block's operations in its
// order, so the same bits; whole rows per block keep the read from memory contiguous.
template <class V, int NA, int NB>
void seq_one_block(float* S, const delta_io& io, int j0) {
    using vec = typename V::type;
    constexpr int W = V::width;
    static_assert(NA % NB == 0);
    const int dk = io.d_k;
    const ptrdiff_t dv = io.d_v;
    float* base = S + j0;
    vec sk[NA];
    for (int b = 0; b < NA; ++b) sk[b] = V::zero();
    for (int i = 0; i < dk; ++i) {
        const vec ki = V::set1(io.k[i]);
        for (int b = 0; b < NA; ++b) sk[b] = V::fmadd(ki, V::load(base + i * dv + b * W), sk[b]);
    }
    const vec eg = V::set1(std::exp(io.g[0]));
    const vec beta = V::set1(io.beta[0]);
    for (int c = 0; c < NA; c += NB) {
        vec delta[NB], o[NB];
        for (int b = 0; b < NB; ++b) {
            delta[b] = V::mul(beta, V::fnmadd(eg, sk[c + b], V::load(io.v + j0 + (c + b) * W)));
            o[b] = V::zero();
        }
        for (int i = 0; i < dk; ++i) {
            const vec ki = V::set1(io.k[i]), qi = V::set1(io.q[i]);
            for (int b = 0; b < NB; ++b) {
                float* p = base + i * dv + (c + b) * W;
                const vec s = V::fmadd(ki, delta[b], V::mul(eg, V::load(p)));
                V::store(p, s);
                o[b] = V::fmadd(qi, s, o[b]);
            }
        }
        for (int b = 0; b < NB; ++b) V::store(io.o + j0 + (c + b) * W, o[b]);
    }
}

template <class V>
void delta_seq_simd(float* S, const delta_io& io, int n_tok) {
    constexpr int W = V::width, NB = V::seq_nb;
    if (io.d_v % W != 0) {
        delta_seq_scalar(S, io, n_tok);
        return;
    }
    if (n_tok == 1) {
        constexpr int NA = V::seq1_na, NB1 = V::seq1_nb;
        int j0 = 0;
        for (; io.d_v - j0 >= NA * W; j0 += NA * W) seq_one_block<V, NA, NB1>(S, io, j0);
        if constexpr (NA > 4)
            for (; io.d_v - j0 >= 4 * W; j0 += 4 * W) seq_one_block<V, 4, 4>(S, io, j0);
        for (; j0 < io.d_v; j0 += W) seq_one_block<V, 1, 1>(S, io, j0);
        return;
    }
    // Tiles of tokens, so a tile's q, k, v rows stay in L2 while each column block passes over them.
    constexpr int token_tile = 64;
    for (int t0 = 0; t0 < n_tok; t0 += token_tile) {
        const delta_io tile = io.from(t0);
        const int n = std::min(token_tile, n_tok - t0);
        int j0 = 0;
        for (; io.d_v - j0 >= NB * W; j0 += NB * W) seq_block<V, NB>(S, tile, n, j0);
        switch ((io.d_v - j0) / W) {
            case 1: seq_block<V, 1>(S, tile, n, j0); break;
            case 2: if constexpr (NB > 2) seq_block<V, 2>(S, tile, n, j0); break;
            case 3: if constexpr (NB > 3) seq_block<V, 3>(S, tile, n, j0); break;
            default: break;
        }
    }
}

// ---- GEMM tiles for the chunked form -----------------------------------------------------------------
// C[r][0, NB*width) = (scale_c ? scale_c * C[r] : 0) -/+ sum_{p < p_len} A[r * a_r + p * a_p] * B[p][.]
// for R rows r; B rows ldb floats apart, C rows ldc apart. A is read by broadcasts, so any strides do
// (A transposed: a_r = 1).
template <class V, int R, int NB, bool Sub>
void gemm_tile(int p_len, const float* A, ptrdiff_t a_r, ptrdiff_t a_p, const float* B, ptrdiff_t ldb, float* C,
               ptrdiff_t ldc, float scale_c) {
    using vec = typename V::type;
    constexpr int W = V::width;
    vec acc[R][NB];
    const vec sc = V::set1(scale_c);
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < NB; ++b) acc[r][b] = scale_c != 0 ? V::mul(sc, V::load(C + r * ldc + b * W)) : V::zero();
    for (int p = 0; p < p_len; ++p) {
        vec bv[NB];
        for (int b = 0; b < NB; ++b) bv[b] = V::load(B + p * ldb + b * W);
        for (int r = 0; r < R; ++r) {
            const vec a = V::set1(A[r * a_r + p * a_p]);
            for (int b = 0; b < NB; ++b) acc[r][b] = Sub ? V::fnmadd(a, bv[b], acc[r][b]) : V::fmadd(a, bv[b], acc[r][b]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < NB; ++b) V::store(C + r * ldc + b * W, acc[r][b]);
}

constexpr int kGemmRows = 4;

template <class V, int R, bool Sub>
void gemm_rows(int nb, int p_len, const float* A, ptrdiff_t a_r, ptrdiff_t a_p, const float* B, ptrdiff_t ldb, float* C,
               ptrdiff_t ldc, float scale_c) {
    switch (nb) {
        case 1: gemm_tile<V, R, 1, Sub>(p_len, A, a_r, a_p, B, ldb, C, ldc, scale_c); return;
        case 2: gemm_tile<V, R, 2, Sub>(p_len, A, a_r, a_p, B, ldb, C, ldc, scale_c); return;
        case 3: if constexpr (V::gemm_nb >= 3) gemm_tile<V, R, 3, Sub>(p_len, A, a_r, a_p, B, ldb, C, ldc, scale_c); return;
        case 4: if constexpr (V::gemm_nb >= 4) gemm_tile<V, R, 4, Sub>(p_len, A, a_r, a_p, B, ldb, C, ldc, scale_c); return;
        default: return;
    }
}

// Which part of a product a triangular operand lets the GEMM skip.
enum class tri { none, lower_a, lower_c };

// C [m][n] (n a multiple of the width) as gemm_tile says, over tiles of 4 rows x gemm_nb vectors, column
// blocks outermost so a block of B stays in L1 while every row passes. lower_a: A is lower triangular
// (row r uses p <= r); lower_c: only C's columns c <= r are wanted (whole vectors past them are skipped).
// b_block: floats from one column block of B (gemm_nb vectors wide) to the next; 0: B is row-major.
template <class V, bool Sub>
void gemm(int m, int n, int p_len, const float* A, ptrdiff_t a_r, ptrdiff_t a_p, const float* B, ptrdiff_t ldb, float* C,
          ptrdiff_t ldc, float scale_c, tri shape = tri::none, ptrdiff_t b_block = 0) {
    constexpr int W = V::width, NB = V::gemm_nb;
    for (int c0 = 0; c0 < n; c0 += NB * W) {
        const float* Bc = B + (b_block > 0 ? c0 / (NB * W) * b_block : c0);
        for (int r0 = 0; r0 < m; r0 += kGemmRows) {
            const int rows = std::min(kGemmRows, m - r0);
            int cols = std::min(NB * W, n - c0);
            if (shape == tri::lower_c) cols = std::min(cols, (r0 + rows + W - 1) / W * W - c0);
            if (cols <= 0) continue;
            const int pl = shape == tri::lower_a ? std::min(p_len, r0 + rows) : p_len;
            const float* a = A + r0 * a_r;
            float* c = C + r0 * ldc + c0;
            switch (rows) {
                case 1: gemm_rows<V, 1, Sub>(cols / W, pl, a, a_r, a_p, Bc, ldb, c, ldc, scale_c); break;
                case 2: gemm_rows<V, 2, Sub>(cols / W, pl, a, a_r, a_p, Bc, ldb, c, ldc, scale_c); break;
                case 3: gemm_rows<V, 3, Sub>(cols / W, pl, a, a_r, a_p, Bc, ldb, c, ldc, scale_c); break;
                default: gemm_rows<V, 4, Sub>(cols / W, pl, a, a_r, a_p, Bc, ldb, c, ldc, scale_c); break;
            }
        }
    }
}

// x[0, n) <- exp(x), n a multiple of 8.
inline void exp_inplace(float* x, int n) {
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, exp_avx2(_mm256_loadu_ps(x + i)));
}

// ---- Chunked form: one chunk of n tokens -------------------------------------------------------------
// The scalar kernel's steps as GEMMs over the layout's buffers (delta_net.hpp has the formulas).
template <class V>
void delta_chunk_simd(float* S, const delta_io& io, int n, int chunk, float* scratch) {
    constexpr int W = V::width;
    const int dk = io.d_k, dv = io.d_v;
    if (dk % W != 0 || dv % W != 0) {
        delta_chunk_scalar(S, io, n, chunk, scratch);
        return;
    }
    const delta_chunk_layout L(dk, dv, chunk);
    const int cp = static_cast<int>(L.c_pad);
    float* G = scratch + L.G;
    float* A = scratch + L.A;
    float* P = scratch + L.P;
    float* U = scratch + L.U;
    float* Wm = scratch + L.W;
    float* qd = scratch + L.qd;
    float* kd = scratch + L.kd;
    float* kt = scratch + L.kt;
    const int n_pad = (n + W - 1) / W * W;  // columns of the [chunk][c_pad] matrices in use

    for (int t = 0; t < n; ++t) G[t] = (t > 0 ? G[t - 1] : 0.0f) + io.g[t * io.g_stride];
    const float g_last = G[n - 1];
    // Token-wise scalings and K transposed (zero columns past n).
    for (int t = 0; t < n; ++t) {
        const float* q = io.q + t * io.q_stride;
        const float* k = io.k + t * io.k_stride;
        const float eg = std::exp(G[t]), e_last = std::exp(g_last - G[t]);
        const float bg = io.beta[t * io.beta_stride] * eg;
        for (int i = 0; i < dk; ++i) {
            qd[t * dk + i] = eg * q[i];
            kd[t * dk + i] = e_last * k[i];
            Wm[t * dk + i] = bg * k[i];
            kt[i * cp + t] = k[i];
        }
        const float beta = io.beta[t * io.beta_stride];
        const float* v = io.v + t * io.v_stride;
        for (int j = 0; j < dv; ++j) U[t * dv + j] = beta * v[j];
    }
    for (int i = 0; i < dk; ++i)
        for (int t = n; t < n_pad; ++t) kt[i * cp + t] = 0.0f;

    // k_t.k_s and q_t.k_s for s <= t (whole vectors), then A and P with their decays.
    gemm<V, false>(n, n_pad, dk, io.k, io.k_stride, 1, kt, cp, A, cp, 0.0f, tri::lower_c);
    gemm<V, false>(n, n_pad, dk, io.q, io.q_stride, 1, kt, cp, P, cp, 0.0f, tri::lower_c);
    alignas(64) float e[delta_rule_max_chunk + 16];
    for (int t = 0; t < n; ++t) {
        const int s_end = (t + 1 + 7) / 8 * 8;
        for (int s = 0; s < s_end; ++s) e[s] = s <= t ? G[t] - G[s] : 0.0f;
        exp_inplace(e, s_end);
        const float beta = io.beta[t * io.beta_stride];
        float* a = A + t * cp;
        float* p = P + t * cp;
        for (int s = 0; s < t; ++s) a[s] = beta * e[s] * a[s];
        for (int s = 0; s <= t; ++s) p[s] = e[s] * p[s];
        for (int s = t; s < n_pad; ++s) a[s] = 0.0f;
        for (int s = t + 1; s < n_pad; ++s) p[s] = 0.0f;
    }
    // Forward substitution, row by row: U[t] -= sum_{s<t} A[t][s] U[s], the same for W.
    for (int t = 1; t < n; ++t) {
        gemm<V, true>(1, dv, t, A + t * cp, 0, 1, U, dv, U + t * dv, dv, 1.0f);
        gemm<V, true>(1, dk, t, A + t * cp, 0, 1, Wm, dk, Wm + t * dk, dk, 1.0f);
    }
    // D = U - W S0 (in U); O = Qd S0 + P D; S = e^{G_last} S0 + Kd^T D. S0 is read from a copy in column
    // blocks ([d_v / BW][d_k][BW]): in place, a block's rows would share a fraction of the L1 sets.
    constexpr int BW = V::gemm_nb * W;
    float* sb = scratch + L.sb;
    for (int c0 = 0; c0 < dv; c0 += BW) {
        const int w = std::min(BW, dv - c0);
        for (int i = 0; i < dk; ++i) std::memcpy(sb + c0 * dk + i * BW, S + i * dv + c0, sizeof(float) * w);
    }
    gemm<V, true>(n, dv, dk, Wm, dk, 1, sb, BW, U, dv, 1.0f, tri::none, ptrdiff_t{dk} * BW);
    gemm<V, false>(n, dv, dk, qd, dk, 1, sb, BW, io.o, io.o_stride, 0.0f, tri::none, ptrdiff_t{dk} * BW);
    gemm<V, false>(n, dv, n, P, cp, 1, U, dv, io.o, io.o_stride, 1.0f, tri::lower_a);
    gemm<V, false>(dk, dv, n, kd, 1, dk, U, dv, S, dv, std::exp(g_last));  // e^{G_last} == 0: S0 forgotten
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
