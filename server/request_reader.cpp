#include "request_reader.hpp"

#include <algorithm>
#include <charconv>
#include <vector>

#include <spdlog/fmt/fmt.h>

namespace strata::server {
namespace {

constexpr size_t max_chunk_line = 1024;
constexpr size_t max_trailer_bytes = 16 * 1024;

bool equal_ci(std::string_view a, std::string_view b) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) { return lower(x) == lower(y); });
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

bool all_digits(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The head's lines without their CRLF, the blank last one excluded; false when a CR or LF stands alone.
bool split_lines(std::string_view head, std::vector<std::string_view>& lines) {
    for (size_t i = 0; i < head.size(); ++i) {
        if (head[i] == '\r' && (i + 1 == head.size() || head[i + 1] != '\n')) return false;
        if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) return false;
    }
    size_t pos = 0;
    while (pos < head.size()) {
        const size_t end = head.find("\r\n", pos);
        if (end == pos) break;
        lines.push_back(head.substr(pos, end - pos));
        pos = end + 2;
    }
    return true;
}

}  // namespace

request_line parse_request_line(std::string_view head) {
    const std::string_view line = head.substr(0, head.find("\r\n"));
    const size_t sp1 = line.find(' ');
    if (sp1 == std::string_view::npos) return {};
    const size_t sp2 = line.find(' ', sp1 + 1);
    std::string_view target = line.substr(sp1 + 1, sp2 == std::string_view::npos ? std::string_view::npos : sp2 - sp1 - 1);
    target = target.substr(0, target.find('?'));
    return {line.substr(0, sp1), target};
}

std::optional<std::string_view> header_value(std::string_view head, std::string_view name) {
    size_t pos = head.find("\r\n");
    while (pos != std::string_view::npos && pos + 2 < head.size()) {
        const size_t start = pos + 2;
        const size_t end = std::min(head.find("\r\n", start), head.size());
        const std::string_view line = head.substr(start, end - start);
        const size_t colon = line.find(':');
        if (colon != std::string_view::npos && equal_ci(line.substr(0, colon), name))
            return trim(line.substr(colon + 1));
        pos = end == head.size() ? std::string_view::npos : end;
    }
    return std::nullopt;
}

void request_reader::fail(int status, std::string message, std::string code) {
    phase_ = phase::failed;
    error_ = {status, std::move(message), std::move(code)};
}

bool request_reader::take_continue() {
    const bool c = continue_;
    continue_ = false;
    return c;
}

void request_reader::next() {
    phase_ = phase::idle;
    error_ = {};
    head_.clear();
    body_ = std::string();  // the worker moved it out; start without its capacity
    chunked_ = false;
    content_length_ = 0;
    continue_ = false;
    step_ = chunk_step::size_line;
    line_.clear();
    chunk_left_ = 0;
    trailer_bytes_ = 0;
}

size_t request_reader::feed(std::string_view data) {
    size_t used = 0;
    if (phase_ == phase::idle || phase_ == phase::head) {
        used += feed_head(data);
        if (pause_after_head_) return used;
    }
    if (phase_ == phase::body) used += chunked_ ? feed_chunked(data.substr(used)) : feed_body(data.substr(used));
    return used;
}

size_t request_reader::feed_head(std::string_view data) {
    size_t used = 0;
    if (phase_ == phase::idle) {
        // RFC 9112 2.2: empty lines before a request line are ignored.
        while (used < data.size() && (data[used] == '\r' || data[used] == '\n')) ++used;
        if (used == data.size()) return used;
        phase_ = phase::head;
    }
    const size_t before = head_.size();
    head_.append(data.substr(used));
    const size_t end = head_.find("\r\n\r\n", before < 3 ? 0 : before - 3);
    // A bare LF or CR is refused as soon as it arrives: a client that ends its lines with LF alone
    // would otherwise wait for a CRLF CRLF that never comes.
    const size_t from = before == 0 ? 0 : before - 1;
    const size_t scan_end = end == std::string::npos ? head_.size() : end + 4;
    for (size_t i = from; i < scan_end; ++i) {
        const bool bare_lf = head_[i] == '\n' && (i == 0 || head_[i - 1] != '\r');
        const bool bare_cr = head_[i] == '\r' && i + 1 < scan_end && head_[i + 1] != '\n';
        if (bare_lf || bare_cr) {
            fail(400, fmt::format("the request head has a bare {} at byte {}: lines must end in CRLF",
                                  bare_lf ? "LF" : "CR", i), "malformed_request");
            return data.size();
        }
    }
    if (end == std::string::npos) {
        if (head_.size() > max_head_bytes)
            fail(431, fmt::format("the request head (request line and headers) is longer than {} bytes", max_head_bytes),
                 "headers_too_large");
        return data.size();
    }
    head_.resize(end + 4);
    if (head_.size() > max_head_bytes) {
        fail(431, fmt::format("the request head (request line and headers) is {} bytes, more than the limit of {}",
                              head_.size(), max_head_bytes), "headers_too_large");
        return data.size();
    }
    used += head_.size() - before;
    parse_head();
    return used;
}

void request_reader::parse_head() {
    std::vector<std::string_view> lines;
    if (!split_lines(head_, lines) || lines.empty())
        return fail(400, "the request head has a CR or LF outside a CRLF line ending", "malformed_request");
    const std::string_view request_line = lines[0];
    const bool http10 = request_line.size() >= 8 && request_line.substr(request_line.size() - 8) == "HTTP/1.0";

    bool has_length = false;
    std::vector<std::string_view> codings;
    std::string_view expect;
    for (size_t i = 1; i < lines.size(); ++i) {
        const std::string_view line = lines[i];
        if (line.front() == ' ' || line.front() == '\t')
            return fail(400, fmt::format("header line {} continues the one before (obsolete line folding)", i),
                        "malformed_request");
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos || colon == 0)
            return fail(400, fmt::format("header line {} has no name before a colon", i), "malformed_request");
        const std::string_view name = line.substr(0, colon);
        if (name.find_first_of(" \t") != std::string_view::npos)
            return fail(400, fmt::format("header '{}' has whitespace before its colon", trim(name)), "malformed_request");
        const std::string_view value = trim(line.substr(colon + 1));
        if (equal_ci(name, "Content-Length")) {
            uint64_t n = 0;
            const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
            if (!all_digits(value) || ec == std::errc::invalid_argument)
                return fail(400, fmt::format("Content-Length '{}' is not a number of bytes", value), "malformed_request");
            if (ec == std::errc::result_out_of_range) n = UINT64_MAX;
            if (has_length && n != content_length_)
                return fail(400, fmt::format("the request has two different Content-Length values ({} and {})",
                                             content_length_, n), "malformed_request");
            has_length = true;
            content_length_ = n;
        } else if (equal_ci(name, "Transfer-Encoding")) {
            codings.push_back(value);
        } else if (equal_ci(name, "Expect")) {
            expect = value;
        } else if (equal_ci(name, "Content-Encoding") && !equal_ci(value, "identity")) {
            return fail(415, fmt::format("Content-Encoding '{}' is not supported; send the body uncompressed", value),
                        "unsupported_encoding");
        }
    }

    if (!codings.empty()) {
        if (has_length)
            return fail(400, "the request has both Transfer-Encoding and Content-Length; send only one (either could "
                             "delimit the body, which lets requests be smuggled past a proxy)", "malformed_request");
        if (codings.size() != 1 || !equal_ci(codings[0], "chunked"))
            return fail(501, fmt::format("Transfer-Encoding '{}' is not supported; only 'chunked' is",
                                         fmt::join(codings, ", ")), "unsupported_encoding");
        chunked_ = true;
    } else if (content_length_ > max_body_) {
        return fail(413, fmt::format("the request body of {} bytes (Content-Length) is larger than the limit of {} "
                                     "bytes (--max-body)", content_length_, max_body_), "request_too_large");
    }
    if (!expect.empty()) {
        if (!equal_ci(expect, "100-continue"))
            return fail(417, fmt::format("Expect '{}' is not supported; only '100-continue' is", expect),
                        "expectation_failed");
        continue_ = !http10 && (chunked_ || content_length_ > 0);
    }
    if (!chunked_) body_.reserve(static_cast<size_t>(content_length_));
    phase_ = chunked_ || content_length_ > 0 ? phase::body : phase::done;
}

size_t request_reader::feed_body(std::string_view data) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(data.size(), content_length_ - body_.size()));
    body_.append(data.substr(0, n));
    if (body_.size() == content_length_) phase_ = phase::done;
    return n;
}

bool request_reader::take_line(std::string_view data, size_t& used, size_t limit) {
    const size_t lf = data.find('\n', used);
    const size_t end = lf == std::string_view::npos ? data.size() : lf + 1;
    line_.append(data.substr(used, end - used));
    used = end;
    if (line_.size() > limit) {
        fail(400, fmt::format("a line of the chunked body is longer than {} bytes", limit), "malformed_request");
        return false;
    }
    if (lf == std::string_view::npos) return false;
    if (line_.size() < 2 || line_[line_.size() - 2] != '\r') {
        fail(400, "a line of the chunked body ends in LF without CR", "malformed_request");
        return false;
    }
    line_.resize(line_.size() - 2);
    return true;
}

size_t request_reader::feed_chunked(std::string_view data) {
    size_t used = 0;
    while (phase_ == phase::body && used < data.size()) {
        switch (step_) {
            case chunk_step::size_line: {
                if (!take_line(data, used, max_chunk_line)) break;
                // chunk-size in hex, then optional chunk extensions (";name=value"), which are ignored
                const std::string_view line = line_;
                const size_t digits = std::min(line.find_first_not_of("0123456789abcdefABCDEF"), line.size());
                const std::string_view rest = trim(line.substr(digits));
                if (digits == 0 || digits > 15 || (!rest.empty() && rest.front() != ';')) {
                    fail(400, fmt::format("'{}' is not a chunk size (hexadecimal digits)", line.substr(0, 40)),
                         "malformed_request");
                    break;
                }
                std::from_chars(line.data(), line.data() + digits, chunk_left_, 16);
                line_.clear();
                if (chunk_left_ > max_body_ - std::min<uint64_t>(max_body_, body_.size())) {
                    fail(413, fmt::format("the chunked request body is larger than the limit of {} bytes (--max-body)",
                                          max_body_), "request_too_large");
                    break;
                }
                step_ = chunk_left_ == 0 ? chunk_step::trailer : chunk_step::data;
                break;
            }
            case chunk_step::data: {
                const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_left_, data.size() - used));
                body_.append(data.substr(used, n));
                used += n;
                chunk_left_ -= n;
                if (chunk_left_ == 0) step_ = chunk_step::data_end;
                break;
            }
            case chunk_step::data_end:
                if (!take_line(data, used, 2)) break;
                if (!line_.empty()) {
                    fail(400, "a chunk's data is longer than its size says", "malformed_request");
                    break;
                }
                step_ = chunk_step::size_line;
                break;
            case chunk_step::trailer:
                // Trailer fields after the last chunk are read and dropped; a blank line ends the body.
                if (!take_line(data, used, max_chunk_line)) break;
                trailer_bytes_ += line_.size() + 2;
                if (trailer_bytes_ > max_trailer_bytes) {
                    fail(400, fmt::format("the chunked body's trailer is longer than {} bytes", max_trailer_bytes),
                         "malformed_request");
                    break;
                }
                if (line_.empty()) phase_ = phase::done;
                line_.clear();
                break;
        }
    }
    return used;
}

}  // namespace strata::server
