#include "reference_forward.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "formats/quant.hpp"

namespace strata::testing {

namespace {

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& w, float eps, size_t off = 0,
                           size_t n = 0) {
    if (n == 0) n = x.size();
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += double(x[off + i]) * x[off + i];
    const float s = 1.0f / std::sqrt(float(ss / double(n)) + eps);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = x[off + i] * s * w[i];
    return out;
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

void softmax(std::vector<float>& v) {
    const float mx = *std::max_element(v.begin(), v.end());
    double sum = 0;
    for (float& x : v) {
        x = std::exp(x - mx);
        sum += x;
    }
    for (float& x : v) x = float(x / sum);
}

// RoPE on the first hd values of one head at position pos: "normal" rotates (2i, 2i+1), "neox" (i, i + hd/2).
// Scaled as ggml_rope_ext: angles divided by the factor; under YaRN, pairs below the fast correction
// dim (beta 32) keep the undivided angle, a linear ramp up to the slow one (beta 1), and cos/sin grow
// by 1 + 0.1 ln(factor).
void rope(float* h, int hd, int pos, float base, bool neox, const rope_scaling& sc) {
    double low = 0, high = 0, mscale = sc.attn_factor;
    if (sc.yarn) {
        const auto dim = [&](double beta) {
            return hd * std::log(sc.n_ctx_orig / (beta * 2 * M_PI)) / (2 * std::log(double(base)));
        };
        low = std::max(0.0, std::floor(dim(32)));
        high = std::min(hd - 1.0, std::ceil(dim(1)));
        mscale *= 1 + 0.1 * std::log(sc.factor);
    }
    for (int i = 0; i < hd / 2; ++i) {
        const double unscaled = pos * std::pow(double(base), -2.0 * i / hd);
        double theta = unscaled / sc.factor;
        if (sc.yarn) {
            const double keep = 1 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
            theta = theta * (1 - keep) + unscaled * keep;
        }
        const float c = float(std::cos(theta) * mscale), s = float(std::sin(theta) * mscale);
        const int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        const float x0 = h[a], x1 = h[b];
        h[a] = x0 * c - x1 * s;
        h[b] = x0 * s + x1 * c;
    }
}

}  // namespace

reference_model::reference_model(const gguf::reader& f) : f_(f) {
    arch_ = f.at("general.architecture").as_string();
    const std::string p = arch_ + ".";
    // glm4moe: block_count counts the next-token-prediction layers, which are not evaluated.
    n_layer_ = int(f.at(p + "block_count").as_u64() - f.get_u64(p + "nextn_predict_layers", 0));
    n_embd_ = int(f.at(p + "embedding_length").as_u64());
    n_head_ = int(f.at(p + "attention.head_count").as_u64());
    n_head_kv_ = int(f.at(p + "attention.head_count_kv").as_u64());
    head_dim_ = int(f.get_u64(p + "attention.key_length", uint64_t(n_embd_ / n_head_)));
    n_rot_ = int(f.get_u64(p + "rope.dimension_count", uint64_t(head_dim_)));
    n_expert_ = int(f.at(p + "expert_count").as_u64());
    n_used_ = int(f.at(p + "expert_used_count").as_u64());
    n_ff_ = int(arch_ == "llama" ? f.at(p + "feed_forward_length").as_u64()
                                 : f.at(p + "expert_feed_forward_length").as_u64());
    n_vocab_ = int(f.find_tensor("token_embd.weight")->ne[1]);
    norm_w_ = arch_ != "qwen2moe";
    if (arch_ == "glm4moe") {
        n_dense_ = int(f.get_u64(p + "leading_dense_block_count", 0));
        const uint64_t gating = f.get_u64(p + "expert_gating_func", 0);
        sigmoid_ = gating == 0 || gating == 2;
        const gguf::value* norm = f.find(p + "expert_weights_norm");
        norm_w_ = norm && norm->as_bool();
        scale_w_ = float(f.get_f64(p + "expert_weights_scale", 0.0));
    }
    if (arch_ == "deepseek2") read_deepseek2(f, p);
    eps_ = float(f.at(p + "attention.layer_norm_rms_epsilon").as_f64());
    freq_base_ = float(f.at(p + "rope.freq_base").as_f64());
    // llama.cpp: type linear when absent, factor 0 (none) when absent, original context = the context.
    const std::string type = f.get_string(p + "rope.scaling.type", "linear");
    const double factor = f.get_f64(p + "rope.scaling.factor", f.get_f64(p + "rope.scale_linear", 0.0));
    scaling_.yarn = type == "yarn";
    scaling_.factor = type == "none" || factor == 0 ? 1.0 : factor;
    scaling_.n_ctx_orig = double(f.get_u64(p + "rope.scaling.original_context_length",
                                           f.at(p + "context_length").as_u64()));
    scaling_.attn_factor = f.get_f64(p + "rope.scaling.attn_factor", 1.0);
    if (mla_) {
        // llama.cpp's DeepSeek YaRN: with a yarn_log_multiplier (stored times 0.1) the rotation's own
        // 1 + 0.1 ln(factor) is cancelled; the attention scale is mscale^2 / sqrt(head size), mscale =
        // (1 + 0.1 ln factor)(1 + 0.1 log_mul ln factor) times the rotation's attn_factor.
        const double ln_f = std::log(scaling_.factor);
        const double log_mul = f.get_f64(p + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
        if (scaling_.yarn)
            scaling_.attn_factor *= (log_mul != 0 || scaling_.factor <= 1 ? 1.0 : 1 + 0.1 * ln_f) / (1 + 0.1 * ln_f);
        const double mscale = scaling_.attn_factor * (1 + 0.1 * ln_f) * (1 + 0.1 * log_mul * ln_f);
        kq_scale_ = mscale * mscale / std::sqrt(double(head_dim_));
    }
}

void reference_model::read_deepseek2(const gguf::reader& f, const std::string& p) {
    mla_ = true;
    n_dense_ = int(f.get_u64(p + "leading_dense_block_count", 0));
    sigmoid_ = f.get_u64(p + "expert_gating_func", 0) == 2;  // absent: softmax, as DeepSeek-V2 files
    const gguf::value* norm = f.find(p + "expert_weights_norm");
    norm_w_ = norm && norm->as_bool();
    scale_w_ = float(f.get_f64(p + "expert_weights_scale", 0.0));
    n_lora_kv_ = int(f.at(p + "attention.kv_lora_rank").as_u64());
    const bool split = f.find(p + "attention.key_length_mla") != nullptr;
    head_dim_ = int(f.at(p + (split ? "attention.key_length_mla" : "attention.key_length")).as_u64());
    head_dim_v_ = int(f.at(p + (split ? "attention.value_length_mla" : "attention.value_length")).as_u64());
    n_rot_ = int(f.at(p + "rope.dimension_count").as_u64());
    n_group_ = int(f.get_u64(p + "expert_group_count", 0));
    n_group_used_ = int(f.get_u64(p + "expert_group_used_count", 0));
}

std::vector<float> reference_model::matrix::apply(const std::vector<float>& x) const {
    std::vector<float> y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        double acc = 0;
        for (int64_t c = 0; c < cols; ++c) acc += double(w[size_t(r * cols + c)]) * x[size_t(c)];
        y[size_t(r)] = float(acc);
    }
    return y;
}

const reference_model::matrix& reference_model::load(const std::string& name) const {
    if (const auto it = dequantized_.find(name); it != dequantized_.end()) return it->second;
    const gguf::tensor_info* t = f_.find_tensor(name);
    if (!t) throw std::runtime_error("reference: missing " + name);
    matrix m;
    m.cols = t->ne[0];
    m.rows = t->n_elements / t->ne[0];
    m.w.resize(size_t(t->n_elements));
    formats::dequantize_row(t->type, f_.tensor_data(*t).data(), m.w.data(), t->n_elements);
    return dequantized_.emplace(name, std::move(m)).first->second;
}

std::vector<float> reference_model::vec(const std::string& name) const { return load(name).w; }

reference_model::matrix reference_model::expert(const std::string& merged, const std::string& split_name, int e,
                                                bool down) const {
    if (f_.find_tensor(merged)) {
        const matrix& all = load(merged);
        matrix m;
        m.cols = down ? n_ff_ : n_embd_;
        m.rows = down ? n_embd_ : n_ff_;
        const size_t n = size_t(m.rows * m.cols);
        m.w.assign(all.w.begin() + std::ptrdiff_t(n * size_t(e)), all.w.begin() + std::ptrdiff_t(n * size_t(e + 1)));
        return m;
    }
    return load(split_name);
}

std::vector<float> reference_model::ffn(const matrix& gate, const matrix& up, const matrix& down,
                                        const std::vector<float>& x) const {
    std::vector<float> g = gate.apply(x), u = up.apply(x);
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
    return down.apply(g);
}

float reference_model::mask_groups(std::vector<float>& sel, const std::vector<float>& p) const {
    // A group's score is the sum of its two best selection scores.
    const int per = n_expert_ / n_group_;
    std::vector<double> score(static_cast<size_t>(n_group_));
    std::vector<std::pair<int, int>> top2(static_cast<size_t>(n_group_));
    for (int g = 0; g < n_group_; ++g) {
        std::vector<int> idx(static_cast<size_t>(per));
        std::iota(idx.begin(), idx.end(), g * per);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int c) { return sel[size_t(a)] > sel[size_t(c)]; });
        score[size_t(g)] = double(sel[size_t(idx[0])]) + sel[size_t(idx[1])];
        top2[size_t(g)] = {idx[0], idx[1]};
    }
    std::vector<int> groups(static_cast<size_t>(n_group_));
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(), [&](int a, int c) { return score[size_t(a)] > score[size_t(c)]; });
    for (size_t j = size_t(n_group_used_); j < groups.size(); ++j)
        for (int e = 0; e < per; ++e) sel[size_t(groups[j] * per + e)] = -INFINITY;
    // To first order, the router-logit change that swaps the last kept and the first dropped group.
    const int kept = groups[size_t(n_group_used_ - 1)], dropped = groups[size_t(n_group_used_)];
    double slope = 0;
    for (int e : {top2[size_t(kept)].first, top2[size_t(kept)].second, top2[size_t(dropped)].first,
                  top2[size_t(dropped)].second}) {
        const double v = p[size_t(e)];
        slope += v * (1 - v);
    }
    return float(2 * (score[size_t(kept)] - score[size_t(dropped)]) / std::max(slope, 1e-12));
}

std::vector<float> reference_model::latent_attention(const std::string& b, const std::vector<float>& xn, size_t pos,
                                                     std::vector<std::vector<float>>& kcache,
                                                     std::vector<std::vector<float>>& vcache) {
    const int hd = head_dim_, nope = hd - n_rot_, lora = n_lora_kv_, hv = head_dim_v_;
    std::vector<float> q = f_.find_tensor(b + "attn_q_a.weight")
                               ? load(b + "attn_q_b.weight")
                                     .apply(rmsnorm(load(b + "attn_q_a.weight").apply(xn), vec(b + "attn_q_a_norm.weight"), eps_))
                               : load(b + "attn_q.weight").apply(xn);
    const std::vector<float> kv_a = load(b + "attn_kv_a_mqa.weight").apply(xn);
    const std::vector<float> c = rmsnorm(kv_a, vec(b + "attn_kv_a_norm.weight"), eps_, 0, size_t(lora));
    std::vector<float> k_pe(kv_a.begin() + lora, kv_a.end());
    // DeepSeek rotates pairs (2i, 2i + 1) of the last n_rot dims of each query head and of the one shared key.
    rope(k_pe.data(), n_rot_, int(pos), freq_base_, false, scaling_);
    for (int h = 0; h < n_head_; ++h) rope(q.data() + h * hd + nope, n_rot_, int(pos), freq_base_, false, scaling_);
    // Every head's key (its no-RoPE part from the latent, then the shared k_pe) and value.
    const bool split = f_.find_tensor(b + "attn_k_b.weight") != nullptr;
    const matrix& kb = load(b + (split ? "attn_k_b.weight" : "attn_kv_b.weight"));
    const matrix& vb = load(b + (split ? "attn_v_b.weight" : "attn_kv_b.weight"));
    std::vector<float> k(size_t(n_head_ * hd)), v(size_t(n_head_ * hv));
    for (int h = 0; h < n_head_; ++h) {
        for (int d = 0; d < nope; ++d) {
            double acc = 0;
            for (int i = 0; i < lora; ++i)
                acc += double(split ? kb.w[size_t((h * lora + i) * nope + d)] : kb.w[size_t((h * (nope + hv) + d) * lora + i)]) *
                       c[size_t(i)];
            k[size_t(h * hd + d)] = float(acc);
        }
        for (int d = 0; d < n_rot_; ++d) k[size_t(h * hd + nope + d)] = k_pe[size_t(d)];
        for (int j = 0; j < hv; ++j) {
            double acc = 0;
            for (int i = 0; i < lora; ++i)
                acc += double(split ? vb.w[size_t((h * hv + j) * lora + i)] : vb.w[size_t((h * (nope + hv) + nope + j) * lora + i)]) *
                       c[size_t(i)];
            v[size_t(h * hv + j)] = float(acc);
        }
    }
    kcache.push_back(k);
    vcache.push_back(v);
    const double scale = kq_scale_ > 0 ? kq_scale_ : 1 / std::sqrt(double(hd));
    std::vector<float> att(size_t(n_head_ * hv), 0.0f);
    for (int h = 0; h < n_head_; ++h) {
        std::vector<float> s(pos + 1);
        for (size_t t = 0; t <= pos; ++t) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += double(q[size_t(h * hd + i)]) * kcache[t][size_t(h * hd + i)];
            s[t] = float(d * scale);
        }
        softmax(s);
        for (size_t t = 0; t <= pos; ++t)
            for (int j = 0; j < hv; ++j) att[size_t(h * hv + j)] += s[t] * vcache[t][size_t(h * hv + j)];
    }
    return att;
}

void reference_model::block(int il, std::vector<float>& x, size_t pos, const routes* follow, float& margin) {
    const bool qwen2 = arch_ == "qwen2moe", glm = arch_ == "glm4moe";
    const bool neox = arch_ != "llama";
    const int hd = head_dim_, n_q = n_head_ * hd, n_kv = n_head_kv_ * hd;
    const std::string b = "blk." + std::to_string(il) + ".";
    std::vector<float> xn = rmsnorm(x, vec(b + "attn_norm.weight"), eps_);
    std::vector<float> att;
    if (mla_) {
        att = latent_attention(b, xn, pos, kcache_[size_t(il)], vcache_[size_t(il)]);
    } else {
        std::vector<float> q = load(b + "attn_q.weight").apply(xn);
        std::vector<float> k = load(b + "attn_k.weight").apply(xn);
        std::vector<float> v = load(b + "attn_v.weight").apply(xn);
        if (f_.find_tensor(b + "attn_q.bias")) {  // qwen2moe; glm4moe
            const auto bq = vec(b + "attn_q.bias"), bk = vec(b + "attn_k.bias"), bv = vec(b + "attn_v.bias");
            for (int i = 0; i < n_q; ++i) q[size_t(i)] += bq[size_t(i)];
            for (int i = 0; i < n_kv; ++i) k[size_t(i)] += bk[size_t(i)], v[size_t(i)] += bv[size_t(i)];
        }
        if (f_.find_tensor(b + "attn_q_norm.weight")) {  // qwen3moe; glm4moe optionally
            const auto qn = vec(b + "attn_q_norm.weight"), kn = vec(b + "attn_k_norm.weight");
            for (int h = 0; h < n_head_; ++h) {
                auto o = rmsnorm(q, qn, eps_, size_t(h * hd), size_t(hd));
                std::copy(o.begin(), o.end(), q.begin() + h * hd);
            }
            for (int h = 0; h < n_head_kv_; ++h) {
                auto o = rmsnorm(k, kn, eps_, size_t(h * hd), size_t(hd));
                std::copy(o.begin(), o.end(), k.begin() + h * hd);
            }
        }
        // The first n_rot dims of each head turn (neox pairs i, i + n_rot/2), the rest pass through.
        for (int h = 0; h < n_head_; ++h) rope(q.data() + h * hd, n_rot_, int(pos), freq_base_, neox, scaling_);
        for (int h = 0; h < n_head_kv_; ++h) rope(k.data() + h * hd, n_rot_, int(pos), freq_base_, neox, scaling_);
        kcache_[size_t(il)].push_back(k);
        vcache_[size_t(il)].push_back(v);
        att.assign(static_cast<size_t>(n_q), 0.0f);
        for (int h = 0; h < n_head_; ++h) {
            const int g = h / (n_head_ / n_head_kv_);
            std::vector<float> s(pos + 1);
            for (size_t t = 0; t <= pos; ++t) {
                double d = 0;
                for (int i = 0; i < hd; ++i) d += double(q[size_t(h * hd + i)]) * kcache_[size_t(il)][t][size_t(g * hd + i)];
                s[t] = float(d / std::sqrt(double(hd)));
            }
            softmax(s);
            for (size_t t = 0; t <= pos; ++t)
                for (int i = 0; i < hd; ++i) att[size_t(h * hd + i)] += s[t] * vcache_[size_t(il)][t][size_t(g * hd + i)];
        }
    }
    const std::vector<float> o = load(b + "attn_output.weight").apply(att);
    for (int i = 0; i < n_embd_; ++i) x[size_t(i)] += o[size_t(i)];

    xn = rmsnorm(x, vec(b + (glm ? "post_attention_norm.weight" : "ffn_norm.weight")), eps_);
    const bool record = il < n_layer_;  // the MTP block's routing is not recorded
    if (record) ids_.back().emplace_back();
    if (il < n_dense_) {
        const auto y = ffn(load(b + "ffn_gate.weight"), load(b + "ffn_up.weight"), load(b + "ffn_down.weight"), xn);
        for (int i = 0; i < n_embd_; ++i) x[size_t(i)] += y[size_t(i)];
        return;
    }
    std::vector<float> p = load(b + "ffn_gate_inp.weight").apply(xn);
    if (sigmoid_)
        for (float& v : p) v = float(1.0 / (1.0 + std::exp(-double(v))));
    else
        softmax(p);
    // The experts are chosen by score + correction bias; their weights are the plain scores.
    std::vector<float> sel = p;
    const bool biased = f_.find_tensor(b + "exp_probs_b.bias") != nullptr;
    if (biased) {
        const auto bias = vec(b + "exp_probs_b.bias");
        for (int e = 0; e < n_expert_; ++e) sel[size_t(e)] += bias[size_t(e)];
    }
    const auto ranked = [&](const std::vector<float>& score) {
        std::vector<int> order(static_cast<size_t>(n_expert_));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int c) { return score[size_t(a)] > score[size_t(c)]; });
        return order;
    };
    const std::vector<float> sel_all = sel;
    float layer_margin = n_group_ > 1 ? mask_groups(sel, p) : 1e9f;
    std::vector<int> order = ranked(sel);
    if (!std::isfinite(sel[size_t(order[size_t(std::min(n_used_, n_expert_ - 1))])])) {
        // the best expert left out is in a dropped group: the group gap above is the margin
    } else if (n_used_ < n_expert_ && !sigmoid_) {
        layer_margin = std::min(layer_margin, std::log(sel[size_t(order[size_t(n_used_ - 1)])] /
                                                       sel[size_t(order[size_t(n_used_)])]));
    } else if (n_used_ < n_expert_) {
        // Sigmoid: over every chosen / not chosen pair, the router-logit change (half on each,
        // opposite ways) that closes their selection gap, to first order. The slopes differ, so
        // the closest pair need not be the k-th and the (k+1)-th.
        for (int i = 0; i < n_used_; ++i)
            for (int j = n_used_; j < n_expert_; ++j) {
                const size_t a = size_t(order[size_t(i)]), c = size_t(order[size_t(j)]);
                if (!std::isfinite(sel[c])) continue;
                const double slope = double(p[a]) * (1 - p[a]) + double(p[c]) * (1 - p[c]);
                layer_margin = std::min(layer_margin, float(2 * (sel[a] - sel[c]) / std::max(slope, 1e-12)));
            }
    }
    margin = std::min(margin, layer_margin);
    if (record) layer_margins_.back()[size_t(il)] = layer_margin;
    const auto chosen = [&](const std::vector<int>& ranking) {
        std::vector<int> a(ranking.begin(), ranking.begin() + n_used_);
        std::sort(a.begin(), a.end());
        return a;
    };
    if (record && biased) bias_changed_.back()[size_t(il)] = chosen(order) != chosen(ranked(p));
    if (record && n_group_ > 1) group_changed_.back()[size_t(il)] = chosen(order) != chosen(ranked(sel_all));
    if (record) ids_.back().back().assign(order.begin(), order.begin() + n_used_);
    if (record && follow && layer_margin <= follow->tie_margin) {
        std::vector<int> theirs = follow->ids.at(pos).at(size_t(il));
        std::sort(theirs.begin(), theirs.end());
        if (theirs.size() == size_t(n_used_) && theirs != chosen(order)) {
            std::stable_sort(theirs.begin(), theirs.end(),
                             [&](int a, int c) { return sel[size_t(a)] > sel[size_t(c)]; });
            std::copy(theirs.begin(), theirs.end(), order.begin());
            ++followed_;
        }
    }
    float wsum = 0;
    for (int j = 0; j < n_used_; ++j) wsum += p[size_t(order[size_t(j)])];
    wsum = std::max(wsum, 6.103515625e-5f);
    std::vector<float> moe(static_cast<size_t>(n_embd_), 0.0f);
    for (int j = 0; j < n_used_; ++j) {
        const int e = order[size_t(j)];
        float w = norm_w_ ? p[size_t(e)] / wsum : p[size_t(e)];
        if (scale_w_ != 0 && scale_w_ != 1) w *= scale_w_;
        const std::string es = std::to_string(e);
        const auto y = ffn(expert(b + "ffn_gate_exps.weight", b + "ffn_gate." + es + ".weight", e, false),
                           expert(b + "ffn_up_exps.weight", b + "ffn_up." + es + ".weight", e, false),
                           expert(b + "ffn_down_exps.weight", b + "ffn_down." + es + ".weight", e, true), xn);
        for (int i = 0; i < n_embd_; ++i) moe[size_t(i)] += w * y[size_t(i)];
    }
    if ((glm || mla_) && f_.find_tensor(b + "ffn_gate_shexp.weight")) {  // no gate of its own
        const auto y = ffn(load(b + "ffn_gate_shexp.weight"), load(b + "ffn_up_shexp.weight"),
                           load(b + "ffn_down_shexp.weight"), xn);
        for (int i = 0; i < n_embd_; ++i) moe[size_t(i)] += y[size_t(i)];
    }
    if (qwen2 && f_.find_tensor(b + "ffn_gate_shexp.weight")) {
        const auto gi = vec(b + "ffn_gate_inp_shexp.weight");
        double d = 0;
        for (int i = 0; i < n_embd_; ++i) d += double(gi[size_t(i)]) * xn[size_t(i)];
        const float gate = float(1.0 / (1.0 + std::exp(-d)));
        const auto y = ffn(load(b + "ffn_gate_shexp.weight"), load(b + "ffn_up_shexp.weight"),
                           load(b + "ffn_down_shexp.weight"), xn);
        for (int i = 0; i < n_embd_; ++i) moe[size_t(i)] += gate * y[size_t(i)];
    }
    for (int i = 0; i < n_embd_; ++i) x[size_t(i)] += moe[size_t(i)];
}

std::vector<std::vector<float>> reference_model::logits(const std::vector<int32_t>& tokens, const routes* follow) {
    kcache_.assign(static_cast<size_t>(n_layer_) + 1, {});
    vcache_.assign(static_cast<size_t>(n_layer_) + 1, {});
    hidden_.clear();
    const matrix embd = load("token_embd.weight");
    const matrix out_w = f_.find_tensor("output.weight") ? load("output.weight") : embd;
    std::vector<std::vector<float>> result;
    margins_.clear();
    ids_.clear();
    bias_changed_.clear();
    group_changed_.clear();
    layer_margins_.clear();
    followed_ = 0;

    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        float margin = 1e9f;
        ids_.emplace_back();
        bias_changed_.emplace_back(static_cast<size_t>(n_layer_), false);
        group_changed_.emplace_back(static_cast<size_t>(n_layer_), false);
        layer_margins_.emplace_back(static_cast<size_t>(n_layer_), 1e9f);
        std::vector<float> x(embd.w.begin() + std::ptrdiff_t(size_t(tokens[pos]) * size_t(n_embd_)),
                             embd.w.begin() + std::ptrdiff_t(size_t(tokens[pos] + 1) * size_t(n_embd_)));
        for (int il = 0; il < n_layer_; ++il) block(il, x, pos, follow, margin);
        hidden_.push_back(x);
        margins_.push_back(margin);
        result.push_back(out_w.apply(rmsnorm(x, vec("output_norm.weight"), eps_)));
    }
    return result;
}

std::vector<float> reference_model::mtp_row(int32_t token, const std::vector<float>* h, const std::string& h_norm,
                                            size_t pos) {
    const std::string b = "blk." + std::to_string(n_layer_) + ".";
    const matrix& embd = load(f_.find_tensor(b + "nextn.embed_tokens.weight") ? b + "nextn.embed_tokens.weight"
                                                                              : std::string("token_embd.weight"));
    const std::vector<float> e(embd.w.begin() + std::ptrdiff_t(size_t(token) * size_t(n_embd_)),
                               embd.w.begin() + std::ptrdiff_t(size_t(token + 1) * size_t(n_embd_)));
    std::vector<float> cat = rmsnorm(e, vec(b + "nextn.enorm.weight"), eps_);
    if (h) {
        const std::vector<float> hn = rmsnorm(rmsnorm(*h, vec(h_norm), eps_), vec(b + "nextn.hnorm.weight"), eps_);
        cat.insert(cat.end(), hn.begin(), hn.end());
    } else {
        cat.resize(2 * size_t(n_embd_), 0.0f);
    }
    std::vector<float> x = load(b + "nextn.eh_proj.weight").apply(cat);
    float margin = 0;
    block(n_layer_, x, pos, nullptr, margin);
    mtp_out_ = x;
    const matrix& head = load(f_.find_tensor(b + "nextn.shared_head_head.weight") ? b + "nextn.shared_head_head.weight"
                              : f_.find_tensor("output.weight")                 ? std::string("output.weight")
                                                                                 : std::string("token_embd.weight"));
    return head.apply(rmsnorm(x, vec(mtp_head_norm()), eps_));
}

std::string reference_model::mtp_head_norm() const {
    const std::string n = "blk." + std::to_string(n_layer_) + ".nextn.shared_head_norm.weight";
    return f_.find_tensor(n) ? n : std::string("output_norm.weight");
}

std::vector<std::vector<float>> reference_model::mtp_logits(const std::vector<int32_t>& tokens) {
    logits(tokens);
    std::vector<std::vector<float>> result;
    for (size_t pos = 0; pos < tokens.size(); ++pos)
        result.push_back(mtp_row(tokens[pos], pos == 0 ? nullptr : &hidden_[pos - 1], "output_norm.weight", pos));
    return result;
}

std::vector<float> reference_model::mtp_chain(int32_t token, size_t pos) {
    const std::vector<float> h = mtp_out_;
    return mtp_row(token, &h, mtp_head_norm(), pos);
}

}  // namespace strata::testing
