// Internal: converting an attention tile (F16 or Q8_0 rows) to f32 once per attn_tile call, and small
// helpers, shared by the AVX2 and AVX-512 files (every helper `static` or in an unnamed namespace, so
// each file keeps its own copy compiled with its own flags). Include only from files compiled with at
// least -mavx2 -mfma -mf16c.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/attention.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {

// Heads larger than this go to the next simpler kernel: the f32 copies of a tile's keys and values
// (about kSimdMaxHeadDim x attn_tile_max floats each, 272 KiB) live on the stack.
inline constexpr int64_t kSimdMaxHeadDim = 256;
// Rows of those copies are padded by one cache line: power-of-two strides (1 KiB for 256 positions,
// 512 B for head_dim 128) put a whole column of a loop into a few L1 sets and evict it every pass.
inline constexpr int kRowPad = 16;
inline constexpr size_t kTileFloats = (kSimdMaxHeadDim + kRowPad) * attn_tile_max;
// Heads up to this size (deepseek2's latent attention: 576) stream the tile instead of converting it,
// whatever the number of rows: their stack scratch is a few rows' scores and sums, not the tile.
inline constexpr int64_t kStreamMaxHeadDim = 1024;

// Asks for the bytes of positions [t_begin, t_end) (clamped to [0, n)) of a tile's k (row_bytes per
// position; the range whole key blocks) or v (attn_value_stride per position).
static inline void prefetch_rows(const kv_tile& kv, const void* rows, size_t stride, int t_begin, int t_end) {
    t_begin = t_begin > 0 ? t_begin : 0;
    t_end = t_end < kv.n ? t_end : kv.n;
    if (t_begin >= t_end) return;
    const auto* b = static_cast<const char*>(rows);
    const size_t begin = static_cast<size_t>(t_begin) * stride, end = static_cast<size_t>(t_end) * stride;
    for (size_t off = begin; off < end; off += 64) _mm_prefetch(b + off, _MM_HINT_T0);
}

// Elements j..j+7 (j a multiple of 8) of one tile row, as f32. Q8_0: d * q, exactly as kv_value.
template <ggml_type T>
static inline __m256 load8(const uint8_t* row, int64_t j) {
    if constexpr (T == ggml_type::F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * j)));
    } else {
        const auto* b = reinterpret_cast<const formats::block_q8_0*>(row) + j / formats::QK8_0;
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + j % formats::QK8_0));
        uint16_t d;
        std::memcpy(&d, &b->d, sizeof(d));
        const __m256 scale = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(d)));  // broadcast, then convert
        return _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
}

// Element j of keys t .. t + 7 (t a multiple of 8) of an F16 tile, as f32, from the blocked layout of
// attention.hpp.
static inline __m256 load_keys8(const uint8_t* k, size_t row_bytes, int t, int64_t j) {
    const uint8_t* at = k + attn_key_offset(ggml_type::F16, row_bytes, t, j);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
}

// Lanes i < n_valid all ones, the rest zero (any n_valid).
static inline __m256 lanes_below(int n_valid) {
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n_valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

// The tile's values as f32, and for F16 its keys transposed (Q8_0 keys are scored in int8 straight
// from their blocks), with row strides ldk = n_pad + kRowPad and ldv = v_dim + kRowPad:
//   kt[head_dim][ldk]  kt[j][t] = k_t[j], positions n..n_pad-1 zero (F16 only);
//   vf[n][ldv]         vf[t][j] = v_t[j]  (v_dim a multiple of 8).
// F16 keys are already transposed in their blocks (attention.hpp): converted in place, no shuffles.
template <ggml_type T>
static void convert_tile(const kv_tile& kv, int64_t head_dim, int n_pad, float* kt, float* vf) {
    const auto* v = static_cast<const uint8_t*>(kv.v);
    const int64_t v_dim = attn_value_dim(kv, head_dim);
    const size_t v_stride = attn_value_stride(kv);
    const int64_t ldk = n_pad + kRowPad, ldv = v_dim + kRowPad;
    for (int t = 0; t < kv.n; ++t)
        for (int64_t j = 0; j < v_dim; j += 8) _mm256_store_ps(vf + t * ldv + j, load8<T>(v + t * v_stride, j));
    if constexpr (T != ggml_type::F16) return;
    for (int b0 = 0; b0 < n_pad; b0 += attn_key_block) {
        const int width = n_pad - b0 < attn_key_block ? n_pad - b0 : attn_key_block;
        for (int64_t j = 0; j < head_dim; ++j)
            for (int c = 0; c < width; c += 8) {
                __m256 x = load_keys8(static_cast<const uint8_t*>(kv.k), kv.row_bytes, b0 + c, j);
                if (b0 + c + 8 > kv.n) x = _mm256_and_ps(x, lanes_below(kv.n - b0 - c));
                _mm256_store_ps(kt + j * ldk + b0 + c, x);
            }
    }
}

namespace {  // each including file its own copy, compiled with its own flags

// Asks for the cache lines of [at, at + lines * 64) at an even rate over `steps` calls of step(), one
// request per call (a line is asked for steps / lines times in a row; at most one new line per call), so
// the memory stays busy without bursts (a burst fills the miss buffers and stalls the loads the FMAs wait
// on). Branch-free: a counting loop mispredicts on every irregular lines / steps ratio (Q8_0 rows). Loops
// step a local copy: one reached through a reference is stored and reloaded at every step.
struct prefetch_stream {
    const char* at;
    uint64_t pos = 0, inc = 0;  // the current line in 24-bit fixed point, and its advance per call
    prefetch_stream(const char* at_, int64_t lines, int64_t steps)
        : at(at_), inc((static_cast<uint64_t>(lines) << 24) / static_cast<uint64_t>(steps > 1 ? steps : 1)) {}
    void step() {
        _mm_prefetch(at + (pos >> 24) * 64, _MM_HINT_T0);
        pos += inc;
    }
};

// The stream of calls that prefetch nothing (the converted-tile kernels).
struct no_prefetch {
    void step() {}
};

}  // namespace

// f(std::integral_constant<int, n>{}) for 1 <= n <= R.
template <int R, class F>
static inline void with_rows(int n, F&& f) {
    if constexpr (R > 1)
        if (n < R) return with_rows<R - 1>(n, f);
    f(std::integral_constant<int, R>{});
}

// Positions of the tile row r sees: t <= last_pos - pos0, clamped to [0, n].
static inline int visible(const kv_tile& kv, int64_t last_pos) {
    const int64_t n = last_pos - kv.pos0 + 1;
    return n <= 0 ? 0 : n >= kv.n ? kv.n : static_cast<int>(n);
}

}  // namespace strata::kernels::cpu::detail
