// Internal: converting an attention tile (F16 or Q8_0 rows) to f32 once per attn_tile call, shared by
// the AVX2 and AVX-512 files (every helper `static`, so each file keeps its own copy compiled with its
// own flags). Include only from files compiled with at least -mavx2 -mfma -mf16c.
#pragma once

#include <cstdint>
#include <cstring>

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

// How many rows ahead convert_tile prefetches when asked (decode, where the tile is read from memory
// and little arithmetic hides it): the hardware prefetchers stop at 4 KiB pages (16 f16 rows of 128
// dimensions).
inline constexpr int kPrefetchRows = 16;

// Asks for rows [t_begin, t_end) (clamped to [0, n)) of a tile's k or v ([n][row_bytes], contiguous).
static inline void prefetch_rows(const kv_tile& kv, const void* rows, int t_begin, int t_end) {
    t_begin = t_begin > 0 ? t_begin : 0;
    t_end = t_end < kv.n ? t_end : kv.n;
    if (t_begin >= t_end) return;
    const auto* b = static_cast<const char*>(rows);
    const size_t begin = static_cast<size_t>(t_begin) * kv.row_bytes, end = static_cast<size_t>(t_end) * kv.row_bytes;
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

// r[i][j] -> r[j][i] for an 8 x 8 block of floats.
static inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Lanes i < n_valid all ones, the rest zero (any n_valid).
static inline __m256 lanes_below(int n_valid) {
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n_valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

// The tile's keys transposed and its values, as f32 (head_dim a multiple of 8, n_pad of 8), with
// row strides ldk = n_pad + kRowPad and ldv = head_dim + kRowPad:
//   kt[head_dim][ldk]  kt[j][t] = k_t[j], positions n..n_pad-1 zero;
//   vf[n][ldv]         vf[t][j] = v_t[j].
// F16 keys are already transposed in their blocks (attention.hpp): converted in place, no shuffles.
template <ggml_type T>
static void convert_tile(const kv_tile& kv, int64_t head_dim, int n_pad, float* kt, float* vf, bool prefetch) {
    const auto* k = static_cast<const uint8_t*>(kv.k);
    const auto* v = static_cast<const uint8_t*>(kv.v);
    const int64_t ldk = n_pad + kRowPad, ldv = head_dim + kRowPad;
    for (int t = 0; t < kv.n; ++t) {
        if (prefetch) {
            prefetch_rows(kv, v, t + kPrefetchRows, t + kPrefetchRows + 1);
            prefetch_rows(kv, k, t - kv.n + kPrefetchRows, t - kv.n + kPrefetchRows + 1);  // the first keys, at the end
        }
        for (int64_t j = 0; j < head_dim; j += 8) _mm256_store_ps(vf + t * ldv + j, load8<T>(v + t * kv.row_bytes, j));
    }
    if constexpr (T == ggml_type::F16) {
        const auto* kh = static_cast<const formats::fp16_t*>(kv.k);
        for (int b0 = 0; b0 < n_pad; b0 += attn_key_block) {
            if (prefetch) prefetch_rows(kv, k, b0 + attn_key_block, b0 + 2 * attn_key_block);  // the next block
            const int width = n_pad - b0 < attn_key_block ? n_pad - b0 : attn_key_block;
            const formats::fp16_t* block = kh + static_cast<size_t>(b0) * head_dim;
            for (int64_t j = 0; j < head_dim; ++j)
                for (int c = 0; c < width; c += 8) {
                    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + j * attn_key_block + c)));
                    if (b0 + c + 8 > kv.n) x = _mm256_and_ps(x, lanes_below(kv.n - b0 - c));
                    _mm256_store_ps(kt + j * ldk + b0 + c, x);
                }
        }
        return;
    }
    for (int t0 = 0; t0 < n_pad; t0 += 8) {
        if (prefetch) prefetch_rows(kv, k, t0 + kPrefetchRows, t0 + kPrefetchRows + 8);
        for (int64_t j0 = 0; j0 < head_dim; j0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i)
                r[i] = t0 + i < kv.n ? load8<T>(k + (t0 + i) * kv.row_bytes, j0) : _mm256_setzero_ps();
            transpose8(r);
            for (int i = 0; i < 8; ++i) _mm256_store_ps(kt + (j0 + i) * ldk + t0, r[i]);
        }
    }
}

// Positions of the tile row r sees: t <= last_pos - pos0, clamped to [0, n].
static inline int visible(const kv_tile& kv, int64_t last_pos) {
    const int64_t n = last_pos - kv.pos0 + 1;
    return n <= 0 ? 0 : n >= kv.n ? kv.n : static_cast<int>(n);
}

}  // namespace strata::kernels::cpu::detail
