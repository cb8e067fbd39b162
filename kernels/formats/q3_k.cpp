// Q3_K: super-blocks of 256 = 16 sub-blocks of 16, x = d * (sc[e / 16] - 32) * (q - 4), q in [0, 7],
// 6-bit scales.
//
// Codes: element e, chunk c = e / 128, k = (e % 128) / 32, l = e % 32: the low 2 bits are bits 2k, 2k + 1
// of qs[32 * c + l]; bit 2 is bit e / 32 of hmask[l] (a set bit means q >= 4).
//
// Scale packing (12 bytes): the low 4 bits of sc[s] are nibble s / 8 of byte s % 8; the top 2 bits are
// bits 2 * (s / 4), +1 of byte 8 + s % 4.
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

constexpr int kSub = 16;   // sub-blocks per super-block
constexpr int kSubN = 16;  // elements per sub-block

int scale(const uint8_t* q, int s) {
    const int lo = (q[s % 8] >> (4 * (s / 8))) & 0x0f;
    const int hi = (q[8 + s % 4] >> (2 * (s / 4))) & 0x03;
    return (lo | (hi << 4)) - 32;
}

void pack_scales(const int* sc, uint8_t* q) {  // sc in [-32, 31]
    std::fill(q, q + 12, uint8_t{0});
    for (int s = 0; s < kSub; ++s) {
        const int v = sc[s] + 32;
        q[s % 8] |= static_cast<uint8_t>((v & 0x0f) << (4 * (s / 8)));
        q[8 + s % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (s / 4)));
    }
}

int qs_index(int e) { return 32 * (e / 128) + e % 32; }
int qs_shift(int e) { return 2 * ((e % 128) / 32); }

// The signed code q - 4 of element e.
int code(const block_q3_K& b, int e) {
    const int lo = (b.qs[qs_index(e)] >> qs_shift(e)) & 0x03;
    const int hi = (b.hmask[e % 32] >> (e / 32)) & 1;
    return (lo | (hi << 2)) - 4;
}

}  // namespace

void dequantize_q3_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q3_K*>(src);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K) {
        const float d = fp16_to_fp32(b->d);
        for (int e = 0; e < QK_K; ++e)
            dst[e] = d * static_cast<float>(scale(b->scales, e / kSubN)) * static_cast<float>(code(*b, e));
    }
}

// Sub-block scales from symmetric fits; the largest magnitude maps to scale code -32.
void quantize_q3_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q3_K*>(dst);
    uint8_t codes[QK_K];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        float sub_scale[kSub];
        float max_scale = 0.0f;  // signed, largest magnitude
        for (int s = 0; s < kSub; ++s) {
            sub_scale[s] = fit_symmetric(kSubN, 4, src + kSubN * s, codes + kSubN * s);
            if (std::fabs(sub_scale[s]) > std::fabs(max_scale)) max_scale = sub_scale[s];
        }
        b->d = fp32_to_fp16(max_scale / -32.0f);
        const float d = fp16_to_fp32(b->d);
        int sc[kSub];
        for (int s = 0; s < kSub; ++s) {
            sc[s] = d != 0.0f ? std::clamp(nearest_int(sub_scale[s] / d), -32, 31) : 0;
            const float dl = d * static_cast<float>(sc[s]);
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e)
                codes[e] = static_cast<uint8_t>((dl != 0.0f ? std::clamp(nearest_int(src[e] / dl), -4, 3) : 0) + 4);
        }
        pack_scales(sc, b->scales);
        std::fill(std::begin(b->qs), std::end(b->qs), uint8_t{0});
        std::fill(std::begin(b->hmask), std::end(b->hmask), uint8_t{0});
        for (int e = 0; e < QK_K; ++e) {
            b->qs[qs_index(e)] |= static_cast<uint8_t>((codes[e] & 0x03) << qs_shift(e));
            b->hmask[e % 32] |= static_cast<uint8_t>((codes[e] >> 2) << (e / 32));
        }
    }
}

// Per super-block: isum = sum over sub-blocks of (sc - 32) * (int32 sum of (q - 4) * a), then
// sum += (d_w * d_a) * isum, in super-block order.
float vec_dot_q3_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q3_K*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        int isum = 0;
        for (int s = 0; s < kSub; ++s) {
            int sub = 0;
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e) sub += code(*x, e) * y->qs[e];
            isum += scale(x->scales, s) * sub;
        }
        sum += (fp16_to_fp32(x->d) * y->d) * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace strata::formats::detail
