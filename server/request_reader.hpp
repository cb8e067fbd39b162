// Reads one HTTP/1.x request from the bytes a connection receives, in whatever pieces they come: the
// head (request line and headers, up to the blank line) and the body, framed by Content-Length or
// chunked encoding and decoded. The HTTP front runs it on its event thread so that a request reaches a
// worker thread only when it is whole; cpp-httplib then parses the head again and is handed the body.
//
// It refuses what it cannot frame unambiguously, with the status the client gets: a bare CR or LF,
// obsolete line folding, whitespace before a colon, Transfer-Encoding together with Content-Length,
// conflicting Content-Length values (400); a body over the limit (413, before any of it is read);
// a transfer coding other than chunked (501), a content coding (415), an Expect other than
// 100-continue (417), a head over 64 KiB (431).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::server {

struct request_error {
    int status = 0;
    std::string message;
    std::string code;    // machine-readable reason for the error object
    int retry_after_s = 0;  // > 0: the answer carries Retry-After (a cap was reached, not a bad request)
};

// The method and the target's path (without its query) of a head's request line; empty when absent.
struct request_line {
    std::string_view method, path;
};
request_line parse_request_line(std::string_view head);

// The value of the first header named `name` (any case), trimmed, in a head whole or in part.
std::optional<std::string_view> header_value(std::string_view head, std::string_view name);

class request_reader {
public:
    static constexpr size_t max_head_bytes = 64 * 1024;

    enum class phase {
        idle,    // nothing of a request yet
        head,    // part of the head
        body,    // the head is whole; part of the body
        done,    // the request is whole: head() and body()
        failed,  // error() says why; the connection cannot be read further
    };

    // pause_after_head: feed() returns at the end of the head, so that the request can be screened
    // (its API key checked, its body's bytes reserved) before any of the body is read.
    explicit request_reader(size_t max_body_bytes, bool pause_after_head = false)
        : max_body_(max_body_bytes), pause_after_head_(pause_after_head) {}

    // Reads from `data`; returns how many bytes it used. It stops at the end of the request, so the
    // rest belongs to the next one (a pipelining client), and after the head when pausing there.
    size_t feed(std::string_view data);

    phase at() const { return phase_; }
    // True once, right after the head of a request whose client waits for "100 Continue".
    bool take_continue();
    const request_error& error() const { return error_; }
    // Body bytes expected (Content-Length), or received so far (chunked).
    uint64_t body_expected() const { return chunked_ ? body_.size() : content_length_; }
    bool chunked() const { return chunked_; }
    size_t body_received() const { return body_.size(); }

    std::string& head() { return head_; }
    std::string& body() { return body_; }

    // Starts over for the next request on the same connection.
    void next();

private:
    enum class chunk_step { size_line, data, data_end, trailer };

    size_t feed_head(std::string_view data);
    void parse_head();
    size_t feed_body(std::string_view data);
    size_t feed_chunked(std::string_view data);
    // Appends to line_ up to and including an LF; true once a whole line (ending in CRLF) is there.
    bool take_line(std::string_view data, size_t& used, size_t limit);
    void fail(int status, std::string message, std::string code);

    size_t max_body_;
    bool pause_after_head_;
    phase phase_ = phase::idle;
    request_error error_;
    std::string head_, body_;
    bool chunked_ = false;
    uint64_t content_length_ = 0;
    bool continue_ = false;

    chunk_step step_ = chunk_step::size_line;
    std::string line_;            // the chunk-size or trailer line being read
    uint64_t chunk_left_ = 0;     // data bytes of the current chunk not read yet
    size_t trailer_bytes_ = 0;
};

}  // namespace strata::server
