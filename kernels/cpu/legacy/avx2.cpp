// The 32-element formats besides Q8_0, AVX2: Q4_0, Q5_0, IQ4_NL against Q8_0 (signed codes, maddubs
// with w's sign moved onto a) and Q4_1, Q5_1 against Q8_1 (unsigned codes, plus m_w * s_a per block).
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

// Signed codes of one block of each _0 / NL format as 32 bytes in element order.
struct codes_q4_0 {
    using block = block_q4_0;
    static __m256i load(const block& b) { return _mm256_sub_epi8(unpack_nibbles_32(b.qs), _mm256_set1_epi8(8)); }
};
struct codes_q5_0 {
    using block = block_q5_0;
    static __m256i load(const block& b) {
        // (q | bit4 << 4) - 16: set the bits 4..7 where the fifth bit is clear (two's complement q - 16).
        const __m256i high = _mm256_andnot_si256(expand_bits_32(b.qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
        return _mm256_or_si256(unpack_nibbles_32(b.qs), high);
    }
};
struct codes_iq4_nl {
    using block = block_iq4_nl;
    static __m256i load(const block& b) {
        const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
        return _mm256_shuffle_epi8(values, unpack_nibbles_32(b.qs));
    }
};
// Unsigned codes of the _1 formats.
struct codes_q4_1 {
    using block = block_q4_1;
    static __m256i load(const block& b) { return unpack_nibbles_32(b.qs); }
};
struct codes_q5_1 {
    using block = block_q5_1;
    static __m256i load(const block& b) {
        return _mm256_or_si256(unpack_nibbles_32(b.qs), _mm256_and_si256(expand_bits_32(b.qh), _mm256_set1_epi8(0x10)));
    }
};

template <typename Codes>
struct signed_x_q8_0 {
    template <int NT>
    struct kernel {
        static void run(int64_t n, const void* w, const void* const* a, float* out) {
            const auto* x = static_cast<const typename Codes::block*>(w);
            const block_q8_0* y[NT];
            for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_0*>(a[t]);
            __m256 acc[NT];
            for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n / 32; ++i) {
                prefetch_weights<sizeof(typename Codes::block)>(x + i);
                const float d = half_to_float(x[i].d);
                const __m256i qx = Codes::load(x[i]);
                const __m256i ax = _mm256_sign_epi8(qx, qx);
                for (int t = 0; t < NT; ++t) {
                    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs));
                    const __m256 q = sum_pairs_i16_f32(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy, qx)));
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y[t][i].d)), q, acc[t]);
                }
            }
            for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
        }
    };
};

template <typename Codes>
struct unsigned_x_q8_1 {
    template <int NT>
    struct kernel {
        static void run(int64_t n, const void* w, const void* const* a, float* out) {
            const auto* x = static_cast<const typename Codes::block*>(w);
            const block_q8_1* y[NT];
            for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_1*>(a[t]);
            __m256 acc[NT];
            float mins[NT] = {};  // sum of m_w * s_a
            for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
            for (int64_t i = 0; i < n / 32; ++i) {
                prefetch_weights<sizeof(typename Codes::block)>(x + i);
                const float d = half_to_float(x[i].d), m = half_to_float(x[i].m);
                const __m256i qx = Codes::load(x[i]);
                for (int t = 0; t < NT; ++t) {
                    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs));
                    const __m256 q = sum_pairs_i16_f32(_mm256_maddubs_epi16(qx, qy));
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y[t][i].d)), q, acc[t]);
                    mins[t] += m * half_to_float(y[t][i].s);
                }
            }
            for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]) + mins[t];
        }
    };
};

}  // namespace

void dot_q4_0_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<signed_x_q8_0<codes_q4_0>::kernel>(n, w, a, n_tok, out);
}
void dot_q5_0_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<signed_x_q8_0<codes_q5_0>::kernel>(n, w, a, n_tok, out);
}
void dot_iq4_nl_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<signed_x_q8_0<codes_iq4_nl>::kernel>(n, w, a, n_tok, out);
}
void dot_q4_1_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<unsigned_x_q8_1<codes_q4_1>::kernel>(n, w, a, n_tok, out);
}
void dot_q5_1_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<unsigned_x_q8_1<codes_q5_1>::kernel>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
