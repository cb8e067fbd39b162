// fp16 / bf16 conversions: exact where representable, round to nearest even, inf / NaN / subnormals.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "formats/quant.hpp"

namespace strata::formats {
namespace {

// The value of half bits h, computed independently of the library from the IEEE definition.
double half_value(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

TEST(Fp16, ToFp32IsExactForEveryHalf) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = fp16_to_fp32(static_cast<fp16_t>(h));
        const int exp = (h >> 10) & 0x1f;
        if (exp == 0x1f) {
            if (h & 0x3ff) {
                EXPECT_TRUE(std::isnan(f)) << h;
            } else {
                EXPECT_EQ(f, (h & 0x8000) ? -INFINITY : INFINITY) << h;
            }
            continue;
        }
        EXPECT_EQ(static_cast<double>(f), half_value(static_cast<uint16_t>(h))) << "half bits " << h;
        EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    }
}

TEST(Fp16, RoundTripsEveryHalfBitExactly) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) continue;  // NaNs: checked below
        EXPECT_EQ(fp32_to_fp16(fp16_to_fp32(static_cast<fp16_t>(h))), h) << h;
    }
}

TEST(Fp16, KnownValues) {
    EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
    EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
    EXPECT_EQ(fp32_to_fp16(0.5f), 0x3800);
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);            // largest half
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(fp32_to_fp16(-std::ldexp(3.0f, -24)), 0x8003);
}

TEST(Fp16, RoundsToNearestEven) {
    const float ulp = std::ldexp(1.0f, -10);  // half's spacing in [1, 2)
    EXPECT_EQ(fp32_to_fp16(1.0f + ulp / 2), 0x3c00);                            // tie -> even (down)
    EXPECT_EQ(fp32_to_fp16(1.0f + 3 * ulp / 2), 0x3c02);                        // tie -> even (up)
    EXPECT_EQ(fp32_to_fp16(1.0f + ulp / 2 + std::ldexp(1.0f, -20)), 0x3c01);    // above the tie
    EXPECT_EQ(fp32_to_fp16(1.0f + ulp / 2 - std::ldexp(1.0f, -20)), 0x3c00);    // below the tie
    EXPECT_EQ(fp32_to_fp16(2.0f - ulp / 4), 0x4000);                            // carry into the exponent
}

TEST(Fp16, OverflowInfAndNan) {
    EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);  // below the midpoint to 2^16
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // the midpoint rounds to even = inf
    EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
    EXPECT_EQ(fp32_to_fp16(-1e10f), 0xfc00);
    EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7c00);
    EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xfc00);
    for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fa00000u}) {
        const fp16_t h = fp32_to_fp16(std::bit_cast<float>(bits));
        EXPECT_EQ(h & 0x7c00, 0x7c00) << bits;
        EXPECT_NE(h & 0x3ff, 0) << "NaN " << bits << " became inf";
        EXPECT_EQ((h & 0x8000) != 0, (bits >> 31) != 0);
    }
}

TEST(Fp16, Subnormals) {
    const float tiny = std::ldexp(1.0f, -24);                // smallest subnormal half
    EXPECT_EQ(fp32_to_fp16(tiny / 2), 0x0000);               // tie -> even 0
    EXPECT_EQ(fp32_to_fp16(tiny / 2 * 1.0001f), 0x0001);     // just above the tie
    EXPECT_EQ(fp32_to_fp16(3 * tiny / 2), 0x0002);           // tie between 1 and 2 -> 2
    EXPECT_EQ(fp32_to_fp16(5 * tiny / 2), 0x0002);           // tie between 2 and 3 -> 2
    EXPECT_EQ(fp32_to_fp16(tiny / 4), 0x0000);
    EXPECT_EQ(fp32_to_fp16(-tiny / 4), 0x8000);
    EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
    EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14) - tiny / 2), 0x0400);  // tie 0x03ff / 0x0400 -> even
    EXPECT_EQ(fp32_to_fp16(1023 * tiny), 0x03ff);
}

// Property: over random floats in half's range, the result is a nearest half, ties to even.
TEST(Fp16, RandomFloatsRoundToANearestHalf) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> bits(0, 0x477fe000u);  // |x| < 65504
    for (int i = 0; i < 200000; ++i) {
        const uint32_t b = bits(rng) | (i % 2 ? 0x80000000u : 0u);
        const float f = std::bit_cast<float>(b);
        const fp16_t h = fp32_to_fp16(f);
        const uint16_t mag = h & 0x7fff;
        const double v = half_value(h), err = std::fabs(v - f);
        const double sign = (h & 0x8000) ? -1.0 : 1.0;
        const double below = mag > 0 ? sign * half_value(static_cast<uint16_t>(mag - 1)) : -sign * half_value(1);
        const double above = sign * half_value(static_cast<uint16_t>(mag + 1));
        ASSERT_LE(err, std::fabs(below - f)) << "float bits " << b;
        ASSERT_LE(err, std::fabs(above - f)) << "float bits " << b;
        if (err == std::fabs(above - f) || (mag > 0 && err == std::fabs(below - f))) {
            ASSERT_EQ(h & 1, 0) << "tie not rounded to even, float bits " << b;
        }
    }
}

TEST(Bf16, ConversionsAndRounding) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(fp32_to_bf16(-2.0f), 0xc000);
    EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
    EXPECT_EQ(bf16_to_fp32(0xc0a0), -5.0f);
    const float ulp = std::ldexp(1.0f, -7);
    EXPECT_EQ(fp32_to_bf16(1.0f + ulp / 2), 0x3f80);      // tie -> even (down)
    EXPECT_EQ(fp32_to_bf16(1.0f + 3 * ulp / 2), 0x3f82);  // tie -> even (up)
    EXPECT_EQ(fp32_to_bf16(1.0f + ulp / 2 + std::ldexp(1.0f, -20)), 0x3f81);
    EXPECT_EQ(fp32_to_bf16(INFINITY), 0x7f80);
    EXPECT_EQ(fp32_to_bf16(-INFINITY), 0xff80);
    EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
    for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xff800001u}) {
        const bf16_t h = fp32_to_bf16(std::bit_cast<float>(bits));
        EXPECT_TRUE(std::isnan(bf16_to_fp32(h))) << "NaN " << bits << " gave " << h;
        EXPECT_EQ((h & 0x8000) != 0, (bits >> 31) != 0);
    }
    EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x00010000u)), 0x0001);  // subnormal, exact
    EXPECT_EQ(std::bit_cast<uint32_t>(bf16_to_fp32(0x0001)), 0x00010000u);
    for (uint32_t h = 0; h < 0x10000; ++h) {  // every non-NaN bf16 round-trips
        const float f = bf16_to_fp32(static_cast<bf16_t>(h));
        if (!std::isnan(f)) {
            EXPECT_EQ(fp32_to_bf16(f), h);
        }
    }
}

}  // namespace
}  // namespace strata::formats
