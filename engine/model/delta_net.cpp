#include "model/delta_net.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <spdlog/fmt/fmt.h>

#include "cpu/delta_net.hpp"
#include "cpu/kernels.hpp"
#include "model/forward.hpp"
#include "model/parallel.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

// Every token through the sequential form: the same bits for any split of a sequence into calls, so a
// state restored from a checkpoint or a snapshot continues exactly as an uninterrupted one; on the CPU
// it is also the faster form (kernels/cpu/delta_net.hpp, docs/ARCHITECTURE.md).
constexpr int kChunk = 0;
// Channels per work item of the causal conv.
constexpr int64_t kConvGrain = 256;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // ggml's threshold
float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

delta_net_mixer::delta_net_mixer(arenas::expert_pool& pool, const hparams& hp) : pool_(pool), hp_(hp) {}

void delta_net_mixer::run(const layer_weights& l, int r, recurrent_state& state, int n_tok, float* qkv, const float* z,
                          const float* b, const float* a, float* out) {
    const int dk = hp_.ssm_d_state, n_k = hp_.ssm_n_k_head, n_v = hp_.ssm_n_v_head, conv_dim = hp_.ssm_conv_dim();
    const int key_dim = hp_.ssm_key_dim(), value_dim = hp_.ssm_value_dim();
    const size_t nt = static_cast<size_t>(n_tok);
    conv_out_.resize(nt * static_cast<size_t>(conv_dim));
    g_.resize(nt * static_cast<size_t>(n_v));
    beta_.resize(nt * static_cast<size_t>(n_v));
    const int64_t pos0 = state.pos();
    // A speculative verification keeps the state after each token (recurrent_state::start_trace).
    const bool trace = state.traced(static_cast<int>(pos0), state.conv(r)) != nullptr;
    const size_t hist = static_cast<size_t>(hp_.ssm_conv_kernel - 1) * static_cast<size_t>(conv_dim);
    if (trace) conv_prev_.assign(state.conv(r), state.conv(r) + hist);
    // Channels split between the workers (each channel's sums are the same however they are split).
    parallel_rows(pool_, conv_dim, kConvGrain, [&](int64_t c0, int64_t c1) {
        cpu::causal_conv1d_silu(state.conv(r) + c0, qkv + c0, conv_dim, l.ssm_conv1d + c0 * hp_.ssm_conv_kernel, n_tok,
                                static_cast<int>(c1 - c0), hp_.ssm_conv_kernel, conv_out_.data() + c0, conv_dim,
                                conv_dim);
    });
    if (trace) trace_conv(state, r, n_tok, qkv);
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (size_t t = 0; t < nt; ++t) {
        float* row = conv_out_.data() + t * conv_dim;
        cpu::l2_normalize_rows(row, n_k, dk, dk, hp_.rms_eps, q_scale);
        cpu::l2_normalize_rows(row + key_dim, n_k, dk, dk, hp_.rms_eps, 1.0f);
        for (int h = 0; h < n_v; ++h) {
            const size_t i = t * n_v + static_cast<size_t>(h);
            beta_[i] = sigmoid(b[i]);
            g_[i] = l.ssm_a[h] * softplus(a[i] + l.ssm_dt_bias[h]);
        }
    }
    const int group = n_v / n_k;
    float* S0 = state.ssm(r);
    const size_t scratch_floats = kChunk > 0 ? (cpu::delta_rule_chunked_scratch(dk, dk, kChunk) + 15) / 16 * 16 : 0;
    float* scratch0 = grown(scratch_, scratch_floats * n_v);
    parallel_rows(pool_, n_v, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
            const int kh = hp_.ssm_v_tiled ? static_cast<int>(h % n_k) : static_cast<int>(h / group);
            const float* q = conv_out_.data() + static_cast<size_t>(kh) * dk;
            const float* k = q + key_dim;
            const float* v = conv_out_.data() + 2 * static_cast<size_t>(key_dim) + static_cast<size_t>(h) * dk;
            float* S = S0 + static_cast<size_t>(h) * dk * dk;
            float* o = out + static_cast<size_t>(h) * dk;
            float* scratch = scratch0 + static_cast<size_t>(h) * scratch_floats;
            if (!trace) {
                cpu::delta_rule_run(S, pos0, dk, dk, n_tok, q, conv_dim, k, conv_dim, v, conv_dim, g_.data() + h, n_v,
                                    beta_.data() + h, n_v, o, value_dim, kChunk, scratch);
            } else {
                // Token by token (the sequential form gives the same bits), copying the state after each.
                for (size_t t = 0; t < nt; ++t) {
                    const size_t in = t * static_cast<size_t>(conv_dim), gi = t * static_cast<size_t>(n_v);
                    cpu::delta_rule_run(S, pos0 + static_cast<int64_t>(t), dk, dk, 1, q + in, conv_dim, k + in, conv_dim,
                                        v + in, conv_dim, g_.data() + h + gi, n_v, beta_.data() + h + gi, n_v,
                                        o + t * value_dim, value_dim, kChunk, scratch);
                    if (float* copy = state.traced(static_cast<int>(pos0 + static_cast<int64_t>(t)), S))
                        std::memcpy(copy, S, sizeof(float) * static_cast<size_t>(dk) * dk);
                }
            }
            for (size_t t = 0; t < nt; ++t) {
                float* ot = o + t * value_dim;
                const float* zt = z + t * value_dim + static_cast<size_t>(h) * dk;
                cpu::rms_norm(ot, l.ssm_norm, hp_.rms_eps, dk, ot);
                if (hp_.ssm_gate_sigmoid)
                    for (int i = 0; i < dk; ++i) ot[i] *= 1.0f / (1.0f + std::exp(-zt[i]));
                else
                    for (int i = 0; i < dk; ++i) ot[i] *= silu(zt[i]);
            }
        }
    });
}

void delta_net_mixer::split_ssm_in(const hparams& hp, const float* in, int n_tok, float* qkv, float* z) {
    const size_t dk = static_cast<size_t>(hp.ssm_d_state), n_k = static_cast<size_t>(hp.ssm_n_k_head);
    const size_t per_k = static_cast<size_t>(hp.ssm_n_v_head) / n_k * dk;  // one key head's v (or z) width
    const size_t key_dim = n_k * dk, conv_dim = static_cast<size_t>(hp.ssm_conv_dim());
    const size_t value_dim = static_cast<size_t>(hp.ssm_value_dim()), in_row = conv_dim + value_dim;
    for (size_t t = 0; t < static_cast<size_t>(n_tok); ++t) {
        const float* src = in + t * in_row;
        float* dst = qkv + t * conv_dim;
        for (size_t h = 0; h < n_k; ++h) {
            const float* s = src + h * (2 * dk + 2 * per_k);
            std::memcpy(dst + h * dk, s, dk * sizeof(float));
            std::memcpy(dst + key_dim + h * dk, s + dk, dk * sizeof(float));
            std::memcpy(dst + 2 * key_dim + h * per_k, s + 2 * dk, per_k * sizeof(float));
            std::memcpy(z + t * value_dim + h * per_k, s + 2 * dk + per_k, per_k * sizeof(float));
        }
    }
}

void delta_net_mixer::split_ba(const hparams& hp, const float* ba, int n_tok, float* b, float* a) {
    const size_t n_v = static_cast<size_t>(hp.ssm_n_v_head), n_k = static_cast<size_t>(hp.ssm_n_k_head);
    const size_t group = n_v / n_k;
    for (size_t t = 0; t < static_cast<size_t>(n_tok); ++t)
        for (size_t h = 0; h < n_k; ++h)
            for (size_t j = 0; j < group; ++j) {
                b[t * n_v + h * group + j] = ba[t * 2 * n_v + h * 2 * group + j];
                a[t * n_v + h * group + j] = ba[t * 2 * n_v + h * 2 * group + group + j];
            }
}

void delta_net_mixer::trace_conv(recurrent_state& state, int r, int n_tok, const float* qkv) const {
    // The conv state after token t: the last kernel - 1 rows of [the state before the call | the inputs 0..t].
    const int rows = hp_.ssm_conv_kernel - 1;
    const size_t conv_dim = static_cast<size_t>(hp_.ssm_conv_dim());
    for (int t = 0; t < n_tok; ++t) {
        float* copy = state.traced(state.pos() + t, state.conv(r));
        if (!copy) continue;
        for (int j = 0; j < rows; ++j) {
            const int i = t + 1 + j;  // index into [previous rows | inputs]
            const float* src = i < rows ? conv_prev_.data() + static_cast<size_t>(i) * conv_dim
                                        : qkv + static_cast<size_t>(i - rows) * conv_dim;
            std::memcpy(copy + static_cast<size_t>(j) * conv_dim, src, conv_dim * sizeof(float));
        }
    }
}

namespace {

// Its part of the state: the recurrent state of every DeltaNet layer (conv + SSM), checkpointed.
class delta_net_kind final : public mixer_kind {
public:
    const char* name() const override { return "gated DeltaNet"; }
    kv_rows rows(const hparams& hp) const override {
        (void)hp;
        return {};
    }
    bool recurrent() const override { return true; }
    std::string gpu_unsupported(const hparams& hp) const override {
        return fmt::format("the GPU hybrid does not run {}'s gated DeltaNet layers and their recurrent state yet",
                           hp.arch.name);
    }
    std::unique_ptr<state_part> make_state(const hparams& hp) const override {
        return std::make_unique<recurrent_state>(hp);
    }
    size_t state_bytes(const hparams& hp) const override { return recurrent_state_bytes(hp); }
};

}  // namespace

const mixer_kind& gated_delta_net::layer_kind() {
    static const delta_net_kind k;
    return k;
}

gated_delta_net::gated_delta_net(forward_pass& f) : token_mixer(f), kernel_(f.pool_, f.hp_) {
    for (int il = 0, r = 0; il < f.hp_.n_layer; ++il) rec_index_.push_back(f.hp_.is_recurrent(il) ? r++ : -1);
}

void gated_delta_net::eval(int il, std::span<const step_segment> segs, int n_tok) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const layer_weights& l = f.w_.layers[static_cast<size_t>(il)];
    const size_t nt = static_cast<size_t>(n_tok), n_v = static_cast<size_t>(hp.ssm_n_v_head);
    const size_t conv_dim = static_cast<size_t>(hp.ssm_conv_dim()), value_dim = static_cast<size_t>(hp.ssm_value_dim());
    dn_in_.resize(nt * (conv_dim + value_dim));
    dn_z_.resize(nt * value_dim);
    dn_b_.resize(nt * n_v);
    dn_a_.resize(nt * n_v);
    {
        arenas::scoped_seconds t(f.seconds(phase_clock::attn_proj));
        if (l.ssm_in.present()) {  // qwen3next's older files: one interleaved projection
            in_.resize(nt * (conv_dim + value_dim));
            dn_ba_.resize(nt * 2 * n_v);
            const weight_matrix* const w[] = {&l.ssm_in, &l.ssm_ba};
            float* const y[] = {in_.data(), dn_ba_.data()};
            f.matmul_same_input(w, n_tok, f.xn_.data(), y);
            delta_net_mixer::split_ssm_in(hp, in_.data(), n_tok, dn_in_.data(), dn_z_.data());
        } else if (l.ssm_ba.present()) {
            dn_ba_.resize(nt * 2 * n_v);
            const weight_matrix* const w[] = {&l.wqkv, &l.wz, &l.ssm_ba};
            float* const y[] = {dn_in_.data(), dn_z_.data(), dn_ba_.data()};
            f.matmul_same_input(w, n_tok, f.xn_.data(), y);
        } else {
            const weight_matrix* const w[] = {&l.wqkv, &l.wz, &l.ssm_beta, &l.ssm_alpha};
            float* const y[] = {dn_in_.data(), dn_z_.data(), dn_b_.data(), dn_a_.data()};
            f.matmul_same_input(w, n_tok, f.xn_.data(), y);
        }
        if (l.ssm_ba.present()) delta_net_mixer::split_ba(hp, dn_ba_.data(), n_tok, dn_b_.data(), dn_a_.data());
    }
    arenas::scoped_seconds t(f.seconds(phase_clock::attention));
    const int r = rec_index_[static_cast<size_t>(il)];
    for (size_t row = 0; const step_segment& g : segs) {
        recurrent_state& state = g.kv->state<recurrent_state>();
        f.add_bytes(phase_clock::attention, 2 * state.bytes() / static_cast<uint64_t>(std::max(1, state.n_layer())));
        kernel_.run(l, r, state, g.n_tok, dn_in_.data() + row * conv_dim, dn_z_.data() + row * value_dim,
                    dn_b_.data() + row * n_v, dn_a_.data() + row * n_v, f.att_.data() + row * value_dim);
        row += static_cast<size_t>(g.n_tok);
    }
}

}  // namespace strata::engine
