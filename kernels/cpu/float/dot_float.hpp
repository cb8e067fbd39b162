// Internal: the float matvec kernel template shared by float/avx2.cpp and float/avx512.cpp. Each
// includer supplies a vector traits type V (width, load-as-f32 for F32 / F16 / BF16 weights, fmadd,
// horizontal sum); the template is instantiated in an anonymous namespace per file so AVX2 and
// AVX-512 code never merge.
#pragma once

#include <cstdint>

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

}  // namespace
}  // namespace strata::kernels::cpu::detail
