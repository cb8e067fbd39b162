// UTF-8 helpers for the tokenizer: sequence validation, the incomplete tail a stream must hold back,
// and GPT-2's reversible byte <-> printable code point mapping.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace strata::tok {

enum class utf8_status { ok, incomplete, invalid };

struct utf8_seq {
    utf8_status status;
    size_t length;  // ok: bytes of the character; incomplete: bytes present; invalid: 1
};

// Classifies the sequence starting at s[pos] (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
utf8_seq utf8_next(std::string_view s, size_t pos);

// Bytes at the end of s that start a valid sequence not yet complete (0..3).
size_t utf8_incomplete_tail(std::string_view s);

bool utf8_valid(std::string_view s);

// s with every byte that does not belong to a valid sequence replaced by U+FFFD.
std::string replace_invalid_utf8(std::string_view s);

// The code point of a sequence utf8_next reported ok.
char32_t utf8_decode(std::string_view s, size_t pos, size_t length);

// Appends the UTF-8 encoding of cp (which must be a valid scalar value).
void utf8_append(std::string& out, char32_t cp);

// U+FFFD, what the stream decoder writes for bytes that can never form a character.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// GPT-2 byte-level BPE spells every byte as a printable code point: bytes 33-126, 161-172 and
// 174-255 as themselves, the other 68 as U+0100.. in byte order.
class byte_unicode_map {
public:
    byte_unicode_map();
    const std::string& encode(uint8_t b) const { return symbol_[b]; }
    // The byte a code point stands for; -1 when it is not one of the 256 symbols.
    int decode(char32_t cp) const;

private:
    std::array<std::string, 256> symbol_;
    std::unordered_map<char32_t, uint8_t> byte_of_;
};

}  // namespace strata::tok
