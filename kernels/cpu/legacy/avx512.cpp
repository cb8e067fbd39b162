// The 32-element formats besides Q8_0, AVX-512 VNNI (on 256-bit vectors, one block per vector, up to 8
// tokens per call): Q4_0, Q5_0, IQ4_NL against Q8_0 (signed codes: vpdpbusd on |w| and a with w's sign)
// and Q4_1, Q5_1 against Q8_1 (unsigned codes straight into vpdpbusd, plus m_w * s_a per block). The
// fifth bits of Q5_0 / Q5_1 come in as a 32-bit byte mask instead of a widened bit pattern.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {
namespace {

using namespace formats;

static inline __mmask32 fifth_bits(const uint8_t* qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, sizeof(bits));
    return static_cast<__mmask32>(bits);
}

// Signed codes of one block of each _0 / NL format as 32 bytes in element order.
struct codes_q4_0 {
    using block = block_q4_0;
    static __m256i load(const block& b) { return _mm256_sub_epi8(unpack_nibbles_32(b.qs), _mm256_set1_epi8(8)); }
};
struct codes_q5_0 {
    using block = block_q5_0;
    static __m256i load(const block& b) {  // q - 16 where the fifth bit is clear
        const __m256i q = unpack_nibbles_32(b.qs);
        return _mm256_mask_sub_epi8(q, static_cast<__mmask32>(~fifth_bits(b.qh)), q, _mm256_set1_epi8(16));
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
        const __m256i q = unpack_nibbles_32(b.qs);
        return _mm256_mask_add_epi8(q, fifth_bits(b.qh), q, _mm256_set1_epi8(16));
    }
};

template <typename Codes>
struct signed_x_q8_0 {
    template <int NT>
    struct kernel {
        // One block into acc: (d_w * d_a) * (w . a).
        static inline void block(const typename Codes::block& xb, const block_q8_0* const* y, int64_t i, __m256* acc) {
            const float d = half_to_float(xb.d);
            const __m256i qx = Codes::load(xb);
            const __m256i ax = _mm256_sign_epi8(qx, qx);
            for (int t = 0; t < NT; ++t) {
                const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs));
                const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, _mm256_sign_epi8(qy, qx));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y[t][i].d)), _mm256_cvtepi32_ps(dot), acc[t]);
            }
        }

        static void run(int64_t n, const void* w, const void* const* a, float* out) {
            const auto* x = static_cast<const typename Codes::block*>(w);
            const block_q8_0* y[NT];
            for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_0*>(a[t]);
            __m256 even[NT], odd[NT];  // blocks 2i and 2i + 1: two dependency chains
            for (int t = 0; t < NT; ++t) even[t] = odd[t] = _mm256_setzero_ps();
            const int64_t nb = n / 32;
            int64_t i = 0;
            for (; i + 2 <= nb; i += 2) {
                prefetch_weights<2 * sizeof(typename Codes::block)>(x + i);
                block(x[i], y, i, even);
                block(x[i + 1], y, i + 1, odd);
            }
            if (i < nb) block(x[i], y, i, even);
            for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(even[t], odd[t]));
        }
    };
};

template <typename Codes>
struct unsigned_x_q8_1 {
    template <int NT>
    struct kernel {
        static inline void block(const typename Codes::block& xb, const block_q8_1* const* y, int64_t i, __m256* acc,
                                 float* mins) {
            const float d = half_to_float(xb.d), m = half_to_float(xb.m);
            const __m256i qx = Codes::load(xb);
            for (int t = 0; t < NT; ++t) {
                const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].qs));
                const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, qy);
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * half_to_float(y[t][i].d)), _mm256_cvtepi32_ps(dot), acc[t]);
                mins[t] += m * half_to_float(y[t][i].s);
            }
        }

        static void run(int64_t n, const void* w, const void* const* a, float* out) {
            const auto* x = static_cast<const typename Codes::block*>(w);
            const block_q8_1* y[NT];
            for (int t = 0; t < NT; ++t) y[t] = static_cast<const block_q8_1*>(a[t]);
            __m256 even[NT], odd[NT];
            float mins[NT] = {};  // sum of m_w * s_a
            for (int t = 0; t < NT; ++t) even[t] = odd[t] = _mm256_setzero_ps();
            const int64_t nb = n / 32;
            int64_t i = 0;
            for (; i + 2 <= nb; i += 2) {
                prefetch_weights<2 * sizeof(typename Codes::block)>(x + i);
                block(x[i], y, i, even, mins);
                block(x[i + 1], y, i + 1, odd, mins);
            }
            if (i < nb) block(x[i], y, i, even, mins);
            for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(even[t], odd[t])) + mins[t];
        }
    };
};

}  // namespace

void dot_q4_0_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<signed_x_q8_0<codes_q4_0>::kernel, 8>(n, w, a, n_tok, out);
}
void dot_q5_0_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<signed_x_q8_0<codes_q5_0>::kernel, 8>(n, w, a, n_tok, out);
}
void dot_iq4_nl_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<signed_x_q8_0<codes_iq4_nl>::kernel, 8>(n, w, a, n_tok, out);
}
void dot_q4_1_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<unsigned_x_q8_1<codes_q4_1>::kernel, 8>(n, w, a, n_tok, out);
}
void dot_q5_1_avx512(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<unsigned_x_q8_1<codes_q5_1>::kernel, 8>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
