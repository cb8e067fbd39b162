// The 32-element nibble formats and MXFP4 on the rows16 layout, AVX2 with AVX-VNNI (the kernel is in
// avx2_gemm.hpp).
#include "cpu/legacy/avx2_gemm.hpp"

namespace strata::kernels::cpu::detail {

void gemm16_q4_0_avxvnni(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                         float* y, int64_t y_stride) {
    gemm16<fmt_q4_0, true>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q4_1_avxvnni(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                         float* y, int64_t y_stride) {
    gemm16<fmt_q4_1, true>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_0_avxvnni(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                         float* y, int64_t y_stride) {
    gemm16<fmt_q5_0, true>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_1_avxvnni(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                         float* y, int64_t y_stride) {
    gemm16<fmt_q5_1, true>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_iq4_nl_avxvnni(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                           float* y, int64_t y_stride) {
    gemm16<fmt_iq4_nl, true>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_mxfp4_avxvnni(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm16<fmt_mxfp4, true>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
