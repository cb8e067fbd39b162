// Gated DeltaNet (Qwen3.5-MoE / Qwen3-Next linear attention): the delta-rule recurrence of one V head,
// in a token-sequential form (decode) and a chunked WY / UT-transform form (prompts), plus the causal
// depthwise conv with SiLU and the row L2 norm that feed it.
//
// The recurrence, per token t, on one head's state S [d_k][d_v] (f32, row i = key dim i):
//   S <- exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S <- S + k_t delta^T;  o_t = S^T q_t.
// q_t and k_t are L2-normalised by the caller, q_t also scaled by 1/sqrt(d_k).
//
// Token buffers are rows with a stride in floats between consecutive tokens, so the caller can pass
// [n_tok][n_head][dim] buffers at a head's offset: q_t = q + t * q_stride ([d_k]), k_t ([d_k]),
// v_t ([d_v]), o_t ([d_v], written), g_t = g[t * g_stride], beta_t = beta[t * beta_stride] (scalars).
//
// Determinism. Both forms are deterministic functions of their inputs (one thread per head, fixed
// summation orders). The sequential form gives the same bits however the tokens are split between calls
// (n calls of one token == one call of n). The chunked form rounds differently (equal within f32
// rounding). delta_rule_run picks the form of each token from its absolute position alone: tokens of a
// chunk-aligned window [m * chunk, (m + 1) * chunk) that lies wholly inside the call take the chunked form,
// every other token the sequential one. Hence, for the same tokens from the same state:
//   - calls split at absolute positions that are multiples of `chunk` (any batch size that is a multiple
//     of it, from a chunk-aligned start) give the same bits as one call;
//   - one-token calls (decode) give the bits of the sequential form, within f32 rounding of a prompt that
//     held the same tokens; so do other splits.
// With chunk 0 every token takes the sequential form: the same bits for any split whatsoever.
// Different ISAs (STRATA_FORCE_ISA) round differently.
//
// Speed: the sequential form does 7 d_k d_v flops per token from L1 (a column block of S is copied to
// up to 64 KiB of stack; a one-token call updates S in place, reading it from memory once), the chunked one 6 d_k d_v + 2.5 chunk (d_k + d_v) as GEMM tiles; on the CPU the
// sequential form is the faster (strata-bench kernels, DeltaNet rows).
//
// Threading: single-threaded, reentrant; callers run heads in parallel on disjoint states.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::kernels::cpu {

// The chunk length of the prompt form, as llama.cpp and the reference implementations use it.
inline constexpr int delta_rule_default_chunk = 64;
// Largest d_k, d_v and chunk the kernels take (stack scratch of the sequential form).
inline constexpr int delta_rule_max_dim = 256;
inline constexpr int delta_rule_max_chunk = 128;

// The recurrence token by token over n_tok tokens (n_tok >= 0). S: [d_k][d_v], updated in place.
void delta_rule_sequential(float* S, int d_k, int d_v, int n_tok, const float* q, ptrdiff_t q_stride, const float* k,
                           ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, const float* g, ptrdiff_t g_stride,
                           const float* beta, ptrdiff_t beta_stride, float* o, ptrdiff_t o_stride);

// Floats of scratch delta_rule_chunked needs for these sizes.
size_t delta_rule_chunked_scratch(int d_k, int d_v, int chunk);

// The same recurrence over consecutive chunks of `chunk` tokens (the last one may be shorter), each chunk
// as matrix products: with G_t = sum_{s<=t} g_s inside the chunk, the UT transform
//   (I + A) U = diag(beta) V,  (I + A) W = diag(beta exp(G)) K,  A[t][s] = beta_t exp(G_t - G_s) k_t.k_s (s < t)
// gives the chunk's deltas D = U - W S0, its outputs O_t = exp(G_t) S0^T q_t + sum_{s<=t} exp(G_t - G_s)
// (q_t.k_s) D_s and the state S = exp(G_last) S0 + sum_s exp(G_last - G_s) k_s D_s^T.
// scratch: delta_rule_chunked_scratch(d_k, d_v, chunk) floats (any alignment; 64 bytes is best).
void delta_rule_chunked(float* S, int d_k, int d_v, int n_tok, const float* q, ptrdiff_t q_stride, const float* k,
                        ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, const float* g, ptrdiff_t g_stride,
                        const float* beta, ptrdiff_t beta_stride, float* o, ptrdiff_t o_stride, int chunk,
                        float* scratch);

// The engine's entry: tokens at absolute positions [pos0, pos0 + n_tok), whole chunk-aligned windows
// chunked, the rest sequential (the determinism rule above). scratch as for delta_rule_chunked.
// chunk 0: every token sequential (scratch unused, may be null): the same bits for any split into calls.
void delta_rule_run(float* S, int64_t pos0, int d_k, int d_v, int n_tok, const float* q, ptrdiff_t q_stride,
                    const float* k, ptrdiff_t k_stride, const float* v, ptrdiff_t v_stride, const float* g,
                    ptrdiff_t g_stride, const float* beta, ptrdiff_t beta_stride, float* o, ptrdiff_t o_stride,
                    int chunk, float* scratch);

// Depthwise causal conv over time with SiLU, as ggml_ssm_conv + ggml_silu compute it:
//   y_t[c] = silu(sum_{j<kernel} w[c][j] * x_{t - (kernel-1) + j}[c])  (the newest input meets w[c][kernel-1]),
// where inputs before the first token come from conv_state.
// conv_state: [kernel-1][channels], the previous kernel-1 inputs, oldest first; updated to the last
// kernel-1 inputs (the call's tokens and, when n_tok < kernel-1, older state rows).
// x: n_tok rows of [channels], x_stride floats apart; w: [channels][kernel] (GGUF ssm_conv1d, ne = {kernel,
// channels}); y: n_tok rows of [channels], y_stride apart. y may not overlap x. state_stride: floats between
// conv_state's rows (0: channels), so callers can split the channels of a wider state between threads.
void causal_conv1d_silu(float* conv_state, const float* x, ptrdiff_t x_stride, const float* w, int n_tok, int channels,
                        int kernel, float* y, ptrdiff_t y_stride, ptrdiff_t state_stride = 0);

// In place on n_rows rows of dim floats, stride apart: x <- x * scale / max(|x|_2, eps) (ggml_l2_norm, then a
// scale: 1 for k, 1/sqrt(d_k) for q).
void l2_normalize_rows(float* x, int n_rows, int dim, ptrdiff_t stride, float eps, float scale);

}  // namespace strata::kernels::cpu
