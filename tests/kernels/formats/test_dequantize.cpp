// Dequantizing hand-built blocks gives the values each format defines. The expected values are
// computed here by walking each layout the way ggml's documentation describes it (chunk / shift
// loops), independently of the library's per-element index arithmetic.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "formats/quant.hpp"

namespace strata::formats {
namespace {

constexpr fp16_t kHalf = 0x3800, kQuarter = 0x3400, kOne = 0x3c00, kTwo = 0x4000;

template <size_t N>
void fill_bytes(uint8_t (&bytes)[N], uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
}

template <typename Block>
std::vector<float> dequantize(ggml_type type, const Block& b) {
    std::vector<float> out(static_cast<size_t>(info(type).block_size));
    dequantize_row(type, &b, out.data(), static_cast<int64_t>(out.size()));
    return out;
}

void expect_values(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
}

TEST(Dequantize, FloatFormats) {
    const float f32[3] = {1.5f, -0.0f, 3e-8f};
    float out[3];
    dequantize_row(ggml_type::F32, f32, out, 3);
    EXPECT_EQ(std::memcmp(f32, out, sizeof out), 0);
    const fp16_t f16[4] = {0x3c00, 0xc000, 0x7bff, 0x0001};
    float o16[4];
    dequantize_row(ggml_type::F16, f16, o16, 4);
    EXPECT_EQ(o16[0], 1.0f);
    EXPECT_EQ(o16[1], -2.0f);
    EXPECT_EQ(o16[2], 65504.0f);
    EXPECT_EQ(o16[3], std::ldexp(1.0f, -24));
    const bf16_t b16[2] = {0x3f80, 0xc2f7};
    float ob[2];
    dequantize_row(ggml_type::BF16, b16, ob, 2);
    EXPECT_EQ(ob[0], 1.0f);
    EXPECT_EQ(ob[1], -123.5f);
}

TEST(Dequantize, Q4_0) {
    block_q4_0 b{};
    b.d = kHalf;
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
        want[j] = 0.5f * static_cast<float>(j - 8);
        want[j + 16] = 0.5f * static_cast<float>(7 - j);
    }
    expect_values(dequantize(ggml_type::Q4_0, b), want);
}

TEST(Dequantize, Q4_1) {
    block_q4_1 b{};
    b.d = kQuarter;
    b.m = 0xbc00;  // -1
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
        want[j] = 0.25f * static_cast<float>(j) - 1.0f;
        want[j + 16] = 0.25f * static_cast<float>(15 - j) - 1.0f;
    }
    expect_values(dequantize(ggml_type::Q4_1, b), want);
}

// qh read as a little-endian uint32: bit j is the fifth bit of element j.
std::vector<int> q5_codes(const uint8_t* qs, const uint8_t* qh_bytes) {
    uint32_t qh = 0;
    for (int k = 0; k < 4; ++k) qh |= static_cast<uint32_t>(qh_bytes[k]) << (8 * k);
    std::vector<int> q(32);
    for (int j = 0; j < 16; ++j) {
        q[j] = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10);
        q[j + 16] = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
    }
    return q;
}

TEST(Dequantize, Q5_0) {
    block_q5_0 b{};
    b.d = kOne;
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const uint8_t qh[4] = {0xff, 0x00, 0xa5, 0x81};
    std::memcpy(b.qh, qh, 4);
    const auto q = q5_codes(b.qs, b.qh);
    std::vector<float> want(32);
    for (int i = 0; i < 32; ++i) want[i] = static_cast<float>(q[i] - 16);
    expect_values(dequantize(ggml_type::Q5_0, b), want);
    // Spot checks by hand: element 0 = 0 | 16 - 16, element 16 = 15 | 16 (bit 16 = 0xa5 bit 0) - 16.
    EXPECT_EQ(want[0], 0.0f);
    EXPECT_EQ(want[16], 15.0f);
    EXPECT_EQ(want[17], -2.0f);  // 14, bit 17 = 0xa5 bit 1 = 0
}

TEST(Dequantize, Q5_1) {
    block_q5_1 b{};
    b.d = kHalf;
    b.m = kTwo;
    fill_bytes(b.qs, 1);
    fill_bytes(b.qh, 2);
    const auto q = q5_codes(b.qs, b.qh);
    std::vector<float> want(32);
    for (int i = 0; i < 32; ++i) want[i] = 0.5f * static_cast<float>(q[i]) + 2.0f;
    expect_values(dequantize(ggml_type::Q5_1, b), want);
}

TEST(Dequantize, Q8_0AndQ8_1) {
    block_q8_0 b{};
    b.d = 0x3000;  // 0.125
    for (int i = 0; i < 32; ++i) b.qs[i] = static_cast<int8_t>(i * 8 - 128);
    std::vector<float> want(32);
    for (int i = 0; i < 32; ++i) want[i] = 0.125f * static_cast<float>(i * 8 - 128);
    expect_values(dequantize(ggml_type::Q8_0, b), want);

    block_q8_1 b1{};
    b1.d = b.d;
    b1.s = kTwo;  // not part of the values
    std::memcpy(b1.qs, b.qs, 32);
    expect_values(dequantize(ggml_type::Q8_1, b1), want);
}

TEST(Dequantize, IQ4_NL) {
    block_iq4_nl b{};
    b.d = kTwo;
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
        want[j] = 2.0f * kvalues_iq4nl[j];
        want[j + 16] = 2.0f * kvalues_iq4nl[15 - j];
    }
    expect_values(dequantize(ggml_type::IQ4_NL, b), want);
    EXPECT_EQ(want[0], -254.0f);
    EXPECT_EQ(want[16], 226.0f);
}

TEST(Dequantize, Q2_K) {
    block_q2_K b{};
    b.d = kOne;
    b.dmin = kHalf;
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<uint8_t>(s | ((15 - s) << 4));
    fill_bytes(b.qs, 3);
    std::vector<float> want;
    for (int chunk = 0; chunk < 2; ++chunk) {
        const uint8_t* q = b.qs + 32 * chunk;
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; ++half) {
                const int sc = b.scales[chunk * 8 + shift + half];
                for (int l = 0; l < 16; ++l)
                    want.push_back(1.0f * (sc & 15) * ((q[l + 16 * half] >> shift) & 3) - 0.5f * (sc >> 4));
            }
        }
    }
    expect_values(dequantize(ggml_type::Q2_K, b), want);
}

TEST(Dequantize, Q3_K) {
    block_q3_K b{};
    b.d = kHalf;
    fill_bytes(b.hmask, 4);
    fill_bytes(b.qs, 5);
    fill_bytes(b.scales, 6);
    // The 16 six-bit scales, unpacked with 32-bit masks over the 12 bytes (ggml's way).
    uint32_t aux[4];
    std::memcpy(aux, b.scales, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & 0x0f0f0f0f) | (((tmp >> 4) & 0x03030303) << 4);
    aux[3] = ((aux[1] >> 4) & 0x0f0f0f0f) | (((tmp >> 6) & 0x03030303) << 4);
    aux[0] = (aux[0] & 0x0f0f0f0f) | (((tmp >> 0) & 0x03030303) << 4);
    aux[1] = (aux[1] & 0x0f0f0f0f) | (((tmp >> 2) & 0x03030303) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);

    std::vector<float> want;
    uint8_t m = 1;
    for (int chunk = 0; chunk < 2; ++chunk) {
        const uint8_t* q = b.qs + 32 * chunk;
        for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
            for (int half = 0; half < 2; ++half) {
                const float dl = 0.5f * static_cast<float>(scales[chunk * 8 + shift + half] - 32);
                for (int l = 16 * half; l < 16 * half + 16; ++l)
                    want.push_back(dl * static_cast<float>(((q[l] >> shift) & 3) - ((b.hmask[l] & m) ? 0 : 4)));
            }
        }
    }
    expect_values(dequantize(ggml_type::Q3_K, b), want);
}

TEST(Dequantize, Q3_KHandPackedScale) {
    // Sub-block 13 scale = 0b10'0101 (37 -> +5): low nibble in byte 5's high half, top bits in
    // byte 9 (13 % 4 = 1) at bits 6-7 (13 / 4 = 3). Every other scale is 32 (-> 0).
    block_q3_K b{};
    b.d = kOne;
    for (int s = 0; s < 16; ++s) {
        const int v = s == 13 ? 37 : 32;
        b.scales[s % 8] |= static_cast<uint8_t>((v & 15) << (4 * (s / 8)));
        b.scales[8 + s % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (s / 4)));
    }
    EXPECT_EQ(b.scales[5], 0x50);
    EXPECT_EQ(b.scales[9], 0x80 | 0x20 | 0x08 | 0x02);
    std::memset(b.hmask, 0xff, sizeof b.hmask);  // q = low bits + 4 - 4
    std::memset(b.qs, 0xe4, sizeof b.qs);        // shifts 0, 2, 4, 6 give 0, 1, 2, 3
    const auto y = dequantize(ggml_type::Q3_K, b);
    // Elements 208..223: chunk 1, shift 4 (q = 2), second half.
    for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], e >= 208 && e < 224 ? 10.0f : 0.0f) << e;
}

// Six-bit scale and min j of the 12-byte K_SCALE_SIZE packing (ggml's description).
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

TEST(Dequantize, Q4_K) {
    block_q4_K b{};
    b.d = kHalf;
    b.dmin = kQuarter;
    fill_bytes(b.scales, 7);
    fill_bytes(b.qs, 8);
    std::vector<float> want;
    for (int c = 0; c < 4; ++c) {
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * c, b.scales, &sc0, &m0);
        scale_min_k4(2 * c + 1, b.scales, &sc1, &m1);
        const uint8_t* q = b.qs + 32 * c;
        for (int l = 0; l < 32; ++l) want.push_back(0.5f * sc0 * (q[l] & 0xf) - 0.25f * m0);
        for (int l = 0; l < 32; ++l) want.push_back(0.5f * sc1 * (q[l] >> 4) - 0.25f * m1);
    }
    expect_values(dequantize(ggml_type::Q4_K, b), want);
}

TEST(Dequantize, Q4_KHandPackedScale) {
    // Sub-block 6: sc = 0b11'0101 = 53, m = 0b01'1010 = 26. Low nibbles in byte 10, top bits in the
    // top of bytes 2 (sc) and 6 (m). All codes 3, so elements 192..223 = 1 * 53 * 3 - 1 * 26.
    block_q4_K b{};
    b.d = kOne;
    b.dmin = kOne;
    b.scales[10] = 0xa5;
    b.scales[2] = 0xc0;
    b.scales[6] = 0x40;
    std::memset(b.qs, 0x33, sizeof b.qs);
    const auto y = dequantize(ggml_type::Q4_K, b);
    for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], e >= 192 && e < 224 ? 133.0f : 0.0f) << e;
}

TEST(Dequantize, Q5_K) {
    block_q5_K b{};
    b.d = kHalf;
    b.dmin = kTwo;
    fill_bytes(b.scales, 9);
    fill_bytes(b.qh, 10);
    fill_bytes(b.qs, 11);
    std::vector<float> want;
    uint8_t u1 = 1, u2 = 2;
    for (int c = 0; c < 4; ++c, u1 = static_cast<uint8_t>(u1 << 2), u2 = static_cast<uint8_t>(u2 << 2)) {
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * c, b.scales, &sc0, &m0);
        scale_min_k4(2 * c + 1, b.scales, &sc1, &m1);
        const uint8_t* q = b.qs + 32 * c;
        for (int l = 0; l < 32; ++l) want.push_back(0.5f * sc0 * ((q[l] & 0xf) + (b.qh[l] & u1 ? 16 : 0)) - 2.0f * m0);
        for (int l = 0; l < 32; ++l) want.push_back(0.5f * sc1 * ((q[l] >> 4) + (b.qh[l] & u2 ? 16 : 0)) - 2.0f * m1);
    }
    expect_values(dequantize(ggml_type::Q5_K, b), want);
}

TEST(Dequantize, Q6_K) {
    block_q6_K b{};
    b.d = kQuarter;
    fill_bytes(b.ql, 12);
    fill_bytes(b.qh, 13);
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s * 17 - 128);
    std::vector<float> want(256);
    for (int c = 0; c < 2; ++c) {
        const uint8_t* ql = b.ql + 64 * c;
        const uint8_t* qh = b.qh + 32 * c;
        const int8_t* sc = b.scales + 8 * c;
        float* y = want.data() + 128 * c;
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            y[l] = 0.25f * sc[is] * (((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = 0.25f * sc[is + 2] * (((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = 0.25f * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = 0.25f * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
    expect_values(dequantize(ggml_type::Q6_K, b), want);
}

TEST(Dequantize, Q8_K) {
    block_q8_K b{};
    b.d = 0.01f;
    for (int i = 0; i < 256; ++i) b.qs[i] = static_cast<int8_t>(i - 128);
    std::vector<float> want(256);
    for (int i = 0; i < 256; ++i) want[i] = 0.01f * static_cast<float>(i - 128);
    expect_values(dequantize(ggml_type::Q8_K, b), want);
}

TEST(Dequantize, IQ4_XS) {
    block_iq4_xs b{};
    b.d = kHalf;
    b.scales_h = 0x9c63;
    fill_bytes(b.scales_l, 14);
    fill_bytes(b.qs, 15);
    std::vector<float> want;
    for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b.scales_h >> 2 * ib) & 3) << 4);
        const float dl = 0.5f * static_cast<float>(ls - 32);
        const uint8_t* qs = b.qs + 16 * ib;
        for (int j = 0; j < 16; ++j) want.push_back(dl * kvalues_iq4nl[qs[j] & 0xf]);
        for (int j = 0; j < 16; ++j) want.push_back(dl * kvalues_iq4nl[qs[j] >> 4]);
    }
    expect_values(dequantize(ggml_type::IQ4_XS, b), want);
}

TEST(Dequantize, SeveralBlocksAdvance) {
    block_q4_0 b[3]{};
    for (int k = 0; k < 3; ++k) {
        b[k].d = fp32_to_fp16(static_cast<float>(k + 1));
        std::memset(b[k].qs, 0x99, 16);  // q = 9 -> x = d
    }
    float y[96];
    dequantize_row(ggml_type::Q4_0, b, y, 96);
    for (int i = 0; i < 96; ++i) EXPECT_EQ(y[i], static_cast<float>(i / 32 + 1)) << i;
}

}  // namespace
}  // namespace strata::formats
