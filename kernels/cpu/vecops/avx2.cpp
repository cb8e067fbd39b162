// RMSNorm, SiLU-mul, softmax, f32 -> f16 rows and the QSA block scores, AVX2 + FMA (+ F16C). exp is a Cephes-style polynomial (about 1 ulp over the
// clamped range [-87, 88]; below it returns exp(-87) ~ 1.6e-38 instead of a smaller number).
#include <algorithm>
#include <cmath>

#include "cpu/detail/exp_avx2.hpp"
#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"

namespace strata::kernels::cpu::detail {
namespace {

static inline float exp_scalar(float x) {
    alignas(32) float v[8] = {x};
    _mm256_store_ps(v, exp_avx2(_mm256_load_ps(v)));
    return v[0];
}

}  // namespace

void rms_norm_avx2(const float* x, const float* weight, float eps, int64_t n, float* out) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
        acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) sum += x[i] * x[i];
    const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
    const __m256 s = _mm256_set1_ps(scale);
    i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
        if (weight) v = _mm256_mul_ps(v, _mm256_loadu_ps(weight + i));
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; ++i) out[i] = x[i] * scale * (weight ? weight[i] : 1.0f);
}

void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; ++i) out[i] = gate[i] / (1.0f + exp_scalar(-gate[i])) * up[i];
}

void softmax_avx2(float* x, int64_t n) {
    float max = -INFINITY;
    int64_t i = 0;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    for (float v : lanes) max = std::max(max, v);
    for (; i < n; ++i) max = std::max(max, x[i]);

    const __m256 m = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum(vsum);
    for (; i < n; ++i) {
        x[i] = exp_scalar(x[i] - max);
        sum += x[i];
    }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; ++i) x[i] *= 1.0f / sum;
}

void from_fp16_avx2(const uint16_t* x, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
    for (; i < n; ++i) out[i] = _cvtsh_ss(x[i]);
}

namespace {

// NH heads' dots with one group of block keys (two 8-lane halves), each an FMA chain over the dims in
// order, relu'd and added to the totals in head order.
template <int NH>
void qsa_heads(const float* q, int dim, const float* k, __m256& tot0, __m256& tot1) {
    __m256 acc[NH][2];
    for (int h = 0; h < NH; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    for (int i = 0; i < dim; ++i) {
        const __m256 k0 = _mm256_loadu_ps(k + i * qsa_group), k1 = _mm256_loadu_ps(k + i * qsa_group + 8);
        for (int h = 0; h < NH; ++h) {
            const __m256 qv = _mm256_broadcast_ss(q + h * dim + i);
            acc[h][0] = _mm256_fmadd_ps(qv, k0, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(qv, k1, acc[h][1]);
        }
    }
    const __m256 zero = _mm256_setzero_ps();
    for (int h = 0; h < NH; ++h) {
        tot0 = _mm256_add_ps(tot0, _mm256_max_ps(acc[h][0], zero));
        tot1 = _mm256_add_ps(tot1, _mm256_max_ps(acc[h][1], zero));
    }
}

}  // namespace

void qsa_scores_avx2(const float* q, int n_head, int dim, const float* keys, int64_t n_groups, float scale,
                     float* scores) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t g = 0; g < n_groups; ++g) {
        const float* k = keys + static_cast<size_t>(g) * dim * qsa_group;
        __m256 tot0 = _mm256_setzero_ps(), tot1 = _mm256_setzero_ps();
        int h = 0;
        for (; h + 4 <= n_head; h += 4) qsa_heads<4>(q + h * dim, dim, k, tot0, tot1);
        switch (n_head - h) {
            case 3: qsa_heads<3>(q + h * dim, dim, k, tot0, tot1); break;
            case 2: qsa_heads<2>(q + h * dim, dim, k, tot0, tot1); break;
            case 1: qsa_heads<1>(q + h * dim, dim, k, tot0, tot1); break;
            default: break;
        }
        _mm256_storeu_ps(scores + g * qsa_group, _mm256_mul_ps(tot0, s));
        _mm256_storeu_ps(scores + g * qsa_group + 8, _mm256_mul_ps(tot1, s));
    }
}

void to_fp16_avx2(const float* x, uint16_t* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

}  // namespace strata::kernels::cpu::detail
