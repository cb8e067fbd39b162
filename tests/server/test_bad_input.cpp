// Every kind of bad request gets an OpenAI-style error object with the right status, and the server
// keeps serving: malformed JSON, wrong types, missing or empty fields, unknown roles, prompts and
// max_tokens beyond the context, invalid UTF-8, oversized bodies, unknown routes, wrong methods, keys.
#include <gtest/gtest.h>

#include "server_fixture.hpp"
#include "text.hpp"

namespace strata::server::test {
namespace {

// Checks the OpenAI error shape and returns the error object.
json expect_error(const reply& r, int status, const std::string& param = {}, const std::string& code = {}) {
    EXPECT_EQ(r.status, status) << r.body;
    const json j = r.parsed();
    EXPECT_TRUE(j.contains("error")) << r.body;
    const json e = j.value("error", json::object());
    for (const char* key : {"message", "type", "param", "code"}) EXPECT_TRUE(e.contains(key)) << key << ": " << r.body;
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.body;
    if (!param.empty()) {
        EXPECT_EQ(e["param"], param) << r.body;
    }
    if (!code.empty()) {
        EXPECT_EQ(e["code"], code) << r.body;
    }
    return e;
}

std::string message(const json& e) { return e.value("message", ""); }

TEST(ServerBadInput, MalformedAndWrongShapes) {
    test_server s;
    expect_error(s.post("/v1/chat/completions", std::string("{\"messages\": [")), 400, "", "invalid_json");
    expect_error(s.post("/v1/chat/completions", std::string("[1, 2]")), 400, "", "invalid_json");
    expect_error(s.post("/v1/chat/completions", std::string("")), 400, "", "invalid_json");

    json b = chat_body("hi", 4);
    b["temperature"] = "hot";
    EXPECT_NE(message(expect_error(s.post("/v1/chat/completions", b), 400, "temperature", "invalid_type")).find("temperature"),
              std::string::npos);
    b = chat_body("hi", 4);
    b["max_tokens"] = "ten";
    expect_error(s.post("/v1/chat/completions", b), 400, "max_tokens", "invalid_type");
    b = chat_body("hi", 4);
    b["stream"] = "yes";
    expect_error(s.post("/v1/chat/completions", b), 400, "stream", "invalid_type");
    b = chat_body("hi", 4);
    b["stop"] = json::array({1});
    expect_error(s.post("/v1/chat/completions", b), 400, "stop[0]", "invalid_type");
    b = chat_body("hi", 4);
    b["messages"][0]["content"] = 42;
    expect_error(s.post("/v1/chat/completions", b), 400, "messages[0].content", "invalid_type");
    b = chat_body("hi", 4);
    b["top_p"] = 3;
    expect_error(s.post("/v1/chat/completions", b), 400, "top_p", "invalid_value");
    b = chat_body("hi", 4);
    b["top_logprobs"] = 2;
    expect_error(s.post("/v1/chat/completions", b), 400, "top_logprobs");
    b = chat_body("hi", 4);
    b["n"] = 2;
    expect_error(s.post("/v1/chat/completions", b), 400, "n");
    expect_error(s.post("/v1/completions", json{{"prompt", {true}}}), 400, "prompt");
    expect_error(s.post("/tokenize", json{{"content", 5}}), 400, "content", "invalid_type");
}

TEST(ServerBadInput, MissingEmptyAndUnknown) {
    test_server s;
    expect_error(s.post("/v1/chat/completions", json{{"max_tokens", 4}}), 400, "messages", "missing_required_parameter");
    expect_error(s.post("/v1/chat/completions", json{{"messages", json::array()}}), 400, "messages");
    expect_error(s.post("/v1/chat/completions", json{{"messages", "hello"}}), 400, "messages", "invalid_type");
    json b = chat_body("hi", 4);
    b["messages"][0]["role"] = "robot";
    EXPECT_NE(message(expect_error(s.post("/v1/chat/completions", b), 400, "messages[0].role")).find("robot"),
              std::string::npos);
    b["messages"][0].erase("role");
    expect_error(s.post("/v1/chat/completions", b), 400, "messages[0].role", "missing_required_parameter");
    expect_error(s.post("/v1/completions", json{{"max_tokens", 4}}), 400, "prompt", "missing_required_parameter");
    expect_error(s.post("/v1/completions", json{{"prompt", ""}}), 400, "prompt");
    expect_error(s.post("/v1/completions", json{{"prompt", json::array()}}), 400, "prompt");
}

TEST(ServerBadInput, ContextLimits) {
    test_server s;
    std::string long_text;
    for (int i = 0; i < test_ctx; ++i) long_text += "word" + std::to_string(i) + " ";
    const size_t n_tokens = s.post("/tokenize", json{{"content", long_text}, {"add_special", true}}).parsed()["tokens"].size();
    ASSERT_GT(n_tokens, size_t(test_ctx));
    const json e = expect_error(s.post("/v1/completions", json{{"prompt", long_text}, {"max_tokens", 4}}), 400, "prompt",
                                "context_length_exceeded");
    EXPECT_NE(message(e).find(std::to_string(n_tokens)), std::string::npos) << message(e);
    EXPECT_NE(message(e).find(std::to_string(test_ctx)), std::string::npos) << message(e);
    expect_error(s.post("/v1/chat/completions", chat_body(long_text, 4)), 400, "messages", "context_length_exceeded");

    expect_error(s.post("/v1/chat/completions", chat_body("hi", 0)), 400, "max_tokens", "invalid_value");
    expect_error(s.post("/v1/chat/completions", chat_body("hi", -3)), 400, "max_tokens", "invalid_value");
    const json big = expect_error(s.post("/v1/chat/completions", chat_body("hi", 100000)), 400, "max_tokens",
                                  "context_length_exceeded");
    EXPECT_NE(message(big).find("100000"), std::string::npos);
    EXPECT_NE(message(big).find(std::to_string(test_ctx)), std::string::npos);
}

TEST(ServerBadInput, InvalidUtf8) {
    test_server s;
    const std::string body = "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\xC3\x28\"}], \"max_tokens\": 2}";
    EXPECT_NE(message(expect_error(s.post("/v1/chat/completions", body), 400, "", "invalid_utf8")).find("offset"),
              std::string::npos);
    expect_error(s.post("/tokenize", std::string("{\"content\": \"\xFF\"}")), 400, "", "invalid_utf8");
}

TEST(ServerBadInput, BodyOverTheLimit) {
    server_options o;
    o.max_body_bytes = 4096;
    test_server s(o);
    json b = chat_body(std::string(8000, 'a'), 2);
    expect_error(s.post("/v1/chat/completions", b), 413, "", "request_too_large");
    // curl -d without a Content-Type: the body is form-encoded, which cpp-httplib caps at 8 KiB.
    test_server roomy;
    const json e = expect_error(roomy.send("POST", "/v1/chat/completions", chat_body(std::string(9000, 'a'), 2).dump(),
                                           {{"Content-Type", "application/x-www-form-urlencoded"}}),
                                413, "", "request_too_large");
    EXPECT_NE(message(e).find("Content-Type"), std::string::npos);
    EXPECT_EQ(s.post("/v1/chat/completions", chat_body("small", 2)).status, 200);
}

TEST(ServerBadInput, RoutesAndMethods) {
    test_server s;
    expect_error(s.get("/v1/nothing"), 404, "", "not_found");
    expect_error(s.post("/v1/nothing", std::string("{}")), 404, "", "not_found");
    const reply wrong = s.get("/v1/chat/completions");
    expect_error(wrong, 405, "", "method_not_allowed");
    EXPECT_EQ(wrong.header("Allow"), "POST");
    expect_error(s.send("DELETE", "/health"), 405, "", "method_not_allowed");
    expect_error(s.send("PUT", "/v1/completions", "{}"), 405, "", "method_not_allowed");

    // A request line cpp-httplib cannot parse still gets an answer, and the server goes on.
    raw_connection c(s.port());
    c.send_all("NONSENSE\r\n\r\n");
    EXPECT_TRUE(c.read_until("HTTP/1.1 400")) << c.received();
    EXPECT_EQ(s.post("/v1/chat/completions", chat_body("still there?", 2)).status, 200);
}

TEST(ServerBadInput, ApiKey) {
    server_options o;
    o.api_key = "s3cret-key";
    test_server s(o);
    const json body = chat_body("hi", 2);
    expect_error(s.post("/v1/chat/completions", body), 401, "", "invalid_api_key");
    expect_error(s.post("/v1/chat/completions", body, {{"Authorization", "Bearer wrong"}}), 401, "", "invalid_api_key");
    expect_error(s.post("/v1/chat/completions", body, {{"Authorization", "Bearer s3cret-ke"}}), 401);
    expect_error(s.post("/v1/chat/completions", body, {{"x-api-key", "s3cret-key-and-more"}}), 401);
    expect_error(s.get("/v1/status"), 401);
    expect_error(s.get("/metrics"), 401);
    EXPECT_EQ(s.post("/v1/chat/completions", body, {{"Authorization", "Bearer s3cret-key"}}).status, 200);
    EXPECT_EQ(s.post("/v1/chat/completions", body, {{"x-api-key", "s3cret-key"}}).status, 200);
    EXPECT_EQ(s.get("/v1/models", {{"Authorization", "Bearer s3cret-key"}}).status, 200);
    EXPECT_EQ(s.get("/health").status, 200);  // open, for load balancers
}

TEST(ServerText, Helpers) {
    EXPECT_FALSE(find_invalid_utf8("héllo ✓ 𝄞").has_value());
    EXPECT_EQ(find_invalid_utf8("ab\xC0\xAF"), 2u);        // overlong
    EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0u);       // surrogate
    EXPECT_EQ(find_invalid_utf8("x\xF4\x90\x80\x80"), 1u);  // past U+10FFFF
    EXPECT_EQ(find_invalid_utf8("\xE2\x9C"), 0u);           // cut short
    EXPECT_EQ(to_valid_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
    EXPECT_TRUE(equal_constant_time("abc", "abc"));
    EXPECT_FALSE(equal_constant_time("abc", "abd"));
    EXPECT_FALSE(equal_constant_time("abc", "abcd"));
    EXPECT_FALSE(equal_constant_time("", "a"));
    EXPECT_TRUE(is_loopback_host("127.0.0.1"));
    EXPECT_TRUE(is_loopback_host("localhost"));
    EXPECT_TRUE(is_loopback_host("::1"));
    EXPECT_FALSE(is_loopback_host("0.0.0.0"));
}

}  // namespace
}  // namespace strata::server::test
