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

}  // namespace
}  // namespace strata::server
