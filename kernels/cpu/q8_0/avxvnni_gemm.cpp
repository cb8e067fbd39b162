// Q8_0 x Q8_0 on the rows16 layout, AVX2 with AVX-VNNI (vpdpbusd, VEX form): 8 rows x NT tokens per
// pass. As the AVX-512 kernel: the stored bytes w + 128 are unsigned, so vpdpbusd multiplies 4 columns
// of 8 rows by the token's 4 activation bytes broadcast to every row; 128 * sum(a) per block, computed
// once per call and token, takes the offset back out exactly, and the float step is the AVX-512 one.
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

// Per activation block: 128 * sum(qs) and d as f32.
struct block_terms {
    int32_t offset;
    float d;
};

static void fill_terms(const block_q8_0* a, int64_t n_blocks, block_terms* out) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
        const __m256i s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ones, q);  // 8 partial sums
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
        out[b] = {128 * _mm_cvtsi128_si32(h), half_to_float(a[b].d)};
    }
}

template <int NT>
struct q8_0_gemm16 {
    // One token (decode): both halves of the group per block, so each 64-byte qs line is loaded once and
    // each activation broadcast serves 16 rows; the same sums and float steps per row, so the same bits.
    static inline void run_one(const block_q8_0x16* x, int64_t nb, const block_q8_0* act, const block_terms* terms,
                               float* y) {
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t b = 0; b < nb; ++b) {
            __m256i part[2][2] = {};  // [h][v % 2]: two dependency chains per half
#pragma GCC unroll 1
            for (int v = 0; v < 8; v += 2) {
                for (int u = 0; u < 2; ++u) {
                    prefetch_weight_line(x + b, v + u);  // the block's 544 bytes: lines 0-7 here, line 8 below
                    const __m256i a = broadcast_dword(act[b].qs + 4 * (v + u));
                    for (int h = 0; h < 2; ++h)
                        part[h][u] = _mm256_dpbusd_avx_epi32(part[h][u], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs[v + u][8 * h])), a);
                }
            }
            prefetch_weight_line(x + b, 8);
            const __m256i isum[2] = {_mm256_add_epi32(part[0][0], part[0][1]), _mm256_add_epi32(part[1][0], part[1][1])};
            const __m256 d = _mm256_set1_ps(terms[b].d);
            for (int h = 0; h < 2; ++h) {
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].d + 8 * h)));
                const __m256 sumi = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[h], _mm256_set1_epi32(terms[b].offset)));
                acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, d), sumi, acc[h]);
            }
        }
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + 8 * h, acc[h]);
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const int64_t nb = n / QK8_0;
        const block_q8_0* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_0*>(a[t]);
        constexpr int64_t stack_blocks = 4 * 256;  // terms[t * nb + b]: token t's block b
        block_terms stack_terms[stack_blocks];
        std::unique_ptr<block_terms[]> heap_terms;
        block_terms* terms = stack_terms;
        if (NT * nb > stack_blocks) terms = (heap_terms = std::make_unique<block_terms[]>(static_cast<size_t>(NT * nb))).get();
        for (int t = 0; t < NT; ++t) fill_terms(act[t], nb, terms + t * nb);

        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const block_q8_0x16*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            if constexpr (NT == 1) {
                run_one(x, nb, act[0], terms, y + g * 16);
                continue;
            }
            for (int h = 0; h < 2; ++h) {
                __m256 acc[NT];
                for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t b = 0; b < nb; ++b) {
                    if (h == 0) prefetch_weights<sizeof(block_q8_0x16)>(x + b);
                    __m256i isum[NT];
                    for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
                    for (int v = 0; v < 8; ++v) {
                        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs[v][8 * h]));
                        for (int t = 0; t < NT; ++t)
                            isum[t] = _mm256_dpbusd_avx_epi32(isum[t], q, broadcast_dword(act[t][b].qs + 4 * v));
                    }
                    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].d + 8 * h)));
                    for (int t = 0; t < NT; ++t) {
                        const block_terms& tb = terms[t * nb + b];
                        const __m256 sumi = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], _mm256_set1_epi32(tb.offset)));
                        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(tb.d)), sumi, acc[t]);
                    }
                }
                for (int t = 0; t < NT; ++t) _mm256_storeu_ps(y + t * y_stride + g * 16 + 8 * h, acc[t]);
            }
        }
    }
};

}  // namespace

void gemm16_q8_0_avxvnni(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                         float* y, int64_t y_stride) {
    with_tokens<4>(n_tok, [&]<int NT>() {
        q8_0_gemm16<NT>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace strata::kernels::cpu::detail
