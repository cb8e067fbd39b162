#include <charconv>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "tokenizer/merge_queue.hpp"
#include "tokenizer/models.hpp"

namespace strata::tok {

namespace {

// Pieces the merges may form: the model's own subwords, not control, byte or placeholder tokens.
int32_t find_piece(const vocab& v, std::string_view text) {
    const auto it = v.piece_to_id.find(std::string(text));
    if (it == v.piece_to_id.end()) return -1;
    const token_type t = v.type[static_cast<size_t>(it->second)];
    return t == token_type::normal || t == token_type::user_defined || t == token_type::undefined ? it->second : -1;
}

}  // namespace

void spm_encode(const vocab& v, std::string_view text, std::vector<int32_t>& out) {
    std::vector<merge_symbol> sym;
    for (size_t pos = 0; pos < text.size();) {
        const utf8_seq q = utf8_next(text, pos);
        const int idx = static_cast<int>(sym.size());
        sym.push_back({pos, q.length, idx - 1, pos + q.length < text.size() ? idx + 1 : -1});
        pos += q.length;
    }
    run_merges(text, sym, [&](std::string_view a, std::string_view b, double& priority) {
        std::string joined(a);
        joined += b;
        const int32_t id = find_piece(v, joined);
        if (id < 0) return false;
        priority = v.score[static_cast<size_t>(id)];
        return true;
    });
    for (const merge_symbol& s : sym) {
        if (s.length == 0) continue;
        const std::string_view piece = text.substr(s.begin, s.length);
        if (const int32_t id = find_piece(v, piece); id >= 0) {
            out.push_back(id);
            continue;
        }
        // Byte fallback: every byte of a character the vocabulary lacks as its <0xXX> token.
        for (unsigned char c : piece) {
            const int32_t id = v.byte_token[c] >= 0 ? v.byte_token[c] : v.unk;
            if (id < 0)
                throw std::runtime_error(fmt::format("tokenizer: byte 0x{:02X} has neither a <0x{:02X}> token nor an "
                                                     "unknown token to stand for it",
                                                     c, c));
            out.push_back(id);
        }
    }
}

std::string spm_piece(const vocab& v, int32_t id) {
    const std::string& t = v.text[static_cast<size_t>(id)];
    switch (v.type[static_cast<size_t>(id)]) {
        case token_type::byte: {
            // "<0xXX>"; a malformed byte token renders as its text.
            unsigned value = 0;
            if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' &&
                std::from_chars(t.data() + 3, t.data() + 5, value, 16).ptr == t.data() + 5)
                return std::string(1, static_cast<char>(value));
            return t;
        }
        case token_type::unknown: return "\xE2\x96\x85";  // U+2585, as llama.cpp renders unk
        default: {
            std::string out;
            for (size_t pos = 0; pos < t.size();) {
                if (t.compare(pos, kSpmSpace.size(), kSpmSpace) == 0) {
                    out += ' ';
                    pos += kSpmSpace.size();
                } else {
                    out += t[pos++];
                }
            }
            return out;
        }
    }
}

}  // namespace strata::tok
