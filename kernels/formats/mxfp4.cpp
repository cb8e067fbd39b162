// MXFP4: blocks of 32 E2M1 values (kvalues_mxfp4, doubled) sharing an E8M0 exponent e; x = 2^(e - 128) *
// kvalues_mxfp4[q], IQ4_NL's nibble order. The dot product reads Q8_0 activations.
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

constexpr int QK = QK_MXFP4;

int nearest_fp4_index(float v) {
    int best = 0;
    for (int k = 1; k < 16; ++k)
        if (std::fabs(v - kvalues_mxfp4[k]) < std::fabs(v - kvalues_mxfp4[best])) best = k;
    return best;
}

int code_of(const uint8_t* qs, int i) { return i < QK / 2 ? qs[i] & 0x0f : qs[i - QK / 2] >> 4; }

}  // namespace

float e8m0_half(uint8_t e) { return std::ldexp(1.0f, static_cast<int>(e) - 128); }

void dequantize_mxfp4(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_mxfp4*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = e8m0_half(b->e);
        for (int i = 0; i < QK; ++i) dst[i] = static_cast<float>(kvalues_mxfp4[code_of(b->qs, i)]) * d;
    }
}

// The exponent putting the largest magnitude at 8 .. 16 code units, or one above (4 .. 8, no clipping);
// whichever encodes the block with the smaller squared error.
void quantize_mxfp4(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_mxfp4*>(dst);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) {
        const float amax = max_abs(QK, src);
        int e0 = 0;
        if (amax > 0.0f) e0 = std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 253);
        float best_err = INFINITY;
        for (int e = e0; e <= e0 + 1; ++e) {
            const float d = e8m0_half(static_cast<uint8_t>(e));
            uint8_t codes[QK];
            float err = 0.0f;
            for (int i = 0; i < QK; ++i) {
                codes[i] = static_cast<uint8_t>(nearest_fp4_index(src[i] / d));
                const float diff = src[i] - static_cast<float>(kvalues_mxfp4[codes[i]]) * d;
                err += diff * diff;
            }
            if (err >= best_err) continue;
            best_err = err;
            b->e = static_cast<uint8_t>(e);
            for (int j = 0; j < QK / 2; ++j) b->qs[j] = static_cast<uint8_t>(codes[j] | (codes[j + QK / 2] << 4));
        }
    }
}

// Per block an int32 sum of kvalues_mxfp4[q] * a, then sum += (2^(e-128) * d_a) * isum, in block order.
float vec_dot_mxfp4(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_mxfp4*>(w);
    const auto* y = static_cast<const block_q8_0*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK; ++ib, ++x, ++y) {
        int isum = 0;
        for (int i = 0; i < QK; ++i) isum += kvalues_mxfp4[code_of(x->qs, i)] * y->qs[i];
        sum += (e8m0_half(x->e) * fp16_to_fp32(y->d)) * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace strata::formats::detail
