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

// ---- IQ code book search (grid_search.cpp) ----

struct grid_book;
enum class grid_kind { iq2xxs, iq2xs, iq2s, iq3xxs, iq3s, iq1s };
const grid_book& book(grid_kind kind);  // built on first use, then shared (thread-safe)
int book_dim(const grid_book& b);       // values per entry: 8 or 4
float book_max_level(const grid_book& b);
int book_value(const grid_book& b, int entry, int j);
// The entry nearest (squared distance) to v[0 .. dim), found among the entries nearest to v's lattice
// point; *err (if given) gets the squared distance.
int nearest_entry(const grid_book& b, const float* v, float* err);

// A group of 8 elements of a signed code book: 1 entry (8 values) or 2 (4 values), sign bit j for element j.
struct signed_group {
    uint16_t entry[2] = {0, 0};
    uint8_t signs = 0;
};
// Encodes x[0 .. 8) at `scale` (x ~ scale * +-value); `even` forces an even count of negatives (IQ2_XXS,
// IQ2_XS, IQ3_XXS store 7 sign bits). Adds sum x q and sum q q of the code to xq, qq.
void encode_signed8(const grid_book& b, bool even, const float* x, float scale, signed_group& g, float& xq, float& qq);
// The least-squares scale of the best of a sweep of candidate scales for x[0 .. n) (n a multiple of 8).
float fit_signed(const grid_book& b, bool even, const float* x, int n);
// IQ1: the iq1s_grid entry for x[0 .. 8) ~ scale * (value + delta); adds sum x q and sum q q.
int encode_iq1_group(const float* x, float scale, float delta, float& xq, float& qq);
// Sub-block scales as odd multiples d * unit * (2 ls + 1), ls in [0, max_code]: d (rounded to half, returned)
// from the largest scale, ls[i] the nearest code for scales[i].
float odd_scales(const float* scales, int n, int max_code, float unit, int* ls);

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

// iq2.cpp
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n);
void quantize_iq2_xxs(const float* src, void* dst, int64_t n);
float vec_dot_iq2_xxs(int64_t n, const void* w, const void* a);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);
void quantize_iq2_xs(const float* src, void* dst, int64_t n);
float vec_dot_iq2_xs(int64_t n, const void* w, const void* a);
void dequantize_iq2_s(const void* src, float* dst, int64_t n);
void quantize_iq2_s(const float* src, void* dst, int64_t n);
float vec_dot_iq2_s(int64_t n, const void* w, const void* a);
// iq3.cpp
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void quantize_iq3_xxs(const float* src, void* dst, int64_t n);
float vec_dot_iq3_xxs(int64_t n, const void* w, const void* a);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void quantize_iq3_s(const float* src, void* dst, int64_t n);
float vec_dot_iq3_s(int64_t n, const void* w, const void* a);
// iq1.cpp
void dequantize_iq1_s(const void* src, float* dst, int64_t n);
void quantize_iq1_s(const float* src, void* dst, int64_t n);
float vec_dot_iq1_s(int64_t n, const void* w, const void* a);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);
void quantize_iq1_m(const float* src, void* dst, int64_t n);
float vec_dot_iq1_m(int64_t n, const void* w, const void* a);
// mxfp4.cpp
float e8m0_half(uint8_t e);  // 2^(e - 128): MXFP4's scale, halved to match the doubled code book
void dequantize_mxfp4(const void* src, float* dst, int64_t n);
void quantize_mxfp4(const float* src, void* dst, int64_t n);
float vec_dot_mxfp4(int64_t n, const void* w, const void* a);

}  // namespace strata::formats::detail
