// Q6_K on the rows16 layout, plain AVX2 (the kernel is in avx2_gemm.hpp).
#include "cpu/q6_k/avx2_gemm.hpp"

namespace strata::kernels::cpu::detail {

void gemm16_q6_k_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok, float* y,
                      int64_t y_stride) {
    gemm16_q6_k<false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
