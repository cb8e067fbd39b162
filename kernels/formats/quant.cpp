// Type dispatch for the scalar reference code: one table row per format strata implements.
#include "formats/quant.hpp"

#include <array>
#include <stdexcept>
#include <string>

#include "formats/detail.hpp"

namespace strata::formats {

namespace {

using namespace detail;

struct format_ops {
    ggml_type type;
    dequantize_fn dequantize;
    quantize_fn quantize;   // every format here has an encoder
    ggml_type dot_type;     // the activation format vec_dot reads
    vec_dot_fn vec_dot;     // nullptr for the activation-only format Q8_1
};

constexpr std::array kFormats = {
    format_ops{ggml_type::F32, dequantize_f32, quantize_f32, ggml_type::F32, vec_dot_f32},
    format_ops{ggml_type::F16, dequantize_f16, quantize_f16, ggml_type::F32, vec_dot_f16},
    format_ops{ggml_type::BF16, dequantize_bf16, quantize_bf16, ggml_type::F32, vec_dot_bf16},
    format_ops{ggml_type::Q4_0, dequantize_q4_0, quantize_q4_0, ggml_type::Q8_0, vec_dot_q4_0},
    format_ops{ggml_type::Q4_1, dequantize_q4_1, quantize_q4_1, ggml_type::Q8_1, vec_dot_q4_1},
    format_ops{ggml_type::Q5_0, dequantize_q5_0, quantize_q5_0, ggml_type::Q8_0, vec_dot_q5_0},
    format_ops{ggml_type::Q5_1, dequantize_q5_1, quantize_q5_1, ggml_type::Q8_1, vec_dot_q5_1},
    format_ops{ggml_type::Q8_0, dequantize_q8_0, quantize_q8_0, ggml_type::Q8_0, vec_dot_q8_0},
    format_ops{ggml_type::Q8_1, dequantize_q8_1, quantize_q8_1, ggml_type::Q8_1, nullptr},
    format_ops{ggml_type::Q2_K, dequantize_q2_K, quantize_q2_K, ggml_type::Q8_K, vec_dot_q2_K},
    format_ops{ggml_type::Q3_K, dequantize_q3_K, quantize_q3_K, ggml_type::Q8_K, vec_dot_q3_K},
    format_ops{ggml_type::Q4_K, dequantize_q4_K, quantize_q4_K, ggml_type::Q8_K, vec_dot_q4_K},
    format_ops{ggml_type::Q5_K, dequantize_q5_K, quantize_q5_K, ggml_type::Q8_K, vec_dot_q5_K},
    format_ops{ggml_type::Q6_K, dequantize_q6_K, quantize_q6_K, ggml_type::Q8_K, vec_dot_q6_K},
    format_ops{ggml_type::Q8_K, dequantize_q8_K, quantize_q8_K, ggml_type::Q8_K, vec_dot_q8_K},
    format_ops{ggml_type::IQ4_NL, dequantize_iq4_nl, quantize_iq4_nl, ggml_type::Q8_0, vec_dot_iq4_nl},
    format_ops{ggml_type::IQ4_XS, dequantize_iq4_xs, quantize_iq4_xs, ggml_type::Q8_K, vec_dot_iq4_xs},
    format_ops{ggml_type::IQ2_XXS, dequantize_iq2_xxs, quantize_iq2_xxs, ggml_type::Q8_K, vec_dot_iq2_xxs},
    format_ops{ggml_type::IQ2_XS, dequantize_iq2_xs, quantize_iq2_xs, ggml_type::Q8_K, vec_dot_iq2_xs},
    format_ops{ggml_type::IQ2_S, dequantize_iq2_s, quantize_iq2_s, ggml_type::Q8_K, vec_dot_iq2_s},
    format_ops{ggml_type::IQ3_XXS, dequantize_iq3_xxs, quantize_iq3_xxs, ggml_type::Q8_K, vec_dot_iq3_xxs},
    format_ops{ggml_type::IQ3_S, dequantize_iq3_s, quantize_iq3_s, ggml_type::Q8_K, vec_dot_iq3_s},
    format_ops{ggml_type::IQ1_S, dequantize_iq1_s, quantize_iq1_s, ggml_type::Q8_K, vec_dot_iq1_s},
    format_ops{ggml_type::IQ1_M, dequantize_iq1_m, quantize_iq1_m, ggml_type::Q8_K, vec_dot_iq1_m},
    format_ops{ggml_type::MXFP4, dequantize_mxfp4, quantize_mxfp4, ggml_type::Q8_0, vec_dot_mxfp4},
};

std::string type_name(ggml_type type) {
    const type_info* t = find_type(static_cast<uint32_t>(type));
    const std::string id = "id " + std::to_string(static_cast<uint32_t>(type));
    return t ? std::string(t->name) + " (" + id + ")" : "unknown type (" + id + ")";
}

// The table row for type, or an exception naming the type, the operation and the types it supports.
const format_ops& ops_for(ggml_type type, const char* operation, bool needs_vec_dot) {
    for (const auto& f : kFormats)
        if (f.type == type && (!needs_vec_dot || f.vec_dot)) return f;
    std::string supported;
    for (const auto& f : kFormats) {
        if (needs_vec_dot && !f.vec_dot) continue;
        if (!supported.empty()) supported += ", ";
        supported += info(f.type).name;
    }
    throw std::invalid_argument(std::string(operation) + ": " + type_name(type) +
                                " is not supported; supported types: " + supported);
}

// A row must be a whole number of blocks.
void check_row(ggml_type type, int64_t n) {
    const type_info& t = info(type);
    if (n < 0 || n % t.block_size != 0)
        throw std::invalid_argument("a row of " + std::to_string(n) + " elements is not a whole number of " +
                                    std::string(t.name) + " blocks of " + std::to_string(t.block_size));
}

}  // namespace

void dequantize_row(ggml_type type, const void* src, float* dst, int64_t n) {
    const format_ops& f = ops_for(type, "dequantize_row", false);
    check_row(type, n);
    f.dequantize(src, dst, n);
}

bool can_quantize(ggml_type type) {
    for (const auto& f : kFormats)
        if (f.type == type) return f.quantize != nullptr;
    return false;
}

void quantize_row(ggml_type type, const float* src, void* dst, int64_t n) {
    const format_ops& f = ops_for(type, "quantize_row", false);
    check_row(type, n);
    f.quantize(src, dst, n);
}

ggml_type vec_dot_type(ggml_type weight_type) { return ops_for(weight_type, "vec_dot_type", true).dot_type; }

float vec_dot_ref(ggml_type weight_type, int64_t n, const void* w, const void* a) {
    const format_ops& f = ops_for(weight_type, "vec_dot_ref", true);
    check_row(weight_type, n);
    check_row(f.dot_type, n);
    return f.vec_dot(n, w, a);
}

}  // namespace strata::formats
