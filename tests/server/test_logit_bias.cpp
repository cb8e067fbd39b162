// logit_bias on both completion endpoints: a bias forces or bans tokens in greedy and sampled
// generation, and bad maps are 400s naming the key and the numbers.
#include <gtest/gtest.h>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

int32_t word_token(const std::string& word) {
    const std::vector<int32_t> ids = tiny_model()->tokenize(word, false, false);
    EXPECT_FALSE(ids.empty()) << word;
    return ids.empty() ? 0 : ids.front();
}

TEST(LogitBias, ForcesATokenOnBothEndpoints) {
    test_server s;
    const int32_t x = word_token(" apple");
    const std::string xxx = tiny_model()->detokenize(std::vector<int32_t>{x, x, x});
    json chat = chat_body("Say something.", 3);
    chat["ignore_eos"] = true;
    chat["logit_bias"] = {{std::to_string(x), 100}};
    const reply c = s.post("/v1/chat/completions", chat);
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_EQ(c.parsed()["choices"][0]["message"]["content"], xxx);

    // Sampled (temperature 1, no truncation) it is just as forced.
    const json text = {{"prompt", "Once upon a time"}, {"max_tokens", 3},     {"temperature", 1.0},
                       {"top_k", 0},                   {"top_p", 1.0},        {"min_p", 0},
                       {"seed", 5},                    {"ignore_eos", true},  {"logit_bias", {{std::to_string(x), 100}}}};
    const reply t = s.post("/v1/completions", text);
    ASSERT_EQ(t.status, 200) << t.body;
    EXPECT_EQ(t.parsed()["choices"][0]["text"], xxx);
}

TEST(LogitBias, BansTheGreedyChoice) {
    test_server s;
    // A prompt whose greedy first token is a whole piece of text (not part of a UTF-8 character), so
    // its id can be found again from the text.
    for (const char* prompt : {"The quick brown fox", "Once upon a time", "Hello there", "1, 2, 3,", "Paris is"}) {
        json body = {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 1}};
        const reply plain = s.post("/v1/completions", body);
        ASSERT_EQ(plain.status, 200) << plain.body;
        const std::string first = plain.parsed()["choices"][0]["logprobs"]["tokens"][0];
        const std::vector<int32_t> ids = tiny_model()->tokenize(first, false, false);
        if (ids.size() != 1 || tiny_model()->detokenize(ids) != first) continue;
        body["logit_bias"] = {{std::to_string(ids[0]), -100}};
        const reply banned = s.post("/v1/completions", body);
        ASSERT_EQ(banned.status, 200) << banned.body;
        EXPECT_NE(banned.parsed()["choices"][0]["logprobs"]["tokens"][0], first) << prompt;
        // A bias too small to matter and an empty map change nothing.
        body["logit_bias"] = {{std::to_string(ids[0]), -1e-6}};
        EXPECT_EQ(s.post("/v1/completions", body).parsed()["choices"][0]["logprobs"]["tokens"][0], first);
        body["logit_bias"] = json::object();
        EXPECT_EQ(s.post("/v1/completions", body).parsed()["choices"][0]["logprobs"]["tokens"][0], first);
        return;
    }
    FAIL() << "no prompt's greedy first token was a whole piece of text";
}

TEST(LogitBias, BadMapsAre400sNamingTheNumbers) {
    test_server s;
    const int n_vocab = tiny_model()->info().n_vocab;
    const std::vector<std::pair<json, std::string>> cases = {
        {json::array({1, 2}), "'logit_bias' must be an object mapping token ids to biases, got an array"},
        {{{"abc", 1}}, "'logit_bias' key \"abc\" is not a token id"},
        {{{"-3", 1}}, "'logit_bias' key \"-3\" is not a token id"},
        {{{std::to_string(n_vocab), 1}},
         "token id " + std::to_string(n_vocab) + " in 'logit_bias' is outside the vocabulary (0.." +
             std::to_string(n_vocab - 1) + ")"},
        {{{"5", 100.5}}, "'logit_bias[\"5\"]' must be between -100 and 100, got 100.5"},
        {{{"5", -101}}, "'logit_bias[\"5\"]' must be between -100 and 100, got -101"},
        {{{"5", "high"}}, "'logit_bias[\"5\"]' must be a number, got a string"},
    };
    for (const auto& [bias, message] : cases) {
        for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
            json body = std::string(path) == "/v1/completions" ? json{{"prompt", "hi"}, {"max_tokens", 1}} : chat_body("hi", 1);
            body["logit_bias"] = bias;
            const reply r = s.post(path, body);
            ASSERT_EQ(r.status, 400) << path << " " << bias.dump() << ": " << r.body;
            const json e = r.parsed()["error"];
            EXPECT_NE(e["message"].get<std::string>().find(message), std::string::npos) << e.dump();
            EXPECT_EQ(e["param"].get<std::string>().rfind("logit_bias", 0), 0u) << e.dump();
        }
    }
}

}  // namespace
}  // namespace strata::server::test
