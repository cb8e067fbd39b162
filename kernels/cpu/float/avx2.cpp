// F32 / F16 / BF16 weights x f32 activation, AVX2 + F16C.
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"
#include "cpu/float/dot_float.hpp"

namespace strata::kernels::cpu::detail {
namespace {

struct v256 {
    using reg = __m256;
    static constexpr int width = 8;
    static reg zero() { return _mm256_setzero_ps(); }
    static reg load(const float* p) { return _mm256_loadu_ps(p); }
    static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
    static float hsum(reg v) { return detail::hsum(v); }
};

static inline float bf16_bits_to_float(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

struct load_f32 {
    static __m256 load(const void* w, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(w) + i); }
    static float scalar(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
    static void prefetch(const void* w, int64_t i) { prefetch_weights<2 * 8 * 4>(static_cast<const float*>(w) + i); }
};
struct load_f16 {
    static __m256 load(const void* w, int64_t i) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
    }
    static float scalar(const void* w, int64_t i) { return half_to_float(static_cast<const uint16_t*>(w)[i]); }
    static void prefetch(const void* w, int64_t i) { prefetch_weights<2 * 8 * 2>(static_cast<const uint16_t*>(w) + i); }
};
struct load_bf16 {
    static __m256 load(const void* w, int64_t i) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static float scalar(const void* w, int64_t i) { return bf16_bits_to_float(static_cast<const uint16_t*>(w)[i]); }
    static void prefetch(const void* w, int64_t i) { prefetch_weights<2 * 8 * 2>(static_cast<const uint16_t*>(w) + i); }
};

template <int NT> using f32_kernel = float_dot<v256, load_f32, NT>;
template <int NT> using f16_kernel = float_dot<v256, load_f16, NT>;
template <int NT> using bf16_kernel = float_dot<v256, load_bf16, NT>;

}  // namespace

void dot_f32_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<f32_kernel>(n, w, a, n_tok, out);
}
void dot_f16_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<f16_kernel>(n, w, a, n_tok, out);
}
void dot_bf16_avx2(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    call_with_tokens<bf16_kernel>(n, w, a, n_tok, out);
}

}  // namespace strata::kernels::cpu::detail
