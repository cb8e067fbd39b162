// The MTP (next-token-prediction) block, as llama.cpp's MTP graphs compute it: eh_proj over
// [enorm(embedding) | hnorm(hidden)], the family's attention layer (qwen35moe: gated attention; glm4moe:
// plain attention; deepseek2: latent attention) with its MoE and shared expert, then shared_head_norm
// (or the output norm) and the output head. hnorm is fed the normed hidden state, as llama.cpp's graphs
// take it: the trunk's residual through the output norm, a chained draft's through the head norm.
// qwen4exp's block over the hc residual streams is forward_pass::mtp_qwen4 (qwen4exp_forward.cpp).
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "formats/quant.hpp"
#include "model/forward.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

std::string forward_pass::mtp_refusal() const {
    if (std::string why = residual_->mtp_refusal(); !why.empty()) return why;
    if (!w_.nextn_error.empty()) return "it could not be bound: " + w_.nextn_error;
    return fmt::format("not implemented for {}", hp_.arch.name);
}

void forward_pass::mtp(const int32_t* tokens, const float* h, int n_tok, int pos0, kv_cache& kv, float* h_out,
                       float* logits, bool all_logits, bool chained) {
    if (!mtp_moe_) throw std::logic_error("forward_pass::mtp: the model has no MTP block this pass can run");
    if (hp_.qwen4()) return mtp_qwen4(tokens, h, n_tok, pos0, kv, h_out, logits, all_logits);
    const nextn_weights& nw = w_.nextn[0];
    const layer_weights& l = nw.layer;
    const size_t n_embd = static_cast<size_t>(hp_.n_embd), nt = static_cast<size_t>(n_tok);
    kv.reserve(pos0 + n_tok);
    x_.resize(nt * n_embd);
    xn_.resize(nt * n_embd);
    q_.resize(nt * hp_.n_q());
    att_.resize(nt * std::max({hp_.n_q(), hp_.n_v(), hp_.ssm_value_dim()}));
    k_.resize(nt * hp_.n_kv());
    v_.resize(nt * hp_.n_kv());
    tmp_.resize(nt * n_embd);
    tmp2_.resize(nt * static_cast<size_t>(std::max({hp_.n_ff_shexp, hp_.n_ff, 1})));
    router_.resize(nt * hp_.n_expert);
    ids_.resize(nt * hp_.n_expert_used);
    weights_.resize(nt * hp_.n_expert_used);
    rope_cs_.resize(nt * static_cast<size_t>(hp_.n_rot));
    mtp_in_.resize(nt * 2 * n_embd);

    const float* head_norm = nw.shared_head_norm ? nw.shared_head_norm : w_.output_norm;
    const float* h_norm = chained ? head_norm : w_.output_norm;  // what normed the fed rows
    const cpu::matrix& embd = nw.embed_tokens.present() ? nw.embed_tokens.m : w_.tok_embd.m;
    for (size_t t = 0; t < nt; ++t) {
        cpu::rope_angles(hp_.n_rot, pos0 + static_cast<int>(t), hp_.rope, rope_cs_.data() + t * hp_.n_rot);
        float* in = mtp_in_.data() + t * 2 * n_embd;
        const auto* row = static_cast<const uint8_t*>(embd.data) + static_cast<size_t>(tokens[t]) * embd.row_stride;
        formats::dequantize_row(embd.type, row, tmp_.data(), hp_.n_embd);
        cpu::rms_norm(tmp_.data(), nw.enorm, hp_.rms_eps, hp_.n_embd, in);
        if (h) {
            cpu::rms_norm(h + t * n_embd, h_norm, hp_.rms_eps, hp_.n_embd, in + n_embd);
            cpu::rms_norm(in + n_embd, nw.hnorm, hp_.rms_eps, hp_.n_embd, in + n_embd);
        } else {
            std::fill_n(in + n_embd, n_embd, 0.0f);
        }
    }
    matmul(nw.eh_proj, n_tok, mtp_in_.data(), x_.data());

    for (size_t t = 0; t < nt; ++t)
        cpu::rms_norm(x_.data() + t * n_embd, l.attn_norm, hp_.rms_eps, hp_.n_embd, xn_.data() + t * n_embd);
    const step_segment seg{tokens, n_tok, pos0, &kv, nullptr, false, nullptr};
    mtp_mixer_->eval_weights(l, 0, std::span(&seg, 1), n_tok);
    matmul(l.wo, n_tok, att_.data(), tmp_.data());
    for (size_t i = 0; i < nt * n_embd; ++i) x_[i] += tmp_[i];
    for (size_t t = 0; t < nt; ++t)
        cpu::rms_norm(x_.data() + t * n_embd, l.ffn_norm, hp_.rms_eps, hp_.n_embd, xn_.data() + t * n_embd);
    moe(l, *mtp_moe_, mtp_moe_layers_, 0, nullptr, n_tok);
    for (size_t i = 0; i < nt * n_embd; ++i) x_[i] += tmp_[i];
    if (l.shexp_gate.present()) {
        shared_expert(l, n_tok);
        for (size_t i = 0; i < nt * n_embd; ++i) x_[i] += tmp_[i];
    }
    if (h_out) std::memcpy(h_out, x_.data(), sizeof(float) * nt * n_embd);
    if (!logits) return;
    const size_t first = all_logits ? 0 : nt - 1;
    for (size_t t = first; t < nt; ++t)
        cpu::rms_norm(x_.data() + t * n_embd, head_norm, hp_.rms_eps, hp_.n_embd, xn_.data() + (t - first) * n_embd);
    matmul(nw.shared_head_head.present() ? nw.shared_head_head : w_.output, static_cast<int>(nt - first), xn_.data(),
           logits);
}

}  // namespace strata::engine
