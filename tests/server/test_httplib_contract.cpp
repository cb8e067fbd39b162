// What strata-server takes from the distribution's cpp-httplib, pinned: the listener and connections
// are strata's own (listener, http_front); each request read whole goes to httplib::Server's protected
// process_request with the head in memory and the body already decoded. A library upgrade that
// changes any of this fails here rather than in production.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include <httplib.h>

namespace strata::server {
namespace {

// The head from memory, the answer into a string.
class memory_stream : public httplib::Stream {
public:
    explicit memory_stream(std::string head) : head_(std::move(head)) {}
    bool is_readable() const override { return pos_ < head_.size(); }
    bool is_writable() const override { return true; }
    ssize_t read(char* ptr, size_t size) override {
        const size_t n = std::min(size, head_.size() - pos_);
        std::memcpy(ptr, head_.data() + pos_, n);
        pos_ += n;
        return static_cast<ssize_t>(n);
    }
    ssize_t write(const char* ptr, size_t size) override {
        out.append(ptr, size);
        return static_cast<ssize_t>(size);
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override { ip = "127.0.0.1", port = 4242; }
    void get_local_ip_and_port(std::string& ip, int& port) const override { ip = "127.0.0.1", port = 80; }
    socket_t socket() const override { return -1; }

    std::string out;
    size_t unread() const { return head_.size() - pos_; }

private:
    std::string head_;
    size_t pos_ = 0;
};

class routing_server : public httplib::Server {
public:
    using httplib::Server::process_request;
    // Chunked content providers run only while svr_sock_ holds a socket (is_shutting_down() reads it):
    // the server sets it to its own listening socket while it serves.
    void serving(bool on) { svr_sock_ = on ? 0 : INVALID_SOCKET; }
};

TEST(HttplibContract, Version) {
    // Upgrading: run this binary and test_server, then raise the pin.
    EXPECT_EQ(std::string(CPPHTTPLIB_VERSION).rfind("0.11.", 0), 0u) << "cpp-httplib " << CPPHTTPLIB_VERSION;
}

TEST(HttplibContract, ProcessRequestRoutesAHeadFromMemoryWithItsBodyGiven) {
    routing_server http;
    std::string seen_body, seen_header;
    int seen_port = 0;
    http.Post("/v1/x", [&](const httplib::Request& req, httplib::Response& res) {
        seen_body = req.body;
        seen_header = req.get_header_value("X-Test");
        seen_port = req.remote_port;
        res.set_content("{\"ok\":true}", "application/json");
    });
    memory_stream s("POST /v1/x?q=1 HTTP/1.1\r\nHost: t\r\nX-Test: yes\r\nContent-Length: 5\r\n\r\n");
    bool closed = false;
    const bool ok = http.process_request(s, false, closed, [](httplib::Request& req) {
        req.headers.erase("Content-Length");  // as the server does: the body is not on the stream
        req.body = "hello";
    });
    EXPECT_TRUE(ok);
    EXPECT_FALSE(closed);
    EXPECT_EQ(s.unread(), 0u);
    EXPECT_EQ(seen_body, "hello");
    EXPECT_EQ(seen_header, "yes");
    EXPECT_EQ(seen_port, 4242);
    EXPECT_EQ(s.out.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << s.out;
    EXPECT_NE(s.out.find("\r\n\r\n{\"ok\":true}"), std::string::npos) << s.out;
}

TEST(HttplibContract, CloseConnectionIsAnnouncedAndReported) {
    routing_server http;
    http.Get("/h", [](const httplib::Request&, httplib::Response& res) { res.set_content("x", "text/plain"); });
    memory_stream s("GET /h HTTP/1.1\r\nHost: t\r\n\r\n");
    bool closed = false;
    EXPECT_TRUE(http.process_request(s, true, closed, [](httplib::Request&) {}));
    EXPECT_NE(s.out.find("Connection: close\r\n"), std::string::npos) << s.out;
}

TEST(HttplibContract, ChunkedProviderAndErrorHandler) {
    routing_server http;
    http.Get("/s", [](const httplib::Request&, httplib::Response& res) {
        res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
            sink.write("data: 1\n\n", 9);
            sink.done();
            return true;
        });
    });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) { res.set_content("nf", "text/plain"); });
    bool closed = false;
    http.serving(true);
    memory_stream s("GET /s HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_TRUE(http.process_request(s, false, closed, [](httplib::Request&) {}));
    EXPECT_NE(s.out.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << s.out;
    EXPECT_NE(s.out.find("9\r\ndata: 1\n\n\r\n0\r\n\r\n"), std::string::npos) << s.out;
    // Stopped: a provider's stream ends before its first chunk (how a stopping server ends streams).
    http.serving(false);
    memory_stream stopped("GET /s HTTP/1.1\r\nHost: t\r\n\r\n");
    http.process_request(stopped, false, closed, [](httplib::Request&) {});
    EXPECT_EQ(stopped.out.find("data: 1"), std::string::npos) << stopped.out;
    memory_stream missing("GET /nope HTTP/1.1\r\nHost: t\r\n\r\n");
    http.process_request(missing, false, closed, [](httplib::Request&) {});
    EXPECT_EQ(missing.out.rfind("HTTP/1.1 404", 0), 0u) << missing.out;
    EXPECT_NE(missing.out.find("\r\n\r\nnf"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace strata::server
