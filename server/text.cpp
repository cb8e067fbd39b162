#include "text.hpp"

#include <cstdint>

namespace strata::server {

// Length of the well-formed UTF-8 sequence at s[i], or 0 when it is ill-formed (Unicode 15, table 3-7).
static size_t utf8_sequence_length(std::string_view s, size_t i) {
    const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const uint8_t b0 = byte(i);
    if (b0 < 0x80) return 1;
    size_t n = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) n = 2;
    else if (b0 == 0xE0) n = 3, lo = 0xA0;
    else if (b0 == 0xED) n = 3, hi = 0x9F;
    else if (b0 >= 0xE1 && b0 <= 0xEF) n = 3;
    else if (b0 == 0xF0) n = 4, lo = 0x90;
    else if (b0 == 0xF4) n = 4, hi = 0x8F;
    else if (b0 >= 0xF1 && b0 <= 0xF3) n = 4;
    else return 0;
    if (i + n > s.size()) return 0;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
    for (size_t k = 2; k < n; ++k)
        if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
    return n;
}

std::optional<size_t> find_invalid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_sequence_length(s, i);
        if (n == 0) return i;
        i += n;
    }
    return std::nullopt;
}

std::string to_valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_sequence_length(s, i);
        if (n == 0) {
            out += "\xEF\xBF\xBD";
            ++i;
        } else {
            out.append(s.substr(i, n));
            i += n;
        }
    }
    return out;
}

bool equal_constant_time(std::string_view a, std::string_view b) {
    // Every byte of the longer string is read whatever the contents; a length difference counts as a
    // difference without an early exit.
    const size_t n = a.size() > b.size() ? a.size() : b.size();
    unsigned diff = a.size() == b.size() ? 0u : 1u;
    for (size_t i = 0; i < n; ++i) {
        const unsigned x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0u;
        const unsigned y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0u;
        diff |= x ^ y;
    }
    volatile unsigned sink = diff;  // keeps the compiler from turning the loop into an early-exit compare
    return sink == 0;
}

bool is_loopback_host(std::string_view host) {
    if (host == "localhost" || host == "::1" || host == "[::1]") return true;
    return host.starts_with("127.");
}

}  // namespace strata::server
