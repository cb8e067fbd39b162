// The code book formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) x Q8_K and MXFP4 x Q8_0,
// AVX2. Each IQ format decodes a sub-block of 32 into magnitudes |w| (grid entries gathered by index; the
// IQ2/IQ3 grids hold no zero), a sign operand s with sign(s) = sign(w) (IQ1: w = 8 * value + delta sign,
// never zero, is its own) and int16 scales (one per 16 elements, a 128-bit lane each); every format then
// shares one loop: maddubs(|w|, sign(a, s)) times the scales,
// int32 sums per super-block, scaled by d_w * d_a in f32, and the format's unit (1/8, 1/4, 1) at the end.
// The prompt GEMM (iq_avx2_gemm, mxfp4_avx2_gemm) decodes each block once for up to 64 tokens and applies
// the same operations per token, so its results are bitwise the dot kernel's.
#include <bit>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "cpu/iq/sign_tables.hpp"
#include "formats/blocks.hpp"
#include "formats/iq_grids.hpp"
#include "cpu/iq/gemm_rows.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

// Grid entries gathered by 4 (64-bit entries) or 8 (32-bit) indices; index k gets bits from `high`
// (broadcast, shifted right by shift[k], masked) above bit 8 when the format has them.
// Scalar: loads put together instead of a vpgather (faster for some formats where gathers are
// microcoded, as on Zen 4).
template <bool Scalar = false>
static inline __m256i gather64(const uint64_t* grid, __m128i ix) {
    if constexpr (!Scalar) {
        return _mm256_i32gather_epi64(reinterpret_cast<const long long*>(grid), ix, 8);
    } else {
        alignas(16) uint32_t k[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(k), ix);
        asm("" : "+m"(k));  // reload the indices as scalars rather than extract them lane by lane
        return _mm256_setr_epi64x(static_cast<int64_t>(grid[k[0]]), static_cast<int64_t>(grid[k[1]]),
                                  static_cast<int64_t>(grid[k[2]]), static_cast<int64_t>(grid[k[3]]));
    }
}
static inline __m128i low_bytes4(const uint8_t* q) {
    uint32_t v;
    std::memcpy(&v, q, 4);
    return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(v)));
}
static inline __m128i high_bits4(int high, __m128i shift, int mask) {
    return _mm_slli_epi32(_mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(high), shift), _mm_set1_epi32(mask)), 8);
}
static inline __m256i signs64(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) {
    return _mm256_set_epi64x(static_cast<int64_t>(s3), static_cast<int64_t>(s2), static_cast<int64_t>(s1),
                             static_cast<int64_t>(s0));
}
static inline __m256i scale_pair(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(hi)), _mm_set1_epi16(static_cast<short>(lo)));
}

struct iq2_xxs_dec {
    using block = block_iq2_xxs;
    static constexpr float unit = 0.125f;
    static float d(const block& b) { return half_to_float(b.d); }
    static void sub(const block& b, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        uint32_t idx, meta;
        std::memcpy(&idx, b.qs + 4 * ib, 4);
        std::memcpy(&meta, b.qs + 4 * ib + 2, 4);
        mag = gather64(iq2xxs_grid, _mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(idx))));
        sgn = signs64(sign_even[meta & 127], sign_even[(meta >> 7) & 127], sign_even[(meta >> 14) & 127],
                      sign_even[(meta >> 21) & 127]);
        sc = _mm256_set1_epi16(static_cast<short>(2 * (meta >> 28) + 1));
    }
};

struct iq2_xs_dec {
    using block = block_iq2_xs;
    static constexpr float unit = 0.125f;
    static float d(const block& b) { return half_to_float(b.d); }
    static void sub(const block& b, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint16_t* q = b.qs + 4 * ib;
        mag = gather64<true>(iq2xs_grid, _mm_and_si128(_mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))), _mm_set1_epi32(511)));
        sgn = signs64(sign_even[q[0] >> 9], sign_even[q[1] >> 9], sign_even[q[2] >> 9], sign_even[q[3] >> 9]);
        sc = scale_pair(2 * (b.scales[ib] & 15) + 1, 2 * (b.scales[ib] >> 4) + 1);
    }
};

struct iq2_s_dec {
    using block = block_iq2_s;
    static constexpr float unit = 0.125f;
    static float d(const block& b) { return half_to_float(b.d); }
    static void sub(const block& b, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 4 * ib;
        const int h = b.qh[ib];
        mag = gather64(iq2s_grid, _mm_or_si128(low_bytes4(q), high_bits4(h, _mm_setr_epi32(0, 2, 4, 6), 3)));
        const uint8_t* s = b.qs + QK_K / 8 + 4 * ib;
        sgn = signs64(sign_pm1[s[0]], sign_pm1[s[1]], sign_pm1[s[2]], sign_pm1[s[3]]);
        sc = scale_pair(2 * (b.scales[ib] & 15) + 1, 2 * (b.scales[ib] >> 4) + 1);
    }
};

struct iq3_xxs_dec {
    using block = block_iq3_xxs;
    static constexpr float unit = 0.25f;
    static float d(const block& b) { return half_to_float(b.d); }
    static void sub(const block& b, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 8 * ib;
        uint32_t meta;
        std::memcpy(&meta, b.qs + QK_K / 4 + 4 * ib, 4);
        mag = _mm256_i32gather_epi32(reinterpret_cast<const int*>(iq3xxs_grid), _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))), 4);
        sgn = signs64(sign_even[meta & 127], sign_even[(meta >> 7) & 127], sign_even[(meta >> 14) & 127],
                      sign_even[(meta >> 21) & 127]);
        sc = _mm256_set1_epi16(static_cast<short>(2 * (meta >> 28) + 1));
    }
};

struct iq3_s_dec {
    using block = block_iq3_s;
    static constexpr float unit = 1.0f;
    static float d(const block& b) { return half_to_float(b.d); }
    static void sub(const block& b, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 8 * ib;
        const int h = b.qh[ib];
        const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(h), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                                              _mm256_set1_epi32(1));
        const __m256i ix = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))),
                                           _mm256_slli_epi32(high, 8));
        mag = _mm256_i32gather_epi32(reinterpret_cast<const int*>(iq3s_grid), ix, 4);
        const uint8_t* s = b.signs + 4 * ib;
        sgn = signs64(sign_pm1[s[0]], sign_pm1[s[1]], sign_pm1[s[2]], sign_pm1[s[3]]);
        sc = _mm256_set1_epi16(static_cast<short>(2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15) + 1));
    }
};

// IQ1: w = 8 * value + delta sign (value in -1, 0, 1), so |w| <= 9 and the unit is 1/8.
static inline __m256i iq1_weights(const __m256i grid, const __m256i delta) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), delta);
}

struct iq1_s_dec {
    using block = block_iq1_s;
    static constexpr float unit = 0.125f;
    static float d(const block& b) { return half_to_float(b.d); }
    static void sub(const block& b, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 4 * ib;
        const int h = b.qh[ib];
        const __m256i grid = gather64<true>(iq1s_grid, _mm_or_si128(low_bytes4(q), high_bits4(h, _mm_setr_epi32(0, 3, 6, 9), 7)));
        sgn = iq1_weights(grid, _mm256_set1_epi8(h & 0x8000 ? -1 : 1));
        mag = _mm256_sign_epi8(sgn, sgn);
        sc = _mm256_set1_epi16(static_cast<short>(2 * ((h >> 12) & 7) + 1));
    }
};

struct iq1_m_dec {
    using block = block_iq1_m;
    static constexpr float unit = 0.125f;
    static float d(const block& b) {
        uint16_t sc[4];
        std::memcpy(sc, b.scales, sizeof sc);
        return half_to_float(static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                                   (sc[3] & 0xf000)));
    }
    static void sub(const block& b, int ib, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 4 * ib;
        const int h0 = b.qh[2 * ib], h1 = b.qh[2 * ib + 1];
        const __m256i grid = gather64<true>(iq1s_grid, _mm_or_si128(low_bytes4(q), high_bits4(h0 | h1 << 8, _mm_setr_epi32(0, 4, 8, 12), 7)));
        // delta +1 (0x01 bytes) where bit 3 of the group's nibble is clear, else -1 (0xFF)
        const __m256i clear = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi16(static_cast<short>(h0 | h1 << 8)),
                                                                  _mm256_setr_epi64x(8, 0x80, 0x800, 0x8000)),
                                                 _mm256_setzero_si256());
        sgn = iq1_weights(grid, _mm256_or_si256(_mm256_andnot_si256(clear, _mm256_set1_epi8(-1)), _mm256_set1_epi8(1)));
        mag = _mm256_sign_epi8(sgn, sgn);
        uint16_t s;
        std::memcpy(&s, b.scales + 2 * (ib / 2), 2);
        const int bits = s >> (6 * (ib % 2));
        sc = scale_pair(2 * (bits & 7) + 1, 2 * ((bits >> 3) & 7) + 1);
    }
};

template <class F>
struct iq_avx2 {
    template <int NT>
    struct kernel {
        static void run(int64_t n, const void* w, const void* const* a, float* out) {
            const auto* x = static_cast<const typename F::block*>(w);
            const block_q8_K* y[NT];
            for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_K*>(a[t]);
            __m256 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n / QK_K; ++i) {
                prefetch_weights<sizeof(typename F::block)>(x + i);
                __m256i sumi[NT];
                for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
                for (int ib = 0; ib < QK_K / 32; ++ib) {
                    __m256i mag, sgn, sc;
                    F::sub(x[i], ib, mag, sgn, sc);
                    for (int t = 0; t < NT; ++t) {
                        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs + 32 * ib));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(q8, sgn)), sc));
                    }
                }
                const float d = F::d(x[i]);
                for (int t = 0; t < NT; ++t)
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
            for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]) * F::unit;
        }
    };
};

// MXFP4 x Q8_0: nibbles through the 16-entry doubled E2M1 table (pshufb), one block of 32 per step;
// block i goes to accumulator i % 2 (two FMA chains), summed at the end.
// 2^(e - 128) as a float for every E8M0 byte: e >= 2 is a normal exponent field of e - 1; e < 2 a subnormal.
struct mxfp4_scale_table {
    float v[256];
    constexpr mxfp4_scale_table() : v{} {
        for (uint32_t e = 0; e < 256; ++e) v[e] = std::bit_cast<float>(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    }
};
alignas(64) constexpr mxfp4_scale_table mxfp4_scales;

static inline void mxfp4_avx2_decode(const block_mxfp4& x, __m256i& aw, __m256i& wv, float& d) {
    const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_mxfp4));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i q4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs));
    wv = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q4, 4), low4)),
                          _mm_shuffle_epi8(values, _mm_and_si128(q4, low4)));
    aw = _mm256_sign_epi8(wv, wv);
    d = mxfp4_scales.v[x.e];
}

static inline __m256 mxfp4_avx2_step(__m256i aw, __m256i wv, float d, const block_q8_0& y, __m256 acc) {
    const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
    const __m256i sumi = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(q8, wv)), _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y.d)), _mm256_cvtepi32_ps(sumi), acc);
}

template <int NT>
struct mxfp4_avx2 {
    static void run(int64_t n, const void* w, const void* const* a, float* out) {
        const auto* x = static_cast<const block_mxfp4*>(w);
        const block_q8_0* y[NT];
        for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_0*>(a[t]);
        __m256 acc0[NT], acc1[NT];
        for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
        const int64_t nb = n / QK_MXFP4;
        const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_mxfp4)));
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        int64_t i = 0;
        for (; i + 1 < nb; i += 2) {
            prefetch_weights<2 * sizeof(block_mxfp4)>(x + i);
            // Both blocks' nibbles in one register (block i low lane), looked up at once: the same bytes as
            // mxfp4_avx2_decode gives per block.
            const __m256i q4 = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(x[i + 1].qs),
                                                   reinterpret_cast<const __m128i*>(x[i].qs));
            const __m256i vl = _mm256_shuffle_epi8(values, _mm256_and_si256(q4, low4));
            const __m256i vh = _mm256_shuffle_epi8(values, _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4));
            const __m256i wv0 = _mm256_permute2x128_si256(vl, vh, 0x20), wv1 = _mm256_permute2x128_si256(vl, vh, 0x31);
            const __m256i aw0 = _mm256_sign_epi8(wv0, wv0), aw1 = _mm256_sign_epi8(wv1, wv1);
            const float d0 = mxfp4_scales.v[x[i].e], d1 = mxfp4_scales.v[x[i + 1].e];
            for (int t = 0; t < NT; ++t) {
                acc0[t] = mxfp4_avx2_step(aw0, wv0, d0, y[t][i], acc0[t]);
                acc1[t] = mxfp4_avx2_step(aw1, wv1, d1, y[t][i + 1], acc1[t]);
            }
        }
        if (i < nb) {
            __m256i aw0, wv0;
            float d0;
            mxfp4_avx2_decode(x[i], aw0, wv0, d0);
            for (int t = 0; t < NT; ++t) acc0[t] = mxfp4_avx2_step(aw0, wv0, d0, y[t][i], acc0[t]);
        }
        for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc0[t], acc1[t]));
    }
};

// The prompt GEMM's parts of format F (iq/gemm_rows.hpp): the dot kernel's operations per token, each
// block decoded once for many tokens.
template <class F>
struct iq_avx2_gemm {
    using block = typename F::block;
    using act_block = block_q8_K;
    static constexpr int block_elems = QK_K, group = 4, rows = 4, chunk = 8;
    struct dec {
        __m256i mag[8], sgn[8], sc[8];
        float d;
    };
    using acc_t = __m256;
    static __m256 zero() { return _mm256_setzero_ps(); }
    static void decode(const block* x, int64_t i, dec& b) {
        for (int ib = 0; ib < QK_K / 32; ++ib) F::sub(x[i], ib, b.mag[ib], b.sgn[ib], b.sc[ib]);
        b.d = F::d(x[i]);
    }
    template <int NT>
    static void apply(const dec& b, const block_q8_K* const* y, int64_t i, __m256 acc[4]) {
        __m256i sumi[NT];
        for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            for (int t = 0; t < NT; ++t) {
                const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs + 32 * ib));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(b.mag[ib], _mm256_sign_epi8(q8, b.sgn[ib])), b.sc[ib]));
            }
        }
        for (int t = 0; t < NT; ++t)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * y[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
    template <int NT>
    static void finish(const __m256 acc[4], float* out) {
        for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]) * F::unit;
    }
};

// The same for MXFP4 (two accumulators per token, block i into i % 2, as the dot kernel).
struct mxfp4_avx2_gemm {
    using block = block_mxfp4;
    using act_block = block_q8_0;
    static constexpr int block_elems = QK_MXFP4, group = 4, rows = 4, chunk = 64;
    struct dec {
        __m256i aw, wv;  // |w| and w
        float d;
    };
    struct acc_t {
        __m256 v[2];
    };
    static acc_t zero() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
    static void decode(const block* x, int64_t i, dec& b) { mxfp4_avx2_decode(x[i], b.aw, b.wv, b.d); }
    template <int NT>
    static void apply(const dec& b, const block_q8_0* const* y, int64_t i, acc_t acc[4]) {
        if (i & 1) {
            for (int t = 0; t < NT; ++t) acc[t].v[1] = mxfp4_avx2_step(b.aw, b.wv, b.d, y[t][i], acc[t].v[1]);
        } else {
            for (int t = 0; t < NT; ++t) acc[t].v[0] = mxfp4_avx2_step(b.aw, b.wv, b.d, y[t][i], acc[t].v[0]);
        }
    }
    template <int NT>
    static void finish(const acc_t acc[4], float* out) {
        for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc[t].v[0], acc[t].v[1]));
    }
};

}  // namespace

void dot_iq2_xxs_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq2_xxs_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_xxs_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq2_xxs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq2_xs_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq2_xs_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_xs_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq2_xs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq2_s_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq2_s_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq2_s_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq2_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq3_xxs_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq3_xxs_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq3_xxs_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq3_xxs_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq3_s_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq3_s_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq3_s_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq3_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq1_s_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq1_s_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq1_s_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq1_s_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_iq1_m_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<iq_avx2<iq1_m_dec>::kernel>(n, w, a, n_tok, out);
}
void gemm_rows_iq1_m_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<iq_avx2_gemm<iq1_m_dec>>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}
void dot_mxfp4_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<mxfp4_avx2>(n, w, a, n_tok, out);
}
void gemm_rows_mxfp4_avx2(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm_rows<mxfp4_avx2_gemm>(n, w, row_stride, n_rows, a, n_tok, y, y_stride);
}

}  // namespace strata::kernels::cpu::detail
