// Gated DeltaNet: argument checks, the chunk loop and the position rule of delta_rule_run, the conv
// and the row L2 norm (small per-token work, plain C++ on every ISA).
#include "cpu/delta_net.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/delta_net/layout.hpp"
#include "cpu/detail/kernel_table.hpp"

namespace strata::kernels::cpu {
namespace {

void check_dims(int d_k, int d_v, int n_tok) {
    if (d_k < 1 || d_k > delta_rule_max_dim || d_v < 1 || d_v > delta_rule_max_dim || n_tok < 0)
        throw std::invalid_argument("delta rule: d_k " + std::to_string(d_k) + ", d_v " + std::to_string(d_v) +
                                    " must be in 1.." + std::to_string(delta_rule_max_dim) + " and n_tok " +
                                    std::to_string(n_tok) + " >= 0.");
}

void check_chunk(int chunk) {
    if (chunk < 1 || chunk > delta_rule_max_chunk)
        throw std::invalid_argument("delta rule: chunk " + std::to_string(chunk) + " must be in 1.." +
                                    std::to_string(delta_rule_max_chunk) + ".");
}

void chunked(const detail::isa_table& t, float* S, const detail::delta_io& io, int n_tok, int chunk, float* scratch) {
    for (int t0 = 0; t0 < n_tok; t0 += chunk) t.delta_chunk(S, io.from(t0), std::min(chunk, n_tok - t0), chunk, scratch);
}

}  // namespace

void delta_rule_sequential(float* S, int d_k, int d_v, int n_tok, const float* q, ptrdiff_t q_stride, const float* k,
                           ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, const float* g, ptrdiff_t g_stride,
                           const float* beta, ptrdiff_t beta_stride, float* o, ptrdiff_t o_stride) {
    check_dims(d_k, d_v, n_tok);
    const detail::delta_io io{d_k, d_v, q, q_stride, k, k_stride, v, v_stride, g, g_stride, beta, beta_stride, o, o_stride};
    detail::active_table().delta_seq(S, io, n_tok);
}

size_t delta_rule_chunked_scratch(int d_k, int d_v, int chunk) {
    check_dims(d_k, d_v, 0);
    check_chunk(chunk);
    return detail::delta_chunk_layout(d_k, d_v, chunk).total;
}

void delta_rule_chunked(float* S, int d_k, int d_v, int n_tok, const float* q, ptrdiff_t q_stride, const float* k,
                        ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, const float* g, ptrdiff_t g_stride,
                        const float* beta, ptrdiff_t beta_stride, float* o, ptrdiff_t o_stride, int chunk,
                        float* scratch) {
    check_dims(d_k, d_v, n_tok);
    check_chunk(chunk);
    const detail::delta_io io{d_k, d_v, q, q_stride, k, k_stride, v, v_stride, g, g_stride, beta, beta_stride, o, o_stride};
    chunked(detail::active_table(), S, io, n_tok, chunk, scratch);
}

void delta_rule_run(float* S, int64_t pos0, int d_k, int d_v, int n_tok, const float* q, ptrdiff_t q_stride,
                    const float* k, ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, const float* g,
                    ptrdiff_t g_stride, const float* beta, ptrdiff_t beta_stride, float* o, ptrdiff_t o_stride,
                    int chunk, float* scratch) {
    check_dims(d_k, d_v, n_tok);
    if (chunk != 0) check_chunk(chunk);
    if (pos0 < 0) throw std::invalid_argument("delta rule: negative position " + std::to_string(pos0) + ".");
    const detail::delta_io io{d_k, d_v, q, q_stride, k, k_stride, v, v_stride, g, g_stride, beta, beta_stride, o, o_stride};
    const auto& t = detail::active_table();
    if (chunk == 0) {
        t.delta_seq(S, io, n_tok);
        return;
    }
    // [0, head): up to the first chunk boundary; [head, tail): whole aligned chunks; [tail, n_tok): the rest.
    const int64_t first_boundary = (pos0 + chunk - 1) / chunk * chunk;
    const int head = static_cast<int>(std::min<int64_t>(n_tok, first_boundary - pos0));
    const int tail = head + (n_tok - head) / chunk * chunk;
    if (head > 0) t.delta_seq(S, io, head);
    if (tail > head) chunked(t, S, io.from(head), tail - head, chunk, scratch);
    if (n_tok > tail) t.delta_seq(S, io.from(tail), n_tok - tail);
}

void causal_conv1d_silu(float* conv_state, const float* x, ptrdiff_t x_stride, const float* w, int n_tok, int channels,
                        int kernel, float* y, ptrdiff_t y_stride, ptrdiff_t state_stride) {
    if (kernel < 1 || kernel > 16 || channels < 1 || n_tok < 0)
        throw std::invalid_argument("causal conv: kernel " + std::to_string(kernel) + " must be in 1..16, channels " +
                                    std::to_string(channels) + " >= 1 and n_tok " + std::to_string(n_tok) + " >= 0.");
    const int hist = kernel - 1;
    const ptrdiff_t ss = state_stride > 0 ? state_stride : channels;
    // Input row r of the window (r < hist: the state's rows, then the tokens).
    auto row = [&](int r) { return r < hist ? conv_state + r * ss : x + (r - hist) * x_stride; };
    // Channels in blocks whose weights are first transposed to [kernel][block], so the inner loops run
    // over consecutive channels; each channel sums its taps in order j = 0..kernel-1.
    constexpr int block = 256;
    float wt[16 * block];
    for (int c0 = 0; c0 < channels; c0 += block) {
        const int nc = std::min(block, channels - c0);
        for (int c = 0; c < nc; ++c)
            for (int j = 0; j < kernel; ++j) wt[j * block + c] = w[static_cast<ptrdiff_t>(c0 + c) * kernel + j];
        for (int t = 0; t < n_tok; ++t) {
            float* out = y + t * y_stride + c0;
            std::memset(out, 0, sizeof(float) * static_cast<size_t>(nc));
            for (int j = 0; j < kernel; ++j) {
                const float* in = row(t + j) + c0;
                const float* wj = wt + j * block;
                for (int c = 0; c < nc; ++c) out[c] += in[c] * wj[c];
            }
            for (int c = 0; c < nc; ++c) out[c] = out[c] / (1.0f + std::exp(-out[c]));
        }
    }
    // The last hist inputs become the state (rows still from the old state move up first).
    for (int r = 0; r < hist; ++r) {
        const int src = n_tok + r;  // window row of new state row r
        float* dst = conv_state + r * ss;
        if (src < hist)
            std::memmove(dst, conv_state + src * ss, sizeof(float) * static_cast<size_t>(channels));
        else
            std::memcpy(dst, x + (src - hist) * x_stride, sizeof(float) * static_cast<size_t>(channels));
    }
}

void l2_normalize_rows(float* x, int n_rows, int dim, ptrdiff_t stride, float eps, float scale) {
    for (int r = 0; r < n_rows; ++r) {
        float* row = x + r * stride;
        double ss = 0;  // in double, as ggml_l2_norm sums
        for (int i = 0; i < dim; ++i) ss += double{row[i] * row[i]};
        const float f = scale / std::max(std::sqrt(static_cast<float>(ss)), eps);
        for (int i = 0; i < dim; ++i) row[i] *= f;
    }
}

}  // namespace strata::kernels::cpu
