// Small text helpers for the server: UTF-8 checks, secrets comparison, host classification.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace strata::server {

// The byte offset of the first byte that is not part of well-formed UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF included), or nothing when all of `s` is well-formed.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// `s` with every ill-formed sequence replaced by U+FFFD (token pieces can end inside a character).
std::string to_valid_utf8(std::string_view s);

// Compares in time that depends only on the lengths, never on where the strings differ.
bool equal_constant_time(std::string_view a, std::string_view b);

// 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(std::string_view host);

}  // namespace strata::server
