// request_reader frames requests the way RFC 9112 says, from bytes in any pieces, and refuses what
// could be framed two ways; check_json_depth counts nesting outside strings only.
#include <gtest/gtest.h>

#include <string>

#include "api_error.hpp"
#include "json_depth.hpp"
#include "request_reader.hpp"

namespace strata::server {
namespace {

using phase = request_reader::phase;

// Feeds `bytes` in pieces of `piece` bytes; returns the bytes used.
size_t feed_in_pieces(request_reader& r, const std::string& bytes, size_t piece) {
    size_t used = 0;
    for (size_t at = 0; at < bytes.size() && r.at() != phase::done && r.at() != phase::failed; at += piece) {
        const std::string_view part = std::string_view(bytes).substr(at, piece);
        const size_t n = r.feed(part);
        used += n;
        if (n < part.size()) break;
    }
    return used;
}

TEST(RequestReader, ContentLengthInAnyPieces) {
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n";
    const std::string bytes = "\r\n" + head + "hello world" + "GET /health HTTP/1.1\r\n\r\n";
    for (const size_t piece : {size_t(1), size_t(3), size_t(64), bytes.size()}) {
        request_reader r(1024);
        const size_t used = feed_in_pieces(r, bytes, piece);
        ASSERT_EQ(r.at(), phase::done) << piece;
        EXPECT_EQ(r.head(), head);
        EXPECT_EQ(r.body(), "hello world");
        EXPECT_EQ(bytes.substr(used), "GET /health HTTP/1.1\r\n\r\n") << "the next request is left alone";
        r.next();
        r.feed(std::string_view(bytes).substr(used));
        EXPECT_EQ(r.at(), phase::done);
        EXPECT_EQ(r.body(), "");
    }
}

TEST(RequestReader, ChunkedIsDecoded) {
    const std::string bytes = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\nNEXT";
    for (const size_t piece : {size_t(1), size_t(7), bytes.size()}) {
        request_reader r(1024);
        const size_t used = feed_in_pieces(r, bytes, piece);
        ASSERT_EQ(r.at(), phase::done) << piece << ": " << r.error().message;
        EXPECT_EQ(r.body(), "hello 0123456789");
        EXPECT_EQ(bytes.substr(used), "NEXT");
    }
}

request_error failure(const std::string& bytes, size_t max_body = 1024) {
    request_reader r(max_body);
    r.feed(bytes);
    EXPECT_EQ(r.at(), phase::failed) << bytes;
    return r.error();
}

TEST(RequestReader, RefusesAmbiguousFraming) {
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nX: a\nContent-Length: 5\r\n\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").status, 501);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\n").status, 415);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").status, 400);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n").status, 400);
    EXPECT_EQ(failure("GET / HTTP/1.1\r\n" + std::string(request_reader::max_head_bytes, 'a')).status, 431);
}

TEST(RequestReader, BareLineEndingsFailAtOnce) {
    // No blank line is needed: the first bare LF or CR fails the head, in any pieces.
    for (const char* head : {"GET /health HTTP/1.1\nHost: x\n", "GET /health HTTP/1.1\r\nHost: x\rY: z"}) {
        for (const size_t piece : {size_t(1), size_t(5), size_t(100)}) {
            request_reader r(1024);
            feed_in_pieces(r, head, piece);
            EXPECT_EQ(r.at(), phase::failed) << head << " in pieces of " << piece;
            EXPECT_EQ(r.error().status, 400);
            EXPECT_NE(r.error().message.find("bare"), std::string::npos) << r.error().message;
        }
    }
    // A body's own line ends are not the head's.
    request_reader r(1024);
    r.feed("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\na\nb");
    EXPECT_EQ(r.at(), phase::done);
}

TEST(RequestReader, BodyOverTheLimitBeforeItIsRead) {
    const request_error e = failure("POST / HTTP/1.1\r\nContent-Length: 52428800\r\nExpect: 100-continue\r\n\r\n", 8u << 20);
    EXPECT_EQ(e.status, 413);
    EXPECT_NE(e.message.find("52428800"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("8388608"), std::string::npos) << e.message;
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n").status, 413);
    EXPECT_EQ(failure("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + std::string(1024, 'a') +
                      "\r\n1\r\n").status, 413);

    request_reader r(1024);
    r.feed("POST / HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
    EXPECT_EQ(r.at(), phase::body);
    EXPECT_TRUE(r.take_continue());
    EXPECT_FALSE(r.take_continue());
    r.feed("abc");
    EXPECT_EQ(r.at(), phase::done);
}

TEST(JsonDepth, CountsNestingOutsideStrings) {
    const auto nested = [](int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); };
    EXPECT_NO_THROW(check_json_depth(nested(max_json_depth)));
    EXPECT_NO_THROW(check_json_depth("{\"a\": \"" + std::string(1000, '[') + "\\\"[\"}"));
    try {
        check_json_depth(std::string(8u << 20, '['));
        FAIL() << "no error";
    } catch (const api_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.code, "too_deep");
        EXPECT_NE(std::string(e.what()).find(std::to_string(max_json_depth)), std::string::npos) << e.what();
    }
    EXPECT_THROW(check_json_depth(nested(max_json_depth + 1)), api_error);
}

}  // namespace
}  // namespace strata::server
