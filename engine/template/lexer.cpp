// Tokenizer following Jinja2's lexer rules for the default delimiters.
#include "template/lexer.hpp"

#include <algorithm>
#include <cctype>

namespace strata::jinja::detail {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int count_lines(std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

[[noreturn]] void fail(int line, const std::string& msg) {
    throw template_error("line " + std::to_string(line) + ": " + msg);
}

class lexer {
public:
    lexer(std::string_view src, const lex_options& opt) : src_(src), opt_(opt) {}

    std::vector<token> run() {
        bool line_starting = true;
        while (pos_ < src_.size()) {
            std::size_t start = next_tag(pos_);
            std::string text(src_.substr(pos_, start - pos_));
            if (start == src_.size()) {
                emit_text(text);
                break;
            }
            char type = src_[start + 1];  // '{', '%' or '#'
            char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
            if (sign == '-') {
                text.erase(std::find_if_not(text.rbegin(), text.rend(), is_space).base(), text.end());
            } else if (sign != '+' && opt_.lstrip_blocks && type != '{') {
                std::size_t l_pos = text.rfind('\n');
                l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
                if ((l_pos > 0 || line_starting) &&
                    text.find_first_not_of(" \t", l_pos) == std::string::npos)
                    text.resize(l_pos);
            }
            emit_text(text);
            line_ += count_lines(src_.substr(pos_, start - pos_));
            pos_ = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
            if (type == '#')
                skip_comment();
            else
                lex_tag(type == '{');
            line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
        }
        out_.push_back({token::kind::eof, "", line_});
        return std::move(out_);
    }

private:
    std::size_t next_tag(std::size_t from) const {
        for (std::size_t i = src_.find('{', from); i != std::string_view::npos; i = src_.find('{', i + 1))
            if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
        return src_.size();
    }

    void emit_text(const std::string& text) {
        if (!text.empty()) out_.push_back({token::kind::text, text, line_});
    }

    // After an end delimiter: "-" strips all following whitespace, trim_blocks one newline.
    void after_end(char sign, bool block) {
        std::size_t begin = pos_;
        if (sign == '-') {
            while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
        } else if (sign != '+' && block && opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
            ++pos_;
        }
        line_ += count_lines(src_.substr(begin, pos_ - begin));
    }

    void skip_comment() {
        std::size_t end = src_.find("#}", pos_);
        if (end == std::string_view::npos) fail(line_, "unclosed comment");
        char sign = end > pos_ ? src_[end - 1] : '\0';
        line_ += count_lines(src_.substr(pos_, end - pos_));
        pos_ = end + 2;
        after_end(sign, true);
    }

    void lex_tag(bool variable) {
        out_.push_back({variable ? token::kind::var_begin : token::kind::block_begin, "", line_});
        int depth = 0;  // open brackets: an end delimiter inside them is not one
        for (;;) {
            while (pos_ < src_.size() && is_space(src_[pos_])) {
                if (src_[pos_] == '\n') ++line_;
                ++pos_;
            }
            if (pos_ >= src_.size()) fail(line_, variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
            std::string_view rest = src_.substr(pos_);
            if (depth == 0) {
                const char* close = variable ? "}}" : "%}";
                char sign = rest[0];
                std::size_t skip = (sign == '-' || sign == '+') ? 1 : 0;
                if (rest.substr(skip, 2) == close && (skip == 0 || sign == '-' || !variable)) {
                    out_.push_back({variable ? token::kind::var_end : token::kind::block_end, "", line_});
                    pos_ += skip + 2;
                    after_end(skip ? sign : '\0', !variable);
                    return;
                }
            }
            lex_one(rest, depth);
        }
    }

    void lex_one(std::string_view rest, int& depth) {
        char c = rest[0];
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            std::size_t n = 1;
            while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
            push(token::kind::name, std::string(rest.substr(0, n)), n);
        } else if (std::isdigit(static_cast<unsigned char>(c))) {
            lex_number(rest);
        } else if (c == '\'' || c == '"') {
            lex_string(rest);
        } else {
            static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                              "<", ">", "=", ".", ",", ":", "|", "(", ")", "[", "]", "{", "}"};
            for (const char* op : ops) {
                std::string_view o(op);
                if (rest.substr(0, o.size()) == o) {
                    if (o == "(" || o == "[" || o == "{") ++depth;
                    if (o == ")" || o == "]" || o == "}") --depth;
                    push(token::kind::op, std::string(o), o.size());
                    return;
                }
            }
            fail(line_, std::string("unexpected character '") + c + "'");
        }
    }

    void push(token::kind k, std::string text, std::size_t consumed) {
        out_.push_back({k, std::move(text), line_});
        pos_ += consumed;
    }

    void lex_number(std::string_view rest) {
        std::size_t n = 0;
        bool is_float = false;
        auto digits = [&] {
            while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
        };
        digits();
        if (n + 1 < rest.size() && rest[n] == '.' && std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
            is_float = true;
            ++n;
            digits();
        }
        if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
            std::size_t m = n + 1;
            if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
            if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
                is_float = true;
                n = m;
                digits();
            }
        }
        std::string text(rest.substr(0, n));
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        out_.push_back({is_float ? token::kind::floating : token::kind::integer, text, line_});
        pos_ += n;
    }

    void lex_string(std::string_view rest) {
        char quote = rest[0];
        std::string out;
        std::size_t i = 1;
        int start_line = line_;
        for (; i < rest.size() && rest[i] != quote; ++i) {
            char c = rest[i];
            if (c == '\n') ++line_;
            if (c != '\\' || i + 1 >= rest.size()) {
                out += c;
                continue;
            }
            char e = rest[++i];
            switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '0': out += '\0'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'v': out += '\v'; break;
            case 'a': out += '\a'; break;
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            case '\n': ++line_; break;
            case 'x':
            case 'u':
            case 'U': {
                std::size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                std::string hex(rest.substr(i + 1, len));
                if (hex.size() != len || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
                    fail(line_, "bad escape in string literal");
                out += to_utf8(std::u32string(1, static_cast<char32_t>(std::stoul(hex, nullptr, 16))));
                i += len;
                break;
            }
            default: out += '\\'; out += e;
            }
        }
        if (i >= rest.size()) fail(start_line, "unterminated string literal");
        out_.push_back({token::kind::string, std::move(out), start_line});
        pos_ += i + 1;
    }

    std::string_view src_;
    lex_options opt_;
    std::size_t pos_ = 0;
    int line_ = 1;
    std::vector<token> out_;
};

}  // namespace

std::vector<token> tokenize(std::string_view src, const lex_options& opt) { return lexer(src, opt).run(); }

}  // namespace strata::jinja::detail
