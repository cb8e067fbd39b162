// Long prompts stay interruptible: a client that disconnects, the request timeout and a shutdown each
// stop a prompt of thousands of tokens between batches, and a queued request whose client left never
// runs. The assertions count prompt tokens evaluated (/metrics) against the prompt's length; times are
// compared with the prompt speed measured in the same process.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>


#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr int n_long = 3000;  // prompt tokens: 188 batches of long_batch

// Token ids 1.. in a fixed pattern, so no two long prompts share more than their start with a short one.
std::vector<int> prompt_ids(int n, int first) {
    const int n_vocab = long_prompt_model()->info().n_vocab;
    std::vector<int> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[size_t(i)] = 1 + (first + i * 31) % (n_vocab - 2);
    return ids;
}

json long_body(bool stream = false, int first = 0) {
    return {{"prompt", prompt_ids(n_long, first)}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true},
            {"stream", stream}};
}

// Seconds per prompt token at the start of the context, measured once on a session of its own (the
// long prompt's own tokens come slower, deeper in the context, so times derived from this are low).
double prompt_s_per_token() {
    static const double s = [] {
        session probe(long_prompt_model());
        generation_options o;
        o.max_tokens = 1;
        const generation_result r = probe.generate(prompt_ids(512, 7), o);
        return r.time.prompt_ms / 1000.0 / r.time.prompt_n;
    }();
    return s;
}

double metric(const test_server& s, const std::string& sample) {
    const std::string text = s.get("/metrics").body;
    const size_t at = text.find("\n" + sample + " ");
    return at == std::string::npos ? 0 : std::stod(text.substr(at + sample.size() + 2));
}

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto until = clock_type::now() + timeout;
    while (!done()) {
        if (clock_type::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

bool running(const test_server& s) { return !s.status()["queue"]["running"].is_null(); }

// A short request after the long one: its own prompt tokens, evaluated (not reused), and its wait.
struct next_request {
    int evaluated = 0;
    double queue_s = 0;
};

next_request serve_next(const test_server& s) {
    const reply r = s.post("/v1/completions", json{{"prompt", "Next, please"}, {"max_tokens", 2}, {"temperature", 0}});
    EXPECT_EQ(r.status, 200) << r.body;
    const json usage = r.parsed()["usage"];
    return {usage["prompt_tokens"].get<int>() - usage["prompt_tokens_details"]["cached_tokens"].get<int>(),
            s.status()["last_request"]["queue_s"].get<double>()};
}

TEST(ServerLongPrompt, ClientDisconnectStopsThePrompt) {
    const double full_s = n_long * prompt_s_per_token();
    const log_capture log;
    test_server s({}, long_prompt_model());
    raw_connection c(s.port());
    c.send_all(http_post_text("/v1/completions", long_body().dump()));
    ASSERT_TRUE(wait_until([&] { return running(s); }));
    c.close();

    const next_request next = serve_next(s);
    const double evaluated = metric(s, "strata_prompt_tokens_total") - next.evaluated;
    std::printf("the long prompt stopped after %.0f of %d tokens (its whole evaluation: at least %.2f s); the next "
                "request waited %.3f s\n", evaluated, n_long, full_s, next.queue_s);
    EXPECT_EQ(metric(s, "strata_generations_total{stopped_by=\"client disconnected\"}"), 1);
    EXPECT_LT(evaluated, n_long / 2);
    EXPECT_LT(next.queue_s, full_s / 2);
    EXPECT_NE(log.text().find("stopped by client disconnected during the prompt"), std::string::npos) << log.text();
}

TEST(ServerLongPrompt, RequestTimeoutStopsThePrompt) {
    server_options o;
    // A tenth of the prompt's time at this build's measured speed: far into the prompt, far from its
    // end, and well inside the test client's 60 s read timeout on a sanitizer build too.
    o.request_timeout_s = n_long * prompt_s_per_token() / 10;
    const log_capture log;
    test_server s(o, long_prompt_model());
    const reply r = s.post("/v1/completions", long_body());
    ASSERT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.parsed()["error"]["code"], "timeout");
    EXPECT_NE(r.body.find("was still being evaluated"), std::string::npos) << r.body;

    const json last = s.status()["last_request"];
    EXPECT_EQ(last["stopped_by"], "timeout");
    const int evaluated = last["timings"]["prompt_n"].get<int>();
    std::printf("--timeout %.2f s stopped the prompt after %d of %d tokens\n", o.request_timeout_s, evaluated, n_long);
    EXPECT_LT(evaluated, n_long / 2);
    EXPECT_NE(log.text().find("stopped by timeout during the prompt"), std::string::npos) << log.text();
}

TEST(ServerLongPrompt, ShutdownStopsThePrompt) {
    const double full_s = n_long * prompt_s_per_token();
    test_server s({}, long_prompt_model());
    raw_connection c(s.port());
    c.send_all(http_post_text("/v1/completions", long_body(true).dump()));
    ASSERT_TRUE(wait_until([&] { return running(s); }));

    const auto t0 = clock_type::now();
    s.server().begin_shutdown();
    ASSERT_TRUE(s.server().wait_idle(std::chrono::seconds(20)));
    const double idle_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    EXPECT_TRUE(c.read_until("data: [DONE]")) << c.received();
    EXPECT_NE(c.received().find("\"shutting_down\""), std::string::npos) << c.received();
    const int evaluated = s.status()["last_request"]["timings"]["prompt_n"].get<int>();
    std::printf("shutdown: idle %.3f s later, after %d of %d prompt tokens (the whole prompt: at least %.2f s)\n",
                idle_s, evaluated, n_long, full_s);
    EXPECT_LT(evaluated, n_long / 2);
    EXPECT_LT(idle_s, full_s / 2);
    c.close();
    s.shut_down();
}

TEST(ServerLongPrompt, QueuedRequestWhoseClientLeftNeverRuns) {
    const log_capture log;
    test_server s({}, long_prompt_model());
    raw_connection first(s.port());
    first.send_all(http_post_text("/v1/completions", long_body(false, 0).dump()));
    ASSERT_TRUE(wait_until([&] { return running(s); }));
    const uint64_t first_id = s.status()["queue"]["running"].get<uint64_t>();
    raw_connection second(s.port());
    second.send_all(http_post_text("/v1/completions", long_body(false, 5).dump()));
    ASSERT_TRUE(s.wait_for_waiting(1));

    second.close();
    ASSERT_TRUE(wait_until([&] { return s.status()["queue"]["n_waiting"].get<int>() == 0; }));
    EXPECT_EQ(s.status()["queue"]["running"], first_id) << "the first prompt ended before the second client left";
    first.close();

    const next_request next = serve_next(s);
    const double evaluated = metric(s, "strata_prompt_tokens_total") - next.evaluated;
    EXPECT_EQ(metric(s, "strata_generations_total{stopped_by=\"client disconnected\"}"), 1);  // the first only
    EXPECT_LT(evaluated, n_long / 2);
    EXPECT_NE(log.text().find("left the queue: its client disconnected"), std::string::npos) << log.text();
}

}  // namespace
}  // namespace strata::server::test
