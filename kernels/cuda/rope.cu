// Rotary position embedding, normal (GPT-J pairs) and NeoX (split halves) layouts, with linear and
// YaRN scaling as kernels::cpu::rope.
#include "common.cuh"
#include "cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

// The per-call constants of rope_params, resolved on the host.
struct rope_consts {
    float freq_base, freq_scale, ext_factor, mscale, corr_low, corr_high;
};

// One thread per (token, head, pair i < n_rot / 2); theta = pos * base^(-2i / n_rot) as the CPU.
__global__ void rope_kernel(float* x, int n_tok, int n_head, int head_dim, int n_rot, int pos0, rope_consts k,
                            bool neox) {
    const int half = n_rot / 2;
    const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (idx >= int64_t{n_tok} * n_head * half) return;
    const int i = static_cast<int>(idx % half);
    const int64_t th = idx / half;  // token * n_head + head
    const int t = static_cast<int>(th / n_head);
    float* v = x + th * head_dim;
    const float theta_extrap =
        static_cast<float>(pos0 + t) * powf(k.freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(n_rot));
    float theta = k.freq_scale * theta_extrap;
    if (k.ext_factor != 0.0f) {
        // YaRN ramp: 1 below corr_low (extrapolate), 0 above corr_high (interpolate).
        const float y = (static_cast<float>(i) - k.corr_low) / fmaxf(0.001f, k.corr_high - k.corr_low);
        const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * k.ext_factor;
        theta = theta * (1.0f - mix) + theta_extrap * mix;
    }
    float s, c;
    sincosf(theta, &s, &c);
    c *= k.mscale;
    s *= k.mscale;
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    const float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * c - x1 * s;
    v[i1] = x0 * s + x1 * c;
}

}  // namespace

void rope(float* x, int n_tok, int n_head, int head_dim, int n_rot, int pos0, const rope_params& p, bool neox,
          stream_t stream) {
    const int64_t n = int64_t{n_tok} * n_head * (n_rot / 2);
    if (n <= 0) return;
    const rope_yarn_range corr = p.ext_factor != 0.0f ? rope_yarn_corr_dims(p, n_rot) : rope_yarn_range{};
    const rope_consts k{p.freq_base, p.freq_scale, p.ext_factor, rope_mscale(p), corr.low, corr.high};
    STRATA_LAUNCH(rope_kernel, grid_for(n, 256), 256, as_stream(stream))(x, n_tok, n_head, head_dim, n_rot, pos0, k,
                                                                         neox);
    check_launch("rope");
}

}  // namespace strata::kernels::cuda
