#include "gguf/gguf_value.hpp"

#include <array>
#include <cmath>
#include <limits>

#include <spdlog/fmt/fmt.h>

namespace strata::gguf {

namespace {

constexpr std::array<std::string_view, kValueTypeCount> kTypeNames = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64"};

}  // namespace

std::string_view type_name(value_type t) {
    const auto i = static_cast<uint32_t>(t);
    return i < kValueTypeCount ? kTypeNames[i] : std::string_view("invalid");
}

size_t scalar_size(value_type t) {
    switch (t) {
        case value_type::UINT8: case value_type::INT8: case value_type::BOOL: return 1;
        case value_type::UINT16: case value_type::INT16: return 2;
        case value_type::UINT32: case value_type::INT32: case value_type::FLOAT32: return 4;
        case value_type::UINT64: case value_type::INT64: case value_type::FLOAT64: return 8;
        case value_type::STRING: case value_type::ARRAY: return 0;
    }
    return 0;
}

value value::arr(value_type elem_type, array elems) {
    for (size_t i = 0; i < elems.size(); ++i)
        if (elems[i].type() != elem_type)
            throw gguf_error(fmt::format("array element {} is {}, but the array holds {}", i,
                                         type_name(elems[i].type()), type_name(elem_type)));
    value v{value_type::ARRAY, std::move(elems)};
    v.elem_type_ = elem_type;
    return v;
}

value value::str_array(const std::vector<std::string>& v) {
    array elems;
    elems.reserve(v.size());
    for (const auto& s : v) elems.push_back(str(s));
    return arr(value_type::STRING, std::move(elems));
}

value value::f32_array(const std::vector<float>& v) {
    array elems;
    elems.reserve(v.size());
    for (float f : v) elems.push_back(f32(f));
    return arr(value_type::FLOAT32, std::move(elems));
}

value value::i32_array(const std::vector<int32_t>& v) {
    array elems;
    elems.reserve(v.size());
    for (int32_t i : v) elems.push_back(i32(i));
    return arr(value_type::INT32, std::move(elems));
}

bool value::is_integer() const {
    return std::holds_alternative<uint64_t>(data_) || std::holds_alternative<int64_t>(data_);
}

uint64_t value::as_u64(std::string_view what) const {
    if (const auto* u = std::get_if<uint64_t>(&data_)) return *u;
    if (const auto* i = std::get_if<int64_t>(&data_); i && *i >= 0) return static_cast<uint64_t>(*i);
    throw gguf_error(fmt::format("{} must be a non-negative integer, found {} {}", what, type_name(type_),
                                 to_string()));
}

int64_t value::as_i64(std::string_view what) const {
    if (const auto* i = std::get_if<int64_t>(&data_)) return *i;
    if (const auto* u = std::get_if<uint64_t>(&data_);
        u && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return static_cast<int64_t>(*u);
    throw gguf_error(fmt::format("{} must be an integer, found {} {}", what, type_name(type_), to_string()));
}

double value::as_f64(std::string_view what) const {
    if (const auto* d = std::get_if<double>(&data_)) return *d;
    if (const auto* u = std::get_if<uint64_t>(&data_)) return static_cast<double>(*u);
    if (const auto* i = std::get_if<int64_t>(&data_)) return static_cast<double>(*i);
    throw gguf_error(fmt::format("{} must be a number, found {}", what, type_name(type_)));
}

bool value::as_bool(std::string_view what) const {
    if (const auto* b = std::get_if<bool>(&data_)) return *b;
    throw gguf_error(fmt::format("{} must be a bool, found {}", what, type_name(type_)));
}

const std::string& value::as_string(std::string_view what) const {
    if (const auto* s = std::get_if<std::string>(&data_)) return *s;
    throw gguf_error(fmt::format("{} must be a string, found {}", what, type_name(type_)));
}

const value::array& value::as_array(std::string_view what) const {
    if (const auto* a = std::get_if<array>(&data_)) return *a;
    throw gguf_error(fmt::format("{} must be an array, found {}", what, type_name(type_)));
}

std::string value::to_string(size_t max_elems) const {
    return std::visit(
        [&](const auto& v) -> std::string {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, std::string>) {
                std::string s = v.size() > 60 ? v.substr(0, 57) + "..." : v;
                for (char& c : s)
                    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
                return "\"" + s + "\"";
            } else if constexpr (std::is_same_v<T, array>) {
                std::string s = fmt::format("[{} x {}]", v.size(), type_name(elem_type_));
                if (max_elems == 0 || v.empty()) return s;
                s += " {";
                for (size_t i = 0; i < v.size() && i < max_elems; ++i)
                    s += (i ? ", " : "") + v[i].to_string(0);
                return s + (v.size() > max_elems ? ", ...}" : "}");
            } else if constexpr (std::is_same_v<T, bool>) {
                return v ? "true" : "false";
            } else if constexpr (std::is_same_v<T, double>) {
                return fmt::format("{:g}", v);
            } else {
                return std::to_string(v);
            }
        },
        data_);
}

}  // namespace strata::gguf
