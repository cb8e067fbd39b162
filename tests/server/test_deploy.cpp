// What a load balancer relies on: the conversation key (prompt_cache_key, user, X-Conversation-Id)
// scopes the KV and conversation caches, /health/live and /health/ready, and the drain (readiness
// fails, new generations get 503 with Retry-After, admitted ones finish; POST /admin/drain).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <sstream>

#include <spdlog/fmt/fmt.h>

#include "server_fixture.hpp"

extern char** environ;

namespace strata::server::test {
namespace {

std::shared_ptr<model> load_with_cache() {
    model_options o;
    o.path = tiny_model_path();
    o.n_ctx = test_ctx;
    o.numa_pool = "off";
    o.cache_ram_mib = 64;
    return model::load(o);
}

// A prompt well past conversation_cache::min_tail_tokens, so a session's state is parked when it moves on.
json long_prompt(json extra = json::object()) {
    std::string text = "A long shared preamble about rivers, bridges and towns. ";
    for (int i = 0; i < 4; ++i) text += text;
    json b = {{"prompt", text}, {"max_tokens", 4}, {"temperature", 0}};
    b.update(extra);
    return b;
}

int cache_n(const reply& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.parsed()["timings"]["cache_n"].get<int>() : -1;
}

TEST(ServerConversationScope, AKeyNeverReusesAnotherKeysPrompt) {
    test_server s({}, false);
    s.server().set_model(load_with_cache());
    const reply a = s.post("/v1/completions", long_prompt({{"prompt_cache_key", "alice"}}));
    const int n = a.parsed()["usage"]["prompt_tokens"].get<int>();
    ASSERT_GT(n, 64);
    // The same prompt under another key, a user, no key: nothing of alice's is reused.
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt({{"prompt_cache_key", "bob"}}))), 0);
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt({{"user", "carol"}}))), 0);
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt())), 0);
    // Alice again, by body and by header: her parked prompt comes back whole (all but the last token).
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt({{"prompt_cache_key", "alice"}}))), n - 1);
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt(), {{"X-Conversation-Id", "bob"}})), n - 1);
    // The header names the conversation ahead of the body's key; user counts when no key is given.
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt({{"prompt_cache_key", "bob"}}),
                             {{"X-Conversation-Id", "alice"}})), n - 1);
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt({{"user", "carol"}}))), n - 1);
    EXPECT_EQ(cache_n(s.post("/v1/completions", long_prompt({{"user", "carol"}, {"prompt_cache_key", "dave"}}))), 0);
}

TEST(ServerConversationScope, BadKeysAreRefusedByName) {
    test_server s;
    const auto code_of = [](const reply& r) { return r.status == 400 ? r.parsed()["error"]["param"] : json(); };
    EXPECT_EQ(code_of(s.post("/v1/completions", long_prompt({{"prompt_cache_key", std::string(300, 'k')}}))),
              "prompt_cache_key");
    EXPECT_EQ(code_of(s.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                            {"user", 42}})), "user");
    EXPECT_EQ(code_of(s.post("/v1/completions", long_prompt(), {{"X-Conversation-Id", std::string(300, 'x')}})),
              "X-Conversation-Id");
    const reply r = s.post("/v1/completions", long_prompt({{"prompt_cache_key", std::string(256, 'k')}}));
    EXPECT_EQ(r.status, 200) << r.body;
}

TEST(ServerHealth, LiveAlwaysReadyOnlyWhenServing) {
    test_server loading({}, false);
    EXPECT_EQ(loading.get("/health/live").status, 200);
    const reply not_ready = loading.get("/health/ready");
    EXPECT_EQ(not_ready.status, 503);
    EXPECT_EQ(not_ready.parsed()["error"]["code"], "loading");
    loading.server().set_model(tiny_model());
    const reply ready = loading.get("/health/ready");
    EXPECT_EQ(ready.status, 200) << ready.body;
    EXPECT_EQ(ready.parsed()["status"], "ready");
    EXPECT_NE(loading.get("/metrics").body.find("\nstrata_ready 1\n"), std::string::npos);
}

// A generation holds the engine while two more wait: past --ready-max-waiting 1 the replica is busy,
// and the probes are answered at once all the same.
TEST(ServerHealth, ReadinessFailsPastTheQueueThreshold) {
    server_options o;
    o.ready_max_waiting = 1;
    test_server s(o, hold_model());
    raw_connection holder(s.port());
    const std::string body = json{{"prompt", "hold"}, {"max_tokens", hold_tokens}, {"ignore_eos", true},
                                  {"stream", true}}.dump();
    holder.send_all(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: {}\r\n\r\n{}", body.size(), body));
    ASSERT_TRUE(holder.read_until("data: "));
    std::vector<std::unique_ptr<raw_connection>> waiting;
    for (int i = 0; i < 2; ++i) {
        waiting.push_back(std::make_unique<raw_connection>(s.port()));
        waiting.back()->send_all(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                             "application/json\r\nContent-Length: {}\r\n\r\n{}", body.size(), body));
        if (i == 0) {
            ASSERT_TRUE(s.wait_for_waiting(1));
            EXPECT_EQ(s.get("/health/ready").status, 200) << "one waiting is not past 1";
        }
    }
    ASSERT_TRUE(s.wait_for_waiting(2));
    const reply busy = s.get("/health/ready");
    EXPECT_EQ(busy.status, 503);
    EXPECT_EQ(busy.parsed()["error"]["code"], "busy");
    EXPECT_EQ(s.get("/health/live").status, 200);
    for (auto& w : waiting) w->close();
    holder.close();
}

// Draining: not ready, a new generation is refused before it starts (503, Retry-After, "draining"),
// the admitted one keeps generating, liveness and reads still answer.
TEST(ServerDrain, RefusesNewGenerationsAndLetsTheRunningOneGoOn) {
    test_server s({}, hold_model());
    raw_connection holder(s.port());
    const std::string body = json{{"prompt", "hold"}, {"max_tokens", hold_tokens}, {"ignore_eos", true},
                                  {"stream", true}}.dump();
    holder.send_all(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: {}\r\n\r\n{}", body.size(), body));
    ASSERT_TRUE(holder.read_until("data: "));
    EXPECT_TRUE(s.server().begin_drain());
    EXPECT_FALSE(s.server().begin_drain()) << "a second drain is a no-op";
    EXPECT_TRUE(s.server().draining());

    const reply ready = s.get("/health/ready");
    EXPECT_EQ(ready.status, 503);
    EXPECT_EQ(ready.parsed()["error"]["code"], "draining");
    EXPECT_EQ(s.get("/health/live").status, 200);
    EXPECT_EQ(s.get("/health").status, 200);
    const reply refused = s.post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}});
    EXPECT_EQ(refused.status, 503);
    EXPECT_EQ(refused.parsed()["error"]["code"], "draining");
    EXPECT_EQ(refused.header("Retry-After"), "1");
    EXPECT_EQ(s.post("/tokenize", json{{"content", "hi"}}).status, 200) << "what does not generate still answers";
    EXPECT_EQ(s.server().in_flight(), 1);
    const std::string metrics = s.get("/metrics").body;
    EXPECT_NE(metrics.find("\nstrata_draining 1\n"), std::string::npos);
    EXPECT_NE(metrics.find("\nstrata_ready 0\n"), std::string::npos);
    EXPECT_NE(metrics.find("\nstrata_requests_in_flight 1\n"), std::string::npos);
    EXPECT_EQ(s.status()["state"], "draining");

    // The admitted stream still produces tokens after the drain began.
    const size_t before = holder.received().size();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (holder.received().size() < before + 2000 && std::chrono::steady_clock::now() < until)
        holder.read_until("\x01", std::chrono::milliseconds(50));
    EXPECT_GE(holder.received().size(), before + 2000) << "the running generation stopped at the drain";
    holder.close();
    EXPECT_TRUE(s.server().wait_idle(std::chrono::seconds(20)));
}

TEST(ServerDrain, AdminRouteNeedsTheAdminKeyAndCallsTheHookOnce) {
    test_server off;
    const reply forbidden = off.post("/admin/drain", std::string());
    EXPECT_EQ(forbidden.status, 403);
    EXPECT_EQ(forbidden.parsed()["error"]["code"], "admin_disabled");
    EXPECT_FALSE(off.server().draining());

    server_options o;
    o.api_key = "user-key";
    o.admin_key = "admin-key";
    test_server s(o, false);
    s.server().set_model(tiny_model());
    std::atomic<int> hooks{0};
    s.server().on_drain_requested([&hooks] { ++hooks; });
    EXPECT_EQ(s.post("/admin/drain", std::string()).status, 401);
    EXPECT_EQ(s.post("/admin/drain", std::string(), {{"Authorization", "Bearer user-key"}}).status, 401)
        << "the API key is not the admin key";
    EXPECT_FALSE(s.server().draining());
    const reply first = s.post("/admin/drain", std::string(), {{"Authorization", "Bearer admin-key"}});
    EXPECT_EQ(first.status, 202) << first.body;
    EXPECT_TRUE(first.parsed()["started"].get<bool>());
    const reply second = s.post("/admin/drain", std::string(), {{"x-api-key", "admin-key"}});
    EXPECT_EQ(second.status, 202);
    EXPECT_FALSE(second.parsed()["started"].get<bool>());
    EXPECT_EQ(hooks.load(), 1);
    EXPECT_TRUE(s.server().draining());
    EXPECT_EQ(s.server().park_conversation(), 0u) << "nothing generated yet: nothing to park";
}

// The strata-server binary, its output in a file, on a free port, with a model loaded.
class spawned_server {
public:
    explicit spawned_server(std::vector<std::string> flags) : log_path_(tiny_model_path() + ".drain.log") {
        std::vector<std::string> args = {STRATA_SERVER_BIN, "-m", tiny_model_path(), "--port", "0", "--numa-pool", "off",
                                         "--pool-workers", "1"};
        args.insert(args.end(), flags.begin(), flags.end());
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
        const int spawned = posix_spawn(&pid_, STRATA_SERVER_BIN, &actions, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        if (spawned != 0) throw std::runtime_error("cannot start strata-server");
        static const std::regex listening(R"(Listening on http://127\.0\.0\.1:(\d+))");
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (std::chrono::steady_clock::now() < until && log().find("Ready.") == std::string::npos)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::smatch m;
        const std::string text = log();
        if (std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
    }
    ~spawned_server() {
        if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0) kill(pid_, SIGKILL), waitpid(pid_, nullptr, 0);
    }
    spawned_server(const spawned_server&) = delete;
    spawned_server& operator=(const spawned_server&) = delete;

    int port() const { return port_; }
    std::string log() const {
        std::ifstream f(log_path_);
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    }
    bool wait_for_log(const std::string& needle, std::chrono::seconds timeout = std::chrono::seconds(30)) const {
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (log().find(needle) == std::string::npos) {
            if (std::chrono::steady_clock::now() >= until) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return true;
    }
    void signal(int sig) const { kill(pid_, sig); }
    // The exit status (-1: still running after the timeout, then killed).
    int wait_exit(std::chrono::seconds timeout = std::chrono::seconds(60)) {
        int status = 0;
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (waitpid(pid_, &status, WNOHANG) != pid_) {
            if (std::chrono::steady_clock::now() >= until) return -1;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

private:
    std::string log_path_;
    pid_t pid_ = -1;
    int port_ = 0;
};

void start_stream(raw_connection& c, int max_tokens) {
    const std::string body = json{{"prompt", "drain"}, {"max_tokens", max_tokens}, {"ignore_eos", true},
                                  {"temperature", 0}, {"stream", true}}.dump();
    c.send_all(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: {}\r\n\r\n{}", body.size(), body));
}

// SIGTERM with a stream running: it runs to its end ([DONE], finish_reason length), new requests in
// the meantime are refused, and the process exits 0 after the drain.
TEST(ServerDrainBinary, SigtermLetsTheRunningStreamFinish) {
    spawned_server srv({"--ctx", "2048", "--drain-timeout", "60"});
    ASSERT_GT(srv.port(), 0) << srv.log();
    raw_connection stream(srv.port());
    start_stream(stream, 1500);
    ASSERT_TRUE(stream.read_until("data: ")) << srv.log();
    srv.signal(SIGTERM);
    ASSERT_TRUE(srv.wait_for_log("draining")) << srv.log();
    ASSERT_TRUE(stream.read_until("data: [DONE]", std::chrono::seconds(60))) << srv.log();
    EXPECT_NE(stream.received().find("\"finish_reason\":\"length\""), std::string::npos);
    EXPECT_EQ(stream.received().find("shutting_down"), std::string::npos);
    EXPECT_EQ(srv.wait_exit(), 0) << srv.log();
    EXPECT_NE(srv.log().find("Drained in"), std::string::npos) << srv.log();
}

// A second SIGTERM, or the drain timeout, stops the running generation as a plain shutdown does.
TEST(ServerDrainBinary, SecondSigtermOrTimeoutStopsTheGeneration) {
    for (const bool second_signal : {true, false}) {
        SCOPED_TRACE(second_signal ? "second SIGTERM" : "drain timeout");
        spawned_server srv({"--ctx", std::to_string(hold_ctx), "--drain-timeout", second_signal ? "600" : "0.5"});
        ASSERT_GT(srv.port(), 0) << srv.log();
        raw_connection stream(srv.port());
        start_stream(stream, hold_tokens);
        ASSERT_TRUE(stream.read_until("data: ")) << srv.log();
        srv.signal(SIGTERM);
        ASSERT_TRUE(srv.wait_for_log("draining")) << srv.log();
        if (second_signal) srv.signal(SIGTERM);
        ASSERT_TRUE(stream.read_until("shutting_down", std::chrono::seconds(60))) << srv.log();
        EXPECT_EQ(srv.wait_exit(), 0) << srv.log();
        EXPECT_NE(srv.log().find(second_signal ? "while draining" : "after --drain-timeout"), std::string::npos)
            << srv.log();
        EXPECT_EQ(srv.log().find("Drained in"), std::string::npos);
    }
}

}  // namespace
}  // namespace strata::server::test
