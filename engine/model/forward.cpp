#include "model/forward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "formats/quant.hpp"
#include "model/parallel.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

constexpr int64_t kDenseGrain = 16;  // rows per work item of a dense matmul

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Group-limited routing (DeepSeek-V2/V3): each group of n_expert / n_group experts is scored by the
// sum of its two best selection scores; every expert outside the n_used best groups drops to -inf.
// groups: scratch, [n_group] once filled.
void keep_best_groups(std::vector<float>& sel, int n_group, int n_used, std::vector<std::pair<float, int>>& groups) {
    const size_t per_group = sel.size() / static_cast<size_t>(n_group);
    groups.clear();
    for (int g = 0; g < n_group; ++g) {
        const float* s = sel.data() + static_cast<size_t>(g) * per_group;
        float best = -INFINITY, second = -INFINITY;
        for (size_t i = 0; i < per_group; ++i) {
            if (s[i] > best) {
                second = best;
                best = s[i];
            } else if (s[i] > second) {
                second = s[i];
            }
        }
        groups.emplace_back(best + second, g);
    }
    std::partial_sort(groups.begin(), groups.begin() + n_used, groups.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (size_t j = static_cast<size_t>(n_used); j < groups.size(); ++j)
        std::fill_n(sel.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(groups[j].second) * per_group),
                    per_group, -INFINITY);
}

uint64_t bytes_of(const weight_matrix& w) { return w.present() ? static_cast<uint64_t>(w.n_rows) * w.m.row_stride : 0; }

}  // namespace

void route_token(const float* logits, const float* bias, int n_expert, int k, const routing_options& o, int32_t* ids,
                 float* weights) {
    routing_scratch scratch;
    route_token(logits, bias, n_expert, k, o, ids, weights, scratch);
}

void route_token(const float* logits, const float* bias, int n_expert, int k, const routing_options& o, int32_t* ids,
                 float* weights, routing_scratch& scratch) {
    constexpr float kMinSum = 6.103515625e-5f;  // 2^-14, the smallest normal f16: llama.cpp's clamp
    std::vector<float>& p = scratch.p;
    p.assign(logits, logits + n_expert);
    if (o.gating == gating_func::softmax)
        cpu::softmax(p.data(), n_expert);
    else
        for (float& x : p) x = sigmoid(x);
    std::vector<float>& sel = scratch.sel;
    sel.assign(p.begin(), p.end());
    if (bias)
        for (int e = 0; e < n_expert; ++e) sel[static_cast<size_t>(e)] += bias[e];
    if (o.n_group > 1) keep_best_groups(sel, o.n_group, o.n_group_used, scratch.groups);
    std::vector<int32_t>& order = scratch.order;
    order.resize(static_cast<size_t>(n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return sel[a] > sel[b] || (sel[a] == sel[b] && a < b); });
    float sum = 0;
    for (int j = 0; j < k; ++j) {
        ids[j] = order[static_cast<size_t>(j)];
        weights[j] = p[static_cast<size_t>(order[static_cast<size_t>(j)])];
        sum += weights[j];
    }
    if (o.normalize)
        for (int j = 0; j < k; ++j) weights[j] /= std::max(sum, kMinSum);
    if (o.scale != 0.0f && o.scale != 1.0f)
        for (int j = 0; j < k; ++j) weights[j] *= o.scale;
}

void route_token(const float* logits, int n_expert, int k, bool normalize, int32_t* ids, float* weights) {
    route_token(logits, nullptr, n_expert, k, {gating_func::softmax, normalize, 0.0f}, ids, weights);
}

kv_cache make_sequence_state(const hparams& hp, int n_ctx, kv_type kv) {
    kv_cache c(hp.n_kv_layer(), n_ctx, hp.kv_heads(), hp.kv_head_dim(), kv, hp.mla());
    c.recurrent() = recurrent_state(hp);
    return c;
}

std::vector<arenas::moe_layer> moe_layers(const model_weights& w) {
    std::vector<arenas::moe_layer> layers;
    for (const auto& l : w.layers)
        if (l.router.present()) layers.push_back({l.gate, l.up, l.down});
    return layers;
}

forward_pass::forward_pass(arenas::expert_pool& pool, const hparams& hp, const model_weights& w,
                           const arenas::expert_rows& rows)
    : pool_(pool),
      hp_(hp),
      w_(w),
      moe_layers_(moe_layers(w)),
      moe_(pool, {hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used}, moe_layers_, rows),
      attn_(pool, hp),
      dnet_(pool, hp) {
    routing_.counts.assign(static_cast<size_t>(hp.n_layer) * hp.n_expert, 0);
    for (int il = 0, r = 0; il < hp.n_layer; ++il) rec_index_.push_back(hp.is_recurrent(il) ? r++ : -1);
    for (int il = 0, r = 0; il < hp.n_layer && hp.qwen4(); ++il)
        qsa_index_.push_back(hp.qsa_ratio[static_cast<size_t>(il)] > 0 ? r++ : -1);
    if (!w.nextn.empty() && w.nextn[0].layer.router.present() && (!hp.qwen4() || w.nextn[0].hc_head.present())) {
        const layer_weights& l = w.nextn[0].layer;
        mtp_moe_layers_.push_back({l.gate, l.up, l.down});
        mtp_rows_ = std::make_unique<arenas::mapped_expert_rows>(mtp_moe_layers_);
        mtp_moe_ = std::make_unique<arenas::moe_runner>(
            pool, arenas::moe_shape{hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used}, mtp_moe_layers_, *mtp_rows_);
    }
}

const char* phase_clock::name(int p) {
    static const char* const names[n_parts] = {"attention projections", "attention", "router", "experts: quantize",
                                               "experts: gate+up", "experts: down", "shared expert", "dense FFN",
                                               "output head", "PLE rows (cold table)",
                                               "other"};
    return p >= 0 && p < n_parts ? names[p] : "?";
}

void forward_pass::set_clock(phase_clock* clock) {
    clock_ = clock;
    moe_.set_phase_seconds(clock ? &clock->seconds[phase_clock::experts_quantize] : nullptr);
}

void forward_pass::matmul(const weight_matrix& w, int n_tok, const float* in, float* y) {
    const weight_matrix* const ws[] = {&w};
    float* const ys[] = {y};
    matmul_same_input(ws, n_tok, in, ys);
}

void forward_pass::matmul_same_input(std::span<const weight_matrix* const> w, int n_tok, const float* in,
                                     std::span<float* const> y) {
    const auto act_type = cpu::activation_type(w[0]->cpu().type);
    int64_t total = 0;
    bool fuse = true;
    for (const weight_matrix* m : w) {  // one matrix always runs as one phase
        fuse = fuse && cpu::activation_type(m->cpu().type) == act_type && m->cpu().n_cols == w[0]->cpu().n_cols &&
               (w.size() == 1 || m->n_rows % kDenseGrain == 0);
        total += m->n_rows;
    }
    if (!fuse) {
        for (size_t i = 0; i < w.size(); ++i) matmul(*w[i], n_tok, in, y[i]);
        return;
    }
    const cpu::matrix& m0 = w[0]->cpu();
    const size_t act_bytes = cpu::activation_row_size(m0.type, m0.n_cols);
    if (act_.size() < act_bytes * static_cast<size_t>(n_tok)) act_.resize(act_bytes * static_cast<size_t>(n_tok));
    for (int t = 0; t < n_tok; ++t)
        cpu::quantize_activation(m0.type, in + static_cast<size_t>(t) * m0.n_cols, act_.data() + t * act_bytes, m0.n_cols);
    // Rows of the matrices one after the other; a range is cut where one matrix ends.
    parallel_rows(pool_, total, kDenseGrain, [&](int64_t r0, int64_t r1) {
        int64_t first = 0;
        for (size_t i = 0; i < w.size() && r0 < r1; ++i) {
            const int64_t n = w[i]->n_rows;
            if (r0 < first + n) {
                const int64_t end = std::min(r1, first + n);
                cpu::matmul(w[i]->cpu(), r0 - first, end - first, act_.data(), act_bytes, n_tok, y[i] + (r0 - first), n);
                r0 = end;
            }
            first += n;
        }
    });
}

void forward_pass::eval(std::span<const int32_t> tokens, int pos0, kv_cache& kv, float* logits, bool all_logits,
                        int n_batch, float* hidden) {
    const int n = static_cast<int>(tokens.size());
    if (pos0 < 0 || int64_t{pos0} + n > kv.n_ctx())
        throw kv_cache_full(fmt::format("positions {}..{} do not fit the context of {}", pos0, int64_t{pos0} + n - 1,
                                        kv.n_ctx()));
    recurrent_state& rs = kv.recurrent();
    if (!rs.empty() && rs.pos() != pos0)
        throw std::logic_error(fmt::format("the recurrent state holds {} positions, the batch starts at {}", rs.pos(), pos0));
    kv.reserve(pos0 + n);
    const int every = rs.empty() ? 0 : checkpoint_interval_;
    for (int first = 0, n_tok = 0; first < n; first += n_tok) {
        n_tok = std::min(n_batch, n - first);
        if (every > 0) n_tok = std::min(n_tok, every - (pos0 + first) % every);
        const bool last = first + n_tok == n;
        float* out = nullptr;
        if (all_logits)
            out = logits + static_cast<size_t>(first) * hp_.n_vocab;
        else if (last)
            out = logits;
        eval_batch(tokens.data() + first, n_tok, pos0 + first, kv, out, all_logits,
                   hidden ? hidden + static_cast<size_t>(first) * hp_.residual_width() : nullptr);
        if (rs.empty()) continue;
        rs.set_pos(pos0 + first + n_tok);
        if (every > 0 && rs.pos() % every == 0) rs.checkpoint();
    }
}

void forward_pass::eval_step(std::span<const step_segment> segments, int n_batch) {
    if (!batches_sequences() || segments.size() == 1) {
        for (const step_segment& g : segments)
            eval(std::span(g.tokens, static_cast<size_t>(g.n_tok)), g.pos0, *g.kv, g.logits, g.all_logits, n_batch,
                 g.hidden);
        return;
    }
    for (const step_segment& g : segments) {
        if (g.pos0 < 0 || int64_t{g.pos0} + g.n_tok > g.kv->n_ctx())
            throw kv_cache_full(fmt::format("positions {}..{} do not fit the context of {}", g.pos0,
                                            int64_t{g.pos0} + g.n_tok - 1, g.kv->n_ctx()));
    }
    for (const step_segment& g : segments) g.kv->reserve(g.pos0 + g.n_tok);
    timed_layers(segments);
}

void forward_pass::eval_batch(const int32_t* tokens, int n_tok, int pos0, kv_cache& kv, float* logits,
                              bool all_logits, float* hidden) {
    const step_segment one{tokens, n_tok, pos0, &kv, logits, all_logits, hidden};
    timed_layers(std::span(&one, 1));
}

void forward_pass::timed_layers(std::span<const step_segment> segs) {
    double total = 0, parts_before = 0;
    if (clock_) {
        for (double x : clock_->seconds) parts_before += x;
        ++clock_->passes;
    }
    {
        arenas::scoped_seconds whole(clock_ ? &total : nullptr);
        eval_layers(segs);
    }
    if (clock_) {
        double parts = 0;
        for (double x : clock_->seconds) parts += x;
        clock_->seconds[phase_clock::other] += total - (parts - parts_before);
    }
}

void forward_pass::eval_layers(std::span<const step_segment> segs) {
    if (hp_.qwen4()) {  // one segment: a hybrid model's sequences are not batched (batches_sequences())
        const step_segment& g = segs[0];
        eval_layers_qwen4(g.tokens, g.n_tok, g.pos0, *g.kv, g.logits, g.all_logits, g.hidden);
        return;
    }
    int n_tok = 0;
    for (const step_segment& g : segs) n_tok += g.n_tok;
    const size_t n_embd = static_cast<size_t>(hp_.n_embd);
    const size_t nt = static_cast<size_t>(n_tok);
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

    // Every layer turns q and k by the same angles at a position: computed once per row.
    rope_cs_.resize(nt * static_cast<size_t>(hp_.n_rot));
    tok_.clear();
    for (const step_segment& g : segs)
        for (int t = 0; t < g.n_tok; ++t) {
            cpu::rope_angles(hp_.n_rot, g.pos0 + t, hp_.rope, rope_cs_.data() + tok_.size() * hp_.n_rot);
            tok_.push_back(g.tokens[t]);
        }

    const cpu::matrix& embd = w_.tok_embd.m;
    for (int t = 0; t < n_tok; ++t) {
        const auto* row = static_cast<const uint8_t*>(embd.data) + static_cast<size_t>(tok_[t]) * embd.row_stride;
        formats::dequantize_row(embd.type, row, x_.data() + t * n_embd, hp_.n_embd);
    }
    for (int il = 0; il < hp_.n_layer; ++il) {
        const layer_weights& l = w_.layers[static_cast<size_t>(il)];
        for (int t = 0; t < n_tok; ++t)
            cpu::rms_norm(x_.data() + t * n_embd, l.attn_norm, hp_.rms_eps, hp_.n_embd, xn_.data() + t * n_embd);
        // Latent attention and recurrent layers see one segment (eval_step runs them in turn).
        if (hp_.is_recurrent(il))
            delta_net(il, n_tok, segs[0].kv->recurrent());
        else if (hp_.mla())
            mla_attention(il, n_tok, segs[0].pos0, *segs[0].kv);
        else
            attention(il, segs, n_tok);
        {
            arenas::scoped_seconds t(seconds(phase_clock::attn_proj));
            matmul(l.wo, n_tok, att_.data(), tmp_.data());
        }
        add_bytes(phase_clock::attn_proj, bytes_of(l.wq) + bytes_of(l.wk) + bytes_of(l.wv) + bytes_of(l.wo) +
                                              bytes_of(l.wq_a) + bytes_of(l.wq_b) + bytes_of(l.wkv_a) +
                                              bytes_of(l.wqkv) + bytes_of(l.wz) + bytes_of(l.ssm_in) +
                                              bytes_of(l.ssm_beta) + bytes_of(l.ssm_alpha) + bytes_of(l.ssm_ba));
        for (size_t i = 0; i < nt * n_embd; ++i) x_[i] += tmp_[i];

        for (int t = 0; t < n_tok; ++t)
            cpu::rms_norm(x_.data() + t * n_embd, l.ffn_norm, hp_.rms_eps, hp_.n_embd, xn_.data() + t * n_embd);
        if (!hp_.is_moe_layer(il)) {
            arenas::scoped_seconds t(seconds(phase_clock::dense_ffn));
            add_bytes(phase_clock::dense_ffn, bytes_of(l.ffn_gate) + bytes_of(l.ffn_up) + bytes_of(l.ffn_down));
            ffn(l.ffn_gate, l.ffn_up, l.ffn_down, hp_.n_ff, n_tok);
            for (size_t i = 0; i < nt * n_embd; ++i) x_[i] += tmp_[i];
            continue;
        }
        moe(il, n_tok);
        for (size_t i = 0; i < nt * n_embd; ++i) x_[i] += tmp_[i];
        if (l.shexp_gate.present()) {
            arenas::scoped_seconds t(seconds(phase_clock::shared_expert));
            add_bytes(phase_clock::shared_expert, bytes_of(l.shexp_gate) + bytes_of(l.shexp_up) + bytes_of(l.shexp_down));
            shared_expert(il, n_tok);
            for (size_t i = 0; i < nt * n_embd; ++i) x_[i] += tmp_[i];
        }
    }
    for (size_t row = 0; const step_segment& g : segs) {
        if (g.hidden) std::memcpy(g.hidden, x_.data() + row * n_embd, sizeof(float) * n_embd * static_cast<size_t>(g.n_tok));
        row += static_cast<size_t>(g.n_tok);
    }
    output_head(segs);
}

void forward_pass::output_head(std::span<const step_segment> segs) {
    const size_t n_embd = static_cast<size_t>(hp_.n_embd), n_vocab = static_cast<size_t>(hp_.n_vocab);
    // The rows that want logits, packed at the front of xn_ (a row's slot never runs ahead of it).
    int n_out = 0;
    for (int row = 0; const step_segment& g : segs) {
        const int first = g.all_logits ? 0 : g.n_tok - 1;
        if (g.logits)
            for (int t = first; t < g.n_tok; ++t, ++n_out)
                cpu::rms_norm(x_.data() + static_cast<size_t>(row + t) * n_embd, w_.output_norm, hp_.rms_eps,
                              hp_.n_embd, xn_.data() + static_cast<size_t>(n_out) * n_embd);
        row += g.n_tok;
    }
    if (n_out == 0) return;
    arenas::scoped_seconds t_head(seconds(phase_clock::head));
    add_bytes(phase_clock::head, bytes_of(w_.output));
    if (segs.size() == 1) {
        matmul(w_.output, n_out, xn_.data(), segs[0].logits);
        return;
    }
    head_out_.resize(static_cast<size_t>(n_out) * n_vocab);
    matmul(w_.output, n_out, xn_.data(), head_out_.data());
    for (size_t done = 0; const step_segment& g : segs) {
        if (!g.logits) continue;
        const size_t n = g.all_logits ? static_cast<size_t>(g.n_tok) : 1;
        std::memcpy(g.logits, head_out_.data() + done * n_vocab, n * n_vocab * sizeof(float));
        done += n;
    }
}

void forward_pass::attention(int il, std::span<const step_segment> segs, int n_tok) {
    attention(w_.layers[static_cast<size_t>(il)], hp_.kv_layer(il), segs, n_tok);
}

void forward_pass::attention(const layer_weights& l, int kvl, std::span<const step_segment> segs, int n_tok) {
    const int hd = hp_.head_dim, n_q = hp_.n_q(), n_kv = hp_.n_kv();
    const bool gated = hp_.attn_gate();
    if (gated) {
        qg_.resize(static_cast<size_t>(n_tok) * 2 * n_q);
        gate_.resize(static_cast<size_t>(n_tok) * n_q);
    }
    {
        arenas::scoped_seconds t(seconds(phase_clock::attn_proj));
        const weight_matrix* const w[] = {&l.wq, &l.wk, &l.wv};
        float* const y[] = {gated ? qg_.data() : q_.data(), k_.data(), v_.data()};
        matmul_same_input(w, n_tok, xn_.data(), y);
    }
    if (gated)  // per head [query | gate] -> q_, gate_
        for (size_t t = 0; t < static_cast<size_t>(n_tok); ++t)
            for (int h = 0; h < hp_.n_head; ++h) {
                const float* src = qg_.data() + (t * hp_.n_head + h) * 2 * hd;
                std::memcpy(q_.data() + t * n_q + static_cast<size_t>(h) * hd, src, sizeof(float) * hd);
                std::memcpy(gate_.data() + t * n_q + static_cast<size_t>(h) * hd, src + hd, sizeof(float) * hd);
            }
    arenas::scoped_seconds t(seconds(phase_clock::attention));
    for (int row0 = 0; const step_segment& g : segs) {
        kv_cache& kv = *g.kv;
        add_bytes(phase_clock::attention, kv_cache::bytes_per_token(1, hp_.n_head_kv, hd, kv.type()) *
                                              static_cast<uint64_t>(g.pos0 + g.n_tok));
        for (int t = row0; t < row0 + g.n_tok; ++t) {
            float* q = q_.data() + static_cast<size_t>(t) * n_q;
            float* k = k_.data() + static_cast<size_t>(t) * n_kv;
            float* v = v_.data() + static_cast<size_t>(t) * n_kv;
            if (l.bq)
                for (int i = 0; i < n_q; ++i) q[i] += l.bq[i];
            if (l.bk)
                for (int i = 0; i < n_kv; ++i) k[i] += l.bk[i];
            if (l.bv)
                for (int i = 0; i < n_kv; ++i) v[i] += l.bv[i];
            if (l.q_norm) {
                for (int h = 0; h < hp_.n_head; ++h) cpu::rms_norm(q + h * hd, l.q_norm, hp_.rms_eps, hd, q + h * hd);
                for (int h = 0; h < hp_.n_head_kv; ++h) cpu::rms_norm(k + h * hd, l.k_norm, hp_.rms_eps, hd, k + h * hd);
            }
            const float* cs = rope_cs_.data() + static_cast<size_t>(t) * hp_.n_rot;
            cpu::rope_apply(q, hp_.n_head, hd, hp_.n_rot, cs, hp_.arch.rope);
            cpu::rope_apply(k, hp_.n_head_kv, hd, hp_.n_rot, cs, hp_.arch.rope);
            kv.store(kvl, g.pos0 + t - row0, k, v);
        }
        if (!qsa_only_)
            attn_.run(kv, kvl, q_.data() + static_cast<size_t>(row0) * n_q, g.n_tok, g.pos0,
                      att_.data() + static_cast<size_t>(row0) * n_q);
        row0 += g.n_tok;
    }
    if (gated)
        for (size_t i = 0; i < static_cast<size_t>(n_tok) * n_q; ++i) att_[i] *= sigmoid(gate_[i]);
}

void forward_pass::delta_net(int il, int n_tok, recurrent_state& state) {
    const layer_weights& l = w_.layers[static_cast<size_t>(il)];
    const size_t nt = static_cast<size_t>(n_tok), n_v = static_cast<size_t>(hp_.ssm_n_v_head);
    const size_t conv_dim = static_cast<size_t>(hp_.ssm_conv_dim()), value_dim = static_cast<size_t>(hp_.ssm_value_dim());
    dn_in_.resize(nt * (conv_dim + value_dim));
    dn_z_.resize(nt * value_dim);
    dn_b_.resize(nt * n_v);
    dn_a_.resize(nt * n_v);
    {
        arenas::scoped_seconds t(seconds(phase_clock::attn_proj));
        if (l.ssm_in.present()) {  // qwen3next's older files: one interleaved projection
            qg_.resize(nt * (conv_dim + value_dim));
            dn_ba_.resize(nt * 2 * n_v);
            const weight_matrix* const w[] = {&l.ssm_in, &l.ssm_ba};
            float* const y[] = {qg_.data(), dn_ba_.data()};
            matmul_same_input(w, n_tok, xn_.data(), y);
            delta_net_mixer::split_ssm_in(hp_, qg_.data(), n_tok, dn_in_.data(), dn_z_.data());
        } else if (l.ssm_ba.present()) {
            dn_ba_.resize(nt * 2 * n_v);
            const weight_matrix* const w[] = {&l.wqkv, &l.wz, &l.ssm_ba};
            float* const y[] = {dn_in_.data(), dn_z_.data(), dn_ba_.data()};
            matmul_same_input(w, n_tok, xn_.data(), y);
        } else {
            const weight_matrix* const w[] = {&l.wqkv, &l.wz, &l.ssm_beta, &l.ssm_alpha};
            float* const y[] = {dn_in_.data(), dn_z_.data(), dn_b_.data(), dn_a_.data()};
            matmul_same_input(w, n_tok, xn_.data(), y);
        }
        if (l.ssm_ba.present()) delta_net_mixer::split_ba(hp_, dn_ba_.data(), n_tok, dn_b_.data(), dn_a_.data());
    }
    arenas::scoped_seconds t(seconds(phase_clock::attention));
    add_bytes(phase_clock::attention, 2 * state.bytes() / static_cast<uint64_t>(std::max(1, state.n_layer())));
    dnet_.run(l, rec_index_[static_cast<size_t>(il)], state, n_tok, dn_in_.data(), dn_z_.data(), dn_b_.data(),
              dn_a_.data(), att_.data());
}

void forward_pass::moe(int il, int n_tok) {
    moe(w_.layers[static_cast<size_t>(il)], moe_, moe_layers_, il - hp_.n_layer_dense_lead,
        routing_.counts.data() + static_cast<size_t>(il) * hp_.n_expert, n_tok);
}

void forward_pass::moe(const layer_weights& l, arenas::moe_runner& runner, const std::vector<arenas::moe_layer>& layers,
                       int moe_il, uint64_t* counts, int n_tok) {
    const int k = hp_.n_expert_used;
    const routing_options ro{hp_.gating, hp_.expert_weights_norm, hp_.expert_weights_scale, hp_.n_expert_groups,
                             hp_.n_group_used};
    std::optional<arenas::scoped_seconds> t;
    t.emplace(seconds(phase_clock::router));
    add_bytes(phase_clock::router, bytes_of(l.router));
    matmul(l.router, n_tok, xn_.data(), router_.data());
    for (int t = 0; t < n_tok; ++t) {
        route_token(router_.data() + static_cast<size_t>(t) * hp_.n_expert, l.exp_probs_b, hp_.n_expert, k, ro,
                    ids_.data() + t * k, weights_.data() + t * k, route_scratch_);
        if (counts)
            for (int j = 0; j < k; ++j) ++counts[ids_[static_cast<size_t>(t * k + j)]];
    }
    t.reset();
    runner.run(moe_il, n_tok, xn_.data(), ids_.data(), weights_.data(), tmp_.data());
    const arenas::moe_layer& e = layers[static_cast<size_t>(moe_il)];
    const uint64_t n = runner.n_active();
    add_bytes(phase_clock::experts_gate_up, n * (static_cast<uint64_t>(e.gate.n_rows) * e.gate.row_stride +
                                                 static_cast<uint64_t>(e.up.n_rows) * e.up.row_stride));
    add_bytes(phase_clock::experts_down, n * static_cast<uint64_t>(e.down.n_rows) * e.down.row_stride);
}

void forward_pass::ffn(const weight_matrix& gate, const weight_matrix& up, const weight_matrix& down, int n_ff,
                       int n_tok) {
    const size_t nf = static_cast<size_t>(n_ff);
    shexp_up_.resize(static_cast<size_t>(n_tok) * nf);
    const weight_matrix* const w[] = {&gate, &up};
    float* const y[] = {tmp2_.data(), shexp_up_.data()};
    matmul_same_input(w, n_tok, xn_.data(), y);
    for (int t = 0; t < n_tok; ++t)
        cpu::silu_mul(tmp2_.data() + t * nf, shexp_up_.data() + t * nf, static_cast<int64_t>(nf), tmp2_.data() + t * nf);
    matmul(down, n_tok, tmp2_.data(), tmp_.data());
}

void forward_pass::shared_expert(int il, int n_tok) { shared_expert(w_.layers[static_cast<size_t>(il)], n_tok); }

void forward_pass::shared_expert(const layer_weights& l, int n_tok) {
    const size_t n_embd = static_cast<size_t>(hp_.n_embd);
    ffn(l.shexp_gate, l.shexp_up, l.shexp_down, hp_.n_ff_shexp, n_tok);
    if (!l.shexp_gate_inp) return;
    for (int t = 0; t < n_tok; ++t) {
        const float* xn = xn_.data() + t * n_embd;
        float dot = 0;
        for (size_t i = 0; i < n_embd; ++i) dot += l.shexp_gate_inp[i] * xn[i];
        const float gate = sigmoid(dot);
        for (size_t i = 0; i < n_embd; ++i) tmp_[t * n_embd + i] *= gate;
    }
}

}  // namespace strata::engine
