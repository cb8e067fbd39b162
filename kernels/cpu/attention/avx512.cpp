// Tiled attention, AVX-512 (F + BW + VL + DQ + VNNI): attn_tile for F16 and Q8_0 tiles.
//
// The same algorithm as attention/avx2.cpp, on 16 lanes with blocks of 8 rows (32 registers):
//   kt[head_dim][n_pad]    F16: the tile's keys, f32, transposed (tile_convert.hpp; n_pad a multiple of
//                          32, rows padded by kRowPad); Q8_0 keys are scored with vpdpbusd straight from
//                          their blocks against the quantized query (score_block_q8);
//   vf[n][head_dim]        its values, f32 (rows padded by kRowPad);
//   score[kRows][n_pad]    scale * q_r . k_t, one lane per position; then p = exp(score - max) in place;
//   acc[kRows][head_dim]   sum_t p_t v_t, one lane per dimension;
// each row's (max, sum, acc) then folded into the state with the shared attn_merge_row. Calls of at most
// kFewRows rows (decode) take attn_tile_few instead, which streams the tile with the same arithmetic;
// so do heads larger than kSimdMaxHeadDim (deepseek2's latent attention), kFewRows rows per call.
//
// NOTE: as in avx2.cpp: each score one FMA chain over the dimensions in order, each acc element one FMA
// chain over the positions in order (a row's positions past its own visible count carry p = 0, which
// leaves acc unchanged), exp a polynomial, a row's sum 16 lane sums then _mm512_reduce_add_ps. A row's
// state depends only on its q, its last_pos and the tile. AVX512-BF16 dot products are not used: they
// would round f16 keys to 8 mantissa bits.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu/attention/q8_query.hpp"
#include "cpu/attention/tile_convert.hpp"
#include "cpu/detail/kernel_table.hpp"

namespace strata::kernels::cpu::detail {
namespace {

constexpr int kRows = 8;        // query rows per register block
constexpr int kPosStep = 32;    // positions per score register block (2 vectors); n_pad is a multiple
constexpr int kFewRows = 16;    // calls with at most this many rows (decode) take attn_tile_few
constexpr int kValueRows = 8;   // query rows per register block of attn_tile_few's weighted values
constexpr int kValueVectors = 2;  // 16-float vectors per value row and pass: 8 x 2 accumulators
constexpr int kLdp = attn_tile_max;  // floats between rows of scores / probabilities: a constant, so the
                                     // value pass's broadcasts address rows by displacement, not registers
constexpr int kPrefetchItems = 2;  // how many key blocks or value chunks ahead attn_tile_few prefetches
constexpr int kPrefetchPos = kPrefetchItems * kPosStep;

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

// One block of kPosStep scores for the block's R rows (q: [R][head_dim]): score[i][0..31] =
// scale * sum_j q_i[j] k_{0..31}[j], each one FMA chain over the dimensions in order; keys(j, k0, k1)
// gives dimension j of the 32 keys.
template <int R, class Keys>
static inline void score_block(const float* q, int64_t head_dim, Keys&& keys, float scale, float* score, int lds) {
    __m512 acc[R][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
    for (int64_t j = 0; j < head_dim; ++j) {
        __m512 k0, k1;
        keys(j, k0, k1);
        for (int i = 0; i < R; ++i) {
            const __m512 qj = _mm512_set1_ps(q[i * head_dim + j]);
            acc[i][0] = _mm512_fmadd_ps(qj, k0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(qj, k1, acc[i][1]);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
    for (int i = 0; i < R; ++i) {
        _mm512_storeu_ps(score + i * lds, _mm512_mul_ps(acc[i][0], s));
        _mm512_storeu_ps(score + i * lds + 16, _mm512_mul_ps(acc[i][1], s));
    }
}

// score[i][t] = scale * (q_i . k_t) for the block's R rows, t < n_score (kt: [head_dim][ldk] transposed
// keys; score: [R][lds]).
template <int R>
static void scores(const float* q, int64_t head_dim, const float* kt, int64_t ldk, int n_score, float scale,
                   float* score, int lds) {
    for (int t = 0; t < n_score; t += kPosStep)
        score_block<R>(
            q, head_dim,
            [&](int64_t j, __m512& k0, __m512& k1) {
                k0 = _mm512_loadu_ps(kt + j * ldk + t);
                k1 = _mm512_loadu_ps(kt + j * ldk + t + 16);
            },
            scale, score + t, lds);
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

// Element j of keys t .. t + 15 (t a multiple of 16) of an F16 tile, from the blocked layout of
// attention.hpp: the values load_keys8 gives, 16 at a time.
static inline __m512 load_keys16(const uint8_t* k, size_t row_bytes, int t, int64_t j) {
    const uint8_t* at = k + attn_key_offset(ggml_type::F16, row_bytes, t, j);
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}

// quantize_query (q8_query.hpp) on 16 lanes, bit for bit: the largest |x| of each block of 32, its
// half d by the F16C round-to-nearest-even convert, and q = clamp(round-to-even(x * (1 / d)), -127, 127).
static inline void quantize_query16(const float* q, int64_t head_dim, const q8_query_view& out) {
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t b = 0; b < head_dim / formats::QK8_0; ++b) {
        const __m512 x0 = _mm512_loadu_ps(q + 32 * b), x1 = _mm512_loadu_ps(q + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = _cvtsh_ss(_cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        const __m512i i0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), lo), hi);
        const __m512i i1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, id)), lo), hi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out.qs + 32 * b), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out.qs + 32 * b + 16), _mm512_cvtepi32_epi8(i1));
        out.d[b] = d;
        out.sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

// Quantized query rows for Q8_0 keys: row i's quants at qs + i * head_dim, its block scales and sums
// at d + i * n_b, sum + i * n_b (n_b = head_dim / 32).
struct q8_rows {
    const int8_t* qs;
    const float* d;
    const int32_t* sum;
    int64_t head_dim;
};

// Rows [i0, i0 + R) (R <= 4, so the 2 R accumulators, the keys and the query stay in registers) of
// score_block_q8 for block b of 32 dimensions.
template <int R>
static inline void score_rows_q8(const q8_rows& q, int i0, int64_t b, const uint8_t* kb, __m512 dk0, __m512 dk1,
                                 float scale, float* score, int lds) {
    const int64_t head_dim = q.head_dim, n_b = head_dim / formats::QK8_0;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i a[R][2];
    for (int i = 0; i < R; ++i) a[i][0] = a[i][1] = _mm512_set1_epi32(-128 * q.sum[(i0 + i) * n_b + b]);
    const uint8_t* quads = kb + b * 8 * (kPosStep * 4);
    const int8_t* qs = q.qs + i0 * head_dim + b * 32;
    for (int st = 0; st < 8; ++st) {
        const __m512i k0 = _mm512_xor_si512(_mm512_loadu_si512(quads + st * 128), flip);
        const __m512i k1 = _mm512_xor_si512(_mm512_loadu_si512(quads + st * 128 + 64), flip);
        for (int i = 0; i < R; ++i) {
            int32_t q4;
            std::memcpy(&q4, qs + i * head_dim + st * 4, sizeof(q4));
            const __m512i qb = _mm512_set1_epi32(q4);
            a[i][0] = _mm512_dpbusd_epi32(a[i][0], k0, qb);
            a[i][1] = _mm512_dpbusd_epi32(a[i][1], k1, qb);
        }
    }
    for (int i = 0; i < R; ++i) {
        const __m512 dq = _mm512_set1_ps(q.d[(i0 + i) * n_b + b]);
        float* out = score + (i0 + i) * lds;
        __m512 f0 = _mm512_cvtepi32_ps(a[i][0]), f1 = _mm512_cvtepi32_ps(a[i][1]);
        if (b == 0) {
            f0 = _mm512_mul_ps(f0, _mm512_mul_ps(dk0, dq));
            f1 = _mm512_mul_ps(f1, _mm512_mul_ps(dk1, dq));
        } else {
            f0 = _mm512_fmadd_ps(f0, _mm512_mul_ps(dk0, dq), _mm512_loadu_ps(out));
            f1 = _mm512_fmadd_ps(f1, _mm512_mul_ps(dk1, dq), _mm512_loadu_ps(out + 16));
        }
        if (b == n_b - 1) {
            f0 = _mm512_mul_ps(f0, _mm512_set1_ps(scale));
            f1 = _mm512_mul_ps(f1, _mm512_set1_ps(scale));
        }
        _mm512_storeu_ps(out, f0);
        _mm512_storeu_ps(out + 16, f1);
    }
}

// The int8 scores of attention.hpp for the kPosStep positions of the Q8_0 key block kb, R rows:
// score[i][0..31] (stride lds). Per block of 32 dimensions, 8 steps of vpdpbusd over 4 dimensions of
// 16 positions, the keys made unsigned by +128 and the accumulators started at -128 * sum(q) to take
// that back out (exact); then one f32 FMA per block, in block order, into the score row. Rows go in
// groups of at most 4, each a pass over the block's keys (from L1 after the first). pf(step) is
// called head_dim / 4 times per call, spread over the blocks.
template <int R, class Prefetch>
static inline void score_block_q8(const q8_rows& q, const uint8_t* kb, float scale, float* score, int lds,
                                  Prefetch&& pf) {
    const int64_t head_dim = q.head_dim, n_b = head_dim / formats::QK8_0;
    const uint8_t* scales = kb + head_dim * kPosStep;
    for (int64_t b = 0; b < n_b; ++b) {
        for (int st = 0; st < 8; ++st) pf(b * 8 + st);
        const __m512 dk0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 64 * b)));
        const __m512 dk1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 64 * b + 32)));
        int i0 = 0;
        for (; i0 + 4 <= R; i0 += 4) score_rows_q8<4>(q, i0, b, kb, dk0, dk1, scale, score, lds);
        if constexpr (R % 4 != 0) score_rows_q8<R % 4>(q, i0, b, kb, dk0, dk1, scale, score, lds);
    }
}

// scores() for the kPosStep positions [t0, t0 + kPosStep) of an F16 tile read straight from their key
// block: the same key values and FMA chains, so the same scores as from convert_tile. stream.step() is
// called once per dimension, on a local copy (decode's prefetches, so the memory streams while the FMAs
// run).
template <int R, class Stream>
static void scores_blocked(const float* q, int64_t head_dim, const kv_tile& kv, int t0, float scale, float* score,
                           int lds, Stream& stream) {
    static_assert(kPosStep == attn_key_block);
    const auto* k = static_cast<const uint8_t*>(kv.k);
    const size_t row_bytes = kv.row_bytes;
    Stream ahead = stream;
    score_block<R>(
        q, head_dim,
        [&](int64_t j, __m512& k0, __m512& k1) {
            ahead.step();
            k0 = load_keys16(k, row_bytes, t0, j);
            k1 = load_keys16(k, row_bytes, t0 + 16, j);
        },
        scale, score, lds);
    stream = ahead;
}

// Elements j..j+15 (j a multiple of 16) of one Q8_0 tile row, as f32: d * q, as load8 gives them.
static inline __m512 load16_q8(const uint8_t* row, int64_t j) {
    const auto* b = reinterpret_cast<const formats::block_q8_0*>(row) + j / formats::QK8_0;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + j % formats::QK8_0));
    uint16_t d;
    std::memcpy(&d, &b->d, sizeof(d));
    const __m512 scale = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(d)));
    return _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
}

// Elements j..j+15 (j a multiple of 16) of one F16 tile row, as f32.
static inline __m512 load16_f16(const uint8_t* row, int64_t j) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * j)));
}

// acc[i][:] = sum_{t < n_t} p[i][t] v_t[:] for the block's R rows (acc: [R][v_dim]), the positions in
// chunks of C: every pass over the elements (16 D at a time) of one chunk, then the next chunk, the
// accumulators stored and reloaded in between (exact, so each acc element is still one FMA chain over the
// positions in order, whatever C). Decode takes chunks of kPosStep rows (8 KiB of f16 values), which stay
// in L1 over the passes. p: [R][kLdp]; value(t, j) gives v_t[j..j+15] (j a multiple of 16) as f32;
// chunk(t0) is called before each chunk (it may set stream) and stream.step() once per position and pass,
// on a local copy.
template <int R, int D, int C, class Value, class Chunk, class Stream>
static void weighted_values(const float* p, int n_t, int64_t v_dim, float* acc, Value value, Chunk&& chunk,
                            Stream& stream) {
    constexpr int ldp = kLdp;
    for (int t0 = 0; t0 < n_t; t0 += C) {
        const int t1 = std::min(n_t, t0 + C);
        chunk(t0);
        Stream ahead = stream;
        const auto step = [&] { ahead.step(); };
        int64_t j = 0;
        for (; j + 16 * D <= v_dim; j += 16 * D) {
            __m512 a[R][D];
            for (int i = 0; i < R; ++i)
                for (int c = 0; c < D; ++c)
                    a[i][c] = t0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + i * v_dim + j + 16 * c);
            for (int t = t0; t < t1; ++t) {
                step();
                __m512 vt[D];
                for (int c = 0; c < D; ++c) vt[c] = value(t, j + 16 * c);
                for (int i = 0; i < R; ++i) {
                    const __m512 pt = _mm512_set1_ps(p[i * ldp + t]);
                    for (int c = 0; c < D; ++c) a[i][c] = _mm512_fmadd_ps(pt, vt[c], a[i][c]);
                }
            }
            for (int i = 0; i < R; ++i)
                for (int c = 0; c < D; ++c) _mm512_storeu_ps(acc + i * v_dim + j + 16 * c, a[i][c]);
        }
        for (; j < v_dim; j += 16) {  // v_dim not a multiple of 16 D
            __m512 a[R];
            for (int i = 0; i < R; ++i) a[i] = t0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + i * v_dim + j);
            for (int t = t0; t < t1; ++t) {
                step();
                const __m512 v0 = value(t, j);
                for (int i = 0; i < R; ++i) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[i * ldp + t]), v0, a[i]);
            }
            for (int i = 0; i < R; ++i) _mm512_storeu_ps(acc + i * v_dim + j, a[i]);
        }
        stream = ahead;
    }
}

// Up to kFewRows query rows quantized for Q8_0 keys; rows(i0) views those from row i0 on.
struct q8_buf : q8_query_rows<kFewRows, kStreamMaxHeadDim> {
    q8_buf(const float* q, int64_t hd, int n) : q8_query_rows(q, hd, n, quantize_query16) {}
    q8_rows rows(int i0) const { return {qs + i0 * head_dim, d + i0 * n_b, sum + i0 * n_b, head_dim}; }
};

// Rows [r0, r0 + R) of the call: their tile states, folded into st.
template <ggml_type T, int R>
static void row_block(const kv_tile& kv, int64_t head_dim, const float* q, const int64_t* last_pos, float scale,
                      const attn_state& st, int r0, const float* kt, const float* vf, int n_pad) {
    alignas(64) float p[R * kLdp];              // [R][kLdp] scores, then probabilities
    alignas(64) float acc[R * kSimdMaxHeadDim];  // [R][v_dim]
    const int64_t v_dim = attn_value_dim(kv, head_dim);
    int n_vis[R], max_vis = 0;
    for (int i = 0; i < R; ++i) max_vis = std::max(max_vis, n_vis[i] = visible(kv, last_pos[r0 + i]));
    if (max_vis == 0) return;
    const int n_score = (max_vis + kPosStep - 1) / kPosStep * kPosStep;
    if constexpr (T == ggml_type::F16) {
        scores<R>(q + r0 * head_dim, head_dim, kt, n_pad + kRowPad, n_score, scale, p, kLdp);
    } else {
        const q8_buf qq(q + r0 * head_dim, head_dim, R);
        const auto* k = static_cast<const uint8_t*>(kv.k);
        for (int t = 0; t < n_score; t += kPosStep)
            score_block_q8<R>(qq.rows(0), k + t * kv.row_bytes, scale, p + t, kLdp, [](int64_t) {});
    }
    float max[R], sum[R];
    for (int i = 0; i < R; ++i) sum[i] = softmax_row(p + i * kLdp, n_vis[i], n_score, max + i);
    const int64_t ldv = v_dim + kRowPad;
    const auto value = [=](int t, int64_t j) { return _mm512_loadu_ps(vf + t * ldv + j); };
    no_prefetch none;
    weighted_values<R, 2, attn_tile_max>(p, max_vis, v_dim, acc, value, [](int) {}, none);
    for (int i = 0; i < R; ++i)
        if (n_vis[i] > 0)
            attn_merge_row(v_dim, st.max + r0 + i, st.sum + r0 + i, st.acc + (r0 + i) * v_dim, max[i], sum[i],
                           acc + i * v_dim);
}

// The last n_left < kRows rows, as one block of that many (R counts down to n_left).
template <ggml_type T, int R>
static void row_tail(const kv_tile& kv, int64_t head_dim, const float* q, const int64_t* last_pos, float scale,
                     const attn_state& st, int r0, int n_left, const float* kt, const float* vf, int n_pad) {
    if constexpr (R > 0) {
        if (n_left == R) return row_block<T, R>(kv, head_dim, q, last_pos, scale, st, r0, kt, vf, n_pad);
        row_tail<T, R - 1>(kv, head_dim, q, last_pos, scale, st, r0, n_left, kt, vf, n_pad);
    }
}

// NOTE: calls with few rows (decode: one token's query heads of a kv head) never convert the whole tile:
// keys are scored straight from their blocks (no transposes, no copy), for every row at once; values are
// read from the tile and converted in registers, in blocks of kValueRows rows x 32 dimensions (so a value
// row is converted once for all the group's rows), kPosStep positions at a time so the chunk stays in L1
// over the passes. Every score, exp, sum and acc element is still the same operation sequence as
// row_block's (p = 0 past a row's visible positions leaves acc unchanged), so prompts and decode agree
// bitwise. Memory is read in order (key blocks, value chunks, the next tile's first key blocks) and each
// item is prefetched kPrefetchItems items ahead, a line per step of the work (a burst of requests per
// block left the FMAs waiting).
template <ggml_type T>
static void attn_tile_few(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                          float scale, const attn_state& st) {
    alignas(64) float p[kFewRows * kLdp];                 // [n_rows][kLdp] scores, then probabilities
    alignas(64) float acc[kValueRows * kStreamMaxHeadDim];  // [kValueRows][v_dim]
    const int64_t v_dim = attn_value_dim(kv, head_dim);
    const size_t v_stride = attn_value_stride(kv);
    int n_vis[kFewRows], max_vis = 0;
    for (int r = 0; r < n_rows; ++r) max_vis = std::max(max_vis, n_vis[r] = visible(kv, last_pos[r]));
    if (max_vis == 0) return;
    const int n_pad = (max_vis + kPosStep - 1) / kPosStep * kPosStep;
    prefetch_rows(kv, kv.k, kv.row_bytes, 0, kPrefetchPos);
    const auto* kb = static_cast<const char*>(kv.k);
    const auto* vb = static_cast<const char*>(kv.v);
    const size_t block_bytes = kPosStep * kv.row_bytes, v_block_bytes = kPosStep * v_stride;  // a key block; kPosStep value rows
    const int64_t block_lines = static_cast<int64_t>((block_bytes + 63) / 64);
    const int64_t v_block_lines = static_cast<int64_t>((v_block_bytes + 63) / 64);
    // Decode reads the tile as items: its n_kb key blocks, then its values kPosStep rows at a time, then
    // the caller's next tile's key blocks. While it works on item i it asks for item i + kPrefetchItems,
    // spread over the work (the hardware prefetchers stop at 4 KiB pages).
    const int n_kb = n_pad / kPosStep;
    const auto item = [&](int i, int64_t steps) -> prefetch_stream {
        if (i < n_kb) return {kb + i * block_bytes, block_lines, steps};
        if (i < 2 * n_kb) return {vb + (i - n_kb) * v_block_bytes, v_block_lines, steps};
        if (kv.next_k) return {static_cast<const char*>(kv.next_k) + (i - 2 * n_kb) * block_bytes, block_lines, steps};
        return {kb, 0, steps};  // nothing left: the first line, already here
    };
    prefetch_stream ahead = item(kPrefetchItems, 1);
    const int groups = (n_rows + kRows - 1) / kRows;
    if constexpr (T == ggml_type::F16) {
        for (int t0 = 0; t0 < n_pad; t0 += kPosStep) {
            ahead = item(t0 / kPosStep + kPrefetchItems, head_dim * groups);
            for (int r0 = 0; r0 < n_rows; r0 += kRows)
                with_rows<kRows>(std::min(kRows, n_rows - r0), [&](auto rows) {
                    scores_blocked<rows()>(q + r0 * head_dim, head_dim, kv, t0, scale, p + r0 * kLdp + t0, kLdp, ahead);
                });
        }
    } else {
        const q8_buf qq(q, head_dim, n_rows);
        for (int t0 = 0; t0 < n_pad; t0 += kPosStep) {
            // 4 steps per call of pf: a key block has more lines (68 at head_dim 128) than calls, and a
            // step asks for one line.
            ahead = item(t0 / kPosStep + kPrefetchItems, head_dim * groups);
            for (int r0 = 0; r0 < n_rows; r0 += kRows)
                with_rows<kRows>(std::min(kRows, n_rows - r0), [&](auto rows) {
                    score_block_q8<rows()>(qq.rows(r0),
                                           static_cast<const uint8_t*>(kv.k) + t0 / kPosStep * block_bytes, scale,
                                           p + r0 * kLdp + t0, kLdp, [&](int64_t) {
                                               for (int s = 0; s < 4; ++s) ahead.step();
                                           });
                });
        }
    }
    const auto* v = static_cast<const uint8_t*>(kv.v);
    const int64_t passes = (v_dim + 16 * kValueVectors - 1) / (16 * kValueVectors);
    for (int r0 = 0; r0 < n_rows; r0 += kValueRows) {
        const int nr = std::min(kValueRows, n_rows - r0);
        int block_vis = 0;
        for (int i = 0; i < nr; ++i) block_vis = std::max(block_vis, n_vis[r0 + i]);
        if (block_vis == 0) continue;
        float max[kValueRows], sum[kValueRows];
        for (int i = 0; i < nr; ++i) sum[i] = softmax_row(p + (r0 + i) * kLdp, n_vis[r0 + i], n_pad, max + i);
        const float* pr = p + r0 * kLdp;
        const auto chunk = [&](int t0) {
            ahead = item(n_kb + t0 / kPosStep + kPrefetchItems, std::min(kPosStep, block_vis - t0) * passes);
        };
        with_rows<kValueRows>(nr, [&](auto rows) {
            if constexpr (T == ggml_type::F16) {
                weighted_values<rows(), kValueVectors, kPosStep>(
                    pr, block_vis, v_dim, acc, [=](int t, int64_t j) { return load16_f16(v + t * v_stride, j); }, chunk,
                    ahead);
            } else {
                weighted_values<rows(), kValueVectors, kPosStep>(
                    pr, block_vis, v_dim, acc, [=](int t, int64_t j) { return load16_q8(v + t * v_stride, j); }, chunk,
                    ahead);
            }
        });
        for (int i = 0; i < nr; ++i)
            if (n_vis[r0 + i] > 0)
                attn_merge_row(v_dim, st.max + r0 + i, st.sum + r0 + i, st.acc + (r0 + i) * v_dim, max[i], sum[i],
                               acc + i * v_dim);
    }
}

template <ggml_type T>
static void attn_tile_t(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                        float scale, const attn_state& st) {
    bool any = false;
    for (int r = 0; r < n_rows && !any; ++r) any = visible(kv, last_pos[r]) > 0;
    if (!any) return;
    if (n_rows <= kFewRows || head_dim > kSimdMaxHeadDim) {
        const int64_t v_dim = attn_value_dim(kv, head_dim);
        for (int r0 = 0; r0 < n_rows; r0 += kFewRows)
            attn_tile_few<T>(kv, head_dim, q + r0 * head_dim, std::min(kFewRows, n_rows - r0), last_pos + r0, scale,
                             {st.max + r0, st.sum + r0, st.acc + r0 * v_dim});
        return;
    }
    alignas(64) float kt[T == ggml_type::F16 ? kTileFloats : 1];  // [head_dim][n_pad + kRowPad]
    alignas(64) float vf[kTileFloats];                             // [n][head_dim + kRowPad]
    const int n_pad = (kv.n + kPosStep - 1) / kPosStep * kPosStep;
    convert_tile<T>(kv, head_dim, n_pad, kt, vf);
    int r0 = 0;
    for (; r0 + kRows <= n_rows; r0 += kRows)
        row_block<T, kRows>(kv, head_dim, q, last_pos, scale, st, r0, kt, vf, n_pad);
    row_tail<T, kRows - 1>(kv, head_dim, q, last_pos, scale, st, r0, n_rows - r0, kt, vf, n_pad);
}

}  // namespace

// Heads or values that are not a multiple of 16, and heads larger than kStreamMaxHeadDim, take the
// AVX2 kernel.
void attn_tile_avx512(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                      float scale, const attn_state& st) {
    if (head_dim % 16 != 0 || attn_value_dim(kv, head_dim) % 16 != 0 || head_dim > kStreamMaxHeadDim)
        return attn_tile_avx2(kv, head_dim, q, n_rows, last_pos, scale, st);
    if (kv.type == ggml_type::F16)
        attn_tile_t<ggml_type::F16>(kv, head_dim, q, n_rows, last_pos, scale, st);
    else
        attn_tile_t<ggml_type::Q8_0>(kv, head_dim, q, n_rows, last_pos, scale, st);
}

}  // namespace strata::kernels::cpu::detail
