// Q4_K and Q5_K x Q8_K on the rows16 layout, AVX-512 VNNI: 16 rows x NT tokens per pass. Each 64-byte
// load holds 4 columns of 16 rows in both nibble halves (sub-blocks 2k and 2k + 1); vpdpbusd multiplies
// one half by the token's 4 activation bytes broadcast to every row, so one instruction does 64 products
// and the unpacking is shared by all NT tokens. Q5_K adds 16 where bit j of the matching qh bytes is set
// (sub-block j). Per sub-block the int sums are scaled by d * sc (per row); the mins go through the
// activation's bsums with vpdpwssd.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_K;
using formats::QK_K;

static inline __m512i broadcast_dword(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi32(v);
}

// 16 bytes -> 16 floats.
static inline __m512 bytes_to_ps(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Packed: block_q4_Kx16 or block_q5_Kx16 (the same fields plus qh).
template <class Packed, int NT>
struct k4_gemm16 {
    static constexpr bool fifth_bit = requires(const Packed& x) { x.qh; };

    // acc[t] (lane r: row r) += superblock i of the group times token t's activations.
    static inline void superblock(const Packed& x, const block_q8_K* const y[NT], int64_t i, __m512 acc[NT]) {
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d)));
        __m512 sumf[NT];  // sum over sub-blocks of d * sc * (q . a), lane r: row r
        for (int j = 0; j < 8; ++j) {
            const int k = j / 2, half = j % 2;
            __m512i isum[NT];
            for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
            for (int v = 0; v < 8; ++v) {
                const __m512i q = _mm512_loadu_si512(x.qs[8 * k + v]);
                __m512i w = half ? _mm512_and_si512(_mm512_srli_epi16(q, 4), low4) : _mm512_and_si512(q, low4);
                if constexpr (fifth_bit) {
                    const __mmask64 bit = _mm512_test_epi8_mask(_mm512_loadu_si512(x.qh[v]), _mm512_set1_epi8(static_cast<char>(1 << j)));
                    w = _mm512_mask_add_epi8(w, bit, w, _mm512_set1_epi8(16));
                }
                for (int t = 0; t < NT; ++t)
                    isum[t] = _mm512_dpbusd_epi32(isum[t], w, broadcast_dword(y[t][i].qs + 32 * j + 4 * v));
            }
            const __m512 scale = _mm512_mul_ps(d, bytes_to_ps(x.sc[j]));
            for (int t = 0; t < NT; ++t)
                sumf[t] = j == 0 ? _mm512_mul_ps(scale, _mm512_cvtepi32_ps(isum[t]))
                                 : _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum[t]), sumf[t]);
        }
        // mins: dword lane r holds m[j][r] twice (int16), times bsums 2j and 2j + 1 of the token.
        __m512i mins[8];
        for (int j = 0; j < 8; ++j) {
            const __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.m[j])));
            mins[j] = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));
        }
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.dmin)));
        for (int t = 0; t < NT; ++t) {
            __m512i msum = _mm512_setzero_si512();
            for (int j = 0; j < 8; ++j) msum = _mm512_dpwssd_epi32(msum, mins[j], broadcast_dword(y[t][i].bsums + 2 * j));
            const __m512 z = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(msum), sumf[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d), z, acc[t]);
        }
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const Packed*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            __m512 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) {
                prefetch_weights<sizeof(Packed)>(x + i);
                superblock(x[i], act, i, acc);
            }
            for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * y_stride + g * 16, acc[t]);
        }
    }
};

template <class Packed>
static void gemm16(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                   float* y, int64_t y_stride) {
    switch (n_tok) {
        case 1: k4_gemm16<Packed, 1>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 2: k4_gemm16<Packed, 2>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 3: k4_gemm16<Packed, 3>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 4: k4_gemm16<Packed, 4>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 5: k4_gemm16<Packed, 5>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 6: k4_gemm16<Packed, 6>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 7: k4_gemm16<Packed, 7>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
        case 8: k4_gemm16<Packed, 8>::run(n, w, group_bytes, n_groups, a, y, y_stride); return;
    }
}

}  // namespace

void gemm16_q4_k_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<block_q4_Kx16>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_k_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<block_q5_Kx16>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
