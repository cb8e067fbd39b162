// libFuzzer target for the HTTP front's parser: an arbitrary byte stream, cut into pieces whose sizes
// the input's first bytes choose, goes through request_reader as a connection's bytes would
// (pipelined requests included), and each whole request's head through the helpers the screen uses
// and its body through parse_json_body. A finding: a crash or sanitizer report, or a broken invariant
// (bytes used beyond those given, a body past the limit, a whole head without its blank line, an
// error that is not a 4xx or 5xx status with a message).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "api_error.hpp"
#include "json_body.hpp"
#include "request_reader.hpp"

namespace {

using namespace strata::server;

[[noreturn]] void finding(const char* what) {
    std::fprintf(stderr, "fuzz_front: %s\n", what);
    std::abort();
}

constexpr size_t max_body = 4096;

void check_request(request_reader& r) {
    const std::string& head = r.head();
    if (head.size() < 4 || head.compare(head.size() - 4, 4, "\r\n\r\n") != 0) finding("a whole head without CRLF CRLF");
    if (r.body().size() > max_body) finding("a body past the limit");
    const request_line line = parse_request_line(head);
    if (line.method.size() > head.size() || line.path.size() > head.size()) finding("a request line past its head");
    (void)header_value(head, "Authorization");
    (void)header_value(head, "Origin");
    try {
        (void)parse_json_body(r.body(), 256);
    } catch (const api_error& e) {
        if (e.status != 400) finding("a body error that is not a 400");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const size_t piece = 1 + data[0] % 64;  // bytes per recv
    const bool pause = data[1] & 1;
    std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
    request_reader r(max_body, pause);
    std::string pending;
    for (int guard = 0; guard < 100000; ++guard) {
        if (pending.empty()) {
            if (rest.empty()) break;
            pending.assign(rest.substr(0, piece));
            rest.remove_prefix(pending.size());
        }
        const size_t used = r.feed(pending);
        if (used > pending.size()) finding("more bytes used than given");
        pending.erase(0, used);
        switch (r.at()) {
            case request_reader::phase::done:
                check_request(r);
                r.next();
                break;
            case request_reader::phase::failed:
                if (r.error().status < 400 || r.error().status > 599 || r.error().message.empty())
                    finding("an error without a 4xx/5xx status and a message");
                return 0;
            default:
                // Nothing used while the request still waits for bytes: the next piece must come.
                if (used == 0 && !pending.empty() && r.at() != request_reader::phase::body) finding("stuck on a piece");
                if (used == 0 && !pending.empty()) {
                    if (rest.empty()) return 0;
                    pending.append(rest.substr(0, piece));
                    rest.remove_prefix(std::min(piece, rest.size()));
                }
        }
    }
    return 0;
}
