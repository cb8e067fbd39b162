// Q8_0 x Q8_0 with AVX-512 VNNI (on 256-bit vectors: one 34-byte block per vector keeps the loads
// simple): vpdpbusd on |w| and a with w's sign, two blocks per step into two accumulators.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_0;
using formats::QK8_0;

template <int NT>
struct q8_0_avx512 {
    // One block into acc: (d_w * d_a) * (w . a), the int dot by vpdpbusd on |w| and a with w's sign.
    static inline void block(const block_q8_0& xb, const block_q8_0* const* y, int64_t i, __m256* acc) {
        const float d = half_to_float(xb.d);
        const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
        const __m256i ax = _mm256_sign_epi8(qx, qx);
        for (int t = 0; t < NT; ++t) {
            const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs));
            const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, _mm256_sign_epi8(qy, qx));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y[t][i].d)), _mm256_cvtepi32_ps(dot), acc[t]);
        }
    }

    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q8_0*>(w);
        const block_q8_0* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_0*>(a[t]);
        __m256 even[NT], odd[NT];  // blocks 2i and 2i + 1: two dependency chains
        for (int t = 0; t < NT; ++t) even[t] = odd[t] = _mm256_setzero_ps();
        const int64_t nb = n / QK8_0;
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            prefetch_weights<2 * sizeof(block_q8_0)>(x + i);
            block(x[i], y, i, even);
            block(x[i + 1], y, i + 1, odd);
        }
        if (i < nb) block(x[i], y, i, even);
        for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(even[t], odd[t]));
    }
};

}  // namespace

void dot_q8_0_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q8_0_avx512, 8>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
