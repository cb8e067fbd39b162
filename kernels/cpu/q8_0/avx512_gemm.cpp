// Q8_0 x Q8_0 on the rows16 layout, AVX-512 VNNI: 16 rows x NT tokens per pass. The repacked weights
// are w + 128 (unsigned), so vpdpbusd multiplies 4 columns of 16 rows by the token's 4 activation bytes
// broadcast to every row; 128 * sum(a) per block, computed once per call and token, takes the offset
// back out exactly before the scale d_w * d_a.
#include <memory>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86_512.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_0;
using formats::QK8_0;

// Per activation block: 128 * sum(qs) and d as f32.
struct block_terms {
    int32_t offset;
    float d;
};

static void fill_terms(const block_q8_0* a, int64_t n_blocks, block_terms* out) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);  // 8 partial sums
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
        out[b] = {128 * _mm_cvtsi128_si32(h), half_to_float(a[b].d)};
    }
}

template <int NT>
struct q8_0_gemm16 {
    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const int64_t nb = n / QK8_0;
        const block_q8_0* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_0*>(a[t]);
        // terms[t * nb + b]: token t's block b
        constexpr int64_t stack_blocks = 8 * 256;
        block_terms stack_terms[stack_blocks];
        std::unique_ptr<block_terms[]> heap_terms;
        block_terms* terms = stack_terms;
        if (NT * nb > stack_blocks) terms = (heap_terms = std::make_unique<block_terms[]>(static_cast<size_t>(NT * nb))).get();
        for (int t = 0; t < NT; ++t) fill_terms(act[t], nb, terms + t * nb);

        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const block_q8_0x16*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            __m512 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; ++b) {
                __m512i isum[NT];
                for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
                const auto step = [&](int v) {
                    const __m512i q = _mm512_loadu_si512(x[b].qs[v]);
                    for (int t = 0; t < NT; ++t) isum[t] = dpbusd_bcast(isum[t], q, act[t][b].qs + 4 * v);
                };
                if constexpr (NT <= spread_prefetch_tokens) {
#pragma GCC unroll 1
                    for (int v = 0; v < 8; ++v) {
                        prefetch_weight_line(x + b, v);  // the block's 544 bytes: lines 0-7 here, line 8 below
                        step(v);
                    }
                    prefetch_weight_line(x + b, 8);
                } else {
                    prefetch_weights<sizeof(block_q8_0x16)>(x + b);
                    for (int v = 0; v < 8; ++v) step(v);
                }
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].d)));
                for (int t = 0; t < NT; ++t) {
                    const block_terms& tb = terms[t * nb + b];
                    const __m512 sumi = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], _mm512_set1_epi32(tb.offset)));
                    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(tb.d)), sumi, acc[t]);
                }
            }
            for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * y_stride + g * 16, acc[t]);
        }
    }
};

}  // namespace

void gemm16_q8_0_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    with_tokens<8>(n_tok, [&]<int NT>() {
        q8_0_gemm16<NT>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace strata::kernels::cpu::detail
