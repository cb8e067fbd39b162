// The 32-element nibble formats and MXFP4 on the rows16 layout, plain AVX2 (the kernel is in avx2_gemm.hpp).
#include "cpu/legacy/avx2_gemm.hpp"

namespace strata::kernels::cpu::detail {

void gemm16_q4_0_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    gemm16<fmt_q4_0, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q4_1_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    gemm16<fmt_q4_1, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_0_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    gemm16<fmt_q5_0, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_1_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    gemm16<fmt_q5_1, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_iq4_nl_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<fmt_iq4_nl, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_mxfp4_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                       float* y, int64_t y_stride) {
    gemm16<fmt_mxfp4, false>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
