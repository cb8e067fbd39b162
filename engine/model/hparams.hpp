// Architecture and hyper-parameters of a MoE model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "gguf/gguf_reader.hpp"
#include "model/rope.hpp"

namespace strata::engine {

enum class arch { qwen3moe, qwen2moe, mixtral, glm4moe, deepseek2, qwen35moe, qwen3next };

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
};

// Reads and checks the hyper-parameters, llama.cpp's default for an absent optional key (docs/DETAILS.md
// lists them); throws std::runtime_error naming the key and the numbers
// (missing key, an architecture strata does not run, a dense llama file, inconsistent head counts, an
// unknown RoPE scaling type). `rope` replaces the file's RoPE settings where given.
hparams read_hparams(const gguf::reader& file, const rope_overrides& rope = {});

}  // namespace strata::engine
