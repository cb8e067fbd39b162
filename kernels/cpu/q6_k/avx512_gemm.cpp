// Q6_K x Q8_K on the rows16 layout, AVX-512 VNNI: 16 rows x NT tokens per pass. A 64-byte load of ql
// dwords holds 4 columns of 16 rows in two nibble halves, one of qh dwords the top 2 bits of 4 such
// column sets; the unsigned 6-bit codes go into vpdpbusd against the token's 4 activation bytes
// broadcast to every row (64 products per instruction, unpacking shared by all NT tokens).
// NOTE: everything stays in int32 until the end of a superblock: each sub-block's sum times its int8
// scale (per row), minus 32 * sum(sc * bsums) (vpdpwssd on the activation's bsums) for the code offset,
// then one (d_w * d_a) * isum per superblock, as the reference does.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86_512.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using formats::block_q8_K;
using formats::QK_K;

// 16 int8 -> 16 int32.
static inline __m512i scales_epi32(const int8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int NT>
struct q6_k_gemm16 {
    // Codes of quarter k (elements 128c + 32k + 4v + i) from ql dwords a (k even) or b (k odd) and qh h.
    static inline __m512i codes(int k, __m512i a, __m512i b, __m512i h) {
        const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
        const __m512i q = k % 2 == 0 ? a : b;
        const __m512i lo = k < 2 ? _mm512_and_si512(q, low4) : _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
        __m512i hi;  // bits 2k, 2k + 1 of h moved to bits 4, 5
        switch (k) {
            case 0: hi = _mm512_slli_epi16(h, 4); break;
            case 1: hi = _mm512_slli_epi16(h, 2); break;
            case 2: hi = h; break;
            default: hi = _mm512_srli_epi16(h, 2); break;
        }
        return _mm512_or_si512(lo, _mm512_and_si512(hi, top2));
    }

    // superblock() for one or two tokens: each (ql, ql, qh) load triple gives the codes of all four
    // quarters (shared shifts), so four dot-product chains per token run side by side; each sub-block's
    // sum starts at -32 * its bsum, so the code offset needs no second pass. Same int32 total, exactly.
    static inline void superblock_few(const block_q6_Kx16& x, const block_q8_K* const y[NT], int64_t i, __m512 acc[NT]) {
        const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
        alignas(64) int32_t offset[NT][16];  // -32 * bsums[j] of token t
        for (int t = 0; t < NT; ++t) {
            const __m512i bs = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums)));
            _mm512_store_si512(offset[t], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bs, 5)));
        }
        __m512i total[NT];
        for (int t = 0; t < NT; ++t) total[t] = _mm512_setzero_si512();
        for (int c = 0; c < 2; ++c)
            for (int s = 0; s < 2; ++s) {
                __m512i isum[4][NT];  // sub-block 8c + 2k + s
                for (int k = 0; k < 4; ++k)
                    for (int t = 0; t < NT; ++t) isum[k][t] = _mm512_set1_epi32(offset[t][8 * c + 2 * k + s]);
                for (int v = 4 * s; v < 4 * s + 4; ++v) {
                    const __m512i a = _mm512_loadu_si512(x.ql[16 * c + v]), b = _mm512_loadu_si512(x.ql[16 * c + 8 + v]);
                    const __m512i h = _mm512_loadu_si512(x.qh[8 * c + v]);
                    // low nibble (bits 0-3) from a, b or their high nibbles, bits 4-5 from h: (lo & 0x0F) | hi.
                    const __m512i w[4] = {
                        _mm512_ternarylogic_epi32(low4, a, _mm512_and_si512(_mm512_slli_epi16(h, 4), top2), 0xEA),
                        _mm512_ternarylogic_epi32(low4, b, _mm512_and_si512(_mm512_slli_epi16(h, 2), top2), 0xEA),
                        _mm512_ternarylogic_epi32(low4, _mm512_srli_epi16(a, 4), _mm512_and_si512(h, top2), 0xEA),
                        _mm512_ternarylogic_epi32(low4, _mm512_srli_epi16(b, 4), _mm512_and_si512(_mm512_srli_epi16(h, 2), top2), 0xEA),
                    };
                    for (int k = 0; k < 4; ++k)
                        for (int t = 0; t < NT; ++t)
                            isum[k][t] = _mm512_dpbusd_epi32(isum[k][t], w[k], broadcast_dword(y[t][i].qs + 128 * c + 32 * k + 4 * v));
                }
                for (int k = 0; k < 4; ++k) {
                    const __m512i sc = scales_epi32(x.sc[8 * c + 2 * k + s]);
                    for (int t = 0; t < NT; ++t) total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(isum[k][t], sc));
                }
            }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d)));
        for (int t = 0; t < NT; ++t)
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(y[t][i].d)), _mm512_cvtepi32_ps(total[t]), acc[t]);
    }

    // acc[t] (lane r: row r) += superblock i of the group times token t's activations.
    static inline void superblock(const block_q6_Kx16& x, const block_q8_K* const y[NT], int64_t i, __m512 acc[NT]) {
        __m512i total[NT];  // sum over sub-blocks of sc * (q . a), lane r: row r
        for (int t = 0; t < NT; ++t) total[t] = _mm512_setzero_si512();
        // k and v unrolled, so codes() shifts by constants (GCC kept them as loops); c and s stay loops,
        // which spill no accumulators. Each half c of the superblock prefetches half its lines (prefetch_distance
        // ahead): one burst per superblock left the faster loop waiting on memory.
#pragma GCC unroll 1
        for (int c = 0; c < 2; ++c) {
            prefetch_weights_part<sizeof(block_q6_Kx16)>(&x, c, 2);
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k)
#pragma GCC unroll 1
                for (int s = 0; s < 2; ++s) {
                    const int j = 8 * c + 2 * k + s;  // sub-block of elements 128c + 32k + 16s ..
                    __m512i isum[NT];
                    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int v = 4 * s; v < 4 * s + 4; ++v) {
                        const __m512i w = codes(k, _mm512_loadu_si512(x.ql[16 * c + v]), _mm512_loadu_si512(x.ql[16 * c + 8 + v]),
                                                _mm512_loadu_si512(x.qh[8 * c + v]));
                        for (int t = 0; t < NT; ++t)
                            isum[t] = dpbusd_bcast(isum[t], w, y[t][i].qs + 128 * c + 32 * k + 4 * v);
                    }
                    const __m512i sc = scales_epi32(x.sc[j]);
                    for (int t = 0; t < NT; ++t) total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(isum[t], sc));
                    // Up to 7 tokens, each sub-block's sums are folded before the next one's start: GCC
                    // otherwise runs the unrolled sub-blocks' chains side by side and spills them. At 8 the
                    // barrier makes it spill the totals instead.
                    if constexpr (NT < 8)
                        for (int t = 0; t < NT; ++t) __asm__ volatile("" : "+v"(total[t]));
                }
        }
        // The code offset: dword lane r holds sc[2p][r], sc[2p + 1][r] (int16), times bsums 2p and 2p + 1.
        __m512i pairs[8];
        for (int p = 0; p < 8; ++p) {
            const __m512i lo = _mm512_and_si512(scales_epi32(x.sc[2 * p]), _mm512_set1_epi32(0xFFFF));
            pairs[p] = _mm512_or_si512(lo, _mm512_slli_epi32(scales_epi32(x.sc[2 * p + 1]), 16));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d)));
        for (int t = 0; t < NT; ++t) {
            __m512i offset = _mm512_setzero_si512();
            for (int p = 0; p < 8; ++p) offset = _mm512_dpwssd_epi32(offset, pairs[p], broadcast_dword(y[t][i].bsums + 2 * p));
            const __m512i isum = _mm512_sub_epi32(total[t], _mm512_slli_epi32(offset, 5));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(y[t][i].d)), _mm512_cvtepi32_ps(isum), acc[t]);
        }
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const block_q8_K* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const block_q8_K*>(a[t]);
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const block_q6_Kx16*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            __m512 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) {
                if constexpr (NT <= 2) {
                    prefetch_weights<sizeof(block_q6_Kx16)>(x + i);
                    superblock_few(x[i], act, i, acc);
                } else {
                    superblock(x[i], act, i, acc);  // prefetches as it goes
                }
            }
            for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * y_stride + g * 16, acc[t]);
        }
    }
};

}  // namespace

void gemm16_q6_k_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    with_tokens<8>(n_tok, [&]<int NT>() {
        q6_k_gemm16<NT>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace strata::kernels::cpu::detail
