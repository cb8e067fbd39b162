// The IQ1 / IQ2 / IQ3 and MXFP4 blocks: dequantizing random-filled blocks gives the values computed
// here by walking each layout as ggml's format definition does (byte views of the code book entries,
// the 7-bit sign codes through a parity rule, per-32 loops), and a few fully hand-built blocks give
// values worked out by hand. Equality is exact: both sides round the same float operations.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/iq_grids.hpp"
#include "formats/quant.hpp"

namespace strata::formats {
namespace {

constexpr fp16_t kHalf = 0x3800;  // 0.5

template <typename Block>
Block random_block(uint32_t seed) {
    Block b;
    std::mt19937 rng(seed);
    auto* bytes = reinterpret_cast<uint8_t*>(&b);
    for (size_t i = 0; i < sizeof b; ++i) bytes[i] = static_cast<uint8_t>(rng());
    return b;
}

template <typename Block>
std::vector<float> dequantize(ggml_type type, const Block& b) {
    std::vector<float> out(static_cast<size_t>(info(type).block_size));
    dequantize_row(type, &b, out.data(), static_cast<int64_t>(out.size()));
    return out;
}

void expect_values(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

// ggml's ksigns_iq2xs[i]: the 7 bits of i, bit 7 set when i has an odd number of bits.
uint8_t ksign(unsigned i) { return static_cast<uint8_t>(i | ((std::popcount(i) & 1u) << 7)); }

template <typename T>
void grid_bytes(const T& entry, uint8_t* out) { std::memcpy(out, &entry, sizeof entry); }  // x86: little-endian

float sign_of(uint8_t signs, int j) { return signs & (1u << j) ? -1.0f : 1.0f; }

TEST(DequantizeIq, SignCodeIsGgmlsTable) {
    // Rows of ggml's ksigns_iq2xs.
    const uint8_t first[8] = {0, 129, 130, 3, 132, 5, 6, 135};
    for (unsigned i = 0; i < 8; ++i) EXPECT_EQ(even_signs(i), first[i]) << i;
    EXPECT_EQ(even_signs(63), 63);
    EXPECT_EQ(even_signs(64), 192);
    EXPECT_EQ(even_signs(127), 255);
    for (unsigned i = 0; i < 128; ++i) EXPECT_EQ(even_signs(i), ksign(i)) << i;
}

TEST(DequantizeIq, CodeBooksHoldTheirLevels) {
    auto check = [](const auto* grid, int n, int dim, std::vector<int> levels, bool is_signed) {
        for (int e = 0; e < n; ++e)
            for (int j = 0; j < dim; ++j) {
                const int v = is_signed ? grid_value_signed(grid[e], j) : grid_value(grid[e], j);
                ASSERT_NE(std::find(levels.begin(), levels.end(), v), levels.end()) << "entry " << e << " value " << v;
            }
        for (int e = 1; e < n; ++e) ASSERT_LT(grid[e - 1], grid[e]) << "entries ascend (distinct), entry " << e;
    };
    check(iq2xxs_grid, 256, 8, {8, 25, 43}, false);
    check(iq2xs_grid, 512, 8, {8, 25, 43}, false);
    check(iq2s_grid, 1024, 8, {8, 25, 43}, false);
    check(iq3xxs_grid, 256, 4, {4, 12, 20, 28, 36, 44, 52, 62}, false);
    check(iq3s_grid, 512, 4, {1, 3, 5, 7, 9, 11, 13, 15}, false);
    EXPECT_EQ(iq2xxs_grid[0], 0x0808080808080808u);
    EXPECT_EQ(iq2xxs_grid[255], 0x2b2b2b1908081908u);
    EXPECT_EQ(iq3xxs_grid[0], 0x04040404u);
    EXPECT_EQ(iq1s_grid[0], 0xffffffffffffffffu);
    EXPECT_EQ(iq1s_grid[1], 0xffffffffffffff01u);
    for (int e = 0; e < 2048; ++e)
        for (int j = 0; j < 8; ++j) {
            const int v = grid_value_signed(iq1s_grid[e], j);
            ASSERT_TRUE(v == -1 || v == 0 || v == 1) << "iq1s entry " << e;
        }
}

TEST(DequantizeIq, IQ2_XXS) {
    for (uint32_t seed : {1u, 2u, 3u}) {
        auto b = random_block<block_iq2_xxs>(seed);
        b.d = kHalf;
        std::vector<float> want;
        for (int ib = 0; ib < 8; ++ib) {
            uint32_t aux[2];
            std::memcpy(aux, b.qs + 4 * ib, 8);
            const auto* idx = reinterpret_cast<const uint8_t*>(aux);
            const float db = 0.5f * (0.5f + static_cast<float>(aux[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                uint8_t g[8];
                grid_bytes(iq2xxs_grid[idx[l]], g);
                const uint8_t s = ksign((aux[1] >> (7 * l)) & 127);
                for (int j = 0; j < 8; ++j) want.push_back(db * g[j] * sign_of(s, j));
            }
        }
        expect_values(dequantize(ggml_type::IQ2_XXS, b), want);
    }
}

TEST(DequantizeIq, IQ2_XS) {
    auto b = random_block<block_iq2_xs>(4);
    b.d = kHalf;
    std::vector<float> want;
    for (int ib = 0; ib < 8; ++ib) {
        const float db[2] = {0.5f * (0.5f + (b.scales[ib] & 0xf)) * 0.25f, 0.5f * (0.5f + (b.scales[ib] >> 4)) * 0.25f};
        for (int l = 0; l < 4; ++l) {
            uint8_t g[8];
            grid_bytes(iq2xs_grid[b.qs[4 * ib + l] & 511], g);
            const uint8_t s = ksign(b.qs[4 * ib + l] >> 9);
            for (int j = 0; j < 8; ++j) want.push_back(db[l / 2] * g[j] * sign_of(s, j));
        }
    }
    expect_values(dequantize(ggml_type::IQ2_XS, b), want);
}

TEST(DequantizeIq, IQ2_S) {
    auto b = random_block<block_iq2_s>(5);
    b.d = kHalf;
    std::vector<float> want;
    const uint8_t* qs = b.qs;
    const uint8_t* signs = b.qs + 32;
    for (int ib = 0; ib < 8; ++ib, qs += 4, signs += 4) {
        const float db[2] = {0.5f * (0.5f + (b.scales[ib] & 0xf)) * 0.25f, 0.5f * (0.5f + (b.scales[ib] >> 4)) * 0.25f};
        for (int l = 0; l < 4; ++l) {
            uint8_t g[8];
            grid_bytes(iq2s_grid[qs[l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300)], g);
            for (int j = 0; j < 8; ++j) want.push_back(db[l / 2] * g[j] * sign_of(signs[l], j));
        }
    }
    expect_values(dequantize(ggml_type::IQ2_S, b), want);
}

TEST(DequantizeIq, IQ3_XXS) {
    auto b = random_block<block_iq3_xxs>(6);
    b.d = kHalf;
    std::vector<float> want;
    const uint8_t* qs = b.qs;
    for (int ib = 0; ib < 8; ++ib, qs += 8) {
        uint32_t aux;
        std::memcpy(&aux, b.qs + 64 + 4 * ib, 4);
        const float db = 0.5f * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
        for (int l = 0; l < 4; ++l) {
            uint8_t g1[4], g2[4];
            grid_bytes(iq3xxs_grid[qs[2 * l]], g1);
            grid_bytes(iq3xxs_grid[qs[2 * l + 1]], g2);
            const uint8_t s = ksign((aux >> (7 * l)) & 127);
            float y[8];
            for (int j = 0; j < 4; ++j) {
                y[j] = db * g1[j] * sign_of(s, j);
                y[j + 4] = db * g2[j] * sign_of(s, j + 4);
            }
            want.insert(want.end(), y, y + 8);
        }
    }
    expect_values(dequantize(ggml_type::IQ3_XXS, b), want);
}

TEST(DequantizeIq, IQ3_S) {
    auto b = random_block<block_iq3_s>(7);
    b.d = kHalf;
    std::vector<float> want;
    for (int ib = 0; ib < 8; ++ib) {
        const float db = 0.5f * static_cast<float>(1 + 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
        const uint8_t* qs = b.qs + 8 * ib;
        const uint8_t* signs = b.signs + 4 * ib;
        for (int l = 0; l < 4; ++l) {
            uint8_t g1[4], g2[4];
            grid_bytes(iq3s_grid[qs[2 * l] | ((b.qh[ib] << (8 - 2 * l)) & 256)], g1);
            grid_bytes(iq3s_grid[qs[2 * l + 1] | ((b.qh[ib] << (7 - 2 * l)) & 256)], g2);
            float y[8];
            for (int j = 0; j < 4; ++j) {
                y[j] = db * g1[j] * sign_of(signs[l], j);
                y[j + 4] = db * g2[j] * sign_of(signs[l], j + 4);
            }
            want.insert(want.end(), y, y + 8);
        }
    }
    expect_values(dequantize(ggml_type::IQ3_S, b), want);
}

TEST(DequantizeIq, IQ1_S) {
    auto b = random_block<block_iq1_s>(8);
    b.d = kHalf;
    std::vector<float> want;
    for (int ib = 0; ib < 8; ++ib) {
        const float dl = 0.5f * static_cast<float>(2 * ((b.qh[ib] >> 12) & 7) + 1);
        const float delta = b.qh[ib] & 0x8000 ? -0.125f : 0.125f;
        for (int l = 0; l < 4; ++l) {
            int8_t g[8];
            std::memcpy(g, &iq1s_grid[b.qs[4 * ib + l] | (((b.qh[ib] >> (3 * l)) & 7) << 8)], 8);
            for (int j = 0; j < 8; ++j) want.push_back(dl * (g[j] + delta));
        }
    }
    expect_values(dequantize(ggml_type::IQ1_S, b), want);
}

TEST(DequantizeIq, IQ1_M) {
    auto b = random_block<block_iq1_m>(9);
    uint16_t sc[4];
    std::memcpy(sc, b.scales, 8);
    for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>((sc[k] & 0x0fff) | (((kHalf >> (4 * k)) & 0xf) << 12));
    std::memcpy(b.scales, sc, 8);
    std::vector<float> want;
    const float d = 0.5f;
    for (int ib = 0; ib < 8; ++ib) {
        const float dl1 = d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1);
        const float dl2 = d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1);
        const uint8_t* qh = b.qh + 2 * ib;
        const int idx[4] = {b.qs[4 * ib] | ((qh[0] << 8) & 0x700), b.qs[4 * ib + 1] | ((qh[0] << 4) & 0x700),
                            b.qs[4 * ib + 2] | ((qh[1] << 8) & 0x700), b.qs[4 * ib + 3] | ((qh[1] << 4) & 0x700)};
        const float delta[4] = {qh[0] & 0x08 ? -0.125f : 0.125f, qh[0] & 0x80 ? -0.125f : 0.125f,
                                qh[1] & 0x08 ? -0.125f : 0.125f, qh[1] & 0x80 ? -0.125f : 0.125f};
        for (int l = 0; l < 4; ++l) {
            int8_t g[8];
            std::memcpy(g, &iq1s_grid[idx[l]], 8);
            for (int j = 0; j < 8; ++j) want.push_back((l < 2 ? dl1 : dl2) * (g[j] + delta[l]));
        }
    }
    expect_values(dequantize(ggml_type::IQ1_M, b), want);
}

TEST(DequantizeIq, MXFP4) {
    for (uint8_t e : {uint8_t{0}, uint8_t{1}, uint8_t{100}, uint8_t{127}, uint8_t{130}, uint8_t{254}}) {
        auto b = random_block<block_mxfp4>(10 + e);
        b.e = e;
        const float d = std::ldexp(1.0f, e - 128);  // E8M0 2^(e-127), halved for the doubled values
        const int8_t values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        std::vector<float> want(32);
        for (int j = 0; j < 16; ++j) {
            want[j] = values[b.qs[j] & 0xf] * d;
            want[j + 16] = values[b.qs[j] >> 4] * d;
        }
        expect_values(dequantize(ggml_type::MXFP4, b), want);
    }
}

// Blocks built by hand with values worked out on paper.
TEST(DequantizeIq, HandBuiltBlocks) {
    block_iq2_xxs a{};
    a.d = 0x3c00;  // 1: entry 0 (all 8), scale code 0: 1 * 1/8 * 8 = 1
    uint32_t meta = (3u << 28) | (1u << 7);  // scale code 3 (7/8), group 1 sign code 1: elements 0 and 7 negative
    std::memcpy(a.qs + 2, &meta, 4);
    const auto ya = dequantize(ggml_type::IQ2_XXS, a);
    EXPECT_EQ(ya[0], 7.0f);
    EXPECT_EQ(ya[8], -7.0f);
    EXPECT_EQ(ya[15], -7.0f);
    EXPECT_EQ(ya[9], 7.0f);
    EXPECT_EQ(ya[32], 1.0f);  // second sub-block: all zero bits

    block_iq1_s c{};
    c.d = 0x3c00;
    c.qh[0] = 0x8000 | (2 << 12);  // scale 5, delta -1/8, entry 0 (all -1): 5 * (-1 - 1/8)
    const auto yc = dequantize(ggml_type::IQ1_S, c);
    EXPECT_EQ(yc[0], -5.625f);
    EXPECT_EQ(yc[32], -0.875f);  // second sub-block: scale 1, delta +1/8, entry 0: -1 + 1/8

    block_mxfp4 m{};
    m.e = 128;  // d = 1: code 7 is 12, code 15 is -12, code 5 is 6
    m.qs[0] = 0xf7;
    m.qs[1] = 0x05;
    const auto ym = dequantize(ggml_type::MXFP4, m);
    EXPECT_EQ(ym[0], 12.0f);
    EXPECT_EQ(ym[16], -12.0f);
    EXPECT_EQ(ym[1], 6.0f);
    EXPECT_EQ(ym[17], 0.0f);
}

}  // namespace
}  // namespace strata::formats
