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

}  // namespace strata::kernels::cpu::detail
