// str/list/dict methods with Python's semantics (ASCII case mapping).
#include "template/methods.hpp"

#include <algorithm>
#include <cctype>

namespace strata::jinja::detail {

namespace {

bool py_space(char32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

std::string arg_str(const value& v, const char* what) {
    if (!v.is_string()) throw template_error(std::string(what) + " must be str, not " + v.type_name());
    return v.str();
}

bool affix(const std::string& s, const value& arg, bool prefix) {
    auto one = [&](const value& a) {
        const std::string p = arg_str(a, prefix ? "startswith first arg" : "endswith first arg");
        if (p.size() > s.size()) return false;
        return prefix ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
    };
    if (arg.is_array()) return std::any_of(arg.items().begin(), arg.items().end(), one);
    return one(arg);
}

value string_method(const std::string& s, const std::string& name) {
    auto bind = [&](auto fn) { return value::make_function(name, [s, fn](call_args& a) -> value { return fn(s, a); }); };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        bool l = name != "rstrip", r = name != "lstrip";
        return bind([l, r](const std::string& str, call_args& a) { return value(py_strip(str, a.get(0, "chars"), l, r)); });
    }
    if (name == "split" || name == "rsplit") {
        bool right = name == "rsplit";
        return bind([right](const std::string& str, call_args& a) {
            value m = a.get(1, "maxsplit");
            return py_split(str, a.get(0, "sep"), m.is_undefined() ? -1 : m.as_int(), right);
        });
    }
    if (name == "startswith" || name == "endswith") {
        bool prefix = name == "startswith";
        return bind([prefix](const std::string& str, call_args& a) { return value(affix(str, a.get(0, "prefix"), prefix)); });
    }
    if (name == "upper") return bind([](const std::string& str, call_args&) { return value(py_upper(str)); });
    if (name == "lower") return bind([](const std::string& str, call_args&) { return value(py_lower(str)); });
    if (name == "title") return bind([](const std::string& str, call_args&) { return value(py_title(str)); });
    if (name == "capitalize") return bind([](const std::string& str, call_args&) { return value(py_capitalize(str)); });
    if (name == "replace")
        return bind([](const std::string& str, call_args& a) {
            value c = a.get(2, "count");
            return value(py_replace(str, arg_str(a.get(0, "old"), "replace() argument 1"),
                                    arg_str(a.get(1, "new"), "replace() argument 2"), c.is_undefined() ? -1 : c.as_int()));
        });
    if (name == "find" || name == "rfind" || name == "count")
        return bind([name](const std::string& str, call_args& a) -> value {
            const std::string sub = arg_str(a.get(0, "sub"), name.c_str());
            if (name == "count") {
                if (sub.empty()) return value(static_cast<std::int64_t>(to_u32(str).size() + 1));
                std::int64_t n = 0;
                for (std::size_t p = str.find(sub); p != std::string::npos; p = str.find(sub, p + sub.size())) ++n;
                return value(n);
            }
            std::size_t p = name == "find" ? str.find(sub) : str.rfind(sub);
            if (p == std::string::npos) return value(-1);
            return value(static_cast<std::int64_t>(to_u32(str.substr(0, p)).size()));
        });
    if (name == "join")
        return bind([](const std::string& sep, call_args& a) {
            std::string out;
            value seq = a.get(0, "iterable");
            if (!seq.is_array()) throw template_error("can only join an iterable");
            for (std::size_t i = 0; i < seq.items().size(); ++i)
                out += (i ? sep : "") + arg_str(seq.items()[i], "sequence item");
            return value(std::move(out));
        });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum")
        return bind([name](const std::string& str, call_args&) {
            if (str.empty()) return value(false);
            auto pred = name == "isdigit" ? ::isdigit : name == "isalpha" ? ::isalpha : name == "isspace" ? ::isspace : ::isalnum;
            return value(std::all_of(str.begin(), str.end(), [pred](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
        });
    if (name == "splitlines")
        return bind([](const std::string& str, call_args&) {
            array lines;
            std::string cur;
            for (std::size_t i = 0; i < str.size(); ++i) {
                if (str[i] == '\n' || str[i] == '\r') {
                    lines.emplace_back(cur);
                    cur.clear();
                    if (str[i] == '\r' && i + 1 < str.size() && str[i + 1] == '\n') ++i;
                } else {
                    cur += str[i];
                }
            }
            if (!cur.empty()) lines.emplace_back(cur);
            return value::make_array(std::move(lines));
        });
    return value();
}

value unsafe_method(const std::string& type, const std::string& name) {
    return value::make_function(name, [type, name](call_args&) -> value {
        throw template_error("access to attribute '" + name + "' of '" + type + "' object is unsafe.");
    });
}

value dict_method(const value& d, const std::string& name) {
    auto bind = [&](auto fn) { return value::make_function(name, [d, fn](call_args& a) -> value { return fn(d.obj(), a); }); };
    if (name == "items")
        return bind([](const object& o, call_args&) {
            array out;
            for (const auto& [k, v] : o.entries) out.push_back(value::make_array({value(k), v}, true));
            return value::make_array(std::move(out));
        });
    if (name == "keys" || name == "values") {
        bool keys = name == "keys";
        return bind([keys](const object& o, call_args&) {
            array out;
            for (const auto& [k, v] : o.entries) out.push_back(keys ? value(k) : v);
            return value::make_array(std::move(out));
        });
    }
    if (name == "get")
        return bind([](const object& o, call_args& a) {
            value key = a.get(0, "key");
            const value* v = key.is_string() ? o.find(key.str()) : nullptr;
            if (v) return *v;
            value def = a.get(1, "default");
            return def.is_undefined() ? value::none() : def;
        });
    if (name == "copy")
        return bind([](const object& o, call_args&) {
            value c = value::make_object();
            c.obj().entries = o.entries;
            return c;
        });
    if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" || name == "clear")
        return unsafe_method("dict", name);
    return value();
}

value list_method(const value& l, const std::string& name) {
    if (name == "index" || name == "count")
        return value::make_function(name, [l, name](call_args& a) -> value {
            value x = a.get(0, "value");
            std::int64_t n = 0;
            for (std::size_t i = 0; i < l.items().size(); ++i)
                if (equal(l.items()[i], x)) {
                    if (name == "index") return value(static_cast<std::int64_t>(i));
                    ++n;
                }
            if (name == "index") throw template_error(x.repr() + " is not in list");
            return value(n);
        });
    if (!l.is_tuple() && (name == "append" || name == "pop" || name == "extend" || name == "insert" ||
                          name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
        return unsafe_method("list", name);
    return value();
}

}  // namespace

value bound_method(const value& obj, const std::string& name) {
    if (obj.is_string()) return string_method(obj.str(), name);
    if (obj.is_object() && !obj.obj().is_namespace) return dict_method(obj, name);
    if (obj.is_array()) return list_method(obj, name);
    return value();
}

std::string py_strip(std::string_view s, const value& chars, bool left, bool right) {
    std::u32string u = to_u32(s);
    std::u32string set = chars.is_string() ? to_u32(chars.str()) : std::u32string();
    auto strip = [&](char32_t c) { return chars.is_string() ? set.find(c) != std::u32string::npos : py_space(c); };
    std::size_t b = 0, e = u.size();
    if (left)
        while (b < e && strip(u[b])) ++b;
    if (right)
        while (e > b && strip(u[e - 1])) --e;
    return to_utf8(u.substr(b, e - b));
}

value py_split(const std::string& s, const value& sep, std::int64_t maxsplit, bool from_right) {
    array parts;
    if (sep.is_undefined() || sep.is_none()) {
        std::u32string u = to_u32(s);
        std::vector<std::pair<std::size_t, std::size_t>> words;
        for (std::size_t i = 0; i < u.size();) {
            while (i < u.size() && py_space(u[i])) ++i;
            if (i >= u.size()) break;
            std::size_t j = i;
            while (j < u.size() && !py_space(u[j])) ++j;
            words.emplace_back(i, j);
            i = j;
        }
        if (maxsplit >= 0 && static_cast<std::int64_t>(words.size()) > maxsplit + 1) {
            std::size_t keep = static_cast<std::size_t>(maxsplit);
            if (from_right) {
                std::size_t first = words.size() - keep - 1;
                parts.emplace_back(to_utf8(u.substr(0, words[first].second)));
                for (std::size_t k = first + 1; k < words.size(); ++k)
                    parts.emplace_back(to_utf8(u.substr(words[k].first, words[k].second - words[k].first)));
                return value::make_array(std::move(parts));
            }
            for (std::size_t k = 0; k < keep; ++k)
                parts.emplace_back(to_utf8(u.substr(words[k].first, words[k].second - words[k].first)));
            parts.emplace_back(to_utf8(u.substr(words[keep].first)));
            return value::make_array(std::move(parts));
        }
        for (const auto& [b, e] : words) parts.emplace_back(to_utf8(u.substr(b, e - b)));
        return value::make_array(std::move(parts));
    }
    const std::string d = arg_str(sep, "separator");
    if (d.empty()) throw template_error("empty separator");
    std::vector<std::string> pieces;
    std::size_t start = 0;
    for (std::size_t p = s.find(d); p != std::string::npos; p = s.find(d, start)) {
        pieces.push_back(s.substr(start, p - start));
        start = p + d.size();
    }
    pieces.push_back(s.substr(start));
    if (maxsplit >= 0 && pieces.size() > static_cast<std::size_t>(maxsplit) + 1) {
        std::size_t keep = static_cast<std::size_t>(maxsplit);
        std::vector<std::string> merged;
        auto join = [&](std::size_t b, std::size_t e) {
            std::string out;
            for (std::size_t k = b; k < e; ++k) out += (k > b ? d : "") + pieces[k];
            return out;
        };
        if (from_right) {
            merged.push_back(join(0, pieces.size() - keep));
            merged.insert(merged.end(), pieces.end() - static_cast<std::ptrdiff_t>(keep), pieces.end());
        } else {
            merged.assign(pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(keep));
            merged.push_back(join(keep, pieces.size()));
        }
        pieces = std::move(merged);
    }
    for (auto& p : pieces) parts.emplace_back(std::move(p));
    return value::make_array(std::move(parts));
}

std::string py_upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

std::string py_lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string py_title(const std::string& s) {
    std::string out = s;
    bool prev_cased = false;
    for (char& c : out) {
        auto u = static_cast<unsigned char>(c);
        bool alpha = std::isalpha(u) != 0;
        c = static_cast<char>(alpha ? (prev_cased ? std::tolower(u) : std::toupper(u)) : u);
        prev_cased = alpha;
    }
    return out;
}

std::string py_capitalize(const std::string& s) {
    std::string out = py_lower(s);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
    std::string out;
    if (from.empty()) {
        std::u32string u = to_u32(s);
        for (std::size_t i = 0; i <= u.size(); ++i) {
            if (count < 0 || static_cast<std::int64_t>(i) < count) out += to;
            if (i < u.size()) out += to_utf8(u.substr(i, 1));
        }
        return out;
    }
    std::size_t start = 0;
    std::int64_t n = 0;
    for (std::size_t p = s.find(from); p != std::string::npos && (count < 0 || n < count); p = s.find(from, start), ++n) {
        out += s.substr(start, p - start) + to;
        start = p + from.size();
    }
    return out + s.substr(start);
}

}  // namespace strata::jinja::detail
