// Internal to kernels/formats: the IQ2 / IQ3 formats decode a super-block into signed integer values
// and odd sub-block scale multipliers, x[i] = d * unit * ls[i / span] * q[i]; dequantize and the
// reference dot product are written once over that form.
#pragma once

#include <cstdint>

#include "formats/blocks.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

struct iq_values {
    int8_t q[QK_K];  // +- code book value
    int ls[16];      // 2 s + 1 per span
    int span;        // elements per scale: 16 or 32
};

// x = (d * (unit * ls)) * q, the rounding ggml's dequantizers do (unit * ls is exact).
template <typename Block, void (*Decode)(const Block&, iq_values&)>
void dequantize_iq(const void* src, float* dst, int64_t n, float unit) {
    const auto* b = static_cast<const Block*>(src);
    iq_values v;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K) {
        Decode(*b, v);
        const float d = fp16_to_fp32(b->d);
        for (int i = 0; i < QK_K; ++i)
            dst[i] = d * (unit * static_cast<float>(v.ls[i / v.span])) * static_cast<float>(v.q[i]);
    }
}

// Per super-block an int32 isum = sum over spans of ls * (sum of q * a), then sum += (d_w * d_a) * isum;
// the result is sum * unit (a power of two).
template <typename Block, void (*Decode)(const Block&, iq_values&)>
float vec_dot_iq(int64_t n, const void* w, const void* a, float unit) {
    const auto* x = static_cast<const Block*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    iq_values v;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        Decode(*x, v);
        int isum = 0;
        for (int s = 0; s < QK_K / v.span; ++s) {
            int part = 0;
            for (int i = s * v.span; i < (s + 1) * v.span; ++i) part += v.q[i] * y->qs[i];
            isum += v.ls[s] * part;
        }
        sum += (fp16_to_fp32(x->d) * y->d) * static_cast<float>(isum);
    }
    return sum * unit;
}

}  // namespace strata::formats::detail
