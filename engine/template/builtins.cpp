// Python operators and item/attribute access with Jinja2's semantics.
#include "template/builtins.hpp"

#include <algorithm>
#include <cmath>

#include "template/methods.hpp"

namespace strata::jinja::detail {

namespace {

[[noreturn]] void type_error(const std::string& op, const value& a, const value& b) {
    throw template_error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

void fail_undefined(const value& v) {
    if (v.is_undefined()) throw template_error("access to an attribute or item of an undefined value");
}

bool is_num(const value& v) { return v.is_number() || v.type() == value::kind::boolean; }
std::int64_t int_of(const value& v) { return v.type() == value::kind::boolean ? (v.as_bool() ? 1 : 0) : v.as_int(); }
double dbl_of(const value& v) { return v.type() == value::kind::boolean ? (v.as_bool() ? 1.0 : 0.0) : v.as_double(); }
bool both_int(const value& a, const value& b) {
    return a.type() != value::kind::floating && b.type() != value::kind::floating;
}

value repeat(const value& seq, std::int64_t n) {
    if (seq.is_string()) {
        std::string out;
        for (std::int64_t i = 0; i < n; ++i) out += seq.str();
        return value(std::move(out));
    }
    array out;
    for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
    return value::make_array(std::move(out), seq.is_tuple());
}

value arith(const std::string& op, const value& a, const value& b) {
    if (op == "+") {
        if (a.is_string() && b.is_string()) return value(a.str() + b.str());
        if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
            array out = a.items();
            out.insert(out.end(), b.items().begin(), b.items().end());
            return value::make_array(std::move(out), a.is_tuple());
        }
    }
    if (op == "*") {
        if ((a.is_string() || a.is_array()) && b.type() == value::kind::integer) return repeat(a, b.as_int());
        if ((b.is_string() || b.is_array()) && a.type() == value::kind::integer) return repeat(b, a.as_int());
    }
    if (!is_num(a) || !is_num(b)) type_error(op, a, b);
    if (op == "/") {
        if (dbl_of(b) == 0) throw template_error("division by zero");
        return value(dbl_of(a) / dbl_of(b));
    }
    if (both_int(a, b)) {
        std::int64_t x = int_of(a), y = int_of(b);
        if (op == "+") return value(x + y);
        if (op == "-") return value(x - y);
        if (op == "*") return value(x * y);
        if (op == "**") {
            if (y < 0) return value(std::pow(static_cast<double>(x), static_cast<double>(y)));
            std::int64_t r = 1;
            for (std::int64_t i = 0; i < y; ++i) r *= x;
            return value(r);
        }
        if (y == 0) throw template_error("integer division or modulo by zero");
        std::int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
        if (op == "//") return value(q);
        if (op == "%") return value(x - q * y);
    } else {
        double x = dbl_of(a), y = dbl_of(b);
        if (op == "+") return value(x + y);
        if (op == "-") return value(x - y);
        if (op == "*") return value(x * y);
        if (op == "**") return value(std::pow(x, y));
        if (y == 0) throw template_error("float division by zero");
        if (op == "//") return value(std::floor(x / y));
        if (op == "%") {
            double m = std::fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return value(m);
        }
    }
    type_error(op, a, b);
}

int compare(const value& a, const value& b, const std::string& op) {
    if (is_num(a) && is_num(b)) {
        if (both_int(a, b)) return int_of(a) < int_of(b) ? -1 : int_of(a) > int_of(b) ? 1 : 0;
        return dbl_of(a) < dbl_of(b) ? -1 : dbl_of(a) > dbl_of(b) ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
    if (a.is_array() && b.is_array()) {
        for (std::size_t i = 0; i < std::min(a.items().size(), b.items().size()); ++i) {
            if (equal(a.items()[i], b.items()[i])) continue;
            return compare(a.items()[i], b.items()[i], op);
        }
        return a.items().size() < b.items().size() ? -1 : a.items().size() > b.items().size() ? 1 : 0;
    }
    throw template_error("'" + op + "' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

bool contains(const value& container, const value& item) {
    if (container.is_string()) {
        if (!item.is_string())
            throw template_error("'in <string>' requires string as left operand, not " + item.type_name());
        return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_object()) return item.is_string() && container.obj().find(item.str()) != nullptr;
    if (container.is_array()) {
        for (const value& v : container.items())
            if (equal(v, item)) return true;
        return false;
    }
    if (container.is_undefined()) return false;
    throw template_error("argument of type '" + container.type_name() + "' is not iterable");
}

std::int64_t normalise_index(std::int64_t i, std::size_t size) {
    return i < 0 ? i + static_cast<std::int64_t>(size) : i;
}

}  // namespace

value binary_op(const std::string& op, const value& a, const value& b) {
    if (op == "~") return value(to_output(a) + to_output(b));
    if (op == "==") return value(equal(a, b));
    if (op == "!=") return value(!equal(a, b));
    if (op == "in") return value(contains(b, a));
    if (op == "not in") return value(!contains(b, a));
    if (op == "<") return value(compare(a, b, op) < 0);
    if (op == "<=") return value(compare(a, b, op) <= 0);
    if (op == ">") return value(compare(a, b, op) > 0);
    if (op == ">=") return value(compare(a, b, op) >= 0);
    if (a.is_undefined() || b.is_undefined()) throw template_error("an undefined value was used in '" + op + "'");
    return arith(op, a, b);
}

array iterate(const value& v) {
    switch (v.type()) {
    case value::kind::undefined: return {};
    case value::kind::array: return v.items();
    case value::kind::object: {
        if (v.obj().is_namespace) break;
        array keys;
        for (const auto& [k, _] : v.obj().entries) keys.emplace_back(k);
        return keys;
    }
    case value::kind::string: {
        array chars;
        for (char32_t c : to_u32(v.str())) chars.emplace_back(to_utf8(std::u32string(1, c)));
        return chars;
    }
    default: break;
    }
    throw template_error("'" + v.type_name() + "' object is not iterable");
}

value get_attr(const value& obj, const std::string& name) {
    fail_undefined(obj);
    if (value m = bound_method(obj, name); !m.is_undefined()) return m;
    if (obj.is_object()) {
        const value* v = obj.obj().find(name);
        return v ? *v : value();
    }
    return value();
}

value get_item(const value& obj, const value& key) {
    fail_undefined(obj);
    if (obj.is_object() && key.is_string()) {
        if (const value* v = obj.obj().find(key.str())) return *v;
        return bound_method(obj, key.str());
    }
    if ((obj.is_array() || obj.is_string()) && key.type() == value::kind::integer) {
        if (obj.is_array()) {
            std::int64_t i = normalise_index(key.as_int(), obj.items().size());
            if (i < 0 || i >= static_cast<std::int64_t>(obj.items().size())) return value();
            return obj.items()[static_cast<std::size_t>(i)];
        }
        std::u32string s = to_u32(obj.str());
        std::int64_t i = normalise_index(key.as_int(), s.size());
        if (i < 0 || i >= static_cast<std::int64_t>(s.size())) return value();
        return value(to_utf8(s.substr(static_cast<std::size_t>(i), 1)));
    }
    if (key.is_string()) return bound_method(obj, key.str());
    return value();
}

value slice(const value& obj, const value& start, const value& stop, const value& step) {
    fail_undefined(obj);
    if (!obj.is_array() && !obj.is_string()) throw template_error("'" + obj.type_name() + "' object is not subscriptable");
    std::u32string s = obj.is_string() ? to_u32(obj.str()) : std::u32string();
    const auto n = static_cast<std::int64_t>(obj.is_string() ? s.size() : obj.items().size());
    std::int64_t st = step.is_none() ? 1 : step.as_int();
    if (st == 0) throw template_error("slice step cannot be zero");
    auto clamp = [&](const value& v, std::int64_t def) {
        if (v.is_none()) return def;
        std::int64_t i = v.as_int();
        if (i < 0) i += n;
        if (st > 0) return std::clamp<std::int64_t>(i, 0, n);
        return std::clamp<std::int64_t>(i, -1, n - 1);
    };
    std::int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
    std::u32string out_s;
    array out_a;
    for (std::int64_t i = b; st > 0 ? i < e : i > e; i += st) {
        if (obj.is_string()) out_s += s[static_cast<std::size_t>(i)];
        else out_a.push_back(obj.items()[static_cast<std::size_t>(i)]);
    }
    if (obj.is_string()) return value(to_utf8(out_s));
    return value::make_array(std::move(out_a), obj.is_tuple());
}

}  // namespace strata::jinja::detail
