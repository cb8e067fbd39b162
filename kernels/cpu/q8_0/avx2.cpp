// Q8_0 x Q8_0, AVX2: per block an int dot (maddubs on |w| and a with w's sign) scaled by d_w * d_a.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_0;
using formats::QK8_0;

template <int NT>
struct q8_0_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_q8_0*>(w);
        const block_q8_0* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_0*>(a[t]);
        __m256 acc[NT];
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n / QK8_0; ++i) {
            prefetch_weights<sizeof(block_q8_0)>(x + i);
            const float d = half_to_float(x[i].d);
            const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
            const __m256i ax = _mm256_sign_epi8(qx, qx);
            for (int t = 0; t < NT; ++t) {
                const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs));
                const __m256 q = sum_pairs_i16_f32(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy, qx)));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y[t][i].d)), q, acc[t]);
            }
        }
        for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
    }
};

}  // namespace

void dot_q8_0_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q8_0_avx2>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
