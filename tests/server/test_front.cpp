// The front layer under abuse: linear JSON parsing whatever the body nests, bounded memory for bodies
// full of ignored values, probes answered whatever waits for the engine, half-closed clients still
// answered, bare LF refused at once, CORS on the front's own errors, caps on connections and bytes in
// flight answered with Retry-After, and API keys checked before any body is read.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A loopback client that can half-close and can read an answer whole.
class peer {
public:
    explicit peer(int port) {
        fd_ = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
            throw std::runtime_error("cannot connect");
    }
    ~peer() { ::close(fd_); }
    peer(const peer&) = delete;
    peer& operator=(const peer&) = delete;

    bool send_all(std::string_view bytes) {
        while (!bytes.empty()) {
            const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
            if (n <= 0) return false;
            bytes.remove_prefix(static_cast<size_t>(n));
        }
        return true;
    }
    void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
    // Reads until `needle` arrived (true), or the peer closed or the timeout passed (false).
    bool read_until(const std::string& needle, std::chrono::milliseconds timeout = 20s) {
        const auto until = clock_type::now() + timeout;
        while (got_.find(needle) == std::string::npos) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
            pollfd p{fd_, POLLIN, 0};
            if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
            char buf[65536];
            const ssize_t n = recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) return false;
            got_.append(buf, static_cast<size_t>(n));
        }
        return true;
    }
    // Reads until the server closes the connection (true) or the timeout passes (false).
    bool read_to_close(std::chrono::milliseconds timeout) {
        const auto until = clock_type::now() + timeout;
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
            pollfd p{fd_, POLLIN, 0};
            if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
            char buf[65536];
            const ssize_t n = recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) return true;
            got_.append(buf, static_cast<size_t>(n));
        }
    }
    const std::string& received() const { return got_; }
    // The final answer's status (after any 1xx), 0 when none arrived.
    int status() const {
        size_t at = 0;
        while ((at = got_.find("HTTP/1.1 ", at)) != std::string::npos) {
            const int code = std::atoi(got_.c_str() + at + 9);
            if (code >= 200) return code;
            at += 9;
        }
        return 0;
    }

private:
    int fd_ = -1;
    std::string got_;
};

std::string post(const std::string& path, const std::string& body, const std::string& extra = {}) {
    return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + extra +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string repeated(const std::string& item, size_t n) {
    std::string s;
    s.reserve((item.size() + 1) * n);
    for (size_t i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s;
}

size_t vm_bytes(const std::string& field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
    return 0;
}

// Row 1: 2.8 million empty objects (8 MiB) used to take the parser quadratic time: no answer in
// minutes. In an ignored field they cost nothing; in a read one they meet the cap on values.
TEST(ServerFront, EmptyObjectsParseInLinearTime) {
    test_server s;
    const std::string objects = "[" + repeated("{}", 2'700'000) + "]";
    for (const std::string field : {"metadata", "stop"}) {
        SCOPED_TRACE(field);
        peer c(s.port());
        c.send_all(post("/v1/completions", "{\"" + field + "\": " + objects + ", \"prompt\": \"hi\", \"max_tokens\": 2}",
                        "Connection: close\r\n"));
        // Minutes before; a fraction of a second now: the bound only keeps a broken build from hanging.
        ASSERT_TRUE(c.read_to_close(60s)) << c.received().substr(0, 300);
        if (field == "metadata") EXPECT_EQ(c.status(), 200) << c.received().substr(0, 300);
        else EXPECT_NE(c.received().find("too_many_values"), std::string::npos) << c.received().substr(0, 300);
    }
}

// Row 2: 4.2 million small numbers in an ignored field, eight bodies at once.
TEST(ServerFront, IgnoredValuesCostNoMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "resident memory under a sanitizer says nothing about the server's";
#endif
    constexpr int n = 8;
    test_server s;
    const std::string body = "{\"prompt\": \"hi\", \"max_tokens\": 1, \"metadata\": [" + repeated("1", 4'150'000) + "]}";
    ASSERT_LE(body.size(), size_t(8) << 20);
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to VmRSS
    const size_t base = vm_bytes("VmRSS");
    std::vector<int> status(n);
    std::vector<std::thread> clients;
    for (int i = 0; i < n; ++i)
        clients.emplace_back([&, i] {
            peer c(s.port());
            c.send_all(post("/v1/completions", body, "Connection: close\r\n"));
            c.read_to_close(60s);
            status[size_t(i)] = c.status();
        });
    for (std::thread& t : clients) t.join();
    const double peak = double(vm_bytes("VmHWM") - base) / (1 << 20);
    const double after = (double(vm_bytes("VmRSS")) - double(base)) / (1 << 20);
    std::printf("%d bodies of %.1f MiB with 4.15 M ignored numbers: peak RSS +%.1f MiB, after +%.1f MiB\n", n,
                double(body.size()) / (1 << 20), peak, after);
    for (const int st : status) EXPECT_EQ(st, 200);
    // The bodies themselves, twice each (received, and handed to the handler), plus slack; the DOM used
    // to add 16 bytes or more per number (1.6 GB at peak).
    EXPECT_LT(peak, 2.0 * n * double(body.size()) / (1 << 20) + 64) << "peak RSS above the idle server";
    EXPECT_LT(after, 64.0) << "RSS kept after the requests";
}

// Row 3: a generation holds the engine and every request thread waits behind it; probes, status,
// metrics, preflights and 401s are still answered.
TEST(ServerFront, ProbesDoNotQueueBehindGenerations) {
    server_options o;
    o.http_threads = 2;
    o.api_key = "k";
    test_server s(o, hold_model());
    const std::string auth = "Authorization: Bearer k\r\n";
    std::vector<std::unique_ptr<peer>> waiting;
    const std::string hold = json{{"prompt", "Hold"}, {"max_tokens", hold_tokens}, {"ignore_eos", true}}.dump();
    for (int i = 0; i < 4; ++i) {  // one generating, one waiting for the engine, two waiting for a thread
        waiting.push_back(std::make_unique<peer>(s.port()));
        waiting.back()->send_all(post("/v1/completions", hold, auth));
    }
    const auto until = clock_type::now() + 20s;
    while (s.get("/v1/status", {{"Authorization", "Bearer k"}}).parsed()["queue"]["waiting"].size() < 1 &&
           clock_type::now() < until)
        std::this_thread::sleep_for(10ms);
    for (const std::string& req : std::vector<std::string>{"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
                                  "GET /metrics HTTP/1.1\r\nHost: t\r\n" + auth + "\r\n",
                                  "GET /v1/status HTTP/1.1\r\nHost: t\r\n" + auth + "\r\n",
                                  "OPTIONS /v1/completions HTTP/1.1\r\nHost: t\r\nOrigin: http://a\r\n\r\n",
                                  post("/v1/completions", hold)}) {
        SCOPED_TRACE(req.substr(0, req.find('\r')));
        peer c(s.port());
        c.send_all(req);
        ASSERT_TRUE(c.read_until("\r\n\r\n", 20s)) << c.received();
        const int want = req[0] == 'O' ? 204 : req[0] == 'P' ? 401 : 200;
        EXPECT_EQ(c.status(), want) << c.received();
    }
    s.shut_down();
}

// Row 4: a client that half-closes after its request still gets the answer.
TEST(ServerFront, HalfCloseIsNotADisconnect) {
    test_server s;
    for (const bool stream : {false, true}) {
        SCOPED_TRACE(stream ? "streamed" : "whole answer");
        peer c(s.port());
        c.send_all(post("/v1/completions", json{{"prompt", "Half"}, {"max_tokens", 8}, {"ignore_eos", true},
                                                 {"stream", stream}}.dump(), "Connection: close\r\n"));
        c.shutdown_write();
        ASSERT_TRUE(c.read_until(stream ? "[DONE]" : "\"usage\"")) << c.received();
        EXPECT_EQ(c.status(), 200) << c.received();
        EXPECT_EQ(s.status()["last_request"]["stopped_by"], "max_tokens");
    }
}

// Row 5: bare LF line ends are refused at once, not after the head timeout.
TEST(ServerFront, BareLfIs400AtOnce) {
    server_options o;
    o.header_timeout_s = 120;
    test_server s(o);
    peer c(s.port());
    c.send_all("GET /health HTTP/1.1\nHost: x\n\n");
    ASSERT_TRUE(c.read_until("\r\n\r\n", 20s)) << c.received();
    EXPECT_EQ(c.status(), 400) << c.received();
    EXPECT_NE(c.received().find("bare LF"), std::string::npos) << c.received();
}

// Row 6: the front's own errors carry CORS headers, so a browser's script can read them.
TEST(ServerFront, FrontErrorsCarryCors) {
    server_options o;
    o.cors_origin = "http://app.example";
    test_server s(o);
    for (const std::string& req : {std::string("POST /v1/completions HTTP/1.1\r\nHost: t\r\nOrigin: http://app.example"
                                              "\r\nContent-Length: 9999999\r\n\r\n"),
                                  std::string("GET /health HTTP/1.1\r\nOrigin: http://app.example\r\nX: a\nY: b\r\n\r\n")}) {
        peer c(s.port());
        c.send_all(req);
        ASSERT_TRUE(c.read_until("\r\n\r\n")) << c.received();
        EXPECT_TRUE(c.status() == 413 || c.status() == 400) << c.received();
        EXPECT_NE(c.received().find("Access-Control-Allow-Origin: http://app.example\r\n"), std::string::npos)
            << c.received();
    }
}

// Bodies are read only after the API key checks out: a wrong key is answered 401 from the head.
TEST(ServerFront, WrongKeyIsRefusedBeforeTheBody) {
    server_options o;
    o.api_key = "right";
    test_server s(o);
    peer c(s.port());
    c.send_all("POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\nContent-Length: 1000000\r\n\r\n");
    ASSERT_TRUE(c.read_until("\r\n\r\n")) << c.received();
    EXPECT_EQ(c.status(), 401) << c.received();
    EXPECT_NE(c.received().find("WWW-Authenticate: Bearer"), std::string::npos) << c.received();
}

// Connections past the caps get 503 (all) or 429 (one client address) with Retry-After.
TEST(ServerFront, ConnectionCaps) {
    for (const bool per_client : {false, true}) {
        server_options o;
        (per_client ? o.max_connections_per_client : o.max_connections) = 3;
        test_server s(o);
        std::vector<std::unique_ptr<peer>> held;
        for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<peer>(s.port()));
        // The held ones are counted once the front took them: a request on each shows it.
        for (auto& p : held) {
            p->send_all("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
            ASSERT_TRUE(p->read_until("\"ok\""));
        }
        peer extra(s.port());
        ASSERT_TRUE(extra.read_until("\r\n\r\n")) << extra.received();
        EXPECT_EQ(extra.status(), per_client ? 429 : 503) << extra.received();
        EXPECT_NE(extra.received().find("Retry-After: 1\r\n"), std::string::npos) << extra.received();
        held.pop_back();
        // The slot is free again once the server saw the close.
        bool served = false;
        for (int tries = 0; tries < 200 && !served; ++tries) {
            peer again(s.port());
            again.send_all("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
            served = again.read_until("\"ok\"", 5s);
            if (!served) std::this_thread::sleep_for(10ms);
        }
        EXPECT_TRUE(served);
    }
}

// 300 connections announcing 8 MiB bodies and sending them slowly: the bytes in flight stay within
// the cap (--max-bytes-in-flight), the rest get 503 with Retry-After before their body is read.
TEST(ServerFront, BytesInFlightAreCapped) {
    constexpr int n = 300;
    constexpr size_t cap = 48u << 20, announced = 8u << 20, sent = 1u << 20;
    server_options o;
    o.max_bytes_in_flight = cap;
    o.max_connections_per_client = 0;
    o.body_timeout_s = 60;
    test_server s(o);
    std::ofstream("/proc/self/clear_refs") << "5";
    const size_t base = vm_bytes("VmRSS");
    std::vector<std::unique_ptr<peer>> clients;
    const std::string chunk(sent, ' ');
    int refused = 0;
    for (int i = 0; i < n; ++i) {
        clients.push_back(std::make_unique<peer>(s.port()));
        peer& c = *clients.back();
        c.send_all("POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: " +
                   std::to_string(announced) + "\r\n\r\n");
        // The verdict comes before any body byte: 100 Continue once the bytes are reserved, else 503.
        ASSERT_TRUE(c.read_until("\r\n\r\n")) << "connection " << i << " got no verdict";
        if (c.received().rfind("HTTP/1.1 100 Continue", 0) != 0) {
            EXPECT_EQ(c.status(), 503) << c.received();
            EXPECT_NE(c.received().find("Retry-After: 1"), std::string::npos);
            EXPECT_NE(c.received().find("--max-bytes-in-flight"), std::string::npos);
            ++refused;
        } else {
            c.send_all(chunk);
        }
    }
    const double peak = double(vm_bytes("VmHWM") - base) / (1 << 20);
    std::printf("%d connections announcing 8 MiB bodies, 1 MiB sent by each one admitted: %d refused, peak RSS +%.1f MiB "
                "(cap %zu MiB)\n", n, refused, peak, cap >> 20);
    EXPECT_GE(refused, n - int(cap / announced));
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    EXPECT_LT(peak, double(cap >> 20) + 64);
#endif
}

}  // namespace
}  // namespace strata::server::test
