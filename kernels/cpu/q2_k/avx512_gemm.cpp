// Q2_K x Q8_K on the rows16 layout, AVX-512 VNNI (the kernel is q2_k/avx512_gemm.hpp's, shared by Q2_K and Q3_K).
#include "cpu/q2_k/avx512_gemm.hpp"

namespace strata::kernels::cpu::detail {

void gemm16_q2_k_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    lowk_gemm16_avx512<block_q2_Kx16>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
