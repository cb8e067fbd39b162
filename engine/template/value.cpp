// Values: construction, Python's str/repr/truthiness/equality, and transformers' tojson.
#include "template/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace strata::jinja {

value value::none() {
    value v;
    v.kind_ = kind::none;
    return v;
}
value::value(bool b) : kind_(kind::boolean), b_(b) {}
value::value(std::int64_t i) : kind_(kind::integer), i_(i) {}
value::value(double d) : kind_(kind::floating), d_(d) {}
value::value(std::string s) : kind_(kind::string), s_(std::make_shared<std::string>(std::move(s))) {}

value value::make_array(array items, bool tuple) {
    value v;
    v.kind_ = kind::array;
    v.tuple_ = tuple;
    v.a_ = std::make_shared<array>(std::move(items));
    return v;
}

value value::make_object() {
    value v;
    v.kind_ = kind::object;
    v.o_ = std::make_shared<object>();
    return v;
}

value value::make_function(std::string name, native_fn fn) {
    value v;
    v.kind_ = kind::function;
    v.s_ = std::make_shared<std::string>(std::move(name));
    v.f_ = std::make_shared<native_fn>(std::move(fn));
    return v;
}

template <class Json>
static value json_to_value(const Json& j) {
    switch (j.type()) {
    case nlohmann::detail::value_t::null: return value::none();
    case nlohmann::detail::value_t::boolean: return value(j.template get<bool>());
    case nlohmann::detail::value_t::number_integer: return value(j.template get<std::int64_t>());
    case nlohmann::detail::value_t::number_unsigned: return value(static_cast<std::int64_t>(j.template get<std::uint64_t>()));
    case nlohmann::detail::value_t::number_float: return value(j.template get<double>());
    case nlohmann::detail::value_t::string: return value(j.template get<std::string>());
    case nlohmann::detail::value_t::array: {
        array items;
        items.reserve(j.size());
        for (const auto& e : j) items.push_back(json_to_value(e));
        return value::make_array(std::move(items));
    }
    case nlohmann::detail::value_t::object: {
        value v = value::make_object();
        for (auto it = j.begin(); it != j.end(); ++it) v.obj().set(it.key(), json_to_value(it.value()));
        return v;
    }
    default: return value::none();
    }
}

value value::from_json(const nlohmann::json& j) { return json_to_value(j); }
value value::from_json(const nlohmann::ordered_json& j) { return json_to_value(j); }

const value* object::find(std::string_view key) const {
    for (const auto& [k, v] : entries)
        if (k == key) return &v;
    return nullptr;
}

void object::set(const std::string& key, value v) {
    for (auto& [k, old] : entries)
        if (k == key) {
            old = std::move(v);
            return;
        }
    entries.emplace_back(key, std::move(v));
}

value call_args::get(std::size_t i, std::string_view name) const {
    for (const auto& [k, v] : keyword)
        if (k == name) return v;
    return i < positional.size() ? positional[i] : value();
}

bool value::truthy() const {
    switch (kind_) {
    case kind::undefined:
    case kind::none: return false;
    case kind::boolean: return b_;
    case kind::integer: return i_ != 0;
    case kind::floating: return d_ != 0;
    case kind::string: return !s_->empty();
    case kind::array: return !a_->empty();
    case kind::object: return o_->is_namespace || !o_->entries.empty();
    case kind::function: return true;
    }
    return false;
}

bool value::same_object(const value& o) const {
    if (kind_ != o.kind_) return false;
    switch (kind_) {
    case kind::array: return a_ == o.a_;
    case kind::object: return o_ == o.o_;
    case kind::function: return f_ == o.f_;
    default: return equal(*this, o);
    }
}

std::string value::type_name() const {
    switch (kind_) {
    case kind::undefined: return "Undefined";
    case kind::none: return "NoneType";
    case kind::boolean: return "bool";
    case kind::integer: return "int";
    case kind::floating: return "float";
    case kind::string: return "str";
    case kind::array: return tuple_ ? "tuple" : "list";
    case kind::object: return o_->is_namespace ? "Namespace" : "dict";
    case kind::function: return "function";
    }
    return "object";
}

std::string python_float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, res.ptr);
    bool neg = sci[0] == '-';
    if (neg) sci.erase(0, 1);
    std::size_t e = sci.find('e');
    std::string digits = sci.substr(0, e);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    int exp10 = std::stoi(sci.substr(e + 1));
    int decpt = exp10 + 1;  // value = 0.DIGITS x 10^decpt
    std::string out = neg ? "-" : "";
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
        } else if (static_cast<std::size_t>(decpt) >= digits.size()) {
            out += digits + std::string(static_cast<std::size_t>(decpt) - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." + digits.substr(static_cast<std::size_t>(decpt));
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + ebuf;
}

static std::string repr_string(const std::string& s) {
    char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string out(1, quote);
    for (unsigned char c : s) {
        switch (c) {
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
            if (c == static_cast<unsigned char>(quote)) {
                out += '\\';
                out += static_cast<char>(c);
            } else if (c < 0x20 || c == 0x7f) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\x%02x", c);
                out += buf;
            } else {
                out += static_cast<char>(c);
            }
        }
    }
    return out + quote;
}

std::string value::repr() const {
    switch (kind_) {
    case kind::string: return repr_string(*s_);
    case kind::array: {
        std::string out = tuple_ ? "(" : "[";
        for (std::size_t i = 0; i < a_->size(); ++i) out += (i ? ", " : "") + (*a_)[i].repr();
        if (tuple_ && a_->size() == 1) out += ",";
        return out + (tuple_ ? ")" : "]");
    }
    case kind::object: {
        std::string out = o_->is_namespace ? "<Namespace {" : "{";
        bool first = true;
        for (const auto& [k, v] : o_->entries) {
            out += (first ? "" : ", ") + repr_string(k) + ": " + v.repr();
            first = false;
        }
        return out + (o_->is_namespace ? "}>" : "}");
    }
    default: return to_str();
    }
}

std::string value::to_str() const {
    switch (kind_) {
    case kind::undefined: return "";
    case kind::none: return "None";
    case kind::boolean: return b_ ? "True" : "False";
    case kind::integer: return std::to_string(i_);
    case kind::floating: return python_float_repr(d_);
    case kind::string: return *s_;
    case kind::function: return "<function " + *s_ + ">";
    default: return repr();
    }
}

bool equal(const value& a, const value& b) {
    using k = value::kind;
    auto numeric = [](const value& v) { return v.is_number() || v.type() == k::boolean; };
    if (numeric(a) && numeric(b)) {
        auto as_d = [](const value& v) { return v.type() == k::boolean ? (v.as_bool() ? 1.0 : 0.0) : v.as_double(); };
        if (a.type() == k::integer && b.type() == k::integer) return a.as_int() == b.as_int();
        return as_d(a) == as_d(b);
    }
    if (a.type() != b.type()) return false;
    switch (a.type()) {
    case k::undefined:
    case k::none: return true;
    case k::string: return a.str() == b.str();
    case k::array: {
        if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
        for (std::size_t i = 0; i < a.items().size(); ++i)
            if (!equal(a.items()[i], b.items()[i])) return false;
        return true;
    }
    case k::object: {
        if (a.obj().is_namespace || b.obj().is_namespace) return a.same_object(b);
        if (a.obj().entries.size() != b.obj().entries.size()) return false;
        for (const auto& [key, v] : a.obj().entries) {
            const value* o = b.obj().find(key);
            if (!o || !equal(v, *o)) return false;
        }
        return true;
    }
    default: return a.same_object(b);
    }
}

std::u32string to_u32(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        auto c = static_cast<unsigned char>(s[i]);
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (i + static_cast<std::size_t>(len) > s.size()) len = 1;
        char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
        for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]) & 0x3f);
        out += cp;
        i += static_cast<std::size_t>(len);
    }
    return out;
}

std::string to_utf8(std::u32string_view s) {
    std::string out;
    for (char32_t cp : s) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xc0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xe0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
        } else {
            out += static_cast<char>(0xf0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
        }
    }
    return out;
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out += '"';
    auto hex4 = [&out](unsigned v) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\u%04x", v);
        out += buf;
    };
    for (std::size_t i = 0; i < s.size(); ++i) {
        auto c = static_cast<unsigned char>(s[i]);
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                hex4(c);
            } else if (c >= 0x80 && ensure_ascii) {
                std::size_t len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
                for (char32_t cp : to_u32(std::string_view(s).substr(i, len))) {
                    if (cp >= 0x10000) {
                        cp -= 0x10000;
                        hex4(0xd800 + (cp >> 10));
                        hex4(0xdc00 + (cp & 0x3ff));
                    } else {
                        hex4(cp);
                    }
                }
                i += len - 1;
            } else {
                out += static_cast<char>(c);
            }
        }
    }
    out += '"';
}

static void json_value(std::string& out, const value& v, const json_options& opt, int depth) {
    const std::string item_sep = !opt.item_sep.empty() ? opt.item_sep : (opt.indent >= 0 ? "," : ", ");
    const std::string key_sep = !opt.key_sep.empty() ? opt.key_sep : ": ";
    auto newline = [&](int d) {
        if (opt.indent < 0) return;
        out += '\n';
        out.append(static_cast<std::size_t>(opt.indent * d), ' ');
    };
    switch (v.type()) {
    case value::kind::none: out += "null"; return;
    case value::kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case value::kind::integer: out += std::to_string(v.as_int()); return;
    case value::kind::floating: {
        double d = v.as_double();
        out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float_repr(d);
        return;
    }
    case value::kind::string: json_string(out, v.str(), opt.ensure_ascii); return;
    case value::kind::array: {
        if (v.items().empty()) {
            out += "[]";
            return;
        }
        out += '[';
        for (std::size_t i = 0; i < v.items().size(); ++i) {
            if (i) out += item_sep;
            newline(depth + 1);
            json_value(out, v.items()[i], opt, depth + 1);
        }
        newline(depth);
        out += ']';
        return;
    }
    case value::kind::object: {
        if (v.obj().is_namespace) throw template_error("Object of type Namespace is not JSON serializable");
        auto entries = v.obj().entries;
        if (entries.empty()) {
            out += "{}";
            return;
        }
        if (opt.sort_keys)
            std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        out += '{';
        for (std::size_t i = 0; i < entries.size(); ++i) {
            if (i) out += item_sep;
            newline(depth + 1);
            json_string(out, entries[i].first, opt.ensure_ascii);
            out += key_sep;
            json_value(out, entries[i].second, opt, depth + 1);
        }
        newline(depth);
        out += '}';
        return;
    }
    default: throw template_error("Object of type " + v.type_name() + " is not JSON serializable");
    }
}

std::string to_json(const value& v, const json_options& opt) {
    std::string out;
    json_value(out, v, opt, 0);
    return out;
}

}  // namespace strata::jinja
