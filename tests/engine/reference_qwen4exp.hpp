// A naive forward pass of qwen4exp for tests, written from transformers' modeling_qwen4_exp.py and
// sharing no code with the engine: f32 weights dequantized once, token by token, double accumulations.
// Hyper-connections (Qwen4ExpTextGatedResidual), the PLE block with its n-gram hashing over the whole
// token history (Qwen4ExpTextNGramEmbedding's shift-right-ignoring-EOS), gated DeltaNet with a sigmoid
// output gate, gated attention whose QSA indexer masks all but the chosen blocks, the MoE with its
// gated shared expert, and the output mixer before the LM head.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_reader.hpp"

namespace strata::testing {

class qwen4exp_reference {
public:
    explicit qwen4exp_reference(const gguf::reader& file);

    // Logits [n_vocab] after each token, fed one at a time from position 0 (fresh state).
    std::vector<std::vector<float>> logits(const std::vector<int32_t>& tokens);
    // The MTP block's draft logits at each position, after logits(tokens): position p fed token p and
    // the trunk's wide residual after p - 1 (zeros at 0), as llama.cpp's qwen4exp MTP graph computes it
    // (transformers has no MTP block): each stream hnorm-ed and projected by eh_proj with the normed
    // embedding, a trunk-style block with dense attention, the block's own output mixer, the LM head.
    std::vector<std::vector<float>> mtp_logits(const std::vector<int32_t>& tokens);
    float min_route_margin() const { return min_margin_; }
    // How many queries of the last logits() call attended to fewer positions than they could see.
    int sparse_queries() const { return sparse_queries_; }

private:
    struct matrix {
        int64_t rows = 0, cols = 0;
        std::vector<float> w;
        std::vector<float> apply(const std::vector<float>& x, int64_t row0 = 0, int64_t n = -1) const;
    };
    using vec = std::vector<float>;
    const matrix& load(const std::string& name) const;
    // Qwen4ExpTextGatedResidual over h [hc * n_embd]: the block input; inj (unless null) the stream weights.
    vec mixer(const std::string& prefix, const vec& h, vec* inj) const;
    vec grouped_rms(const vec& x, const vec& w) const;
    std::vector<int64_t> ngram_rows(const std::vector<int32_t>& history, size_t q) const;
    void ple(int il, const std::vector<int32_t>& tokens, size_t pos, vec& h);
    vec attention(int il, const vec& xn, int pos);
    vec delta_net(int il, int r, const vec& xn);
    vec moe(int il, const vec& xn);

    const gguf::reader& f_;
    int n_layer_, n_embd_, n_head_, n_head_kv_, head_dim_, n_rot_, n_expert_, n_used_, n_ff_;
    int d_state_, n_k_, n_v_, kernel_, hc_, idx_heads_, idx_dim_, idx_top_k_;
    int ple_layer_ = -1, ngram_ = 0, per_ngram_ = 0, ple_kernel_ = 0, ple_dim_ = 0;
    int64_t eos_ = 0;
    std::vector<int64_t> mult_, offset_, vocab_;
    std::vector<int> ratio_;
    float eps_, freq_base_;
    std::vector<bool> recurrent_;
    mutable std::map<std::string, matrix> cache_;
    std::vector<std::vector<vec>> k_cache_, v_cache_, idx_keys_;  // [layer][pos][..]
    std::vector<std::vector<vec>> conv_hist_;                      // [rec layer][kernel-1][conv_dim]
    std::vector<std::vector<std::vector<double>>> S_;              // [rec layer][n_v][d_k * d_v]
    std::vector<vec> ple_hist_;                                    // normed gated values of past tokens
    std::vector<vec> hidden_;                                      // [pos] the wide residual before the output mixer
    float min_margin_ = 0;
    int sparse_queries_ = 0;
};

}  // namespace strata::testing
