// The evaluator: runs the statement tree over scopes (the render's globals, then one scope per for
// loop or macro call, as Jinja2 scopes assignments) and writes the output.
#include <ctime>
#include <map>

#include <nlohmann/json.hpp>

#include "template/ast.hpp"
#include "template/builtins.hpp"
#include "template/jinja.hpp"

namespace strata::jinja {

namespace detail {
namespace {

// A render error already prefixed with its template line.
struct located_error : template_error {
    using template_error::template_error;
};

[[noreturn]] void rethrow_at(int line, const std::exception& e) {
    if (dynamic_cast<const located_error*>(&e)) throw;
    throw located_error("line " + std::to_string(line) + ": " + e.what());
}

using scope = std::map<std::string, value, std::less<>>;
enum class flow { normal, break_, continue_ };

class interpreter {
public:
    interpreter(const render_options& opt, scope globals) : opt_(opt) {
        scopes_.push_back(std::make_shared<scope>(std::move(globals)));
        define_globals(*scopes_.front());
    }

    std::string run(const body& b) {
        std::string out;
        exec(b, out);
        return out;
    }

private:
    void define_globals(scope& g) {
        g["raise_exception"] = value::make_function("raise_exception", [](call_args& a) -> value {
            throw template_error(a.get(0, "message").to_str());
        });
        g["strftime_now"] = value::make_function("strftime_now", [this](call_args& a) -> value {
            std::time_t t = opt_.now ? static_cast<std::time_t>(*opt_.now) : std::time(nullptr);
            std::tm tm{};
            localtime_r(&t, &tm);
            char buf[256];
            std::size_t n = std::strftime(buf, sizeof buf, a.get(0, "format").to_str().c_str(), &tm);
            return value(std::string(buf, n));
        });
        g["namespace"] = value::make_function("namespace", [](call_args& a) -> value {
            value ns = value::make_object();
            ns.obj().is_namespace = true;
            for (const auto& p : a.positional)
                if (p.is_object())
                    for (const auto& [k, v] : p.obj().entries) ns.obj().set(k, v);
            for (const auto& [k, v] : a.keyword) ns.obj().set(k, v);
            return ns;
        });
        g["range"] = value::make_function("range", [](call_args& a) -> value {
            std::int64_t start = 0, stop, step = 1;
            if (a.positional.size() == 1) {
                stop = a.positional[0].as_int();
            } else if (a.positional.size() >= 2) {
                start = a.positional[0].as_int();
                stop = a.positional[1].as_int();
                if (a.positional.size() > 2) step = a.positional[2].as_int();
            } else {
                throw template_error("range expected at least 1 argument, got 0");
            }
            if (step == 0) throw template_error("range() arg 3 must not be zero");
            array out;
            for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
            return value::make_array(std::move(out));
        });
        g["dict"] = value::make_function("dict", [](call_args& a) -> value {
            value d = value::make_object();
            for (const auto& [k, v] : a.keyword) d.obj().set(k, v);
            return d;
        });
    }

    value lookup(const std::string& name) const {
        for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
            auto f = (*it)->find(name);
            if (f != (*it)->end()) return f->second;
        }
        return value();
    }

    void assign(const std::string& name, value v) { (*scopes_.back())[name] = std::move(v); }

    void assign_targets(const std::vector<std::string>& targets, const value& v) {
        if (targets.size() == 1) {
            assign(targets[0], v);
            return;
        }
        array items = iterate(v);
        if (items.size() != targets.size())
            throw template_error("cannot unpack " + std::to_string(items.size()) + " values into " +
                                 std::to_string(targets.size()) + " names");
        for (std::size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
    }

    flow exec(const body& b, std::string& out) {
        for (const node& n : b) {
            flow f = flow::normal;
            try {
                f = exec_node(n, out);
            } catch (const template_error& e) {
                rethrow_at(n.line, e);
            }
            if (f != flow::normal) return f;
        }
        return flow::normal;
    }

    flow exec_node(const node& n, std::string& out) {
        switch (n.k) {
        case node::kind::text: out += n.text; return flow::normal;
        case node::kind::output: out += to_output(eval(*n.value)); return flow::normal;
        case node::kind::if_:
            for (const auto& [cond, children] : n.branches)
                if (!cond || eval(*cond).truthy()) return exec(children, out);
            return flow::normal;
        case node::kind::for_: exec_for(n, out); return flow::normal;
        case node::kind::set: exec_set(n, eval(*n.value)); return flow::normal;
        case node::kind::set_block: {
            std::string captured;
            exec(n.children, captured);
            value v(std::move(captured));
            if (n.value) v = apply_filter_chain(*n.value, v);
            exec_set(n, v);
            return flow::normal;
        }
        case node::kind::macro: assign(n.text, make_macro(n)); return flow::normal;
        case node::kind::filter_block: {
            std::string captured;
            flow f = exec(n.children, captured);
            out += to_output(apply_filter_chain(*n.value, value(std::move(captured))));
            return f;
        }
        case node::kind::scope: return exec(n.children, out);
        case node::kind::break_: return flow::break_;
        case node::kind::continue_: return flow::continue_;
        case node::kind::call_block: throw template_error("call blocks are not supported");
        }
        return flow::normal;
    }

    void exec_set(const node& n, const value& v) {
        if (n.attr.empty()) {
            assign_targets(n.targets, v);
            return;
        }
        value ns = lookup(n.targets[0]);
        if (!ns.is_object() || !ns.obj().is_namespace)
            throw template_error("cannot assign attribute on non-namespace object");
        ns.obj().set(n.attr, v);
    }

    // Applies a filter chain parsed with a null innermost target to v.
    value apply_filter_chain(const expr& chain, const value& v) {
        value target = chain.args[0] ? apply_filter_chain(*chain.args[0], v) : v;
        call_args a = eval_args(chain, 1);
        return apply_filter(chain.name, target, a);
    }

    void exec_for(const node& n, std::string& out) {
        array items = iterate(eval(*n.value));
        scopes_.push_back(std::make_shared<scope>());
        if (n.cond) {
            array kept;
            for (const value& it : items) {
                assign_targets(n.targets, it);
                if (eval(*n.cond).truthy()) kept.push_back(it);
            }
            items = std::move(kept);
        }
        const auto len = static_cast<std::int64_t>(items.size());
        for (std::int64_t i = 0; i < len; ++i) {
            const auto idx = static_cast<std::size_t>(i);
            value loop = value::make_object();
            object& l = loop.obj();
            l.set("index", value(i + 1));
            l.set("index0", value(i));
            l.set("revindex", value(len - i));
            l.set("revindex0", value(len - i - 1));
            l.set("first", value(i == 0));
            l.set("last", value(i == len - 1));
            l.set("length", value(len));
            l.set("depth", value(1));
            l.set("depth0", value(0));
            if (i > 0) l.set("previtem", items[idx - 1]);
            if (i + 1 < len) l.set("nextitem", items[idx + 1]);
            l.set("cycle", value::make_function("cycle", [i](call_args& a) -> value {
                if (a.positional.empty()) throw template_error("no items for cycling given");
                return a.positional[static_cast<std::size_t>(i) % a.positional.size()];
            }));
            assign("loop", loop);
            assign_targets(n.targets, items[idx]);
            if (exec(n.children, out) == flow::break_) break;
        }
        scopes_.pop_back();
        if (items.empty()) exec(n.else_children, out);
    }

    value make_macro(const node& n) {
        return value::make_function(n.text, [this, &n](call_args& a) -> value {
            if (depth_ >= max_macro_depth) throw template_error("maximum macro recursion depth exceeded");
            struct depth_guard {
                int& d;
                explicit depth_guard(int& x) : d(++x) {}
                ~depth_guard() { --d; }
            } guard(depth_);
            auto local = std::make_shared<scope>();
            if (a.positional.size() > n.params.size())
                throw template_error("macro '" + n.text + "' takes not more than " + std::to_string(n.params.size()) +
                                     " argument(s)");
            std::vector<std::shared_ptr<scope>> saved{scopes_.front(), local};
            std::swap(saved, scopes_);
            std::string out;
            try {
                for (std::size_t i = 0; i < n.params.size(); ++i) {
                    const auto& [name, def] = n.params[i];
                    value v = a.get(i, name);
                    bool given = i < a.positional.size();
                    for (const auto& kw : a.keyword) given = given || kw.first == name;
                    (*local)[name] = given ? v : def ? eval(*def) : value();
                }
                for (const auto& kw : a.keyword) {
                    bool known = false;
                    for (const auto& p : n.params) known = known || p.first == kw.first;
                    if (!known) throw template_error("macro '" + n.text + "' takes no keyword argument '" + kw.first + "'");
                }
                exec(n.children, out);
            } catch (...) {
                std::swap(saved, scopes_);
                throw;
            }
            std::swap(saved, scopes_);
            return value(std::move(out));
        });
    }

    call_args eval_args(const expr& e, std::size_t first) {
        call_args a;
        for (std::size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
        for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
        return a;
    }

    value eval(const expr& e) {
        try {
            return eval_expr(e);
        } catch (const located_error&) {
            throw;
        } catch (const template_error& err) {
            rethrow_at(e.line, err);
        }
    }

    value eval_expr(const expr& e) {
        switch (e.k) {
        case expr::kind::literal: return e.lit;
        case expr::kind::name: return lookup(e.name);
        case expr::kind::list:
        case expr::kind::tuple: {
            array items;
            for (const auto& a : e.args) items.push_back(eval(*a));
            return value::make_array(std::move(items), e.k == expr::kind::tuple);
        }
        case expr::kind::dict: {
            value d = value::make_object();
            for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
                value k = eval(*e.args[i]);
                if (!k.is_string()) throw template_error("dict keys other than strings are not supported");
                d.obj().set(k.str(), eval(*e.args[i + 1]));
            }
            return d;
        }
        case expr::kind::attr: return get_attr(eval(*e.args[0]), e.name);
        case expr::kind::item: return get_item(eval(*e.args[0]), eval(*e.args[1]));
        case expr::kind::slice: {
            auto opt = [&](std::size_t i) { return e.args[i] ? eval(*e.args[i]) : value::none(); };
            return slice(eval(*e.args[0]), opt(1), opt(2), opt(3));
        }
        case expr::kind::call: {
            value f = eval(*e.args[0]);
            if (f.type() != value::kind::function) {
                if (f.is_undefined()) throw template_error("'" + describe(*e.args[0]) + "' is undefined");
                throw template_error("'" + f.type_name() + "' object is not callable");
            }
            call_args a = eval_args(e, 1);
            return f.fn()(a);
        }
        case expr::kind::filter: {
            value target = eval(*e.args[0]);
            call_args a = eval_args(e, 1);
            return apply_filter(e.name, target, a);
        }
        case expr::kind::test: {
            value target = eval(*e.args[0]);
            call_args a = eval_args(e, 1);
            return value(apply_test(e.name, target, a) != e.negated);
        }
        case expr::kind::unary: {
            value v = eval(*e.args[0]);
            if (e.name == "not") return value(!v.truthy());
            if (e.name == "-") return binary_op("-", value(0), v);
            if (!v.is_number()) throw template_error("bad operand type for unary +: '" + v.type_name() + "'");
            return v;
        }
        case expr::kind::binary: {
            if (e.name == "and") {
                value l = eval(*e.args[0]);
                return l.truthy() ? eval(*e.args[1]) : l;
            }
            if (e.name == "or") {
                value l = eval(*e.args[0]);
                return l.truthy() ? l : eval(*e.args[1]);
            }
            return binary_op(e.name, eval(*e.args[0]), eval(*e.args[1]));
        }
        case expr::kind::cond:
            if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
            return e.args[2] ? eval(*e.args[2]) : value();
        }
        return value();
    }

    static std::string describe(const expr& e) {
        if (e.k == expr::kind::name) return e.name;
        if (e.k == expr::kind::attr) return e.name;
        return "expression";
    }

    static constexpr int max_macro_depth = 100;  // Python would stop near 1000 frames, ~300 macro calls
    const render_options& opt_;
    std::vector<std::shared_ptr<scope>> scopes_;
    int depth_ = 0;
};

}  // namespace
}  // namespace detail

template_program::template_program(std::string_view source)
    : body_(std::make_shared<const detail::body>(detail::parse_template(source, detail::lex_options{}))) {}

template <class Json>
static std::string render_with(const detail::body& b, const Json& context, const render_options& opt) {
    detail::scope globals;
    if (context.is_object())
        for (auto it = context.begin(); it != context.end(); ++it) globals[it.key()] = value::from_json(it.value());
    return detail::interpreter(opt, std::move(globals)).run(b);
}

std::string template_program::render(const nlohmann::json& context, const render_options& opt) const {
    return render_with(*body_, context, opt);
}

std::string template_program::render(const nlohmann::ordered_json& context, const render_options& opt) const {
    return render_with(*body_, context, opt);
}

}  // namespace strata::jinja
