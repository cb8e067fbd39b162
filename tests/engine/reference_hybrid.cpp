#include "reference_hybrid.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "formats/quant.hpp"

namespace strata::testing {

namespace {

float sigm(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu_f(float x) { return x * sigm(x); }

// RMS norm of x[off, off + n) times w.
std::vector<float> rms(const std::vector<float>& x, const std::vector<float>& w, float eps, size_t off, size_t n) {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += double(x[off + i]) * x[off + i];
    const double s = 1.0 / std::sqrt(ss / double(n) + eps);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = float(x[off + i] * s) * w[i];
    return out;
}

// NeoX RoPE on the first n_rot dims of one head: pairs (i, i + n_rot / 2) turn by pos * base^(-2i / n_rot).
void rope_neox(float* h, int n_rot, int pos, float base) {
    for (int i = 0; i < n_rot / 2; ++i) {
        const double th = pos * std::pow(double(base), -2.0 * i / n_rot);
        const double c = std::cos(th), s = std::sin(th);
        const double a = h[i], b = h[i + n_rot / 2];
        h[i] = float(a * c - b * s);
        h[i + n_rot / 2] = float(a * s + b * c);
    }
}

}  // namespace

hybrid_reference::hybrid_reference(const gguf::reader& f) : f_(f) {
    arch_ = f.at("general.architecture").as_string();
    const std::string p = arch_ + ".";
    n_layer_ = int(f.at(p + "block_count").as_u64() - f.get_u64(p + "nextn_predict_layers", 0));
    n_embd_ = int(f.at(p + "embedding_length").as_u64());
    n_head_ = int(f.at(p + "attention.head_count").as_u64());
    n_head_kv_ = int(f.at(p + "attention.head_count_kv").as_u64());
    head_dim_ = int(f.at(p + "attention.key_length").as_u64());
    n_rot_ = int(f.at(p + "rope.dimension_count").as_u64());
    n_expert_ = int(f.at(p + "expert_count").as_u64());
    n_used_ = int(f.at(p + "expert_used_count").as_u64());
    n_ff_ = int(f.at(p + "expert_feed_forward_length").as_u64());
    n_vocab_ = int(f.find_tensor("token_embd.weight")->ne[1]);
    d_state_ = int(f.at(p + "ssm.state_size").as_u64());
    n_k_ = int(f.at(p + "ssm.group_count").as_u64());
    n_v_ = int(f.at(p + "ssm.time_step_rank").as_u64());
    kernel_ = int(f.at(p + "ssm.conv_kernel").as_u64());
    eps_ = float(f.at(p + "attention.layer_norm_rms_epsilon").as_f64());
    freq_base_ = float(f.at(p + "rope.freq_base").as_f64());
    w_scale_ = float(f.get_f64(p + "expert_weights_scale", 0.0));
    const int interval = int(f.get_u64(p + "full_attention_interval", 4));
    for (int il = 0; il < n_layer_; ++il) recurrent_.push_back((il + 1) % interval != 0);
}

const hybrid_reference::matrix& hybrid_reference::load(const std::string& name) const {
    if (const auto it = cache_.find(name); it != cache_.end()) return it->second;
    const gguf::tensor_info* t = f_.find_tensor(name);
    if (!t) throw std::runtime_error("reference: missing " + name);
    matrix m;
    m.cols = t->ne[0];
    m.rows = t->n_elements / t->ne[0];
    m.w.resize(size_t(t->n_elements));
    formats::dequantize_row(t->type, f_.tensor_data(*t).data(), m.w.data(), t->n_elements);
    return cache_.emplace(name, std::move(m)).first->second;
}

std::vector<float> hybrid_reference::matrix::apply(const std::vector<float>& x, int64_t row0, int64_t n) const {
    if (n < 0) n = rows - row0;
    std::vector<float> y(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
        double acc = 0;
        for (int64_t c = 0; c < cols; ++c) acc += double(w[size_t((row0 + r) * cols + c)]) * x[size_t(c)];
        y[size_t(r)] = float(acc);
    }
    return y;
}

void hybrid_reference::delta_step(std::vector<double>& S, int d_k, int d_v, const float* q, const float* k,
                                  const float* v, float g, float beta, float* o) {
    const double decay = std::exp(double(g));
    for (double& s : S) s *= decay;
    for (int j = 0; j < d_v; ++j) {
        double sk = 0;
        for (int i = 0; i < d_k; ++i) sk += S[size_t(i * d_v + j)] * k[i];
        const double delta = beta * (v[j] - sk);
        for (int i = 0; i < d_k; ++i) S[size_t(i * d_v + j)] += k[i] * delta;
    }
    for (int j = 0; j < d_v; ++j) {
        double acc = 0;
        for (int i = 0; i < d_k; ++i) acc += S[size_t(i * d_v + j)] * q[i];
        o[j] = float(acc);
    }
}

std::vector<float> hybrid_reference::attention(int il, const std::vector<float>& xn, int pos) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const int hd = head_dim_;
    const std::vector<float> qg = load(b + "attn_q.weight").apply(xn);
    std::vector<float> k = load(b + "attn_k.weight").apply(xn), v = load(b + "attn_v.weight").apply(xn);
    const std::vector<float>& qn = load(b + "attn_q_norm.weight").w;
    const std::vector<float>& kn = load(b + "attn_k_norm.weight").w;
    std::vector<float> q(static_cast<size_t>(n_head_ * hd)), gate(static_cast<size_t>(n_head_ * hd));
    for (int h = 0; h < n_head_; ++h) {
        const std::vector<float> normed = rms(qg, qn, eps_, size_t(h * 2 * hd), size_t(hd));
        std::copy(normed.begin(), normed.end(), q.begin() + h * hd);
        std::copy(qg.begin() + h * 2 * hd + hd, qg.begin() + (h + 1) * 2 * hd, gate.begin() + h * hd);
        rope_neox(q.data() + h * hd, n_rot_, pos, freq_base_);
    }
    for (int h = 0; h < n_head_kv_; ++h) {
        const std::vector<float> normed = rms(k, kn, eps_, size_t(h * hd), size_t(hd));
        std::copy(normed.begin(), normed.end(), k.begin() + h * hd);
        rope_neox(k.data() + h * hd, n_rot_, pos, freq_base_);
    }
    k_cache_[size_t(il)].push_back(k);
    v_cache_[size_t(il)].push_back(v);
    std::vector<float> out(static_cast<size_t>(n_head_ * hd));
    const int group = n_head_ / n_head_kv_;
    for (int h = 0; h < n_head_; ++h) {
        const int g = h / group;
        std::vector<double> score;
        for (const auto& kp : k_cache_[size_t(il)]) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += double(q[size_t(h * hd + i)]) * kp[size_t(g * hd + i)];
            score.push_back(d / std::sqrt(double(hd)));
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (int i = 0; i < hd; ++i) {
            double acc = 0;
            for (size_t p = 0; p < score.size(); ++p) acc += score[p] * v_cache_[size_t(il)][p][size_t(g * hd + i)];
            out[size_t(h * hd + i)] = float(acc / sum) * sigm(gate[size_t(h * hd + i)]);
        }
    }
    return load(b + "attn_output.weight").apply(out);
}

std::vector<float> hybrid_reference::delta_net(int il, int r, const std::vector<float>& xn) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const int dk = d_state_, key_dim = n_k_ * dk, value_dim = n_v_ * dk, conv_dim = 2 * key_dim + value_dim;
    const int per_k = n_v_ / n_k_;
    std::vector<float> qkv(static_cast<size_t>(conv_dim)), z(static_cast<size_t>(value_dim));
    std::vector<float> beta(static_cast<size_t>(n_v_)), alpha(static_cast<size_t>(n_v_));
    if (has(b + "ssm_in.weight")) {  // per key head: q, k, its value heads' v, their z
        const std::vector<float> all = load(b + "ssm_in.weight").apply(xn);
        const int stride = 2 * dk + 2 * per_k * dk;
        for (int h = 0; h < n_k_; ++h)
            for (int i = 0; i < dk; ++i) {
                qkv[size_t(h * dk + i)] = all[size_t(h * stride + i)];
                qkv[size_t(key_dim + h * dk + i)] = all[size_t(h * stride + dk + i)];
            }
        for (int h = 0; h < n_k_; ++h)
            for (int i = 0; i < per_k * dk; ++i) {
                qkv[size_t(2 * key_dim + h * per_k * dk + i)] = all[size_t(h * stride + 2 * dk + i)];
                z[size_t(h * per_k * dk + i)] = all[size_t(h * stride + 2 * dk + per_k * dk + i)];
            }
    } else {
        qkv = load(b + "attn_qkv.weight").apply(xn);
        z = load(b + "attn_gate.weight").apply(xn);
    }
    if (has(b + "ssm_ba.weight")) {  // per key head: its value heads' beta, then their alpha
        const std::vector<float> ba = load(b + "ssm_ba.weight").apply(xn);
        for (int h = 0; h < n_k_; ++h)
            for (int j = 0; j < per_k; ++j) {
                beta[size_t(h * per_k + j)] = ba[size_t(h * 2 * per_k + j)];
                alpha[size_t(h * per_k + j)] = ba[size_t(h * 2 * per_k + per_k + j)];
            }
    } else {
        beta = load(b + "ssm_beta.weight").apply(xn);
        alpha = load(b + "ssm_alpha.weight").apply(xn);
    }
    // The causal conv over this token and the kernel - 1 before it, then SiLU.
    auto& hist = conv_hist_[size_t(r)];
    const matrix& cw = load(b + "ssm_conv1d.weight");  // [conv_dim][kernel]
    std::vector<float> x(static_cast<size_t>(conv_dim));
    for (int c = 0; c < conv_dim; ++c) {
        double acc = double(cw.w[size_t(c * kernel_ + kernel_ - 1)]) * qkv[size_t(c)];
        for (int j = 0; j < kernel_ - 1; ++j) acc += double(cw.w[size_t(c * kernel_ + j)]) * hist[size_t(j)][size_t(c)];
        x[size_t(c)] = silu_f(float(acc));
    }
    hist.erase(hist.begin());
    hist.push_back(qkv);
    for (int h = 0; h < 2 * n_k_; ++h) {  // q heads, then k heads: L2-normalised; q scaled
        double ss = 0;
        for (int i = 0; i < dk; ++i) ss += double(x[size_t(h * dk + i)]) * x[size_t(h * dk + i)];
        const double s = (h < n_k_ ? 1.0 / std::sqrt(double(dk)) : 1.0) / std::max(std::sqrt(ss), double(eps_));
        for (int i = 0; i < dk; ++i) x[size_t(h * dk + i)] = float(x[size_t(h * dk + i)] * s);
    }
    const std::vector<float>& a_log = load(b + "ssm_a").w;
    const std::vector<float>& dt = load(b + "ssm_dt.bias").w;
    const std::vector<float>& norm = load(b + "ssm_norm.weight").w;
    std::vector<float> o(static_cast<size_t>(value_dim));
    for (int h = 0; h < n_v_; ++h) {
        const int kh = arch_ == "qwen35moe" ? h % n_k_ : h / per_k;
        const double sp = std::log1p(std::exp(double(alpha[size_t(h)]) + dt[size_t(h)]));
        const float g = float(a_log[size_t(h)] * sp);
        delta_step(S_[size_t(r)][size_t(h)], dk, dk, &x[size_t(kh * dk)], &x[size_t(key_dim + kh * dk)],
                   &x[size_t(2 * key_dim + h * dk)], g, sigm(beta[size_t(h)]), &o[size_t(h * dk)]);
        const std::vector<float> n = rms(o, norm, eps_, size_t(h * dk), size_t(dk));
        for (int i = 0; i < dk; ++i) o[size_t(h * dk + i)] = n[size_t(i)] * silu_f(z[size_t(h * dk + i)]);
    }
    return load(b + "ssm_out.weight").apply(o);
}

std::vector<float> hybrid_reference::moe(int il, const std::vector<float>& xn) {
    const std::string b = "blk." + std::to_string(il) + ".";
    std::vector<float> logit = load(b + "ffn_gate_inp.weight").apply(xn);
    std::vector<int> order(static_cast<size_t>(n_expert_));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return logit[size_t(a)] > logit[size_t(c)]; });
    if (n_used_ < n_expert_)
        min_margin_ = std::min(min_margin_, logit[size_t(order[size_t(n_used_ - 1)])] - logit[size_t(order[size_t(n_used_)])]);
    const float mx = logit[size_t(order[0])];
    double sum = 0;
    for (float l : logit) sum += std::exp(double(l - mx));
    std::vector<double> w;
    double wsum = 0;
    for (int j = 0; j < n_used_; ++j) wsum += w.emplace_back(std::exp(double(logit[size_t(order[size_t(j)])] - mx)) / sum);
    const matrix& gate = load(b + "ffn_gate_exps.weight");
    const matrix& up = load(b + "ffn_up_exps.weight");
    const matrix& down = load(b + "ffn_down_exps.weight");
    std::vector<double> y(static_cast<size_t>(n_embd_));
    for (int j = 0; j < n_used_; ++j) {
        const int e = order[size_t(j)];
        std::vector<float> g = gate.apply(xn, int64_t(e) * n_ff_, n_ff_), u = up.apply(xn, int64_t(e) * n_ff_, n_ff_);
        for (size_t i = 0; i < g.size(); ++i) g[i] = silu_f(g[i]) * u[i];
        std::vector<float> d(static_cast<size_t>(n_embd_));
        for (int r = 0; r < n_embd_; ++r) {
            double acc = 0;
            for (int c = 0; c < n_ff_; ++c) acc += double(down.w[size_t((int64_t(e) * n_embd_ + r) * n_ff_ + c)]) * g[size_t(c)];
            d[size_t(r)] = float(acc);
        }
        double wj = w[size_t(j)] / wsum;  // renormalised top-k (norm_w true for these families)
        if (w_scale_ != 0.0f) wj *= w_scale_;
        for (int r = 0; r < n_embd_; ++r) y[size_t(r)] += wj * d[size_t(r)];
    }
    std::vector<float> sg = load(b + "ffn_gate_shexp.weight").apply(xn), su = load(b + "ffn_up_shexp.weight").apply(xn);
    for (size_t i = 0; i < sg.size(); ++i) sg[i] = silu_f(sg[i]) * su[i];
    const std::vector<float> sd = load(b + "ffn_down_shexp.weight").apply(sg);
    const std::vector<float>& gi = load(b + "ffn_gate_inp_shexp.weight").w;
    double dot = 0;
    for (int i = 0; i < n_embd_; ++i) dot += double(gi[size_t(i)]) * xn[size_t(i)];
    const double s = 1.0 / (1.0 + std::exp(-dot));
    std::vector<float> out(static_cast<size_t>(n_embd_));
    for (int r = 0; r < n_embd_; ++r) out[size_t(r)] = float(y[size_t(r)] + s * sd[size_t(r)]);
    return out;
}

std::vector<std::vector<float>> hybrid_reference::logits(const std::vector<int32_t>& tokens) {
    const int conv_dim = 2 * n_k_ * d_state_ + n_v_ * d_state_;
    k_cache_.assign(size_t(n_layer_), {});
    v_cache_.assign(size_t(n_layer_), {});
    conv_hist_.clear();
    S_.clear();
    for (int il = 0; il < n_layer_; ++il)
        if (recurrent_[size_t(il)]) {
            conv_hist_.emplace_back(size_t(kernel_ - 1), std::vector<float>(size_t(conv_dim), 0.0f));
            S_.emplace_back(size_t(n_v_), std::vector<double>(size_t(d_state_ * d_state_), 0.0));
        }
    min_margin_ = INFINITY;
    hidden_.clear();
    const matrix& embd = load("token_embd.weight");
    const matrix& out = load(f_.find_tensor("output.weight") ? "output.weight" : "token_embd.weight");
    std::vector<std::vector<float>> result;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        std::vector<float> x(embd.w.begin() + std::ptrdiff_t(static_cast<size_t>(tokens[pos]) * size_t(n_embd_)),
                             embd.w.begin() + std::ptrdiff_t(size_t(tokens[pos] + 1) * size_t(n_embd_)));
        for (int il = 0, r = 0; il < n_layer_; ++il) {
            const std::string b = "blk." + std::to_string(il) + ".";
            const std::vector<float> xn = rms(x, load(b + "attn_norm.weight").w, eps_, 0, size_t(n_embd_));
            const std::vector<float> mix = recurrent_[size_t(il)] ? delta_net(il, r++, xn) : attention(il, xn, int(pos));
            for (int i = 0; i < n_embd_; ++i) x[size_t(i)] += mix[size_t(i)];
            const std::vector<float> hn = rms(x, load(b + "post_attention_norm.weight").w, eps_, 0, size_t(n_embd_));
            const std::vector<float> ffn = moe(il, hn);
            for (int i = 0; i < n_embd_; ++i) x[size_t(i)] += ffn[size_t(i)];
        }
        hidden_.push_back(x);
        result.push_back(out.apply(rms(x, load("output_norm.weight").w, eps_, 0, size_t(n_embd_))));
    }
    return result;
}

std::vector<std::vector<float>> hybrid_reference::mtp_logits(const std::vector<int32_t>& tokens) {
    logits(tokens);
    const std::string b = "blk." + std::to_string(n_layer_) + ".";
    k_cache_.resize(size_t(n_layer_) + 1);
    v_cache_.resize(size_t(n_layer_) + 1);
    k_cache_.back().clear();
    v_cache_.back().clear();
    const matrix& embd = load("token_embd.weight");
    const matrix& out = load(f_.find_tensor("output.weight") ? "output.weight" : "token_embd.weight");
    const std::string head_norm = has(b + "nextn.shared_head_norm.weight") ? b + "nextn.shared_head_norm.weight"
                                                                           : std::string("output_norm.weight");
    std::vector<std::vector<float>> result;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        const std::vector<float> e(embd.w.begin() + std::ptrdiff_t(static_cast<size_t>(tokens[pos]) * size_t(n_embd_)),
                                   embd.w.begin() + std::ptrdiff_t(size_t(tokens[pos] + 1) * size_t(n_embd_)));
        std::vector<float> cat = rms(e, load(b + "nextn.enorm.weight").w, eps_, 0, size_t(n_embd_));
        if (pos == 0) {
            cat.resize(2 * size_t(n_embd_), 0.0f);
        } else {
            // llama.cpp feeds the trunk's residual through the output norm.
            const std::vector<float> h = rms(hidden_[pos - 1], load("output_norm.weight").w, eps_, 0, size_t(n_embd_));
            const std::vector<float> hn = rms(h, load(b + "nextn.hnorm.weight").w, eps_, 0, size_t(n_embd_));
            cat.insert(cat.end(), hn.begin(), hn.end());
        }
        std::vector<float> x = load(b + "nextn.eh_proj.weight").apply(cat);
        const std::vector<float> xn = rms(x, load(b + "attn_norm.weight").w, eps_, 0, size_t(n_embd_));
        const std::vector<float> mix = attention(n_layer_, xn, int(pos));
        for (int i = 0; i < n_embd_; ++i) x[size_t(i)] += mix[size_t(i)];
        const std::vector<float> hn = rms(x, load(b + "post_attention_norm.weight").w, eps_, 0, size_t(n_embd_));
        const std::vector<float> ffn = moe(n_layer_, hn);
        for (int i = 0; i < n_embd_; ++i) x[size_t(i)] += ffn[size_t(i)];
        result.push_back(out.apply(rms(x, load(head_norm).w, eps_, 0, size_t(n_embd_))));
    }
    return result;
}

}  // namespace strata::testing
