#include <spdlog/fmt/fmt.h>

#include "tokenizer/merge_queue.hpp"
#include "tokenizer/models.hpp"

namespace strata::tok {

namespace {

void encode_word(const vocab& v, const byte_unicode_map& bytes, std::string_view word, std::string& mapped,
                 std::string& key, std::vector<merge_symbol>& sym, std::vector<int32_t>& out) {
    mapped.clear();
    sym.clear();
    for (size_t i = 0; i < word.size(); ++i) {
        const std::string& s = bytes.encode(static_cast<uint8_t>(word[i]));
        const int idx = static_cast<int>(i);
        sym.push_back({mapped.size(), s.size(), idx - 1, i + 1 < word.size() ? idx + 1 : -1});
        mapped += s;
    }
    if (v.ignore_merges)
        if (const auto it = v.piece_to_id.find(mapped); it != v.piece_to_id.end()) {
            out.push_back(it->second);
            return;
        }
    run_merges(mapped, sym, [&](std::string_view a, std::string_view b, double& priority) {
        key.assign(a);
        key += ' ';
        key += b;
        const auto it = v.merge_rank.find(key);
        if (it == v.merge_rank.end()) return false;
        priority = -static_cast<double>(it->second);
        return true;
    });
    for (const merge_symbol& s : sym) {
        if (s.length == 0) continue;
        key.assign(mapped, s.begin, s.length);
        if (const auto it = v.piece_to_id.find(key); it != v.piece_to_id.end()) {
            out.push_back(it->second);
            continue;
        }
        // A merge whose result is not a token: spell the symbol's bytes one by one; a byte without a
        // token is dropped, as llama.cpp does.
        for (size_t pos = s.begin; pos < s.begin + s.length;) {
            const utf8_seq q = utf8_next(mapped, pos);
            key.assign(mapped, pos, q.length);
            if (const auto it = v.piece_to_id.find(key); it != v.piece_to_id.end()) out.push_back(it->second);
            pos += q.length;
        }
    }
}

}  // namespace

void bpe_encode(const vocab& v, const pre_splitter& splitter, const byte_unicode_map& bytes, std::string_view text,
                std::vector<int32_t>& out) {
    std::string mapped, key;
    std::vector<merge_symbol> sym;
    for (std::string_view word : splitter.split(text)) encode_word(v, bytes, word, mapped, key, sym, out);
}

std::string bpe_piece(const vocab& v, const byte_unicode_map& bytes, int32_t id) {
    const std::string& t = v.text[static_cast<size_t>(id)];
    if (v.type[static_cast<size_t>(id)] == token_type::user_defined) return t;  // added tokens are plain text
    std::string out;
    for (size_t pos = 0; pos < t.size();) {
        const utf8_seq q = utf8_next(t, pos);
        const int b = q.status == utf8_status::ok ? bytes.decode(utf8_decode(t, pos, q.length)) : -1;
        if (b >= 0)
            out += static_cast<char>(b);
        else
            out.append(t, pos, q.length);  // not a byte symbol: keep the text as it is
        pos += q.length;
    }
    return out;
}

}  // namespace strata::tok
