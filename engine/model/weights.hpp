// The model's tensors bound by name, with shapes checked against the hyper-parameters. Everything
// points into the mapped GGUF file; repack_dense adds copies in the CPU's prompt GEMM layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "gguf/gguf_reader.hpp"
#include "model/hparams.hpp"
#include "moe_phases.hpp"
#include "numa_policy.hpp"

namespace strata::engine {

// A 2-D weight: n_rows rows of n_cols elements (ggml's ne[1] x ne[0]).
struct weight_matrix {
    std::string name;
    kernels::cpu::matrix m{};   // type, data, n_cols, row_stride
    int64_t n_rows = 0;
    kernels::cpu::matrix packed{};  // rows16 copy (repack_dense) the CPU matmuls read instead of m; data null: none
    bool present() const { return m.data != nullptr; }
    const kernels::cpu::matrix& cpu() const { return packed.data ? packed : m; }
};

// One layer's routed experts (a merged 3-D tensor, or one tensor per expert in older Mixtral files).
using expert_matrix = arenas::expert_tensor;

struct layer_weights {
    const float* attn_norm = nullptr;   // [n_embd]
    weight_matrix wq, wk, wv, wo;       // [n_q x n_embd], [n_kv x n_embd] x2, [n_embd x n_q]
    const float* bq = nullptr;          // [n_q]  (qwen2moe, glm4moe; each may be absent in glm4moe)
    const float* bk = nullptr;          // [n_kv]
    const float* bv = nullptr;          // [n_kv]
    const float* q_norm = nullptr;      // [head_dim] (qwen3moe)
    const float* k_norm = nullptr;      // [head_dim]
    // deepseek2 (latent attention; wk and wv absent, wq absent when n_lora_q > 0):
    weight_matrix wq_a;                 // [n_lora_q x n_embd]
    const float* q_a_norm = nullptr;    // [n_lora_q]
    weight_matrix wq_b;                 // [n_q x n_lora_q]
    weight_matrix wkv_a;                // [(n_lora_kv + n_rot) x n_embd]: the latent, then the rotated key
    const float* kv_a_norm = nullptr;   // [n_lora_kv]
    weight_matrix wk_b;                 // [n_head * n_lora_kv x nope]: head h's rows map its q_nope to the latent
    weight_matrix wv_b;                 // head h's value rows: [head_dim_v x n_lora_kv] from row h * v_b_step + v_b_row0
    int64_t v_b_step = 0, v_b_row0 = 0;
    // Gated DeltaNet layers (qwen35moe, qwen3next; wo is ssm_out [n_embd x value_dim]):
    weight_matrix wqkv;                 // attn_qkv [conv_dim x n_embd]: q | k | v of every head
    weight_matrix wz;                   // attn_gate [value_dim x n_embd]: the output gate z
    weight_matrix ssm_in;               // qwen3next's older [q | k | v | z per key head] instead of wqkv + wz
    weight_matrix ssm_beta, ssm_alpha;  // [n_v_head x n_embd] each (qwen35moe)
    weight_matrix ssm_ba;               // [2 n_v_head x n_embd]: per key head its value heads' beta, then alpha (qwen3next)
    const float* ssm_conv1d = nullptr;  // [conv_dim][conv_kernel]
    const float* ssm_dt_bias = nullptr; // [n_v_head]
    const float* ssm_a = nullptr;       // [n_v_head] -exp(A_log)
    const float* ssm_norm = nullptr;    // [d_state]
    const float* ffn_norm = nullptr;    // [n_embd] (glm4moe, hybrids: post_attention_norm)
    // A leading dense layer has ffn_gate/up/down and none of the expert tensors below.
    weight_matrix ffn_gate, ffn_up;     // [n_ff x n_embd]
    weight_matrix ffn_down;             // [n_embd x n_ff]
    weight_matrix router;               // [n_expert x n_embd]
    const float* exp_probs_b = nullptr; // [n_expert] score correction for the selection only (glm4moe)
    expert_matrix gate, up, down;       // gate/up: [n_ff x n_embd] per expert; down: [n_embd x n_ff]
    const float* shexp_gate_inp = nullptr;      // [n_embd] (qwen2moe's sigmoid gate; glm4moe has none)
    weight_matrix shexp_gate, shexp_up, shexp_down;
};

// A next-token-prediction block past the trunk (qwen35moe's MTP): a gated attention layer with its
// MoE, and the projection of [enorm(embedding) | hnorm(hidden)] into it. Bound for speculation, not run.
struct nextn_weights {
    layer_weights layer;
    weight_matrix eh_proj;              // [n_embd x 2 n_embd]
    const float* enorm = nullptr;       // [n_embd]
    const float* hnorm = nullptr;       // [n_embd]
    const float* shared_head_norm = nullptr;  // [n_embd] or absent
};

struct model_weights {
    weight_matrix tok_embd;             // [n_vocab x n_embd]
    const float* output_norm = nullptr; // [n_embd]
    weight_matrix output;               // [n_vocab x n_embd]; tok_embd when tied
    std::vector<layer_weights> layers;
    std::vector<nextn_weights> nextn;   // hybrids' MTP blocks (blk.n_layer ..)
    std::vector<std::vector<uint8_t>> packed_storage;  // owns wk_b built from attn_kv_b
    // The dense rows16 copies, in one buffer advised for transparent huge pages: decode reads them all
    // every token, and with 4 KiB pages the TLB misses cost as much as a quarter of their read time.
    arenas::node_buffer packed_dense;
};

// Binds every tensor the architecture needs, for the hp.n_layer evaluated layers (the tensors of
// next-token-prediction layers after them are left unread). Throws std::runtime_error naming the tensor with the
// expected and found shape or type (a missing tensor, a wrong shape, a type without a CPU kernel,
// a norm that is not F32).
model_weights bind_weights(const gguf::reader& file, const hparams& hp);

struct repack_summary {
    std::vector<std::string> names;   // the tensors repacked
    size_t bytes = 0;                 // their rows16 copies
    size_t gguf_bytes = 0;            // the same rows in the file
    std::vector<std::string> copied;  // the other dense tensors, copied as they are
    size_t copied_bytes = 0;
};
// Gives every dense matrix (attention, router, shared expert, output head; not the embedding table)
// that kernels::cpu::can_repack accepts a rows16 copy in w.packed_dense, and every other one a copy of
// its GGUF rows there (so decode reads all of them from huge pages, none from the mapped file). The
// GGUF rows stay bound (the GPU reads them).
repack_summary repack_dense(model_weights& w);

}  // namespace strata::engine
