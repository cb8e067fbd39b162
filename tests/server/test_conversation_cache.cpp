// The conversation cache behind strata-server: two conversations alternating on one server restore
// their history from parked snapshots (timings.cache_n), answer exactly as a fresh server would, and
// /v1/status and /metrics show the cache.
#include <gtest/gtest.h>

#include <spdlog/fmt/fmt.h>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

std::shared_ptr<model> load_tiny(int cache_ram_mib) {
    model_options o;
    o.path = tiny_model_path();
    o.n_ctx = test_ctx;
    o.numa_pool = "off";
    o.cache_ram_mib = cache_ram_mib;
    return model::load(o);
}

json turn_body(const json& messages) {
    return {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true},
            {"logprobs", true},     {"top_logprobs", 3}};
}

// The answer of a server that has seen nothing before, on a model with the cache off.
json fresh_answer(const std::shared_ptr<model>& cold, const json& body) {
    test_server fresh({}, false);
    fresh.server().set_model(cold);
    const reply r = fresh.post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.parsed();
}

TEST(ServerConversationCache, TwoConversationsAlternatingRestoreTheirHistory) {
    const auto m = load_tiny(64);
    const auto cold = load_tiny(0);
    test_server s({}, false);
    s.server().set_model(m);

    const char* topics[2] = {"rivers, bridges and the towns that grew along them",
                             "mountains, glaciers and the weather above the tree line"};
    json history[2] = {json::array(), json::array()};
    int previous_prompt[2] = {0, 0};
    for (int turn = 1; turn <= 5; ++turn) {
        for (int c = 0; c < 2; ++c) {
            history[c].push_back({{"role", "user"},
                                  {"content", fmt::format("Conversation {}, turn {}: tell me more about {}.",
                                                          c == 0 ? "A" : "B", turn, topics[c])}});
            const json body = turn_body(history[c]);
            const reply r = s.post("/v1/chat/completions", body);
            ASSERT_EQ(r.status, 200) << r.body;
            const json j = r.parsed();
            const json reference = fresh_answer(cold, body);
            const std::string where = fmt::format("conversation {} turn {}", c, turn);
            EXPECT_EQ(j["choices"][0]["message"]["content"], reference["choices"][0]["message"]["content"]) << where;
            EXPECT_EQ(j["choices"][0]["logprobs"], reference["choices"][0]["logprobs"]) << where;
            const int prompt = j["usage"]["prompt_tokens"].get<int>();
            const int cache_n = j["timings"]["cache_n"].get<int>();
            if (turn >= 2) {
                EXPECT_GE(cache_n, previous_prompt[c]) << where << ": the earlier history is restored";
            }
            previous_prompt[c] = prompt;
            history[c].push_back({{"role", "assistant"}, {"content", j["choices"][0]["message"]["content"]}});
        }
    }

    const json cc = s.status()["conversation_cache"];
    EXPECT_TRUE(cc["enabled"].get<bool>());
    EXPECT_EQ(cc["budget_bytes"].get<uint64_t>(), uint64_t{64} << 20);
    EXPECT_GE(cc["hits"].get<int>(), 8) << cc.dump();
    EXPECT_GE(cc["entries"].size(), 1u);
    EXPECT_GT(cc["bytes"].get<uint64_t>(), 0u);
    for (const json& e : cc["entries"]) {
        EXPECT_GT(e["tokens"].get<int>(), 0);
        EXPECT_GE(e["idle_s"].get<double>(), 0.0);
    }
    EXPECT_EQ(cc["placement"], "anonymous memory");
    const std::string metrics = s.get("/metrics").body;
    EXPECT_NE(metrics.find("strata_conversation_cache_hits_total " + std::to_string(cc["hits"].get<int>())),
              std::string::npos);
    EXPECT_NE(metrics.find("strata_conversation_cache_bytes "), std::string::npos);
}

}  // namespace
}  // namespace strata::server::test
