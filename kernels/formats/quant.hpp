// Scalar reference code per format: conversions, dequantize, quantize, dot products.
// These are the definitions the ISA kernels (kernels/cpu) are tested against.
#pragma once

#include <cstdint>

#include "formats/blocks.hpp"
#include "formats/types.hpp"

namespace strata::formats {

float fp16_to_fp32(fp16_t h);
fp16_t fp32_to_fp16(float f);  // round to nearest even, saturating to inf like a hardware convert
float bf16_to_fp32(bf16_t h);
bf16_t fp32_to_bf16(float f);  // round to nearest even, NaN stays NaN

// Dequantizes n elements (a whole number of blocks) of `type` from src into dst.
// Throws std::invalid_argument for a type strata does not support or a ragged n.
void dequantize_row(ggml_type type, const void* src, float* dst, int64_t n);

// True where quantize_row has an encoder for the type.
bool can_quantize(ggml_type type);
// Quantizes n elements (a whole number of blocks) into row_size(type, n) bytes at dst.
void quantize_row(ggml_type type, const float* src, void* dst, int64_t n);

// The activation format a weight format's dot product reads (Q8_0, Q8_1, Q8_K, or F32 for float weights).
ggml_type vec_dot_type(ggml_type weight_type);
// Reference dot product of n elements: weight row w (of weight_type) with activation row a (of
// vec_dot_type(weight_type)), accumulated as the format defines it (integer sums per block, scaled in f32).
float vec_dot_ref(ggml_type weight_type, int64_t n, const void* w, const void* a);

}  // namespace strata::formats
