// IQ2_XXS, IQ2_XS, IQ2_S: groups of 8 elements take one entry of an 8-value code book (values 8, 25,
// 43) and 8 signs; x = d * (2 s + 1) / 8 * (+-value), s a 4-bit sub-block scale.
//   IQ2_XXS: per 32 elements two uint32: four 8-bit entry indices; four 7-bit sign codes (even_signs)
//            and s in the top 4 bits. 256 entries.
//   IQ2_XS:  per group a uint16: 9-bit index | 7-bit sign code << 9; s per 16 (nibbles of scales).
//            512 entries.
//   IQ2_S:   per group an 8-bit index in qs[0..32), its 2 high bits in qh (bits 2l, 2l+1 of the sub-block's
//            byte), 8 plain sign bits in qs[32..64); s per 16. 1024 entries.
#include <cstring>

#include "formats/detail.hpp"
#include "formats/iq_common.hpp"
#include "formats/iq_grids.hpp"

namespace strata::formats::detail {

namespace {

constexpr float kUnit = 0.125f;

void put_group(iq_values& v, int group, uint64_t entry, unsigned signs) {
    for (int j = 0; j < 8; ++j) {
        const int q = grid_value(entry, j);
        v.q[8 * group + j] = static_cast<int8_t>((signs >> j) & 1 ? -q : q);
    }
}

void decode_xxs(const block_iq2_xxs& b, iq_values& v) {
    v.span = 32;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        uint32_t index, meta;
        std::memcpy(&index, b.qs + 4 * ib, 4);
        std::memcpy(&meta, b.qs + 4 * ib + 2, 4);
        v.ls[ib] = 2 * static_cast<int>(meta >> 28) + 1;
        for (int l = 0; l < 4; ++l)
            put_group(v, 4 * ib + l, iq2xxs_grid[(index >> (8 * l)) & 0xff], even_signs(meta >> (7 * l)));
    }
}

void decode_xs(const block_iq2_xs& b, iq_values& v) {
    v.span = 16;
    for (int s = 0; s < QK_K / 16; ++s) v.ls[s] = 2 * ((b.scales[s / 2] >> (4 * (s % 2))) & 0x0f) + 1;
    for (int g = 0; g < QK_K / 8; ++g) put_group(v, g, iq2xs_grid[b.qs[g] & 511], even_signs(b.qs[g] >> 9));
}

void decode_s(const block_iq2_s& b, iq_values& v) {
    v.span = 16;
    for (int s = 0; s < QK_K / 16; ++s) v.ls[s] = 2 * ((b.scales[s / 2] >> (4 * (s % 2))) & 0x0f) + 1;
    for (int g = 0; g < QK_K / 8; ++g) {
        const int index = b.qs[g] | (((b.qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
        put_group(v, g, iq2s_grid[index], b.qs[QK_K / 8 + g]);
    }
}

// Sub-block scales of a super-block (spans of `span`), their codes and the groups at the stored scales.
float encode_block(grid_kind kind, bool even, const float* x, int span, int* ls, signed_group* groups) {
    const grid_book& bk = book(kind);
    float scales[16];
    for (int s = 0; s < QK_K / span; ++s) scales[s] = fit_signed(bk, even, x + span * s, span);
    const float d = odd_scales(scales, QK_K / span, 15, kUnit, ls);
    float xq = 0.0f, qq = 0.0f;
    for (int g = 0; g < QK_K / 8; ++g)
        encode_signed8(bk, even, x + 8 * g, d * kUnit * static_cast<float>(2 * ls[8 * g / span] + 1), groups[g], xq, qq);
    return d;
}

}  // namespace

void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) { dequantize_iq<block_iq2_xxs, decode_xxs>(src, dst, n, kUnit); }
void dequantize_iq2_xs(const void* src, float* dst, int64_t n) { dequantize_iq<block_iq2_xs, decode_xs>(src, dst, n, kUnit); }
void dequantize_iq2_s(const void* src, float* dst, int64_t n) { dequantize_iq<block_iq2_s, decode_s>(src, dst, n, kUnit); }

float vec_dot_iq2_xxs(int64_t n, const void* w, const void* a) { return vec_dot_iq<block_iq2_xxs, decode_xxs>(n, w, a, kUnit); }
float vec_dot_iq2_xs(int64_t n, const void* w, const void* a) { return vec_dot_iq<block_iq2_xs, decode_xs>(n, w, a, kUnit); }
float vec_dot_iq2_s(int64_t n, const void* w, const void* a) { return vec_dot_iq<block_iq2_s, decode_s>(n, w, a, kUnit); }

void quantize_iq2_xxs(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq2_xxs*>(dst);
    int ls[16];
    signed_group groups[QK_K / 8];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        b->d = fp32_to_fp16(encode_block(grid_kind::iq2xxs, true, src, 32, ls, groups));
        for (int s = 0; s < QK_K / 32; ++s) {
            uint32_t index = 0, meta = static_cast<uint32_t>(ls[s]) << 28;
            for (int l = 0; l < 4; ++l) {
                index |= static_cast<uint32_t>(groups[4 * s + l].entry[0]) << (8 * l);
                meta |= static_cast<uint32_t>(groups[4 * s + l].signs & 0x7f) << (7 * l);
            }
            std::memcpy(b->qs + 4 * s, &index, 4);
            std::memcpy(b->qs + 4 * s + 2, &meta, 4);
        }
    }
}

void quantize_iq2_xs(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq2_xs*>(dst);
    int ls[16];
    signed_group groups[QK_K / 8];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        b->d = fp32_to_fp16(encode_block(grid_kind::iq2xs, true, src, 16, ls, groups));
        for (int s = 0; s < QK_K / 32; ++s) b->scales[s] = static_cast<uint8_t>(ls[2 * s] | (ls[2 * s + 1] << 4));
        for (int g = 0; g < QK_K / 8; ++g)
            b->qs[g] = static_cast<uint16_t>(groups[g].entry[0] | ((groups[g].signs & 0x7f) << 9));
    }
}

void quantize_iq2_s(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq2_s*>(dst);
    int ls[16];
    signed_group groups[QK_K / 8];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        b->d = fp32_to_fp16(encode_block(grid_kind::iq2s, false, src, 16, ls, groups));
        for (int s = 0; s < QK_K / 32; ++s) {
            b->scales[s] = static_cast<uint8_t>(ls[2 * s] | (ls[2 * s + 1] << 4));
            b->qh[s] = 0;
        }
        for (int g = 0; g < QK_K / 8; ++g) {
            b->qs[g] = static_cast<uint8_t>(groups[g].entry[0] & 0xff);
            b->qs[QK_K / 8 + g] = groups[g].signs;
            b->qh[g / 4] |= static_cast<uint8_t>((groups[g].entry[0] >> 8) << (2 * (g % 4)));
        }
    }
}

}  // namespace strata::formats::detail
