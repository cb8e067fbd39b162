// IQ3_XXS, IQ3_S: entries of 4 values; a group of 8 elements takes two entries and 8 signs.
//   IQ3_XXS: qs[0..64) 8-bit indices (256 entries, values 4 .. 62); per 32 elements a uint32 at
//            qs[64 + 4 ib]: four 7-bit sign codes (even_signs) and a 4-bit s on top; x = d (2s+1)/4 (+-v).
//   IQ3_S:   9-bit indices (512 entries, values 1 .. 15): low 8 in qs, bit 8 of entry k of sub-block ib
//            in bit k of qh[ib]; 8 plain sign bits per group; s per 32 in nibbles of scales; x = d (2s+1) (+-v).
#include <cstring>

#include "formats/detail.hpp"
#include "formats/iq_common.hpp"
#include "formats/iq_grids.hpp"

namespace strata::formats::detail {

namespace {

constexpr float kUnitXxs = 0.25f, kUnitS = 1.0f;

void put_entry(iq_values& v, int first, uint32_t entry, unsigned signs) {
    for (int j = 0; j < 4; ++j) {
        const int q = grid_value(entry, j);
        v.q[first + j] = static_cast<int8_t>((signs >> j) & 1 ? -q : q);
    }
}

void decode_xxs(const block_iq3_xxs& b, iq_values& v) {
    v.span = 32;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        uint32_t meta;
        std::memcpy(&meta, b.qs + QK_K / 4 + 4 * ib, 4);
        v.ls[ib] = 2 * static_cast<int>(meta >> 28) + 1;
        for (int l = 0; l < 4; ++l) {
            const unsigned signs = even_signs(meta >> (7 * l));
            const int first = 32 * ib + 8 * l;
            put_entry(v, first, iq3xxs_grid[b.qs[8 * ib + 2 * l]], signs);
            put_entry(v, first + 4, iq3xxs_grid[b.qs[8 * ib + 2 * l + 1]], signs >> 4);
        }
    }
}

void decode_s(const block_iq3_s& b, iq_values& v) {
    v.span = 32;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        v.ls[ib] = 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f) + 1;
        for (int k = 0; k < 8; ++k) {
            const int index = b.qs[8 * ib + k] | (((b.qh[ib] >> k) & 1) << 8);
            put_entry(v, 32 * ib + 4 * k, iq3s_grid[index], b.signs[4 * ib + k / 2] >> (4 * (k % 2)));
        }
    }
}

float encode_block(grid_kind kind, bool even, float unit, const float* x, int* ls, signed_group* groups) {
    const grid_book& bk = book(kind);
    float scales[QK_K / 32];
    for (int s = 0; s < QK_K / 32; ++s) scales[s] = fit_signed(bk, even, x + 32 * s, 32);
    const float d = odd_scales(scales, QK_K / 32, 15, unit, ls);
    float xq = 0.0f, qq = 0.0f;
    for (int g = 0; g < QK_K / 8; ++g)
        encode_signed8(bk, even, x + 8 * g, d * unit * static_cast<float>(2 * ls[g / 4] + 1), groups[g], xq, qq);
    return d;
}

}  // namespace

void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) { dequantize_iq<block_iq3_xxs, decode_xxs>(src, dst, n, kUnitXxs); }
void dequantize_iq3_s(const void* src, float* dst, int64_t n) { dequantize_iq<block_iq3_s, decode_s>(src, dst, n, kUnitS); }

float vec_dot_iq3_xxs(int64_t n, const void* w, const void* a) { return vec_dot_iq<block_iq3_xxs, decode_xxs>(n, w, a, kUnitXxs); }
float vec_dot_iq3_s(int64_t n, const void* w, const void* a) { return vec_dot_iq<block_iq3_s, decode_s>(n, w, a, kUnitS); }

void quantize_iq3_xxs(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq3_xxs*>(dst);
    int ls[QK_K / 32];
    signed_group groups[QK_K / 8];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        b->d = fp32_to_fp16(encode_block(grid_kind::iq3xxs, true, kUnitXxs, src, ls, groups));
        for (int s = 0; s < QK_K / 32; ++s) {
            uint32_t meta = static_cast<uint32_t>(ls[s]) << 28;
            for (int l = 0; l < 4; ++l) {
                const signed_group& g = groups[4 * s + l];
                meta |= static_cast<uint32_t>(g.signs & 0x7f) << (7 * l);
                b->qs[8 * s + 2 * l] = static_cast<uint8_t>(g.entry[0]);
                b->qs[8 * s + 2 * l + 1] = static_cast<uint8_t>(g.entry[1]);
            }
            std::memcpy(b->qs + QK_K / 4 + 4 * s, &meta, 4);
        }
    }
}

void quantize_iq3_s(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<block_iq3_s*>(dst);
    int ls[QK_K / 32];
    signed_group groups[QK_K / 8];
    for (int64_t ib = 0; ib < n / QK_K; ++ib, ++b, src += QK_K) {
        b->d = fp32_to_fp16(encode_block(grid_kind::iq3s, false, kUnitS, src, ls, groups));
        for (int s = 0; s < QK_K / 64; ++s) b->scales[s] = static_cast<uint8_t>(ls[2 * s] | (ls[2 * s + 1] << 4));
        for (int s = 0; s < QK_K / 32; ++s) {
            b->qh[s] = 0;
            for (int l = 0; l < 4; ++l) {
                const signed_group& g = groups[4 * s + l];
                b->signs[4 * s + l] = g.signs;
                for (int k = 0; k < 2; ++k) {
                    b->qs[8 * s + 2 * l + k] = static_cast<uint8_t>(g.entry[k] & 0xff);
                    b->qh[s] |= static_cast<uint8_t>((g.entry[k] >> 8) << (2 * l + k));
                }
            }
        }
    }
}

}  // namespace strata::formats::detail
