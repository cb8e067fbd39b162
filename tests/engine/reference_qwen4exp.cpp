#include "reference_qwen4exp.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "formats/quant.hpp"

namespace strata::testing {

namespace {

double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu_d(double x) { return x * sigm(x); }

std::vector<float> rms(const std::vector<float>& x, const float* w, float eps, size_t off, size_t n) {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += double(x[off + i]) * x[off + i];
    const double s = 1.0 / std::sqrt(ss / double(n) + eps);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = float(x[off + i] * s * w[i]);
    return out;
}

// rotate_half RoPE on the first n_rot dims: pairs (i, i + n_rot / 2) turn by pos * base^(-2i / n_rot).
void rope(float* h, int n_rot, int pos, float base) {
    for (int i = 0; i < n_rot / 2; ++i) {
        const double th = pos * std::pow(double(base), -2.0 * i / n_rot);
        const double c = std::cos(th), s = std::sin(th);
        const double a = h[i], b = h[i + n_rot / 2];
        h[i] = float(a * c - b * s);
        h[i + n_rot / 2] = float(a * s + b * c);
    }
}

std::vector<int64_t> ints(const gguf::value& v) {
    std::vector<int64_t> out;
    for (const gguf::value& e : v.as_array()) out.push_back(static_cast<int64_t>(e.as_u64()));
    return out;
}

}  // namespace

qwen4exp_reference::qwen4exp_reference(const gguf::reader& f) : f_(f) {
    const std::string p = "qwen4exp.";
    n_layer_ = int(f.at(p + "block_count").as_u64() - f.get_u64(p + "nextn_predict_layers", 0));
    n_embd_ = int(f.at(p + "embedding_length").as_u64());
    n_head_ = int(f.at(p + "attention.head_count").as_u64());
    n_head_kv_ = int(f.at(p + "attention.head_count_kv").as_u64());
    head_dim_ = int(f.at(p + "attention.key_length").as_u64());
    n_rot_ = int(f.at(p + "rope.dimension_count").as_u64());
    n_expert_ = int(f.at(p + "expert_count").as_u64());
    n_used_ = int(f.at(p + "expert_used_count").as_u64());
    n_ff_ = int(f.at(p + "expert_feed_forward_length").as_u64());
    d_state_ = int(f.at(p + "ssm.state_size").as_u64());
    n_k_ = int(f.at(p + "ssm.group_count").as_u64());
    n_v_ = int(f.at(p + "ssm.time_step_rank").as_u64());
    kernel_ = int(f.at(p + "ssm.conv_kernel").as_u64());
    hc_ = int(f.at(p + "hyper_connection.count").as_u64());
    idx_heads_ = int(f.at(p + "attention.indexer.head_count").as_u64());
    idx_dim_ = int(f.at(p + "attention.indexer.key_length").as_u64());
    idx_top_k_ = int(f.at(p + "attention.indexer.top_k").as_u64());
    for (int64_t r : ints(f.at(p + "attention.compress_ratios"))) ratio_.push_back(int(r));
    eps_ = float(f.at(p + "attention.layer_norm_rms_epsilon").as_f64());
    freq_base_ = float(f.at(p + "rope.freq_base").as_f64());
    const int interval = int(f.get_u64(p + "full_attention_interval", 4));
    for (int il = 0; il < n_layer_; ++il) recurrent_.push_back((il + 1) % interval != 0);
    if (const gguf::value* layers = f.find(p + "ple.layers")) {
        ple_layer_ = int(ints(*layers).at(0));
        ngram_ = int(f.at(p + "ple.ngram_size").as_u64());
        per_ngram_ = int(f.at(p + "ple.heads_per_ngram").as_u64());
        ple_kernel_ = int(f.at(p + "ple.conv_kernel").as_u64());
        ple_dim_ = int(f.at(p + "embedding_length_per_layer").as_u64());
        eos_ = int64_t(f.at(p + "ple.eos_token_id").as_u64());
        mult_ = ints(f.at(p + "ple.layer_multipliers"));
        offset_ = ints(f.at(p + "ple.head_offsets"));
        vocab_ = ints(f.at(p + "ple.head_vocab_sizes"));
    }
}

const qwen4exp_reference::matrix& qwen4exp_reference::load(const std::string& name) const {
    if (const auto it = cache_.find(name); it != cache_.end()) return it->second;
    const gguf::tensor_info* t = f_.find_tensor(name);
    if (!t) throw std::runtime_error("reference: missing " + name);
    matrix m;
    m.cols = t->ne[0];
    m.rows = t->n_elements / t->ne[0];
    m.w.resize(static_cast<size_t>(t->n_elements));
    formats::dequantize_row(t->type, f_.tensor_data(*t).data(), m.w.data(), t->n_elements);
    return cache_.emplace(name, std::move(m)).first->second;
}

std::vector<float> qwen4exp_reference::matrix::apply(const std::vector<float>& x, int64_t row0, int64_t n) const {
    if (n < 0) n = rows - row0;
    std::vector<float> y(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
        double acc = 0;
        for (int64_t c = 0; c < cols; ++c) acc += double(w[size_t((row0 + r) * cols + c)]) * x[size_t(c)];
        y[size_t(r)] = float(acc);
    }
    return y;
}

qwen4exp_reference::vec qwen4exp_reference::grouped_rms(const vec& x, const vec& w) const {
    vec out(x.size());
    for (int s = 0; s < int(x.size()) / n_embd_; ++s) {
        const vec part = rms(x, w.data() + size_t(s * n_embd_), eps_, size_t(s * n_embd_), size_t(n_embd_));
        std::copy(part.begin(), part.end(), out.begin() + s * n_embd_);
    }
    return out;
}

qwen4exp_reference::vec qwen4exp_reference::mixer(const std::string& prefix, const vec& h, vec* inj) const {
    const vec hn = grouped_rms(h, load(prefix + "norm.weight").w);
    vec lo = load(prefix + "down.weight").apply(hn);
    for (float& v : lo) v = float(silu_d(double(v) / hc_));
    const vec gate = load(prefix + "up.weight").apply(lo);
    vec mixed(static_cast<size_t>(n_embd_));
    for (int i = 0; i < n_embd_; ++i) {
        double sum = 0;
        for (int s = 0; s < hc_; ++s) sum += sigm(gate[size_t(s * n_embd_ + i)]) * hn[size_t(s * n_embd_ + i)];
        mixed[size_t(i)] = float(sum / hc_);
    }
    if (inj) {
        *inj = load(prefix + "inject.weight").apply(hn);
        for (float& v : *inj) v = float(2.0 * sigm(double(v) / hc_));
    }
    return mixed;
}

// history: [ngram - 1 EOS | the tokens]; q indexes it. Token q - s for shift s counts only when no
// EOS lies strictly between it and q's segment start, as _shift_right_ignore_eos decides it.
std::vector<int64_t> qwen4exp_reference::ngram_rows(const std::vector<int32_t>& history, size_t q) const {
    int64_t prev_eos = -1;
    for (size_t j = 0; j < q; ++j)
        if (history[j] == eos_) prev_eos = int64_t(j);
    const int64_t seg_start = prev_eos + 1;
    std::vector<int64_t> shifted;
    for (int s = 0; s < ngram_; ++s) {
        const bool valid = int64_t(q) - seg_start >= s && int64_t(q) - s >= 0;
        shifted.push_back(valid ? history[q - size_t(s)] : eos_);
    }
    std::vector<int64_t> rows;
    for (int n = 2; n <= ngram_; ++n) {
        // torch.long arithmetic: wrapping products, XOR, then remainder with a positive divisor.
        uint64_t mixed = uint64_t(shifted[0]) * uint64_t(mult_[0]);
        for (int j = 1; j < n; ++j) mixed ^= uint64_t(shifted[size_t(j)]) * uint64_t(mult_[size_t(j)]);
        const int64_t m = static_cast<int64_t>(mixed);
        for (int g = 0; g < per_ngram_; ++g) {
            const size_t h = size_t((n - 2) * per_ngram_ + g);
            const int64_t r = ((m % vocab_[h]) + vocab_[h]) % vocab_[h];
            rows.push_back(r + offset_[h]);
        }
    }
    return rows;
}

void qwen4exp_reference::ple(int il, const std::vector<int32_t>& tokens, size_t pos, vec& h) {
    const std::string b = "blk." + std::to_string(il) + ".";
    std::vector<int32_t> history(static_cast<size_t>(ngram_ - 1), int32_t(eos_));
    history.insert(history.end(), tokens.begin(), tokens.begin() + std::ptrdiff_t(pos + 1));
    const matrix& table = load("per_layer_token_embd.weight");
    vec emb;
    for (int64_t row : ngram_rows(history, history.size() - 1))
        emb.insert(emb.end(), table.w.begin() + std::ptrdiff_t(row * ple_dim_),
                   table.w.begin() + std::ptrdiff_t((row + 1) * ple_dim_));
    const vec key = grouped_rms(load(b + "ple_key.weight").apply(emb), load(b + "ple_norm_key.weight").w);
    const vec value = load(b + "ple_value.weight").apply(emb);
    const vec query = grouped_rms(h, load(b + "ple_norm_query.weight").w);
    vec gated(h.size());
    for (int s = 0; s < hc_; ++s) {
        double dot = 0;
        for (int i = 0; i < n_embd_; ++i) dot += double(key[size_t(s * n_embd_ + i)]) * query[size_t(s * n_embd_ + i)];
        const double g = dot / std::sqrt(double(n_embd_));
        const double sgn = g > 0 ? 1.0 : g < 0 ? -1.0 : 0.0;
        const double a = sigm(std::sqrt(std::max(std::abs(g), 1e-6)) * sgn);
        for (int i = 0; i < n_embd_; ++i) gated[size_t(s * n_embd_ + i)] = float(a * value[size_t(i)]);
    }
    ple_hist_.push_back(grouped_rms(gated, load(b + "ple_norm_conv.weight").w));
    const matrix& cw = load(b + "ple_conv1d.weight");  // [hc * n_embd][kernel]
    for (size_t c = 0; c < h.size(); ++c) {
        double acc = 0;
        for (int k = 0; k < ple_kernel_; ++k) {
            const int64_t src = int64_t(pos) - int64_t(ple_kernel_ - 1 - k) * ngram_;
            if (src >= 0) acc += double(cw.w[c * size_t(ple_kernel_) + size_t(k)]) * ple_hist_[size_t(src)][c];
        }
        h[c] += float(gated[c] + silu_d(acc));
    }
}

qwen4exp_reference::vec qwen4exp_reference::attention(int il, const vec& xn, int pos) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const int hd = head_dim_;
    const vec qg = load(b + "attn_q.weight").apply(xn);
    vec k = load(b + "attn_k.weight").apply(xn), v = load(b + "attn_v.weight").apply(xn);
    const vec& qn = load(b + "attn_q_norm.weight").w;
    const vec& kn = load(b + "attn_k_norm.weight").w;
    vec q(static_cast<size_t>(n_head_ * hd)), gate(static_cast<size_t>(n_head_ * hd));
    for (int h = 0; h < n_head_; ++h) {
        const vec normed = rms(qg, qn.data(), eps_, size_t(h * 2 * hd), size_t(hd));
        std::copy(normed.begin(), normed.end(), q.begin() + h * hd);
        std::copy(qg.begin() + h * 2 * hd + hd, qg.begin() + (h + 1) * 2 * hd, gate.begin() + h * hd);
        rope(q.data() + h * hd, n_rot_, pos, freq_base_);
    }
    for (int h = 0; h < n_head_kv_; ++h) {
        const vec normed = rms(k, kn.data(), eps_, size_t(h * hd), size_t(hd));
        std::copy(normed.begin(), normed.end(), k.begin() + h * hd);
        rope(k.data() + h * hd, n_rot_, pos, freq_base_);
    }
    k_cache_[size_t(il)].push_back(k);
    v_cache_[size_t(il)].push_back(v);

    // The indexer: raw keys kept; complete blocks pooled, normed and rotated to their first position.
    std::vector<bool> visible(static_cast<size_t>(pos + 1), true);
    const int r = il < n_layer_ ? ratio_[size_t(il)] : 0;  // the MTP block attends densely
    idx_keys_[size_t(il)].push_back(load(b + "indexer.k_proj.weight").apply(xn));
    const int nb = r > 0 ? (pos + 1) / r : 0;
    if (r > 0 && nb > idx_top_k_ / r) {
        const vec& qnorm = load(b + "indexer.q_norm.weight").w;
        const vec& knorm = load(b + "indexer.k_norm.weight").w;
        const vec iq = load(b + "indexer.q_proj.weight").apply(xn);
        std::vector<vec> qh;
        for (int h = 0; h < idx_heads_; ++h) {
            qh.push_back(rms(iq, qnorm.data(), eps_, size_t(h * idx_dim_), size_t(idx_dim_)));
            rope(qh.back().data(), n_rot_, pos, freq_base_);
        }
        std::vector<double> score(static_cast<size_t>(nb));
        for (int blk = 0; blk < nb; ++blk) {
            vec pooled(static_cast<size_t>(idx_dim_));
            for (int i = 0; i < idx_dim_; ++i) {
                double s = 0;
                for (int j = 0; j < r; ++j) s += idx_keys_[size_t(il)][size_t(blk * r + j)][size_t(i)];
                pooled[size_t(i)] = float(s / r);
            }
            vec kb = rms(pooled, knorm.data(), eps_, 0, size_t(idx_dim_));
            rope(kb.data(), n_rot_, blk * r, freq_base_);
            for (const vec& qq : qh) {
                double dot = 0;
                for (int i = 0; i < idx_dim_; ++i) dot += double(qq[size_t(i)]) * kb[size_t(i)];
                score[size_t(blk)] += std::max(dot, 0.0);
            }
            score[size_t(blk)] /= std::sqrt(double(idx_dim_));
        }
        std::vector<int> order(static_cast<size_t>(nb));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return score[size_t(a)] > score[size_t(c)]; });
        std::fill(visible.begin(), visible.begin() + nb * r, false);
        for (int j = 0; j < idx_top_k_ / r; ++j)
            for (int t = 0; t < r; ++t) visible[size_t(order[size_t(j)] * r + t)] = true;
        ++sparse_queries_;
    }

    vec out(static_cast<size_t>(n_head_ * hd));
    const int group = n_head_ / n_head_kv_;
    for (int h = 0; h < n_head_; ++h) {
        const int g = h / group;
        std::vector<double> score;
        std::vector<int> at;
        for (int p = 0; p <= pos; ++p) {
            if (!visible[size_t(p)]) continue;
            double d = 0;
            for (int i = 0; i < hd; ++i) d += double(q[size_t(h * hd + i)]) * k_cache_[size_t(il)][size_t(p)][size_t(g * hd + i)];
            score.push_back(d / std::sqrt(double(hd)));
            at.push_back(p);
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (int i = 0; i < hd; ++i) {
            double acc = 0;
            for (size_t j = 0; j < score.size(); ++j) acc += score[j] * v_cache_[size_t(il)][size_t(at[j])][size_t(g * hd + i)];
            out[size_t(h * hd + i)] = float(acc / sum * sigm(gate[size_t(h * hd + i)]));
        }
    }
    return load(b + "attn_output.weight").apply(out);
}

qwen4exp_reference::vec qwen4exp_reference::delta_net(int il, int r, const vec& xn) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const int dk = d_state_, key_dim = n_k_ * dk, value_dim = n_v_ * dk, conv_dim = 2 * key_dim + value_dim;
    const vec qkv = load(b + "attn_qkv.weight").apply(xn), z = load(b + "attn_gate.weight").apply(xn);
    const vec beta = load(b + "ssm_beta.weight").apply(xn), alpha = load(b + "ssm_alpha.weight").apply(xn);
    auto& hist = conv_hist_[size_t(r)];
    const matrix& cw = load(b + "ssm_conv1d.weight");
    vec x(static_cast<size_t>(conv_dim));
    for (int c = 0; c < conv_dim; ++c) {
        double acc = double(cw.w[size_t(c * kernel_ + kernel_ - 1)]) * qkv[size_t(c)];
        for (int j = 0; j < kernel_ - 1; ++j) acc += double(cw.w[size_t(c * kernel_ + j)]) * hist[size_t(j)][size_t(c)];
        x[size_t(c)] = float(silu_d(acc));
    }
    hist.erase(hist.begin());
    hist.push_back(qkv);
    for (int h = 0; h < 2 * n_k_; ++h) {  // l2norm (x / sqrt(sum x^2 + 1e-6)); queries also / sqrt(d_k)
        double ss = 0;
        for (int i = 0; i < dk; ++i) ss += double(x[size_t(h * dk + i)]) * x[size_t(h * dk + i)];
        const double s = (h < n_k_ ? 1.0 / std::sqrt(double(dk)) : 1.0) / std::sqrt(ss + 1e-6);
        for (int i = 0; i < dk; ++i) x[size_t(h * dk + i)] = float(x[size_t(h * dk + i)] * s);
    }
    const vec& a = load(b + "ssm_a").w;
    const vec& dt = load(b + "ssm_dt.bias").w;
    const vec& norm = load(b + "ssm_norm.weight").w;
    vec o(static_cast<size_t>(value_dim));
    for (int h = 0; h < n_v_; ++h) {
        const int kh = h % n_k_;  // the file's value heads are tiled over the key heads
        const double g = a[size_t(h)] * std::log1p(std::exp(double(alpha[size_t(h)]) + dt[size_t(h)]));
        const double bt = sigm(beta[size_t(h)]);
        std::vector<double>& S = S_[size_t(r)][size_t(h)];
        const float* q = &x[size_t(kh * dk)];
        const float* k = &x[size_t(key_dim + kh * dk)];
        const float* v = &x[size_t(2 * key_dim + h * dk)];
        for (double& s : S) s *= std::exp(g);
        for (int j = 0; j < dk; ++j) {
            double sk = 0;
            for (int i = 0; i < dk; ++i) sk += S[size_t(i * dk + j)] * k[i];
            const double delta = bt * (v[j] - sk);
            for (int i = 0; i < dk; ++i) S[size_t(i * dk + j)] += k[i] * delta;
        }
        for (int j = 0; j < dk; ++j) {
            double acc = 0;
            for (int i = 0; i < dk; ++i) acc += S[size_t(i * dk + j)] * q[i];
            o[size_t(h * dk + j)] = float(acc);
        }
        const vec n = rms(o, norm.data(), eps_, size_t(h * dk), size_t(dk));
        for (int i = 0; i < dk; ++i) o[size_t(h * dk + i)] = float(n[size_t(i)] * sigm(z[size_t(h * dk + i)]));
    }
    return load(b + "ssm_out.weight").apply(o);
}

qwen4exp_reference::vec qwen4exp_reference::moe(int il, const vec& xn) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const vec logit = load(b + "ffn_gate_inp.weight").apply(xn);
    std::vector<int> order(static_cast<size_t>(n_expert_));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return logit[size_t(a)] > logit[size_t(c)]; });
    if (n_used_ < n_expert_)
        min_margin_ = std::min(min_margin_, logit[size_t(order[size_t(n_used_ - 1)])] - logit[size_t(order[size_t(n_used_)])]);
    double wsum = 0;
    std::vector<double> w;
    for (int j = 0; j < n_used_; ++j) wsum += w.emplace_back(std::exp(double(logit[size_t(order[size_t(j)])] - logit[size_t(order[0])])));
    const matrix& gate = load(b + "ffn_gate_exps.weight");
    const matrix& up = load(b + "ffn_up_exps.weight");
    const matrix& down = load(b + "ffn_down_exps.weight");
    std::vector<double> y(static_cast<size_t>(n_embd_));
    for (int j = 0; j < n_used_; ++j) {
        const int e = order[size_t(j)];
        vec g = gate.apply(xn, int64_t(e) * n_ff_, n_ff_), u = up.apply(xn, int64_t(e) * n_ff_, n_ff_);
        for (size_t i = 0; i < g.size(); ++i) g[i] = float(silu_d(g[i]) * u[i]);
        for (int r = 0; r < n_embd_; ++r) {
            double acc = 0;
            for (int c = 0; c < n_ff_; ++c) acc += double(down.w[size_t((int64_t(e) * n_embd_ + r) * n_ff_ + c)]) * g[size_t(c)];
            y[size_t(r)] += w[size_t(j)] / wsum * acc;  // the softmax's top-k, renormalised
        }
    }
    vec sg = load(b + "ffn_gate_shexp.weight").apply(xn), su = load(b + "ffn_up_shexp.weight").apply(xn);
    for (size_t i = 0; i < sg.size(); ++i) sg[i] = float(silu_d(sg[i]) * su[i]);
    const vec sd = load(b + "ffn_down_shexp.weight").apply(sg);
    const vec& gi = load(b + "ffn_gate_inp_shexp.weight").w;
    double dot = 0;
    for (int i = 0; i < n_embd_; ++i) dot += double(gi[size_t(i)]) * xn[size_t(i)];
    vec out(static_cast<size_t>(n_embd_));
    for (int r = 0; r < n_embd_; ++r) out[size_t(r)] = float(y[size_t(r)] + sigm(dot) * sd[size_t(r)]);
    return out;
}

std::vector<std::vector<float>> qwen4exp_reference::logits(const std::vector<int32_t>& tokens) {
    const int conv_dim = 2 * n_k_ * d_state_ + n_v_ * d_state_;
    k_cache_.assign(static_cast<size_t>(n_layer_), {});
    v_cache_.assign(static_cast<size_t>(n_layer_), {});
    idx_keys_.assign(static_cast<size_t>(n_layer_), {});
    conv_hist_.clear();
    S_.clear();
    ple_hist_.clear();
    hidden_.clear();
    for (int il = 0; il < n_layer_; ++il)
        if (recurrent_[size_t(il)]) {
            conv_hist_.emplace_back(static_cast<size_t>(kernel_ - 1), vec(static_cast<size_t>(conv_dim), 0.0f));
            S_.emplace_back(static_cast<size_t>(n_v_), std::vector<double>(static_cast<size_t>(d_state_ * d_state_), 0.0));
        }
    min_margin_ = INFINITY;
    sparse_queries_ = 0;
    const matrix& embd = load("token_embd.weight");
    const matrix& out = load(f_.find_tensor("output.weight") ? "output.weight" : "token_embd.weight");
    std::vector<std::vector<float>> result;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        vec h;  // hc copies of the embedding
        for (int s = 0; s < hc_; ++s)
            h.insert(h.end(), embd.w.begin() + std::ptrdiff_t(static_cast<size_t>(tokens[pos]) * size_t(n_embd_)),
                     embd.w.begin() + std::ptrdiff_t(static_cast<size_t>(tokens[pos] + 1) * size_t(n_embd_)));
        for (int il = 0, r = 0; il < n_layer_; ++il) {
            const std::string b = "blk." + std::to_string(il) + ".";
            if (il == ple_layer_) ple(il, tokens, pos, h);
            vec inj;
            const vec xn = mixer(b + "hc_attn_", h, &inj);
            const vec mix = recurrent_[size_t(il)] ? delta_net(il, r++, xn) : attention(il, xn, int(pos));
            for (int s = 0; s < hc_; ++s)
                for (int i = 0; i < n_embd_; ++i) h[size_t(s * n_embd_ + i)] += mix[size_t(i)] * inj[size_t(s)];
            const vec hn = mixer(b + "hc_ffn_", h, &inj);
            const vec ffn = moe(il, hn);
            for (int s = 0; s < hc_; ++s)
                for (int i = 0; i < n_embd_; ++i) h[size_t(s * n_embd_ + i)] += ffn[size_t(i)] * inj[size_t(s)];
        }
        hidden_.push_back(h);
        result.push_back(out.apply(mixer("output_hc_", h, nullptr)));
    }
    return result;
}

std::vector<std::vector<float>> qwen4exp_reference::mtp_logits(const std::vector<int32_t>& tokens) {
    logits(tokens);
    const int il = n_layer_;
    const std::string b = "blk." + std::to_string(il) + ".";
    for (auto* c : {&k_cache_, &v_cache_, &idx_keys_}) c->resize(size_t(il) + 1);
    const matrix& embd = load("token_embd.weight");
    const matrix& out = load(f_.find_tensor("output.weight") ? "output.weight" : "token_embd.weight");
    const matrix& eh = load(b + "nextn.eh_proj.weight");
    std::vector<std::vector<float>> result;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        const vec e(embd.w.begin() + std::ptrdiff_t(static_cast<size_t>(tokens[pos]) * size_t(n_embd_)),
                    embd.w.begin() + std::ptrdiff_t(size_t(tokens[pos] + 1) * size_t(n_embd_)));
        const vec en = rms(e, load(b + "nextn.enorm.weight").w.data(), eps_, 0, size_t(n_embd_));
        const vec hn = pos == 0 ? vec(size_t(hc_ * n_embd_), 0.0f) : grouped_rms(hidden_[pos - 1], load(b + "nextn.hnorm.weight").w);
        vec h;  // stream s: eh_proj [en | hn's stream s]
        for (int s = 0; s < hc_; ++s) {
            vec cat = en;
            cat.insert(cat.end(), hn.begin() + s * n_embd_, hn.begin() + (s + 1) * n_embd_);
            const vec y = eh.apply(cat);
            h.insert(h.end(), y.begin(), y.end());
        }
        vec inj;
        const vec xn = mixer(b + "hc_attn_", h, &inj);
        const vec mix = attention(il, xn, int(pos));
        for (int s = 0; s < hc_; ++s)
            for (int i = 0; i < n_embd_; ++i) h[size_t(s * n_embd_ + i)] += mix[size_t(i)] * inj[size_t(s)];
        const vec hn2 = mixer(b + "hc_ffn_", h, &inj);
        const vec ffn = moe(il, hn2);
        for (int s = 0; s < hc_; ++s)
            for (int i = 0; i < n_embd_; ++i) h[size_t(s * n_embd_ + i)] += ffn[size_t(i)] * inj[size_t(s)];
        result.push_back(out.apply(mixer(b + "nextn.hc_head_", h, nullptr)));
    }
    return result;
}

}  // namespace strata::testing
