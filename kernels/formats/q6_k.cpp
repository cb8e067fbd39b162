// Q6_K: super-blocks of 256 = 16 sub-blocks of 16, x = d * scales[e / 16] * (q - 32), q in [0, 63],
// int8 scales.
//
// Codes: element e, chunk c = e / 128, quarter k = (e % 128) / 32, l = e % 32: the low 4 bits are
// nibble k / 2 of ql[64 * c + 32 * (k % 2) + l], the top 2 bits are bits 2k, 2k + 1 of qh[32 * c + l].
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

constexpr int kSub = 16;   // sub-blocks per super-block
constexpr int kSubN = 16;  // elements per sub-block

int ql_index(int e) { return 64 * (e / 128) + 32 * ((e / 32) % 2) + e % 32; }
int ql_shift(int e) { return 4 * ((e % 128) / 64); }
int qh_index(int e) { return 32 * (e / 128) + e % 32; }
int qh_shift(int e) { return 2 * ((e % 128) / 32); }

// The signed code q - 32 of element e.
int code(const block_q6_K& b, int e) {
    const int lo = (b.ql[ql_index(e)] >> ql_shift(e)) & 0x0f;
    const int hi = (b.qh[qh_index(e)] >> qh_shift(e)) & 0x03;
    return (lo | (hi << 4)) - 32;
}

}  // namespace

void dequantize_q6_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q6_K*>(src);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K) {
        const float d = fp16_to_fp32(b->d);
        for (int e = 0; e < QK_K; ++e)
            dst[e] = d * static_cast<float>(b->scales[e / kSubN]) * static_cast<float>(code(*b, e));
    }
}

// Sub-block scales from symmetric fits; the largest magnitude maps to scale code -128.
void quantize_q6_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q6_K*>(dst);
    uint8_t codes[QK_K];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        float sub_scale[kSub];
        float max_scale = 0.0f;  // signed, largest magnitude
        for (int s = 0; s < kSub; ++s) {
            sub_scale[s] = fit_symmetric(kSubN, 32, src + kSubN * s, codes + kSubN * s);
            if (std::fabs(sub_scale[s]) > std::fabs(max_scale)) max_scale = sub_scale[s];
        }
        b->d = fp32_to_fp16(max_scale / -128.0f);
        const float d = fp16_to_fp32(b->d);
        for (int s = 0; s < kSub; ++s) {
            const int ls = d != 0.0f ? std::clamp(nearest_int(sub_scale[s] / d), -128, 127) : 0;
            b->scales[s] = static_cast<int8_t>(ls);
            const float dl = d * static_cast<float>(ls);
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e)
                codes[e] = static_cast<uint8_t>(
                    (dl != 0.0f ? std::clamp(nearest_int(src[e] / dl), -32, 31) : 0) + 32);
        }
        std::fill(std::begin(b->ql), std::end(b->ql), uint8_t{0});
        std::fill(std::begin(b->qh), std::end(b->qh), uint8_t{0});
        for (int e = 0; e < QK_K; ++e) {
            b->ql[ql_index(e)] |= static_cast<uint8_t>((codes[e] & 0x0f) << ql_shift(e));
            b->qh[qh_index(e)] |= static_cast<uint8_t>((codes[e] >> 4) << qh_shift(e));
        }
    }
}

// Per super-block: isum = sum over sub-blocks of scales[s] * (int32 sum of (q - 32) * a), then
// sum += (d_w * d_a) * isum, in super-block order.
float vec_dot_q6_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q6_K*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        int isum = 0;
        for (int s = 0; s < kSub; ++s) {
            int sub = 0;
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e) sub += code(*x, e) * y->qs[e];
            isum += x->scales[s] * sub;
        }
        sum += (fp16_to_fp32(x->d) * y->d) * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace strata::formats::detail
