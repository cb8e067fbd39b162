// The server under connection-level abuse, over loopback: slow and idle clients hold no thread and
// are cut off at their deadlines, deep bodies cost bounded memory, framing that could be read two
// ways is refused, HTTP/1.0 streams are not chunked, and a client that leaves over IPv6 stops its
// generation.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>
#include <spdlog/fmt/fmt.h>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A TCP client to 127.0.0.1 or ::1.
class client {
public:
    client(const std::string& host, int port) {
        const bool v6 = host.find(':') != std::string::npos;
        fd_ = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
        sockaddr_storage a{};
        socklen_t len = 0;
        if (v6) {
            auto& a6 = reinterpret_cast<sockaddr_in6&>(a);
            a6.sin6_family = AF_INET6;
            a6.sin6_port = htons(static_cast<uint16_t>(port));
            inet_pton(AF_INET6, host.c_str(), &a6.sin6_addr);
            len = sizeof a6;
        } else {
            auto& a4 = reinterpret_cast<sockaddr_in&>(a);
            a4.sin_family = AF_INET;
            a4.sin_port = htons(static_cast<uint16_t>(port));
            inet_pton(AF_INET, host.c_str(), &a4.sin_addr);
            len = sizeof a4;
        }
        if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0)
            throw std::runtime_error("cannot connect to " + host + ":" + std::to_string(port));
    }
    ~client() { close(); }
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    bool send_all(std::string_view bytes) {
        while (!bytes.empty()) {
            const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
            if (n <= 0) return false;
            bytes.remove_prefix(static_cast<size_t>(n));
        }
        return true;
    }
    // Reads until `needle` arrives (true), the peer closes or the timeout passes (false).
    bool read_until(const std::string& needle, std::chrono::milliseconds timeout = 20s) {
        const auto until = clock_type::now() + timeout;
        while (received_.find(needle) == std::string::npos)
            if (!read_some(until)) return false;
        return true;
    }
    // Reads until the peer closes (true) or the timeout passes (false).
    bool read_to_close(std::chrono::milliseconds timeout = 20s) {
        const auto until = clock_type::now() + timeout;
        while (read_some(until)) {}
        return closed_;
    }
    // Reads one whole answer with a Content-Length; false when it does not arrive in time.
    bool read_response(std::chrono::milliseconds timeout = 20s) {
        if (!read_until("\r\n\r\n", timeout)) return false;
        const size_t head_end = received_.find("\r\n\r\n") + 4;
        const size_t at = received_.find("Content-Length: ");
        if (at == std::string::npos || at > head_end) return false;
        const size_t length = std::stoull(received_.substr(at + 16));
        const auto until = clock_type::now() + timeout;
        while (received_.size() < head_end + length)
            if (!read_some(until)) return false;
        return true;
    }
    const std::string& received() const { return received_; }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    bool read_some(clock_type::time_point until) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
        if (closed_ || left.count() <= 0) return false;
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
        char buf[65536];
        const ssize_t n = recv(fd_, buf, sizeof buf, 0);
        if (n <= 0) {
            closed_ = true;
            return false;
        }
        received_.append(buf, static_cast<size_t>(n));
        return true;
    }

    int fd_ = -1;
    bool closed_ = false;
    std::string received_;
};

std::string post_head(const std::string& path, size_t length, const std::string& extra = {},
                      const std::string& version = "HTTP/1.1") {
    return "POST " + path + " " + version + "\r\nHost: test\r\nContent-Type: application/json\r\n" + extra +
           "Content-Length: " + std::to_string(length) + "\r\n\r\n";
}

// The JSON body of a whole answer read so far (after the head).
json body_of(const std::string& response) {
    const size_t at = response.find("\r\n\r\n");
    return at == std::string::npos ? json() : json::parse(response.substr(at + 4), nullptr, false);
}

bool raise_descriptor_limit(rlim_t need) {
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) != 0) return false;
    if (r.rlim_cur >= need) return true;
    if (r.rlim_max < need) return false;
    r.rlim_cur = need;
    return setrlimit(RLIMIT_NOFILE, &r) == 0;
}

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

TEST(ServerConnections, SlowAndIdleClientsDoNotDelayOthers) {
    constexpr int n_idle = 500, n_slow = 64, n_requests = 20;
    // Both ends of every connection are in this process.
    if (!raise_descriptor_limit(2 * (n_idle + n_slow) + 512))
        GTEST_SKIP() << "the descriptor limit (ulimit -n) is too low for " << n_idle + n_slow << " connections";
    log_capture log;
    server_options o;
    o.header_timeout_s = 3;
    o.body_timeout_s = 3;
    o.max_connections_per_client = 0;  // every client here is 127.0.0.1
    test_server s(o);

    std::vector<std::unique_ptr<client>> idle, slow;
    for (int i = 0; i < n_idle; ++i) idle.push_back(std::make_unique<client>("127.0.0.1", s.port()));
    // Even ones send their headers a line at a time, odd ones their body a byte at a time.
    for (int i = 0; i < n_slow; ++i) {
        slow.push_back(std::make_unique<client>("127.0.0.1", s.port()));
        slow.back()->send_all(i % 2 ? post_head("/v1/chat/completions", 100000)
                                    : std::string("POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"));
    }
    std::atomic<bool> trickling{true};
    std::promise<void> first_round;
    std::thread trickle([&] {
        for (bool first = true; trickling; first = false) {
            for (size_t i = 0; i < slow.size(); ++i) slow[i]->send_all(i % 2 ? "[" : "X-Slow: 1\r\n");
            if (first) first_round.set_value();
            std::this_thread::sleep_for(200ms);
        }
    });
    first_round.get_future().wait();

    std::vector<double> ms;
    for (int i = 0; i < n_requests; ++i) {
        const auto t0 = clock_type::now();
        const reply r = i % 2 ? s.post("/v1/chat/completions", chat_body("hi", 2)) : s.get("/health");
        ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        EXPECT_EQ(r.status, 200) << r.body;
    }
    std::printf("%d requests beside %d idle and %d slow connections: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
                n_requests, n_idle, n_slow, percentile(ms, 0.5), percentile(ms, 0.99),
                *std::max_element(ms.begin(), ms.end()));
    // Answered while every slow connection still held its place: none has had its 408 yet. (Requests
    // queued behind them would be answered only once their deadlines freed the server.)
    for (size_t i = 0; i < slow.size(); ++i) {
        slow[i]->read_until("HTTP/1.1", 1ms);  // what has arrived, without waiting
        EXPECT_EQ(slow[i]->received(), "") << "slow connection " << i << " was answered before the requests beside it";
    }

    // The slow ones are answered 408 at their deadline although they keep sending; the idle ones closed.
    for (size_t i = 0; i < slow.size(); ++i) {
        ASSERT_TRUE(slow[i]->read_until("\"code\":\"timeout\"", 10s)) << i << ": " << slow[i]->received();
        EXPECT_EQ(slow[i]->received().rfind("HTTP/1.1 408", 0), 0u) << slow[i]->received();
        EXPECT_NE(slow[i]->received().find(i % 2 ? "--body-timeout" : "--header-timeout"), std::string::npos)
            << slow[i]->received();
    }
    trickling = false;
    trickle.join();
    for (auto& c : idle) EXPECT_TRUE(c->read_to_close(10s));
    // One line for the first, the rest summed up a minute later.
    EXPECT_EQ(log.count("Closed the connection from"), 1u);
}

// Peak resident memory since the last reset and current, in bytes (Linux: /proc/self/status).
size_t vm_bytes(const std::string& field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
    return 0;
}

TEST(ServerConnections, DeepBodiesCostBoundedMemory) {
    constexpr int n = 16;
    constexpr size_t size = 8u << 20;
    test_server s;
    const std::string body(size, '[');
    const std::string head = post_head("/v1/chat/completions", size);
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to VmRSS
    const size_t base = vm_bytes("VmRSS");

    std::vector<std::string> answers(n);
    std::vector<std::thread> clients;
    for (int i = 0; i < n; ++i)
        clients.emplace_back([&, i] {
            client c("127.0.0.1", s.port());
            if (c.send_all(head) && c.send_all(body)) c.read_response(60s);
            answers[size_t(i)] = c.received();
        });
    for (std::thread& t : clients) t.join();
    const size_t peak = vm_bytes("VmHWM"), after = vm_bytes("VmRSS");
    std::printf("%d concurrent bodies of 8 MiB '[': peak RSS %.1f MiB above the idle server, %.1f MiB after\n", n,
                double(peak - base) / (1 << 20), (double(after) - double(base)) / (1 << 20));
    for (const std::string& a : answers) {
        EXPECT_EQ(a.rfind("HTTP/1.1 400", 0), 0u) << a.substr(0, 300);
        const json e = body_of(a);
        ASSERT_TRUE(e.contains("error")) << a.substr(0, 300);
        EXPECT_EQ(e["error"]["code"], "too_deep");
        EXPECT_NE(e["error"]["message"].get<std::string>().find("64 levels"), std::string::npos) << e.dump();
    }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "resident memory under a sanitizer says nothing about the server's";
#else
    EXPECT_LT(peak - base, size_t(200) << 20);
#endif
}

TEST(ServerConnections, ChunkedWithContentLengthIsRefused) {
    test_server s;
    const std::string body = chat_body("hi", 2).dump();
    client both("127.0.0.1", s.port());
    both.send_all(post_head("/v1/chat/completions", body.size(), "Transfer-Encoding: chunked\r\n") + body);
    ASSERT_TRUE(both.read_response());
    EXPECT_EQ(both.received().rfind("HTTP/1.1 400", 0), 0u) << both.received();
    EXPECT_NE(body_of(both.received())["error"]["message"].get<std::string>().find("Transfer-Encoding"),
              std::string::npos);

    // Chunked alone is read and decoded.
    client chunked("127.0.0.1", s.port());
    const size_t half = body.size() / 2;
    chunked.send_all(fmt::format("POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                                 "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
                                 half, body.substr(0, half), body.size() - half, body.substr(half)));
    ASSERT_TRUE(chunked.read_response());
    EXPECT_EQ(chunked.received().rfind("HTTP/1.1 200", 0), 0u) << chunked.received();
    EXPECT_EQ(body_of(chunked.received())["object"], "chat.completion");
}

TEST(ServerConnections, ExpectContinueOverTheLimitIs413AtOnce) {
    test_server s;
    client big("127.0.0.1", s.port());
    big.send_all(post_head("/v1/chat/completions", 50u << 20, "Expect: 100-continue\r\n"));
    ASSERT_TRUE(big.read_response()) << big.received();  // before any body byte is sent
    EXPECT_EQ(big.received().rfind("HTTP/1.1 413", 0), 0u) << big.received();
    EXPECT_EQ(body_of(big.received())["error"]["code"], "request_too_large");
    EXPECT_TRUE(big.read_to_close());

    // Within the limit: 100 Continue, then the answer.
    const std::string body = chat_body("hi", 2).dump();
    client small("127.0.0.1", s.port());
    small.send_all(post_head("/v1/chat/completions", body.size(), "Expect: 100-continue\r\n"));
    ASSERT_TRUE(small.read_until("HTTP/1.1 100 Continue\r\n\r\n")) << small.received();
    small.send_all(body);
    ASSERT_TRUE(small.read_until("HTTP/1.1 200"));
    const std::string after_continue = small.received().substr(small.received().find("HTTP/1.1 200"));
    EXPECT_EQ(after_continue.find("100 Continue"), std::string::npos) << "one 100 Continue only";
}

TEST(ServerConnections, PipelinedRequestsOnAKeptAliveConnection) {
    test_server s;
    const std::string body = chat_body("hi", 2).dump();
    client c("127.0.0.1", s.port());
    // Sent in one piece: each is answered in order, and the connection stays open for a third.
    c.send_all("GET /health HTTP/1.1\r\nHost: test\r\n\r\n" + post_head("/v1/chat/completions", body.size()) + body);
    ASSERT_TRUE(c.read_until("chat.completion")) << c.received();
    EXPECT_EQ(c.received().rfind("HTTP/1.1 200", 0), 0u) << c.received();
    EXPECT_NE(c.received().find("HTTP/1.1 200", 10), std::string::npos) << c.received();
    c.send_all("GET /health HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    ASSERT_TRUE(c.read_to_close());
    EXPECT_NE(c.received().find("{\"status\":\"ok\"}", c.received().find("chat.completion")), std::string::npos)
        << c.received();
}

TEST(ServerConnections, Http10StreamIsNotChunked) {
    test_server s;
    const std::string body = chat_body("hi", 4, true).dump();
    client c("127.0.0.1", s.port());
    c.send_all(post_head("/v1/chat/completions", body.size(), "", "HTTP/1.0") + body);
    ASSERT_TRUE(c.read_to_close()) << "the body ends where the connection does";
    const std::string& r = c.received();
    const size_t head_end = r.find("\r\n\r\n");
    ASSERT_NE(head_end, std::string::npos) << r;
    const std::string head = r.substr(0, head_end);
    EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
    EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
    EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
    const std::string events = r.substr(head_end + 4);
    EXPECT_EQ(events.rfind("data: {", 0), 0u) << events;
    EXPECT_GE(events.size(), 14u);
    EXPECT_EQ(events.substr(events.size() - 14), "data: [DONE]\n\n") << events;
}

// A server on [::1] (skipped where IPv6 loopback is missing) and its /v1/status over a plain socket.
struct ipv6_server {
    std::unique_ptr<http_server> server;
    std::thread thread;
    int port = 0;
    ipv6_server() {
        server_options o;
        o.host = "::1";
        o.port = 0;
        server = std::make_unique<http_server>(o);
        port = server->bind();
        thread = std::thread([this] { server->run(); });
        server->set_model(hold_model());
    }
    ~ipv6_server() {
        server->begin_shutdown();
        server->wait_idle(20s);
        server->stop();
        thread.join();
    }
    json status() const {
        client c("::1", port);
        c.send_all("GET /v1/status HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        c.read_to_close(20s);
        return body_of(c.received());
    }
    bool wait_running(bool running) const {
        const auto until = clock_type::now() + 20s;
        while (status()["queue"]["running"].is_null() == running)
            if (clock_type::now() >= until) return false;
        return true;
    }
};

bool ipv6_loopback() {
    const int fd = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    return ok;
}

TEST(ServerConnections, DisconnectOverIpv6StopsTheGeneration) {
    if (!ipv6_loopback()) GTEST_SKIP() << "no IPv6 loopback (::1) here";
    ipv6_server s;
    const int max_tokens = hold_tokens;
    for (const bool stream : {false, true}) {
        SCOPED_TRACE(stream ? "streamed" : "whole answer");
        const std::string body =
            json{{"prompt", "Tell a long story"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", stream}}
                .dump();
        client c("::1", s.port);
        c.send_all(post_head("/v1/completions", body.size()) + body);
        if (stream) ASSERT_TRUE(c.read_until("data: ")) << c.received();
        else ASSERT_TRUE(s.wait_running(true));
        c.close();
        ASSERT_TRUE(s.wait_running(false));
        const json last = s.status()["last_request"];
        EXPECT_EQ(last["stopped_by"], "client disconnected") << last.dump();
        EXPECT_LT(last["usage"]["completion_tokens"].get<int>(), max_tokens) << last.dump();
    }
}

}  // namespace
}  // namespace strata::server::test
