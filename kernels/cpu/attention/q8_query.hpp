// Internal: a query row quantized for the int8 scores against Q8_0 keys (attention.hpp), shared by the
// scalar, AVX2 and AVX-512 tiles. Plain C++, so every file can include it.
#pragma once

#include <cstdint>
#include <cstring>

#include "formats/blocks.hpp"
#include "formats/quant.hpp"

namespace strata::kernels::cpu::detail {

// One row's Q8_0 blocks unpacked: quants qs[head_dim], and per block of 32 its scale d (the f16 scale
// as f32) and the sum of its quants (the unsigned-times-signed dot products of AVX-512 VNNI shift the
// keys by 128 and take 128 * sum back out).
struct q8_query_view {
    int8_t* qs;
    float* d;
    int32_t* sum;
};

// Quantizes q[0..head_dim) (a multiple of 32) exactly as formats::quantize_row(Q8_0) does.
inline void quantize_query(const float* q, int64_t head_dim, const q8_query_view& out) {
    for (int64_t b = 0; b < head_dim / formats::QK8_0; ++b) {
        formats::block_q8_0 blk;
        formats::quantize_row(formats::ggml_type::Q8_0, q + b * formats::QK8_0, &blk, formats::QK8_0);
        std::memcpy(out.qs + b * formats::QK8_0, blk.qs, formats::QK8_0);
        out.d[b] = formats::fp16_to_fp32(blk.d);
        int32_t s = 0;
        for (int i = 0; i < formats::QK8_0; ++i) s += blk.qs[i];
        out.sum[b] = s;
    }
}

// Up to MaxRows query rows of at most MaxHeadDim elements, quantized by `quantize` (a file's SIMD twin
// of quantize_query): row i at qs + i * head_dim, d + i * n_b and sum + i * n_b (n_b = head_dim / 32).
template <int MaxRows, int64_t MaxHeadDim>
struct q8_query_rows {
    alignas(64) int8_t qs[MaxRows * MaxHeadDim];
    float d[MaxRows * MaxHeadDim / formats::QK8_0];
    int32_t sum[MaxRows * MaxHeadDim / formats::QK8_0];
    int64_t head_dim, n_b;
    template <class Quantize>
    q8_query_rows(const float* q, int64_t hd, int n, Quantize quantize) : head_dim(hd), n_b(hd / formats::QK8_0) {
        for (int i = 0; i < n; ++i) quantize(q + i * hd, hd, q8_query_view{qs + i * hd, d + i * n_b, sum + i * n_b});
    }
};

}  // namespace strata::kernels::cpu::detail
