// The Python str, list and dict methods a template may call (x.strip(), d.items(), ...).
#pragma once

#include <string>
#include <string_view>

#include "template/value.hpp"

namespace strata::jinja::detail {

// obj.name as a callable bound to obj; undefined when obj has no such method. Methods that modify a
// list or dict return a callable that fails as the immutable sandbox does.
value bound_method(const value& obj, const std::string& name);

// Python's str.strip/lstrip/rstrip (chars undefined or None: whitespace) and str.split.
std::string py_strip(std::string_view s, const value& chars, bool left, bool right);
value py_split(const std::string& s, const value& sep, std::int64_t maxsplit, bool from_right);
std::string py_upper(std::string s);
std::string py_lower(std::string s);
std::string py_title(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, std::int64_t count);

}  // namespace strata::jinja::detail
