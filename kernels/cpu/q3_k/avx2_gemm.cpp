// Q3_K x Q8_K on the rows16 layout, AVX2 (the kernel is q2_k/avx2_gemm.hpp's, shared with Q2_K).
#include "cpu/q2_k/avx2_gemm.hpp"

namespace strata::kernels::cpu::detail {

void gemm16_q3_k_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    lowk_gemm16<block_q3_Kx16, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
