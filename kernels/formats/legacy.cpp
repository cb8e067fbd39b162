// The 32-element "legacy" formats: Q4_0, Q4_1, Q5_0, Q5_1 (weights), Q8_0 (weights and the activations
// of the _0 formats) and Q8_1 (activations of the _1 formats).
//
// Layout shared by the 4- and 5-bit formats: qs[j] holds element j in its low nibble and element j + 16
// in its high nibble; for the 5-bit formats bit i of the 32-bit little-endian qh is bit 4 of element i.
#include <algorithm>
#include <cmath>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

constexpr int QK = 32;  // elements per block, all formats of this file

int nibble(const uint8_t* qs, int i) { return i < QK / 2 ? qs[i] & 0x0f : qs[i - QK / 2] >> 4; }

int high_bit(const uint8_t* qh, int i) { return (qh[i / 8] >> (i % 8)) & 1; }

// Packs 32 codes (4 or 5 bits each) into qs and, when qh is given, bit 4 of each into qh.
void pack_codes(const uint8_t* codes, uint8_t* qs, uint8_t* qh) {
    for (int j = 0; j < QK / 2; ++j)
        qs[j] = static_cast<uint8_t>((codes[j] & 0x0f) | ((codes[j + QK / 2] & 0x0f) << 4));
    if (!qh) return;
    std::fill(qh, qh + 4, uint8_t{0});
    for (int i = 0; i < QK; ++i) qh[i / 8] |= static_cast<uint8_t>(((codes[i] >> 4) & 1) << (i % 8));
}

// Symmetric formats: x = d * (q - bias), q in [0, 2 * bias - 1]. Fits the scale, stores it as a half and
// rounds the codes against the stored scale.
fp16_t quantize_symmetric(const float* x, int bias, uint8_t* codes) {
    const fp16_t d = fp32_to_fp16(fit_symmetric(QK, bias, x, codes));
    const float dd = fp16_to_fp32(d);
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int i = 0; i < QK; ++i)
        codes[i] = static_cast<uint8_t>(std::clamp(nearest_int(x[i] * id), -bias, bias - 1) + bias);
    return d;
}

// Affine formats: x = d * q + m, q in [0, nmax]. Writes d and m as halves.
void quantize_affine(const float* x, int nmax, uint8_t* codes, fp16_t* d, fp16_t* m) {
    float offset = 0.0f;
    *d = fp32_to_fp16(fit_affine(QK, nmax, x, codes, &offset, /*free_offset=*/true));
    *m = fp32_to_fp16(offset);
    const float dd = fp16_to_fp32(*d), mm = fp16_to_fp32(*m);
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int i = 0; i < QK; ++i)
        codes[i] = static_cast<uint8_t>(std::clamp(nearest_int((x[i] - mm) * id), 0, nmax));
}

// Q8_0 / Q8_1 codes: d = max|x| / 127, q = round(x / d). Returns the half d.
fp16_t quantize_q8(const float* x, int8_t* qs) {
    const fp16_t d = fp32_to_fp16(max_abs(QK, x) / 127.0f);
    const float dd = fp16_to_fp32(d);
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int i = 0; i < QK; ++i) qs[i] = static_cast<int8_t>(std::clamp(nearest_int(x[i] * id), -127, 127));
    return d;
}

}  // namespace

// ---- dequantize ----

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q4_0*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = fp16_to_fp32(b->d);
        for (int i = 0; i < QK; ++i) dst[i] = d * static_cast<float>(nibble(b->qs, i) - 8);
    }
}

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q4_1*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = fp16_to_fp32(b->d), m = fp16_to_fp32(b->m);
        for (int i = 0; i < QK; ++i) dst[i] = d * static_cast<float>(nibble(b->qs, i)) + m;
    }
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q5_0*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = fp16_to_fp32(b->d);
        for (int i = 0; i < QK; ++i)
            dst[i] = d * static_cast<float>((nibble(b->qs, i) | (high_bit(b->qh, i) << 4)) - 16);
    }
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q5_1*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = fp16_to_fp32(b->d), m = fp16_to_fp32(b->m);
        for (int i = 0; i < QK; ++i)
            dst[i] = d * static_cast<float>(nibble(b->qs, i) | (high_bit(b->qh, i) << 4)) + m;
    }
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q8_0*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = fp16_to_fp32(b->d);
        for (int i = 0; i < QK; ++i) dst[i] = d * static_cast<float>(b->qs[i]);
    }
}

void dequantize_q8_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const block_q8_1*>(src);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, dst += QK) {
        const float d = fp16_to_fp32(b->d);
        for (int i = 0; i < QK; ++i) dst[i] = d * static_cast<float>(b->qs[i]);
    }
}

// ---- quantize ----

void quantize_q4_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q4_0*>(dst);
    uint8_t codes[QK];
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) {
        b->d = quantize_symmetric(src, 8, codes);
        pack_codes(codes, b->qs, nullptr);
    }
}

void quantize_q4_1(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q4_1*>(dst);
    uint8_t codes[QK];
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) {
        quantize_affine(src, 15, codes, &b->d, &b->m);
        pack_codes(codes, b->qs, nullptr);
    }
}

void quantize_q5_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q5_0*>(dst);
    uint8_t codes[QK];
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) {
        b->d = quantize_symmetric(src, 16, codes);
        pack_codes(codes, b->qs, b->qh);
    }
}

void quantize_q5_1(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q5_1*>(dst);
    uint8_t codes[QK];
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) {
        quantize_affine(src, 31, codes, &b->d, &b->m);
        pack_codes(codes, b->qs, b->qh);
    }
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q8_0*>(dst);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) b->d = quantize_q8(src, b->qs);
}

// s = d * sum(qs), computed from the stored (half) d.
void quantize_q8_1(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_q8_1*>(dst);
    for (int64_t ib = 0; ib < n / QK; ++ib, ++b, src += QK) {
        b->d = quantize_q8(src, b->qs);
        int sum = 0;
        for (int i = 0; i < QK; ++i) sum += b->qs[i];
        b->s = fp32_to_fp16(fp16_to_fp32(b->d) * static_cast<float>(sum));
    }
}

// ---- dot products ----
// Per block: an exact int32 sum of code products, then one f32 term added to a single f32 accumulator
// in block order: sum += (d_w * d_a) * isum, plus m_w * s_a for the _1 formats.

float vec_dot_q4_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q4_0*>(w);
    const auto* y = static_cast<const block_q8_0*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK; ++ib, ++x, ++y) {
        int isum = 0;
        for (int i = 0; i < QK; ++i) isum += (nibble(x->qs, i) - 8) * y->qs[i];
        sum += (fp16_to_fp32(x->d) * fp16_to_fp32(y->d)) * static_cast<float>(isum);
    }
    return sum;
}

float vec_dot_q4_1(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q4_1*>(w);
    const auto* y = static_cast<const block_q8_1*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK; ++ib, ++x, ++y) {
        int isum = 0;
        for (int i = 0; i < QK; ++i) isum += nibble(x->qs, i) * y->qs[i];
        sum += (fp16_to_fp32(x->d) * fp16_to_fp32(y->d)) * static_cast<float>(isum) +
               fp16_to_fp32(x->m) * fp16_to_fp32(y->s);
    }
    return sum;
}

float vec_dot_q5_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q5_0*>(w);
    const auto* y = static_cast<const block_q8_0*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK; ++ib, ++x, ++y) {
        int isum = 0;
        for (int i = 0; i < QK; ++i) isum += ((nibble(x->qs, i) | (high_bit(x->qh, i) << 4)) - 16) * y->qs[i];
        sum += (fp16_to_fp32(x->d) * fp16_to_fp32(y->d)) * static_cast<float>(isum);
    }
    return sum;
}

float vec_dot_q5_1(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q5_1*>(w);
    const auto* y = static_cast<const block_q8_1*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK; ++ib, ++x, ++y) {
        int isum = 0;
        for (int i = 0; i < QK; ++i) isum += (nibble(x->qs, i) | (high_bit(x->qh, i) << 4)) * y->qs[i];
        sum += (fp16_to_fp32(x->d) * fp16_to_fp32(y->d)) * static_cast<float>(isum) +
               fp16_to_fp32(x->m) * fp16_to_fp32(y->s);
    }
    return sum;
}

float vec_dot_q8_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const block_q8_0*>(w);
    const auto* y = static_cast<const block_q8_0*>(a);
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK; ++ib, ++x, ++y) {
        int isum = 0;
        for (int i = 0; i < QK; ++i) isum += x->qs[i] * y->qs[i];
        sum += (fp16_to_fp32(x->d) * fp16_to_fp32(y->d)) * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace strata::formats::detail
