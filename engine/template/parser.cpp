// Recursive-descent parser with Jinja2's grammar and operator precedence (jinja2/parser.py):
// ternary < or < and < not < comparison < + - < ~ < * / // % < ** < unary - + < primary, postfix,
// then filters and tests.
#include <initializer_list>

#include "template/lexer.hpp"

namespace strata::jinja::detail {

namespace {

using tk = token::kind;

class parser {
public:
    explicit parser(std::vector<token> toks) : t_(std::move(toks)) {}

    body parse_all() {
        std::string end;
        body b = parse_body({}, end);
        return b;
    }

private:
    const token& cur() const { return t_[i_]; }
    const token& peek(std::size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
    bool is_op(std::string_view op) const { return cur().k == tk::op && cur().text == op; }
    bool is_name(std::string_view n) const { return cur().k == tk::name && cur().text == n; }
    [[noreturn]] void fail(const std::string& msg) const {
        throw template_error("line " + std::to_string(cur().line) + ": " + msg);
    }
    std::string describe() const {
        switch (cur().k) {
        case tk::eof: return "end of template";
        case tk::block_end: return "end of statement block";
        case tk::var_end: return "end of print statement";
        default: return "'" + cur().text + "'";
        }
    }
    void expect_op(std::string_view op) {
        if (!is_op(op)) fail("expected '" + std::string(op) + "', got " + describe());
        ++i_;
    }
    std::string expect_name() {
        if (cur().k != tk::name) fail("expected a name, got " + describe());
        return t_[i_++].text;
    }
    void expect_block_end() {
        if (cur().k != tk::block_end) fail("expected end of statement block, got " + describe());
        ++i_;
    }

    // Statements until a block whose keyword is in `ends` (consumed: the keyword, not its block end).
    body parse_body(std::initializer_list<std::string_view> ends, std::string& end_found) {
        body out;
        for (;;) {
            const token& tok = cur();
            if (tok.k == tk::eof) {
                if (ends.size() != 0) fail("unexpected end of template, expected '" + std::string(*ends.begin()) + "'");
                return out;
            }
            if (tok.k == tk::text) {
                node n{node::kind::text};
                n.line = tok.line;
                n.text = tok.text;
                out.push_back(std::move(n));
                ++i_;
            } else if (tok.k == tk::var_begin) {
                ++i_;
                node n{node::kind::output};
                n.line = tok.line;
                n.value = parse_tuple(true);
                if (cur().k != tk::var_end) fail("expected end of print statement, got " + describe());
                ++i_;
                out.push_back(std::move(n));
            } else if (tok.k == tk::block_begin) {
                ++i_;
                std::string kw = expect_name();
                for (std::string_view e : ends)
                    if (kw == e) {
                        end_found = kw;
                        return out;
                    }
                out.push_back(parse_statement(kw, tok.line));
            } else {
                fail("unexpected " + describe());
            }
        }
    }

    node parse_statement(const std::string& kw, int line) {
        node n{node::kind::text};
        n.line = line;
        std::string end;
        if (kw == "if") {
            n.k = node::kind::if_;
            expr_ptr c = parse_expression(true);
            expect_block_end();
            for (;;) {
                body b = parse_body({"elif", "else", "endif"}, end);
                n.branches.emplace_back(std::move(c), std::move(b));
                if (end == "elif") {
                    c = parse_expression(true);
                    expect_block_end();
                } else if (end == "else") {
                    expect_block_end();
                    n.branches.emplace_back(nullptr, parse_body({"endif"}, end));
                    expect_block_end();
                    break;
                } else {
                    expect_block_end();
                    break;
                }
            }
        } else if (kw == "for") {
            n.k = node::kind::for_;
            n.targets.push_back(expect_name());
            while (is_op(",")) {
                ++i_;
                n.targets.push_back(expect_name());
            }
            if (!is_name("in")) fail("expected 'in', got " + describe());
            ++i_;
            n.value = parse_tuple(false);
            if (is_name("if")) {
                ++i_;
                n.cond = parse_expression(true);
            }
            if (is_name("recursive")) fail("recursive for loops are not supported");
            expect_block_end();
            n.children = parse_body({"endfor", "else"}, end);
            if (end == "else") {
                expect_block_end();
                n.else_children = parse_body({"endfor"}, end);
            }
            expect_block_end();
        } else if (kw == "set") {
            n.targets.push_back(expect_name());
            if (is_op(".")) {
                ++i_;
                n.attr = expect_name();
            }
            while (is_op(",")) {
                ++i_;
                n.targets.push_back(expect_name());
            }
            if (is_op("=")) {
                ++i_;
                n.k = node::kind::set;
                n.value = parse_tuple(true);
                expect_block_end();
            } else {
                n.k = node::kind::set_block;
                if (is_op("|")) n.value = parse_filters(nullptr);
                expect_block_end();
                n.children = parse_body({"endset"}, end);
                expect_block_end();
            }
        } else if (kw == "macro") {
            n.k = node::kind::macro;
            n.text = expect_name();
            parse_params(n.params);
            expect_block_end();
            n.children = parse_body({"endmacro"}, end);
            expect_block_end();
        } else if (kw == "filter") {
            n.k = node::kind::filter_block;
            n.value = parse_filters(nullptr, false);
            expect_block_end();
            n.children = parse_body({"endfilter"}, end);
            expect_block_end();
        } else if (kw == "break" || kw == "continue") {
            n.k = kw == "break" ? node::kind::break_ : node::kind::continue_;
            expect_block_end();
        } else if (kw == "generation") {  // transformers' assistant-mask extension: renders its body
            n.k = node::kind::scope;
            expect_block_end();
            n.children = parse_body({"endgeneration"}, end);
            expect_block_end();
        } else {
            fail("unknown or unsupported tag '" + kw + "'");
        }
        return n;
    }

    void parse_params(std::vector<std::pair<std::string, expr_ptr>>& params) {
        expect_op("(");
        while (!is_op(")")) {
            if (!params.empty()) expect_op(",");
            if (is_op(")")) break;
            std::string name = expect_name();
            expr_ptr def;
            if (is_op("=")) {
                ++i_;
                def = parse_expression(true);
            }
            params.emplace_back(std::move(name), std::move(def));
        }
        ++i_;
    }

    expr_ptr make(expr::kind k, int line) {
        auto e = std::make_unique<expr>();
        e->k = k;
        e->line = line;
        return e;
    }

    expr_ptr parse_tuple(bool with_cond) {
        int line = cur().line;
        expr_ptr first = parse_expression(with_cond);
        if (!is_op(",")) return first;
        auto t = make(expr::kind::tuple, line);
        t->args.push_back(std::move(first));
        while (is_op(",")) {
            ++i_;
            if (cur().k == tk::var_end || cur().k == tk::block_end || is_op(")")) break;
            t->args.push_back(parse_expression(with_cond));
        }
        return t;
    }

    expr_ptr parse_expression(bool with_cond) {
        expr_ptr e = parse_or();
        if (!with_cond) return e;
        while (is_name("if")) {
            int line = cur().line;
            ++i_;
            auto c = make(expr::kind::cond, line);
            c->args.push_back(parse_or());  // condition
            c->args.push_back(std::move(e));  // value when true
            if (is_name("else")) {
                ++i_;
                c->args.push_back(parse_expression(true));
            } else {
                c->args.push_back(nullptr);
            }
            e = std::move(c);
        }
        return e;
    }

    expr_ptr binary(std::string op, expr_ptr l, expr_ptr r, int line) {
        auto b = make(expr::kind::binary, line);
        b->name = std::move(op);
        b->args.push_back(std::move(l));
        b->args.push_back(std::move(r));
        return b;
    }

    expr_ptr parse_or() {
        expr_ptr l = parse_and();
        while (is_name("or")) {
            int line = cur().line;
            ++i_;
            l = binary("or", std::move(l), parse_and(), line);
        }
        return l;
    }

    expr_ptr parse_and() {
        expr_ptr l = parse_not();
        while (is_name("and")) {
            int line = cur().line;
            ++i_;
            l = binary("and", std::move(l), parse_not(), line);
        }
        return l;
    }

    expr_ptr parse_not() {
        if (is_name("not")) {
            auto u = make(expr::kind::unary, cur().line);
            ++i_;
            u->name = "not";
            u->args.push_back(parse_not());
            return u;
        }
        return parse_compare();
    }

    expr_ptr parse_compare() {
        expr_ptr l = parse_math1();
        for (;;) {
            int line = cur().line;
            std::string op;
            if (cur().k == tk::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                      cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
                op = cur().text;
                ++i_;
            } else if (is_name("in")) {
                op = "in";
                ++i_;
            } else if (is_name("not") && peek().k == tk::name && peek().text == "in") {
                op = "not in";
                i_ += 2;
            } else {
                return l;
            }
            l = binary(op, std::move(l), parse_math1(), line);
        }
    }

    expr_ptr parse_math1() {
        expr_ptr l = parse_concat();
        while (is_op("+") || is_op("-")) {
            std::string op = cur().text;
            int line = cur().line;
            ++i_;
            l = binary(op, std::move(l), parse_concat(), line);
        }
        return l;
    }

    expr_ptr parse_concat() {
        expr_ptr l = parse_math2();
        while (is_op("~")) {
            int line = cur().line;
            ++i_;
            l = binary("~", std::move(l), parse_math2(), line);
        }
        return l;
    }

    expr_ptr parse_math2() {
        expr_ptr l = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            std::string op = cur().text;
            int line = cur().line;
            ++i_;
            l = binary(op, std::move(l), parse_pow(), line);
        }
        return l;
    }

    expr_ptr parse_pow() {
        expr_ptr l = parse_unary(true);
        while (is_op("**")) {
            int line = cur().line;
            ++i_;
            l = binary("**", std::move(l), parse_unary(true), line);
        }
        return l;
    }

    expr_ptr parse_unary(bool with_filter) {
        expr_ptr e;
        if (is_op("-") || is_op("+")) {
            e = make(expr::kind::unary, cur().line);
            e->name = cur().text;
            ++i_;
            e->args.push_back(parse_unary(false));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) return parse_filters(std::move(e));
        return e;
    }

    expr_ptr parse_primary() {
        const token& tok = cur();
        int line = tok.line;
        if (tok.k == tk::name) {
            ++i_;
            auto e = make(expr::kind::literal, line);
            if (tok.text == "true" || tok.text == "True") e->lit = value(true);
            else if (tok.text == "false" || tok.text == "False") e->lit = value(false);
            else if (tok.text == "none" || tok.text == "None") e->lit = value::none();
            else {
                e->k = expr::kind::name;
                e->name = tok.text;
            }
            return e;
        }
        if (tok.k == tk::string) {
            std::string s;
            while (cur().k == tk::string) s += t_[i_++].text;
            auto e = make(expr::kind::literal, line);
            e->lit = value(std::move(s));
            return e;
        }
        if (tok.k == tk::integer || tok.k == tk::floating) {
            ++i_;
            auto e = make(expr::kind::literal, line);
            try {
                e->lit = tok.k == tk::integer ? value(static_cast<std::int64_t>(std::stoll(tok.text))) : value(std::stod(tok.text));
            } catch (const std::exception&) {
                fail("number out of range: " + tok.text);
            }
            return e;
        }
        if (is_op("(")) {
            ++i_;
            if (is_op(")")) {
                ++i_;
                return make(expr::kind::tuple, line);
            }
            expr_ptr e = parse_tuple(true);
            expect_op(")");
            return e;
        }
        if (is_op("[")) {
            ++i_;
            auto e = make(expr::kind::list, line);
            while (!is_op("]")) {
                if (!e->args.empty()) expect_op(",");
                if (is_op("]")) break;
                e->args.push_back(parse_expression(true));
            }
            ++i_;
            return e;
        }
        if (is_op("{")) {
            ++i_;
            auto e = make(expr::kind::dict, line);
            while (!is_op("}")) {
                if (!e->args.empty()) expect_op(",");
                if (is_op("}")) break;
                e->args.push_back(parse_expression(true));
                expect_op(":");
                e->args.push_back(parse_expression(true));
            }
            ++i_;
            return e;
        }
        fail("unexpected " + describe());
    }

    expr_ptr parse_postfix(expr_ptr e) {
        for (;;) {
            int line = cur().line;
            if (is_op(".")) {
                ++i_;
                if (cur().k == tk::integer) {
                    auto it = make(expr::kind::item, line);
                    auto idx = make(expr::kind::literal, line);
                    idx->lit = value(static_cast<std::int64_t>(std::stoll(t_[i_++].text)));
                    it->args.push_back(std::move(e));
                    it->args.push_back(std::move(idx));
                    e = std::move(it);
                    continue;
                }
                auto a = make(expr::kind::attr, line);
                a->name = expect_name();
                a->args.push_back(std::move(e));
                e = std::move(a);
            } else if (is_op("[")) {
                ++i_;
                e = parse_subscript(std::move(e), line);
            } else if (is_op("(")) {
                auto c = make(expr::kind::call, line);
                c->args.push_back(std::move(e));
                parse_call_args(*c);
                e = std::move(c);
            } else {
                return e;
            }
        }
    }

    expr_ptr parse_subscript(expr_ptr target, int line) {
        expr_ptr parts[3];
        bool is_slice = false;
        int part = 0;
        while (!is_op("]")) {
            if (is_op(":")) {
                is_slice = true;
                if (++part > 2) fail("too many ':' in slice");
                ++i_;
                continue;
            }
            parts[part] = parse_expression(true);
        }
        ++i_;
        auto e = make(is_slice ? expr::kind::slice : expr::kind::item, line);
        e->args.push_back(std::move(target));
        if (!is_slice && !parts[0]) fail("empty subscript");
        for (int k = 0; k < (is_slice ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
        return e;
    }

    void parse_call_args(expr& call) {
        expect_op("(");
        bool first = true;
        while (!is_op(")")) {
            if (!first) expect_op(",");
            first = false;
            if (is_op(")")) break;
            if (cur().k == tk::name && peek().k == tk::op && peek().text == "=") {
                std::string key = t_[i_].text;
                i_ += 2;
                call.kwargs.emplace_back(std::move(key), parse_expression(true));
            } else {
                if (!call.kwargs.empty()) fail("positional argument after keyword argument");
                call.args.push_back(parse_expression(true));
            }
        }
        ++i_;
    }

    // "| name(args)" chains and "is [not] name args" tests; target null: a filter block's chain.
    expr_ptr parse_filters(expr_ptr target, bool first_has_bar = true) {
        bool need_bar = first_has_bar;
        for (;;) {
            int line = cur().line;
            if ((need_bar && is_op("|")) || !need_bar) {
                if (need_bar) ++i_;
                need_bar = true;
                auto f = make(expr::kind::filter, line);
                f->name = expect_name();
                while (is_op(".")) {
                    ++i_;
                    f->name += "." + expect_name();
                }
                f->args.push_back(std::move(target));
                if (is_op("(")) parse_call_args(*f);
                target = std::move(f);
            } else if (is_name("is") && target) {
                ++i_;
                auto t = make(expr::kind::test, line);
                if (is_name("not")) {
                    ++i_;
                    t->negated = true;
                }
                t->name = expect_name();
                t->args.push_back(std::move(target));
                if (is_op("(")) {
                    parse_call_args(*t);
                } else if ((cur().k == tk::name && cur().text != "else" && cur().text != "or" && cur().text != "and" &&
                            cur().text != "if" && cur().text != "is" && cur().text != "in" && cur().text != "not") ||
                           cur().k == tk::string || cur().k == tk::integer || cur().k == tk::floating || is_op("[") ||
                           is_op("{")) {
                    t->args.push_back(parse_postfix(parse_primary()));
                }
                target = std::move(t);
            } else if (is_op("(") && target) {
                auto c = make(expr::kind::call, line);
                c->args.push_back(std::move(target));
                parse_call_args(*c);
                target = parse_postfix(std::move(c));
            } else {
                return target;
            }
        }
    }

    std::vector<token> t_;
    std::size_t i_ = 0;
};

}  // namespace

body parse_template(std::string_view source, const lex_options& opt) { return parser(tokenize(source, opt)).parse_all(); }

}  // namespace strata::jinja::detail
