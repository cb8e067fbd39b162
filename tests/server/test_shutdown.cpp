// Graceful shutdown: in-process (503 to new and queued requests, the running stream ends at its next
// token, the server stops) and the real strata-server binary under SIGTERM (exit status 0).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <sstream>

#include <httplib.h>

#include "server_fixture.hpp"

extern char** environ;

namespace strata::server::test {
namespace {

TEST(ServerShutdown, InProcess) {
    test_server s({}, hold_model());
    raw_connection stream(s.port());
    stream.send_all(http_post_text("/v1/completions", json{{"prompt", "Keep going"}, {"max_tokens", hold_tokens},
                                                           {"ignore_eos", true}, {"stream", true}}.dump()));
    ASSERT_TRUE(stream.read_until("data: "));
    reply queued;
    std::thread waiting([&] { queued = s.post("/v1/chat/completions", chat_body("waiting", 4)); });
    ASSERT_TRUE(s.wait_for_waiting(1));

    s.server().begin_shutdown();
    const reply fresh = s.post("/v1/chat/completions", chat_body("too late", 4));
    EXPECT_EQ(fresh.status, 503) << fresh.body;
    EXPECT_EQ(fresh.parsed()["error"]["code"], "shutting_down");
    EXPECT_EQ(s.get("/health").status, 503);
    waiting.join();
    EXPECT_EQ(queued.status, 503) << queued.body;
    EXPECT_TRUE(stream.read_until("data: [DONE]")) << stream.received().substr(stream.received().size() - 400);
    EXPECT_NE(stream.received().find("\"shutting_down\""), std::string::npos);
    stream.close();
    EXPECT_TRUE(s.server().wait_idle(std::chrono::seconds(10)));
    EXPECT_EQ(s.status()["state"], "shutting_down");
    s.shut_down();  // stop() and run() returning
}

std::string read_file(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

TEST(ServerShutdown, BinaryExitsZeroOnSigterm) {
    const std::string log_path = tiny_model_path() + ".server.log";
    const std::string secret = "topsecret-7f3a";
    std::vector<std::string> args = {STRATA_SERVER_BIN, "-m", tiny_model_path(), "--port", "0", "--ctx", "256",
                                     "--numa-pool", "off", "--pool-workers", "1"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = {"STRATA_API_KEY=" + secret};
    for (char** e = environ; *e; ++e)
        if (std::string(*e).rfind("STRATA_API_KEY=", 0) != 0) env_strings.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, STRATA_SERVER_BIN, &actions, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);

    int port = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    static const std::regex listening(R"(Listening on http://127\.0\.0\.1:(\d+))");
    while (port == 0 && std::chrono::steady_clock::now() < until) {
        std::smatch m;
        const std::string log = read_file(log_path);
        if (std::regex_search(log, m, listening)) port = std::stoi(m[1]);
        else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(port, 0) << read_file(log_path);
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    int health = 0;
    while (health != 200 && std::chrono::steady_clock::now() < until) {
        const auto r = c.Get("/health");
        health = r ? r->status : 0;
        if (health != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(health, 200) << read_file(log_path);
    const auto unauthorized = c.Post("/v1/chat/completions", chat_body("hi", 4).dump(), "application/json");
    ASSERT_TRUE(unauthorized);
    EXPECT_EQ(unauthorized->status, 401);
    const auto ok = c.Post("/v1/chat/completions", {{"Authorization", "Bearer " + secret}}, chat_body("hi", 4).dump(),
                           "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;

    ASSERT_EQ(kill(pid, SIGTERM), 0);
    int status = -1;
    while (std::chrono::steady_clock::now() < until + std::chrono::seconds(15)) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!WIFEXITED(status)) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    const std::string log = read_file(log_path);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << log;
    EXPECT_NE(log.find("(chat) finished: prompt"), std::string::npos) << log;
    EXPECT_NE(log.find("Received SIGTERM"), std::string::npos) << log;
    EXPECT_EQ(log.find(secret), std::string::npos) << "the API key appears in the log";
}

// stop() before run() (a signal handled before the server listens) is not lost: run() returns at once.
TEST(ServerShutdown, StopBeforeRunIsKept) {
    server_options o;
    o.port = 0;
    http_server srv(o);
    srv.bind();
    srv.stop();
    std::atomic<bool> returned{false};
    std::thread serving([&] {
        srv.run();
        returned = true;
    });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!returned && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_TRUE(returned) << "run() kept serving after stop()";
    if (!returned) srv.stop();
    serving.join();
}

// SIGTERM while the server starts (before it listens, while it loads): it exits 0 all the same. The
// child starts with SIGTERM blocked, as strata-server blocks it first thing, so a signal sent before
// its main() runs waits for it instead of killing it by default action.
TEST(ServerShutdown, EarlySigtermExitsZero) {
    std::vector<std::string> args = {STRATA_SERVER_BIN, "-m", tiny_model_path(), "--port", "0", "--ctx", "256",
                                     "--numa-pool", "off", "--pool-workers", "1"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (const int delay_ms : {0, 10, 50}) {
        SCOPED_TRACE(delay_ms);
        const std::string log_path = tiny_model_path() + ".early.log";
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        sigset_t term;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        posix_spawnattr_setsigmask(&attr, &term);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
        pid_t pid = 0;
        ASSERT_EQ(posix_spawn(&pid, STRATA_SERVER_BIN, &actions, &attr, argv.data(), environ), 0);
        posix_spawn_file_actions_destroy(&actions);
        posix_spawnattr_destroy(&attr);
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        ASSERT_EQ(kill(pid, SIGTERM), 0);
        int status = -1;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (std::chrono::steady_clock::now() < until && waitpid(pid, &status, WNOHANG) != pid)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        const bool exited = WIFEXITED(status);
        if (!exited) kill(pid, SIGKILL), waitpid(pid, &status, 0);
        EXPECT_TRUE(exited && WEXITSTATUS(status) == 0) << "status " << status << "\n" << read_file(log_path);
    }
}

}  // namespace
}  // namespace strata::server::test
