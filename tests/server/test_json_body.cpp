// parse_json_body keeps the fields handlers read, skips the rest without building them, caps the
// values it keeps, and names the field of a number it cannot hold.
#include <gtest/gtest.h>

#include <string>

#include "api_error.hpp"
#include "json_body.hpp"

namespace strata::server {
namespace {

std::string repeated(const std::string& item, size_t n) {
    std::string s;
    s.reserve(item.size() * n + n);
    for (size_t i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s;
}

api_error error_of(const std::string& body, size_t max_values = max_json_values) {
    try {
        parse_json_body(body, max_values);
    } catch (const api_error& e) {
        return e;
    }
    ADD_FAILURE() << "no error for " << body.substr(0, 80);
    return api_error(0, "");
}

TEST(JsonBody, KeepsReadFieldsAndSkipsTheRest) {
    const auto j = parse_json_body(R"({"model": "m", "metadata": {"a": [1, {"b": 2}]}, "stop": ["x", {"y": [null]}],
                                      "stream_options": {"include_usage": true}, "zzz": 1e3, "n": 1})");
    EXPECT_EQ(j.dump(), R"({"model":"m","n":1,"stop":["x",{"y":[null]}],"stream_options":{"include_usage":true}})");
    for (const char* f : {"messages", "prompt", "max_tokens", "tools", "user", "prompt_cache_key"})
        EXPECT_TRUE(is_read_field(f)) << f;
    EXPECT_FALSE(is_read_field("metadata"));
}

TEST(JsonBody, SkippedFieldsCostNoValues) {
    // 160,000 objects and 100,000 numbers in ignored fields, with a cap of 10 values kept.
    const std::string body = "{\"ignored\": [" + repeated("{}", 160000) + "], \"other\": [" + repeated("7", 100000) +
                             "], \"model\": \"m\"}";
    EXPECT_EQ(parse_json_body(body, 10).dump(), R"({"model":"m"})");
}

TEST(JsonBody, KeptValuesAreCapped) {
    const std::string body = "{\"stop\": [" + repeated("{}", 2000) + "]}";
    // The body object, the array and its 2000 objects.
    EXPECT_EQ(parse_json_body(body, 2002)["stop"].size(), 2000u);
    const api_error e = error_of(body, 2001);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "too_many_values");
    EXPECT_NE(std::string(e.what()).find("2001"), std::string::npos) << e.what();
}

TEST(JsonBody, ErrorsNameWhatAndWhere) {
    api_error e = error_of(R"({"stream_options": {"x": 1, "include_usage": 1e999}})");
    EXPECT_EQ(e.param, "stream_options.include_usage");
    EXPECT_NE(std::string(e.what()).find("1e999"), std::string::npos) << e.what();
    e = error_of(R"({"ignored": [1e999]})");
    EXPECT_EQ(e.param, "ignored");
    e = error_of("[1e999]");
    EXPECT_EQ(e.code, "invalid_value");
    EXPECT_EQ(error_of(R"({"messages": [)").code, "invalid_json");
    EXPECT_EQ(error_of(R"({"ignored": [}, "model": 1})").code, "invalid_json");
    EXPECT_EQ(error_of("[1, 2]").code, "invalid_json");
    EXPECT_EQ(error_of("").code, "invalid_json");
    EXPECT_EQ(error_of("{\"model\": \"\xff\"}").code, "invalid_utf8");
}

TEST(JsonBody, DuplicateKeysKeepTheLast) {
    EXPECT_EQ(parse_json_body(R"({"n": 1, "n": 2, "stop": "a", "stop": ["b"]})").dump(), R"({"n":2,"stop":["b"]})");
}

// The ordered document (for chat templates) keeps the client's key order, skips the same fields,
// keeps the last of repeated keys, and builds a wide object through its index (200,000 members).
TEST(JsonBody, OrderedKeepsKeyOrderAndTheSameBounds) {
    const auto j = parse_json_body_ordered(
        R"({"messages": [{"role": "user", "z": 1, "a": 2, "m": 3, "a": 4}], "ignored": [1, 2, 3]})");
    ASSERT_TRUE(j.contains("messages"));
    EXPECT_FALSE(j.contains("ignored"));
    EXPECT_EQ(j["messages"][0].dump(), R"({"role":"user","z":1,"a":4,"m":3})");

    std::string wide = R"({"tools": [{)";
    for (int i = 0; i < 200000; ++i) wide += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": " + std::to_string(i);
    wide += "}]}";
    const auto w = parse_json_body_ordered(wide);
    ASSERT_EQ(w["tools"][0].size(), 200000u);
    EXPECT_EQ(w["tools"][0].begin().key(), "k0");
    EXPECT_EQ(w["tools"][0]["k199999"], 199999);
    EXPECT_THROW(parse_json_body_ordered(wide, 1000), api_error);
}

}  // namespace
}  // namespace strata::server
