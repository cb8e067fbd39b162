// --parallel: several generations at once, their tokens in shared engine steps; each answer is what it
// is alone; /v1/status and /metrics show the slots and the steps; a client that stops reading its
// stream ends only its own request (--write-timeout), never the others'.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

using clock_type = std::chrono::steady_clock;

json text_body(const std::string& prompt, int max_tokens, bool stream = false) {
    return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
}

double metric(const std::string& text, const std::string& sample) {
    const size_t at = text.find("\n" + sample + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + sample.size() + 2));
}

server_options parallel(int n, double write_timeout_s = 30) {
    server_options o;
    o.parallel = n;
    o.write_timeout_s = write_timeout_s;
    return o;
}

// Waits until no request holds a slot (false after the timeout).
bool wait_idle_slots(const test_server& s, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto until = clock_type::now() + timeout;
    while (!s.status()["queue"]["running_all"].empty())
        if (clock_type::now() >= until) return false;
        else std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return true;
}

TEST(ServerParallel, AnswersBesideARunningStreamAreTheirSoloAnswers) {
    const std::vector<std::string> prompts{"The first client asks about rivers.", "A second one wants a poem",
                                           "Third: tell me about the weather today, please."};
    std::vector<std::string> solo;
    {
        test_server s(parallel(1), hold_model());
        for (const auto& p : prompts) {
            const reply r = s.post("/v1/completions", text_body(p, 20));
            ASSERT_EQ(r.status, 200) << r.body;
            solo.push_back(r.parsed()["choices"][0]["text"].get<std::string>());
        }
    }
    test_server s(parallel(4), hold_model());
    // A long stream decodes the whole time, so every other answer shares its steps.
    raw_connection hold(s.port());
    hold.send_all(http_post_text("/v1/completions", text_body("Hold a slot for a while.", hold_tokens, true).dump()));
    ASSERT_TRUE(hold.read_until("data: ")) << hold.received();
    const json q = s.status()["queue"];
    EXPECT_EQ(q["parallel"], 4);
    EXPECT_GT(q["budget"].get<int>(), 0);
    ASSERT_EQ(q["slots"].size(), 4u);
    EXPECT_EQ(q["running_all"].size(), 1u);

    std::vector<reply> replies(prompts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i)
        clients.emplace_back([&, i] { replies[i] = s.post("/v1/completions", text_body(prompts[i], 20)); });
    for (auto& t : clients) t.join();
    const json during = s.status()["queue"];
    int decoding = 0;
    for (const json& slot : during["slots"]) decoding += slot["state"] == "decoding";
    EXPECT_EQ(decoding, 1) << during.dump();  // the stream, still going
    for (size_t i = 0; i < prompts.size(); ++i) {
        ASSERT_EQ(replies[i].status, 200) << replies[i].body;
        EXPECT_EQ(replies[i].parsed()["choices"][0]["text"].get<std::string>(), solo[i]) << "client " << i;
    }
    const std::string m = s.get("/metrics").body;
    EXPECT_EQ(metric(m, "strata_slots"), 4);
    EXPECT_GT(metric(m, "strata_batch_rows_total"), metric(m, "strata_batch_steps_total"))
        << "no step held more than one row";
    hold.close();
    EXPECT_TRUE(wait_idle_slots(s));
}

TEST(ServerParallel, AClientThatStopsReadingEndsOnlyItsOwnRequest) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    // The kernel's send buffer on loopback grows to megabytes before a write blocks: thousands of tokens,
    // more than a minute at a sanitizer's decode speed.
    GTEST_SKIP() << "filling the socket buffers takes minutes at a sanitizer build's decode speed";
#endif
    log_capture logs;
    test_server s(parallel(2, 1.0), hold_model());
    // A small receive window: the server's writes to it block soon after it stops reading.
    raw_connection stuck(s.port(), 4096);
    // Twenty top logprobs make each event several hundred bytes, so the socket buffers (megabytes on
    // loopback) fill after a few thousand tokens instead of most of hold_tokens.
    json body = text_body("Nobody reads this answer.", hold_tokens, true);
    body["logprobs"] = 20;
    stuck.send_all(http_post_text("/v1/completions", body.dump()));
    ASSERT_TRUE(stuck.read_until("data: ")) << stuck.received();
    // From here on it reads nothing. Another client is served in full meanwhile.
    for (int i = 0; i < 3; ++i) {
        const reply r = s.post("/v1/completions", text_body("Am I held up? " + std::to_string(i), 16));
        ASSERT_EQ(r.status, 200) << r.body;
        EXPECT_EQ(r.parsed()["usage"]["completion_tokens"], 16);
    }
    ASSERT_TRUE(wait_idle_slots(s)) << "the stuck stream should end after --write-timeout";
    const std::string m = s.get("/metrics").body;
    EXPECT_EQ(metric(m, "strata_generations_total{stopped_by=\"client disconnected\"}"), 1);
    EXPECT_LT(metric(m, "strata_completion_tokens_total"), 3 * 16 + hold_tokens);
}

}  // namespace
}  // namespace strata::server::test
