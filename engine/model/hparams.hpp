// Architecture and hyper-parameters of a MoE model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "gguf/gguf_reader.hpp"
#include "model/rope.hpp"

namespace strata::engine {

enum class arch { qwen3moe, qwen2moe, mixtral, glm4moe, deepseek2, qwen35moe, qwen3next, qwen4exp };

// Whether the file must, may or must not carry a class of tensors.
enum class presence { absent, optional, required };

// How router logits become expert scores (llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid).
enum class gating_func { softmax, sigmoid };

// What differs between the architectures, as llama.cpp defines each one.
struct arch_traits {
    arch id;
    const char* name;
    presence qk_norm;       // per-head RMSNorm of q and k before RoPE (qwen3moe; optional in glm4moe)
    presence qkv_bias;      // q/k/v projections have biases (qwen2moe; optional in glm4moe)
    bool shared_expert;     // an always-on expert (qwen2moe's with a sigmoid gate, glm4moe's without)
    bool norm_topk;         // default of expert_weights_norm: renormalise the top-k weights to sum to 1
    gating_func gating;     // default of expert_gating_func
    presence exp_probs_b;   // a per-expert score-correction bias for the selection (glm4moe; deepseek2 may)
    const char* ffn_norm;   // the pre-FFN norm's tensor name within a block
    kernels::cpu::rope_style rope;
};

const arch_traits& traits(arch a);

struct hparams {
    arch_traits arch;
    std::string gguf_arch;     // general.architecture as written ("llama" for mixtral)
    int n_layer = 0;           // layers evaluated: block_count less the next-token-prediction layers
    int n_embd = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;          // query/key length per head (deepseek2: the no-RoPE part, then the RoPE part)
    int head_dim_v = 0;        // value length per head (head_dim but in deepseek2)
    int n_rot = 0;             // dims rotated by RoPE (head_dim unless the file says otherwise)
    // deepseek2's multi-head latent attention (0 elsewhere).
    int n_lora_q = 0;          // query through a rank-n_lora_q bottleneck; 0: a plain attn_q
    int n_lora_kv = 0;         // the latent a position's keys and values are decompressed from
    bool kv_b_split = false;   // attn_k_b + attn_v_b (the *_mla keys are set); else one attn_kv_b
    float kq_scale = 0;        // attention scale with YaRN's mscale correction (0: 1 / sqrt(head_dim))
    float rope_yarn_log_mul = 0;  // rope.scaling.yarn_log_multiplier / 0.1, as llama.cpp reads it
    int n_expert = 0;
    int n_expert_used = 0;
    int n_ff_exp = 0;          // routed expert hidden size
    int n_ff_shexp = 0;        // shared expert hidden size (0 when absent)
    int n_ff = 0;              // dense FFN hidden size of the leading dense layers (0 when there are none)
    int n_layer_dense_lead = 0;  // the first layers run a dense FFN instead of experts
    int n_layer_nextn = 0;     // next-token-prediction layers after the n_layer evaluated ones, not run
    int n_expert_shared = 0;   // glm4moe, deepseek2: shared experts, n_ff_shexp = n_expert_shared * n_ff_exp
    int n_expert_groups = 0;   // group-limited routing: experts in this many equal groups (0 or 1: off)
    int n_group_used = 0;      // the groups a token's experts may come from
    gating_func gating = gating_func::softmax;
    bool expert_weights_norm = false;  // top-k weights renormalised to sum to 1
    float expert_weights_scale = 0;    // top-k weights multiplied by this (0 or 1: unscaled)
    int n_ctx_train = 0;
    int n_vocab = 0;
    float rms_eps = 1e-6f;
    rope_params rope;          // base frequency and position scaling (model/rope.hpp)
    // The hybrid families (qwen35moe, qwen3next): gated DeltaNet layers beside gated attention layers,
    // whose attn_q holds each head's query and then its sigmoid output gate (0 / empty elsewhere).
    int ssm_conv_kernel = 0;   // ssm.conv_kernel: the causal depthwise conv's width
    int ssm_d_state = 0;       // ssm.state_size: a DeltaNet head's key and value width
    int ssm_n_k_head = 0;      // ssm.group_count: key heads
    int ssm_n_v_head = 0;      // ssm.time_step_rank: value heads, each with a d_state x d_state state
    bool ssm_v_tiled = false;  // value head h reads key head h % n_k (qwen35moe); else h / (n_v / n_k)
    std::vector<int> kv_slot;  // [n_layer] the KV cache layer of an attention layer, -1 for DeltaNet layers
    bool ssm_gate_sigmoid = false;  // the DeltaNet output gate is sigmoid(z) (qwen4exp), else SiLU(z)
    // qwen4exp (0 / empty elsewhere): hc residual streams mixed by hyper-connections, QSA attention
    // layers whose learned indexer picks blocks of keys, and the per-layer n-gram embedding (PLE).
    int hc = 0;                // hyper_connection.count: the residual is hc x n_embd wide
    int hc_rank = 0;           // hyper_connection.low_rank: the mixers' gate bottleneck
    int idx_n_head = 0;        // attention.indexer.head_count
    int idx_head_dim = 0;      // attention.indexer.key_length
    int idx_top_k = 0;         // attention.indexer.top_k: the token budget of a QSA query
    std::vector<int> qsa_ratio;  // [n_layer] attention.compress_ratios: tokens per indexer block (0: dense)
    int ple_layer = -1;        // ple.layers: the (DeltaNet) layer the PLE block feeds; -1: none
    int ple_ngram = 0;         // ple.ngram_size: n-grams of 2..ple_ngram tokens are hashed
    int ple_heads_per_ngram = 0;
    int ple_conv_kernel = 0;   // ple.conv_kernel: taps of its depthwise conv, dilated by ple_ngram
    int ple_head_dim = 0;      // embedding_length_per_layer: the width of one gathered table row
    int64_t ple_eos = 0;       // ple.eos_token_id: cuts the n-gram window and pads its start
    std::vector<uint64_t> ple_mult;    // [ple_ngram] ple.layer_multipliers
    std::vector<uint64_t> ple_offset;  // [heads] ple.head_offsets: each head's first table row
    std::vector<uint64_t> ple_vocab;   // [heads] ple.head_vocab_sizes: each head's (prime) row count

    int n_q() const { return n_head * head_dim; }
    int n_kv() const { return n_head_kv * head_dim; }
    int n_v() const { return n_head * head_dim_v; }  // attention output, the input of attn_output
    bool mla() const { return n_lora_kv > 0; }
    // What the KV cache keeps per position and layer: kv heads of kv_head_dim keys and values, or
    // (latent attention) one row of the latent and the rotated key.
    int kv_heads() const { return mla() ? 1 : n_head_kv; }
    int kv_head_dim() const { return mla() ? n_lora_kv + n_rot : head_dim; }
    bool is_moe_layer(int il) const { return il >= n_layer_dense_lead; }
    bool hybrid() const { return ssm_d_state > 0; }
    bool is_recurrent(int il) const { return hybrid() && kv_slot[static_cast<size_t>(il)] < 0; }
    int kv_layer(int il) const { return hybrid() ? kv_slot[static_cast<size_t>(il)] : il; }
    int n_kv_layer() const;    // layers with a KV cache
    int n_recurrent() const { return n_layer - n_kv_layer(); }
    bool attn_gate() const { return hybrid(); }  // attn_q is [query | gate] per head
    int ssm_key_dim() const { return ssm_n_k_head * ssm_d_state; }
    int ssm_value_dim() const { return ssm_n_v_head * ssm_d_state; }
    int ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
    int n_moe_layer() const { return n_layer - n_layer_dense_lead; }
    bool qwen4() const { return hc > 0; }
    int hc_dim() const { return hc * n_embd; }
    // A token's last residual as the MTP block reads it: qwen4exp's hc streams, else n_embd wide.
    int residual_width() const { return qwen4() ? hc_dim() : n_embd; }
    int ple_n_heads() const { return (ple_ngram - 1) * ple_heads_per_ngram; }
    int ple_dim() const { return ple_n_heads() * ple_head_dim; }  // a token's gathered rows, concatenated
    int64_t ple_rows() const;  // table rows the head ranges reach
};

// Reads and checks the hyper-parameters, llama.cpp's default for an absent optional key (docs/DETAILS.md
// lists them); throws std::runtime_error naming the key and the numbers
// (missing key, an architecture strata does not run, a dense llama file, inconsistent head counts, an
// unknown RoPE scaling type). `rope` replaces the file's RoPE settings where given.
hparams read_hparams(const gguf::reader& file, const rope_overrides& rope = {});

}  // namespace strata::engine
