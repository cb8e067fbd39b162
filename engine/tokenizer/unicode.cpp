#include "tokenizer/unicode.hpp"

namespace strata::tok {

utf8_seq utf8_next(std::string_view s, size_t pos) {
    const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
    const uint8_t lead = byte(pos);
    if (lead < 0x80) return {utf8_status::ok, 1};
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (lead >= 0xC2 && lead <= 0xDF) {
        need = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        need = 3;
        if (lead == 0xE0) lo = 0xA0;  // overlong
        if (lead == 0xED) hi = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        need = 4;
        if (lead == 0xF0) lo = 0x90;  // overlong
        if (lead == 0xF4) hi = 0x8F;  // beyond U+10FFFF
    } else {
        return {utf8_status::invalid, 1};
    }
    for (size_t k = 1; k < need; ++k) {
        if (pos + k >= s.size()) return {utf8_status::incomplete, k};
        const uint8_t c = byte(pos + k);
        const uint8_t min = k == 1 ? lo : uint8_t{0x80}, max = k == 1 ? hi : uint8_t{0xBF};
        if (c < min || c > max) return {utf8_status::invalid, 1};
    }
    return {utf8_status::ok, need};
}

size_t utf8_incomplete_tail(std::string_view s) {
    // An incomplete sequence is at most 3 bytes, so only the last 3 lead positions can start one.
    const size_t first = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t pos = first; pos < s.size(); ++pos) {
        const utf8_seq q = utf8_next(s, pos);
        if (q.status == utf8_status::incomplete) return s.size() - pos;
    }
    return 0;
}

bool utf8_valid(std::string_view s) {
    for (size_t pos = 0; pos < s.size();) {
        const utf8_seq q = utf8_next(s, pos);
        if (q.status != utf8_status::ok) return false;
        pos += q.length;
    }
    return true;
}

std::string replace_invalid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t pos = 0; pos < s.size();) {
        const utf8_seq q = utf8_next(s, pos);
        if (q.status == utf8_status::ok) {
            out.append(s, pos, q.length);
            pos += q.length;
        } else {
            out += kReplacementChar;
            pos += 1;
        }
    }
    return out;
}

char32_t utf8_decode(std::string_view s, size_t pos, size_t length) {
    const auto byte = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(s[pos + i])); };
    switch (length) {
        case 1: return byte(0);
        case 2: return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
        case 3: return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
        default: return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F);
    }
}

void utf8_append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

namespace {

bool printable_byte(unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

}  // namespace

byte_unicode_map::byte_unicode_map() {
    char32_t next_unprintable = 256;
    for (unsigned b = 0; b < 256; ++b) {
        const char32_t cp = printable_byte(b) ? char32_t(b) : next_unprintable++;
        utf8_append(symbol_[b], cp);
        byte_of_[cp] = static_cast<uint8_t>(b);
    }
}

int byte_unicode_map::decode(char32_t cp) const {
    const auto it = byte_of_.find(cp);
    return it == byte_of_.end() ? -1 : it->second;
}

}  // namespace strata::tok
