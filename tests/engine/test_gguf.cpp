// GGUF reader and writer: round trips of every value type and of tensor data, and rejection of
// corrupt files with messages that name the field and the numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "formats/blocks.hpp"
#include "gguf/gguf_reader.hpp"
#include "gguf/gguf_writer.hpp"
#include "gguf_bytes.hpp"

namespace strata::gguf {
namespace {

using formats::ggml_type;
using testing::gguf_bytes;

writer sample_writer() {
    writer w;
    w.set("general.architecture", value::str("qwen3moe"));
    w.set("t.u8", value::u8(200));
    w.set("t.i8", value::i8(-100));
    w.set("t.u16", value::u16(60000));
    w.set("t.i16", value::i16(-30000));
    w.set("t.u32", value::u32(4000000000u));
    w.set("t.i32", value::i32(-2000000000));
    w.set("t.u64", value::u64(18000000000000000000ull));
    w.set("t.i64", value::i64(-9000000000000000000ll));
    w.set("t.f32", value::f32(1.5f));
    w.set("t.f64", value::f64(-2.25e300));
    w.set("t.bool", value::boolean(true));
    w.set("t.str", value::str("héllo\nworld"));
    w.set("t.empty_str", value::str(""));
    w.set("t.strs", value::str_array({"a", "", "ccc"}));
    w.set("t.nested", value::arr(value_type::ARRAY, {value::i32_array({1, 2}), value::i32_array({}),
                                                     value::i32_array({-3})}));
    w.set("t.empty_arr", value::arr(value_type::FLOAT32, {}));
    std::vector<uint8_t> q8(2 * sizeof(formats::block_q8_0) * 3);
    for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 7);
    w.add_tensor("blk.0.attn_q.weight", ggml_type::Q8_0, {64, 3}, q8);
    std::vector<uint8_t> f32(5 * 4);
    for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(255 - i);
    w.add_tensor("output_norm.weight", ggml_type::F32, {5}, f32);
    return w;
}

TEST(Gguf, RoundTripsEveryValueTypeAndTensorBytes) {
    const reader r = reader::from_bytes(sample_writer().write_to_memory());
    EXPECT_EQ(r.version(), 3u);
    EXPECT_EQ(r.metadata().size(), 17u);
    EXPECT_EQ(r.at("t.u8").as_u64(), 200u);
    EXPECT_EQ(r.at("t.u8").type(), value_type::UINT8);
    EXPECT_EQ(r.at("t.i8").as_i64(), -100);
    EXPECT_EQ(r.at("t.u16").as_u64(), 60000u);
    EXPECT_EQ(r.at("t.i16").as_i64(), -30000);
    EXPECT_EQ(r.at("t.u32").as_u64(), 4000000000u);
    EXPECT_EQ(r.at("t.i32").as_i64(), -2000000000);
    EXPECT_EQ(r.at("t.u64").as_u64(), 18000000000000000000ull);
    EXPECT_EQ(r.at("t.i64").as_i64(), -9000000000000000000ll);
    EXPECT_EQ(r.at("t.f32").as_f64(), 1.5);
    EXPECT_EQ(r.at("t.f64").as_f64(), -2.25e300);
    EXPECT_TRUE(r.at("t.bool").as_bool());
    EXPECT_EQ(r.at("t.str").as_string(), "héllo\nworld");
    EXPECT_EQ(r.at("t.empty_str").as_string(), "");
    const auto& strs = r.at("t.strs").as_array();
    ASSERT_EQ(strs.size(), 3u);
    EXPECT_EQ(strs[2].as_string(), "ccc");
    const auto& nested = r.at("t.nested").as_array();
    ASSERT_EQ(nested.size(), 3u);
    EXPECT_EQ(r.at("t.nested").elem_type(), value_type::ARRAY);
    EXPECT_EQ(nested[0].as_array()[1].as_i64(), 2);
    EXPECT_TRUE(nested[1].as_array().empty());
    EXPECT_EQ(nested[2].as_array()[0].as_i64(), -3);
    EXPECT_TRUE(r.at("t.empty_arr").as_array().empty());
    EXPECT_EQ(r.at("t.empty_arr").elem_type(), value_type::FLOAT32);

    ASSERT_EQ(r.tensors().size(), 2u);
    const tensor_info* q = r.find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, ggml_type::Q8_0);
    EXPECT_EQ(q->ne, (std::vector<int64_t>{64, 3}));
    EXPECT_EQ(q->n_bytes, 6u * 34u);
    EXPECT_EQ(q->offset % r.alignment(), 0u);
    const auto data = r.tensor_data(*q);
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<uint8_t>(i * 7)) << i;
    const tensor_info* n = r.find_tensor("output_norm.weight");
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->offset % r.alignment(), 0u);
    EXPECT_EQ(r.tensor_data(*n)[19], 255 - 19);
    EXPECT_EQ(r.data_offset() % r.alignment(), 0u);
}

TEST(Gguf, WritesFileAtomicallyAndReadsItMapped) {
    const auto path = std::filesystem::temp_directory_path() / "strata_test_roundtrip.gguf";
    sample_writer().write_file(path.string());
    EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
    const reader r = reader::open(path.string());
    EXPECT_EQ(r.at("general.architecture").as_string(), "qwen3moe");
    EXPECT_EQ(r.file_size(), std::filesystem::file_size(path));
    r.release_pages(r.tensors()[0]);  // must be harmless on a read-only mapping
    EXPECT_EQ(r.tensor_data(r.tensors()[0])[1], 7);
    std::filesystem::remove(path);
}

TEST(Gguf, HonoursCustomAlignment) {
    writer w;
    w.set("general.alignment", value::u32(64));
    w.add_tensor("a", ggml_type::F32, {3}, std::vector<uint8_t>(12, 1));
    w.add_tensor("b", ggml_type::F32, {1}, std::vector<uint8_t>(4, 2));
    const reader r = reader::from_bytes(w.write_to_memory());
    EXPECT_EQ(r.alignment(), 64u);
    EXPECT_EQ(r.data_offset() % 64, 0u);
    EXPECT_EQ(r.find_tensor("b")->offset, 64u);
    EXPECT_EQ(r.tensor_data(*r.find_tensor("b"))[0], 2);
}

TEST(Gguf, ReadsVersion2) {
    gguf_bytes b;
    b.header(1, 1, 2).kv_str("general.architecture", "llama").tensor("t", {32}, 0, 0).align().zeros(128);
    const reader r = reader::from_bytes(b.bytes);
    EXPECT_EQ(r.version(), 2u);
    EXPECT_EQ(r.tensors()[0].n_bytes, 128u);
}

TEST(Gguf, WriterRejectsBadTensors) {
    writer w;
    EXPECT_THROW(w.add_tensor("x", ggml_type::Q4_K, {100}, [](std::span<uint8_t>) {}), gguf_error);
    EXPECT_THROW(w.add_tensor("x", ggml_type::F32, {0}, [](std::span<uint8_t>) {}), gguf_error);
    EXPECT_THROW(w.add_tensor("y", ggml_type::F32, {4}, std::vector<uint8_t>(15)), gguf_error);
    EXPECT_EQ(w.tensor_count(), 0u);
    w.add_tensor("x", ggml_type::F32, {4}, std::vector<uint8_t>(16));
    EXPECT_THROW(w.add_tensor("x", ggml_type::F32, {4}, std::vector<uint8_t>(16)), gguf_error);
}

TEST(Gguf, ValueAccessorsNameTheField) {
    try {
        (void)value::str("x").as_u64("llama.block_count");
        FAIL();
    } catch (const gguf_error& e) {
        EXPECT_NE(std::string(e.what()).find("llama.block_count"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)value::i32(-1).as_u64(), gguf_error);
    EXPECT_THROW(value::arr(value_type::INT32, {value::u8(1)}), gguf_error);
}

}  // namespace
}  // namespace strata::gguf
