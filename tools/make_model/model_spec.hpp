// What strata-make-model writes: an architecture, its dimensions and the type of each tensor class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/types.hpp"

namespace strata::make_model {

enum class arch { qwen3moe, qwen2moe, mixtral, glm4moe, deepseek2, qwen35moe, qwen3next, qwen4exp };

// The vocabulary written: gpt2 (byte-level BPE, ChatML template) or llama (SentencePiece with scores,
// <0xXX> byte tokens, <unk> <s> </s>, Mistral [INST] template). arch_default: llama for mixtral, as
// real Mixtral files have, gpt2 otherwise.
enum class tokenizer_kind { arch_default, gpt2, llama };

// RoPE scaling keys written: absent (none at all, plain RoPE) or rope.scaling.type with this value,
// and for linear / yarn the factor (yarn: also the original context), as llama.cpp's converter writes them.
enum class rope_scaling_type { absent, none, linear, yarn };

struct model_spec {
    arch architecture = arch::qwen3moe;
    std::string name = "strata synthetic";
    int n_layer = 2;
    int n_embd = 256;
    int n_head = 4;
    int n_head_kv = 2;
    int head_dim = 64;
    int n_expert = 8;
    int n_expert_used = 2;
    int n_ff_exp = 256;      // routed expert hidden size
    int n_ff_shexp = 256;    // shared expert hidden size (qwen2moe)
    int n_rot = 0;           // rope.dimension_count; 0: the head width (glm4moe: half of it, as GLM-4.5)
    // deepseek2 only: multi-head latent attention. head_dim is a query/key head (its last n_rot dims
    // rotate), head_dim_v a value head.
    int n_lora_q = 64;                 // attention.q_lora_rank; 0: a plain attn_q (the Lite models)
    int n_lora_kv = 64;                // attention.kv_lora_rank: the latent the KV cache keeps
    int head_dim_v = 32;
    bool kv_b_split = true;            // attn_k_b + attn_v_b (and the *_mla keys); false: one attn_kv_b
    int expert_gating_func = 2;        // 1 softmax (DeepSeek-V2), 2 sigmoid (V3)
    bool exp_probs_b = true;           // the score-correction bias (V3)
    int n_expert_groups = 4;           // expert_group_count (0: no group-limited routing)
    int n_group_used = 2;              // expert_group_used_count
    float rope_yarn_log_mul = 0.0f;    // rope.scaling.yarn_log_multiplier as files carry it (0: absent)
    // glm4moe and deepseek2: the layer layout and routing of GLM-4.5 / DeepSeek.
    int n_layer_dense_lead = 1;        // leading layers with a dense FFN of width n_ff
    int n_ff = 512;
    int n_expert_shared = 1;           // shared experts, each n_ff_exp wide
    int n_layer_nextn = 0;             // next-token-prediction layers written after the n_layer ones
    // qwen35moe / qwen3next: gated DeltaNet layers (ssm.*) with a gated full-attention layer every
    // full_attention_interval layers; n_ff_shexp is the sigmoid-gated shared expert's width.
    int ssm_d_state = 32;              // ssm.state_size: the key (and value) width of a DeltaNet head
    int ssm_n_group = 2;               // ssm.group_count: key heads
    int ssm_dt_rank = 4;               // ssm.time_step_rank: value heads
    int ssm_conv_kernel = 4;           // ssm.conv_kernel
    int full_attention_interval = 4;
    bool ssm_in = false;               // qwen3next: the older interleaved ssm_in + ssm_ba instead of attn_qkv + attn_gate + ssm_ba
    // qwen4exp (the hybrid layout above plus): hc residual streams mixed through a rank-hc_rank gate,
    // QSA attention layers (an indexer of idx_n_head heads of idx_head_dim picking blocks of qsa_ratio
    // tokens within idx_top_k), and the PLE block at DeltaNet layer ple_layer (-1: none) whose table
    // holds per hash head the first primes from ple_vocab_base rows of ple_head_dim (ple_rows: at least
    // that many rows; more make a large table, left as holes in the file).
    int hc = 4;
    int hc_rank = 32;
    int idx_n_head = 4;
    int idx_head_dim = 32;
    int idx_top_k = 16;
    int qsa_ratio = 4;
    int ple_layer = 1;
    int ple_ngram = 3;
    int ple_heads_per_ngram = 2;
    int ple_conv_kernel = 4;
    int ple_head_dim = 32;
    int ple_vocab_base = 1000;
    int64_t ple_rows = 0;
    formats::ggml_type type_ple = formats::ggml_type::Q8_0;
    bool qk_norm = true;               // attn_q_norm / attn_k_norm (GLM-4.5 has them, GLM-4.5-Air not)
    bool expert_weights_norm = true;
    float expert_weights_scale = 2.5f;
    int n_vocab = 512;
    int n_ctx = 512;
    float rope_freq_base = 1000000.0f;
    rope_scaling_type rope_scaling = rope_scaling_type::absent;
    float rope_factor = 1.0f;         // rope.scaling.factor (linear, yarn)
    int rope_orig_ctx = 0;            // yarn: rope.scaling.original_context_length; 0: n_ctx / rope_factor
    float rms_eps = 1e-6f;
    bool tie_embeddings = false;       // no output.weight; the head reuses token_embd
    // --echo-cycle L: a model that continues a text the way it has seen it: the output head maps each
    // token id to the next one in its run of L ids (the last back to the first) and every layer's output
    // is scaled down so greedy decoding follows the runs. Speculative-decoding benchmarks use it as a
    // stand-in for a model asked to repeat a block of text. 0: off.
    int echo_cycle = 0;
    bool split_experts = false;        // mixtral only: older per-expert tensors blk.N.ffn_gate.E.weight
    // One blk.N.ffn_gate_up_exps [n_embd, 2 n_ff_exp, n_expert] (each expert's gate rows, then its up
    // rows) instead of ffn_gate_exps + ffn_up_exps, holding the same values as those two would.
    bool fused_gate_up = false;
    tokenizer_kind tokenizer = tokenizer_kind::arch_default;
    // --vocab-from FILE: the tokenizer.* keys (vocabulary, merges, chat template) of this GGUF file
    // instead of a learned vocabulary; n_vocab becomes its token count.
    std::string vocab_from;
    // --add-token TEXT: user-defined tokens (plain text, always one token) in place of the last learned
    // ones, after the special tokens; gpt2 tokenizer only. Lets a test force whole phrases by logit_bias.
    std::vector<std::string> added_tokens;
    uint64_t seed = 42;
    formats::ggml_type type_experts = formats::ggml_type::Q4_K;
    formats::ggml_type type_shexp = formats::ggml_type::Q8_0;
    formats::ggml_type type_attn = formats::ggml_type::Q8_0;
    formats::ggml_type type_embd = formats::ggml_type::Q8_0;
    formats::ggml_type type_out = formats::ggml_type::Q6_K;
    formats::ggml_type type_router = formats::ggml_type::F32;
};

std::string arch_name(arch a);             // the name on the command line
std::string gguf_architecture(arch a);     // general.architecture ("llama" for mixtral, as llama.cpp expects)
arch parse_arch(const std::string& name);  // throws std::invalid_argument listing the valid names
tokenizer_kind parse_tokenizer(const std::string& name);  // gpt2 | llama; throws std::invalid_argument
tokenizer_kind resolve_tokenizer(const model_spec& spec);  // arch_default resolved: gpt2 or llama
rope_scaling_type parse_rope_scaling(const std::string& name);  // none | linear | yarn; throws std::invalid_argument

// Presets: "tiny" (a few MB, unit tests), "demo" (tens of MB, the README's model), "bench"
// (about 1.5 GB: n_embd 2048, 8 layers, 32/4 heads of 128, 64 experts of 768, 8 used). For glm4moe,
// tiny and demo gain a leading dense layer, and bench is GLM-4.5 at half width (about 1.7 GB: n_embd
// 2560, 1 dense + 3 MoE layers, 48/4 heads of 128, 160 experts of 768, 8 used, 1 shared).
// deepseek2: tiny has q_lora_rank 64, kv_lora_rank 64, heads of 32 + 32 rotated (values 32), 16
// experts in 4 groups (2 used), sigmoid gating with a correction bias; bench is DeepSeek-V3's layout
// at n_embd 2048 (about 1.2 GB: 1 dense + 7 MoE layers, 16 heads of 128 + 64, latent 512, 64 experts
// of 512 in 8 groups, 8 used in 4 groups, 1 shared).
// qwen35moe, qwen3next: 3 gated DeltaNet layers per gated attention layer; tiny has 4 layers, DeltaNet
// heads of 32 (2 key, 4 value heads); bench is Qwen3.5-35B-A3B per layer with 8 layers (3.8 GB:
// n_embd 2048, 16 key / 32 value heads of 128, attention 16 / 2 heads of 256 rotating 64 dims, 256
// experts of 512, 8 used, a shared expert of 512, context 262144).
// Sets `architecture` to `a`. Throws std::invalid_argument listing the presets.
model_spec preset(const std::string& name, arch a = arch::qwen3moe);

bool hybrid(arch a);                                // qwen35moe, qwen3next or qwen4exp
bool recurrent_layer(const model_spec& s, int il);  // layer il of the trunk is a gated DeltaNet layer

// How a tensor's values are drawn before quantization.
enum class init { matrix, embedding, norm, bias, decay };  // decay: -exp(u * scale), as ssm_a's -exp(A_log)

struct tensor_spec {
    std::string name;
    formats::ggml_type type;
    std::vector<int64_t> ne;  // ggml order
    init kind;
    float scale;              // matrix: std of the entries; others: their spread
};

// Every tensor of the model in file order, with shapes as llama.cpp's loader expects them.
// Throws std::invalid_argument naming the tensor when a dimension does not fit its type's blocks.
std::vector<tensor_spec> tensor_specs(const model_spec& spec);

}  // namespace strata::make_model
