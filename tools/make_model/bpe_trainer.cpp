#include "bpe_trainer.hpp"

#include <cctype>
#include <map>
#include <set>
#include <utility>

namespace strata::make_model {

namespace {

std::string utf8(unsigned cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

bool printable_byte(unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

}  // namespace

std::string byte_symbol(unsigned char b) {
    if (printable_byte(b)) return utf8(b);
    // The non-printable bytes take code points 256, 257, ... in byte order.
    unsigned n = 0;
    for (unsigned c = 0; c < b; ++c)
        if (!printable_byte(c)) ++n;
    return utf8(256 + n);
}

std::vector<std::string> pre_split(std::string_view t) {
    std::vector<std::string> out;
    auto alpha = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; };
    auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
    auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    size_t i = 0;
    while (i < t.size()) {
        const size_t start = i;
        if (t[i] == '\'' && i + 1 < t.size()) {
            static constexpr std::string_view kSuffixes[] = {"'ll", "'re", "'ve", "'s", "'t", "'m", "'d"};
            bool matched = false;
            for (std::string_view s : kSuffixes)
                if (t.substr(i, s.size()) == s) {
                    i += s.size();
                    matched = true;
                    break;
                }
            if (matched) {
                out.emplace_back(t.substr(start, i - start));
                continue;
            }
        }
        if (alpha(t[i]) || (!digit(t[i]) && t[i] != '\n' && t[i] != '\r' && i + 1 < t.size() && alpha(t[i + 1]))) {
            ++i;
            while (i < t.size() && alpha(t[i])) ++i;
        } else if (digit(t[i])) {
            ++i;
        } else if (!space(t[i]) || (t[i] == ' ' && i + 1 < t.size() && !space(t[i + 1]) && !alpha(t[i + 1]) &&
                                    !digit(t[i + 1]))) {
            if (t[i] == ' ') ++i;
            while (i < t.size() && !space(t[i]) && !alpha(t[i]) && !digit(t[i])) ++i;
            while (i < t.size() && (t[i] == '\n' || t[i] == '\r')) ++i;
        } else {
            while (i < t.size() && space(t[i])) ++i;
            // Leave one space to lead the next word (as "\s+(?!\S)" does).
            if (i < t.size() && i - start > 1 && t[i - 1] == ' ') --i;
        }
        out.emplace_back(t.substr(start, i - start));
    }
    return out;
}

bpe_vocab train_bpe(std::string_view text, size_t max_merges) {
    bpe_vocab v;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_symbol(static_cast<unsigned char>(b)));
    std::set<std::string> known(v.tokens.begin(), v.tokens.end());

    std::map<std::string, int> word_counts;
    for (const std::string& w : pre_split(text)) word_counts[w]++;
    // Each distinct word as its current symbol sequence, with its frequency.
    std::vector<std::pair<std::vector<std::string>, int>> words;
    for (const auto& [w, n] : word_counts) {
        std::vector<std::string> symbols;
        for (unsigned char c : w) symbols.push_back(byte_symbol(c));
        words.emplace_back(std::move(symbols), n);
    }

    while (v.merges.size() < max_merges) {
        std::map<std::pair<std::string, std::string>, int> pairs;
        for (const auto& [symbols, n] : words)
            for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += n;
        if (pairs.empty()) break;
        auto best = pairs.begin();
        for (auto it = pairs.begin(); it != pairs.end(); ++it)
            if (it->second > best->second) best = it;  // std::map order breaks ties deterministically
        const auto [left, right] = best->first;
        const std::string merged = left + right;
        v.merges.push_back(left + " " + right);
        // Two merges can spell the same text ("a bc", "ab c"); the vocabulary keeps one token for it.
        if (known.insert(merged).second) v.tokens.push_back(merged);
        for (auto& [symbols, n] : words) {
            std::vector<std::string> next;
            next.reserve(symbols.size());
            for (size_t i = 0; i < symbols.size(); ++i) {
                if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
                    next.push_back(merged);
                    ++i;
                } else {
                    next.push_back(symbols[i]);
                }
            }
            symbols = std::move(next);
        }
    }
    return v;
}

}  // namespace strata::make_model
