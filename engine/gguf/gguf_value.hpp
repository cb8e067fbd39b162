// GGUF metadata values: the 13 on-disk types, arrays (possibly nested) included.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace strata::gguf {

// Thrown for every malformed file or misuse; the message names the field and the numbers.
struct gguf_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

enum class value_type : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
inline constexpr uint32_t kValueTypeCount = 13;

std::string_view type_name(value_type t);
size_t scalar_size(value_type t);  // bytes on disk; 0 for STRING and ARRAY

class value {
public:
    using array = std::vector<value>;

    value() : type_(value_type::UINT32), data_(uint64_t{0}) {}
    static value u8(uint8_t v) { return {value_type::UINT8, uint64_t{v}}; }
    static value i8(int8_t v) { return {value_type::INT8, int64_t{v}}; }
    static value u16(uint16_t v) { return {value_type::UINT16, uint64_t{v}}; }
    static value i16(int16_t v) { return {value_type::INT16, int64_t{v}}; }
    static value u32(uint32_t v) { return {value_type::UINT32, uint64_t{v}}; }
    static value i32(int32_t v) { return {value_type::INT32, int64_t{v}}; }
    static value u64(uint64_t v) { return {value_type::UINT64, v}; }
    static value i64(int64_t v) { return {value_type::INT64, v}; }
    static value f32(float v) { return {value_type::FLOAT32, double{v}}; }
    static value f64(double v) { return {value_type::FLOAT64, v}; }
    static value boolean(bool v) { return {value_type::BOOL, v}; }
    static value str(std::string v) { return {value_type::STRING, std::move(v)}; }
    // Every element must have elem_type; nested arrays are allowed.
    static value arr(value_type elem_type, array elems);
    static value str_array(const std::vector<std::string>& v);
    static value f32_array(const std::vector<float>& v);
    static value i32_array(const std::vector<int32_t>& v);

    value_type type() const { return type_; }
    value_type elem_type() const { return elem_type_; }  // ARRAY only
    bool is_integer() const;
    bool is_float() const { return type_ == value_type::FLOAT32 || type_ == value_type::FLOAT64; }

    // Checked conversions; throw gguf_error naming `what` when the type or range does not fit.
    uint64_t as_u64(std::string_view what = "value") const;
    int64_t as_i64(std::string_view what = "value") const;
    double as_f64(std::string_view what = "value") const;  // integers convert too
    bool as_bool(std::string_view what = "value") const;
    const std::string& as_string(std::string_view what = "value") const;
    const array& as_array(std::string_view what = "value") const;

    std::string to_string(size_t max_elems = 8) const;  // for `strata info`

private:
    using storage = std::variant<uint64_t, int64_t, double, bool, std::string, array>;
    value(value_type t, storage d) : type_(t), data_(std::move(d)) {}

    value_type type_;
    value_type elem_type_ = value_type::UINT8;
    storage data_;
};

}  // namespace strata::gguf
