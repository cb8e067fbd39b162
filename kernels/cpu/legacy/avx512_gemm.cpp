// The 32-element nibble formats on the rows16 layout, AVX-512 VNNI: 16 rows x NT tokens per pass. Each
// 64-byte load holds 4 columns of 16 rows in both nibble halves; after masking (and, per format, the
// fifth bit added from a 64-bit mask or the IQ4_NL code looked up) the bytes are unsigned, so vpdpbusd
// multiplies them by the token's 4 activation bytes broadcast to every row: one instruction does 64
// products and the unpacking is shared by all NT tokens.
// NOTE: the signed formats are computed on unsigned codes u = q + offset (Q4_0: 8, Q5_0: 16, IQ4_NL and
// MXFP4: 128 over their code books); offset * sum(a) per block, computed once per call and token, takes it back
// out of the int sum exactly before the scale d_w * d_a. The _1 formats add m_w * s_a per block.
#include <memory>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86_512.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

static inline __mmask64 load_mask(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));
    return static_cast<__mmask64>(v);
}

// Per format: the packed block, the activation block, and how its codes become unsigned bytes.
struct fmt_q4_0 {
    using packed = block_q4_0x16;
    using act = block_q8_0;
    static constexpr int offset = 8;
    static constexpr bool has_m = false, has_qh = false, lookup = false;
};
struct fmt_iq4_nl {
    using packed = block_q4_0x16;
    using act = block_q8_0;
    static constexpr int offset = 128;
    static constexpr bool has_m = false, has_qh = false, lookup = true;
    static constexpr const int8_t* values = kvalues_iq4nl;
};
struct fmt_mxfp4 {
    using packed = block_mxfp4x16;
    using act = block_q8_0;
    static constexpr int offset = 128;
    static constexpr bool has_m = false, has_qh = false, lookup = true;
    static constexpr const int8_t* values = kvalues_mxfp4;
};
struct fmt_q5_0 {
    using packed = block_q5_0x16;
    using act = block_q8_0;
    static constexpr int offset = 16;
    static constexpr bool has_m = false, has_qh = true, lookup = false;
};
struct fmt_q4_1 {
    using packed = block_q4_1x16;
    using act = block_q8_1;
    static constexpr int offset = 0;
    static constexpr bool has_m = true, has_qh = false, lookup = false;
};
struct fmt_q5_1 {
    using packed = block_q5_1x16;
    using act = block_q8_1;
    static constexpr int offset = 0;
    static constexpr bool has_m = true, has_qh = true, lookup = false;
};

// Per activation block: offset * sum(qs), d and (Q8_1) s as f32.
struct block_terms {
    int32_t offset;
    float d, s;
};

template <class F>
static void fill_terms(const typename F::act* a, int64_t n_blocks, block_terms* out) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t offset = 0;
        if constexpr (F::offset != 0) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
            const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);  // 8 partial sums
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
            offset = F::offset * _mm_cvtsi128_si32(h);
        }
        float s = 0.0f;
        if constexpr (F::has_m) s = half_to_float(a[b].s);
        out[b] = {offset, half_to_float(a[b].d), s};
    }
}

// The 16 rows' weight scales: the f16 d, or MXFP4's 2^(e - 128) (e < 2: a subnormal) from the exponent byte.
template <class P>
static inline __m512 row_scales(const P& x) {
    if constexpr (requires { x.e; }) {
        const __m512i one = _mm512_set1_epi32(1);
        const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.e)));
        const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, one), 23);
        const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
        return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e, one), subnormal, normal));
    } else {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d)));
    }
}

template <class F, int NT>
struct legacy_gemm16 {
    // Up to 4 tokens the low and high nibble halves sum into two chains (latency); above, one.
    static constexpr int chains = NT <= 4 ? 2 : 1;

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const int64_t nb = n / 32;
        const typename F::act* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const typename F::act*>(a[t]);
        // terms[t * nb + b]: token t's block b
        constexpr int64_t stack_blocks = 8 * 256;
        block_terms stack_terms[stack_blocks];
        std::unique_ptr<block_terms[]> heap_terms;
        block_terms* terms = stack_terms;
        if (NT * nb > stack_blocks) terms = (heap_terms = std::make_unique<block_terms[]>(static_cast<size_t>(NT * nb))).get();
        for (int t = 0; t < NT; ++t) fill_terms<F>(act[t], nb, terms + t * nb);

        const __m512i low4 = _mm512_set1_epi8(0x0F);
        const __m512i fifth = _mm512_set1_epi8(0x10);
        // the code book + 128 as bytes, in each 128-bit lane
        __m512i values = _mm512_setzero_si512();
        if constexpr (F::lookup)
            values = _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(F::values)),
                                                           _mm_set1_epi8(static_cast<char>(0x80))));
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const typename F::packed*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            __m512 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; ++b) {
                prefetch_weights<sizeof(typename F::packed)>(x + b);
                __m512i isum[chains][NT];
                for (int c = 0; c < chains; ++c)
                    for (int t = 0; t < NT; ++t) isum[c][t] = _mm512_setzero_si512();
                for (int v = 0; v < 4; ++v) {
                    const __m512i q = _mm512_loadu_si512(x[b].qs[v]);
                    __m512i lo = _mm512_and_si512(q, low4);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
                    if constexpr (F::has_qh) {
                        lo = _mm512_mask_add_epi8(lo, load_mask(x[b].qh[2 * v]), lo, fifth);
                        hi = _mm512_mask_add_epi8(hi, load_mask(x[b].qh[2 * v + 1]), hi, fifth);
                    }
                    if constexpr (F::lookup) {
                        lo = _mm512_shuffle_epi8(values, lo);
                        hi = _mm512_shuffle_epi8(values, hi);
                    }
                    for (int t = 0; t < NT; ++t) {
                        isum[0][t] = dpbusd_bcast(isum[0][t], lo, act[t][b].qs + 4 * v);
                        isum[chains - 1][t] = dpbusd_bcast(isum[chains - 1][t], hi, act[t][b].qs + 16 + 4 * v);
                    }
                }
                const __m512 dw = row_scales(x[b]);
                for (int t = 0; t < NT; ++t) {
                    const block_terms& tb = terms[t * nb + b];
                    __m512i sumi = chains == 2 ? _mm512_add_epi32(isum[0][t], isum[chains - 1][t]) : isum[0][t];
                    if constexpr (F::offset != 0) sumi = _mm512_sub_epi32(sumi, _mm512_set1_epi32(tb.offset));
                    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(tb.d)), _mm512_cvtepi32_ps(sumi), acc[t]);
                    if constexpr (F::has_m) {
                        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].m)));
                        acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(tb.s), acc[t]);
                    }
                }
            }
            for (int t = 0; t < NT; ++t) _mm512_storeu_ps(y + t * y_stride + g * 16, acc[t]);
        }
    }
};

template <class F>
static void gemm16(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                   float* y, int64_t y_stride) {
    with_tokens<8>(n_tok, [&]<int NT>() {
        legacy_gemm16<F, NT>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace

void gemm16_q4_0_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<fmt_q4_0>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q4_1_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<fmt_q4_1>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_0_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<fmt_q5_0>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_q5_1_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16<fmt_q5_1>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_iq4_nl_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm16<fmt_iq4_nl>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}
void gemm16_mxfp4_avx512(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                         float* y, int64_t y_stride) {
    gemm16<fmt_mxfp4>(n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
