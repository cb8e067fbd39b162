// A layer of the forward pass is a token mixer plus an FFN around a residual, each kind chosen per layer
// at load (forward_pass builds the list) and each in its own file:
//   token mixers (xn -> the input of the layer's output projection wo):
//     attention_mixer          GQA attention, with the output gate where the file has one (attention_mixer.cpp)
//     sparse_attention_mixer   QSA: attention plus a learned indexer choosing blocks of keys (qsa.cpp)
//     latent_attention_mixer   deepseek2's multi-head latent attention (mla.cpp)
//     gated_delta_net          the hybrids' gated DeltaNet, a recurrent mixer (delta_net.cpp)
//   FFNs (xn -> the block output, handed to the residual part by part):
//     dense_ffn (ffn_dense.cpp), moe_ffn: routed experts and the shared expert (ffn_moe.cpp)
//   residuals: plain_residual (one stream, RMS norms; residual.cpp), hc_residual (qwen4exp's hc streams
//     mixed by hyper-connections; qwen4exp_forward.cpp)
// Each mixer kind also has a mixer_kind: what it keeps per sequence, known from the hyper-parameters
// alone (mixer_kind_of), so that sequences are made and their memory counted without a forward pass.
// They work on forward_pass's buffers (xn_, att_, tmp_, ...) and helpers (matmul, the pool, the phase
// clock), so the pass's bits, pool dispatches, timing and bytes are those of one loop over them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "expert_pool.hpp"
#include "model/attention.hpp"
#include "model/delta_net.hpp"
#include "model/hparams.hpp"
#include "model/sequence_state.hpp"
#include "model/weights.hpp"

namespace strata::engine {

class forward_pass;
class kv_cache;
class recurrent_state;
struct step_segment;
class residual_stream;

// A layer kind's positioned rows in a sequence's kv_cache: n_head_kv heads of head_dim keys and
// values, or one latent row of head_dim per position (n_head_kv 1); n_head_kv 0: none.
struct kv_rows {
    int n_head_kv = 0;
    int head_dim = 0;
    bool latent = false;
};

// A token mixer kind as a sequence's state sees it, from the file's hyper-parameters alone.
class mixer_kind {
public:
    virtual ~mixer_kind() = default;
    virtual const char* name() const = 0;
    // Its rows in the sequence's kv_cache.
    virtual kv_rows rows(const hparams& hp) const = 0;
    // Whether its part of the state goes back only to checkpoints (a recurrent state).
    virtual bool recurrent() const { return false; }
    // Why the GPU hybrid does not run it yet, or empty.
    virtual std::string gpu_unsupported(const hparams& hp) const {
        (void)hp;
        return {};
    }
    // Its part of a sequence's state beside the KV rows (sequence_state.hpp), or null when it keeps
    // none: made once per sequence for all the layers of the kind.
    virtual std::unique_ptr<state_part> make_state(const hparams& hp) const {
        (void)hp;
        return nullptr;
    }
    // Bytes of that part per sequence that do not grow with the positions (each checkpoint as many).
    virtual size_t state_bytes(const hparams& hp) const {
        (void)hp;
        return 0;
    }
};

// Layer il's mixer kind, from the file's hyper-parameters: the one place they choose it.
const mixer_kind& mixer_kind_of(const hparams& hp, int il);
// Questions about all of hp's layers, asked of their kinds: the rows of the layers that keep any (the
// KV cache's layout, the MTP block's too), the layers with a recurrent state, the bytes of the state
// beside the rows per sequence, and why the GPU hybrid cannot run the model (empty: it can).
kv_rows sequence_rows(const hparams& hp);
int n_recurrent_layers(const hparams& hp);
size_t sequence_state_bytes(const hparams& hp);
std::string gpu_unsupported(const hparams& hp);

// A layer's token mixer: forward_pass::xn_ [n_tok][n_embd] -> forward_pass::att_, the input of wo.
class token_mixer {
public:
    explicit token_mixer(forward_pass& f) : f_(f) {}
    virtual ~token_mixer() = default;
    token_mixer(const token_mixer&) = delete;
    token_mixer& operator=(const token_mixer&) = delete;

    virtual const char* kind() const = 0;
    // Layer il over the rows of segs (n_tok in all, segment after segment), each continuing its
    // sequence's state at the segment's pos0.
    virtual void eval(int il, std::span<const step_segment> segs, int n_tok) = 0;
    // Whether one pass may hold several sequences' rows; else the pass gets one segment at a time.
    virtual bool batches_sequences() const { return true; }
    // Weights l (not a trunk layer's) with their state in layer kvl of the segments' caches: the MTP
    // block, over its own one-layer cache, runs the mixer kind of the trunk's attention layers.
    virtual void eval_weights(const layer_weights& l, int kvl, std::span<const step_segment> segs, int n_tok) {
        (void)l, (void)kvl, (void)segs, (void)n_tok;
        throw std::logic_error(std::string("the ") + kind() + " mixer has no MTP form");
    }

protected:
    forward_pass& f_;
};

// GQA attention over the layer's KV rows; gated attention (the hybrids) splits attn_q per head into
// the query and an output gate, att = attention * sigmoid(gate).
class attention_mixer final : public token_mixer {
public:
    using token_mixer::token_mixer;
    static const mixer_kind& layer_kind();
    const char* kind() const override { return "attention"; }
    void eval(int il, std::span<const step_segment> segs, int n_tok) override;
    void eval_weights(const layer_weights& l, int kvl, std::span<const step_segment> segs, int n_tok) override {
        run(l, kvl, segs, n_tok);
    }
    // Weights l with its keys and values in KV layer kvl (the MTP block's too). dense (one flag per
    // segment; empty: all) false for a segment: its q, k, v and gate are computed and its keys and values
    // stored, its attention itself is left to the caller (a sparse decode).
    void run(const layer_weights& l, int kvl, std::span<const step_segment> segs, int n_tok,
             std::span<const uint8_t> dense = {});
    const float* gate() const { return gate_.data(); }  // [n_tok][n_q] the output gate's logits

private:
    std::vector<float> qg_;    // [n_tok][2 n_q] each head's query, then its gate
    std::vector<float> gate_;  // [n_tok][n_q]
    std::vector<attention_runner::job> jobs_;  // the step's segments whose attention runs here
};

// qwen4exp's QSA: attention_mixer's keys and values stored, plus the indexer's keys; each query whose
// budget leaves blocks out attends to the chosen blocks only.
class sparse_attention_mixer final : public token_mixer {
public:
    sparse_attention_mixer(forward_pass& f, attention_mixer& dense);
    static const mixer_kind& layer_kind();
    const char* kind() const override { return "sparse attention"; }
    void eval(int il, std::span<const step_segment> segs, int n_tok) override;
    // Benchmarks (forward_pass::fill_synthetic): layer il's indexer stores as if positions [0, n_pos)
    // had been evaluated, from raw keys [n_pos][idx_head_dim] (the block keys derived as select() does).
    void fill_keys(kv_cache& kv, int il, std::vector<float> raw_keys, int n_pos);

private:
    // The indexer over one segment's rows [row0, row0 + n_tok) at positions pos0.. of kv.
    void select(int il, int row0, int n_tok, int pos0, kv_cache& kv);
    // Layer il's store in kv: its raw keys [pos][idx_head_dim], or its block keys in groups
    // [group][idx_head_dim][qsa_group]; and the count of complete blocks in the latter.
    std::vector<float>& store(kv_cache& kv, int il, bool blocks) const;
    int& block_count(kv_cache& kv, int il) const;
    // Writes the block keys of blocks from .. n_blocks - 1 from the raw keys (bk grown to whole groups).
    void complete_blocks(int il, const std::vector<float>& keys, std::vector<float>& bk, int from, int n_blocks) const;
    // scores[b] = sum over heads of relu(q_h . bk[b]) / sqrt(idx_head_dim): q [idx_n_head][idx_head_dim]
    // (normed, rotated), bk in groups; scores holds whole groups (the lanes past n_blocks are not blocks).
    void score_blocks(const float* q, const float* bk, int n_blocks, float* scores);
    // Row t's attention over the chosen positions of layer il (keys and values of kv): att_ from q_,
    // gated by attention_mixer's gate, on the pool with the kernels' f32 matmul.
    void attend(int il, int t, std::span<const int> positions, const kv_cache& kv);
    attention_mixer& dense_;
    std::vector<int> slot_;             // [n_layer] a QSA layer's index among the indexer_keys stores, -1 otherwise
    std::vector<float> idx_q_, idx_k_;  // [n_tok][idx_n_head][idx_head_dim], [n_tok][idx_head_dim]
    std::vector<float> keys_;           // [n_head_kv][n_chosen][head_dim] the chosen keys as f32
    std::vector<float> values_;         // [n_head_kv][n_chosen][head_dim] the chosen values as f32
    std::vector<float> probs_;          // [n_head][n_chosen] scores, then softmax weights
    std::vector<uint8_t> raw_;          // [n_head_kv][n_chosen][2][head row bytes] rows as the cache holds them
    struct gather_run {
        int pos, n, j;  // n consecutive chosen positions from pos, the first the j-th chosen
    };
    std::vector<gather_run> runs_;
    std::vector<uint8_t> dense_of_;     // per segment of the pass: whether it attends densely
};

// deepseek2's multi-head latent attention over one latent row per position.
class latent_attention_mixer final : public token_mixer {
public:
    using token_mixer::token_mixer;
    static const mixer_kind& layer_kind();
    const char* kind() const override { return "latent attention"; }
    void eval(int il, std::span<const step_segment> segs, int n_tok) override;
    void eval_weights(const layer_weights& l, int kvl, std::span<const step_segment> segs, int n_tok) override;

private:
    // Weights l over the segments' rows (n_tok in all), each at its positions in latent layer il of its
    // cache: xn_ -> att_ [n_tok][n_v]. Projections over every row, attention per segment.
    void run(const layer_weights& l, int il, std::span<const step_segment> segs, int n_tok);
    // Attention over the latent cache: q [n_tok][n_head][n_lora_kv + n_rot] -> out [n_tok][n_head][n_lora_kv].
    void attend(const kv_cache& kv, int il, int n_tok, int pos0, const float* q, float* out);
    // y[t][h * n_rows + r] = head h's rows of w (n_rows from row h * step + row0) . in[t][h * in_cols ..]
    void matmul_heads(const weight_matrix& w, int64_t step, int64_t row0, int64_t n_rows, int n_tok, const float* in,
                      float* y);
    // Per token: the query through its bottleneck, the latent and rotated key, the query's no-RoPE part
    // absorbed into the latent; per work item, a chunk's keys laid out and states.
    std::vector<float> q_a_;      // [n_tok][n_lora_q]
    std::vector<float> kv_a_;     // [n_tok][n_lora_kv + n_rot]
    std::vector<float> q_nope_;   // [n_tok][n_head][head_dim - n_rot]
    std::vector<float> q_lat_;    // [n_tok][n_head][n_lora_kv + n_rot]: absorbed query, then its rotated part
    std::vector<float> o_lat_;    // [n_tok][n_head][n_lora_kv]
    std::vector<uint8_t> mla_keys_;  // [lanes][chunk_tokens][latent row bytes], blocked (attn_pack_keys)
    std::vector<float> mla_state_;   // [lanes or chunks][rows][n_lora_kv + 2]: acc, max, sum
    std::vector<int64_t> mla_last_;  // [n_tok][n_head]: each query row's last visible position
};

// The hybrids' gated DeltaNet: the layer's projections over every row of the pass, then delta_net_mixer
// over each segment's rows and its sequence's recurrent state.
class gated_delta_net final : public token_mixer {
public:
    explicit gated_delta_net(forward_pass& f);
    static const mixer_kind& layer_kind();
    const char* kind() const override { return "gated DeltaNet"; }
    // xn_ -> att_ [n_tok][value_dim], each segment continuing its own state.
    void eval(int il, std::span<const step_segment> segs, int n_tok) override;

private:
    delta_net_mixer kernel_;
    std::vector<int> rec_index_;  // [n_layer] a DeltaNet layer's index in the recurrent state
    std::vector<float> in_;       // [n_tok][conv_dim + value_dim] qwen3next's interleaved ssm_in output
    std::vector<float> dn_in_;    // [n_tok][conv_dim] q | k | v
    std::vector<float> dn_z_;     // [n_tok][value_dim]
    std::vector<float> dn_b_, dn_a_, dn_ba_;  // [n_tok][n_v_head] (ba: 2 n_v_head)
};

// A layer's FFN: forward_pass::xn_ -> its output, each part (the routed experts, the shared expert)
// handed to the residual in turn.
class ffn_block {
public:
    explicit ffn_block(forward_pass& f) : f_(f) {}
    virtual ~ffn_block() = default;
    ffn_block(const ffn_block&) = delete;
    ffn_block& operator=(const ffn_block&) = delete;

    virtual const char* kind() const = 0;
    virtual void eval(int il, int n_tok, residual_stream& out) = 0;

protected:
    forward_pass& f_;
};

// The gated FFN of leading dense layers: down(silu(gate xn) * up xn).
class dense_ffn final : public ffn_block {
public:
    using ffn_block::ffn_block;
    const char* kind() const override { return "dense FFN"; }
    void eval(int il, int n_tok, residual_stream& out) override;
    // forward_pass::tmp_ = down(silu(gate xn) * up xn) over n_ff hidden units (the shared expert's too).
    void run(const weight_matrix& gate, const weight_matrix& up, const weight_matrix& down, int n_ff, int n_tok);
    // run()'s second half, for a caller that computed gate (forward_pass::tmp2_) and up (shexp_up_) itself.
    void run_down(const weight_matrix& down, int n_ff, int n_tok);
};

// Routed experts on the pool (the router, top-k, expert_pool's MoE runner), then the shared expert
// (sigmoid-gated where the file has its gate) when the layer has one.
class moe_ffn final : public ffn_block {
public:
    moe_ffn(forward_pass& f, dense_ffn& dense) : ffn_block(f), dense_(dense) {}
    const char* kind() const override { return "MoE"; }
    void eval(int il, int n_tok, residual_stream& out) override;
    // The MoE of weights l through `runner`'s pool layer, counting routes into counts (null: not
    // counted): forward_pass::tmp_.
    void experts(const layer_weights& l, arenas::moe_runner& runner, const std::vector<arenas::moe_layer>& layers,
                 int pool_layer, uint64_t* counts, int n_tok);
    void shared_expert(const layer_weights& l, int n_tok);  // forward_pass::tmp_

private:
    dense_ffn& dense_;
    // The layer whose shared expert's gate and up experts() ran beside the router (same input, one phase).
    const layer_weights* shexp_gate_up_of_ = nullptr;
};

// The residual around the blocks: how a block's input is made from it and its output goes back.
class residual_stream {
public:
    explicit residual_stream(forward_pass& f) : f_(f) {}
    virtual ~residual_stream() = default;
    residual_stream(const residual_stream&) = delete;
    residual_stream& operator=(const residual_stream&) = delete;

    virtual const char* kind() const = 0;
    // The residual of the pass's rows (forward_pass::tok_, n_tok) from their embeddings.
    virtual void begin(std::span<const step_segment> segs, int n_tok) = 0;
    // forward_pass::xn_: the input of layer l's mixer, or of its FFN.
    virtual void block_input(const layer_weights& l, bool ffn, int n_tok) = 0;
    // Part of a block's output y [n_tok][n_embd] (first: its first part), then the end of the block.
    virtual void add(const float* y, bool first, int n_tok) = 0;
    virtual void end_block(int n_tok) { (void)n_tok; }
    // After the last layer: the segments' hidden states, the state's last residual, their logits.
    virtual void finish(std::span<const step_segment> segs, int n_tok) = 0;
    // Whether one pass may hold several sequences' rows.
    virtual bool batches_sequences() const { return true; }
    // Why the file's MTP block does not draft under this residual, or empty (then other reasons apply).
    virtual std::string mtp_refusal() const { return {}; }

protected:
    forward_pass& f_;
};

// One stream: RMS norm before each block, its output added.
class plain_residual final : public residual_stream {
public:
    using residual_stream::residual_stream;
    const char* kind() const override { return "plain"; }
    void begin(std::span<const step_segment> segs, int n_tok) override;
    void block_input(const layer_weights& l, bool ffn, int n_tok) override;
    void add(const float* y, bool first, int n_tok) override;
    void finish(std::span<const step_segment> segs, int n_tok) override;
};

// qwen4exp: hc streams, each block's input mixed from them by the layer's hyper-connection mixer and
// its output added to every stream with the mixer's inject weights.
class hc_residual final : public residual_stream {
public:
    using residual_stream::residual_stream;
    const char* kind() const override { return "hyper-connection streams"; }
    void begin(std::span<const step_segment> segs, int n_tok) override;
    void block_input(const layer_weights& l, bool ffn, int n_tok) override;
    void add(const float* y, bool first, int n_tok) override;
    void end_block(int n_tok) override;
    void finish(std::span<const step_segment> segs, int n_tok) override;
    std::string mtp_refusal() const override { return "it has no nextn.hc_head_* output mixer"; }
};

}  // namespace strata::engine
