// Q4_K and Q5_K on the rows16 layout, plain AVX2 (the kernels are in avx2_gemm.hpp).
#include "cpu/q4_k/avx2_gemm.hpp"

namespace strata::kernels::cpu::detail {

void gemm16_q4_k_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    gemm16<block_q4_Kx16, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_k_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    gemm16<block_q5_Kx16, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
