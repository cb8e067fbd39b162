// The values a template computes with, modelled on the Python objects Jinja2 sees when transformers
// renders a chat template: undefined, None, bool, int, float, str, list/tuple, dict (insertion-ordered,
// string keys), namespace() and callables. Lists and dicts are shared by reference, as in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace strata::jinja {

// A render failure; the evaluator adds the template line.
struct template_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class value;
struct call_args;
using array = std::vector<value>;
struct object;
using native_fn = std::function<value(call_args&)>;

class value {
public:
    enum class kind { undefined, none, boolean, integer, floating, string, array, object, function };

    value() = default;  // undefined
    static value none();
    value(bool b);
    value(std::int64_t i);
    value(int i) : value(static_cast<std::int64_t>(i)) {}
    value(double d);
    value(std::string s);
    value(const char* s) : value(std::string(s)) {}
    static value make_array(array items = {}, bool tuple = false);
    static value make_object();
    static value make_function(std::string name, native_fn fn);
    static value from_json(const nlohmann::json& j);
    static value from_json(const nlohmann::ordered_json& j);  // keeps the objects' key order

    kind type() const { return kind_; }
    bool is_undefined() const { return kind_ == kind::undefined; }
    bool is_none() const { return kind_ == kind::none; }
    bool is_string() const { return kind_ == kind::string; }
    bool is_number() const { return kind_ == kind::integer || kind_ == kind::floating; }
    bool is_array() const { return kind_ == kind::array; }
    bool is_object() const { return kind_ == kind::object; }
    bool is_tuple() const { return kind_ == kind::array && tuple_; }

    bool as_bool() const { return b_; }
    std::int64_t as_int() const { return i_; }
    double as_double() const { return kind_ == kind::integer ? static_cast<double>(i_) : d_; }
    const std::string& str() const { return *s_; }
    array& items() const { return *a_; }
    object& obj() const { return *o_; }
    const native_fn& fn() const { return *f_; }
    const std::string& fn_name() const { return *s_; }

    bool truthy() const;
    // Python's str() and repr() of the value (undefined prints as "").
    std::string to_str() const;
    std::string repr() const;
    // The Python type name, for error messages ("str", "list", "dict", "NoneType", ...).
    std::string type_name() const;
    bool same_object(const value& o) const;

private:
    kind kind_ = kind::undefined;
    bool tuple_ = false;
    bool b_ = false;
    std::int64_t i_ = 0;
    double d_ = 0;
    std::shared_ptr<std::string> s_;
    std::shared_ptr<array> a_;
    std::shared_ptr<object> o_;
    std::shared_ptr<native_fn> f_;
};

struct object {
    std::vector<std::pair<std::string, value>> entries;  // insertion order
    bool is_namespace = false;

    const value* find(std::string_view key) const;
    void set(const std::string& key, value v);
};

// Arguments of a call: positional, then keyword in the order written.
struct call_args {
    std::vector<value> positional;
    std::vector<std::pair<std::string, value>> keyword;

    // The argument at position i or named name; undefined when absent.
    value get(std::size_t i, std::string_view name) const;
};

bool equal(const value& a, const value& b);
// Python's float repr ("1.0", "0.1", "1e-05", "inf").
std::string python_float_repr(double d);
// transformers' tojson: json.dumps(v, ensure_ascii, indent, separators, sort_keys).
struct json_options {
    bool ensure_ascii = false;
    int indent = -1;  // -1: None
    std::string item_sep;  // empty: Python's default for the indent
    std::string key_sep;
    bool sort_keys = false;
};
std::string to_json(const value& v, const json_options& opt);
// Length in code points of a UTF-8 string; code point view of it.
std::u32string to_u32(std::string_view s);
std::string to_utf8(std::u32string_view s);

}  // namespace strata::jinja
