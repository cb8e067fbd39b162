// The gated DeltaNet token mixer of the hybrid families (qwen35moe, qwen3next), from the layer's
// projections to the input of its output projection ssm_out:
//   q | k | v -> causal depthwise conv (its state: the last conv_kernel - 1 inputs) -> SiLU;
//   q, k L2-normalised per key head, q scaled by 1 / sqrt(d_state);
//   per value head h: beta = sigmoid(b_h), g = ssm_a_h * softplus(a_h + dt_bias_h), and the delta rule
//   on its state S_h (kernels/cpu/delta_net.hpp), reading key head h % n_k (qwen35moe's tiled heads)
//   or h / (n_v / n_k) (qwen3next's grouped heads);
//   out_h = RMSNorm(o_h) * ssm_norm * SiLU(z_h).
// Value heads run in parallel on the pool, each over the tokens in order: the same result for any
// batch split, pool mode or worker count.
#pragma once

#include <vector>

#include "aligned_vector.hpp"
#include "expert_pool.hpp"
#include "model/hparams.hpp"
#include "model/recurrent_state.hpp"
#include "model/weights.hpp"

namespace strata::engine {

class delta_net_mixer {
public:
    delta_net_mixer(arenas::expert_pool& pool, const hparams& hp);

    // Layer l, the r-th DeltaNet layer, over n_tok tokens continuing `state`. qkv: [n_tok][conv_dim]
    // (attn_qkv's output, overwritten), z: [n_tok][value_dim], b, a: [n_tok][n_v_head] (the beta and
    // alpha projections before their activations); out: [n_tok][value_dim].
    void run(const layer_weights& l, int r, recurrent_state& state, int n_tok, float* qkv, const float* z,
             const float* b, const float* a, float* out);

    // Splits qwen3next's fused projections into the layouts run() takes: ssm_in's rows per key head
    // [q | k | its value heads' v | their z] into qkv and z; ssm_ba's per key head [its value heads'
    // beta | their alpha] into b and a.
    static void split_ssm_in(const hparams& hp, const float* in, int n_tok, float* qkv, float* z);
    static void split_ba(const hparams& hp, const float* ba, int n_tok, float* b, float* a);

private:
    // Copies the conv state after each of the call's tokens into the state's trace (qkv: the inputs).
    void trace_conv(recurrent_state& state, int r, int n_tok, const float* qkv) const;

    arenas::expert_pool& pool_;
    const hparams& hp_;
    std::vector<float> conv_out_;  // [n_tok][conv_dim]
    std::vector<float> conv_prev_; // the conv state before a traced call (recurrent_state::start_trace)
    std::vector<float> g_, beta_;  // [n_tok][n_v_head]
    aligned_vector<float> scratch_;  // [n_v_head][the chunked kernel's scratch]
};

}  // namespace strata::engine
