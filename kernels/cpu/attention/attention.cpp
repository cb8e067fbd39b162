// Tiled attention: the ISA-independent parts (clear, merge, finish, dispatch) and the scalar tile.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <emmintrin.h>  // SSE2, part of every x86-64: the 8 x 8 transposes of attn_pack_keys

#include "cpu/attention/q8_query.hpp"
#include "cpu/detail/kernel_table.hpp"
#include "formats/blocks.hpp"
#include "formats/quant.hpp"

namespace strata::kernels::cpu {
namespace detail {

namespace {

constexpr float kEmpty = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxHeadDim = 1024;  // per-row stack scratch of a tile

// Element j of row `row` of a kv tile (F16 or Q8_0), as f32.
float kv_value(ggml_type type, const uint8_t* row, int64_t j) {
    if (type == ggml_type::F16) return formats::fp16_to_fp32(reinterpret_cast<const formats::fp16_t*>(row)[j]);
    const auto* b = reinterpret_cast<const formats::block_q8_0*>(row) + j / formats::QK8_0;
    return formats::fp16_to_fp32(b->d) * static_cast<float>(b->qs[j % formats::QK8_0]);
}

// Element j of key t of an F16 tile, as f32 (the blocked layout of attention.hpp).
float key_value(const kv_tile& kv, int64_t t, int64_t j) {
    formats::fp16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(kv.k) + attn_key_offset(kv.type, kv.row_bytes, t, j), sizeof(h));
    return formats::fp16_to_fp32(h);
}

// q . k_t for a Q8_0 tile: the int8 dot product of attention.hpp against the quantized row q.
float key_dot_q8(const kv_tile& kv, int64_t head_dim, const q8_query_view& q, int64_t t) {
    const auto* k = static_cast<const uint8_t*>(kv.k);
    float dot = 0;
    for (int64_t b = 0; b < head_dim / formats::QK8_0; ++b) {
        int32_t isum = 0;
        for (int64_t j = b * formats::QK8_0; j < (b + 1) * formats::QK8_0; ++j)
            isum += int32_t{q.qs[j]} * static_cast<int8_t>(k[attn_key_offset(kv.type, kv.row_bytes, t, j)]);
        formats::fp16_t h;
        std::memcpy(&h, k + attn_key_scale_offset(head_dim, kv.row_bytes, t, b * formats::QK8_0), sizeof(h));
        dot += static_cast<float>(isum) * (formats::fp16_to_fp32(h) * q.d[b]);
    }
    return dot;
}

}  // namespace

void attn_merge_row(int64_t v_dim, float* max_a, float* sum_a, float* acc_a, float max_b, float sum_b,
                    const float* acc_b) {
    if (sum_b == 0) return;
    if (*sum_a == 0) {
        *max_a = max_b;
        *sum_a = sum_b;
        std::memcpy(acc_a, acc_b, sizeof(float) * static_cast<size_t>(v_dim));
        return;
    }
    const float m = std::max(*max_a, max_b);
    const float ea = std::exp(*max_a - m), eb = std::exp(max_b - m);
    *max_a = m;
    *sum_a = *sum_a * ea + sum_b * eb;
    for (int64_t d = 0; d < v_dim; ++d) acc_a[d] = acc_a[d] * ea + acc_b[d] * eb;
}

// NOTE: the reference: every score a plain dot in dimension order (Q8_0: per block of 32), the row's tile state from the
// max score, then the shared merge.
void attn_tile_scalar(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                      float scale, const attn_state& st) {
    const auto* v = static_cast<const uint8_t*>(kv.v);
    const int64_t v_dim = attn_value_dim(kv, head_dim);
    const size_t v_stride = attn_value_stride(kv);
    float score[attn_tile_max];
    float acc[kMaxHeadDim];
    int8_t qs[kMaxHeadDim];
    float qd[kMaxHeadDim / formats::QK8_0];
    int32_t qsum[kMaxHeadDim / formats::QK8_0];
    const q8_query_view q8{qs, qd, qsum};
    for (int r = 0; r < n_rows; ++r) {
        const int64_t n_vis = std::min<int64_t>(kv.n, last_pos[r] - kv.pos0 + 1);
        if (n_vis <= 0) continue;
        const float* qr = q + r * head_dim;
        if (kv.type == ggml_type::Q8_0) quantize_query(qr, head_dim, q8);
        float max = kEmpty;
        for (int64_t t = 0; t < n_vis; ++t) {
            float dot = 0;
            if (kv.type == ggml_type::Q8_0) {
                dot = key_dot_q8(kv, head_dim, q8, t);
            } else {
                for (int64_t j = 0; j < head_dim; ++j) dot += qr[j] * key_value(kv, t, j);
            }
            score[t] = dot * scale;
            max = std::max(max, score[t]);
        }
        float sum = 0;
        std::fill(acc, acc + v_dim, 0.0f);
        for (int64_t t = 0; t < n_vis; ++t) {
            const float p = std::exp(score[t] - max);
            sum += p;
            const uint8_t* vt = v + t * v_stride;
            for (int64_t j = 0; j < v_dim; ++j) acc[j] += p * kv_value(kv.type, vt, j);
        }
        attn_merge_row(v_dim, st.max + r, st.sum + r, st.acc + r * v_dim, max, sum, acc);
    }
}

}  // namespace detail

void attn_clear(const attn_state& st, int64_t v_dim, int n_rows) {
    std::fill(st.max, st.max + n_rows, -std::numeric_limits<float>::infinity());
    std::fill(st.sum, st.sum + n_rows, 0.0f);
    std::fill(st.acc, st.acc + n_rows * v_dim, 0.0f);
}

void attn_tile(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos, float scale,
               const attn_state& st) {
    if (kv.n < 1 || kv.n > attn_tile_max || head_dim > detail::kMaxHeadDim ||
        (kv.type != ggml_type::F16 && kv.type != ggml_type::Q8_0) ||
        (kv.type == ggml_type::Q8_0 && head_dim % formats::QK8_0 != 0))
        throw std::invalid_argument("CPU attention: a tile of " + std::to_string(kv.n) + " positions (1.." +
                                    std::to_string(attn_tile_max) + "), head size " + std::to_string(head_dim) +
                                    " (at most " + std::to_string(detail::kMaxHeadDim) + ") of type " +
                                    std::string(formats::info(kv.type).name) + " (F16, or Q8_0 with a head size that is a multiple of 32)");
    const int64_t v_dim = attn_value_dim(kv, head_dim);
    const int64_t block = kv.type == ggml_type::Q8_0 ? formats::QK8_0 : 1;
    const size_t v_min = formats::row_size(kv.type, (v_dim + block - 1) / block * block);  // the blocks v_dim touches
    if (kv.v_dim < 0 || v_dim > head_dim || attn_value_stride(kv) < v_min)
        throw std::invalid_argument("CPU attention: values of " + std::to_string(v_dim) + " elements (1.." +
                                    std::to_string(head_dim) + ") in rows " + std::to_string(attn_value_stride(kv)) +
                                    " bytes apart (at least " + std::to_string(v_min) + ")");
    detail::active_table().attn_tile(kv, head_dim, q, n_rows, last_pos, scale, st);
}

void attn_merge(int64_t v_dim, int n_rows, const attn_state& a, const attn_state& b) {
    for (int r = 0; r < n_rows; ++r)
        detail::attn_merge_row(v_dim, a.max + r, a.sum + r, a.acc + r * v_dim, b.max[r], b.sum[r], b.acc + r * v_dim);
}

void attn_finish(const attn_state& st, int64_t v_dim, int n_rows, float* out, int64_t out_stride) {
    for (int r = 0; r < n_rows; ++r) {
        float* o = out + r * out_stride;
        const float* acc = st.acc + r * v_dim;
        const float inv = st.sum[r] > 0 ? 1.0f / st.sum[r] : 0.0f;
        for (int64_t d = 0; d < v_dim; ++d) o[d] = acc[d] * inv;
    }
}

namespace {

// Eight rows of eight 16-bit elements transposed in registers: r[i] element j -> r[j] element i.
inline void transpose8x8_epi16(__m128i r[8]) {
    __m128i a[8], b[8];
    for (int i = 0; i < 4; ++i) {
        a[i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);      // pairs of rows, elements 0..3
        a[i + 4] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);  // elements 4..7
    }
    for (int h = 0; h < 2; ++h)  // h: elements 0..3 or 4..7
        for (int i = 0; i < 2; ++i) {  // i: rows 0..3 or 4..7
            b[4 * h + 2 * i] = _mm_unpacklo_epi32(a[4 * h + 2 * i], a[4 * h + 2 * i + 1]);
            b[4 * h + 2 * i + 1] = _mm_unpackhi_epi32(a[4 * h + 2 * i], a[4 * h + 2 * i + 1]);
        }
    // b[4 h + 2 i + k] holds elements 4 h + 2 k, 4 h + 2 k + 1 of rows 4 i .. 4 i + 3.
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 2; ++k) {
            r[4 * h + 2 * k] = _mm_unpacklo_epi64(b[4 * h + k], b[4 * h + 2 + k]);
            r[4 * h + 2 * k + 1] = _mm_unpackhi_epi64(b[4 * h + k], b[4 * h + 2 + k]);
        }
}

}  // namespace

// NOTE: F16 keys go in 8 x 8 squares (8 positions, 8 dimensions): eight 16-byte row loads, a register
// transpose, eight 16-byte stores (dimension j of 8 consecutive positions is 16 contiguous bytes of the
// blocked layout). Squares cut by n or head_dim go element by element.
void attn_pack_keys(ggml_type type, int64_t head_dim, const void* rows, size_t row_stride, int n, void* k) {
    if (n < 1 || n > attn_tile_max || (type != ggml_type::F16 && type != ggml_type::Q8_0) ||
        (type == ggml_type::Q8_0 && head_dim % formats::QK8_0 != 0))
        throw std::invalid_argument("attn_pack_keys: " + std::to_string(n) + " keys (1.." +
                                    std::to_string(attn_tile_max) + ") of " + std::to_string(head_dim) + " " +
                                    std::string(formats::info(type).name) + " elements (F16, or Q8_0 in whole blocks)");
    const size_t row_bytes = formats::row_size(type, head_dim);
    const int n_pad = (n + attn_key_block - 1) / attn_key_block * attn_key_block;
    auto* dst = static_cast<uint8_t*>(k);
    const auto* src = static_cast<const uint8_t*>(rows);
    if (n < n_pad) {  // the unused slots of the last block are scored (then masked): keep them zero
        const int b0 = n_pad - attn_key_block;
        std::memset(dst + static_cast<size_t>(b0) * row_bytes, 0, static_cast<size_t>(attn_key_block) * row_bytes);
    }
    if (type == ggml_type::F16) {
        for (int t0 = 0; t0 < n; t0 += 8) {
            const int nt = std::min(8, n - t0);
            int64_t j0 = 0;
            if (nt == 8)
                for (; j0 + 8 <= head_dim; j0 += 8) {
                    __m128i r[8];
                    for (int t = 0; t < 8; ++t)
                        r[t] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + static_cast<size_t>(t0 + t) * row_stride + 2 * j0));
                    transpose8x8_epi16(r);
                    for (int j = 0; j < 8; ++j)
                        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + attn_key_offset(type, row_bytes, t0, j0 + j)), r[j]);
                }
            for (int t = t0; t < t0 + nt; ++t)
                for (int64_t j = j0; j < head_dim; ++j)
                    std::memcpy(dst + attn_key_offset(type, row_bytes, t, j), src + static_cast<size_t>(t) * row_stride + 2 * j, 2);
        }
        return;
    }
    // Q8_0: quants move in groups of 4 (one int32 slot per position), scales one half per position.
    const int64_t n_b = head_dim / formats::QK8_0;
    for (int t = 0; t < n; ++t) {
        const auto* blocks = reinterpret_cast<const formats::block_q8_0*>(src + static_cast<size_t>(t) * row_stride);
        for (int64_t b = 0; b < n_b; ++b) {
            for (int g = 0; g < formats::QK8_0; g += 4)
                std::memcpy(dst + attn_key_offset(type, row_bytes, t, b * formats::QK8_0 + g), blocks[b].qs + g, 4);
            std::memcpy(dst + attn_key_scale_offset(head_dim, row_bytes, t, b * formats::QK8_0), &blocks[b].d, 2);
        }
    }
}

}  // namespace strata::kernels::cpu
