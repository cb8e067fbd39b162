// Rotary position embedding, normal (GPT-J pairs) and NeoX (split halves) layouts.
#include "common.cuh"
#include "cuda_kernels.hpp"

namespace strata::kernels::cuda {

namespace {

using namespace detail;

// One thread per (token, head, pair i < n_rot / 2); theta = pos * base^(-2i / n_rot) as the CPU.
__global__ void rope_kernel(float* x, int n_tok, int n_head, int head_dim, int n_rot, int pos0, float freq_base,
                            bool neox) {
    const int half = n_rot / 2;
    const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (idx >= int64_t{n_tok} * n_head * half) return;
    const int i = static_cast<int>(idx % half);
    const int64_t th = idx / half;  // token * n_head + head
    const int t = static_cast<int>(th / n_head);
    float* v = x + th * head_dim;
    const float theta = static_cast<float>(pos0 + t) * powf(freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(n_rot));
    float s, c;
    sincosf(theta, &s, &c);
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
    const float x0 = v[i0], x1 = v[i1];
    v[i0] = x0 * c - x1 * s;
    v[i1] = x0 * s + x1 * c;
}

}  // namespace

void rope(float* x, int n_tok, int n_head, int head_dim, int n_rot, int pos0, float freq_base, bool neox,
          stream_t stream) {
    const int64_t n = int64_t{n_tok} * n_head * (n_rot / 2);
    if (n <= 0) return;
    STRATA_LAUNCH(rope_kernel, grid_for(n, 256), 256, as_stream(stream))(
        x, n_tok, n_head, head_dim, n_rot, pos0, freq_base, neox);
    check_launch("rope");
}

}  // namespace strata::kernels::cuda
