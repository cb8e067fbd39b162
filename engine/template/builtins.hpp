// Jinja2's filters and tests, Python's operators and the str/list/dict methods templates call, with
// the sandbox's refusal of methods that modify a list or dict.
#pragma once

#include <string>

#include "template/value.hpp"

namespace strata::jinja::detail {

value apply_filter(const std::string& name, const value& v, call_args& args);
bool apply_test(const std::string& name, const value& v, call_args& args);
// obj.name (attribute first, then item) and obj[key] (item first, then attribute).
value get_attr(const value& obj, const std::string& name);
value get_item(const value& obj, const value& key);
value slice(const value& obj, const value& start, const value& stop, const value& step);
// + - * / // % ** ~ == != < <= > >= in "not in" (and/or are evaluated lazily by the caller).
value binary_op(const std::string& op, const value& a, const value& b);
// Iteration as Python's iter(): items of a list, keys of a dict, characters of a string.
array iterate(const value& v);
// The Python str of a value for output and "~".
inline std::string to_output(const value& v) { return v.to_str(); }

}  // namespace strata::jinja::detail
