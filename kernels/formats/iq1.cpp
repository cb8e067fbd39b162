// IQ1_S, IQ1_M: groups of 8 take an entry of iq1s_grid (values -1, 0, 1; 2048 entries, 11-bit index)
// and are shifted by +-IQ1S_DELTA: x = d * (2 s + 1) * (value + delta), s a 3-bit scale.
//   IQ1_S: per 32 elements qh = four 3-bit index tops | s << 12 | (delta < 0) << 15, low index bytes in qs.
//   IQ1_M: per group a nibble of qh: 3-bit index top, bit 3 = (delta < 0); s per 16: the four uint16 words
//          of scales hold four 6-bit pairs of s (bits 0-11) and, in their top nibbles, the half d.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/detail.hpp"
#include "formats/iq_grids.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

namespace {

// A super-block as integers: x[i] = d * ls[i / span] * (q[i] + neg[i / 8] ? -delta : delta).
struct iq1_values {
    int8_t q[QK_K];
    bool neg[QK_K / 8];
    int ls[16];
    int span;
    float d;
};

void put_group(iq1_values& v, int g, int index) {
    for (int j = 0; j < 8; ++j) v.q[8 * g + j] = static_cast<int8_t>(grid_value_signed(iq1s_grid[index], j));
}

void decode_s(const block_iq1_s& b, iq1_values& v) {
    v.span = 32;
    v.d = fp16_to_fp32(b.d);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        v.ls[ib] = 2 * ((b.qh[ib] >> 12) & 7) + 1;
        for (int l = 0; l < 4; ++l) {
            put_group(v, 4 * ib + l, b.qs[4 * ib + l] | (((b.qh[ib] >> (3 * l)) & 7) << 8));
            v.neg[4 * ib + l] = (b.qh[ib] & 0x8000) != 0;
        }
    }
}

void decode_m(const block_iq1_m& b, iq1_values& v) {
    v.span = 16;
    uint16_t sc[4];
    std::memcpy(sc, b.scales, sizeof sc);
    const auto half = static_cast<fp16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    v.d = fp16_to_fp32(half);
    for (int s = 0; s < QK_K / 16; ++s) v.ls[s] = 2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1;
    for (int g = 0; g < QK_K / 8; ++g) {
        const int nibble = (b.qh[g / 2] >> (4 * (g % 2))) & 0x0f;
        put_group(v, g, b.qs[g] | ((nibble & 7) << 8));
        v.neg[g] = (nibble & 8) != 0;
    }
}

template <typename Block, void (*Decode)(const Block&, iq1_values&)>
void dequantize_iq1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const Block*>(src);
    iq1_values v;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, dst += QK_K) {
        Decode(*b, v);
        for (int i = 0; i < QK_K; ++i) {
            const float dl = v.d * static_cast<float>(v.ls[i / v.span]);
            dst[i] = dl * (static_cast<float>(v.q[i]) + (v.neg[i / 8] ? -IQ1S_DELTA : IQ1S_DELTA));
        }
    }
}

// Per super-block an int32 isum = sum over spans of ls * sum(8 q a + delta_sign a), the delta in eighths;
// sum += (d_w * d_a) * isum; the result is sum / 8.
template <typename Block, void (*Decode)(const Block&, iq1_values&)>
float vec_dot_iq1(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const Block*>(w);
    const auto* y = static_cast<const block_q8_K*>(a);
    iq1_values v;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++x, ++y) {
        Decode(*x, v);
        int isum = 0;
        for (int s = 0; s < QK_K / v.span; ++s) {
            int part = 0;
            for (int i = s * v.span; i < (s + 1) * v.span; ++i) part += (8 * v.q[i] + (v.neg[i / 8] ? -1 : 1)) * y->qs[i];
            isum += v.ls[s] * part;
        }
        sum += (v.d * y->d) * static_cast<float>(isum);
    }
    return sum * IQ1S_DELTA;
}

// The better delta sign of a group at a fixed scale (smaller squared error); its entry, xq and qq.
struct iq1_group {
    int entry;
    bool neg;
    float xq, qq;
};
iq1_group best_group(const float* x, float scale, bool fixed, bool neg) {
    iq1_group best{0, false, 0.0f, 0.0f};
    float best_err = INFINITY;
    for (const bool n : {false, true}) {
        if (fixed && n != neg) continue;
        float xq = 0.0f, qq = 0.0f;
        const int e = encode_iq1_group(x, scale, n ? -IQ1S_DELTA : IQ1S_DELTA, xq, qq);
        const float err = scale * scale * qq - 2.0f * scale * xq;
        if (err < best_err) {
            best_err = err;
            best = {e, n, xq, qq};
        }
    }
    return best;
}

// The least-squares scale of the best of a sweep of candidates for `span` elements; per_group: each
// group of 8 picks its delta sign, otherwise one sign for the span (returned in *neg).
float fit_iq1(const float* x, int span, bool per_group, bool* neg) {
    const float amax = max_abs(span, x);
    if (amax == 0.0f) return 0.0f;
    float best_score = -1.0f, best_scale = 0.0f;
    for (int k = 0; k < 7; ++k) {
        const float scale = amax / ((1.0f + IQ1S_DELTA) * (0.6f + 0.15f * static_cast<float>(k)));
        for (const bool n : {false, true}) {
            if (per_group && n) break;
            float xq = 0.0f, qq = 0.0f;
            for (int g = 0; g < span / 8; ++g) {
                const iq1_group r = best_group(x + 8 * g, scale, !per_group, n);
                xq += r.xq;
                qq += r.qq;
            }
            if (qq > 0.0f && xq > 0.0f && xq * xq / qq > best_score) {
                best_score = xq * xq / qq;
                best_scale = xq / qq;
                *neg = n;
            }
        }
    }
    return best_scale;
}

}  // namespace

void dequantize_iq1_s(const void* src, float* dst, int64_t n) { dequantize_iq1<block_iq1_s, decode_s>(src, dst, n); }
void dequantize_iq1_m(const void* src, float* dst, int64_t n) { dequantize_iq1<block_iq1_m, decode_m>(src, dst, n); }
float vec_dot_iq1_s(int64_t n, const void* w, const void* a) { return vec_dot_iq1<block_iq1_s, decode_s>(n, w, a); }
float vec_dot_iq1_m(int64_t n, const void* w, const void* a) { return vec_dot_iq1<block_iq1_m, decode_m>(n, w, a); }

void quantize_iq1_s(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq1_s*>(dst);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        float scales[QK_K / 32];
        bool neg[QK_K / 32] = {};
        int ls[QK_K / 32];
        for (int s = 0; s < QK_K / 32; ++s) scales[s] = fit_iq1(src + 32 * s, 32, false, &neg[s]);
        const float d = odd_scales(scales, QK_K / 32, 7, 1.0f, ls);
        b->d = fp32_to_fp16(d);
        for (int s = 0; s < QK_K / 32; ++s) {
            const float scale = d * static_cast<float>(2 * ls[s] + 1);
            // Both signs at the stored scale: keep the one with the smaller error over the 32.
            iq1_group groups[2][4];
            float err[2] = {0.0f, 0.0f};
            for (int n_ = 0; n_ < 2; ++n_)
                for (int l = 0; l < 4; ++l) {
                    groups[n_][l] = best_group(src + 32 * s + 8 * l, scale, true, n_ == 1);
                    err[n_] += scale * scale * groups[n_][l].qq - 2.0f * scale * groups[n_][l].xq;
                }
            const int pick = err[1] < err[0] ? 1 : 0;
            uint16_t qh = static_cast<uint16_t>((ls[s] << 12) | (pick << 15));
            for (int l = 0; l < 4; ++l) {
                b->qs[4 * s + l] = static_cast<uint8_t>(groups[pick][l].entry & 0xff);
                qh = static_cast<uint16_t>(qh | ((groups[pick][l].entry >> 8) << (3 * l)));
            }
            b->qh[s] = qh;
        }
    }
}

void quantize_iq1_m(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq1_m*>(dst);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        float scales[QK_K / 16];
        int ls[QK_K / 16];
        bool unused = false;
        for (int s = 0; s < QK_K / 16; ++s) scales[s] = fit_iq1(src + 16 * s, 16, true, &unused);
        const float d = odd_scales(scales, QK_K / 16, 7, 1.0f, ls);
        const fp16_t half = fp32_to_fp16(d);
        uint16_t sc[4] = {0, 0, 0, 0};
        for (int s = 0; s < QK_K / 16; ++s) sc[s / 4] = static_cast<uint16_t>(sc[s / 4] | (ls[s] << (3 * (s % 4))));
        for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>(sc[k] | (((half >> (4 * k)) & 0x0f) << 12));
        std::memcpy(b->scales, sc, sizeof sc);
        std::fill(std::begin(b->qh), std::end(b->qh), uint8_t{0});
        for (int g = 0; g < QK_K / 8; ++g) {
            const iq1_group r = best_group(src + 8 * g, d * static_cast<float>(2 * ls[g / 2] + 1), false, false);
            b->qs[g] = static_cast<uint8_t>(r.entry & 0xff);
            const int nibble = (r.entry >> 8) | (r.neg ? 8 : 0);
            b->qh[g / 2] = static_cast<uint8_t>(b->qh[g / 2] | (nibble << (4 * (g % 2))));
        }
    }
}

}  // namespace strata::formats::detail
