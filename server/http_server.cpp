#include <sys/socket.h>

#include <algorithm>
#include <thread>

#include <httplib.h>
#include <spdlog/fmt/fmt.h>

#include "routes.hpp"
#include "server_state.hpp"
#include "strata/server.hpp"

namespace strata::server {

// cpp-httplib 0.11 listens with a backlog of 5: a burst of new connections overflows it and the
// dropped SYNs are retried only after a second. The listening socket is a protected member; this
// subclass reaches it to raise the backlog (listen() again on a listening socket just updates it).
class listener : public httplib::Server {
public:
    void raise_backlog() {
        if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, SOMAXCONN);
    }
};

struct http_server::impl {
    server_state state;
    listener http;
    int port = -1;

    explicit impl(server_options o) : state(std::move(o)) {
        const auto threads = static_cast<size_t>(std::max(state.options.http_threads, 2));
        http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
        http.set_payload_max_length(state.options.max_body_bytes);
        // Answers and SSE events are small writes: without TCP_NODELAY, Nagle's algorithm holds each one
        // back until the client's delayed ACK.
        http.set_tcp_nodelay(true);
        http.set_keep_alive_max_count(1000);
        // An idle keep-alive connection holds its thread this long, and cpp-httplib's stop() waits for it:
        // short, so a shutdown is quick.
        http.set_keep_alive_timeout(2);
        // A streamed token waits this long for a client that stopped reading before counting as gone.
        http.set_write_timeout(30, 0);
        add_routes(http, state);
    }
};

http_server::http_server(server_options options) : impl_(std::make_unique<impl>(std::move(options))) {}

http_server::~http_server() = default;

int http_server::bind() {
    const server_options& o = impl_->state.options;
    if (o.port < 0 || o.port > 65535) throw std::runtime_error(fmt::format("--port must be 0..65535, got {}", o.port));
    const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
    if (port <= 0)
        throw std::runtime_error(fmt::format("cannot listen on {}:{} (address in use, not local, or not allowed)",
                                             o.host, o.port));
    impl_->http.raise_backlog();
    impl_->port = port;
    return port;
}

void http_server::run() {
    if (impl_->port <= 0) throw std::logic_error("http_server::run() needs a successful bind() first");
    impl_->http.listen_after_bind();
}

void http_server::set_model(std::shared_ptr<model> m) { impl_->state.set_model(std::move(m)); }

void http_server::begin_shutdown() {
    if (impl_->state.shutting_down.exchange(true)) return;
    const request_queue::snapshot q = impl_->state.queue.state();
    impl_->state.log->info("Shutting down: new requests get 503; {} waiting request(s) get 503{}.", q.waiting.size(),
                           q.running ? fmt::format(", request {} stops at its next prompt batch or token", *q.running) : "");
}

void http_server::stop() { impl_->http.stop(); }

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
