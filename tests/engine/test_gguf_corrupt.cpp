// The corrupt-file table: every malformed GGUF is rejected with a message naming the field and the
// numbers, by the reader and by `strata info` (exit status 1, one line), never a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf/gguf_reader.hpp"
#include "gguf/gguf_writer.hpp"
#include "gguf_bytes.hpp"

namespace strata::gguf {
namespace {

using testing::gguf_bytes;

struct corrupt_case {
    std::string name;
    std::vector<uint8_t> bytes;
    std::vector<std::string> expect;  // substrings of the error message
};

// A well-formed file with one metadata entry and two F32 tensors of 8 elements (32 bytes each).
gguf_bytes valid_prefix(uint64_t n_tensors = 2) {
    gguf_bytes b;
    b.header(n_tensors, 1).kv_str("general.architecture", "qwen3moe");
    return b;
}

std::vector<corrupt_case> corrupt_cases() {
    std::vector<corrupt_case> c;
    c.push_back({"empty", {}, {"0 bytes", "too small"}});
    c.push_back({"short header", gguf_bytes().put<uint32_t>(0x46554747).put<uint32_t>(3).bytes, {"8 bytes"}});
    c.push_back({"bad magic", gguf_bytes().header(0, 0, 3, 0x4c4c5546).bytes, {"not a GGUF file", "FULL"}});
    c.push_back({"version 1", gguf_bytes().header(0, 0, 1).bytes, {"version 1", "2 and 3"}});
    c.push_back({"version 4", gguf_bytes().header(0, 0, 4).bytes, {"version 4"}});
    c.push_back({"huge tensor count", gguf_bytes().header(1ull << 60, 0).bytes, {"1152921504606846976 tensors"}});
    c.push_back({"huge kv count", gguf_bytes().header(0, 1ull << 62).bytes, {"metadata entries"}});
    c.push_back({"key length beyond file", gguf_bytes().header(0, 1).put<uint64_t>(1ull << 40).zeros(16).bytes,
                 {"key of metadata entry 0", "1099511627776"}});
    c.push_back({"string value beyond file",
                 gguf_bytes().header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(1000).zeros(8).bytes,
                 {"'k'", "1000 bytes"}});
    c.push_back({"array count beyond file",
                 gguf_bytes().header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(1ull << 50).bytes,
                 {"'arr'", "1125899906842624", "int32"}});
    c.push_back({"unknown value type", gguf_bytes().header(0, 1).str("k").put<uint32_t>(13).zeros(8).bytes,
                 {"unknown value type 13", "'k'"}});
    {
        gguf_bytes b;
        b.header(0, 1).str("deep").put<uint32_t>(9);  // an array of arrays of arrays ...
        for (int i = 0; i < 20; ++i) b.put<uint32_t>(9).put<uint64_t>(1);
        c.push_back({"arrays nested too deep", b.zeros(64).bytes, {"'deep'", "deeper than"}});
    }
    c.push_back({"bad bool", gguf_bytes().header(0, 1).str("b").put<uint32_t>(7).put<uint8_t>(2).zeros(8).bytes,
                 {"'b'", "byte value 2"}});
    c.push_back({"duplicate key",
                 gguf_bytes().header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).bytes, {"'a.b'", "twice"}});
    c.push_back({"alignment not a power of two",
                 gguf_bytes().header(0, 1).kv_u32("general.alignment", 48).bytes, {"general.alignment", "48"}});
    c.push_back({"alignment of the wrong type",
                 gguf_bytes().header(0, 1).kv_str("general.alignment", "32").bytes, {"general.alignment", "string"}});
    c.push_back({"unknown tensor type",
                 valid_prefix(1).tensor("blk.0.w", {32}, 31, 0).align().zeros(64).bytes,
                 {"'blk.0.w'", "unknown type id 31"}});
    c.push_back({"zero dimensions", valid_prefix(1).tensor("t", {}, 0, 0).align().zeros(64).bytes,
                 {"'t'", "0 dimensions"}});
    c.push_back({"five dimensions", valid_prefix(1).tensor("t", {1, 1, 1, 1, 1}, 0, 0).align().zeros(64).bytes,
                 {"'t'", "5 dimensions"}});
    c.push_back({"dimension of zero", valid_prefix(1).tensor("t", {8, 0}, 0, 0).align().zeros(64).bytes,
                 {"'t'", "dimension 1 is 0"}});
    c.push_back({"overflowing dims",
                 valid_prefix(1).tensor("t", {1ull << 32, 1ull << 32}, 0, 0).align().zeros(64).bytes,
                 {"'t'", "overflows", "[4294967296, 4294967296]"}});
    c.push_back({"overflowing byte size",
                 valid_prefix(1).tensor("t", {1ull << 61, 2}, 0, 0).align().zeros(64).bytes, {"'t'", "overflow"}});
    c.push_back({"ragged row for the type",
                 valid_prefix(1).tensor("t", {100}, 12, 0).align().zeros(64).bytes,
                 {"'t'", "Q4_K", "100 elements", "256"}});
    c.push_back({"offset out of bounds",
                 valid_prefix(2).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 4096).align().zeros(64).bytes,
                 {"'b'", "4096", "beyond the data section of 64 bytes"}});
    c.push_back({"offset near 2^64",
                 valid_prefix(1).tensor("a", {8}, 0, ~uint64_t{0} - 31).align().zeros(64).bytes, {"'a'", "beyond"}});
    c.push_back({"misaligned offset",
                 valid_prefix(2).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 40).align().zeros(96).bytes,
                 {"'b'", "offset 40", "alignment 32"}});
    c.push_back({"overlapping tensors",
                 valid_prefix(2).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).align().zeros(96).bytes,
                 {"'a'", "'b'", "overlap"}});
    c.push_back({"duplicate tensor names",
                 valid_prefix(2).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).align().zeros(64).bytes,
                 {"'a'", "twice"}});
    c.push_back({"data section truncated",
                 valid_prefix(2).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 32).align().zeros(40).bytes,
                 {"'b'", "beyond the data section of 40 bytes"}});
    return c;
}

TEST(GgufCorrupt, ReaderRejectsEveryCaseWithTheNumbers) {
    for (const auto& c : corrupt_cases()) {
        SCOPED_TRACE(c.name);
        try {
            (void)reader::from_bytes(c.bytes, "case.gguf");
            ADD_FAILURE() << c.name << ": accepted";
        } catch (const gguf_error& e) {
            const std::string msg = e.what();
            EXPECT_EQ(msg.rfind("case.gguf: ", 0), 0u) << msg;
            for (const auto& s : c.expect) EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
        }
    }
}

// Every prefix of a real file (cut anywhere in the header, metadata, tensor infos or data) is rejected
// cleanly; the full file is accepted.
TEST(GgufCorrupt, EveryTruncationIsRejected) {
    writer w;
    w.set("general.architecture", value::str("qwen2moe"));
    w.set("tokenizer.ggml.tokens", value::str_array({"a", "bb", "ccc"}));
    w.set("x.nested", value::arr(value_type::ARRAY, {value::f32_array({1, 2})}));
    w.add_tensor("t0", formats::ggml_type::Q8_0, {32, 2}, std::vector<uint8_t>(68, 3));
    w.add_tensor("t1", formats::ggml_type::F16, {8}, std::vector<uint8_t>(16, 4));
    const std::vector<uint8_t> full = w.write_to_memory();
    ASSERT_NO_THROW((void)reader::from_bytes(full));
    int rejected = 0;
    const reader ok = reader::from_bytes(full);
    const size_t last_needed = ok.data_offset() + ok.find_tensor("t1")->offset + ok.find_tensor("t1")->n_bytes;
    for (size_t n = 0; n < last_needed; ++n) {
        std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
        EXPECT_THROW((void)reader::from_bytes(cut), gguf_error) << "prefix of " << n << " bytes";
        ++rejected;
    }
    EXPECT_EQ(rejected, static_cast<int>(last_needed));
}

std::string temp_file(const std::string& name, const std::vector<uint8_t>& bytes) {
    // The process id keeps concurrent runs of this test (several build trees) off each other's files.
    const auto path = std::filesystem::temp_directory_path() /
                      ("strata_corrupt_" + std::to_string(getpid()) + "_" + name + ".gguf");
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                 static_cast<std::streamsize>(bytes.size()));
    return path.string();
}

TEST(GgufCorrupt, StrataInfoExitsOneWithOneLine) {
    int n = 0;
    for (auto c : corrupt_cases()) {
        SCOPED_TRACE(c.name);
        for (char& ch : c.name)
            if (ch == ' ' || ch == '^') ch = '_';
        const std::string path = temp_file(c.name, c.bytes);
        const std::string err = path + ".err";
        const std::string cmd = std::string(STRATA_CLI) + " info " + path + " > /dev/null 2> " + err;
        const int status = std::system(cmd.c_str());
        ASSERT_TRUE(WIFEXITED(status)) << "strata info crashed on " << c.name;
        EXPECT_EQ(WEXITSTATUS(status), 1);
        std::ifstream in(err);
        std::string line, rest;
        std::getline(in, line);
        EXPECT_NE(line.find("error:"), std::string::npos) << line;
        EXPECT_FALSE(std::getline(in, rest)) << "more than one line: " << rest;
        std::filesystem::remove(path);
        std::filesystem::remove(err);
        ++n;
    }
    EXPECT_GE(n, 25);
}

TEST(GgufCorrupt, MissingFileIsAClearError) {
    try {
        (void)reader::open("/nonexistent/model.gguf");
        FAIL();
    } catch (const gguf_error& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf: cannot open"), std::string::npos);
    }
}

}  // namespace
}  // namespace strata::gguf
