// Architecture and hyper-parameters of a MoE model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

#include "cpu/kernels.hpp"
#include "gguf/gguf_reader.hpp"
#include "model/rope.hpp"

namespace strata::engine {

enum class arch { qwen3moe, qwen2moe, mixtral };

// What differs between the architectures, as llama.cpp defines each one.
struct arch_traits {
    arch id;
    const char* name;
    bool qk_norm;           // per-head RMSNorm of q and k before RoPE (qwen3moe)
    bool qkv_bias;          // q/k/v projections have biases (qwen2moe)
    bool shared_expert;     // an always-on expert with a sigmoid gate (qwen2moe)
    bool norm_topk;         // renormalise the top-k routing weights to sum to 1
    kernels::cpu::rope_style rope;
};

const arch_traits& traits(arch a);

struct hparams {
    arch_traits arch;
    std::string gguf_arch;     // general.architecture as written ("llama" for mixtral)
    int n_layer = 0;
    int n_embd = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;          // key/value length per head
    int n_rot = 0;             // dims rotated by RoPE (head_dim unless the file says otherwise)
    int n_expert = 0;
    int n_expert_used = 0;
    int n_ff_exp = 0;          // routed expert hidden size
    int n_ff_shexp = 0;        // shared expert hidden size (0 when absent)
    int n_ctx_train = 0;
    int n_vocab = 0;
    float rms_eps = 1e-6f;
    rope_params rope;          // base frequency and position scaling (model/rope.hpp)

    int n_q() const { return n_head * head_dim; }
    int n_kv() const { return n_head_kv * head_dim; }
};

// Reads and checks the hyper-parameters, llama.cpp's default for an absent optional key (docs/DETAILS.md
// lists them); throws std::runtime_error naming the key and the numbers
// (missing key, an architecture strata does not run, a dense llama file, inconsistent head counts, an
// unknown RoPE scaling type). `rope` replaces the file's RoPE settings where given.
hparams read_hparams(const gguf::reader& file, const rope_overrides& rope = {});

}  // namespace strata::engine
