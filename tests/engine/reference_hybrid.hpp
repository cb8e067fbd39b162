// A naive forward pass of the hybrid families (qwen35moe, qwen3next) for tests: f32 weights dequantized
// once, plain loops token by token, written from llama.cpp's graphs (src/models/qwen35moe.cpp,
// qwen3next.cpp, delta-net-base.cpp) and sharing no code with the engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_reader.hpp"

namespace strata::testing {

class hybrid_reference {
public:
    explicit hybrid_reference(const gguf::reader& file);

    // Logits [n_vocab] after each token, fed one at a time from position 0 (fresh state).
    std::vector<std::vector<float>> logits(const std::vector<int32_t>& tokens);
    // The MTP block's logits [n_vocab] at each position p of tokens (after logits(tokens)): blk.n_layer fed
    // [enorm(embed(tokens[p])) | hnorm(output_norm(trunk residual at p - 1)), zeros at p = 0] through eh_proj, its
    // gated attention over positions 0..p, its MoE and shared expert, shared_head_norm (else the output
    // norm) and the output head (llama.cpp's qwen35 MTP graph).
    std::vector<std::vector<float>> mtp_logits(const std::vector<int32_t>& tokens);
    // The smallest gap, over the last logits() call's positions and layers, between the router logits
    // of the k-th and (k+1)-th expert: near zero a rounding difference may choose another expert.
    float min_route_margin() const { return min_margin_; }

    // The delta rule, token by token, for one value head with state S [d_k][d_v] (exposed to test
    // the engine's kernels against): S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
    static void delta_step(std::vector<double>& S, int d_k, int d_v, const float* q, const float* k, const float* v,
                           float g, float beta, float* o);

private:
    struct matrix {
        int64_t rows = 0, cols = 0;
        std::vector<float> w;  // [rows][cols]
        std::vector<float> apply(const std::vector<float>& x, int64_t row0 = 0, int64_t n = -1) const;
    };
    const matrix& load(const std::string& name) const;
    bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }
    std::vector<float> attention(int il, const std::vector<float>& xn, int pos);
    std::vector<float> delta_net(int il, int r, const std::vector<float>& xn);
    std::vector<float> moe(int il, const std::vector<float>& xn);

    const gguf::reader& f_;
    std::string arch_;
    int n_layer_, n_embd_, n_head_, n_head_kv_, head_dim_, n_rot_, n_expert_, n_used_, n_ff_, n_vocab_;
    int d_state_, n_k_, n_v_, kernel_;
    float eps_, freq_base_, w_scale_;
    std::vector<bool> recurrent_;
    mutable std::map<std::string, matrix> cache_;
    // Per sequence: each attention layer's keys and values, each DeltaNet layer's conv inputs and states.
    std::vector<std::vector<std::vector<float>>> k_cache_, v_cache_;   // [layer][pos][n_kv]
    std::vector<std::vector<std::vector<float>>> conv_hist_;            // [rec layer][kernel-1][conv_dim]
    std::vector<std::vector<std::vector<double>>> S_;                   // [rec layer][n_v][d_k * d_v]
    std::vector<std::vector<float>> hidden_;                           // [pos][n_embd] the last residual
    float min_margin_ = 0;
};

}  // namespace strata::testing
