// The CPU forward pass: a batch of tokens at consecutive positions through every layer, writing their
// keys and values into the KV cache and producing logits. The layers are a list of kinds built at load
// (a token mixer and an FFN around a residual, model/mixer.hpp); eval_layers is the one loop over it.
#pragma once

#include <array>
#include <memory>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "aligned_vector.hpp"
#include "expert_pool.hpp"
#include "model/attention.hpp"
#include "model/delta_net.hpp"
#include "model/hparams.hpp"
#include "model/kv_cache.hpp"
#include "model/mixer.hpp"
#include "moe_phases.hpp"
#include "model/weights.hpp"

namespace strata::engine {

// Per-expert routing counts, accumulated over every token evaluated (for statistics and profiles).
struct routing_counts {
    std::vector<uint64_t> counts;  // [n_layer][n_expert]
};

// route_token's buffers: scores, biased scores, expert order [n_expert]; group scores [n_group].
struct routing_scratch {
    std::vector<float> p, sel;
    std::vector<int32_t> order;
    std::vector<std::pair<float, int>> groups;
};

// Wall seconds and bytes read per part of the forward pass, summed while attached to a forward_pass.
struct phase_clock {
    enum part : int {
        attn_proj,         // q, k, v and output projections
        attention,         // RoPE, KV store and attention over the cache
        router,            // router matmul and top-k
        experts_quantize,  // routed experts: activations quantized (x, then h)
        experts_gate_up,
        experts_down,      // down and the weighted sum
        shared_expert,
        dense_ffn,         // the FFN of leading dense layers
        head,              // output norm and matmul
        ple_gather,        // qwen4exp: PLE table rows gathered from the mapped file
        indexer,           // qwen4exp: the QSA indexer (its projections, block keys, block scores and choice)
        other,             // the rest of the pass: embedding, norms, residual adds
        n_parts
    };
    static const char* name(int p);

    std::array<double, n_parts> seconds{};
    std::array<uint64_t, n_parts> bytes{};
    int passes = 0;
};

// One sequence's rows in a step (forward_pass::eval_step): tokens at positions [pos0, pos0 + n_tok) of
// its own cache; logits as forward_pass::eval writes them (null: none).
struct step_segment {
    const int32_t* tokens = nullptr;
    int n_tok = 0;
    int pos0 = 0;
    kv_cache* kv = nullptr;
    float* logits = nullptr;
    bool all_logits = false;
    float* hidden = nullptr;  // [n_tok][hp.residual_width()] the last layer's residual (before the output norm), or null
};

class forward_pass {
public:
    // `rows` says where the pool's slices read expert rows (the mapped file, or placed copies);
    // moe_layers(w) describes the experts it reads.
    forward_pass(arenas::expert_pool& pool, const hparams& hp, const model_weights& w, const arenas::expert_rows& rows);

    // Runs tokens at positions [pos0, pos0 + n); every position below pos0 must already be in `kv`
    // (and kv.state_pos() be pos0 or -1). With a recurrent state, batches also end at multiples of the
    // checkpoint interval, where the state is checkpointed.
    // Throws kv_cache_full, before evaluating anything, when the positions do not fit the cache.
    // logits: [n_vocab] for the last token, or [n][n_vocab] when all_logits. Splits the tokens into
    // batches of at most n_batch.
    // hidden (unless null): [n][hp.residual_width()] every token's last residual (before the output norm).
    void eval(std::span<const int32_t> tokens, int pos0, kv_cache& kv, float* logits, bool all_logits = false,
              int n_batch = 512, float* hidden = nullptr);

    // Several sequences' rows in one pass: the dense matrices and experts are read once for all rows,
    // attention runs per segment over its own cache. Each segment's logits are bitwise those of eval()
    // on it alone. Models with latent attention or recurrent layers evaluate the segments in turn
    // (batches_sequences() is false). Throws kv_cache_full, before evaluating anything, when a segment's
    // positions do not fit its cache.
    void eval_step(std::span<const step_segment> segments, int n_batch = 512);
    bool batches_sequences() const { return batches_; }

    const routing_counts& routing() const { return routing_; }
    // Weight and KV bytes the passes so far read (dense matrices, the experts each MoE phase touched,
    // each row's KV cache), as the phase clock counts them.
    uint64_t bytes_read() const { return bytes_read_; }

    // Times every later pass into `clock` (nullptr: off, no clock reads).
    void set_clock(phase_clock* clock);

    // Recurrent state checkpoints every this many positions (0: none but those the caller takes).
    void set_checkpoint_interval(int n) { checkpoint_interval_ = n; }

    // The file's MTP block (blk.n_layer; mtp.cpp). Rows t at positions pos0 + t: input
    // eh_proj([enorm(embed(tokens[t])) | hnorm(h[t])]) (h null: zeros), then the block's attention (gated;
    // glm4moe plain; deepseek2 latent) over `kv` (one layer, its own cache: row t's key and value, or
    // latent, stored at pos0 + t) and its MoE with the shared expert. h[t] is normed before hnorm as
    // llama.cpp feeds it: with the output norm (h from the trunk), or with the head norm when `chained`
    // (h from an earlier mtp() call's h_out; qwen4exp: see mtp_qwen4). h_out (unless null): each row's output
    // residual, what chains the next draft;
    // logits (unless null): shared_head_norm (else the output norm) and the output head, of the last row
    // only, or of every row when all_logits. h and h_out are [n_tok][hp.residual_width()]: for qwen4exp
    // the hc streams, eh_proj applied to each, the block's mixers over them and its own output mixer
    // (nextn.hc_head_*) before the head (qwen4exp_forward.cpp).
    bool has_mtp() const { return mtp_moe_ != nullptr; }
    // Why the file's MTP block does not draft (when has_mtp() is false).
    std::string mtp_refusal() const;

    // Benchmarks: puts `kv` (at position 0) where evaluating `tokens` from position 0 would, without
    // computing them: every KV row, QSA indexer key and recurrent state value is pseudo-random (unit
    // scale; seeded, so the same every run), positions advance, and the PLE n-gram window holds the
    // tokens' last ids. The work of a later pass over it is the real one; its logits are not the model's.
    void fill_synthetic(std::span<const int32_t> tokens, kv_cache& kv, uint64_t seed);
    void mtp(const int32_t* tokens, const float* h, int n_tok, int pos0, kv_cache& kv, float* h_out, float* logits,
             bool all_logits = false, bool chained = false);

private:
    // The layer kinds (mixer.hpp) reach the pass's buffers and helpers.
    friend class attention_mixer;
    friend class sparse_attention_mixer;
    friend class latent_attention_mixer;
    friend class gated_delta_net;
    friend class dense_ffn;
    friend class moe_ffn;
    friend class plain_residual;
    friend class hc_residual;

    void eval_batch(const int32_t* tokens, int n_tok, int pos0, kv_cache& kv, float* logits, bool all_logits,
                    float* hidden);
    void timed_layers(std::span<const step_segment> segs);  // eval_layers, timed into clock_ when set
    // The rows of segs through the layer list: embeddings, each layer's mixer and FFN around the
    // residual, the output head.
    void eval_layers(std::span<const step_segment> segs);
    void output_head(std::span<const step_segment> segs);  // logits of the rows that want them
    // fn(row, k) for each row of the pass that wants logits, k = 0, 1, ... in row order; returns their count.
    template <class F>
    static int for_logit_rows(std::span<const step_segment> segs, F fn) {
        int k = 0;
        for (int row = 0; const step_segment& g : segs) {
            if (g.logits)
                for (int t = g.all_logits ? 0 : g.n_tok - 1; t < g.n_tok; ++t) fn(row + t, k++);
            row += g.n_tok;
        }
        return k;
    }
    // The head over the n_out rows at the front of xn_ (for_logit_rows' order), each segment's handed out.
    void head_logits(std::span<const step_segment> segs, int n_out);
    // The FFN parts the MTP block (mtp.cpp) runs on its own weights: moe_ffn's.
    // The MoE of weights l through `runner`'s pool layer, counting routes into counts (null: not counted).
    void moe(const layer_weights& l, arenas::moe_runner& runner, const std::vector<arenas::moe_layer>& layers,
             int pool_layer, uint64_t* counts, int n_tok);
    void shared_expert(const layer_weights& l, int n_tok);
    // y[t][r] = W[r, :] . in[t] for every row r: in: [n_tok][in_cols], y: [n_tok][n_rows].
    void matmul(const weight_matrix& w, int n_tok, const float* in, float* y);
    // matmul() of each w[i] into y[i], all on the same input, as one pool phase (one dispatch and one
    // join instead of one each) where they share an activation format and whole work items; else in turn.
    void matmul_same_input(std::span<const weight_matrix* const> w, int n_tok, const float* in, std::span<float* const> y);
    // fn(t0, t1) over the rows [0, n_tok) of per-row work (norms, RoPE, cache writes, quantization): on
    // the pool for a prompt's many rows, which the host alone would take while the workers wait; on the
    // host for a few (a pool phase costs more than it saves). Each row's result is the same either way.
    void each_row(int n_tok, arenas::function_ref<void(int64_t t0, int64_t t1)> fn);

    // qwen4exp (qwen4exp_forward.cpp): the MTP block over the hc residual streams.
    void mtp_qwen4(const int32_t* tokens, const float* h, int n_tok, int pos0, kv_cache& kv, float* h_out,
                   float* logits, bool all_logits);
    // xn_ [n_tok][n_embd] = mixer m over hc_x_; inj (unless null): [n_tok][hc] 2 sigmoid(inject xn / hc).
    // Its weights' bytes count in `part`.
    void hc_mix(const hc_mixer& m, int n_tok, float* inj, phase_clock::part part = phase_clock::other);
    // hc_x_[t][s] += inj[t][s] * y[t] for every stream s.
    void hc_add(int n_tok, const float* y, const float* inj);
    // The PLE block of layer l on hc_x_, each segment continuing its state's conv inputs and n-gram window
    // (a layer add-on).
    void ple_block(const layer_weights& l, std::span<const step_segment> segs, int n_tok);
    aligned_vector<float> hc_x_;      // [n_tok][hc][n_embd] the wide residual
    aligned_vector<float> hc_xn_;     // [n_tok][hc][n_embd] its grouped norm in a mixer
    std::vector<float> hc_lo_;     // [n_tok][hc_rank]
    std::vector<float> hc_gate_;   // [n_tok][hc][n_embd]
    std::vector<float> hc_inj_;    // [n_tok][hc]
    aligned_vector<float> blk_out_;   // [n_tok][n_embd] a block's output (MoE + shared expert)
    std::vector<float> ple_emb_;   // [n_tok][ple_dim] gathered rows
    std::vector<float> ple_k_;     // [n_tok][hc][n_embd]
    std::vector<float> ple_v_;     // [n_tok][n_embd]

    arenas::expert_pool& pool_;
    phase_clock* clock_ = nullptr;
    double* seconds(phase_clock::part p) { return clock_ ? &clock_->seconds[p] : nullptr; }
    void add_bytes(phase_clock::part p, uint64_t b) {
        bytes_read_ += b;
        if (clock_) clock_->bytes[p] += b;
    }
    uint64_t bytes_read_ = 0;
    const hparams& hp_;
    const model_weights& w_;
    std::vector<arenas::moe_layer> moe_layers_;
    arenas::moe_runner moe_;
    attention_runner attn_;
    // The layer kinds this model uses (null: unused), and each layer's.
    std::unique_ptr<attention_mixer> attention_;
    std::unique_ptr<sparse_attention_mixer> sparse_attention_;
    std::unique_ptr<latent_attention_mixer> latent_attention_;
    std::unique_ptr<gated_delta_net> delta_net_;
    std::unique_ptr<dense_ffn> dense_ffn_;
    std::unique_ptr<moe_ffn> moe_ffn_;
    std::unique_ptr<residual_stream> residual_;
    struct layer_kind {
        token_mixer* mixer = nullptr;
        ffn_block* ffn = nullptr;
        bool ple = false;  // the PLE block first (qwen4exp's ple.layers)
    };
    std::vector<layer_kind> layers_;  // [n_layer]
    bool batches_ = true;             // every mixer batches sequences
    // The MTP block's experts (read from the mapped file) and their runner; null without an MTP block.
    std::vector<arenas::moe_layer> mtp_moe_layers_;
    std::unique_ptr<arenas::mapped_expert_rows> mtp_rows_;
    std::unique_ptr<arenas::moe_runner> mtp_moe_;
    token_mixer* mtp_mixer_ = nullptr;  // the block's token mixer (one of the above)
    aligned_vector<float> mtp_in_;   // [n_tok][(hc)][2 n_embd] the normed embedding and hidden state (per stream)
    int checkpoint_interval_ = 0;
    routing_counts routing_;
    routing_scratch route_scratch_;

    // Scratch, sized for the largest batch seen (shape comments per token).
    aligned_vector<float> x_;        // [n_tok][n_embd] residual stream
    aligned_vector<float> xn_;       // [n_tok][n_embd] normed input of a block
    aligned_vector<float> q_;        // [n_tok][n_q]
    aligned_vector<float> k_, v_;    // [n_tok][n_kv]
    aligned_vector<float> att_;      // [n_tok][n_q]
    aligned_vector<float> tmp_;      // [n_tok][n_embd]
    aligned_vector<float> tmp2_;     // [n_tok][n_ff_dense] with n_ff_dense = max(n_ff_shexp, n_ff)
    aligned_vector<float> shexp_up_; // [n_tok][n_ff_dense]
    aligned_vector<float> router_;   // [n_tok][n_expert]
    std::vector<float> rope_cs_;  // [n_tok][n_rot] RoPE cosines, then sines, of each token's position
    std::vector<int32_t> ids_;    // [n_tok][n_expert_used]
    std::vector<float> weights_;  // [n_tok][n_expert_used]
    aligned_vector<uint8_t> act_; // quantized activations of a matmul
    std::vector<int32_t> tok_;    // [n_tok] the step's tokens, segment after segment
    aligned_vector<float> head_out_; // [rows][n_vocab] logits of a multi-segment step before they are handed out
};

// A sequence's state for hp: the KV cache of its attention layers (kv heads, or deepseek2's latent rows)
// and, for the hybrid families, the recurrent state of its DeltaNet layers.
kv_cache make_sequence_state(const hparams& hp, int n_ctx, kv_type kv);
// The MTP block's own cache: one layer of the trunk's rows (the block runs the trunk's attention kind).
kv_cache make_mtp_state(const hparams& hp, int n_ctx, kv_type kv);

// The routed experts of every MoE layer in layer order, as the pool reads them: the pool's layer
// il - hp.n_layer_dense_lead is the model's layer il (leading dense layers have no experts).
std::vector<arenas::moe_layer> moe_layers(const model_weights& w);

// How one token's router logits become expert ids and weights (llama.cpp's build_moe_ffn).
struct routing_options {
    gating_func gating = gating_func::softmax;
    bool normalize = false;  // weights divided by their sum (at least 2^-14, as llama.cpp clamps it)
    float scale = 0;         // weights multiplied by this unless 0 or 1
    int n_group = 0;         // group-limited selection over this many equal groups of experts (0, 1: off)
    int n_group_used = 0;    // the groups kept
};

// Scores = softmax or sigmoid of the logits; top-k by score + bias[e] (bias may be null; ties: the
// lower expert id); with groups, only among the n_group_used groups whose two best biased scores sum
// highest (ties: the lower group); the weights are the unbiased scores of the chosen experts, then
// normalised and scaled as `o` says: ids and weights [k]. Exposed for tests.
void route_token(const float* logits, const float* bias, int n_expert, int k, const routing_options& o, int32_t* ids,
                 float* weights);
// The same, with buffers kept by the caller (the forward pass's token loop allocates nothing once grown).
void route_token(const float* logits, const float* bias, int n_expert, int k, const routing_options& o, int32_t* ids,
                 float* weights, routing_scratch& scratch);
// Softmax, no bias, optionally renormalised.
void route_token(const float* logits, int n_expert, int k, bool normalize, int32_t* ids, float* weights);

}  // namespace strata::engine
