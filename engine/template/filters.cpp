// Jinja2's built-in filters and tests (jinja2/filters.py, jinja2/tests.py), with transformers' tojson.
#include <algorithm>
#include <cmath>
#include <map>

#include "template/builtins.hpp"
#include "template/methods.hpp"

namespace strata::jinja::detail {

namespace {

using filter_fn = value (*)(const value&, call_args&);

std::int64_t to_int(const value& v, std::int64_t def) {
    switch (v.type()) {
    case value::kind::integer: return v.as_int();
    case value::kind::floating: return static_cast<std::int64_t>(v.as_double());
    case value::kind::boolean: return v.as_bool() ? 1 : 0;
    case value::kind::string: {
        std::string s = py_strip(v.str(), value(), true, true);
        try {
            std::size_t used = 0;
            long long i = std::stoll(s, &used, 10);
            if (used == s.size()) return i;
            double d = std::stod(s, &used);
            if (used == s.size()) return static_cast<std::int64_t>(d);
        } catch (const std::exception&) {
        }
        return def;
    }
    default: return def;
    }
}

std::size_t length_of(const value& v) {
    switch (v.type()) {
    case value::kind::undefined: return 0;
    case value::kind::string: return to_u32(v.str()).size();
    case value::kind::array: return v.items().size();
    case value::kind::object: return v.obj().entries.size();
    default: throw template_error("object of type '" + v.type_name() + "' has no len()");
    }
}

// Attribute lookup as Jinja's make_attrgetter does: "a.b" walks, integers index.
value attr_path(const value& v, const std::string& path) {
    value cur = v;
    std::size_t start = 0;
    for (;;) {
        std::size_t dot = path.find('.', start);
        std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
        cur = get_item(cur, digits ? value(static_cast<std::int64_t>(std::stoll(part))) : value(part));
        if (dot == std::string::npos) return cur;
        start = dot + 1;
    }
}

call_args rest_args(const call_args& a, std::size_t from) {
    call_args r;
    if (a.positional.size() > from) r.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(from), a.positional.end());
    r.keyword = a.keyword;
    return r;
}

value select_like(const value& v, call_args& a, bool by_attr, bool keep) {
    std::size_t test_at = by_attr ? 1 : 0;
    std::string attr = by_attr ? a.get(0, "attribute").to_str() : "";
    value test = a.positional.size() > test_at ? a.positional[test_at] : value();
    call_args targs = rest_args(a, test_at + 1);
    targs.keyword.clear();
    array out;
    for (const value& item : iterate(v)) {
        value x = by_attr ? attr_path(item, attr) : item;
        bool ok = test.is_undefined() ? x.truthy() : apply_test(test.to_str(), x, targs);
        if (ok == keep) out.push_back(item);
    }
    return value::make_array(std::move(out));
}

value f_tojson(const value& v, call_args& a) {
    json_options o;
    o.ensure_ascii = a.get(0, "ensure_ascii").truthy();
    value indent = a.get(1, "indent");
    if (indent.type() == value::kind::integer) o.indent = static_cast<int>(indent.as_int());
    value seps = a.get(2, "separators");
    if (seps.is_array() && seps.items().size() == 2) {
        o.item_sep = seps.items()[0].to_str();
        o.key_sep = seps.items()[1].to_str();
    }
    o.sort_keys = a.get(3, "sort_keys").truthy();
    return value(to_json(v, o));
}

value f_join(const value& v, call_args& a) {
    value sep = a.get(0, "d");
    value attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const value& item : iterate(v)) {
        out += (first ? "" : (sep.is_undefined() ? "" : sep.to_str())) + to_output(attr.is_undefined() ? item : attr_path(item, attr.to_str()));
        first = false;
    }
    return value(std::move(out));
}

value f_default(const value& v, call_args& a) {
    bool boolean = a.get(1, "boolean").truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) {
        value d = a.get(0, "default_value");
        return d.is_undefined() ? value("") : d;
    }
    return v;
}

value f_map(const value& v, call_args& a) {
    value attr = a.get(99, "attribute");
    array out;
    if (!attr.is_undefined()) {
        value def = a.get(99, "default");
        for (const value& item : iterate(v)) {
            value x = attr_path(item, attr.to_str());
            out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
        }
        return value::make_array(std::move(out));
    }
    if (a.positional.empty()) throw template_error("map requires a filter argument");
    call_args fargs = rest_args(a, 1);
    std::string name = a.positional[0].to_str();
    for (const value& item : iterate(v)) out.push_back(apply_filter(name, item, fargs));
    return value::make_array(std::move(out));
}

value f_indent(const value& v, call_args& a) {
    value w = a.get(0, "width");
    std::string ind = w.is_string() ? w.str() : std::string(w.is_undefined() ? 4 : static_cast<std::size_t>(w.as_int()), ' ');
    bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
    value lines_v = bound_method(value(to_output(v) + "\n"), "splitlines").fn()(a);
    array& lines = lines_v.items();
    std::string out;
    if (blank) {
        for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + ind : "") + lines[i].str();
    } else if (!lines.empty()) {
        out = lines[0].str();
        for (std::size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].str().empty() ? "" : ind + lines[i].str());
    }
    return value(first ? ind + out : out);
}

value f_sort(const value& v, call_args& a) {
    array items = iterate(v);
    bool reverse = a.get(0, "reverse").truthy();
    value attr = a.get(2, "attribute");
    auto key = [&](const value& x) { return attr.is_undefined() ? x : attr_path(x, attr.to_str()); };
    std::stable_sort(items.begin(), items.end(), [&](const value& x, const value& y) {
        return binary_op("<", reverse ? key(y) : key(x), reverse ? key(x) : key(y)).truthy();
    });
    return value::make_array(std::move(items));
}

value f_escape(const value& v, call_args&) {
    std::string out;
    for (char c : to_output(v)) {
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
        }
    }
    return value(std::move(out));
}

const std::map<std::string, filter_fn, std::less<>>& filters() {
    static const std::map<std::string, filter_fn, std::less<>> table = {
        {"tojson", f_tojson},
        {"join", f_join},
        {"default", f_default},
        {"d", f_default},
        {"map", f_map},
        {"indent", f_indent},
        {"sort", f_sort},
        {"escape", f_escape},
        {"e", f_escape},
        {"select", [](const value& v, call_args& a) { return select_like(v, a, false, true); }},
        {"reject", [](const value& v, call_args& a) { return select_like(v, a, false, false); }},
        {"selectattr", [](const value& v, call_args& a) { return select_like(v, a, true, true); }},
        {"rejectattr", [](const value& v, call_args& a) { return select_like(v, a, true, false); }},
        {"trim", [](const value& v, call_args& a) { return value(py_strip(to_output(v), a.get(0, "chars"), true, true)); }},
        {"length", [](const value& v, call_args&) { return value(static_cast<std::int64_t>(length_of(v))); }},
        {"count", [](const value& v, call_args&) { return value(static_cast<std::int64_t>(length_of(v))); }},
        {"string", [](const value& v, call_args&) { return value(to_output(v)); }},
        {"safe", [](const value& v, call_args&) { return v; }},
        {"list", [](const value& v, call_args&) { return value::make_array(iterate(v)); }},
        {"int", [](const value& v, call_args& a) {
             value d = a.get(0, "default");
             return value(to_int(v, d.is_undefined() ? 0 : d.as_int()));
         }},
        {"float", [](const value& v, call_args&) {
             if (v.is_number()) return value(v.as_double());
             try {
                 return value(std::stod(to_output(v)));
             } catch (const std::exception&) {
                 return value(0.0);
             }
         }},
        {"abs", [](const value& v, call_args&) {
             if (v.type() == value::kind::integer) return value(v.as_int() < 0 ? -v.as_int() : v.as_int());
             if (!v.is_number()) throw template_error("bad operand type for abs(): '" + v.type_name() + "'");
             return value(std::fabs(v.as_double()));
         }},
        {"upper", [](const value& v, call_args&) { return value(py_upper(to_output(v))); }},
        {"lower", [](const value& v, call_args&) { return value(py_lower(to_output(v))); }},
        {"title", [](const value& v, call_args&) { return value(py_title(to_output(v))); }},
        {"capitalize", [](const value& v, call_args&) { return value(py_capitalize(to_output(v))); }},
        {"replace", [](const value& v, call_args& a) {
             value c = a.get(2, "count");
             return value(py_replace(to_output(v), a.get(0, "old").to_str(), a.get(1, "new").to_str(),
                                     c.is_undefined() || c.is_none() ? -1 : c.as_int()));
         }},
        {"first", [](const value& v, call_args&) {
             array items = iterate(v);
             return items.empty() ? value() : items.front();
         }},
        {"last", [](const value& v, call_args&) {
             array items = iterate(v);
             return items.empty() ? value() : items.back();
         }},
        {"reverse", [](const value& v, call_args&) {
             if (v.is_string()) {
                 std::u32string u = to_u32(v.str());
                 std::reverse(u.begin(), u.end());
                 return value(to_utf8(u));
             }
             array items = iterate(v);
             std::reverse(items.begin(), items.end());
             return value::make_array(std::move(items));
         }},
        {"unique", [](const value& v, call_args&) {
             array out;
             for (const value& x : iterate(v))
                 if (std::none_of(out.begin(), out.end(), [&](const value& y) { return equal(x, y); })) out.push_back(x);
             return value::make_array(std::move(out));
         }},
        {"items", [](const value& v, call_args& a) {
             if (v.is_undefined()) return value::make_array();
             if (!v.is_object()) throw template_error("can only get item pairs from a mapping");
             return bound_method(v, "items").fn()(a);
         }},
        {"sum", [](const value& v, call_args& a) {
             value start = a.get(1, "start");
             value total = start.is_undefined() ? value(0) : start;
             for (const value& x : iterate(v)) total = binary_op("+", total, x);
             return total;
         }},
        {"wordcount", [](const value& v, call_args&) {
             return value(static_cast<std::int64_t>(py_split(to_output(v), value(), -1, false).items().size()));
         }},
    };
    return table;
}

}  // namespace

value apply_filter(const std::string& name, const value& v, call_args& args) {
    const auto& table = filters();
    auto it = table.find(name);
    if (it == table.end()) throw template_error("no filter named '" + name + "'");
    return it->second(v, args);
}

bool apply_test(const std::string& name, const value& v, call_args& args) {
    using k = value::kind;
    const value arg = args.get(0, "other");
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.type() == k::boolean;
    if (name == "true") return v.type() == k::boolean && v.as_bool();
    if (name == "false") return v.type() == k::boolean && !v.as_bool();
    if (name == "integer") return v.type() == k::integer;
    if (name == "float") return v.type() == k::floating;
    if (name == "number") return v.is_number() || v.type() == k::boolean;
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_object() && !v.obj().is_namespace;
    if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_array() || (v.is_object() && !v.obj().is_namespace);
    if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_array() || (v.is_object() && !v.obj().is_namespace);
    if (name == "callable") return v.type() == k::function;
    if (name == "sameas") return v.same_object(arg);
    if (name == "escaped") return false;
    if (name == "odd" || name == "even") {
        if (v.type() != k::integer) throw template_error("the " + name + " test needs an integer");
        return (v.as_int() % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") return v.type() == k::integer && arg.type() == k::integer && arg.as_int() != 0 && v.as_int() % arg.as_int() == 0;
    if (name == "lower") return v.is_string() && py_lower(v.str()) == v.str();
    if (name == "upper") return v.is_string() && py_upper(v.str()) == v.str();
    if (name == "in") return binary_op("in", v, args.get(0, "seq")).truthy();
    static const std::map<std::string, std::string, std::less<>> ops = {
        {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"lessthan", "<"},
        {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="}, {">=", ">="}};
    if (auto it = ops.find(name); it != ops.end()) return binary_op(it->second, v, arg).truthy();
    throw template_error("no test named '" + name + "'");
}

}  // namespace strata::jinja::detail
