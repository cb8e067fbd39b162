// Tiled attention, AVX2 + FMA + F16C: attn_tile for F16 and Q8_0 tiles.
//
// Per call the tile is converted once to f32 (tile_convert.hpp): F16 keys transposed, kt[head_dim][n_pad]
// (rows padded by kRowPad), so one vector holds one dimension of 8 consecutive positions, and values
// vf[n][head_dim] (rows padded likewise). Q8_0 keys are scored in int8 from their blocks (score8_q8). Query rows then go through in register blocks of kRows:
//   score[kRows][kLdp]     scale * q_r . k_t, one lane per position, broadcast q_r[j] times kt[j];
//                          then p = exp(score - max) in place, 0 past the row's visible positions;
//   acc[kRows][head_dim]   sum_t p_t v_t, one lane per dimension, broadcast p_t times vf[t];
// and each row's (max, sum, acc) is folded into the state with the shared attn_merge_row. Calls of at
// most kFewRows rows (decode) take attn_tile_few instead, which streams the tile with the same arithmetic;
// so do heads larger than kSimdMaxHeadDim (deepseek2's latent attention), kFewRows rows per call.
//
// NOTE: departures from attn_tile_scalar (matched to rounding, not bitwise):
//   - a score is one FMA chain over the dimensions in order; an acc element one FMA chain over the
//     positions in order; exp is a polynomial; a row's sum is 8 lane sums then a fixed horizontal sum;
//   - a block's rows run the value loop to the block's largest visible count: a row's positions past
//     its own have p = 0, and fma(0, v, acc) == acc for finite v (acc starts at +0 and never becomes -0).
// So a row's state depends only on its q, its last_pos and the tile, never on n_rows or the other rows.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "cpu/attention/q8_query.hpp"
#include "cpu/attention/tile_convert.hpp"
#include "cpu/detail/exp_avx2.hpp"
#include "cpu/detail/kernel_table.hpp"

namespace strata::kernels::cpu::detail {
namespace {

constexpr int kRows = 6;      // query rows per register block
constexpr int kPosStep = 16;  // positions per score register block (2 vectors); n_pad is a multiple
constexpr int kFewRows = 16;  // calls with at most this many rows (decode) take attn_tile_few
constexpr int kFewBlock = 8;  // attn_tile_few's query rows per block (split into register blocks by few_split)
constexpr int kValueChunk = attn_key_block;  // attn_tile_few's value rows per chunk (f16, head_dim 128: 8 KiB)
constexpr int kLdp = attn_tile_max;  // floats between rows of scores / probabilities: a constant, so the
                                     // value pass's broadcasts address rows by displacement, not registers
constexpr int kPrefetchItems = 1;  // how many key blocks or value chunks ahead attn_tile_few prefetches

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// score[i][t] = scale * (q_i . k_t) for the block's R rows (q: [R][head_dim]), t < n_score (score: [R][kLdp]).
template <int R>
static void scores(const float* q, int64_t head_dim, const float* kt, int n_pad, int n_score, float scale,
                   float* score) {
    for (int t = 0; t < n_score; t += kPosStep) {
        __m256 acc[R][2];
        for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
        const float* k = kt + t;  // k[j * (n_pad + kRowPad) + 0..15] = k_{t..t+15}[j]
        int64_t j = 0;
        do {  // head_dim >= 8; a do-while keeps acc in registers (see scores_blocked)
            const __m256 k0 = _mm256_load_ps(k), k1 = _mm256_load_ps(k + 8);
            for (int i = 0; i < R; ++i) {
                const __m256 qj = _mm256_broadcast_ss(q + i * head_dim + j);
                acc[i][0] = _mm256_fmadd_ps(qj, k0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(qj, k1, acc[i][1]);
            }
            k += n_pad + kRowPad;
        } while (++j < head_dim);
        const __m256 s = _mm256_set1_ps(scale);
        for (int i = 0; i < R; ++i) {
            _mm256_store_ps(score + i * kLdp + t, _mm256_mul_ps(acc[i][0], s));
            _mm256_store_ps(score + i * kLdp + t + 8, _mm256_mul_ps(acc[i][1], s));
        }
    }
}

// One row: s[t] <- exp(s[t] - max) for t < n_vis, 0 for n_vis <= t < n_score; returns the sum, sets max.
// The max over 4 chains (max is exact in any order); the sum one chain in position order.
static float softmax_row(float* s, int n_vis, int n_score, float* max_out) {
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    const int n_full = n_vis / 8 * 8;
    __m256 m[4] = {ninf, ninf, ninf, ninf};
    int t = 0;
    for (; t + 32 <= n_full; t += 32)
        for (int c = 0; c < 4; ++c) m[c] = _mm256_max_ps(m[c], _mm256_load_ps(s + t + 8 * c));
    for (; t < n_full; t += 8) m[0] = _mm256_max_ps(m[0], _mm256_load_ps(s + t));
    if (t < n_vis) m[1] = _mm256_max_ps(m[1], _mm256_blendv_ps(ninf, _mm256_load_ps(s + t), lanes_below(n_vis - t)));
    const float max = hmax(_mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (t = 0; t < n_full; t += 8) {
        const __m256 p = exp_avx2(_mm256_sub_ps(_mm256_load_ps(s + t), vmax));
        _mm256_store_ps(s + t, p);
        sum = _mm256_add_ps(sum, p);
    }
    if (t < n_vis) {
        const __m256 p = _mm256_and_ps(exp_avx2(_mm256_sub_ps(_mm256_load_ps(s + t), vmax)), lanes_below(n_vis - t));
        _mm256_store_ps(s + t, p);
        sum = _mm256_add_ps(sum, p);
        t += 8;
    }
    for (; t < n_score; t += 8) _mm256_store_ps(s + t, _mm256_setzero_ps());
    *max_out = max;
    return hsum(sum);
}

// acc[i][:] += sum_{t0 <= t < t1} p[i][t] v_t[:] for the block's R rows (acc: [R][v_dim]; t0 == 0 starts
// it from zero), D vectors of 8 elements at a time, the positions in order, so each acc element is one FMA
// chain over the positions whatever the blocking. p: [R][kLdp]; value(t, j) gives v_t[j..j+7] (j a
// multiple of 8) as f32; stream.step() is called once per S positions (and left-over position) and pass,
// on a local copy (a stream reached through a reference is stored and reloaded at every step).
template <int R, int D, int S = 1, class Value, class Stream>
static void weighted_values_chunk(const float* p, int t0, int t1, int64_t v_dim, float* acc, Value value,
                                  Stream& stream) {
    Stream ahead = stream;
    const auto step = [&] { ahead.step(); };
    int64_t j = 0;
    for (; j + 8 * D <= v_dim; j += 8 * D) {
        __m256 a[R][D];
        for (int i = 0; i < R; ++i)
            for (int c = 0; c < D; ++c)
                a[i][c] = t0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + i * v_dim + j + 8 * c);
        const auto position = [&](int t) {
            __m256 vt[D];
            for (int c = 0; c < D; ++c) vt[c] = value(t, j + 8 * c);
            for (int i = 0; i < R; ++i) {
                const __m256 pt = _mm256_broadcast_ss(p + i * kLdp + t);
                for (int c = 0; c < D; ++c) a[i][c] = _mm256_fmadd_ps(pt, vt[c], a[i][c]);
            }
        };
        int t = t0;
        for (; t + S <= t1; t += S) {
            step();
            for (int u = 0; u < S; ++u) position(t + u);
        }
        for (; t < t1; ++t) {
            step();
            position(t);
        }
        for (int i = 0; i < R; ++i)
            for (int c = 0; c < D; ++c) _mm256_storeu_ps(acc + i * v_dim + j + 8 * c, a[i][c]);
    }
    for (; j < v_dim; j += 8) {  // v_dim not a multiple of 8 D
        __m256 a[R];
        for (int i = 0; i < R; ++i) a[i] = t0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + i * v_dim + j);
        for (int t = t0; t < t1; ++t) {
            step();
            const __m256 v0 = value(t, j);
            for (int i = 0; i < R; ++i) a[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + i * kLdp + t), v0, a[i]);
        }
        for (int i = 0; i < R; ++i) _mm256_storeu_ps(acc + i * v_dim + j, a[i]);
    }
    stream = ahead;
}

// The step() calls of one weighted_values_chunk over n_t positions.
static constexpr int64_t value_steps(int n_t, int64_t v_dim, int D, int S) {
    return v_dim / (8 * D) * (n_t / S + n_t % S) + v_dim % (8 * D) / 8 * n_t;
}

// quantize_query (q8_query.hpp) on 8 lanes, bit for bit: the largest |x| of each block of 32, its half
// d by the F16C round-to-nearest-even convert, and q = clamp(round-to-even(x * (1 / d)), -127, 127).
static inline void quantize_query8(const float* q, int64_t head_dim, const q8_query_view& out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int64_t b = 0; b < head_dim / formats::QK8_0; ++b) {
        __m256 x[4], m = _mm256_setzero_ps();
        for (int c = 0; c < 4; ++c) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x[c] = _mm256_loadu_ps(q + 32 * b + 8 * c)));
        const float d = _cvtsh_ss(_cvtss_sh(hmax(m) / 127.0f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        __m256i i[4];
        for (int c = 0; c < 4; ++c)
            i[c] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x[c], id)), lo), hi);
        // packs interleaves the 128-bit lanes: 4-byte groups come out as 0 2 4 6 1 3 5 7 of the wanted order.
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + 32 * b),
                            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        const __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
        const __m128i s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0x4e));
        out.d[b] = d;
        out.sum[b] = _mm_cvtsi128_si32(_mm_add_epi32(s1, _mm_shuffle_epi32(s1, 0xb1)));
    }
}

// Up to kFewRows query rows quantized for Q8_0 keys.
struct q8_buf : q8_query_rows<kFewRows, kStreamMaxHeadDim> {
    q8_buf(const float* q, int64_t hd, int n) : q8_query_rows(q, hd, n, quantize_query8) {}
};

// Rows [i0, i0 + R) of qq (R <= 4, so accumulators, keys and query fit the 16 registers) of score8_q8
// for block b of 32 dimensions; score is row i0's.
template <int R>
static inline void score8_rows_q8(const q8_buf& qq, int i0, int64_t b, const uint8_t* kb, int tb, __m256 dk,
                                  float scale, float* score, int lds) {
    const int64_t head_dim = qq.head_dim, n_b = qq.n_b;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a[R];
    for (auto& x : a) x = _mm256_setzero_si256();
    for (int st = 0; st < 8; ++st) {
        const __m256i k = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(kb + (b * 8 + st) * (attn_key_block * 4) + tb * 4));
        const __m256i ak = _mm256_sign_epi8(k, k);
        for (int i = 0; i < R; ++i) {
            int32_t q4;
            std::memcpy(&q4, qq.qs + (i0 + i) * head_dim + b * 32 + st * 4, sizeof(q4));
            const __m256i sq = _mm256_sign_epi8(_mm256_set1_epi32(q4), k);
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ak, sq), ones));
        }
    }
    for (int i = 0; i < R; ++i) {
        const __m256 dkq = _mm256_mul_ps(dk, _mm256_set1_ps(qq.d[(i0 + i) * n_b + b]));
        float* out = score + i * lds;
        __m256 f = _mm256_cvtepi32_ps(a[i]);
        f = b == 0 ? _mm256_mul_ps(f, dkq) : _mm256_fmadd_ps(f, dkq, _mm256_loadu_ps(out));
        if (b == n_b - 1) f = _mm256_mul_ps(f, _mm256_set1_ps(scale));
        _mm256_storeu_ps(out, f);
    }
}

// The int8 scores of attention.hpp for the 8 positions [tb, tb + 8) of the Q8_0 key block kb (tb a
// multiple of 8), rows [i0, i0 + R) of qq: score[i][0..7] (stride lds). Per block of 32 dimensions, 8
// steps over 4 dimensions of 8 positions: |k| times q with k's sign (pmaddubsw: pairs stay below 2^15),
// summed to int32 exactly; then one f32 FMA per block, in block order, as the AVX-512 kernel does.
// Rows go in groups of at most 4. stream.step() is called head_dim / 4 times, 8 before each block of 32.
template <int R, class Stream>
static inline void score8_q8(const q8_buf& qq, int i0, const uint8_t* kb, int tb, float scale, float* score, int lds,
                             Stream& stream) {
    const uint8_t* scales = kb + qq.head_dim * attn_key_block;
    for (int64_t b = 0; b < qq.n_b; ++b) {
        for (int st = 0; st < 8; ++st) stream.step();
        const __m256 dk = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 64 * b + 2 * tb)));
        int i = 0;
        for (; i + 4 <= R; i += 4) score8_rows_q8<4>(qq, i0 + i, b, kb, tb, dk, scale, score + i * lds, lds);
        if constexpr (R % 4 != 0) score8_rows_q8<R % 4>(qq, i0 + i, b, kb, tb, dk, scale, score + i * lds, lds);
    }
}

// Rows [r0, r0 + R) of the call: their tile states, folded into st.
template <ggml_type T, int R>
static void row_block(const kv_tile& kv, int64_t head_dim, const float* q, const int64_t* last_pos, float scale,
                      const attn_state& st, int r0, const float* kt, const float* vf, int n_pad) {
    alignas(32) float p[R * kLdp];              // [R][kLdp] scores, then probabilities
    alignas(32) float acc[R * kSimdMaxHeadDim];  // [R][v_dim]
    const int64_t v_dim = attn_value_dim(kv, head_dim);
    int n_vis[R], max_vis = 0;
    for (int i = 0; i < R; ++i) max_vis = std::max(max_vis, n_vis[i] = visible(kv, last_pos[r0 + i]));
    if (max_vis == 0) return;
    const int n_score = (max_vis + kPosStep - 1) / kPosStep * kPosStep;
    if constexpr (T == ggml_type::F16) {
        scores<R>(q + r0 * head_dim, head_dim, kt, n_pad, n_score, scale, p);
    } else {
        const q8_buf qq(q + r0 * head_dim, head_dim, R);
        const auto* k = static_cast<const uint8_t*>(kv.k);
        no_prefetch none;
        for (int t = 0; t < n_score; t += 8)
            score8_q8<R>(qq, 0, k + t / attn_key_block * attn_key_block * kv.row_bytes, t % attn_key_block, scale,
                         p + t, kLdp, none);
    }
    float max[R], sum[R];
    for (int i = 0; i < R; ++i) sum[i] = softmax_row(p + i * kLdp, n_vis[i], n_score, max + i);
    const int64_t ldv = v_dim + kRowPad;
    no_prefetch none;
    weighted_values_chunk<R, 2>(
        p, 0, max_vis, v_dim, acc, [=](int t, int64_t j) { return _mm256_load_ps(vf + t * ldv + j); }, none);
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

// scores() for the 8 NP positions [t0, t0 + 8 NP) of R rows of an F16 tile, within the key block k, read
// straight from it: the same key values (load_keys8's) and FMA chains, so the same scores. score:
// [R][lds]. stream.step() is called once per two dimensions, on a local copy (see weighted_values_chunk).
template <int R, int NP, class Stream>
static void scores_blocked(const float* q, int64_t head_dim, const uint8_t* k, size_t row_bytes, int t0, float scale,
                           float* score, int lds, Stream& stream) {
    Stream ahead = stream;
    __m256 acc[R][NP];
    for (int i = 0; i < R; ++i)
        for (int c = 0; c < NP; ++c) acc[i][c] = _mm256_setzero_ps();
    // A do-while (head_dim >= 8 here): with a possibly empty loop GCC keeps acc in memory for R * NP > 8
    // and stores it at every dimension.
    int64_t u = 0;
    do {
        if (u % 2 == 0) ahead.step();
        __m256 ku[NP];
        for (int c = 0; c < NP; ++c) ku[c] = load_keys8(k, row_bytes, t0 + 8 * c, u);
        for (int i = 0; i < R; ++i) {
            const __m256 qu = _mm256_broadcast_ss(q + i * head_dim + u);
            for (int c = 0; c < NP; ++c) acc[i][c] = _mm256_fmadd_ps(qu, ku[c], acc[i][c]);
        }
    } while (++u < head_dim);
    stream = ahead;
    const __m256 s = _mm256_set1_ps(scale);
    for (int i = 0; i < R; ++i)
        for (int c = 0; c < NP; ++c) _mm256_storeu_ps(score + i * lds + 8 * c, _mm256_mul_ps(acc[i][c], s));
}

// How attn_tile_few splits a block of R rows (R <= kFewBlock) into register blocks: `wide` rows over 16
// positions or 16 elements at a time (12 FMA chains for 6 rows: 8 leave the FMA units waiting on their
// latency), then the other R - wide rows over 32 (keys) or 32 elements (values).
template <int R>
struct few_split {
    static constexpr int wide = R >= 6 ? 6 : R >= 3 ? R : 0;
    static constexpr int rest = R - wide;
    // 8-float vectors per register block: of positions (scores) or of elements (values).
    static constexpr int wide_vectors = 2, rest_vectors = attn_key_block / 8;
    // scores_blocked passes over a whole key block, each calling step() head_dim / 2 times.
    static constexpr int key_passes = (wide > 0 ? attn_key_block / (8 * wide_vectors) : 0) + (rest > 0 ? 1 : 0);
};

// The scores of positions [0, n_in) (16 or 32) of the key block k for R rows, split as few_split<R>.
template <int R, class Stream>
static void scores_key_block(const float* q, int64_t head_dim, const uint8_t* k, size_t row_bytes, int n_in,
                             float scale, float* score, int lds, Stream& stream) {
    using split = few_split<R>;
    if constexpr (split::wide > 0)
        for (int t = 0; t < n_in; t += 8 * split::wide_vectors)
            scores_blocked<split::wide, split::wide_vectors>(q, head_dim, k, row_bytes, t, scale, score + t, lds,
                                                             stream);
    if constexpr (split::rest > 0) {
        const float* qr = q + split::wide * head_dim;
        float* sr = score + split::wide * lds;
        if (n_in == attn_key_block)
            scores_blocked<split::rest, split::rest_vectors>(qr, head_dim, k, row_bytes, 0, scale, sr, lds, stream);
        else
            scores_blocked<split::rest, 2>(qr, head_dim, k, row_bytes, 0, scale, sr, lds, stream);
    }
}

// n Q8_0 value rows (stride bytes apart) as f32, [n][v_dim]: load8's scale times load8's converted
// codes, so the same values; the scale converted once per block.
static inline void stage_values_q8(const uint8_t* v, size_t stride, int n, int64_t v_dim, float* out) {
    for (int t = 0; t < n; ++t, out += v_dim) {
        const auto* b = reinterpret_cast<const formats::block_q8_0*>(v + t * stride);
        for (int64_t j = 0; j < v_dim; j += formats::QK8_0, ++b) {
            uint16_t d;
            std::memcpy(&d, &b->d, sizeof(d));
            const __m256 scale = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(d)));
            for (int c = 0; c < formats::QK8_0; c += 8) {
                const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + c));
                _mm256_store_ps(out + j + c, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
            }
        }
    }
}

// NOTE: calls with few rows (decode: one token's query heads of a kv head) stream the tile instead of
// converting it: scores straight from the key blocks, each key vector converted once for a register
// block of rows (few_split), values kValueChunk positions at a time so the chunk stays in L1 over the
// passes of head_dim (F16 values converted in registers, Q8_0 ones dequantized once per chunk). Every
// score, exp, sum and acc element is the same operation sequence as row_block's, so prompts and decode
// agree bitwise. Memory is read in order (key blocks, value chunks, the next tile's first key blocks)
// and each item is prefetched kPrefetchItems items ahead, a line per step of the work (the hardware
// prefetchers stop at 4 KiB pages, and a burst of requests per block leaves the FMAs waiting).
template <ggml_type T>
static void attn_tile_few(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                          float scale, const attn_state& st) {
    alignas(32) float p[kFewRows * kLdp];                 // [n_rows][kLdp] scores, then probabilities
    alignas(32) float acc[kFewBlock * kStreamMaxHeadDim];  // [kFewBlock][v_dim]
    // Q8_0 values up to kSimdMaxHeadDim wide: each chunk dequantized once into L1, [t - t0][v_dim], for
    // both passes of rows (wide and rest) instead of once per pass.
    alignas(32) float staged[T == ggml_type::Q8_0 ? kValueChunk * kSimdMaxHeadDim : 1];
    const int64_t v_dim = attn_value_dim(kv, head_dim);
    const size_t v_stride = attn_value_stride(kv);
    int n_vis[kFewRows], max_vis = 0;
    for (int r = 0; r < n_rows; ++r) max_vis = std::max(max_vis, n_vis[r] = visible(kv, last_pos[r]));
    if (max_vis == 0) return;
    const int n_pad = (max_vis + kPosStep - 1) / kPosStep * kPosStep;
    std::optional<q8_buf> qq;
    if constexpr (T == ggml_type::Q8_0) qq.emplace(q, head_dim, n_rows);
    const auto* k = static_cast<const uint8_t*>(kv.k);
    const auto* v = static_cast<const uint8_t*>(kv.v);
    // Decode reads the tile as items: its n_kb key blocks, then its values kValueChunk rows at a time, then
    // the caller's next tile's key blocks. While it works on item i it asks for item i + kPrefetchItems,
    // spread over the work.
    const size_t block_bytes = attn_key_block * kv.row_bytes, chunk_bytes = kValueChunk * v_stride;
    const int64_t block_lines = static_cast<int64_t>((block_bytes + 63) / 64);
    const int64_t chunk_lines = static_cast<int64_t>((chunk_bytes + 63) / 64);
    const int n_kb = (n_pad + attn_key_block - 1) / attn_key_block;
    const int n_vc = (max_vis + kValueChunk - 1) / kValueChunk;
    // Steps of one key block: F16, one per 2 dimensions of each scores_blocked pass; Q8_0, one per 4
    // dimensions of each 8 positions and block of rows.
    int64_t key_steps = 0;
    for (int r0 = 0; r0 < n_rows; r0 += kFewBlock)
        with_rows<kFewBlock>(std::min(kFewBlock, n_rows - r0), [&](auto rows) {
            key_steps += T == ggml_type::F16 ? head_dim / 2 * few_split<rows()>::key_passes
                                             : head_dim / 4 * (attn_key_block / 8);
        });
    const auto item = [&](int i, int64_t steps) -> prefetch_stream {
        if (i < n_kb) return {reinterpret_cast<const char*>(k) + i * block_bytes, block_lines, steps};
        if (i < n_kb + n_vc) return {reinterpret_cast<const char*>(v) + (i - n_kb) * chunk_bytes, chunk_lines, steps};
        if (kv.next_k)
            return {static_cast<const char*>(kv.next_k) + (i - n_kb - n_vc) * block_bytes, block_lines, steps};
        return {reinterpret_cast<const char*>(k), 0, steps};  // nothing left: the first line, already here
    };
    prefetch_stream ahead = item(kPrefetchItems, key_steps);
    // Positions per step of the value pass: a step every other one leaves the loads and FMAs more of the
    // issue width.
    constexpr int step_pos = 2;
    prefetch_rows(kv, kv.k, kv.row_bytes, 0, kPrefetchItems * attn_key_block);
    for (int t0 = 0; t0 < n_pad; t0 += attn_key_block) {
        ahead = item(t0 / attn_key_block + kPrefetchItems, key_steps);
        const uint8_t* kb = k + t0 / attn_key_block * block_bytes;
        const int n_in = std::min(attn_key_block, n_pad - t0);  // 16 or 32 (n_pad is a multiple of 16)
        for (int r0 = 0; r0 < n_rows; r0 += kFewBlock)
            with_rows<kFewBlock>(std::min(kFewBlock, n_rows - r0), [&](auto rows) {
                float* score = p + r0 * kLdp + t0;
                if constexpr (T == ggml_type::F16)
                    scores_key_block<rows()>(q + r0 * head_dim, head_dim, kb, kv.row_bytes, n_in, scale, score, kLdp, ahead);
                else
                    for (int tb = 0; tb < n_in; tb += 8) score8_q8<rows()>(*qq, r0, kb, tb, scale, score + tb, kLdp, ahead);
            });
    }
    for (int r0 = 0; r0 < n_rows; r0 += kFewBlock) {
        const int nr = std::min(kFewBlock, n_rows - r0);
        int block_vis = 0;
        for (int i = 0; i < nr; ++i) block_vis = std::max(block_vis, n_vis[r0 + i]);
        if (block_vis == 0) continue;
        float max[kFewBlock], sum[kFewBlock];
        for (int i = 0; i < nr; ++i) sum[i] = softmax_row(p + (r0 + i) * kLdp, n_vis[r0 + i], n_pad, max + i);
        const auto value = [=](int t, int64_t j) { return load8<T>(v + t * v_stride, j); };
        with_rows<kFewBlock>(nr, [&](auto rows) {
            using split = few_split<rows()>;
            for (int t0 = 0; t0 < block_vis; t0 += kValueChunk) {
                const int t1 = std::min(block_vis, t0 + kValueChunk);
                ahead = item(n_kb + t0 / kValueChunk + kPrefetchItems,
                             value_steps(t1 - t0, v_dim, split::wide_vectors, step_pos) * (split::wide > 0) +
                                 value_steps(t1 - t0, v_dim, split::rest_vectors, step_pos) * (split::rest > 0));
                // Q8_0's passes written out beside the shared ones below: routing both through one generic
                // lambda changed how GCC inlines F16's passes, and F16 decode ran slower.
                if constexpr (T == ggml_type::Q8_0) {
                    if (v_dim <= kSimdMaxHeadDim) {
                        stage_values_q8(v + t0 * v_stride, v_stride, t1 - t0, v_dim, staged);
                        const float* vs = staged;
                        const auto staged_value = [=](int t, int64_t j) {
                            return _mm256_load_ps(vs + (t - t0) * v_dim + j);
                        };
                        if constexpr (split::wide > 0)
                            weighted_values_chunk<split::wide, split::wide_vectors, step_pos>(
                                p + r0 * kLdp, t0, t1, v_dim, acc, staged_value, ahead);
                        if constexpr (split::rest > 0)
                            weighted_values_chunk<split::rest, split::rest_vectors, step_pos>(
                                p + (r0 + split::wide) * kLdp, t0, t1, v_dim, acc + split::wide * v_dim, staged_value,
                                ahead);
                        continue;
                    }
                }
                if constexpr (split::wide > 0)
                    weighted_values_chunk<split::wide, split::wide_vectors, step_pos>(p + r0 * kLdp, t0, t1, v_dim,
                                                                                      acc, value, ahead);
                if constexpr (split::rest > 0)
                    weighted_values_chunk<split::rest, split::rest_vectors, step_pos>(
                        p + (r0 + split::wide) * kLdp, t0, t1, v_dim, acc + split::wide * v_dim, value, ahead);
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
    alignas(32) float kt[T == ggml_type::F16 ? kTileFloats : 1];  // [head_dim][n_pad + kRowPad]
    alignas(32) float vf[kTileFloats];                             // [n][head_dim + kRowPad]
    const int n_pad = (kv.n + kPosStep - 1) / kPosStep * kPosStep;
    convert_tile<T>(kv, head_dim, n_pad, kt, vf);
    int r0 = 0;
    for (; r0 + kRows <= n_rows; r0 += kRows)
        row_block<T, kRows>(kv, head_dim, q, last_pos, scale, st, r0, kt, vf, n_pad);
    row_tail<T, kRows - 1>(kv, head_dim, q, last_pos, scale, st, r0, n_rows - r0, kt, vf, n_pad);
}

}  // namespace

// Heads or values that are not a multiple of 8, and heads larger than kStreamMaxHeadDim, take the
// scalar kernel.
void attn_tile_avx2(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                    float scale, const attn_state& st) {
    if (head_dim % 8 != 0 || attn_value_dim(kv, head_dim) % 8 != 0 || head_dim > kStreamMaxHeadDim)
        return attn_tile_scalar(kv, head_dim, q, n_rows, last_pos, scale, st);
    if (kv.type == ggml_type::F16)
        attn_tile_t<ggml_type::F16>(kv, head_dim, q, n_rows, last_pos, scale, st);
    else
        attn_tile_t<ggml_type::Q8_0>(kv, head_dim, q, n_rows, last_pos, scale, st);
}

}  // namespace strata::kernels::cpu::detail
