// The 32-element nibble formats (and MXFP4) on the rows16 layout, AVX2 (and AVX-VNNI): 8 rows (one half of a group) x NT tokens
// per pass. Each 32-byte half of a 64-byte qs line holds 4 columns of 8 rows in both nibble halves;
// vpmaddubsw multiplies the unsigned codes (the fifth bit added from the 64-bit masks) by the token's
// 4 activation bytes broadcast to every row, and a block's pair sums add up in int16 before vpmaddwd
// widens them (codes up to 15: 8 * 2 * 15 * 128 = 30720; up to 31: two halves of 4). IQ4_NL's signed
// values go in as |v| against the activation carrying v's sign; MXFP4's (|v| <= 12) are looked up as
// v + 12, unsigned, and taken back out as Q4_0's offset is. The integer sums and the float steps are
// the AVX-512 kernel's (offset * sum(a) out of the codes' sum, then d_w * d_a, the _1 formats' m_w * s_a),
// so both give the same bits. With AVX-VNNI (Vnni), vpdpbusd takes the same operands and adds the products
// of each dword straight into int32: the same sums, so the same bits again.
// Included by one source file per ISA (avx2_gemm.cpp, avxvnni_gemm.cpp): everything here is internal to it.
#pragma once

#include <memory>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

static inline __m256i broadcast_dword(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi32(v);
}

struct fmt_q4_0 {
    using packed = block_q4_0x16;
    using act = block_q8_0;
    static constexpr int offset = 8;
    static constexpr bool has_m = false, has_qh = false, lookup = false;
};
struct fmt_iq4_nl {
    using packed = block_q4_0x16;
    using act = block_q8_0;
    static constexpr int offset = 0;  // signed values, no offset to take out
    static constexpr bool has_m = false, has_qh = false, lookup = true;
    static constexpr const int8_t* values = kvalues_iq4nl;
};
// kvalues_mxfp4 + 12: unsigned bytes for vpmaddubsw.
constexpr int8_t mxfp4_plus12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
struct fmt_mxfp4 {
    using packed = block_mxfp4x16;
    using act = block_q8_0;
    static constexpr int offset = 12;
    static constexpr bool has_m = false, has_qh = false, lookup = true;
    static constexpr const int8_t* values = mxfp4_plus12;
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
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t offset = 0;
        if constexpr (F::offset != 0) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);  // 8 partial sums
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

// Rows 8h..8h+7's weight scales: the f16 d, or MXFP4's 2^(e - 128) (e < 2: a subnormal) from the exponent byte.
template <class P>
static inline __m256 row_scales(const P& x, int h) {
    if constexpr (requires { x.e; }) {
        const __m256i one = _mm256_set1_epi32(1);
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.e + 8 * h)));
        const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
        const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        return _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(e, one)));
    } else {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.d + 8 * h)));
    }
}

template <class F, int NT, bool Vnni>
struct legacy_gemm16 {
    // IQ4_NL: signed values (|v| against the activation with v's sign); MXFP4 looks up unsigned v + offset.
    static constexpr bool signed_lookup = F::lookup && F::offset == 0;
    // Column sets summed in int16 before widening (see the file comment); IQ4_NL's |v| <= 127 widens each.
    static constexpr int int16_sets = signed_lookup ? 1 : F::has_qh || F::lookup ? 4 : 8;

    // The 8 sets of 4 columns of rows 8h..8h+7: sets 0..3 the low nibbles (elements 4v + i), 4..7 the high.
    static inline void codes(const typename F::packed& x, int h, __m256i w[8]) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        for (int v = 0; v < 4; ++v) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs[v][8 * h]));
            w[v] = _mm256_and_si256(q, low4);
            w[4 + v] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if constexpr (F::has_qh) {
                const __m256i fifth = _mm256_set1_epi8(0x10);
                w[v] = _mm256_or_si256(w[v], _mm256_and_si256(expand_bits_32(x.qh[2 * v] + 4 * h), fifth));
                w[4 + v] = _mm256_or_si256(w[4 + v], _mm256_and_si256(expand_bits_32(x.qh[2 * v + 1] + 4 * h), fifth));
            }
        }
    }

    // Column sets 4 part .. 4 part + 3 (part 0: the low nibbles, 1: the high ones).
    static inline void codes_part(const typename F::packed& x, int h, int part, __m256i w[4]) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        for (int v = 0; v < 4; ++v) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs[v][8 * h]));
            w[v] = _mm256_and_si256(part == 0 ? q : _mm256_srli_epi16(q, 4), low4);
            if constexpr (F::has_qh)
                w[v] = _mm256_or_si256(w[v], _mm256_and_si256(expand_bits_32(x.qh[2 * v + part] + 4 * h), _mm256_set1_epi8(0x10)));
        }
    }

    // Token t's int sum (before the offset) over Sets column sets: a block's 8 (qs: its 32 activation
    // bytes; sets 0..3 hold elements 4v + i, 4..7 elements 16 + 4 (v - 4) + i) or half a block's 4 (qs:
    // the part's 16 bytes; the two parts' sums add up to the block's, exact integers).
    template <int Sets>
    static inline __m256i sets_sum(const __m256i w[Sets], const __m256i mag[Sets], const uint8_t* qs) {
        __m256i sum = _mm256_setzero_si256();
        if constexpr (Vnni) {
            for (int v = 0; v < Sets; ++v) {
                const __m256i a = broadcast_dword(qs + 4 * v);
                if constexpr (signed_lookup)
                    sum = _mm256_dpbusd_avx_epi32(sum, mag[v], _mm256_sign_epi8(a, w[v]));
                else
                    sum = _mm256_dpbusd_avx_epi32(sum, w[v], a);
            }
            return sum;
        }
        const __m256i ones = _mm256_set1_epi16(1);
        constexpr int in_int16 = int16_sets < Sets ? int16_sets : Sets;
        for (int v0 = 0; v0 < Sets; v0 += in_int16) {
            __m256i s16 = _mm256_setzero_si256();
            for (int v = v0; v < v0 + in_int16; ++v) {
                const __m256i a = broadcast_dword(qs + 4 * v);
                if constexpr (signed_lookup)
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(mag[v], _mm256_sign_epi8(a, w[v])));
                else
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[v], a));
            }
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s16, ones));
        }
        return sum;
    }

    static void run(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, float* y,
                    int64_t y_stride) {
        const int64_t nb = n / 32;
        const typename F::act* act[NT];
        for (int t = 0; t < NT; ++t) act[t] = static_cast<const typename F::act*>(a[t]);
        constexpr int64_t stack_blocks = 8 * 256;  // terms[t * nb + b]: token t's block b
        block_terms stack_terms[stack_blocks];
        std::unique_ptr<block_terms[]> heap_terms;
        block_terms* terms = stack_terms;
        if (NT * nb > stack_blocks) terms = (heap_terms = std::make_unique<block_terms[]>(static_cast<size_t>(NT * nb))).get();
        for (int t = 0; t < NT; ++t) fill_terms<F>(act[t], nb, terms + t * nb);
        // the code book as bytes, in each 128-bit lane
        __m256i values = _mm256_setzero_si256();
        if constexpr (F::lookup)
            values = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(F::values)));
        for (int64_t g = 0; g < n_groups; ++g) {
            const auto* x = reinterpret_cast<const typename F::packed*>(static_cast<const uint8_t*>(w) + g * group_bytes);
            for (int h = 0; h < 2; ++h) {
                __m256 acc[NT];
                for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
                for (int64_t b = 0; b < nb; ++b) {
                    if (h == 0) prefetch_weights<sizeof(typename F::packed)>(x + b);
                    if constexpr (NT > 4 && signed_lookup) {
                        // IQ4_NL (codes and their magnitudes: 16 registers for a whole block): half a block's
                        // column sets decoded at a time and held while every token passes over them.
                        const __m256 dw = row_scales(x[b], h);
                        __m256i isum[NT];
                        for (int part = 0; part < 2; ++part) {
                            __m256i wv[4], mag[4] = {};
                            codes_part(x[b], h, part, wv);
                            if constexpr (F::lookup)
                                for (int v = 0; v < 4; ++v) {
                                    wv[v] = _mm256_shuffle_epi8(values, wv[v]);
                                    if constexpr (signed_lookup) mag[v] = _mm256_sign_epi8(wv[v], wv[v]);
                                }
                            for (int t = 0; t < NT; ++t) {
                                const __m256i s = sets_sum<4>(wv, mag, reinterpret_cast<const uint8_t*>(act[t][b].qs) + 16 * part);
                                isum[t] = part == 0 ? s : _mm256_add_epi32(isum[t], s);
                            }
                        }
                        for (int t = 0; t < NT; ++t) {
                            const block_terms& tb = terms[t * nb + b];
                            __m256i sumi = isum[t];
                            if constexpr (F::offset != 0) sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(tb.offset));
                            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(tb.d)), _mm256_cvtepi32_ps(sumi), acc[t]);
                            if constexpr (F::has_m) {
                                const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].m + 8 * h)));
                                acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(tb.s), acc[t]);
                            }
                        }
                        continue;
                    }
                    __m256i wv[8], mag[8] = {};
                    codes(x[b], h, wv);
                    if constexpr (F::lookup)
                        for (int v = 0; v < 8; ++v) {
                            wv[v] = _mm256_shuffle_epi8(values, wv[v]);
                            if constexpr (signed_lookup) mag[v] = _mm256_sign_epi8(wv[v], wv[v]);
                        }
                    const __m256 dw = row_scales(x[b], h);
                    for (int t = 0; t < NT; ++t) {
                        const block_terms& tb = terms[t * nb + b];
                        __m256i sumi = sets_sum<8>(wv, mag, reinterpret_cast<const uint8_t*>(act[t][b].qs));
                        if constexpr (F::offset != 0) sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(tb.offset));
                        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(tb.d)), _mm256_cvtepi32_ps(sumi), acc[t]);
                        if constexpr (F::has_m) {
                            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].m + 8 * h)));
                            acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(tb.s), acc[t]);
                        }
                    }
                }
                for (int t = 0; t < NT; ++t) _mm256_storeu_ps(y + t * y_stride + g * 16 + 8 * h, acc[t]);
            }
        }
    }
};

// The formats whose codes cost the most to decode (the fifth bit, the code book lookups) take 8 tokens;
// Q4_0's and Q4_1's (a mask and a shift) cost less than spilling 8 tokens' accumulators.
template <class F, bool Vnni>
static void gemm16(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                   float* y, int64_t y_stride) {
    constexpr bool many_tokens = F::has_qh || F::lookup;
    with_tokens<many_tokens ? 8 : 4>(n_tok, [&]<int NT>() {
        legacy_gemm16<F, NT, Vnni>::run(n, w, group_bytes, n_groups, a, y, y_stride);
    });
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
