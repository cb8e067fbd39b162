// IQ4_NL and IQ4_XS: 4-bit indices into the non-linear code book kvalues_iq4nl.
//
// IQ4_NL: blocks of 32 with a half scale, x = d * kvalues[q]; qs[j] holds element j in its low nibble
// and element j + 16 in its high nibble.
// IQ4_XS: super-blocks of 256 = 8 sub-blocks of 32, x = d * (ls[s] - 32) * kvalues[q], 6-bit ls: the
// low 4 bits in nibble s % 2 of scales_l[s / 2], the top 2 bits in bits 2s, 2s + 1 of scales_h; each
// sub-block's 16 bytes of qs use IQ4_NL's nibble order.
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

constexpr int QK = 32;  // elements per IQ4_NL block and per IQ4_XS sub-block
constexpr int kSub = QK_K / QK;

int index_of(const uint8_t* qs, int i) { return i < QK / 2 ? qs[i] & 0x0f : qs[i - QK / 2] >> 4; }

void pack_indices(const uint8_t* codes, uint8_t* qs) {
    for (int j = 0; j < QK / 2; ++j) qs[j] = static_cast<uint8_t>(codes[j] | (codes[j + QK / 2] << 4));
}

// Indices of 32 elements against the stored scale dl (all map to the entry nearest 0 when dl is 0).
void encode(const float* x, float dl, uint8_t* codes) {
    const float id = dl != 0.0f ? 1.0f / dl : 0.0f;
    for (int i = 0; i < QK; ++i) codes[i] = static_cast<uint8_t>(nearest_iq4_index(x[i] * id));
}

int sub_scale(const block_iq4_xs& b, int s) {
    const int lo = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
    const int hi = (b.scales_h >> (2 * s)) & 0x03;
    return (lo | (hi << 4)) - 32;
}

int code_sum(const uint8_t* qs, const int8_t* a) {
    int sum = 0;
    for (int i = 0; i < QK; ++i) sum += kvalues_iq4nl[index_of(qs, i)] * a[i];
    return sum;
}

}  // namespace

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_iq4_nl*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = fp16_to_fp32(b->d);
        for (int i = 0; i < QK; ++i) dst[i] = d * static_cast<float>(kvalues_iq4nl[index_of(b->qs, i)]);
    }
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_iq4_xs*>(src);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b) {
        const float d = fp16_to_fp32(b->d);
        for (int s = 0; s < kSub; ++s, dst += QK) {
            const float dl = d * static_cast<float>(sub_scale(*b, s));
            const uint8_t* qs = b->qs + QK / 2 * s;
            for (int i = 0; i < QK; ++i) dst[i] = dl * static_cast<float>(kvalues_iq4nl[index_of(qs, i)]);
        }
    }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq4_nl*>(dst);
    uint8_t codes[QK];
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) {
        b->d = fp32_to_fp16(fit_iq4(QK, src, codes));
        encode(src, fp16_to_fp32(b->d), codes);
        pack_indices(codes, b->qs);
    }
}

// Sub-block scales from code-book fits; the largest magnitude maps to scale code -32.
void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq4_xs*>(dst);
    uint8_t codes[QK];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        float scales[kSub];
        float max_scale = 0.0f;  // signed, largest magnitude
        for (int s = 0; s < kSub; ++s) {
            scales[s] = fit_iq4(QK, src + QK * s, codes);
            if (std::fabs(scales[s]) > std::fabs(max_scale)) max_scale = scales[s];
        }
        b->d = fp32_to_fp16(max_scale / -32.0f);
        const float d = fp16_to_fp32(b->d);
        b->scales_h = 0;
        std::fill(std::begin(b->scales_l), std::end(b->scales_l), uint8_t{0});
        for (int s = 0; s < kSub; ++s) {
            const int ls = d != 0.0f ? std::clamp(nearest_int(scales[s] / d), -32, 31) : 0;
            b->scales_l[s / 2] |= static_cast<uint8_t>(((ls + 32) & 0x0f) << (4 * (s % 2)));
            b->scales_h |= static_cast<uint16_t>(((ls + 32) >> 4) << (2 * s));
            encode(src + QK * s, d * static_cast<float>(ls), codes);
            pack_indices(codes, b->qs + QK / 2 * s);
        }
    }
}

// Per block: an int32 sum of kvalues[q] * a, then sum += (d_w * d_a) * isum, in block order.
float vec_dot_iq4_nl(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_iq4_nl*>(w);
    const auto* y = static_cast<const block_q8_0*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK; ++ib, ++x, ++y)
        sum += (fp16_to_fp32(x->d) * fp16_to_fp32(y->d)) * static_cast<float>(code_sum(x->qs, y->qs));
    return sum;
}

// Per super-block: isum = sum over sub-blocks of (ls - 32) * (int32 sum of kvalues[q] * a), then
// sum += (d_w * d_a) * isum, in super-block order.
float vec_dot_iq4_xs(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_iq4_xs*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        int isum = 0;
        for (int s = 0; s < kSub; ++s) isum += sub_scale(*x, s) * code_sum(x->qs + QK / 2 * s, y->qs + QK * s);
        sum += (fp16_to_fp32(x->d) * y->d) * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace strata::formats::detail
