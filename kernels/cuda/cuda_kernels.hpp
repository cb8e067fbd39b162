// CUDA kernels of the GPU forward pass, behind a plain C++ interface: no CUDA type appears here, so
// engine code compiled by the host compiler can call them. Every function enqueues work on `stream`
// (a cudaStream_t passed as void*; nullptr: the legacy default stream) and returns at once; pointers
// are device pointers unless the comment says otherwise. Launch errors throw std::runtime_error
// naming the kernel and CUDA's message.
//
// Shapes follow kernels/cpu/kernels.hpp: a weight matrix has n_rows rows of n_cols elements of one
// ggml type, row r at w + r * row_stride bytes (GGUF's block layouts, byte for byte); activations
// and outputs are f32 rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/types.hpp"
#include "rope_params.hpp"

namespace strata::kernels::cuda {

using formats::ggml_type;
using stream_t = void*;  // cudaStream_t

// Rows must be whole blocks (32 elements for F32/F16/BF16); the weight functions throw
// std::invalid_argument naming the function and the numbers otherwise, or naming the valid types.
// True where a dequantising matvec and a dequantise-to-f16 kernel exist for `type`:
// F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S, MXFP4.
bool has_matvec(ggml_type type);
// "F32, F16, ..." for error messages.
const char* matvec_types();

struct weight_view {
    ggml_type type;
    const void* data;    // [n_rows][row_stride] bytes
    int64_t n_rows;
    int64_t n_cols;
    size_t row_stride;
};

// y[t * y_stride + r] = W[r, :] . x[t * x_stride + :] for r < n_rows, t < n_tok (any n_tok; the
// weights are read once per 8 tokens). f32 accumulation of dequantised weights times f32 activations.
void matvec(const weight_view& w, const float* x, int64_t x_stride, int n_tok, float* y, int64_t y_stride,
            stream_t stream);

// Many matvecs of one shape and type in one launch: y_j = W_j . x_j for each job (a resident expert
// applied to one token). `jobs` is a device array of n_jobs entries.
struct matvec_job {
    const void* w;       // [n_rows][row_stride]
    const float* x;      // [n_cols]
    float* y;            // [n_rows]
};
void matvec_batched(ggml_type type, int64_t n_rows, int64_t n_cols, size_t row_stride, const matvec_job* jobs,
                    int n_jobs, stream_t stream);

// Many matvecs of one shape and type in one launch, each applying one matrix to up to 8 gathered rows
// of activations: y[y_row[t] * y_stride + r] = W . x[x_row[t] * x_stride + :] for t < n_tok. The
// resident experts of a batch: the tokens routed to one expert share a job, so its weights are read
// once per 8 tokens. Each token's sums are those matvec_batched computes for it, bit for bit.
constexpr int kGatherTokens = 8;
struct matvec_gather_job {
    const void* w;                    // [n_rows][row_stride]
    const float* x;                   // activation rows, x_stride floats apart
    float* y;                         // output rows, y_stride floats apart
    int32_t x_row[kGatherTokens];
    int32_t y_row[kGatherTokens];
    int32_t n_tok;                    // 1 .. kGatherTokens
};
void matvec_gathered(ggml_type type, int64_t n_rows, int64_t n_cols, size_t row_stride, int64_t x_stride,
                     int64_t y_stride, const matvec_gather_job* jobs, int n_jobs, stream_t stream);

// out: [n_rows][n_cols] f16 (IEEE half bits), row-major: the dequantised matrix, for cuBLAS.
void dequantize_f16(const weight_view& w, uint16_t* out, stream_t stream);
// out[i] = half(x[i]) for i < n.
void convert_f32_to_f16(const float* x, int64_t n, uint16_t* out, stream_t stream);

// Per row of n elements (n_rows contiguous rows): out = x / sqrt(mean(x^2) + eps) * weight
// (weight may be nullptr: no scale). out may be x.
void rms_norm(const float* x, const float* weight, float eps, int64_t n, int64_t n_rows, float* out, stream_t stream);

// Rotary embedding in place on x: [n_tok][n_head][head_dim], token t at position pos0 + t, with p's
// scaling, as kernels::cpu::rope (neox: pairs (i, i + n_rot/2); else (2i, 2i + 1)).
void rope(float* x, int n_tok, int n_head, int head_dim, int n_rot, int pos0, const rope_params& p, bool neox,
          stream_t stream);

// KV cache in VRAM, one layer: K and V both [n_ctx] rows of n_kv = n_head_kv * head_dim elements, as
// halves (f16) or as Q8_0 blocks (q8_0: the CPU's int8 cache, quantised the same way: d = max|x| / 127
// rounded to half, q = round(x / d)). Row r holds position r.
enum class kv_format { f16, q8_0 };
// Bytes per position row; throws std::invalid_argument when q8_0 rows are not whole 32-element blocks.
size_t kv_row_bytes(kv_format format, int n_kv);

// Writes tokens t < n_tok of k, v: [n_tok][n_kv] f32 at positions pos0 + t.
void kv_store(kv_format format, const float* k, const float* v, int n_tok, int n_kv, int pos0, void* k_cache,
              void* v_cache, stream_t stream);

// Causal grouped-query attention over the cache: token t (position pos0 + t) attends to positions
// [0, pos0 + t]. q, out: [n_tok][n_head][head_dim]; query head h reads kv head h / (n_head / n_head_kv).
// scratch: [n_tok][n_head][pos0 + n_tok] floats.
void attention(kv_format format, const float* q, const void* k_cache, const void* v_cache, int n_tok, int pos0,
               int n_head, int n_head_kv, int head_dim, float scale, float* scratch, float* out, stream_t stream);

// How the router turns logits into expert ids and weights (engine::routing_options and the layer's
// score-correction bias).
struct route_params {
    bool sigmoid = false;         // scores: sigmoid of each logit; false: softmax over the logits
    const float* bias = nullptr;  // [n_expert]: added to the scores for the selection only (nullptr: none)
    bool normalize = false;       // weights divided by their sum (at least 2^-14)
    float scale = 0.0f;           // weights multiplied by this unless 0 or 1
    int n_group = 0;              // group-limited selection over this many equal groups (0, 1: off)
    int n_group_used = 0;         // the groups kept: those whose two best selection scores sum highest
};
// Router: per token of logits [n_tok][n_expert], top-k by selection score (ties: the lower id; with
// groups, only inside the kept groups, ties: the lower group), weighted by the unbiased scores, then
// normalised and scaled as p says: ids, weights [n_tok][k], as engine::route_token. n_expert <= 1024,
// k <= 64; throws std::invalid_argument naming the numbers otherwise or for groups that do not divide
// n_expert.
void route_topk(const float* logits, int n_tok, int n_expert, int k, const route_params& p, int32_t* ids,
                float* weights, stream_t stream);
// Softmax scores, no bias, optionally renormalised.
void route_topk(const float* logits, int n_tok, int n_expert, int k, bool normalize, int32_t* ids, float* weights,
                stream_t stream);

// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out, stream_t stream);
// x[i] += y[i].
void add(float* x, const float* y, int64_t n, stream_t stream);
// x[t][i] += bias[i] for rows t < n_rows of n elements.
void add_bias(float* x, const float* bias, int64_t n, int64_t n_rows, stream_t stream);
// y[t][i] *= sigmoid(g[t]) for rows t < n_rows of n elements (the shared expert's gate).
void scale_by_sigmoid(float* y, const float* g, int64_t n, int64_t n_rows, stream_t stream);
// Routed experts' weighted sum: out[t][i] = sum over jobs j in [job_begin[t], job_begin[t + 1]) of
// weight[j] * y[j][i], in job order (deterministic). y: [n_jobs][n]; out: [n_tok][n].
void weighted_sum(const float* y, const float* weight, const int32_t* job_begin, int n_tok, int64_t n, float* out,
                  stream_t stream);

}  // namespace strata::kernels::cuda
