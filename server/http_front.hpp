// The HTTP server's connections before and between requests. One event thread (epoll) watches every
// open connection and reads each request whole (request_reader) within two deadlines, one for the
// head and one for the body; only then does a worker thread answer it. A connection that sends
// nothing, or sends slowly, therefore holds no worker: it costs a descriptor and the bytes it sent,
// and it is closed at its deadline. A worker returns a kept-alive connection to the event thread
// after its answer.
//
// Each head is screened before its body is read: the server's screen function may refuse it (a
// wrong API key), and the body's bytes are reserved against a budget for all connections. Requests
// the screen calls quick (probes, preflights) have their own workers, so they are answered whatever
// the other workers are waiting for. Caps on connections (in all and per client address), bytes in
// flight and complete requests waiting for a worker are answered 503 or 429 with Retry-After.
//
// Errors the front finds itself (a body over the limit, bad framing, a deadline passed, a cap) are
// answered with the response the server's reject function builds, and the connection is closed
// after it; the rest of an unread body is drained for a short while first, so the client sees the
// answer instead of a reset.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "request_reader.hpp"

namespace strata::server {

struct front_options {
    size_t max_body_bytes = 8u << 20;
    std::chrono::milliseconds header_timeout{10'000};      // from the connection (or a kept-alive one's first byte)
    std::chrono::milliseconds body_timeout{30'000};        // from the end of the head
    std::chrono::milliseconds keep_alive_timeout{5'000};   // idle between requests
    std::chrono::milliseconds write_timeout{30'000};       // a worker's write to a client that does not read
    int workers = 32;
    int quick_workers = 2;
    int max_requests_per_connection = 1000;
    int max_connections = 1024;             // open at once (else 503); 0: no cap
    int max_connections_per_client = 256;   // open at once from one address (else 429); 0: no cap
    size_t max_bytes_in_flight = 256u << 20;  // heads and bodies being read or answered (else 503)
    int max_waiting_requests = 256;         // complete requests waiting for a worker (else 503)
};

// What the screen says about a request whose head just arrived.
struct screening {
    bool quick = false;                   // answered by the quick workers
    std::optional<request_error> refuse;  // answered at once with this error, the body unread
};

// A request read whole, handed to a worker.
struct front_request {
    int fd = -1;
    std::string head;   // request line and headers, the blank line included, as received
    std::string body;   // decoded
    bool last = false;  // the connection closes after this answer (stopping, or its request count is reached)
};

class http_front {
public:
    // Answers one request on a worker thread; false: close the connection afterwards.
    using serve_fn = std::function<bool(front_request&)>;
    // The bytes of a whole response (status line to body) for an error the front answers itself;
    // `head` is as much of the request's head as arrived (for its Origin).
    using reject_fn = std::function<std::string(const request_error&, std::string_view head, const std::string& peer)>;
    // Looks at a whole head on the event thread: must be quick and must not block.
    using screen_fn = std::function<screening(std::string_view head)>;

    http_front(front_options o, serve_fn serve, reject_fn reject, screen_fn screen,
               std::shared_ptr<spdlog::logger> log);
    ~http_front();
    http_front(const http_front&) = delete;
    http_front& operator=(const http_front&) = delete;

    // Any thread: takes a connected socket, which the front closes when it is done with it.
    void adopt(int fd);
    // Closes every idle connection and drops requests not yet started; returns when the workers have
    // finished the requests they were answering. Idempotent.
    void stop();

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

}  // namespace strata::server
