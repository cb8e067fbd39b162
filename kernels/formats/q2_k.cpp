// Q2_K: super-blocks of 256 = 16 sub-blocks of 16, x = d * sc * q - dmin * m, q in [0, 3], where
// scales[s] holds sc (low nibble) and m (high nibble) of sub-block s.
//
// Codes: element e, chunk c = e / 128, k = (e % 128) / 32, l = e % 32: bits 2k, 2k + 1 of qs[32 * c + l].
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

constexpr int kSub = 16;   // sub-blocks per super-block
constexpr int kSubN = 16;  // elements per sub-block

int qs_index(int e) { return 32 * (e / 128) + e % 32; }
int qs_shift(int e) { return 2 * ((e % 128) / 32); }
int code(const block_q2_K& b, int e) { return (b.qs[qs_index(e)] >> qs_shift(e)) & 0x03; }

}  // namespace

void dequantize_q2_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q2_K*>(src);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K) {
        const float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);
        for (int s = 0; s < kSub; ++s) {
            const float dl = d * static_cast<float>(b->scales[s] & 0x0f);
            const float ml = dmin * static_cast<float>(b->scales[s] >> 4);
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e) dst[e] = dl * static_cast<float>(code(*b, e)) - ml;
        }
    }
}

// Sub-block affine fits; scales and mins to 4 bits against the super-block's half d and dmin.
void quantize_q2_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q2_K*>(dst);
    uint8_t codes[QK_K];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        float sub_scale[kSub], sub_min[kSub];
        for (int s = 0; s < kSub; ++s) {
            float offset = 0.0f;
            sub_scale[s] = fit_affine(kSubN, 3, src + kSubN * s, codes + kSubN * s, &offset, false);
            sub_min[s] = -offset;
        }
        b->d = fp32_to_fp16(*std::max_element(sub_scale, sub_scale + kSub) / 15.0f);
        b->dmin = fp32_to_fp16(*std::max_element(sub_min, sub_min + kSub) / 15.0f);
        const float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);
        for (int s = 0; s < kSub; ++s) {
            const int sc = d > 0.0f ? std::clamp(nearest_int(sub_scale[s] / d), 0, 15) : 0;
            const int m = dmin > 0.0f ? std::clamp(nearest_int(sub_min[s] / dmin), 0, 15) : 0;
            b->scales[s] = static_cast<uint8_t>(sc | (m << 4));
            const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e)
                codes[e] = dl > 0.0f ? static_cast<uint8_t>(std::clamp(nearest_int((src[e] + ml) / dl), 0, 3)) : 0;
        }
        std::fill(std::begin(b->qs), std::end(b->qs), uint8_t{0});
        for (int e = 0; e < QK_K; ++e) b->qs[qs_index(e)] |= static_cast<uint8_t>(codes[e] << qs_shift(e));
    }
}

// Per super-block: isum = sum over sub-blocks of sc * (int32 sum of q * a), msum = sum of m * bsums[s];
// then sum += (d_w * d_a) * isum - (dmin_w * d_a) * msum, in super-block order.
float vec_dot_q2_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q2_K*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        int isum = 0, msum = 0;
        for (int s = 0; s < kSub; ++s) {
            int sub = 0;
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e) sub += code(*x, e) * y->qs[e];
            isum += (x->scales[s] & 0x0f) * sub;
            msum += (x->scales[s] >> 4) * y->bsums[s];
        }
        sum += (fp16_to_fp32(x->d) * y->d) * static_cast<float>(isum) -
               (fp16_to_fp32(x->dmin) * y->d) * static_cast<float>(msum);
    }
    return sum;
}

}  // namespace strata::formats::detail
