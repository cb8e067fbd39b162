#include "model/qsa.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "formats/quant.hpp"
#include "model/forward.hpp"
#include "model/parallel.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

constexpr int64_t kScoreGrain = 256;  // indexer blocks per work item of the block scoring

}  // namespace

std::vector<int> qsa_pick_blocks(const float* scores, int n_blocks, int k) {
    std::vector<int> order(static_cast<size_t>(n_blocks));
    std::iota(order.begin(), order.end(), 0);
    if (n_blocks > k) {
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
            return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
        });
        order.resize(static_cast<size_t>(k));
        std::sort(order.begin(), order.end());
    }
    return order;
}

sparse_attention_mixer::sparse_attention_mixer(forward_pass& f, attention_mixer& dense) : token_mixer(f), dense_(dense) {
    for (int il = 0, r = 0; il < f.hp_.n_layer; ++il)
        slot_.push_back(f.hp_.qsa_ratio[static_cast<size_t>(il)] > 0 ? r++ : -1);
}

void sparse_attention_mixer::eval(int il, std::span<const step_segment> segs, int n_tok) {
    const step_segment& g = segs[0];
    const int r = f_.hp_.qsa_ratio[static_cast<size_t>(il)];
    // A lone query that leaves blocks out needs no dense pass: its cost is the budget's.
    const bool sparse_only = n_tok == 1 && (g.pos0 + 1) / r > f_.hp_.idx_top_k / r;
    dense_.run(f_.w_.layers[static_cast<size_t>(il)], f_.hp_.kv_layer(il), segs, n_tok, !sparse_only);
    select(il, n_tok, g.pos0, *g.kv);
}

std::vector<float>& sparse_attention_mixer::store(kv_cache& kv, int il, bool blocks) const {
    auto& stores = kv.indexer_keys();
    const size_t slot = static_cast<size_t>(slot_[static_cast<size_t>(il)]);
    if (stores.size() < 2 * slot + 2) stores.resize(2 * slot + 2);
    return stores[2 * slot + (blocks ? 1 : 0)];
}

void sparse_attention_mixer::complete_blocks(int il, const std::vector<float>& keys, std::vector<float>& bk,
                                             int n_blocks) const {
    const hparams& hp = f_.hp_;
    const layer_weights& l = f_.w_.layers[static_cast<size_t>(il)];
    const int r = hp.qsa_ratio[static_cast<size_t>(il)], d = hp.idx_head_dim;
    std::vector<float> cs(static_cast<size_t>(hp.n_rot));
    for (int b = static_cast<int>(bk.size() / static_cast<size_t>(d)); b < n_blocks; ++b) {
        bk.resize(static_cast<size_t>(b + 1) * d, 0.0f);
        float* k = bk.data() + static_cast<size_t>(b) * d;
        for (int j = 0; j < r; ++j)
            for (int i = 0; i < d; ++i) k[i] += keys[static_cast<size_t>(b * r + j) * d + i];
        for (int i = 0; i < d; ++i) k[i] /= static_cast<float>(r);
        cpu::rms_norm(k, l.idx_k_norm, hp.rms_eps, d, k);
        cpu::rope_angles(hp.n_rot, static_cast<int64_t>(b) * r, hp.rope, cs.data());
        cpu::rope_apply(k, 1, d, hp.n_rot, cs.data(), hp.arch.rope);
    }
}

void sparse_attention_mixer::fill_keys(kv_cache& kv, int il, std::vector<float> raw_keys, int n_pos) {
    std::vector<float>& keys = store(kv, il, false);
    std::vector<float>& bk = store(kv, il, true);
    keys = std::move(raw_keys);
    keys.resize(static_cast<size_t>(n_pos) * f_.hp_.idx_head_dim);
    bk.clear();
    complete_blocks(il, keys, bk, n_pos / f_.hp_.qsa_ratio[static_cast<size_t>(il)]);
}

void sparse_attention_mixer::score_blocks(const float* q, const float* bk, int n_blocks, float* scores) {
    const int d = f_.hp_.idx_head_dim, n_h = f_.hp_.idx_n_head;
    for (int b = 0; b < n_blocks; ++b) {
        float s = 0;
        for (int h = 0; h < n_h; ++h) {
            float dot = 0;
            for (int i = 0; i < d; ++i) dot += q[h * d + i] * bk[static_cast<size_t>(b) * d + i];
            s += std::max(dot, 0.0f);
        }
        scores[b] = s / std::sqrt(static_cast<float>(d));
    }
}

void sparse_attention_mixer::select(int il, int n_tok, int pos0, kv_cache& kv) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const layer_weights& l = f.w_.layers[static_cast<size_t>(il)];
    const int r = hp.qsa_ratio[static_cast<size_t>(il)], d = hp.idx_head_dim, n_h = hp.idx_n_head;
    const int budget = hp.idx_top_k / r;
    // Per QSA layer two stores: the raw key of every position, and the key of every complete block
    // (pooled, normed, rotated), kept as blocks complete and cut back with the positions.
    std::vector<float>& keys = store(kv, il, false);
    std::vector<float>& bk = store(kv, il, true);
    const int last = pos0 + n_tok - 1, n_blocks = (last + 1) / r;
    {
        arenas::scoped_seconds t(f.seconds(phase_clock::indexer));
        const size_t need = static_cast<size_t>(pos0 + n_tok) * d;
        if (keys.size() < need) keys.resize(need);
        idx_k_.resize(static_cast<size_t>(n_tok) * d);
        f.matmul(l.idx_k, n_tok, f.xn_.data(), idx_k_.data());
        std::copy(idx_k_.begin(), idx_k_.end(), keys.begin() + static_cast<std::ptrdiff_t>(pos0) * d);
        bk.resize(std::min(bk.size(), static_cast<size_t>(pos0 / r) * d));
        complete_blocks(il, keys, bk, n_blocks);
    }
    // Queries whose complete blocks all fit the budget attend densely: attention() has done them.
    if (n_blocks <= budget) return;

    {
        arenas::scoped_seconds t(f.seconds(phase_clock::indexer));
        idx_q_.resize(static_cast<size_t>(n_tok) * n_h * d);
        f.matmul(l.idx_q, n_tok, f.xn_.data(), idx_q_.data());
    }
    const int hd = hp.head_dim, n_q = hp.n_q(), group = hp.n_head / hp.n_head_kv, kvl = hp.kv_layer(il);
    const formats::ggml_type row_type = kv.type() == kv_type::f16 ? formats::ggml_type::F16 : formats::ggml_type::Q8_0;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> scores, kr(static_cast<size_t>(hd)), vr(static_cast<size_t>(hd)), p, acc(static_cast<size_t>(hd));
    std::vector<uint8_t> row(kv.head_row_bytes());
    for (int t = 0; t < n_tok; ++t) {
        const int pos = pos0 + t, nb = (pos + 1) / r;
        if (nb <= budget) continue;
        std::vector<int> positions;
        {
            arenas::scoped_seconds timer(f.seconds(phase_clock::indexer));
            float* q = idx_q_.data() + static_cast<size_t>(t) * n_h * d;
            for (int h = 0; h < n_h; ++h) cpu::rms_norm(q + h * d, l.idx_q_norm, hp.rms_eps, d, q + h * d);
            cpu::rope_apply(q, n_h, d, hp.n_rot, f.rope_cs_.data() + static_cast<size_t>(t) * hp.n_rot, hp.arch.rope);
            scores.resize(static_cast<size_t>(nb));
            score_blocks(q, bk.data(), nb, scores.data());
            for (int b : qsa_pick_blocks(scores.data(), nb, budget))
                for (int j = 0; j < r; ++j) positions.push_back(b * r + j);
            for (int j = nb * r; j <= pos; ++j) positions.push_back(j);
        }
        arenas::scoped_seconds timer(f.seconds(phase_clock::attention));
        // Attention of each head over the chosen positions, then the output gate as attention() applies it.
        for (int g = 0; g < hp.n_head_kv; ++g) {
            std::vector<std::vector<float>> ks, vs;
            for (int j : positions) {
                const int chunk = j / kv_cache::chunk_tokens, rr = j % kv_cache::chunk_tokens;
                kv.read_rows(kvl, chunk, g, rr, rr + 1, row.data());
                formats::dequantize_row(row_type, row.data(), kr.data(), hd);
                kv.read_rows(kvl, chunk, hp.n_head_kv + g, rr, rr + 1, row.data());
                formats::dequantize_row(row_type, row.data(), vr.data(), hd);
                ks.push_back(kr);
                vs.push_back(vr);
            }
            for (int h = g * group; h < (g + 1) * group; ++h) {
                const float* qh = f.q_.data() + static_cast<size_t>(t) * n_q + static_cast<size_t>(h) * hd;
                p.assign(positions.size(), 0.0f);
                for (size_t j = 0; j < positions.size(); ++j) {
                    float dot = 0;
                    for (int i = 0; i < hd; ++i) dot += qh[i] * ks[j][static_cast<size_t>(i)];
                    p[j] = dot * scale;
                }
                cpu::softmax(p.data(), static_cast<int64_t>(p.size()));
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (size_t j = 0; j < positions.size(); ++j)
                    for (int i = 0; i < hd; ++i) acc[static_cast<size_t>(i)] += p[j] * vs[j][static_cast<size_t>(i)];
                float* out = f.att_.data() + static_cast<size_t>(t) * n_q + static_cast<size_t>(h) * hd;
                const float* gate = dense_.gate() + static_cast<size_t>(t) * n_q + static_cast<size_t>(h) * hd;
                for (int i = 0; i < hd; ++i) out[i] = acc[static_cast<size_t>(i)] / (1.0f + std::exp(-gate[i]));
            }
        }
    }
}

}  // namespace strata::engine
