#include <malloc.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <httplib.h>
#include <spdlog/fmt/fmt.h>

#include "api_error.hpp"
#include "connection.hpp"
#include "http_front.hpp"
#include "listener.hpp"
#include "openai_response.hpp"
#include "routes.hpp"
#include "server_state.hpp"
#include "strata/server.hpp"

namespace strata::server {
namespace {

using clock_type = std::chrono::steady_clock;

void address_of(int fd, bool remote, std::string& ip, int& port) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    const int got = remote ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                           : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    if (got != 0 || getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                                NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return;
    ip = host;
    port = std::atoi(serv);
}

// One request read whole by the front, as cpp-httplib's process_request reads it: the head comes from
// memory and ends there (the body is handed over already decoded); answers go to the socket, which is
// non-blocking, with the write timeout per write.
class request_stream : public httplib::Stream {
public:
    request_stream(int fd, const std::string& head, std::chrono::milliseconds write_timeout)
        : fd_(fd), head_(head), write_timeout_(write_timeout) {}

    bool is_readable() const override { return pos_ < head_.size(); }
    bool is_writable() const override { return wait_writable(clock_type::now() + write_timeout_); }

    ssize_t read(char* ptr, size_t size) override {
        const size_t n = std::min(size, head_.size() - pos_);
        std::memcpy(ptr, head_.data() + pos_, n);
        pos_ += n;
        return static_cast<ssize_t>(n);
    }

    ssize_t write(const char* ptr, size_t size) override {
        if (!started_) {
            answer_starts(fd_);
            started_ = true;
        }
        const auto deadline = clock_type::now() + write_timeout_;
        size_t sent = 0;
        while (sent < size) {
            const ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL);
            if (n > 0) sent += static_cast<size_t>(n);
            else if (n < 0 && errno == EINTR) continue;
            else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_writable(deadline)) continue;
            else return -1;
        }
        return static_cast<ssize_t>(size);
    }

    void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, true, ip, port); }
    void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, false, ip, port); }
    socket_t socket() const override { return fd_; }

private:
    bool wait_writable(clock_type::time_point deadline) const {
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
            if (left.count() <= 0) return false;
            pollfd p{fd_, POLLOUT, 0};
            const int r = poll(&p, 1, static_cast<int>(left.count()));
            if (r < 0 && errno == EINTR) continue;
            return r > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
        }
    }

    int fd_;
    const std::string& head_;
    size_t pos_ = 0;
    bool started_ = false;
    std::chrono::milliseconds write_timeout_;
};

// cpp-httplib's server used for routing only: the listener and the connections are ours (listener,
// http_front), and each request read whole is handed to its protected process_request, which parses
// the head from memory, runs the route and writes the answer (pinned by test_httplib_contract).
class front_server : public httplib::Server {
public:
    // Chunked content providers (streams) run only while svr_sock_ holds a socket: the listener's
    // while serving, none once stopping, which ends every stream at its next chunk.
    void serving(int listening_fd) { svr_sock_ = listening_fd >= 0 ? listening_fd : INVALID_SOCKET; }

    // On a front worker: answers one request; false when the connection must close after it.
    bool answer(front_request& r, std::chrono::milliseconds write_timeout) {
        request_stream stream(r.fd, r.head, write_timeout);
        const std::string_view line = std::string_view(r.head).substr(0, r.head.find("\r\n"));
        const connection_scope scope(r.fd, line.size() >= 8 && line.substr(line.size() - 8) == "HTTP/1.0");
        bool closed = false;
        const bool ok = process_request(stream, r.last, closed, [&r](httplib::Request& req) {
            // The front read and decoded the body and answered any Expect: nothing of it is left on the
            // socket for cpp-httplib to read.
            req.headers.erase("Content-Length");
            req.headers.erase("Transfer-Encoding");
            req.headers.erase("Expect");
            req.body = std::move(r.body);
        });
        return ok && !closed && !scope.close_requested();
    }
};

std::string_view reason_phrase(int status) {
    switch (status) {
        case 400: return "Bad Request";
        case 408: return "Request Timeout";
        case 401: return "Unauthorized";
        case 413: return "Payload Too Large";
        case 429: return "Too Many Requests";
        case 415: return "Unsupported Media Type";
        case 417: return "Expectation Failed";
        case 431: return "Request Header Fields Too Large";
        case 501: return "Not Implemented";
        case 503: return "Service Unavailable";
        default: return "Error";
    }
}

std::string_view error_type(int status) {
    if (status == 401) return "authentication_error";
    return status >= 500 || status == 429 ? "unavailable_error" : "invalid_request_error";
}

// The whole response for an error the front answers before a handler runs; the connection closes
// after it. CORS headers as on every other answer, so a browser's script can read why.
std::string rejection(server_state& state, const request_error& e, std::string_view head, const std::string& peer) {
    const std::string body = to_text(error_body(api_error(e.status, e.message, std::string(error_type(e.status)), "",
                                                          e.code)));
    state.counters.count_request("rejected", e.status);
    if (e.status != 408 && e.status != 401)  // the front sums 408s up itself; 401s are logged by their count
        state.log->info("A request from {} was answered {} before it was read whole: {}", peer, e.status, e.message);
    std::string extra;
    if (const auto origin = cors_origin_for(state, header_value(head, "Origin")))
        extra += fmt::format("Access-Control-Allow-Origin: {}\r\n{}", *origin, *origin == "*" ? "" : "Vary: Origin\r\n");
    if (e.retry_after_s > 0) extra += fmt::format("Retry-After: {}\r\n", e.retry_after_s);
    if (e.status == 401) extra += "WWW-Authenticate: Bearer\r\n";
    return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}Connection: "
                       "close\r\n\r\n{}", e.status, reason_phrase(e.status), body.size(), extra, body);
}

// Probes, preflights and other reads go to the quick workers; a request without the API key its
// route needs is refused from its head, before its body is read.
screening screen_request(const server_state& state, std::string_view head) {
    const request_line line = parse_request_line(head);
    screening s;
    s.quick = line.method == "GET" || line.method == "HEAD" || line.method == "OPTIONS";
    if (route_is_open(line.method, line.path)) return s;
    if (auto e = api_key_problem(state, header_value(head, "Authorization"), header_value(head, "x-api-key")))
        s.refuse = request_error{401, e->what(), e->code, 0};
    return s;
}

std::chrono::milliseconds to_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

constexpr int keep_alive_s = 5;
constexpr int max_requests_per_connection = 1000;

}  // namespace

struct http_server::impl {
    server_state state;
    front_server http;
    listener accepting;
    std::unique_ptr<http_front> front;  // after http: destroyed (and its workers joined) first
    int port = -1;

    explicit impl(server_options o) : state(std::move(o)) {
        // Request bodies (up to --max-body) get their own mappings, returned when freed: glibc's default
        // raises this threshold after the first large free, and the next bodies then stay in its heaps.
        mallopt(M_MMAP_THRESHOLD, 1 << 20);
        const server_options& so = state.options;
        front_options f;
        f.max_body_bytes = so.max_body_bytes;
        f.header_timeout = to_ms(so.header_timeout_s);
        f.body_timeout = to_ms(so.body_timeout_s);
        f.keep_alive_timeout = std::chrono::seconds(keep_alive_s);
        // A streamed token waits this long for a client that stopped reading before counting as gone.
        f.write_timeout = to_ms(so.write_timeout_s);
        f.workers = std::max(so.http_threads, 2);
        f.max_requests_per_connection = max_requests_per_connection;
        f.max_connections = so.max_connections;
        f.max_connections_per_client = so.max_connections_per_client;
        f.max_bytes_in_flight = so.max_bytes_in_flight;
        f.max_waiting_requests = so.max_waiting_requests;
        front = std::make_unique<http_front>(
            f, [this, wt = f.write_timeout](front_request& r) { return http.answer(r, wt); },
            [this](const request_error& e, std::string_view head, const std::string& peer) {
                return rejection(state, e, head, peer);
            },
            [this](std::string_view head) { return screen_request(state, head); }, state.log);
        // Only what the Keep-Alive response header announces; the front enforces both.
        http.set_keep_alive_max_count(max_requests_per_connection);
        http.set_keep_alive_timeout(keep_alive_s);
        add_routes(http, state);
        http.set_post_routing_handler([](const httplib::Request& req, httplib::Response& res) {
            if (req.version != "HTTP/1.0" || !res.is_chunked_content_provider_) return;
            // HTTP/1.0 has no chunked encoding: the body ends where the connection does.
            res.is_chunked_content_provider_ = false;
            res.headers.erase("Transfer-Encoding");
            res.headers.erase("Content-Encoding");
            res.headers.erase("Keep-Alive");
            res.set_header("Connection", "close");
            close_after_answer();
        });
    }
};

http_server::http_server(server_options options) : impl_(std::make_unique<impl>(std::move(options))) {}

http_server::~http_server() = default;

int http_server::bind() {
    const server_options& o = impl_->state.options;
    if (o.port < 0 || o.port > 65535) throw std::runtime_error(fmt::format("--port must be 0..65535, got {}", o.port));
    impl_->port = impl_->accepting.bind(o.host, o.port);
    impl_->http.serving(impl_->accepting.fd());
    return impl_->port;
}

void http_server::run() {
    if (impl_->port <= 0) throw std::logic_error("http_server::run() needs a successful bind() first");
    http_front& front = *impl_->front;
    impl_->accepting.run([&front](int fd) { front.adopt(fd); });
    front.stop();
}

void http_server::set_model(std::shared_ptr<model> m) { impl_->state.set_model(std::move(m)); }

void http_server::begin_shutdown() {
    if (impl_->state.shutting_down.exchange(true)) return;
    const request_queue::snapshot q = impl_->state.queue.state();
    impl_->state.log->info("Shutting down: new requests get 503; {} waiting request(s) get 503{}.", q.waiting.size(),
                           q.running.empty() ? std::string()
                                             : fmt::format(", request(s) {} stop at their next prompt batch or token",
                                                           fmt::join(q.running, ", ")));
}

bool http_server::begin_drain() { return impl_->state.begin_drain(); }

bool http_server::draining() const { return impl_->state.draining.load(); }

void http_server::on_drain_requested(std::function<void()> fn) { impl_->state.set_drain_hook(std::move(fn)); }

size_t http_server::park_conversation() {
    server_state& s = impl_->state;
    if (!s.loaded_model()) return 0;
    // A queue turn for every slot: then no generation runs and each slot's session can be parked.
    const size_t n_slots = s.slots().size();
    std::vector<request_queue::ticket> turns;
    for (size_t i = 0; i < n_slots; ++i) {
        turns.push_back(s.queue.enter(s.next_request_id.fetch_add(1)));
        if (!s.queue.wait_turn(turns.back(), [&s] { return s.shutting_down.load(); })) return 0;
    }
    size_t parked = 0;
    for (size_t i = 0; i < n_slots; ++i) {
        session& engine = s.slot_session(static_cast<int>(i));
        const size_t n = engine.cached_tokens();
        if (n > 0 && engine.park() != 0) parked += n;
    }
    return parked;
}

void http_server::stop() {
    impl_->http.serving(-1);
    impl_->accepting.stop();
}

int http_server::in_flight() const { return impl_->state.in_flight.load(); }

bool http_server::wait_idle(std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (in_flight() > 0) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

}  // namespace strata::server
