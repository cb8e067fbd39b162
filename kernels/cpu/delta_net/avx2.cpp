// The delta rule on AVX2: 8 columns per register; the sequential form keeps column blocks of 24 in L1
// (3 x 4 accumulators and operands within 16 registers), one token reads whole 128-column rows and
// updates them in blocks of 32; GEMM tiles are 4 rows x 16 columns.
#include <immintrin.h>

#include "cpu/delta_net/simd.hpp"

namespace strata::kernels::cpu::detail {
namespace {

struct vec256 {
    using type = __m256;
    static constexpr int width = 8, seq_nb = 3, seq1_na = 16, seq1_nb = 4, gemm_nb = 2;
    static type zero() { return _mm256_setzero_ps(); }
    static type set1(float x) { return _mm256_set1_ps(x); }
    static type load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, type x) { _mm256_storeu_ps(p, x); }
    static type mul(type a, type b) { return _mm256_mul_ps(a, b); }
    static type fmadd(type a, type b, type c) { return _mm256_fmadd_ps(a, b, c); }
    static type fnmadd(type a, type b, type c) { return _mm256_fnmadd_ps(a, b, c); }
};

}  // namespace

void delta_seq_avx2(float* S, const delta_io& io, int n_tok) { delta_seq_simd<vec256>(S, io, n_tok); }
void delta_chunk_avx2(float* S, const delta_io& io, int n_tok, int chunk, float* scratch) {
    delta_chunk_simd<vec256>(S, io, n_tok, chunk, scratch);
}

}  // namespace strata::kernels::cpu::detail
