// Tiled attention, AVX-512 (F + BW + VL + DQ): attn_tile for F16 and Q8_0 tiles.
//
// The same algorithm as attention/avx2.cpp, on 16 lanes with blocks of 8 rows (32 registers):
//   kt[head_dim][n_pad]    the tile's keys, f32, transposed (tile_convert.hpp; n_pad a multiple of 32,
//                          rows padded by kRowPad);
//   vf[n][head_dim]        its values, f32 (rows padded by kRowPad);
//   score[kRows][n_pad]    scale * q_r . k_t, one lane per position; then p = exp(score - max) in place;
//   acc[kRows][head_dim]   sum_t p_t v_t, one lane per dimension;
// each row's (max, sum, acc) then folded into the state with the shared attn_merge_row.
//
// NOTE: as in avx2.cpp: each score one FMA chain over the dimensions in order, each acc element one FMA
// chain over the positions in order (a row's positions past its own visible count carry p = 0, which
// leaves acc unchanged), exp a polynomial, a row's sum 16 lane sums then _mm512_reduce_add_ps. A row's
// state depends only on its q, its last_pos and the tile. AVX512-BF16 dot products are not used: they
// would round f16 keys to 8 mantissa bits.
#include <algorithm>
#include <limits>

#include "cpu/attention/tile_convert.hpp"
#include "cpu/detail/kernel_table.hpp"

namespace strata::kernels::cpu::detail {
namespace {

constexpr int kRows = 8;      // query rows per register block
constexpr int kPosStep = 32;  // positions per score register block (2 vectors); n_pad is a multiple

// exp(x): the Cephes polynomial of vecops/avx2.cpp on 16 lanes, 2^n applied with scalef.
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // x - n ln2, Cody-Waite
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// Lanes i < n_valid set (n_valid >= 0; 16 or more: all).
static inline __mmask16 first_lanes(int n_valid) {
    return n_valid >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << n_valid) - 1);
}

// score[i][t] = scale * (q_i . k_t) for the block's R rows (q: [R][head_dim]), t < n_score.
template <int R>
static void scores(const float* q, int64_t head_dim, const float* kt, int n_pad, int n_score, float scale,
                   float* score) {
    for (int t = 0; t < n_score; t += kPosStep) {
        __m512 acc[R][2];
        for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
        const float* k = kt + t;  // k[j * (n_pad + kRowPad) + 0..31] = k_{t..t+31}[j]
        for (int64_t j = 0; j < head_dim; ++j, k += n_pad + kRowPad) {
            const __m512 k0 = _mm512_loadu_ps(k), k1 = _mm512_loadu_ps(k + 16);
            for (int i = 0; i < R; ++i) {
                const __m512 qj = _mm512_set1_ps(q[i * head_dim + j]);
                acc[i][0] = _mm512_fmadd_ps(qj, k0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(qj, k1, acc[i][1]);
            }
        }
        const __m512 s = _mm512_set1_ps(scale);
        for (int i = 0; i < R; ++i) {
            _mm512_storeu_ps(score + i * n_pad + t, _mm512_mul_ps(acc[i][0], s));
            _mm512_storeu_ps(score + i * n_pad + t + 16, _mm512_mul_ps(acc[i][1], s));
        }
    }
}

// One row: s[t] <- exp(s[t] - max) for t < n_vis, 0 for n_vis <= t < n_score; returns the sum, sets max.
static float softmax_row(float* s, int n_vis, int n_score, float* max_out) {
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int t = 0; t < n_vis; t += 16) m = _mm512_mask_max_ps(m, first_lanes(n_vis - t), m, _mm512_loadu_ps(s + t));
    const float max = _mm512_reduce_max_ps(m);
    const __m512 vmax = _mm512_set1_ps(max);
    __m512 sum = _mm512_setzero_ps();
    int t = 0;
    for (; t < n_vis; t += 16) {
        const __m512 p = _mm512_maskz_mov_ps(first_lanes(n_vis - t), exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t), vmax)));
        _mm512_storeu_ps(s + t, p);
        sum = _mm512_add_ps(sum, p);
    }
    for (; t < n_score; t += 16) _mm512_storeu_ps(s + t, _mm512_setzero_ps());
    *max_out = max;
    return _mm512_reduce_add_ps(sum);
}

// acc[i][:] = sum_{t < n_t} p[i][t] vf[t][:] for the block's R rows (p: [R][n_pad]).
template <int R>
static void weighted_values(const float* p, int n_pad, int n_t, const float* vf, int64_t head_dim, float* acc) {
    int64_t j = 0;
    for (; j + 32 <= head_dim; j += 32) {
        __m512 a[R][2];
        for (auto& x : a) x[0] = x[1] = _mm512_setzero_ps();
        const float* v = vf + j;
        for (int t = 0; t < n_t; ++t, v += head_dim + kRowPad) {
            const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            for (int i = 0; i < R; ++i) {
                const __m512 pt = _mm512_set1_ps(p[i * n_pad + t]);
                a[i][0] = _mm512_fmadd_ps(pt, v0, a[i][0]);
                a[i][1] = _mm512_fmadd_ps(pt, v1, a[i][1]);
            }
        }
        for (int i = 0; i < R; ++i) {
            _mm512_storeu_ps(acc + i * head_dim + j, a[i][0]);
            _mm512_storeu_ps(acc + i * head_dim + j + 16, a[i][1]);
        }
    }
    if (j < head_dim) {  // head_dim = 32 m + 16
        __m512 a[R];
        for (auto& x : a) x = _mm512_setzero_ps();
        const float* v = vf + j;
        for (int t = 0; t < n_t; ++t, v += head_dim + kRowPad) {
            const __m512 v0 = _mm512_loadu_ps(v);
            for (int i = 0; i < R; ++i) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[i * n_pad + t]), v0, a[i]);
        }
        for (int i = 0; i < R; ++i) _mm512_storeu_ps(acc + i * head_dim + j, a[i]);
    }
}

// Rows [r0, r0 + R) of the call: their tile states, folded into st.
template <int R>
static void row_block(const kv_tile& kv, int64_t head_dim, const float* q, const int64_t* last_pos, float scale,
                      const attn_state& st, int r0, const float* kt, const float* vf, int n_pad) {
    alignas(64) float p[R * attn_tile_max];     // [R][n_pad] scores, then probabilities
    alignas(64) float acc[R * kSimdMaxHeadDim];  // [R][head_dim]
    int n_vis[R], max_vis = 0;
    for (int i = 0; i < R; ++i) max_vis = std::max(max_vis, n_vis[i] = visible(kv, last_pos[r0 + i]));
    if (max_vis == 0) return;
    const int n_score = (max_vis + kPosStep - 1) / kPosStep * kPosStep;
    scores<R>(q + r0 * head_dim, head_dim, kt, n_pad, n_score, scale, p);
    float max[R], sum[R];
    for (int i = 0; i < R; ++i) sum[i] = softmax_row(p + i * n_pad, n_vis[i], n_score, max + i);
    weighted_values<R>(p, n_pad, max_vis, vf, head_dim, acc);
    for (int i = 0; i < R; ++i)
        if (n_vis[i] > 0)
            attn_merge_row(head_dim, st.max + r0 + i, st.sum + r0 + i, st.acc + (r0 + i) * head_dim, max[i], sum[i],
                           acc + i * head_dim);
}

// The last n_left < kRows rows, as one block of that many (R counts down to n_left).
template <int R>
static void row_tail(const kv_tile& kv, int64_t head_dim, const float* q, const int64_t* last_pos, float scale,
                     const attn_state& st, int r0, int n_left, const float* kt, const float* vf, int n_pad) {
    if constexpr (R > 0) {
        if (n_left == R) return row_block<R>(kv, head_dim, q, last_pos, scale, st, r0, kt, vf, n_pad);
        row_tail<R - 1>(kv, head_dim, q, last_pos, scale, st, r0, n_left, kt, vf, n_pad);
    }
}

template <ggml_type T>
static void attn_tile_t(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                        float scale, const attn_state& st) {
    bool any = false;
    for (int r = 0; r < n_rows && !any; ++r) any = visible(kv, last_pos[r]) > 0;
    if (!any) return;
    alignas(64) float kt[kTileFloats];  // [head_dim][n_pad + kRowPad]
    alignas(64) float vf[kTileFloats];  // [n][head_dim + kRowPad]
    const int n_pad = (kv.n + kPosStep - 1) / kPosStep * kPosStep;
    convert_tile<T>(kv, head_dim, n_pad, kt, vf);
    int r0 = 0;
    for (; r0 + kRows <= n_rows; r0 += kRows) row_block<kRows>(kv, head_dim, q, last_pos, scale, st, r0, kt, vf, n_pad);
    row_tail<kRows - 1>(kv, head_dim, q, last_pos, scale, st, r0, n_rows - r0, kt, vf, n_pad);
}

}  // namespace

// Heads that are not a multiple of 16 or larger than kSimdMaxHeadDim take the AVX2 kernel.
void attn_tile_avx512(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                      float scale, const attn_state& st) {
    if (head_dim % 16 != 0 || head_dim > kSimdMaxHeadDim)
        return attn_tile_avx2(kv, head_dim, q, n_rows, last_pos, scale, st);
    if (kv.type == ggml_type::F16)
        attn_tile_t<ggml_type::F16>(kv, head_dim, q, n_rows, last_pos, scale, st);
    else
        attn_tile_t<ggml_type::Q8_0>(kv, head_dim, q, n_rows, last_pos, scale, st);
}

}  // namespace strata::kernels::cpu::detail
