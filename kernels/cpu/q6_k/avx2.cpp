// Q6_K x Q8_K, AVX2 (the kernel is in avx2_dot.hpp).
#include "cpu/q6_k/avx2_dot.hpp"

namespace strata::kernels::cpu::detail {
namespace {

template <int NT>
using q6_k_avx2 = q6_k_dot_avx2<NT, false>;

}  // namespace

void dot_q6_k_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<q6_k_avx2>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
