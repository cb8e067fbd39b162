// Internal: the float matvec kernel template shared by float/avx2.cpp and float/avx512.cpp, and its prompt
// GEMM (float/avx512.cpp). Each includer supplies a vector traits type V (width, load-as-f32 for F32 / F16 /
// BF16 weights, fmadd, horizontal sum); the templates are instantiated in an anonymous namespace per file so
// AVX2 and AVX-512 code never merge.
#pragma once

#include <cstdint>

#include "cpu/detail/kernel_table.hpp"

namespace strata::kernels::cpu::detail {
namespace {

// Weights W (f32 / f16 / bf16 per Load) times NT f32 activations; `lanes` accumulators per token of
// V::width floats each, a scalar tail for n not a multiple of lanes * V::width.
template <typename V, typename Load, int NT>
struct float_dot {
    static constexpr int lanes = 2;
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const float* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const float*>(a[t]);
        typename V::reg acc[NT][lanes];
        for (int t = 0; t < NT; ++t)
            for (int l = 0; l < lanes; ++l) acc[t][l] = V::zero();
        constexpr int step = lanes * V::width;
        int64_t i = 0;
        for (; i + step <= n; i += step) {
            Load::prefetch(w, i);
            for (int l = 0; l < lanes; ++l) {
                const auto wv = Load::load(w, i + l * V::width);
                for (int t = 0; t < NT; ++t) acc[t][l] = V::fmadd(wv, V::load(y[t] + i + l * V::width), acc[t][l]);
            }
        }
        for (int t = 0; t < NT; ++t) {
            float sum = V::hsum(V::add(acc[t][0], acc[t][1]));
            for (int64_t k = i; k < n; ++k) sum += Load::scalar(w, k) * y[t][k];
            out[t] = sum;
        }
    }
};

// The float formats' prompt GEMM: R rows x T tokens at a time, each (row, token) pair through float_dot's
// own operations (its two accumulators, steps, sum and tail), so every result is bitwise the dot
// kernel's. A step's weights are loaded (and widened) once for T tokens, its activations once for R rows.
template <typename V, typename Load, int R, int T>
struct float_tile {
    static void run(int64_t n, const void* const w[R], const float* const y[T], bool prefetch, float* out,
                    int64_t out_stride) {
        constexpr int lanes = float_dot<V, Load, 1>::lanes;
        typename V::reg acc[R][T][lanes];
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < T; ++t)
                for (int l = 0; l < lanes; ++l) acc[r][t][l] = V::zero();
        constexpr int step = lanes * V::width;
        int64_t i = 0;
        for (; i + step <= n; i += step) {
            if (prefetch)
                for (int r = 0; r < R; ++r) Load::prefetch(w[r], i);
            for (int l = 0; l < lanes; ++l) {
                typename V::reg wv[R];
                for (int r = 0; r < R; ++r) {
                    wv[r] = Load::load(w[r], i + l * V::width);
                    // Kept in a register: GCC otherwise folds the load into every token's FMA, loading it T times.
                    __asm__("" : "+v"(wv[r]));
                }
                for (int t = 0; t < T; ++t) {
                    const typename V::reg av = V::load(y[t] + i + l * V::width);
                    for (int r = 0; r < R; ++r) acc[r][t][l] = V::fmadd(wv[r], av, acc[r][t][l]);
                }
            }
        }
        static_assert(lanes == 2);
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < T; ++t) {
                float sum = V::hsum(V::add(acc[r][t][0], acc[r][t][1]));
                for (int64_t k = i; k < n; ++k) sum += Load::scalar(w[r], k) * y[t][k];
                out[t * out_stride + r] = sum;
            }
    }
};

// gemm_rows_fn over float weights: tiles of R rows, each passing over the tokens T at a time (the first
// pass prefetches the rows, the others find them in cache).
template <typename V, typename Load, int R, int T>
struct float_gemm {
    template <int NR, int NT>
    static void tile(int64_t n, const uint8_t* w, size_t row_stride, const float* const* y, bool prefetch, float* out,
                     int64_t out_stride) {
        const void* rows[NR];
        for (int r = 0; r < NR; ++r) rows[r] = w + static_cast<size_t>(r) * row_stride;
        float_tile<V, Load, NR, NT>::run(n, rows, y, prefetch, out, out_stride);
    }

    template <int NR>
    static void rows_tile(int64_t n, const uint8_t* w, size_t row_stride, const float* const* y, int n_tok, float* out,
                          int64_t out_stride) {
        int t0 = 0;
        for (; t0 + T <= n_tok; t0 += T) tile<NR, T>(n, w, row_stride, y + t0, t0 == 0, out + t0 * out_stride, out_stride);
        const int rest = n_tok - t0;
        if constexpr (T > 1)
            if (rest == 1) tile<NR, 1>(n, w, row_stride, y + t0, t0 == 0, out + t0 * out_stride, out_stride);
        if constexpr (T > 2)
            if (rest == 2) tile<NR, 2>(n, w, row_stride, y + t0, t0 == 0, out + t0 * out_stride, out_stride);
        static_assert(T <= 3);
    }

    static void run(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                    float* y, int64_t y_stride) {
        const float* act[max_gemm_rows_tokens];
        for (int t = 0; t < n_tok; ++t) act[t] = static_cast<const float*>(a[t]);
        const auto* base = static_cast<const uint8_t*>(w);
        int64_t r0 = 0;
        for (; r0 + R <= n_rows; r0 += R) rows_tile<R>(n, base + r0 * row_stride, row_stride, act, n_tok, y + r0, y_stride);
        switch (n_rows - r0) {
            case 1: rows_tile<1>(n, base + r0 * row_stride, row_stride, act, n_tok, y + r0, y_stride); return;
            case 2: if constexpr (R > 2) rows_tile<2>(n, base + r0 * row_stride, row_stride, act, n_tok, y + r0, y_stride); return;
            case 3: if constexpr (R > 3) rows_tile<3>(n, base + r0 * row_stride, row_stride, act, n_tok, y + r0, y_stride); return;
        }
        static_assert(R <= 4);
    }
};

}  // namespace
}  // namespace strata::kernels::cpu::detail
