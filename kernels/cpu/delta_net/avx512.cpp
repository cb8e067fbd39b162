// The delta rule on AVX-512: 16 columns per register; the sequential form keeps column blocks of 64
// (32 KiB of a 128-row state) in L1, one token reads and updates whole 128-column rows; GEMM tiles are
// 4 rows x 64 columns (16 accumulators of 32 registers).
#include <immintrin.h>

#include "cpu/delta_net/simd.hpp"

namespace strata::kernels::cpu::detail {
namespace {

struct vec512 {
    using type = __m512;
    static constexpr int width = 16, seq_nb = 4, seq1_na = 8, seq1_nb = 8, gemm_nb = 4;
    static type zero() { return _mm512_setzero_ps(); }
    static type set1(float x) { return _mm512_set1_ps(x); }
    static type load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, type x) { _mm512_storeu_ps(p, x); }
    static type mul(type a, type b) { return _mm512_mul_ps(a, b); }
    static type fmadd(type a, type b, type c) { return _mm512_fmadd_ps(a, b, c); }
    static type fnmadd(type a, type b, type c) { return _mm512_fnmadd_ps(a, b, c); }
};

}  // namespace

void delta_seq_avx512(float* S, const delta_io& io, int n_tok) { delta_seq_simd<vec512>(S, io, n_tok); }
void delta_chunk_avx512(float* S, const delta_io& io, int n_tok, int chunk, float* scratch) {
    delta_chunk_simd<vec512>(S, io, n_tok, chunk, scratch);
}

}  // namespace strata::kernels::cpu::detail
