// Q8_0 x Q8_0 on the rows16 layout, AVX2: 8 rows (one half of a group) x NT tokens per pass. The
// stored bytes are w + 128; flipping the top bit gives w back, and vpmaddubsw on |w| and the token's 4
// activation bytes (broadcast to every row) carrying w's sign makes two exact int16 pair sums per row,
// widened by vpmaddwd. The unpacking is shared by all NT tokens; one float step per block, the same as
// the AVX-512 kernel's (its sums are the same integers), so both give the same bits.
#include <memory>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_0;
using formats::QK8_0;

static inline __m256i broadcast_dword(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi32(v);
}

template <int NT>
struct q8_0_gemm16 {
    // One token (decode): both halves of the group per block, so each 64-byte qs line is loaded once and
    // each activation broadcast serves 16 rows. The same integer sums and float steps per row as the
    // NT-token pass (int32 adds in another order are the same integers), so the same bits.
    static inline void run_one(const block_q8_0x16* x, int64_t nb, const block_q8_0* act, const float* da, float* y) {
        const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
        const __m256i ones = _mm256_set1_epi16(1);
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t b = 0; b < nb; ++b) {
            __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 1
            for (int v = 0; v < 8; ++v) {
                prefetch_weight_line_l2(x + b, v);  // the block's 544 bytes: lines 0-7 here, line 8 below
                const __m256i a = broadcast_dword(act[b].qs + 4 * v);
                for (int h = 0; h < 2; ++h) {
                    const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs[v][8 * h])), top);
                    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
                    isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(p, ones));
                }
            }
            prefetch_weight_line_l2(x + b, 8);
            const __m256 d = _mm256_set1_ps(da[b]);
            for (int h = 0; h < 2; ++h) {
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].d + 8 * h)));
                acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, d), _mm256_cvtepi32_ps(isum[h]), acc[h]);
            }
        }
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + 8 * h, acc[h]);
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const int64_t nb = n / QK8_0;
        const block_q8_0* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_0*>(a[t]);
        // The tokens' block scales as f32, da[NT b + t], converted once per call for every row.
        constexpr int64_t stack_scales = 8 * 512;
        float stack_da[stack_scales];
        std::unique_ptr<float[]> heap_da;
        float* da = stack_da;
        if (NT * nb > stack_scales) da = (heap_da = std::make_unique<float[]>(static_cast<size_t>(NT * nb))).get();
        for (int64_t b = 0; b < nb; ++b)
            for (int t = 0; t < NT; ++t) da[NT * b + t] = half_to_float(act[t][b].d);
        const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
        const __m256i ones = _mm256_set1_epi16(1);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const block_q8_0x16*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            if constexpr (NT == 1) {
                run_one(x, nb, act[0], da, y + g * 16);
                continue;
            }
            for (int h = 0; h < 2; ++h) {
                __m256 acc[NT];
                for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t b = 0; b < nb; ++b) {
                    if (h == 0) prefetch_weights<sizeof(block_q8_0x16)>(x + b);
                    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].d + 8 * h)));
                    // Half a block's columns decoded at a time and held while every token passes over them.
                    __m256i isum[NT];
                    for (int part = 0; part < 2; ++part) {
                        __m256i q[4], mag[4];
                        for (int v = 0; v < 4; ++v) {
                            q[v] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs[4 * part + v][8 * h])), top);
                            mag[v] = _mm256_sign_epi8(q[v], q[v]);
                        }
                        for (int t = 0; t < NT; ++t) {
                            const int8_t* a8 = act[t][b].qs + 16 * part;
                            __m256i p[4];
                            for (int v = 0; v < 4; ++v)
                                p[v] = _mm256_madd_epi16(_mm256_maddubs_epi16(mag[v], _mm256_sign_epi8(broadcast_dword(a8 + 4 * v), q[v])), ones);
                            const __m256i s = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
                            isum[t] = part == 0 ? s : _mm256_add_epi32(isum[t], s);
                        }
                    }
                    for (int t = 0; t < NT; ++t) {
                        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da[NT * b + t])), _mm256_cvtepi32_ps(isum[t]), acc[t]);
                    }
                }
                for (int t = 0; t < NT; ++t) _mm256_storeu_ps(y + t * y_stride + g * 16 + 8 * h, acc[t]);
            }
        }
    }
};

}  // namespace

void gemm16_q8_0_avx2(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    with_tokens<8>(n_tok, [&]<int NT>() {
        q8_0_gemm16<NT>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace strata::kernels::cpu::detail
