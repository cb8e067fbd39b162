// IEEE half and bfloat16 conversions by bit manipulation (no ISA intrinsics), and the float formats'
// row operations (F32, F16, BF16 weights read F32 activations).
#include <bit>
#include <cstring>

#include "formats/detail.hpp"
#include "formats/quant.hpp"

namespace strata::formats {

float fp16_to_fp32(fp16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {  // inf or NaN: keep the payload
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {  // normal: rebias 15 -> 127
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal mant * 2^-24: normalise so the leading one lands in bit 10
        const int top = std::bit_width(mant) - 1;  // 0..9
        mant = (mant << (10 - top)) & 0x3ffu;
        bits = sign | (static_cast<uint32_t>(top + 103) << 23) | (mant << 13);
    }
    return std::bit_cast<float>(bits);
}

fp16_t fp32_to_fp16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u)  // NaN: quiet it, keep the top payload bits
        return static_cast<fp16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x47800000u)  // >= 2^16 (or inf): beyond every half
        return static_cast<fp16_t>(sign | 0x7c00u);

    const int exp = static_cast<int>(abs >> 23) - 127 + 15;  // half's biased exponent
    uint32_t mant24 = (abs & 0x7fffffu) | 0x800000u;         // with the implicit one
    int shift;                                               // bits of mant24 that do not fit
    uint32_t h;
    if (exp >= 1) {
        shift = 13;
        h = (static_cast<uint32_t>(exp) << 10) | ((mant24 >> 13) & 0x3ffu);
    } else {
        shift = 14 - exp;  // subnormal half: units of 2^-24
        if (shift > 24) return static_cast<fp16_t>(sign);  // below half the smallest subnormal
        h = mant24 >> shift;
    }
    // Round to nearest, ties to even. A carry out of the mantissa moves into the exponent, which is
    // the correctly rounded result (up to inf for values in [65520, 65536)).
    const uint32_t rem = mant24 & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<fp16_t>(sign | h);
}

float bf16_to_fp32(bf16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

bf16_t fp32_to_bf16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((x >> 16) | 0x0040u);  // quiet NaN
    const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);  // ties to even; overflows into inf
    return static_cast<bf16_t>(rounded >> 16);
}

namespace detail {

void dequantize_f32(const void* src, float* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void quantize_f32(const float* src, void* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
    const auto* h = static_cast<const fp16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}
void quantize_f16(const float* src, void* dst, int64_t n) {
    auto* h = static_cast<fp16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
    const auto* h = static_cast<const bf16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}
void quantize_bf16(const float* src, void* dst, int64_t n) {
    auto* h = static_cast<bf16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
}

// Float weights: one f32 accumulator, products added in element order.
float vec_dot_f32(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const float*>(w);
    const auto* y = static_cast<const float*>(a);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
    return sum;
}

float vec_dot_f16(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const fp16_t*>(w);
    const auto* y = static_cast<const float*>(a);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += fp16_to_fp32(x[i]) * y[i];
    return sum;
}

float vec_dot_bf16(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const bf16_t*>(w);
    const auto* y = static_cast<const float*>(a);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += bf16_to_fp32(x[i]) * y[i];
    return sum;
}

}  // namespace detail
}  // namespace strata::formats
