// A deliberately naive forward pass for tests: f32 everywhere, weights dequantized once, plain loops,
// written from llama.cpp's definition of each architecture and sharing no code with the engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_reader.hpp"

namespace strata::testing {

// RoPE scaling read from the file: linear when not yarn (factor 1: none).
struct rope_scaling {
    bool yarn = false;
    double factor = 1;       // angles divided by this
    double n_ctx_orig = 0;   // yarn: the context before scaling
    double attn_factor = 1;  // on cos and sin
};

class reference_model {
public:
    explicit reference_model(const gguf::reader& file);

    // Experts chosen elsewhere, [position][layer] in any order, and the layer margin (see
    // route_layer_margins()) at or below which the reference takes them over its own choice.
    struct routes {
        std::vector<std::vector<std::vector<int>>> ids;
        float tie_margin = 0;
    };
    // Logits [n_vocab] after each token of `tokens`, fed one at a time from position 0. With `follow`,
    // a near-tie is settled as the engine settled it: under sigmoid gating with a correction bias the
    // two sides of a tie weigh the outputs differently, and taking the other side would move every
    // later position through the KV cache.
    std::vector<std::vector<float>> logits(const std::vector<int32_t>& tokens, const routes* follow = nullptr);
    int n_vocab() const { return n_vocab_; }
    // glm4moe, deepseek2: the MTP block's logits (blk.n_layer) after logits(tokens), as llama.cpp's MTP graph
    // computes them: position p fed token p and the trunk's hidden state at p - 1 through the output norm
    // (nothing at 0), the block keeping its own cache. mtp_chain: one more position, fed token and the
    // block's last output residual through the head norm (a chained draft), continuing that cache.
    std::vector<std::vector<float>> mtp_logits(const std::vector<int32_t>& tokens);
    std::vector<float> mtp_chain(int32_t token, size_t pos);
    // Per position of the last logits() call: the smallest gap, over layers, between the router logits
    // of the k-th and the (k+1)-th expert (log of their probability ratio; under sigmoid gating, the
    // least change of router logits that swaps a chosen expert for another). Near zero, a rounding
    // difference can pick the other expert, and the logits may then legitimately differ.
    const std::vector<float>& route_margins() const { return margins_; }
    // Per position, per layer: the margin above for that layer alone (huge for a dense layer), and
    // whether the score-correction bias (exp_probs_b) changed the experts chosen.
    const std::vector<std::vector<float>>& route_layer_margins() const { return layer_margins_; }
    const std::vector<std::vector<bool>>& route_bias_changed() const { return bias_changed_; }
    // Per position, per layer: whether group-limited routing (expert_group_count) changed the experts
    // chosen, against a top-k over every expert.
    const std::vector<std::vector<bool>>& route_group_changed() const { return group_changed_; }
    // Per position, per layer: the experts the reference itself chose, in order (none for a leading
    // dense layer).
    const std::vector<std::vector<std::vector<int>>>& route_ids() const { return ids_; }
    // (position, layer) pairs of the last logits() call that took `follow`'s experts over its own.
    int followed() const { return followed_; }

private:
    struct matrix {
        int64_t rows = 0, cols = 0;
        std::vector<float> w;  // [rows][cols]
        std::vector<float> apply(const std::vector<float>& x) const;
    };
    const matrix& load(const std::string& name) const;
    std::vector<float> vec(const std::string& name) const;
    std::vector<float> ffn(const matrix& gate, const matrix& up, const matrix& down, const std::vector<float>& x) const;
    matrix expert(const std::string& merged, const std::string& split_fmt, int e, bool down) const;
    // deepseek2's attention for one position, decompressed (no absorption): K and V of every head
    // rebuilt from each position's latent; kcache/vcache gain this position's [n_head][...] rows.
    std::vector<float> latent_attention(const std::string& b, const std::vector<float>& xn, size_t pos,
                                        std::vector<std::vector<float>>& kcache, std::vector<std::vector<float>>& vcache);
    // Masks (to -inf) the experts outside the n_group_used best groups; returns the least gap, in
    // router-logit units, between a kept group's score and a dropped one's.
    float mask_groups(std::vector<float>& sel, const std::vector<float>& p) const;
    void read_deepseek2(const gguf::reader& f, const std::string& p);
    // Layer il (n_layer_: the MTP block) on x at pos, over kcache_/vcache_[il]; routing recorded for il < n_layer_.
    void block(int il, std::vector<float>& x, size_t pos, const routes* follow, float& margin);
    std::vector<float> mtp_row(int32_t token, const std::vector<float>* h, const std::string& h_norm, size_t pos);
    std::string mtp_head_norm() const;
    std::vector<std::vector<std::vector<float>>> kcache_, vcache_;  // [layer][position]
    std::vector<std::vector<float>> hidden_;  // the trunk's last residual per position
    std::vector<float> mtp_out_;              // the MTP block's last output residual

    const gguf::reader& f_;
    std::string arch_;
    int n_layer_, n_embd_, n_head_, n_head_kv_, head_dim_, n_rot_, n_expert_, n_used_, n_ff_, n_vocab_;
    int n_dense_ = 0;            // leading dense layers (glm4moe, deepseek2)
    // deepseek2: latent attention and group-limited routing.
    bool mla_ = false;
    int n_lora_kv_ = 0, head_dim_v_ = 0, n_group_ = 0, n_group_used_ = 0;
    double kq_scale_ = 0;        // 0: 1 / sqrt(head_dim)
    std::vector<std::vector<bool>> group_changed_;
    bool sigmoid_ = false;       // expert_gating_func 2
    bool norm_w_ = false;        // expert_weights_norm
    float scale_w_ = 0;          // expert_weights_scale
    std::vector<std::vector<bool>> bias_changed_;
    std::vector<std::vector<float>> layer_margins_;
    int followed_ = 0;
    float eps_, freq_base_;
    rope_scaling scaling_;
    mutable std::map<std::string, matrix> dequantized_;  // load()'s cache, by tensor name
    std::vector<float> margins_;
    std::vector<std::vector<std::vector<int>>> ids_;
};

}  // namespace strata::testing
