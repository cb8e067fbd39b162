// Internal to kernels/formats: per-format entry points the dispatch table in quant.cpp points at,
// and the scale searches the quantizers share. n is always a whole number of blocks here
// (quant.cpp validates it before calling).
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/blocks.hpp"

namespace strata::formats::detail {

using dequantize_fn = void (*)(const void* src, float* dst, int64_t n);
using quantize_fn = void (*)(const float* src, void* dst, int64_t n);
using vec_dot_fn = float (*)(int64_t n, const void* w, const void* a);

// Round half to even in the default floating-point environment, as an int.
inline int nearest_int(float x) { return static_cast<int>(std::lrintf(x)); }

// ---- scale searches (search.cpp) ----

// Symmetric codes: x[i] ~ scale * q[i] with q[i] in [-nmax, nmax - 1]. Tries a few inverse scales around
// the one mapping the largest-magnitude value to -nmax, keeps the least-squares fit with the smallest
// error. Writes q[i] + nmax (0 .. 2*nmax-1) to codes and returns the scale (0 for an all-zero input).
float fit_symmetric(int n, int nmax, const float* x, uint8_t* codes);

// Affine codes: x[i] ~ scale * q[i] + offset with q[i] in [0, nmax]. The k-quants store -offset as an
// unsigned number, so offset <= 0 unless free_offset (Q4_1 / Q5_1 store it as a signed half). Searches
// the scale, solving the 2x2 least-squares problem for (scale, offset) per candidate code assignment.
// Writes q to codes, returns scale (> 0, or 0 for a constant block), sets *offset.
float fit_affine(int n, int nmax, const float* x, uint8_t* codes, float* offset, bool free_offset);

// Non-linear 4-bit codes: x[i] ~ scale * kvalues_iq4nl[q[i]]. Searches the scale as fit_symmetric does.
float fit_iq4(int n, const float* x, uint8_t* codes);
// The index of the code book entry nearest to v (in units of the scale).
int nearest_iq4_index(float v);

// Largest |x[i]|.
float max_abs(int n, const float* x);

// ---- per-format entry points (a weight row w, an activation row a of the vec_dot type) ----

// fp16.cpp
void dequantize_f32(const void* src, float* dst, int64_t n);
void quantize_f32(const float* src, void* dst, int64_t n);
float vec_dot_f32(int64_t n, const void* w, const void* a);
void dequantize_f16(const void* src, float* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
float vec_dot_f16(int64_t n, const void* w, const void* a);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);
float vec_dot_bf16(int64_t n, const void* w, const void* a);
// legacy.cpp
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void quantize_q4_0(const float* src, void* dst, int64_t n);
float vec_dot_q4_0(int64_t n, const void* w, const void* a);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void quantize_q4_1(const float* src, void* dst, int64_t n);
float vec_dot_q4_1(int64_t n, const void* w, const void* a);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void quantize_q5_0(const float* src, void* dst, int64_t n);
float vec_dot_q5_0(int64_t n, const void* w, const void* a);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void quantize_q5_1(const float* src, void* dst, int64_t n);
float vec_dot_q5_1(int64_t n, const void* w, const void* a);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void quantize_q8_0(const float* src, void* dst, int64_t n);
float vec_dot_q8_0(int64_t n, const void* w, const void* a);
void dequantize_q8_1(const void* src, float* dst, int64_t n);
void quantize_q8_1(const float* src, void* dst, int64_t n);
// q2_k.cpp
void dequantize_q2_K(const void* src, float* dst, int64_t n);
void quantize_q2_K(const float* src, void* dst, int64_t n);
float vec_dot_q2_K(int64_t n, const void* w, const void* a);
// q3_k.cpp
void dequantize_q3_K(const void* src, float* dst, int64_t n);
void quantize_q3_K(const float* src, void* dst, int64_t n);
float vec_dot_q3_K(int64_t n, const void* w, const void* a);
// q4_k.cpp
void dequantize_q4_K(const void* src, float* dst, int64_t n);
void quantize_q4_K(const float* src, void* dst, int64_t n);
float vec_dot_q4_K(int64_t n, const void* w, const void* a);
void dequantize_q5_K(const void* src, float* dst, int64_t n);
void quantize_q5_K(const float* src, void* dst, int64_t n);
float vec_dot_q5_K(int64_t n, const void* w, const void* a);
// q6_k.cpp
void dequantize_q6_K(const void* src, float* dst, int64_t n);
void quantize_q6_K(const float* src, void* dst, int64_t n);
float vec_dot_q6_K(int64_t n, const void* w, const void* a);
// q8_k.cpp
void dequantize_q8_K(const void* src, float* dst, int64_t n);
void quantize_q8_K(const float* src, void* dst, int64_t n);
float vec_dot_q8_K(int64_t n, const void* w, const void* a);
// iq4.cpp
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void quantize_iq4_nl(const float* src, void* dst, int64_t n);
float vec_dot_iq4_nl(int64_t n, const void* w, const void* a);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);
void quantize_iq4_xs(const float* src, void* dst, int64_t n);
float vec_dot_iq4_xs(int64_t n, const void* w, const void* a);

}  // namespace strata::formats::detail
