// Q4_K and Q5_K: super-blocks of 256 = 8 sub-blocks of 32, x = d * sc[s] * q - dmin * m[s] with 6-bit
// sc and m packed in 12 bytes (below) and q in [0, 15] (Q4_K) or [0, 31] (Q5_K).
//
// Codes: element e, sub-block s = e / 32, l = e % 32: the low 4 bits are nibble s % 2 of
// qs[32 * (s / 2) + l] (sub-blocks 2c and 2c + 1 share 32 bytes, low nibbles first); Q5_K's bit 4 is
// bit s of qh[l].
//
// Scale packing (12 bytes): for s < 4, bytes s and s + 4 hold sc[s] and m[s] in their low 6 bits;
// for s >= 4, byte s + 4 holds the low 4 bits of sc[s] (low nibble) and m[s] (high nibble), and the top
// 2 bits of sc[s] and m[s] sit in the top 2 bits of bytes s - 4 and s.
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

constexpr int kSub = 8;   // sub-blocks per super-block
constexpr int kSubN = 32; // elements per sub-block

struct scale_min {
    int sc, m;
};

scale_min unpack_scale_min(int s, const uint8_t* q) {
    if (s < 4) return {q[s] & 63, q[s + 4] & 63};
    return {(q[s + 4] & 0x0f) | ((q[s - 4] >> 6) << 4), (q[s + 4] >> 4) | ((q[s] >> 6) << 4)};
}

void pack_scale_mins(const int* sc, const int* m, uint8_t* q) {
    for (int s = 0; s < 4; ++s) {
        q[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
        q[s + 4] = static_cast<uint8_t>(m[s] | ((m[s + 4] >> 4) << 6));
        q[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0x0f) | ((m[s + 4] & 0x0f) << 4));
    }
}

int code4(const uint8_t* qs, int e) { return (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0f; }

int code5(const uint8_t* qs, const uint8_t* qh, int e) {
    return code4(qs, e) | (((qh[e % 32] >> (e / 32)) & 1) << 4);
}

// Quantizes one super-block: the per-sub-block affine fits, their scales and mins to 6 bits against
// the super-block's half d and dmin, then the codes against the stored values.
void quantize_super(const float* x, int nmax, fp16_t* d, fp16_t* dmin, uint8_t* scales, uint8_t* codes) {
    float sub_scale[kSub], sub_min[kSub];
    for (int s = 0; s < kSub; ++s) {
        float offset = 0.0f;
        sub_scale[s] = fit_affine(kSubN, nmax, x + kSubN * s, codes + kSubN * s, &offset, false);
        sub_min[s] = -offset;
    }
    *d = fp32_to_fp16(*std::max_element(sub_scale, sub_scale + kSub) / 63.0f);
    *dmin = fp32_to_fp16(*std::max_element(sub_min, sub_min + kSub) / 63.0f);
    const float dd = fp16_to_fp32(*d), dm = fp16_to_fp32(*dmin);
    int sc[kSub], m[kSub];
    for (int s = 0; s < kSub; ++s) {
        sc[s] = dd > 0.0f ? std::clamp(nearest_int(sub_scale[s] / dd), 0, 63) : 0;
        m[s] = dm > 0.0f ? std::clamp(nearest_int(sub_min[s] / dm), 0, 63) : 0;
    }
    pack_scale_mins(sc, m, scales);
    for (int s = 0; s < kSub; ++s) {
        const float dl = dd * static_cast<float>(sc[s]), ml = dm * static_cast<float>(m[s]);
        for (int l = 0; l < kSubN; ++l) {
            const int e = kSubN * s + l;
            codes[e] = dl > 0.0f ? static_cast<uint8_t>(std::clamp(nearest_int((x[e] + ml) / dl), 0, nmax)) : 0;
        }
    }
}

// The min term of the dot product: sum over sub-blocks of m[s] * (sum of the 32 activation codes),
// read from the Q8_K bsums (two per sub-block).
int min_sum(const uint8_t* scales, const block_q8_K& y) {
    int msum = 0;
    for (int s = 0; s < kSub; ++s) msum += unpack_scale_min(s, scales).m * (y.bsums[2 * s] + y.bsums[2 * s + 1]);
    return msum;
}

}  // namespace

void dequantize_q4_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q4_K*>(src);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K) {
        const float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);
        for (int s = 0; s < kSub; ++s) {
            const auto [sc, m] = unpack_scale_min(s, b->scales);
            const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e) dst[e] = dl * static_cast<float>(code4(b->qs, e)) - ml;
        }
    }
}

void dequantize_q5_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q5_K*>(src);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K) {
        const float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);
        for (int s = 0; s < kSub; ++s) {
            const auto [sc, m] = unpack_scale_min(s, b->scales);
            const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e)
                dst[e] = dl * static_cast<float>(code5(b->qs, b->qh, e)) - ml;
        }
    }
}

void quantize_q4_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q4_K*>(dst);
    uint8_t codes[QK_K];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        quantize_super(src, 15, &b->d, &b->dmin, b->scales, codes);
        std::fill(std::begin(b->qs), std::end(b->qs), uint8_t{0});
        for (int e = 0; e < QK_K; ++e) b->qs[32 * (e / 64) + e % 32] |= static_cast<uint8_t>(codes[e] << (4 * ((e / 32) % 2)));
    }
}

void quantize_q5_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q5_K*>(dst);
    uint8_t codes[QK_K];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        quantize_super(src, 31, &b->d, &b->dmin, b->scales, codes);
        std::fill(std::begin(b->qs), std::end(b->qs), uint8_t{0});
        std::fill(std::begin(b->qh), std::end(b->qh), uint8_t{0});
        for (int e = 0; e < QK_K; ++e) {
            b->qs[32 * (e / 64) + e % 32] |= static_cast<uint8_t>((codes[e] & 0x0f) << (4 * ((e / 32) % 2)));
            b->qh[e % 32] |= static_cast<uint8_t>((codes[e] >> 4) << (e / 32));
        }
    }
}

// Per super-block: isum = sum over sub-blocks of sc[s] * (int32 sum of code products), msum from the
// bsums (min_sum); then sum += (d_w * d_a) * isum - (dmin_w * d_a) * msum, in super-block order.
float vec_dot_q4_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q4_K*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        int isum = 0;
        for (int s = 0; s < kSub; ++s) {
            int sub = 0;
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e) sub += code4(x->qs, e) * y->qs[e];
            isum += unpack_scale_min(s, x->scales).sc * sub;
        }
        sum += (fp16_to_fp32(x->d) * y->d) * static_cast<float>(isum) -
               (fp16_to_fp32(x->dmin) * y->d) * static_cast<float>(min_sum(x->scales, *y));
    }
    return sum;
}

float vec_dot_q5_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q5_K*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        int isum = 0;
        for (int s = 0; s < kSub; ++s) {
            int sub = 0;
            for (int e = kSubN * s; e < kSubN * (s + 1); ++e) sub += code5(x->qs, x->qh, e) * y->qs[e];
            isum += unpack_scale_min(s, x->scales).sc * sub;
        }
        sum += (fp16_to_fp32(x->d) * y->d) * static_cast<float>(isum) -
               (fp16_to_fp32(x->dmin) * y->d) * static_cast<float>(min_sum(x->scales, *y));
    }
    return sum;
}

}  // namespace strata::formats::detail
