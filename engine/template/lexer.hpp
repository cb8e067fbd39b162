// Jinja2's lexer: template text, {{ }} / {% %} delimiters (comments dropped) and the expression tokens
// between them, with whitespace control ("-", "+", trim_blocks, lstrip_blocks) applied to the text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "template/ast.hpp"

namespace strata::jinja::detail {

struct token {
    enum class kind { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
    kind k;
    std::string text;  // text, name, op, string (unescaped), number spelling
    int line = 1;
};

std::vector<token> tokenize(std::string_view src, const lex_options& opt);

}  // namespace strata::jinja::detail
