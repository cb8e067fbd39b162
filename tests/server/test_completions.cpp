// Chat and text completions over loopback: whole and streamed answers agree, usage and timings,
// include_usage, logprobs in both OpenAI shapes, stop strings, seeds, prefix reuse, tokenize.
#include <gtest/gtest.h>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

std::string streamed_text(const sse_reply& r, const char* kind) {
    std::string text;
    for (const json& c : r.chunks()) {
        if (c["choices"].empty()) continue;
        const json& choice = c["choices"][0];
        if (std::string(kind) == "chat") {
            if (choice["delta"].contains("content")) text += choice["delta"]["content"].get<std::string>();
        } else {
            text += choice["text"].get<std::string>();
        }
    }
    return text;
}

void expect_timings(const json& t) {
    for (const char* key : {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                            "predicted_per_second", "cache_n"})
        EXPECT_TRUE(t.contains(key) && t[key].is_number()) << key << " in " << t.dump();
}

TEST(ServerCompletions, ChatWholeAnswer) {
    test_server s;
    const reply r = s.post("/v1/chat/completions", chat_body("Hello! How are you?", 12));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.header("Content-Type").find("application/json"), std::string::npos);
    const json j = r.parsed();
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(j["model"], "tiny.gguf");
    const json& choice = j["choices"][0];
    EXPECT_EQ(choice["message"]["role"], "assistant");
    EXPECT_TRUE(choice["message"]["content"].is_string());
    EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length");
    EXPECT_TRUE(choice["logprobs"].is_null());
    const json& u = j["usage"];
    EXPECT_GT(u["prompt_tokens"].get<int>(), 5);
    EXPECT_GE(u["completion_tokens"].get<int>(), 1);
    EXPECT_LE(u["completion_tokens"].get<int>(), 12);
    EXPECT_EQ(u["total_tokens"].get<int>(), u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
    expect_timings(j["timings"]);
    EXPECT_EQ(j["timings"]["predicted_n"], u["completion_tokens"]);
    EXPECT_EQ(j["timings"]["prompt_n"].get<int>() + j["timings"]["cache_n"].get<int>(), u["prompt_tokens"].get<int>());
}

TEST(ServerCompletions, ChatStreamMatchesWholeAnswer) {
    test_server s;
    json body = chat_body("Tell me a story.", 24);
    body["ignore_eos"] = true;
    const json whole = s.post("/v1/chat/completions", body).parsed();
    body["stream"] = true;
    const sse_reply r = s.post_stream("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.content_type, "text/event-stream");
    ASSERT_GE(r.data.size(), 3u);
    EXPECT_EQ(r.data.back(), "[DONE]");
    const std::vector<json> chunks = r.chunks();
    EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
    for (const json& c : chunks) {
        EXPECT_EQ(c["object"], "chat.completion.chunk");
        EXPECT_EQ(c["id"], chunks.front()["id"]);
        EXPECT_FALSE(c.contains("usage"));
    }
    EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");
    expect_timings(chunks.back()["timings"]);
    EXPECT_EQ(chunks.back()["timings"]["predicted_n"], 24);
    EXPECT_EQ(streamed_text(r, "chat"), whole["choices"][0]["message"]["content"].get<std::string>());
}

TEST(ServerCompletions, StreamIncludeUsage) {
    test_server s;
    json body = chat_body("Hi", 8, true);
    body["stream_options"] = {{"include_usage", true}};
    const sse_reply r = s.post_stream("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200);
    const std::vector<json> chunks = r.chunks();
    ASSERT_GE(chunks.size(), 2u);
    const json& last = chunks.back();
    EXPECT_TRUE(last["choices"].empty());
    EXPECT_GT(last["usage"]["prompt_tokens"].get<int>(), 0);
    EXPECT_EQ(last["usage"]["total_tokens"].get<int>(),
              last["usage"]["prompt_tokens"].get<int>() + last["usage"]["completion_tokens"].get<int>());
    for (size_t i = 0; i + 1 < chunks.size(); ++i) EXPECT_TRUE(chunks[i]["usage"].is_null()) << chunks[i].dump();
}

TEST(ServerCompletions, TextWholeAndStreamed) {
    test_server s;
    const json body = {{"prompt", "The quick brown fox"}, {"max_tokens", 16}, {"temperature", 0}, {"ignore_eos", true}};
    const reply r = s.post("/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = r.parsed();
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 16);
    expect_timings(j["timings"]);

    json sb = body;
    sb["stream"] = true;
    const sse_reply st = s.post_stream("/v1/completions", sb);
    ASSERT_EQ(st.status, 200);
    EXPECT_EQ(st.data.back(), "[DONE]");
    for (const json& c : st.chunks()) EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(streamed_text(st, "text"), j["choices"][0]["text"].get<std::string>());
    // The same prompt again: all but its last token come from the KV cache.
    EXPECT_GT(st.chunks().back()["timings"]["cache_n"].get<int>(), 0);
}

TEST(ServerCompletions, PrefixReuse) {
    test_server s;
    const json first = s.post("/v1/chat/completions", chat_body("Remember this sentence about apples.", 4)).parsed();
    EXPECT_EQ(first["timings"]["cache_n"], 0);
    const json second = s.post("/v1/chat/completions", chat_body("Remember this sentence about pears.", 4)).parsed();
    const int cached = second["timings"]["cache_n"].get<int>();
    EXPECT_GT(cached, 3);
    EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], cached);
    EXPECT_EQ(second["timings"]["prompt_n"].get<int>() + cached, second["usage"]["prompt_tokens"].get<int>());
}

TEST(ServerCompletions, ChatLogprobs) {
    test_server s;
    json body = chat_body("Hello", 6);
    body["logprobs"] = true;
    body["top_logprobs"] = 3;
    body["ignore_eos"] = true;
    const json j = s.post("/v1/chat/completions", body).parsed();
    const json& content = j["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), 6u) << j.dump();
    for (const json& t : content) {
        EXPECT_TRUE(t["token"].is_string());
        EXPECT_LE(t["logprob"].get<double>(), 0.0);
        EXPECT_TRUE(t["bytes"].is_array());
        ASSERT_EQ(t["top_logprobs"].size(), 3u);
        EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
        // Greedy: the chosen token is the most likely one.
        EXPECT_NEAR(t["logprob"].get<double>(), t["top_logprobs"][0]["logprob"].get<double>(), 1e-5);
        EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]);
    }

    body["stream"] = true;
    size_t streamed = 0;
    for (const json& c : s.post_stream("/v1/chat/completions", body).chunks())
        if (!c["choices"].empty() && c["choices"][0]["logprobs"].is_object())
            streamed += c["choices"][0]["logprobs"]["content"].size();
    EXPECT_EQ(streamed, 6u);
}

TEST(ServerCompletions, TextLogprobs) {
    test_server s;
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 2},
                       {"ignore_eos", true}};
    const json choice = s.post("/v1/completions", body).parsed()["choices"][0];
    const json& lp = choice["logprobs"];
    const size_t text_size = choice["text"].get<std::string>().size();
    ASSERT_EQ(lp["tokens"].size(), 5u) << lp.dump();
    ASSERT_EQ(lp["token_logprobs"].size(), 5u);
    ASSERT_EQ(lp["top_logprobs"].size(), 5u);
    ASSERT_EQ(lp["text_offset"].size(), 5u);
    EXPECT_EQ(lp["text_offset"][0], 0);
    for (size_t i = 0; i < 5; ++i) {
        EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
        EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
        EXPECT_LE(lp["text_offset"][i].get<size_t>(), text_size);
        if (i > 0) {
            EXPECT_GE(lp["text_offset"][i].get<int>(), lp["text_offset"][i - 1].get<int>());
        }
    }
    // Streamed, the same tokens arrive one per chunk with the same offsets.
    json sb = body;
    sb["stream"] = true;
    json tokens = json::array(), offsets = json::array();
    for (const json& c : s.post_stream("/v1/completions", sb).chunks())
        if (!c["choices"].empty() && c["choices"][0]["logprobs"].is_object()) {
            tokens.push_back(c["choices"][0]["logprobs"]["tokens"][0]);
            offsets.push_back(c["choices"][0]["logprobs"]["text_offset"][0]);
        }
    EXPECT_EQ(tokens, lp["tokens"]);
    EXPECT_EQ(offsets, lp["text_offset"]);
}

TEST(ServerCompletions, StopString) {
    test_server s;
    json body = {{"prompt", "One two three"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
    const std::string text = s.post("/v1/completions", body).parsed()["choices"][0]["text"].get<std::string>();
    // A stop string of two or three whole characters from the middle of the text.
    const auto boundary = [&](size_t i) { return i >= text.size() || (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80; };
    size_t begin = 4;
    while (!boundary(begin)) ++begin;
    size_t end = begin + 2;
    while (!boundary(end)) ++end;
    ASSERT_LT(end, text.size()) << text;
    const std::string stop = text.substr(begin, end - begin);
    body["stop"] = json::array({stop});
    const json j = s.post("/v1/completions", body).parsed();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), text.substr(0, text.find(stop)));
}

TEST(ServerCompletions, SeedGivesTheSameText) {
    test_server s;
    json body = chat_body("Pick a word.", 12);
    body["temperature"] = 1.0;
    body["seed"] = 1234;
    const auto a = s.post("/v1/chat/completions", body).parsed()["choices"][0]["message"]["content"];
    const auto b = s.post("/v1/chat/completions", body).parsed()["choices"][0]["message"]["content"];
    EXPECT_EQ(a, b);
}

TEST(ServerCompletions, TokenizeDetokenizeModels) {
    test_server s;
    const json t = s.post("/tokenize", json{{"content", "Hello world"}}).parsed();
    ASSERT_TRUE(t["tokens"].is_array());
    ASSERT_FALSE(t["tokens"].empty());
    EXPECT_EQ(s.post("/detokenize", json{{"tokens", t["tokens"]}}).parsed()["content"], "Hello world");
    const json p = s.post("/tokenize", json{{"content", "Hello"}, {"with_pieces", true}}).parsed();
    EXPECT_TRUE(p["tokens"][0].contains("id") && p["tokens"][0].contains("piece")) << p.dump();
    const json m = s.get("/v1/models").parsed();
    EXPECT_EQ(m["object"], "list");
    EXPECT_EQ(m["data"][0]["id"], "tiny.gguf");
    EXPECT_EQ(s.post("/detokenize", json{{"tokens", {1, 999999}}}).status, 400);
}

}  // namespace
}  // namespace strata::server::test
