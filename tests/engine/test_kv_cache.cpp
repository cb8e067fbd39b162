// The KV cache grows in chunks as positions are reserved, refuses what does not fit with the numbers,
// and hands attention tiles of one kv head per chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "formats/quant.hpp"
#include "model/kv_cache.hpp"

namespace strata::engine {
namespace {

constexpr int kLayers = 2, kHeads = 2, kHeadDim = 64;

TEST(KvCache, GrowsInChunksUpToTheContext) {
    kv_cache kv(kLayers, 1000, kHeads, kHeadDim, kv_type::f16);
    EXPECT_EQ(kv.bytes(), 0u);
    EXPECT_EQ(kv.capacity(), 0);
    const size_t per_chunk = 2u * kHeads * kv_cache::chunk_tokens * kHeadDim * 2;  // K and V, f16
    EXPECT_EQ(kv.chunk_bytes(), per_chunk);
    kv.reserve(1);
    EXPECT_EQ(kv.capacity(), kv_cache::chunk_tokens);
    EXPECT_EQ(kv.bytes(), kLayers * per_chunk);
    kv.reserve(kv_cache::chunk_tokens + 1);
    EXPECT_EQ(kv.n_chunks(), 2);
    kv.reserve(1000);
    EXPECT_EQ(kv.capacity(), 1000);  // four chunks, clipped to the context
    EXPECT_EQ(kv.bytes(), kv.max_bytes());
    EXPECT_EQ(kv.max_bytes(), kv_cache::bytes_needed(kLayers, 1000, kHeads, kHeadDim, kv_type::f16));
    kv.shrink(300);
    EXPECT_EQ(kv.n_chunks(), 2);
    kv.shrink(0);
    EXPECT_EQ(kv.bytes(), 0u);
}

// f16 rows are whole cache lines: a tile that starts off a line boundary splits every row load in two.
TEST(KvCache, TilesStartOnAPage) {
    kv_cache kv(kLayers, 1000, kHeads, 128, kv_type::f16);
    kv.reserve(1000);
    // A chunk of every layer is one mapping on a 2 MiB boundary, so its whole 2 MiB can be huge pages.
    for (int c = 0; c < kv.n_chunks(); ++c)
        EXPECT_EQ(reinterpret_cast<uintptr_t>(kv.tile(0, 0, c, 1000).k) % (uintptr_t{2} << 20), 0u) << "chunk " << c;
    for (int l = 0; l < kLayers; ++l)
        for (int c = 0; c < kv.n_chunks(); ++c)
            for (int g = 0; g < kHeads; ++g) {
                const auto t = kv.tile(l, g, c, 1000);
                EXPECT_EQ(reinterpret_cast<uintptr_t>(t.k) % 4096, 0u) << "layer " << l << " chunk " << c << " head " << g;
                EXPECT_EQ(reinterpret_cast<uintptr_t>(t.v) % 4096, 0u) << "layer " << l << " chunk " << c << " head " << g;
            }
}

TEST(KvCache, RefusesPastTheContextWithTheNumbers) {
    kv_cache kv(kLayers, 300, kHeads, kHeadDim, kv_type::int8);
    try {
        kv.reserve(301);
        FAIL();
    } catch (const kv_cache_full& e) {
        EXPECT_NE(std::string(e.what()).find("301 positions asked for, the context holds 300"), std::string::npos)
            << e.what();
    }
    EXPECT_EQ(kv.bytes(), 0u);
    std::vector<float> k(kHeads * kHeadDim, 1.0f), v(kHeads * kHeadDim, 2.0f);
    EXPECT_THROW(kv.store(0, 0, k.data(), v.data()), kv_cache_full) << "store before reserve";
    kv.reserve(300);
    kv.store(1, 299, k.data(), v.data());
    EXPECT_THROW(kv.store(1, 300, k.data(), v.data()), kv_cache_full);
    EXPECT_THROW(kv.store(1, -1, k.data(), v.data()), kv_cache_full);
}

TEST(KvCache, TilesHoldEachHeadsRowsOfAChunk) {
    kv_cache kv(1, 600, kHeads, kHeadDim, kv_type::f16);
    kv.reserve(600);
    std::vector<float> k(kHeads * kHeadDim), v(kHeads * kHeadDim);
    for (int pos = 0; pos < 600; ++pos) {
        for (int i = 0; i < kHeads * kHeadDim; ++i) {
            k[static_cast<size_t>(i)] = static_cast<float>(pos) + static_cast<float>(i / kHeadDim) * 0.5f;
            v[static_cast<size_t>(i)] = -static_cast<float>(pos);
        }
        kv.store(0, pos, k.data(), v.data());
    }
    const kernels::cpu::kv_tile t = kv.tile(0, 1, 2, 600);  // head 1, positions 512..599
    EXPECT_EQ(t.pos0, 512);
    EXPECT_EQ(t.n, 88);
    EXPECT_EQ(t.type, formats::ggml_type::F16);
    const auto* v_rows = static_cast<const formats::fp16_t*>(t.v);
    const size_t row = t.row_bytes / sizeof(formats::fp16_t);
    auto key = [&](int r, int j) {  // blocked and transposed
        formats::fp16_t h;
        std::memcpy(&h, static_cast<const uint8_t*>(t.k) + kernels::cpu::attn_key_offset(t.type, t.row_bytes, r, j), 2);
        return formats::fp16_to_fp32(h);
    };
    EXPECT_EQ(key(0, 0), 512.5f);
    EXPECT_EQ(key(10, 63), 522.5f);
    EXPECT_EQ(key(87, 1), 599.5f);
    EXPECT_EQ(formats::fp16_to_fp32(v_rows[87 * row]), -599.0f);

    // read_rows gives rows whatever the layout, and write_rows puts them back where tile() finds them.
    std::vector<formats::fp16_t> rows(3 * row);
    kv.read_rows(0, 2, 1, 85, 88, reinterpret_cast<uint8_t*>(rows.data()));
    EXPECT_EQ(formats::fp16_to_fp32(rows[0]), 597.5f);
    EXPECT_EQ(formats::fp16_to_fp32(rows[2 * row + 5]), 599.5f);
    rows[2 * row + 5] = formats::fp32_to_fp16(-1.0f);
    kv.write_rows(0, 2, 1, 85, 88, reinterpret_cast<const uint8_t*>(rows.data()));
    EXPECT_EQ(key(87, 5), -1.0f);
    EXPECT_EQ(key(87, 4), 599.5f);
    EXPECT_EQ(kv.tile(0, 0, 0, 600).n, kv_cache::chunk_tokens);
}

// int8 keys: a stored row reads back as the Q8_0 row quantize_row makes of it, and the blocked tile
// dequantizes to the same values; rows written back land where they were.
TEST(KvCache, Int8KeysReadBackAsTheirQ80Rows) {
    kv_cache kv(1, 300, kHeads, kHeadDim, kv_type::int8);
    kv.reserve(300);
    std::vector<float> k(kHeads * kHeadDim), v(kHeads * kHeadDim, 0.5f);
    auto key_of = [](int pos, int i) { return std::sin(0.37f * static_cast<float>(pos) + 0.11f * static_cast<float>(i)) * (1 + pos % 7); };
    for (int pos = 0; pos < 300; ++pos) {
        for (int i = 0; i < kHeads * kHeadDim; ++i) k[static_cast<size_t>(i)] = key_of(pos, i);
        kv.store(0, pos, k.data(), v.data());
    }
    const size_t row_bytes = kv.head_row_bytes();
    std::vector<uint8_t> rows(2 * row_bytes), expected(row_bytes);
    kv.read_rows(0, 1, 1, 40, 42, rows.data());  // head 1, positions 296 and 297
    for (int r = 0; r < 2; ++r) {
        std::vector<float> x(kHeadDim);
        for (int j = 0; j < kHeadDim; ++j) x[static_cast<size_t>(j)] = key_of(296 + r, kHeadDim + j);
        formats::quantize_row(formats::ggml_type::Q8_0, x.data(), expected.data(), kHeadDim);
        EXPECT_EQ(0, std::memcmp(rows.data() + r * row_bytes, expected.data(), row_bytes)) << "row " << r;
    }
    const kernels::cpu::kv_tile t = kv.tile(0, 1, 1, 300);
    const auto* kb = static_cast<const uint8_t*>(t.k);
    std::vector<float> deq(kHeadDim);
    formats::dequantize_row(formats::ggml_type::Q8_0, rows.data() + row_bytes, deq.data(), kHeadDim);
    for (int j = 0; j < kHeadDim; ++j) {
        formats::fp16_t d;
        std::memcpy(&d, kb + kernels::cpu::attn_key_scale_offset(kHeadDim, t.row_bytes, 41, j), 2);
        const auto q = static_cast<int8_t>(kb[kernels::cpu::attn_key_offset(t.type, t.row_bytes, 41, j)]);
        EXPECT_EQ(formats::fp16_to_fp32(d) * static_cast<float>(q), deq[static_cast<size_t>(j)]) << "element " << j;
    }
    std::vector<uint8_t> other(row_bytes);
    kv.read_rows(0, 1, 0, 3, 4, other.data());  // head 0, position 259
    kv.write_rows(0, 1, 1, 41, 42, other.data());
    std::vector<uint8_t> back(row_bytes);
    kv.read_rows(0, 1, 1, 41, 42, back.data());
    EXPECT_EQ(other, back);
    kv.read_rows(0, 1, 1, 40, 41, back.data());
    EXPECT_EQ(0, std::memcmp(back.data(), rows.data(), row_bytes)) << "the row before is untouched";
}

// A latent cache (deepseek2) keeps one row per position and layer, half the bytes of keys plus
// values, and reads back what was stored (f16: rounded to halves; int8: its Q8_0 blocks), across chunks.
TEST(KvCache, LatentRowsReadBackAcrossChunksInBothTypes) {
    constexpr int kRow = 96;  // kv_lora_rank 64 + 32 RoPE dims
    EXPECT_EQ(kv_cache::bytes_per_token(3, 1, kRow, kv_type::f16, true), 3u * kRow * 2);
    EXPECT_THROW(kv_cache(1, 10, 2, kRow, kv_type::f16, true), std::invalid_argument);
    auto value_of = [](int pos, int i) { return std::cos(0.21f * static_cast<float>(pos) - 0.05f * static_cast<float>(i)); };
    for (const kv_type type : {kv_type::f16, kv_type::int8}) {
        const formats::ggml_type element = type == kv_type::f16 ? formats::ggml_type::F16 : formats::ggml_type::Q8_0;
        kv_cache kv(2, 600, 1, kRow, type, true);
        EXPECT_EQ(kv.n_tiles(), 1);
        kv.reserve(600);
        EXPECT_EQ(kv.bytes(), 2u * 3 * kv_cache::chunk_tokens * formats::row_size(element, kRow));
        std::vector<float> row(kRow);
        for (int pos = 0; pos < 600; ++pos) {
            for (int i = 0; i < kRow; ++i) row[static_cast<size_t>(i)] = value_of(pos, i) * (1 + pos % 5);
            kv.store_latent(1, pos, row.data());
        }
        std::vector<float> got(static_cast<size_t>(20) * kRow), want(kRow);
        std::vector<uint8_t> q(formats::row_size(element, kRow));
        kv.read_latent(1, 250, 270, got.data());  // across the chunk boundary at 256
        for (int r = 0; r < 20; ++r) {
            for (int i = 0; i < kRow; ++i) row[static_cast<size_t>(i)] = value_of(250 + r, i) * (1 + (250 + r) % 5);
            formats::quantize_row(element, row.data(), q.data(), kRow);
            formats::dequantize_row(element, q.data(), want.data(), kRow);
            EXPECT_EQ(0, std::memcmp(got.data() + static_cast<size_t>(r) * kRow, want.data(), sizeof(float) * kRow))
                << kv_type_name(type) << " position " << 250 + r;
        }
        // Conversation snapshots copy the one tile's rows out and in as they are.
        std::vector<uint8_t> rows(kv.head_row_bytes()), back(kv.head_row_bytes());
        kv.read_rows(1, 1, 0, 4, 5, rows.data());  // position 260
        kv.write_rows(1, 0, 0, 7, 8, rows.data());  // over position 7
        kv.read_latent(1, 7, 8, got.data());
        kv.read_latent(1, 260, 261, want.data());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * kRow)) << kv_type_name(type);
    }
}

// The tile attention reads from a latent cache: keys laid out in the caller's scratch, the row's
// elements at the blocked offsets of attention.hpp; values the first v_dim of the rows, in place.
TEST(KvCache, LatentTileLaysKeysOutAndReadsValuesInPlace) {
    constexpr int kRow = 96, kValue = 64;
    for (const kv_type type : {kv_type::f16, kv_type::int8}) {
        const formats::ggml_type element = type == kv_type::f16 ? formats::ggml_type::F16 : formats::ggml_type::Q8_0;
        kv_cache kv(1, 600, 1, kRow, type, true);
        kv.reserve(600);
        std::vector<float> row(kRow);
        for (int pos = 0; pos < 300; ++pos) {
            for (int i = 0; i < kRow; ++i) row[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(pos + i));
            kv.store_latent(0, pos, row.data());
        }
        std::vector<uint8_t> keys(static_cast<size_t>(kv_cache::chunk_tokens) * kv.head_row_bytes(), 0xFF);
        const kernels::cpu::kv_tile t = kv.latent_tile(0, 1, 300, kValue, keys.data());  // positions 256..299
        EXPECT_EQ(t.pos0, 256);
        EXPECT_EQ(t.n, 44);
        EXPECT_EQ(t.v_dim, kValue);
        EXPECT_EQ(t.v_row_bytes, kv.head_row_bytes());
        EXPECT_EQ(t.k, keys.data());
        std::vector<uint8_t> want(kv.head_row_bytes());
        for (int r : {0, 31, 32, 43}) {
            kv.read_rows(0, 1, 0, r, r + 1, want.data());
            EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(t.v) + static_cast<size_t>(r) * t.v_row_bytes, want.data(),
                                     want.size()))
                << kv_type_name(type) << " value row " << r;
            for (int j = 0; j < kRow; ++j) {
                if (element == formats::ggml_type::F16) {
                    EXPECT_EQ(0, std::memcmp(keys.data() + kernels::cpu::attn_key_offset(element, t.row_bytes, r, j),
                                             want.data() + 2 * j, 2))
                        << "f16 key " << r << " element " << j;
                    continue;
                }
                const auto& b = reinterpret_cast<const formats::block_q8_0*>(want.data())[j / formats::QK8_0];
                EXPECT_EQ(static_cast<int8_t>(keys[kernels::cpu::attn_key_offset(element, t.row_bytes, r, j)]),
                          b.qs[j % formats::QK8_0])
                    << "int8 key " << r << " element " << j;
                EXPECT_EQ(0, std::memcmp(keys.data() + kernels::cpu::attn_key_scale_offset(kRow, t.row_bytes, r, j), &b.d, 2))
                    << "int8 key " << r << " scale of element " << j;
            }
        }
        // The slots past position 299 in the last key block are zero (scored, then masked: finite).
        for (int r = 44; r < 64; ++r)
            for (int j = 0; j < kRow; ++j)
                EXPECT_EQ(keys[kernels::cpu::attn_key_offset(element, t.row_bytes, r, j)], 0) << "slot " << r;
        EXPECT_THROW((void)kv.tile(0, 0, 1, 300), std::logic_error);
    }
}

}  // namespace
}  // namespace strata::engine
