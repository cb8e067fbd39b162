// The parsed template: expression and statement trees, each node carrying its template line.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/value.hpp"

namespace strata::jinja::detail {

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
    enum class kind {
        literal,   // lit
        name,      // name
        list,      // args
        tuple,     // args
        dict,      // args: key, value, key, value, ...
        attr,      // args[0].name
        item,      // args[0][args[1]]
        slice,     // args[0][args[1]:args[2]:args[3]] (null when omitted)
        call,      // args[0](args[1..], kwargs)
        filter,    // args[0] | name(args[1..], kwargs)
        test,      // args[0] is [not] name(args[1..], kwargs)
        unary,     // name ("not", "-", "+") args[0]
        binary,    // args[0] name args[1]: + - * / // % ** ~ and or == != < <= > >= in "not in"
        cond,      // args[1] if args[0] else args[2] (args[2] null: undefined)
    };
    kind k;
    int line = 0;
    value lit;
    std::string name;
    bool negated = false;  // "is not"
    std::vector<expr_ptr> args;
    std::vector<std::pair<std::string, expr_ptr>> kwargs;
};

struct node;
using body = std::vector<node>;

struct node {
    enum class kind { text, output, if_, for_, set, set_block, macro, call_block, filter_block, break_, continue_, scope };
    kind k;
    int line = 0;
    std::string text;                 // text: the text; set/set_block/macro: the name; filter_block: filter name
    std::vector<std::string> targets;  // for/set: names bound (set "ns.attr": targets = {ns}, attr = attr)
    std::string attr;
    expr_ptr value;                   // output, set, for (iterable), filter_block (filter call as expr)
    expr_ptr cond;                    // for ... if cond
    std::vector<std::pair<expr_ptr, body>> branches;  // if/elif (cond) then else (null cond)
    body children;                    // for/set_block/macro/filter_block/scope body
    body else_children;               // for ... else
    std::vector<std::pair<std::string, expr_ptr>> params;  // macro parameters and their defaults
};

// Whitespace handling as transformers configures Jinja2.
struct lex_options {
    bool trim_blocks = true;
    bool lstrip_blocks = true;
};

// Parses a template; throws template_error "line N: ..." on a syntax error.
body parse_template(std::string_view source, const lex_options& opt);

}  // namespace strata::jinja::detail
