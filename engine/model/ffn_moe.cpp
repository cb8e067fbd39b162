// The MoE FFN kind: the router and top-k (route_token: softmax or sigmoid scores, bias, groups), the
// routed experts on the pool (expert_pool's moe_runner), then the shared expert where the layer has one.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "model/forward.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

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

void moe_ffn::eval(int il, int n_tok, residual_stream& out) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const layer_weights& l = f.w_.layers[static_cast<size_t>(il)];
    experts(l, f.moe_, f.moe_layers_, il - hp.n_layer_dense_lead,
            f.routing_.counts.data() + static_cast<size_t>(il) * hp.n_expert, n_tok);
    out.add(f.tmp_.data(), true, n_tok);
    if (!l.shexp_gate.present()) return;
    arenas::scoped_seconds t(f.seconds(phase_clock::shared_expert));
    f.add_bytes(phase_clock::shared_expert, l.shexp_gate.bytes() + l.shexp_up.bytes() + l.shexp_down.bytes());
    shared_expert(l, n_tok);
    out.add(f.tmp_.data(), false, n_tok);
}

void moe_ffn::experts(const layer_weights& l, arenas::moe_runner& runner, const std::vector<arenas::moe_layer>& layers,
                      int moe_il, uint64_t* counts, int n_tok) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const int k = hp.n_expert_used;
    const routing_options ro{hp.gating, hp.expert_weights_norm, hp.expert_weights_scale, hp.n_expert_groups,
                             hp.n_group_used};
    std::optional<arenas::scoped_seconds> t;
    f.add_bytes(phase_clock::router, l.router.bytes());
    if (l.shexp_gate.present() && l.shexp_up.present()) {
        // The shared expert's gate and up read the router's input: one phase for the three, its time
        // shared between the two parts by bytes.
        f.shexp_up_.resize(static_cast<size_t>(n_tok) * static_cast<size_t>(hp.n_ff_shexp));
        const weight_matrix* const w[] = {&l.router, &l.shexp_gate, &l.shexp_up};
        float* const y[] = {f.router_.data(), f.tmp2_.data(), f.shexp_up_.data()};
        double seconds = 0;
        {
            arenas::scoped_seconds fused(f.seconds(phase_clock::router) ? &seconds : nullptr);
            f.matmul_same_input(w, n_tok, f.xn_.data(), y);
        }
        if (double* router_s = f.seconds(phase_clock::router)) {
            const double rb = double(l.router.bytes()), sb = double(l.shexp_gate.bytes() + l.shexp_up.bytes());
            *router_s += seconds * rb / (rb + sb);
            *f.seconds(phase_clock::shared_expert) += seconds * sb / (rb + sb);
        }
        shexp_gate_up_of_ = &l;
        t.emplace(f.seconds(phase_clock::router));
    } else {
        t.emplace(f.seconds(phase_clock::router));
        f.matmul(l.router, n_tok, f.xn_.data(), f.router_.data());
    }
    for (int t = 0; t < n_tok; ++t) {
        route_token(f.router_.data() + static_cast<size_t>(t) * hp.n_expert, l.exp_probs_b, hp.n_expert, k, ro,
                    f.ids_.data() + t * k, f.weights_.data() + t * k, f.route_scratch_);
        if (counts)
            for (int j = 0; j < k; ++j) ++counts[f.ids_[static_cast<size_t>(t * k + j)]];
    }
    t.reset();
    runner.run(moe_il, n_tok, f.xn_.data(), f.ids_.data(), f.weights_.data(), f.tmp_.data());
    const arenas::moe_layer& e = layers[static_cast<size_t>(moe_il)];
    const uint64_t n = runner.n_active();
    f.add_bytes(phase_clock::experts_gate_up, n * (static_cast<uint64_t>(e.gate.n_rows) * e.gate.row_stride +
                                                   static_cast<uint64_t>(e.up.n_rows) * e.up.row_stride));
    f.add_bytes(phase_clock::experts_down, n * static_cast<uint64_t>(e.down.n_rows) * e.down.row_stride);
}

void moe_ffn::shared_expert(const layer_weights& l, int n_tok) {
    forward_pass& f = f_;
    const size_t n_embd = static_cast<size_t>(f.hp_.n_embd);
    if (shexp_gate_up_of_ == &l)
        dense_.run_down(l.shexp_down, f.hp_.n_ff_shexp, n_tok);
    else
        dense_.run(l.shexp_gate, l.shexp_up, l.shexp_down, f.hp_.n_ff_shexp, n_tok);
    shexp_gate_up_of_ = nullptr;
    if (!l.shexp_gate_inp) return;
    for (int t = 0; t < n_tok; ++t) {
        const float* xn = f.xn_.data() + t * n_embd;
        float dot = 0;
        for (size_t i = 0; i < n_embd; ++i) dot += l.shexp_gate_inp[i] * xn[i];
        const float gate = sigmoid(dot);
        for (size_t i = 0; i < n_embd; ++i) f.tmp_[t * n_embd + i] *= gate;
    }
}

}  // namespace strata::engine
