// Q8_K: the activation format of the k-quants and IQ4_XS. Super-blocks of 256 int8 codes with an f32
// scale, x = d * q, and bsums[j] = the sum of codes 16j .. 16j + 15 (for the min terms of the weight
// formats that have mins).
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

void dequantize_q8_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q8_K*>(src);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K)
        for (int e = 0; e < QK_K; ++e) dst[e] = b->d * static_cast<float>(b->qs[e]);
}

// d = max|x| / 127 (codes stay in [-127, 127], so no code is -128), q = round(x / d).
void quantize_q8_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q8_K*>(dst);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        b->d = max_abs(QK_K, src) / 127.0f;
        const float id = b->d != 0.0f ? 1.0f / b->d : 0.0f;
        for (int e = 0; e < QK_K; ++e)
            b->qs[e] = static_cast<int8_t>(std::clamp(nearest_int(src[e] * id), -127, 127));
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int e = 16 * j; e < 16 * (j + 1); ++e) sum += b->qs[e];
            b->bsums[j] = static_cast<int16_t>(sum);
        }
    }
}

// Per super-block: an int32 sum of code products, then sum += (d_w * d_a) * isum, in block order.
float vec_dot_q8_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q8_K*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        int isum = 0;
        for (int e = 0; e < QK_K; ++e) isum += x->qs[e] * y->qs[e];
        sum += (x->d * y->d) * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace strata::formats::detail
