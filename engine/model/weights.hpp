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
    // The file bytes one pass over it reads (0 when absent).
    uint64_t bytes() const { return present() ? static_cast<uint64_t>(n_rows) * m.row_stride : 0; }
};

// One layer's routed experts (a merged 3-D tensor, or one tensor per expert in older Mixtral files).
using expert_matrix = arenas::expert_tensor;

// A hyper-connection mixer (qwen4exp): a grouped RMSNorm over the hc streams, a low-rank sigmoid gate,
// the mean over the gated streams; inject gives each stream's weight for adding the block output back.
struct hc_mixer {
    const float* norm = nullptr;        // [hc * n_embd]
    weight_matrix down;                 // [hc_rank x hc * n_embd]
    weight_matrix up;                   // [hc * n_embd x hc_rank]
    weight_matrix inject;               // [hc x hc * n_embd]; absent for the output mixers
    bool present() const { return norm != nullptr; }
};

// The PLE block of one layer (qwen4exp): the token's gathered n-gram rows projected to a value and one
// key per stream, a gate from the streams, and a depthwise conv dilated by the n-gram size.
struct ple_weights {
    weight_matrix key;                  // [hc * n_embd x ple_dim]
    weight_matrix value;                // [n_embd x ple_dim]
    const float* norm_key = nullptr;    // [hc * n_embd] each
    const float* norm_query = nullptr;
    const float* norm_conv = nullptr;
    const float* conv1d = nullptr;      // [hc * n_embd][ple_conv_kernel]
    bool present() const { return norm_key != nullptr; }
};

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
    // qwen4exp: mixers before the token mixer and before the MoE (no attn_norm / ffn_norm), the QSA
    // indexer of attention layers, the PLE block of hp.ple_layer.
    hc_mixer hc_attn, hc_ffn;
    weight_matrix idx_q;                // [idx_n_head * idx_head_dim x n_embd]
    weight_matrix idx_k;                // [idx_head_dim x n_embd]
    const float* idx_q_norm = nullptr;  // [idx_head_dim]
    const float* idx_k_norm = nullptr;
    ple_weights ple;
};

// A next-token-prediction block past the trunk (the MTP of qwen35moe, qwen4exp, glm4moe and deepseek2): the
// family's attention layer with its MoE, and the projection of [enorm(embedding) | hnorm(hidden)] into it;
// run by forward_pass::mtp.
struct nextn_weights {
    layer_weights layer;
    weight_matrix embed_tokens;         // glm4moe, deepseek2: the block's own embedding, optional (else token_embd)
    weight_matrix shared_head_head;     // glm4moe, deepseek2: the block's own output head, optional (else output)
    weight_matrix eh_proj;              // [n_embd x 2 n_embd]
    const float* enorm = nullptr;       // [n_embd]
    const float* hnorm = nullptr;       // [n_embd]
    const float* shared_head_norm = nullptr;  // [n_embd] or absent
    hc_mixer hc_head;                   // qwen4exp: the draft head's own output mixer (hnorm is hc * n_embd)
};

// The PLE table (per_layer_token_embd) where it lies in the mapped file: rows are gathered from there,
// never copied, first-touched or pinned, so the resident set holds only the rows read.
struct ple_reads;  // model/ple.hpp

struct ple_table {
    const uint8_t* data = nullptr;
    formats::ggml_type type = formats::ggml_type::F32;
    int64_t n_cols = 0, n_rows = 0;
    size_t row_stride = 0;
    ple_reads* reads = nullptr;  // the engine's counters of what passes gather (null: not counted)
    size_t bytes() const { return row_stride * static_cast<size_t>(n_rows); }
};

struct model_weights {
    weight_matrix tok_embd;             // [n_vocab x n_embd]
    const float* output_norm = nullptr; // [n_embd]
    weight_matrix output;               // [n_vocab x n_embd]; tok_embd when tied
    std::vector<layer_weights> layers;
    std::vector<nextn_weights> nextn;   // MTP blocks (blk.n_layer ..)
    std::string nextn_error;            // glm4moe, deepseek2: why the file's MTP block could not be bound (else empty)
    hc_mixer hc_head;                   // qwen4exp: the output mixer (output_hc_*; there is no output_norm)
    ple_table ple;                      // qwen4exp with a PLE block
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
// Gives every dense matrix (attention, router, shared expert, output head, also the MTP blocks'; not
// the embedding table) that kernels::cpu::can_repack accepts a rows16 copy in w.packed_dense, and every
// other one a copy of its GGUF rows there (so decode reads all of them from huge pages, none from the
// mapped file). The GGUF rows stay bound (the GPU reads them).
repack_summary repack_dense(model_weights& w);

}  // namespace strata::engine
